"""Stage MBPP's sanitized test split as data/benchmarks/mbpp_sanitized.jsonl (benchmark.edition=reference).

    python scripts/stage_mbpp_sanitized.py SANITIZED_MBPP_JSON [--out data/benchmarks/mbpp_sanitized.jsonl]

SANITIZED_MBPP_JSON is `mbpp/sanitized-mbpp.json` of github.com/google-research/google-research (the file the
hub's `google-research-datasets/mbpp` "sanitized" configuration is built from). Kept: the test split, task ids
11-510 (the MBPP README's evaluation ids), in the file's order, each as `{"id": "mbpp/<task_id>", "turns":
[prompt]}` with the `prompt` field as it is (what the DFlash paper-era harness feeds the model); code and tests
are not staged.
"""
import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    out = Path(__file__).resolve().parents[1] / "data/benchmarks/mbpp_sanitized.jsonl"
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args()
    rows = json.loads(args.source.read_text(encoding="utf-8"))
    test = [r for r in rows if 11 <= int(r["task_id"]) <= 510]
    lines = [json.dumps({"id": f"mbpp/{r['task_id']}", "turns": [r["prompt"]]}, ensure_ascii=False) for r in test]
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"{args.out}: {len(test)} of {len(rows)} records (task ids 11-510)")


if __name__ == "__main__":
    main()
