"""Where speculation stops paying as the batch grows: tokens/s of AR and of each drafter through the batched engine
(decoding/batch_spec.speculate_batched) at batch sizes B, on the same prompts, interleaved, with paired speedups.

At batch 1 a verify of K + 1 tokens costs about one AR step (the weights are read once either way); at batch B it
checks B (K + 1) tokens, and once the target's matrix units fill the extra rows are no longer free. The crossover
batch of a drafter is the smallest B at which it is no faster than AR through the same engine.

What runs:
- Prompts: the benchmark prompts of `eval.split` (default: the eval split of `benchmark=all`), prompt-index-major
  across benchmarks as bench_references.py and `task=replay` order them, first turns only (a one-turn job each:
  multi-turn samples contribute their first user turn), encoded by the target's chat template. A run at batch B
  decodes the first `n(B) = max(--prompts-per-batch x B, --min-prompts)` of them (default max(2 B, 8)): at least
  two waves of rows, so rows finish at different rounds and are refilled, as in a real batched run; at a given B
  every method decodes the same n(B) prompts. Answers end at the target's stop ids or `--max-new-tokens`.
- Methods: AR (`drafter=None`: one target row a step through the same engine) and each drafter of `--drafters` with
  its committed checkpoint for the target (`drafter.init=auto`; EAGLE-3 in `drafter.mode=chain`, trees run at batch
  1 only). `--max-drafts` caps K (DecodeConfig.max_drafts; default: each drafter's own K).
- Order: one untimed warm-up run per method (the first 2 prompts at 2 rows, 16 tokens), then for each repeat, for
  each B, every method back to back, the methods' order rotated by one each repeat (a drift of the machine's load
  falls on all of them).
- Per run: wall seconds, generated tokens (first tokens included), tokens/s = tokens / wall, rounds (target forwards
  of the batch), τ = the mean of every row's accept lengths (accepted drafts + the bonus, so AR's is 1), the rows'
  prefill seconds (the sum of `Generation.ttft_s`: batch-1 forwards of each prompt, the same for every method) and
  decode tokens/s without them, and the prompts whose tokens differ from AR's in the same repeat and B (greedy is
  lossless: in float32 the count must be 0; in bf16 B rows may round apart at near-ties; every count is reported).
- Summary per (method, B): the median tokens/s over repeats; per drafter the speedup over AR paired within a repeat
  (same repeat, same B), its median and a 95 % CI: a Student t-interval of the mean log speedup over the repeats,
  exponentiated (so a CI of the geometric-mean speedup; none with a single repeat). The crossover per drafter: the
  smallest measured B whose median speedup is <= 1, and between the last B before it (speedup > 1) and it the B at
  which the speedup, interpolated linearly against log2 B, crosses 1; "none <= max B" when it never does, and "<= the
  first B" when the first measured B is already no faster.

Written to `--out` (default experiments/results/batch/<date>-<cpu>-<dtype>): `results.json` (the machine: CPU model,
flags among avx2 / avx512f / avx512_bf16 / amx_bf16 / amx_tile, cores, torch threads and version, the 1-minute load
before and after; the config, every run, the summary), `table.md` and `tokens_per_s.png` (tokens/s against B on a
log2 axis, one line per method, min-max over repeats as bars, each drafter's crossover a dotted line in its colour).

    python experiments/bench_batch.py                                   # the mini target, float32, B = 1 .. 32
    python experiments/bench_batch.py --dtype bfloat16 --drafters dflash eagle3 --batches 1 4 16 --repeats 5 \
        --out experiments/results/batch/$(date +%F)-bf16 -- target.prepack=false

Config overrides for the target and every drafter go after `--` (e.g. `drafter.init=random` on a target with no
committed drafters). CPU wall clock: run it on an otherwise idle machine (the load is recorded; above 0.5 before the
run the result is marked BUSY).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
AR = "AR"

# Student t quantiles t_{0.975, df} for df = 1 .. 30 (beyond: the Cornish-Fisher expansion, within 1e-3).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# ------------------------------------------------------------------------------------- pure functions (tested)
def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (two-sided 95 % intervals)."""
    if df < 1:
        raise ValueError(f"df={df}: at least 1")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def prompts_for(batch: int, per_batch: int = 2, minimum: int = 8) -> int:
    """Prompts a run at `batch` rows decodes: `per_batch` waves of rows, at least `minimum`."""
    return max(per_batch * batch, minimum)


