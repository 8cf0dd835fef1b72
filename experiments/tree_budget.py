"""DFlash draft trees against the DFlash chain and against EAGLE-3 trees at equal node budgets (issue #50), by replay
on the same greedy references: τ per benchmark and macro with 95% CIs, and paired Δτ with paired-bootstrap CIs.

    F=experiments/results/replay_mini/references-smollm2_135m-128tok-50.json.gz
    E="target.dtype=float32 eval.num_samples=10 eval.max_new_tokens=128 replay.references=$F"
    E="$E eval.max_drafts=null"                                    # each drafter at its full depth (below)
    for n in 16 32 60; do
      python -m specexp task=replay drafter=dflash drafter.mode=tree drafter.tree.total_tokens=$n \\
          drafter.tree.top_k=K $E hydra.run.dir=runs/trees/dflash-tree$n
      python -m specexp task=replay drafter=eagle3 drafter.mode=tree drafter.tree.total_tokens=$n $E \\
          hydra.run.dir=runs/trees/eagle3-tree$n
    done
    python experiments/tree_budget.py --family DFlash experiments/results/mini_claims/eval/dflash \\
        runs/trees/dflash-tree{16,32,60} --family DeLS-RNN experiments/results/mini_claims/eval/dels_rnn \\
        runs/trees/dels_rnn-tree{16,32} --eagle3 runs/trees/eagle3-tree{16,32,60} --out table.md

`eval.max_drafts=null`: on a CPU the default `auto` caps a round at 3 drafts, a tree's depth included; the chains
and trees compared here each run at their drafter's full depth.

Each `--family` is a label, that drafter's chain replay on the same references (more prompts are fine: pairs use
the prompts both hold), then its tree replays; trees are matched by their `drafter.tree.total_tokens`
(config.yaml), against the chain, against the EAGLE-3 tree of the same budget and (after the first family) against
the first family's tree. τ includes the bonus token; the macro Δ is the unweighted mean over benchmarks, its CI from the
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
    ap.add_argument("--family", nargs="+", action="append", required=True, metavar="LABEL CHAIN TREE",
                    help="a drafter: its label, its chain's replay directory, then its tree replays (repeatable)")
    ap.add_argument("--eagle3", type=Path, nargs="*", default=[])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    eagle = {budget(r): load_records(r) for r in a.eagle3}
    rows, detail, first_trees = [], [], {}
    for i, (label, chain_dir, *tree_dirs) in enumerate(a.family):
        chain = load_records(Path(chain_dir))
        rows += [f"\n{label}:\n", f"| tokens per round | {label} tree τ | {label} chain τ | Δ tree − chain | 95% CI | "
                 f"EAGLE-3 tree τ | Δ {label} − EAGLE-3 | 95% CI | turns |",
                 "|---:|---:|---:|---:|---|---:|---:|---|---:|"]
        for run in sorted(map(Path, tree_dirs), key=budget):
            n, tree = budget(run), load_records(run)
            vs_chain = compare(tree, chain)
            row = [str(n), f"{macro_tau(vs_chain, 'a'):.3f}", f"{macro_tau(vs_chain, 'b'):.3f}",
                   f"{vs_chain['macro']['delta']:+.3f}", ci(vs_chain["macro"]["delta_ci95"])]
            if n in eagle:
                vs_e = compare(tree, eagle[n])
                row += [f"{macro_tau(vs_e, 'b'):.3f}", f"**{vs_e['macro']['delta']:+.3f}**",
                        ci(vs_e["macro"]["delta_ci95"])]
                if i == 0:
                    detail.append((n, vs_e))
            else:
                row += ["–", "–", "–"]
            rows.append("| " + " | ".join(row + [str(vs_chain["turns_compared"])]) + " |")
            if i == 0:
                first_trees[n] = tree
            elif n in first_trees:
                d = compare(tree, first_trees[n])
                rows.append(f"| | {label} tree − {a.family[0][0]} tree at {n}: {d['macro']['delta']:+.3f} "
                            f"{ci(d['macro']['delta_ci95'])} | | | | | | | |")
    for n, r in detail:
        rows += [f"\n{a.family[0][0]} tree − EAGLE-3 tree at {n} tokens per round, per benchmark:\n",
                 f"| benchmark | prompts | {a.family[0][0]} tree τ | EAGLE-3 tree τ | Δ | 95% CI |",
                 "|---|---:|---:|---:|---:|---|"]
        rows += [f"| {b} | {c['num_prompts']} | {c['tau_a']:.3f} | {c['tau_b']:.3f} | {c['delta']:+.3f} | "
                 f"{ci(c['delta_ci95'])} |" for b, c in r["benchmarks"].items() if c["delta"] is not None]
    md = "\n".join(rows).strip() + "\n"
    print(md)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(md)


if __name__ == "__main__":
    main()
