"""τ of several drafters on one reference set, with 95% CIs, and each drafter paired against the first.

Inputs are run directories of `task=replay` (or `task=eval`) on the same prompts, e.g. the mini drafters on
50 prompts per benchmark (all 30 of AIME25) at 128 new tokens:

    F=experiments/results/replay_mini/references-smollm2_135m-128tok-50.json.gz
    python -m specexp task=replay drafter=none replay.references_only=true replay.references=$F \\
        eval.num_samples=50 eval.max_new_tokens=128
    for d in dflash dels_rnn dels_markov domino_ft dedit; do
      python -m specexp task=replay drafter=$d eval.num_samples=50 eval.max_new_tokens=128 \\
          hydra.run.dir=runs/replay50/$d
    done
    python experiments/replay_tau.py runs/replay50/{dflash,dels_rnn,dels_markov,domino_ft,dedit} \\
        --out experiments/results/replay_mini/tau.md

Writes (and prints) one markdown file: τ per benchmark and macro with the bootstrap 95% CI of each summary (the
mean of per-turn τ, prompts resampled; τ includes the bonus token), the replay diagnostics (rounds, rounds with a
target near-tie, teacher-forced argmax ≠ reference), and for every run after the first the paired comparison with
the first (Δτ with a paired-bootstrap 95% CI and win shares, `specexp.eval.compare`, the same code as
`task=compare`). Never imported by the library.
"""
import argparse
import json
from pathlib import Path

from specexp.eval.compare import compare, compare_markdown, load_records


def fmt_ci(c) -> str:
    return "–" if not c else f"[{c[0]:.3f}, {c[1]:.3f}]"


def summary_table(run: Path) -> str:
    s = json.loads((run / "summary.json").read_text())
    rows = [f"### {s['drafter']} ({s.get('mode', 'online')}; `{run}`)", "",
            "| benchmark | samples | turns | τ | τ 95% CI | rounds | near-tie rounds | TF argmax ≠ ref |",
            "|---|---:|---:|---:|---|---:|---:|---:|"]
    for name, b in s["benchmarks"].items():
        rows.append(f"| {name} | {b['num_samples']} | {b.get('num_turns', '–')} | {b['tau']:.3f} | "
                    f"{fmt_ci(b.get('tau_ci95'))} | {b.get('rounds', '–')} | {b.get('near_tie_rounds', '–')} | "
                    f"{b.get('tf_argmax_mismatches', '–')} |")
    m = s["macro"]
    rows.append(f"| **macro** | | | **{m['tau']:.3f}** | {fmt_ci(m.get('tau_ci95'))} | | | |")
    return "\n".join(rows) + "\n"


def overview(runs: list[Path]) -> str:
    sums = [json.loads((r / "summary.json").read_text()) for r in runs]
    names = list(sums[0]["benchmarks"])
    s0 = sums[0]
    n = {b: s0["benchmarks"][b]["num_samples"] for b in names}
    rows = [f"τ on {s0['target']} ({s0['decoding']['protocol']}, {s0['max_new_tokens']} new tokens; prompts per "
            f"benchmark: " + ", ".join(f"{b} {k}" for b, k in n.items()) + "), 95% CI below each value", "",
            "| drafter | " + " | ".join(names) + " | macro |", "|---|" + "---:|" * (len(names) + 1)]
    for s in sums:
        cells = [s["benchmarks"][b] for b in names]
        rows.append(f"| {s['drafter']} | " + " | ".join(f"{c['tau']:.3f}" for c in cells)
                    + f" | **{s['macro']['tau']:.3f}** |")
        rows.append("| | " + " | ".join(fmt_ci(c.get("tau_ci95")) for c in cells)
                    + f" | {fmt_ci(s['macro'].get('tau_ci95'))} |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories on the same prompts; the first is the baseline")
    ap.add_argument("--out", type=Path, default=None, help="markdown file to write (default: tau.md beside the first)")
    ap.add_argument("--title", default="τ by replay, with 95% CIs")
    args = ap.parse_args()
    parts = [f"# {args.title}\n", overview(args.runs)]
    base = load_records(args.runs[0])
    for run in args.runs[1:]:
        result = {"a": str(run), "b": str(args.runs[0]), **compare(load_records(run), base)}
        parts.append(f"## Paired: {run.name} − {args.runs[0].name}\n\n" + compare_markdown(result))
    parts.append("## Per drafter\n")
    parts += [summary_table(r) for r in args.runs]
    text = "\n".join(parts)
    out = args.out or args.runs[0].parent / "tau.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
