"""DFlash paper Table 1 (Transformers backend, thinking off, 2048 new tokens, block 16): our runs next to
the paper's numbers. Reads the summary.json of each run; never imported by the library.

Runs (GPU, real weights; each writes DIR/summary.json):
  for m in 4b 8b; do
    python -m specexp target=qwen3_$m drafter=dflash benchmark=reference eval=paper decoding=greedy \
        hydra.run.dir=runs/t1/qwen3_$m-T0
    python -m specexp target=qwen3_$m drafter=dflash benchmark=reference eval=paper decoding=sample_a \
        hydra.run.dir=runs/t1/qwen3_$m-T1
  done
  python experiments/dflash_table1.py runs/t1/*        # -> runs/t1/table1.md
benchmark=reference loads the prompts and the selection of the DFlash paper-era harness (MBPP sanitized, the 52K
tatsu-lab Alpaca, LiveCodeBench code_generation_lite; the hub). With benchmark=all (the staged edition, offline)
LiveCodeBench is a partial LeetCode subset, MBPP uses the MBPP paper template and Alpaca is EAGLE's 80 questions
(data/benchmarks/MANIFEST.md): those three columns are then comparable only in trend.
"""
import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from paper_values import comparison  # noqa: E402  (the paper's cells: experiments/paper_values.yaml, dflash_t1)


def read(d: Path):
    cfg = d / "config.yaml"
    return json.loads((d / "summary.json").read_text()), yaml.safe_load(cfg.read_text()) if cfg.exists() else {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, help="eval run directories (summary.json)")
    ap.add_argument("--out", type=Path, help="where to write the markdown (default: beside the runs, table1.md)")
    args = ap.parse_args(argv)
    runs = []
    for d in args.runs:
        if (d / "summary.json").exists():
            s, cfg = read(d)
            runs.append((f"{s['target']} T={s['decoding']['temperature']:g} ({s['decoding']['protocol']})", s, cfg))
    table = ("Cells: speedup and τ (τ includes the bonus token; [95% CI over prompts] when the run has one).\n\n"
             + comparison("dflash_t1", runs, "DFlash Table 1"))
    print(table)
    out = args.out or (args.runs[0].parent / "table1.md" if args.runs else None)
    if out:
        out.write_text(table)


if __name__ == "__main__":
    main()
