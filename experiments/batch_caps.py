"""`eval.max_drafts` as a table by batch size, chosen on the tuning split: for each cap on the drafts a round verifies,
experiments/bench_batch.py measures the drafter against AR at every batch size (the tuning split's prompts,
`eval.split=tune`), and each batch gets the cap with the highest median speedup (paired with AR within its own run,
so drift between the runs of different caps cancels). The result is a value for `eval.max_drafts`, e.g.
`'{1: 3, 16: 1}'`, measured on prompts that no evaluation uses.

At batch B a round verifies B (k + 1) rows: on a machine whose matrix units are already full at B rows, each extra
draft costs about a row's work, so the cap that pays shrinks as B grows, and a drafter that does not pay at any cap
at some B is reported as such (the table cannot say "no speculation": run AR there).

    python experiments/batch_caps.py --drafter dflash --caps 1 3 7 --batches 1 4 16 32 --repeats 2 \
        --out experiments/results/batch/<name>-caps -- --dtype bfloat16

Arguments after `--` go to bench_batch.py unchanged (its own options, and after a second `--` config overrides).
Writes `<out>/cap<k>/` (bench_batch's files per cap), `caps.json` and `caps.md`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def choose(per_cap: dict[int, dict[str, float]]) -> dict:
    """`per_cap`: {cap: {B (str): median speedup}} → {B: {"cap", "speedup", "pays"}} (the best cap at each B)."""
    batches = sorted({b for s in per_cap.values() for b in s}, key=int)
    out = {}
    for b in batches:
        cap, best = max(((c, s[b]) for c, s in per_cap.items() if s.get(b) is not None), key=lambda x: x[1])
        out[b] = {"cap": cap, "speedup": best, "pays": best > 1}
    return out


def table_value(chosen: dict) -> str:
    """The `eval.max_drafts` value: an entry where the cap changes (the first batch always)."""
    entries, last = [], None
    for b, c in chosen.items():
        if c["cap"] != last:
            entries.append(f"{b}: {c['cap']}")
            last = c["cap"]
    return "{" + ", ".join(entries) + "}"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    mine = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="dflash")
    ap.add_argument("--caps", type=int, nargs="+", default=[1, 3, 7])
    ap.add_argument("--batches", nargs="+", default=["1", "4", "16", "32"])
    ap.add_argument("--repeats", default="2")
    ap.add_argument("--max-new-tokens", default="48")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(mine)
    import bench_batch

    bench_opts, overrides = (rest[: rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    per_cap, machine = {}, None
    for cap in args.caps:
        out = args.out / f"cap{cap}"
        rc = bench_batch.main(["--drafters", args.drafter, "--batches", *args.batches, "--repeats", args.repeats,
                               "--max-new-tokens", args.max_new_tokens, "--max-drafts", str(cap), "--out", str(out),
                               *bench_opts, "--", "eval.split=tune", *overrides])
        if rc:
            return rc
        result = json.loads((out / "results.json").read_text())
        machine = result["machine"]
        rows = result["summary"]["methods"][args.drafter]
        per_cap[cap] = {b: r["speedup"]["median"] for b, r in rows.items() if "speedup" in r}
    chosen = choose(per_cap)
    value = table_value(chosen)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "caps.json").write_text(json.dumps({"drafter": args.drafter, "split": "tune", "machine": machine,
                                                    "speedup_by_cap": per_cap, "chosen": chosen,
                                                    "eval.max_drafts": value}, indent=2) + "\n")
    caps = sorted(per_cap)
    md = [f"# eval.max_drafts by batch for {args.drafter} (tuning split)", "",
          "Median speedup over AR (paired within each cap's run) by batch and cap; the chosen cap in bold.", "",
          "| B | " + " | ".join(f"cap {c}" for c in caps) + " | chosen |", "|---:|" + "---:|" * (len(caps) + 1)]
    for b, c in chosen.items():
        cells = [(f"**{per_cap[k][b]:.2f}×**" if k == c["cap"] else f"{per_cap[k][b]:.2f}×") if b in per_cap[k]
                 else "–" for k in caps]
        md.append(f"| {b} | " + " | ".join(cells) + f" | {c['cap']}{'' if c['pays'] else ' (AR is faster)'} |")
    md += ["", f"`eval.max_drafts='{value}'`", ""]
    (args.out / "caps.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
