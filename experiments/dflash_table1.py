"""DFlash paper Table 1 (Transformers backend, thinking off, 2048 new tokens, block 16): our runs next to
the paper's numbers. Reads the summary.json of each run; never imported by the library.

Runs (GPU, real weights; each writes DIR/summary.json):
  for m in 4b 8b; do
    python -m specexp target=qwen3_$m drafter=dflash benchmark=all eval=paper decoding=greedy \
        hydra.run.dir=runs/t1/qwen3_$m-T0
    python -m specexp target=qwen3_$m drafter=dflash benchmark=all eval=paper decoding=sample_a \
        hydra.run.dir=runs/t1/qwen3_$m-T1
  done
  python experiments/dflash_table1.py runs/t1/*        # -> runs/t1/table1.md
Note: the staged LiveCodeBench is a partial LeetCode subset and MBPP uses the MBPP paper template (see
data/benchmarks/MANIFEST.md), so those two columns are comparable only in trend.
"""
import json
import sys
from pathlib import Path

BENCH = ["gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt_bench"]
# Paper Table 1, cells = (speedup, tau); as published (arXiv 2602.06036).
PAPER = {
    ("qwen3_4b", 0.0): [(5.15, 6.53), (6.09, 7.84), (5.68, 7.27), (5.21, 6.64),
                        (4.78, 6.09), (5.41, 7.09), (2.85, 4.35)],
    ("qwen3_8b", 0.0): [(5.15, 6.54), (6.08, 7.87), (5.62, 7.08), (5.14, 6.50),
                        (4.65, 5.95), (5.51, 7.27), (2.75, 4.24)],
    ("qwen3_4b", 1.0): [(4.71, 6.00), (5.09, 6.67), (3.73, 4.92), (4.74, 6.04),
                        (4.42, 5.66), (4.90, 6.50), (2.67, 4.07)],
    ("qwen3_8b", 1.0): [(4.67, 5.98), (4.84, 6.40), (3.57, 4.73), (4.32, 5.52),
                        (4.04, 5.21), (4.93, 6.69), (2.47, 3.80)],
}


def cell(speedup, tau, ci=None):
    s = "–" if speedup is None else f"{speedup:.2f}×"
    return f"{s} / {'–' if tau is None else f'{tau:.2f}'}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def main(dirs):
    rows = ["| run | " + " | ".join(BENCH) + " |", "|---|" + "---|" * len(BENCH)]
    for d in dirs:
        f = Path(d) / "summary.json"
        if not f.exists():
            continue
        s = json.loads(f.read_text())
        t = s["decoding"]["temperature"]
        b = s["benchmarks"]
        rows.append(f"| {s['target']} T={t:g} ({s['decoding']['protocol']}) | " + " | ".join(
            cell(b[n].get("speedup"), b[n]["tau"], b[n].get("tau_ci95")) if n in b else "–" for n in BENCH)
            + " |")
        if (s["target"], t) in PAPER:
            cells = " | ".join(cell(*c) for c in PAPER[(s["target"], t)])
            rows.append(f"| paper {s['target']} T={t:g} | {cells} |")
    table = ("Cells: speedup / τ [95% CI over prompts, when the run has one] (τ includes the bonus token).\n\n"
             + "\n".join(rows) + "\n")
    print(table)
    if dirs:
        (Path(dirs[0]).parent / "table1.md").write_text(table)


if __name__ == "__main__":
    main(sys.argv[1:])
