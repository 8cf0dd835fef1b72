"""DFlash draft trees against the DFlash chain and against EAGLE-3 trees at equal node budgets (issue #50), by replay
on the same greedy references: τ per benchmark and macro with 95% CIs, and paired Δτ with paired-bootstrap CIs.

    F=experiments/results/replay_mini/references-smollm2_135m-128tok-50.json.gz
    for n in 16 32 60; do
      python -m specexp task=replay drafter=dflash drafter.mode=tree drafter.tree.total_tokens=$n \\
          drafter.tree.top_k=K eval.num_samples=10 eval.max_new_tokens=128 replay.references=$F \\
          hydra.run.dir=runs/trees/dflash-tree$n
      python -m specexp task=replay drafter=eagle3 drafter.mode=tree drafter.tree.total_tokens=$n \\
          eval.num_samples=10 eval.max_new_tokens=128 replay.references=$F hydra.run.dir=runs/trees/eagle3-tree$n
    done
    python experiments/tree_budget.py --chain experiments/results/mini_claims/eval/dflash \\
        --dflash runs/trees/dflash-tree{16,32,60} --eagle3 runs/trees/eagle3-tree{16,32,60} \\
        --out experiments/results/trees/README.md

`--dflash` and `--eagle3` are lists of replay run directories, matched by their `drafter.tree.total_tokens`
(config.yaml); `--chain` is the DFlash chain's replay on the same references (more prompts are fine: pairs use the
prompts both hold). τ includes the bonus token; the macro Δ is the unweighted mean over benchmarks, its CI from the
mean of the benchmarks' bootstrap replicates (specexp.eval.metrics, the code of task=compare). Never imported by
the library.
"""
import argparse
from pathlib import Path

import yaml

from specexp.eval.compare import compare, load_records


def budget(run: Path) -> int:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    return int(cfg["drafter"]["tree"]["total_tokens"])


def ci(c) -> str:
    return "–" if not c else f"[{c[0]:+.3f}, {c[1]:+.3f}]"


def macro_tau(result: dict, side: str) -> float:
    v = [b[f"tau_{side}"] for b in result["benchmarks"].values() if b[f"tau_{side}"] is not None]
    return sum(v) / len(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chain", type=Path, required=True)
    ap.add_argument("--dflash", type=Path, nargs="+", required=True)
    ap.add_argument("--eagle3", type=Path, nargs="*", default=[])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    chain = load_records(a.chain)
    eagle = {budget(r): load_records(r) for r in a.eagle3}
    rows = ["| tokens per round | DFlash tree τ | DFlash chain τ | Δ tree − chain | 95% CI | EAGLE-3 tree τ | "
            "Δ DFlash − EAGLE-3 | 95% CI | turns |", "|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    per_bench = []
    for run in sorted(a.dflash, key=budget):
        n, tree = budget(run), load_records(run)
        vs_chain = compare(tree, chain)
        row = [str(n), f"{macro_tau(vs_chain, 'a'):.3f}", f"{macro_tau(vs_chain, 'b'):.3f}",
               f"{vs_chain['macro']['delta']:+.3f}", ci(vs_chain["macro"]["delta_ci95"])]
        if n in eagle:
            vs_e = compare(tree, eagle[n])
            row += [f"{macro_tau(vs_e, 'b'):.3f}", f"**{vs_e['macro']['delta']:+.3f}**",
                    ci(vs_e["macro"]["delta_ci95"])]
            per_bench.append((n, vs_e))
        else:
            row += ["–", "–", "–"]
        row.append(str(vs_chain["turns_compared"]))
        rows.append("| " + " | ".join(row) + " |")
    detail = []
    for n, r in per_bench:
        detail += [f"\nDFlash tree − EAGLE-3 tree at {n} tokens per round, per benchmark:\n",
                   "| benchmark | prompts | DFlash tree τ | EAGLE-3 tree τ | Δ | 95% CI |",
                   "|---|---:|---:|---:|---:|---|"]
        detail += [f"| {b} | {c['num_prompts']} | {c['tau_a']:.3f} | {c['tau_b']:.3f} | {c['delta']:+.3f} | "
                   f"{ci(c['delta_ci95'])} |" for b, c in r["benchmarks"].items() if c["delta"] is not None]
    md = "\n".join(rows + detail) + "\n"
    print(md)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(md)


if __name__ == "__main__":
    main()