def speedup_stats(method_tps: list[float], ar_tps: list[float]) -> dict:
    """Paired speedups (method / AR, repeat by repeat): their median, geometric mean and the 95 % t-interval of the
    mean log speedup, exponentiated (`ci95` None with fewer than two repeats)."""
    if len(method_tps) != len(ar_tps) or not method_tps:
        raise ValueError(f"{len(method_tps)} and {len(ar_tps)} repeats: need the same number, at least one")
    ratios = [m / a for m, a in zip(method_tps, ar_tps)]
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    ci = None
    if len(logs) >= 2:
        half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        ci = [math.exp(mean - half), math.exp(mean + half)]
    return {"repeats": len(ratios), "ratios": ratios, "median": statistics.median(ratios),
            "geomean": math.exp(mean), "ci95": ci}


def crossover(batches: list[int], speedups: list[float | None]) -> dict:
    """Where a drafter's median speedup over AR first falls to <= 1 as B grows (measured B's, any order; None
    entries skipped). `batch`: the smallest measured B at or below 1 (None: never); `interpolated`: between the B
    before it and it, the B at which the speedup, linear in log2 B, equals 1 (None when the first B is already <= 1,
    or when there is no crossing); `text`: one line for the table."""
    pts = sorted((b, s) for b, s in zip(batches, speedups) if s is not None)
    if not pts:
        return {"batch": None, "interpolated": None, "between": None, "text": "not measured"}
    for i, (b, s) in enumerate(pts):
        if s > 1:
            continue
        if i == 0:
            return {"batch": b, "interpolated": None, "between": None,
                    "text": f"<= {b} (already {s:.2f}× at the smallest batch measured)"}
        b0, s0 = pts[i - 1]
        x = math.log2(b0) + (math.log2(b) - math.log2(b0)) * (s0 - 1) / (s0 - s)
        return {"batch": b, "interpolated": 2**x, "between": [b0, b],
                "text": f"B = {b} (interpolated {2**x:.1f}: {s0:.2f}× at {b0}, {s:.2f}× at {b})"}
    return {"batch": None, "interpolated": None, "between": None,
            "text": f"none <= {pts[-1][0]} (still {pts[-1][1]:.2f}× at B = {pts[-1][0]})"}


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (a length difference counts), None when equal."""
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return j if j is not None or len(a) == len(b) else min(len(a), len(b))


def summarize(runs: list[dict], methods: list[str], batches: list[int]) -> dict:
    """Per method and B: tokens/s over repeats (median, min, max), τ, mismatches; per drafter the paired speedups
    and the crossover. `runs`: the per-run records (`method`, `batch`, `repeat`, `tokens_per_s`, `tau`, ...)."""
    by = {(r["method"], r["batch"], r["repeat"]): r for r in runs}
    repeats = sorted({r["repeat"] for r in runs})
    out: dict = {"methods": {}, "crossover": {}}
    for m in methods:
        rows = out["methods"][m] = {}
        for b in batches:
            got = [by[m, b, k] for k in repeats if (m, b, k) in by]
            if not got:
                continue
            tps = [r["tokens_per_s"] for r in got]
            row = rows[str(b)] = {
                "tokens_per_s": tps, "median_tokens_per_s": statistics.median(tps), "min_tokens_per_s": min(tps),
                "max_tokens_per_s": max(tps), "median_decode_tokens_per_s": statistics.median(
                    r["decode_tokens_per_s"] for r in got) if all("decode_tokens_per_s" in r for r in got) else None,
                "median_wall_s": statistics.median(r["wall_s"] for r in got),
                "tau": statistics.median(r["tau"] for r in got), "rounds": statistics.median(r["rounds"] for r in got),
                "mismatches": sum(r.get("mismatches") or 0 for r in got)}
            if m != AR:
                ks = [k for k in repeats if (m, b, k) in by and (AR, b, k) in by]
                if ks:
                    row["speedup"] = speedup_stats([by[m, b, k]["tokens_per_s"] for k in ks],
                                                   [by[AR, b, k]["tokens_per_s"] for k in ks])
        if m != AR:
            measured = [b for b in batches if "speedup" in rows.get(str(b), {})]
            out["crossover"][m] = crossover(measured, [rows[str(b)]["speedup"]["median"] for b in measured])
    out["mismatches"] = sum(r.get("mismatches") or 0 for r in runs)
    return out


def _ci(s: dict | None) -> str:
    if s is None:
        return "–"
    ci = f" [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" if s["ci95"] else ""
    return f"{s['median']:.2f}×{ci}"


def table_md(result: dict) -> str:
    """`table.md`: a row per B, tokens/s per method and each drafter's speedup with its CI, τ and mismatches, then
    the crossovers."""
    s, cfg, mach = result["summary"], result["config"], result["machine"]
    methods, batches = cfg["methods"], cfg["batches"]
    drafters = [m for m in methods if m != AR]
    load0, load1 = result["load_before"][0], result["load_after"][0]
    md = [f"# Batched speculation: tokens/s by batch size ({cfg['target']}, {result['dtype']}, "
          f"{cfg['max_new_tokens']} new tokens)", "",
          f"{mach['cpu']}, flags {', '.join(mach['cpu_flags']) or 'none'}; {mach['torch_threads']} threads of "
          f"{mach['cores']} cores; torch {result['torch']}; load {load0:.2f} before, {load1:.2f} after"
          + (" (BUSY)" if result["busy"] else "") + f"; medians of {cfg['repeats']} repeats; {result['when']}", "",
          f"Prompts at batch B: the first max({cfg['prompts_per_batch']} × B, {cfg['min_prompts']}) of the "
          f"{cfg['split']} split's first turns (prompt-index-major across {', '.join(cfg['benchmarks'])}); "
          f"drafts per round: {cfg['max_drafts_note']}. Speedup: tokens/s over AR's, paired within a repeat; "
          "median [95 % CI: t-interval of the mean log speedup over repeats].", ""]
    head = ["B", "prompts", *(f"{m} tok/s" for m in methods), *(f"{d} × AR" for d in drafters)]
    md += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for b in batches:
        rows = [s["methods"][m].get(str(b)) for m in methods]
        tps = [f"{r['median_tokens_per_s']:.1f}" if r else "–" for r in rows]
        sp = [_ci((s["methods"][d].get(str(b)) or {}).get("speedup")) for d in drafters]
        md.append(f"| {b} | {cfg['prompts'][str(b)]} | " + " | ".join(tps + sp) + " |")
    if drafters:
        md += ["", "τ (accepted tokens per verify, bonus included; median over repeats) and prompts whose tokens "
               "differ from AR's (summed over repeats):", "",
               "| B | " + " | ".join(f"{d} τ | {d} ≠ AR" for d in drafters) + " |",
               "|---:|" + "---:|---:|" * len(drafters)]
        for b in batches:
            cells = []
            for d in drafters:
                r = s["methods"][d].get(str(b))
                cells += [f"{r['tau']:.2f}", str(r["mismatches"])] if r else ["–", "–"]
            md.append(f"| {b} | " + " | ".join(cells) + " |")
        md += ["", "Crossover (the smallest B whose median speedup is ≤ 1):", ""]
        md += [f"- {d}: {s['crossover'][d]['text']}" for d in drafters]
    md += ["", f"Outputs differing from AR's: {s['mismatches']} in all"
           + (" (float32: must be 0)" if result["dtype"] == "torch.float32" else " (bf16: rounding among rows; "
              "reported, not hidden)"), "", f"Command: `{result['command']}`", ""]
    return "\n".join(md)


def plot(result: dict, path: Path) -> None:
    """`tokens_per_s.png`: median tokens/s against B (log2 axis), min-max bars, crossovers as dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, cfg = result["summary"], result["config"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, m in enumerate(cfg["methods"]):
        rows = s["methods"][m]
        bs = [b for b in cfg["batches"] if str(b) in rows]
        med = [rows[str(b)]["median_tokens_per_s"] for b in bs]
        err = [[med[j] - rows[str(b)]["min_tokens_per_s"] for j, b in enumerate(bs)],
               [rows[str(b)]["max_tokens_per_s"] - med[j] for j, b in enumerate(bs)]]
        colour = "black" if m == AR else colours[(i - 1) % len(colours)]
        c = s["crossover"].get(m)
        x = c and (c["interpolated"] or c["batch"])
        label = m if c is None else f"{m} (×1 at B≈{x:.1f})" if x else f"{m} (> ×1 up to B = {bs[-1]})" if bs else m
        ax.errorbar(bs, med, yerr=err, marker="o", capsize=3, color=colour, label=label,
                    linestyle="--" if m == AR else "-")
        if x:
            ax.axvline(x, color=colour, linestyle=":", linewidth=1.5)
            ax.annotate(f"{m} ×1 at B≈{x:.1f}" if c["interpolated"] else f"{m} ≤ ×1 at B={x}", (x, 0.98),
                        xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=8,
                        color=colour)
    ax.set_xscale("log", base=2)
    ax.set_xticks(cfg["batches"], [str(b) for b in cfg["batches"]])
    ax.set_xlabel("batch size B (rows)")
    ax.set_ylabel("tokens/s (median over repeats; bars: min-max)")
    ax.set_title(f"{cfg['target']} {result['dtype'].replace('torch.', '')}, {cfg['max_new_tokens']} new tokens, "
                 f"{result['machine']['torch_threads']} threads", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_tag(cpu: str, dtype: str, day: str) -> str:
    """`<date>-<cpu family>-<dtype>`, e.g. 2026-12-07-epyc-fp32 (the default results folder's name)."""
    words = [w.lower() for w in cpu.replace("(R)", " ").replace("(TM)", " ").replace("(tm)", " ").split()]
    family = next((w for w in words if w not in ("amd", "intel", "genuine", "cpu", "processor")), "cpu")
    short = {"float32": "fp32", "bfloat16": "bf16"}.get(dtype.replace("torch.", ""), dtype)
    return f"{day}-{''.join(ch for ch in family if ch.isalnum()) or 'cpu'}-{short}"


# ----------------------------------------------------------------------------------------------- the run
class Prompt:
    """A one-turn job (decoding/batch.py's protocol) that keeps its generation."""

    def __init__(self, ids: list[int]):
        self.ids, self.gen = ids, None

    def next_prompt(self, previous):
        if previous is None:
            return self.ids
        self.gen = previous
        return None


def _list(values: list[str], cast=str) -> list:
    """Space- or comma-separated values (`--batches 1 2 4` or `--batches 1,2,4`)."""
    out = [v for item in values for v in item.split(",") if v]
    bad = [v for v in out if "=" in v]
    if bad:
        raise SystemExit(f"bench_batch: {bad[0]!r} looks like a config override: put overrides after `--`")
    return [cast(v) for v in out]


def cap_arg(value: str):
    if value in ("auto", "null"):
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not valid; expected an int >= 1, null or auto")
    return int(value)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2_135m", help="target config (smollm2_135m: target.source=gguf "
                                                             "unless an override sets target.source)")
    ap.add_argument("--drafters", nargs="+", default=["dflash", "dels_rnn", "dedit", "eagle3"],
                    help="drafters beside AR, each with its committed checkpoint for the target (drafter.init=auto)")
    ap.add_argument("--batches", nargs="+", default=["1", "2", "4", "8", "16", "32"])
    ap.add_argument("--prompts-per-batch", type=int, default=2, help="a run at batch B decodes max(this x B, "
                                                                     "--min-prompts) prompts")
    ap.add_argument("--min-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-drafts", type=cap_arg, default="null",
                    help="drafts a round verifies at most: an int, null (each drafter's own K, the default) or auto "
                         "(eval.max_drafts=auto: 3 for a bf16 target on a CPU)")
    ap.add_argument("--out", type=Path, default=None, help="default experiments/results/batch/<date>-<cpu>-<dtype>")
    ap.add_argument("overrides", nargs="*", help="config overrides for the target and every drafter (after --)")
    args = ap.parse_args(argv)
    args.drafters = _list(args.drafters)
    args.batches = sorted(set(_list(args.batches, int)))
    if not args.batches or args.batches[0] < 1:
        ap.error("--batches: sizes >= 1")
    if args.repeats < 1 or args.max_new_tokens < 1 or args.prompts_per_batch < 1 or args.min_prompts < 1:
        ap.error("--repeats, --max-new-tokens, --prompts-per-batch and --min-prompts must be >= 1")
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    load_before = os.getloadavg()               # before this process loads anything: the machine's own load
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv, load_before)
    finally:
        torch.set_num_threads(threads)          # main() called in-process (tests) leaves torch as it found it


def _run(args, argv: list[str], load_before) -> int:
    import torch
    from tqdm import tqdm

    from specexp import benchmarks, registry
    from specexp.api import compose
    from specexp.config import BenchmarkConfig, EvalConfig
    from specexp.decoding.batch_spec import speculate_batched
    from specexp.decoding.engine import DecodeConfig, drafts_per_round
    from specexp.decoding.settings import max_drafts
    from specexp.eval.references import batch_engine, turn_prompt
    from specexp.machine import cpu_info, describe

    cpu = torch.device("cpu")
    over = list(args.overrides)
    if args.target == "smollm2_135m" and not any(o.startswith("target.source=") for o in over):
        over.insert(0, "target.source=gguf")
    n_max = prompts_for(args.batches[-1], args.prompts_per_batch, args.min_prompts)
    base = [f"target={args.target}", f"target.dtype={args.dtype}", "device=cpu", f"eval.num_samples={n_max}",
            f"eval.max_new_tokens={args.max_new_tokens}"]

    def config(drafter: str):
        extra = ["drafter.mode=chain"] if drafter == "eagle3" and not any(
            o.startswith("drafter.mode=") for o in over) else []
        mine = over if drafter != "none" else [o for o in over if not o.startswith("drafter.")]
        return compose([*base, f"drafter={drafter}", *mine, *extra])[0]

    cfg = config("none")
    target = batch_engine(registry.build_target(cfg.target, cpu))      # the static engine the batched loop needs
    ev = EvalConfig.from_cfg(cfg.eval)
    bench = BenchmarkConfig.from_cfg(cfg.benchmark)
    samples = benchmarks.from_config(bench, ev)
    count, index = {}, []
    for s in samples:                                                   # prompt-index-major across benchmarks
        index.append(count.get(s.benchmark, 0))
        count[s.benchmark] = index[-1] + 1
    samples = [s for _, s in sorted(zip(index, samples), key=lambda p: p[0])][:n_max]
    if len(samples) < n_max:
        raise SystemExit(f"bench_batch: {len(samples)} prompts in the {ev.split} split, {n_max} needed "
                         f"(--batches {args.batches[-1]} x --prompts-per-batch {args.prompts_per_batch})")
    prompts = [turn_prompt(target, [{"role": "user", "content": s.turns[0]}]) for s in samples]
    cap = None if args.max_drafts == "null" else max_drafts(args.max_drafts, cpu, target.dtype)
    dc = DecodeConfig(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(target.stop_token_ids),
                      max_drafts=cap)
    drafters = {AR: None}
    for name in args.drafters:
        drafters[name] = registry.build_drafter(config(name).drafter, target)
    methods = list(drafters)
    n_of = {b: prompts_for(b, args.prompts_per_batch, args.min_prompts) for b in args.batches}

    def run(method: str, b: int, n: int, dcfg) -> tuple[dict, list]:
        jobs = [Prompt(p) for p in prompts[:n]]
        t0 = time.perf_counter()
        rounds = speculate_batched(target, drafters[method], jobs, dcfg, b, lambda j: None)
        wall = time.perf_counter() - t0
        gens = [j.gen for j in jobs]
        tokens = sum(len(g.tokens) for g in gens)
        acc = [a for g in gens for a in g.accept_lengths]
        prefill = sum(g.ttft_s for g in gens)
        rec = {"method": method, "batch": b, "prompts": n, "wall_s": wall, "tokens": tokens,
               "tokens_per_s": tokens / wall, "rounds": rounds, "verifies": len(acc),
               "tau": sum(acc) / len(acc) if acc else None, "prefill_s": prefill,
               "decode_tokens_per_s": (tokens - n) / (wall - prefill) if wall > prefill else None,
               "stopped": sum(g.stop_reason == "stop" for g in gens)}
        return rec, [g.tokens for g in gens]

    print(f"bench_batch: {target.name} {target.dtype}, methods {methods}, batches {args.batches} "
          f"(prompts {[n_of[b] for b in args.batches]}), {args.max_new_tokens} tokens, {args.repeats} repeats, "
          f"K {[drafts_per_round(d, dc) for d in drafters.values()]}", flush=True)
    warm = DecodeConfig(max_new_tokens=min(16, args.max_new_tokens), stop_token_ids=dc.stop_token_ids,
                        max_drafts=cap)
    for m in methods:                                                   # first calls allocate and dispatch
        run(m, 2, 2, warm)
    load_start = os.getloadavg()
    runs = []
    bar = tqdm(total=args.repeats * len(args.batches) * len(methods), desc="bench_batch", unit="run")
    for rep in range(args.repeats):
        order = methods[rep % len(methods):] + methods[:rep % len(methods)]
        for b in args.batches:
            outs = {}
            for m in order:
                rec, outs[m] = run(m, b, n_of[b], dc)
                rec["repeat"] = rep
                runs.append(rec)
                bar.set_postfix_str(f"r{rep} B={b} {m} {rec['tokens_per_s']:.1f} tok/s")
                bar.update()
            for rec in runs[-len(methods):]:                            # against AR's tokens, same repeat and B
                if rec["method"] != AR:
                    diff = {i: first_mismatch(got, ref)
                            for i, (got, ref) in enumerate(zip(outs[rec["method"]], outs[AR])) if got != ref}
                    rec["mismatches"], rec["first_mismatch"] = len(diff), diff
    bar.close()
    load_after = os.getloadavg()

    machine = {**describe(cpu), "flags": cpu_info()["flags"]}
    result = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine,
        "torch": torch.__version__, "threads": args.threads, "load_before": load_before, "load_start": load_start,
        "load_after": load_after, "busy": load_before[0] > 0.5, "dtype": str(target.dtype),
        "config": {"target": target.name, "engine": type(target).__name__, "methods": methods,
                   "batches": args.batches, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
                   "prompts_per_batch": args.prompts_per_batch, "min_prompts": args.min_prompts,
                   "prompts": {str(b): n for b, n in n_of.items()}, "prompt_tokens": [len(p) for p in prompts],
                   "sample_ids": [s.id for s in samples], "split": ev.split, "benchmarks": list(bench.names),
                   "first_turns_only": True, "stop_token_ids": list(dc.stop_token_ids), "max_drafts": cap,
                   "max_drafts_note": f"at most {cap}" if cap is not None else "each drafter's own K",
                   "drafts_per_round": {m: drafts_per_round(d, dc) for m, d in drafters.items()},
                   "overrides": over, "warmup": "one run per method: 2 prompts, 2 rows, 16 tokens",
                   "order": "per repeat, per B, every method; methods rotated by one per repeat",
                   "speedup_ci": "95 % Student t-interval of the mean log paired speedup over repeats, exponentiated",
                   "crossover": "smallest measured B with median speedup <= 1; interpolated linearly in log2 B"},
        "runs": runs, "summary": summarize(runs, methods, args.batches),
        "command": "python experiments/bench_batch.py " + " ".join(argv)}
    out = args.out or REPO / "experiments" / "results" / "batch" / machine_tag(
        machine["cpu"], str(target.dtype), datetime.now().strftime("%Y-%m-%d"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = table_md(result)
    (out / "table.md").write_text(md)
    plot(result, out / "tokens_per_s.png")
    print(md)
    print(f"bench_batch: wrote {out}/results.json, table.md, tokens_per_s.png", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
