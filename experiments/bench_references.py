"""Greedy references at batch 1 against batched generation (decoding/batch.py), on the same prompts in one run.

Every batch size of `--batches` builds the references of the same prompts (eval split, `--samples` per benchmark,
`--tokens` new tokens, prompt-index-major across benchmarks as `task=replay` orders them) through
`eval.references.compute_references`: batch 1 on the target's own engine (the references' definition), a batch B > 1
on the static engine with B rows refilled as they finish. The batch sizes are interleaved in every repeat (their
order rotated), so a change of machine load falls on all of them.

Printed and written (`--out`): per batch size the median wall time over repeats, tokens per second, the speed-up
over batch 1, and how many turns differ from batch 1's tokens; for each differing turn the top-2 logit gap of the
batch-1 target at the first differing position (a near-tie by the evaluator's rule, metrics.tie_tolerance, is the
rounding of B rows against one, not an error). `--reference-file` also compares every batch's tokens with a
shipped reference set (replay.export) made at batch 1. The machine: CPU model and flags, threads, the load before
and after, library versions.

    python experiments/bench_references.py --dtype float32 --samples 50 --batches 1,16 --repeats 1 \
        --reference-file experiments/results/replay_mini/references-smollm2_135m-128tok-50.json.gz \
        --out experiments/results/batched/$(date +%F)-full
    python experiments/bench_references.py --dtype float32 --prompts 48 --batches 1,4,8,16,32,64 --repeats 3 \
        --out experiments/results/batched/$(date +%F)-sweep

CPU wall clock: run it on an otherwise idle machine (the load is recorded; above 0.5 before the run it is BUSY).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from specexp import benchmarks, registry  # noqa: E402
from specexp.api import compose  # noqa: E402
from specexp.config import BenchmarkConfig, DecodingConfig, EvalConfig  # noqa: E402
from specexp.decoding.settings import decode_config  # noqa: E402
from specexp.eval import metrics  # noqa: E402
from specexp.eval.references import compute_references, sample_key, turns_with_prompts  # noqa: E402
from specexp.machine import describe  # noqa: E402


def interleaved(samples):
    """Prompt-index-major across benchmarks (as replay.build_references orders them)."""
    count, index = {}, []
    for s in samples:
        index.append(count.get(s.benchmark, 0))
        count[s.benchmark] = index[-1] + 1
    return [s for _, s in sorted(zip(index, samples), key=lambda p: p[0])]


@torch.inference_mode()
def first_gap(target, sample, ref: dict, other: dict, near_tie: float) -> list[tuple[float, float]]:
    """Where `other` first leaves `ref` (the first differing turn), the top-2 logit gap of `target` (batch 1, one
    teacher-forced pass over the prompt and the common prefix) and the evaluator's near-tie tolerance there
    (metrics.tie_tolerance: `near_tie`, or 2 units in the last place of the dtype at the best logit)."""
    gaps = []
    for turn, prompt, tokens in turns_with_prompts(target, sample, ref):
        mine = other["turns"][turn]["tokens"]
        j = next((i for i, (a, b) in enumerate(zip(tokens, mine)) if a != b), None)
        if j is None:
            if len(tokens) == len(mine):
                continue
            j = min(len(tokens), len(mine))
        ids = torch.tensor([prompt + tokens[:j]], device=target.device)
        logits, _ = target.forward(ids, 0, target.new_cache(), last_only=True)            # [1, 1, V]
        row = logits[0, -1]                                                                 # [V]
        gaps.append((float(metrics.top2_gap(row[None].float())[0]),
                     metrics.tie_tolerance(row, target.dtype, near_tie)))
        break                                              # later turns follow a different answer
    return gaps


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--samples", default="50", help="eval.num_samples (per benchmark)")
    ap.add_argument("--prompts", type=int, default=0, help="the first N prompts of the interleaved order (0: all)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--near-tie", type=float, default=0.01)
    ap.add_argument("--reference-file", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    cfg, _ = compose(["target=smollm2_135m", "target.source=gguf", f"target.dtype={args.dtype}", "drafter=none",
                      f"eval.num_samples={args.samples}", f"eval.max_new_tokens={args.tokens}", "device=cpu"])
    target = registry.build_target(cfg.target, torch.device("cpu"))
    ev = EvalConfig.from_cfg(cfg.eval)
    samples = interleaved(benchmarks.from_config(BenchmarkConfig.from_cfg(cfg.benchmark), ev))
    samples = samples[:args.prompts] if args.prompts else samples
    dc = decode_config(DecodingConfig.from_cfg(cfg.decoding), ev, target)
    times: dict[int, list[float]] = {b: [] for b in batches}
    outputs: dict[int, dict] = {}
    print(f"{len(samples)} prompts, {args.tokens} tokens, {target.dtype}, engine {type(target).__name__}, "
          f"batches {batches}, {args.repeats} repeats")
    for rep in range(args.repeats):
        order = batches[rep % len(batches):] + batches[:rep % len(batches)]
        for b in order:
            refs: dict = {}
            t0 = time.perf_counter()
            compute_references(target, samples, dc, b, lambda r: refs.__setitem__(r["key"], r))
            times[b].append(time.perf_counter() - t0)
            outputs.setdefault(b, refs)
            print(f"  repeat {rep} batch {b}: {times[b][-1]:.1f} s", flush=True)
    load1 = os.getloadavg()
    base = outputs[1] if 1 in outputs else None
    shipped = None
    if args.reference_file:
        with gzip.open(args.reference_file, "rt") as f:
            shipped = {r["key"]: r for r in json.load(f)["references"]}
    by_key = {sample_key(s): s for s in samples}
    rows = []
    for b in batches:
        refs = outputs[b]
        ntok = sum(len(t["tokens"]) for r in refs.values() for t in r["turns"])
        med = statistics.median(times[b])
        row = {"batch": b, "seconds": times[b], "median_s": med, "tokens": ntok, "tokens_per_s": ntok / med,
               "turns": sum(len(r["turns"]) for r in refs.values())}
        if base is not None and b != 1:
            diff = [k for k in refs if refs[k]["turns"] != base[k]["turns"]]
            gaps = [g for k in diff for g in first_gap(target, by_key[k], base[k], refs[k], args.near_tie)]
            row.update(differing_samples=len(diff), near_ties=sum(metrics.is_near_tie(g, t) for g, t in gaps),
                       gaps=sorted(gaps))
        if shipped is not None:
            row["differs_from_reference_file"] = sum(refs[k]["turns"] != shipped[k]["turns"] for k in refs
                                                     if k in shipped)
            row["in_reference_file"] = sum(k in shipped for k in refs)
        rows.append(row)
    one = next((r for r in rows if r["batch"] == 1), None)
    for r in rows:
        r["speedup"] = one["median_s"] / r["median_s"] if one else None
    result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": describe(target.device),
              "threads": args.threads, "load_before": load0, "load_after": load1, "busy": load0[0] > 0.5,
              "dtype": str(target.dtype), "engine_batch_1": type(target).__name__, "prompts": len(samples),
              "tokens": args.tokens, "repeats": args.repeats, "torch": torch.__version__, "rows": rows,
              "command": "python experiments/bench_references.py " + " ".join(argv or os.sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_references.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [f"# References: batch 1 against batched generation ({len(samples)} prompts, {args.tokens} tokens, "
          f"{result['dtype']})", "",
          f"{result['machine']['cpu']}, flags {', '.join(result['machine']['cpu_flags'])}; {args.threads} threads; "
          f"load {load0[0]:.2f} before, {load1[0]:.2f} after" + (" (BUSY)" if result["busy"] else "") + "; "
          f"medians of {args.repeats}; {result['when']}", "",
          "| batch | time | tokens/s | × batch 1 | samples differing from batch 1 | of them near-ties | "
          "differing from the reference file |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ref = f"{r['differs_from_reference_file']} of {r['in_reference_file']}" if shipped is not None else "–"
        md.append(f"| {r['batch']} | {r['median_s']:.1f} s | {r['tokens_per_s']:.1f} | "
                  f"{_x(r['speedup'])} | {r.get('differing_samples', '–')} | {r.get('near_ties', '–')} | {ref} |")
    md += ["", f"Command: `{result['command']}`", ""]
    (out / "bench_references.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
