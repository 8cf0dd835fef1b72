"""specexp's decoding beside the peers, in one run on one machine: HF `generate` greedy and HF prompt-lookup
decoding, specexp AR and a specexp drafter, each on both target engines (`target.engine=hf`, the HF-eager
reference, and `static`, the preallocated KV cache of static_target.py). Same prompts, threads and token budget;
the contenders are interleaved prompt by prompt in every repeat, so a change of machine load falls on all of them.

Printed and written (`--out`): per contender the median over repeats of the decode time summed over the prompts,
tokens per second, and its speed against HF greedy as a geometric mean over prompts with a bootstrap 95 % CI
(prompts resampled; each prompt's time is its median over repeats). Also the parts of a round in AR steps for
each engine (a 1-row step, the drafter's verify of k + 1 rows, the drafter's proposal), whether every specexp
output equals HF greedy token for token, and the machine: CPU model and flags (avx2, avx512f, avx512_bf16,
amx_bf16), threads, load average before and after, library versions.

    python experiments/bench_engine.py --threads 2 --prompts 6 --tokens 96 --repeats 3 \
        --out experiments/results/engine/$(date +%F)

CPU wall clock: run it on an otherwise idle machine (the load is recorded, and a busy run is marked as such).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402

from specexp.machine import FLAGS, cpu_info  # noqa: E402


def median_ms(f, reps: int) -> float:
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


def geo_ci(ratios: list[float], seed: int = 0, n: int = 2000) -> tuple[float, float, float]:
    """Geometric mean of per-prompt ratios and its bootstrap 95 % CI (prompts resampled)."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n))
    return math.exp(statistics.fmean(logs)), math.exp(means[int(0.025 * n)]), math.exp(means[int(0.975 * n) - 1])


def main() -> None:
    from hydra import compose, initialize_config_dir

    from specexp import benchmarks, registry
    from specexp.cli import CONF_DIR
    from specexp.decoding.engine import DecodeConfig, drafts_per_round, generate
    from specexp.static_target import StaticTarget

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--drafter", default="dflash")
    ap.add_argument("--benchmark", default="gsm8k")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lookup", type=int, default=3, help="HF prompt lookup: tokens proposed per step")
    ap.add_argument("--out", type=Path)
    ap.add_argument("overrides", nargs="*", help="further config overrides (e.g. drafter.checkpoint=DIR)")
    args = ap.parse_args()
    load_before = os.getloadavg()                # before this process loads or runs anything: the machine's own load
    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"target={args.target}", f"drafter={args.drafter}", "device=cpu",
                                 f"benchmark={args.benchmark}", *args.overrides])
    hf = registry.build_target(cfg.target, torch.device("cpu"))
    static = StaticTarget.of(hf)                               # the same modules and weights, another engine
    drafter_cfg = registry.fill_default_checkpoints(cfg.drafter, hf.name)
    drafters = {"hf": registry.build_drafter(drafter_cfg, hf), "static": registry.build_drafter(drafter_cfg, static)}
    # The tuning split: a speed measurement chooses nothing, but it stays off the evaluation prompts all the same.
    samples = benchmarks.load([args.benchmark], args.prompts, split="tune", tune_samples=args.prompts)
    prompts = [hf.encode_chat([{"role": "user", "content": s.turns[0]}]) for s in samples]
    stops = tuple(hf.stop_token_ids)
    dc = DecodeConfig(max_new_tokens=args.tokens, stop_token_ids=stops)
    model = hf.model
    gen_kw = dict(do_sample=False, max_new_tokens=args.tokens, eos_token_id=list(stops), pad_token_id=stops[0])

    def hf_generate(ids, **kw):
        t0 = time.perf_counter()
        out = model.generate(torch.tensor([ids]), **gen_kw, **kw)[0, len(ids):].tolist()
        return out, time.perf_counter() - t0

    def ours(target, drafter):
        def run(ids):
            t0 = time.perf_counter()
            g = generate(target, drafter, ids, dc)
            return g.tokens, time.perf_counter() - t0, g
        return run

    contenders = {
        "HF generate greedy": lambda ids: hf_generate(ids),
        f"HF prompt lookup ({args.lookup})": lambda ids: hf_generate(ids, prompt_lookup_num_tokens=args.lookup),
        "specexp AR, engine=hf": ours(hf, None),
        "specexp AR, engine=static": ours(static, None),
        f"specexp {args.drafter}, engine=hf": ours(hf, drafters["hf"]),
        f"specexp {args.drafter}, engine=static": ours(static, drafters["static"]),
    }
    load_start = os.getloadavg()
    times = {name: [[0.0] * args.repeats for _ in prompts] for name in contenders}
    tokens, taus, exact = {}, {}, {}
    with torch.inference_mode():
        for ids in prompts[:1]:                                # warm-up: first calls allocate and dispatch
            for run in contenders.values():
                run(ids)
        for r in range(args.repeats):
            for p, ids in enumerate(prompts):
                for name, run in contenders.items():
                    out = run(ids)
                    times[name][p][r] = out[1]
                    tokens.setdefault(name, [None] * len(prompts))[p] = len(out[0])
                    if len(out) == 3 and r == 0:
                        acc = out[2].accept_lengths
                        taus.setdefault(name, []).append((sum(acc), len(acc)))
                    if r == 0:
                        exact.setdefault(name, []).append(out[0])
            print(f"repeat {r + 1}/{args.repeats} done", flush=True)

        # The parts of a round, in AR steps, at the first prompt's context.
        parts = {}
        k = drafts_per_round(drafters["hf"], dc)
        for eng, target in (("hf", hf), ("static", static)):
            drafter, ids = drafters[eng], torch.tensor([prompts[0]])
            cache = target.new_cache(ids.shape[1] + k + 8)
            _, hidden = target.forward(ids, 0, cache, taps=drafter.tap_layers)
            drafter.reset()
            drafter.prefill(hidden)
            start = ids.shape[1]

            def step(rows, target=target, cache=cache, drafter=drafter, start=start):
                target.forward(torch.full((1, rows), 100), start, cache, taps=drafter.tap_layers)
                target.rollback(cache, rows)

            ar_ms = median_ms(lambda: step(1), 15)
            verify_ms = median_ms(lambda: step(k + 1), 15)
            propose_ms = median_ms(lambda: drafter.propose(100, start, k, None), 15)
            parts[eng] = {"ar_step_ms": ar_ms, "verify_ms": verify_ms, "propose_ms": propose_ms, "k": k,
                          "verify_in_ar": verify_ms / ar_ms, "round_in_ar": (verify_ms + propose_ms) / ar_ms}
    load_end = os.getloadavg()

    greedy = exact["HF generate greedy"]
    same = {name: sum(a == b for a, b in zip(outs, greedy)) for name, outs in exact.items()}
    base = "HF generate greedy"
    per_prompt = {name: [statistics.median(ts) for ts in times[name]] for name in contenders}
    rows = []
    for name in contenders:
        total = statistics.median(sum(times[name][p][r] for p in range(len(prompts))) for r in range(args.repeats))
        n_tok = sum(tokens[name])
        g, lo, hi = geo_ci([b / a for a, b in zip(per_prompt[name], per_prompt[base])])
        tau = taus.get(name)
        rows.append({"contender": name, "seconds": total, "tokens": n_tok, "tok_per_s": n_tok / total,
                     "speed_vs_hf_greedy": g, "ci95": [lo, hi], "equals_hf_greedy": f"{same[name]}/{len(prompts)}",
                     "tau": sum(a for a, _ in tau) / sum(b for _, b in tau) if tau else None})
    busy = load_before[0] > 0.5                  # the run's own threads load the machine too: judged before it began
    machine = {"cpu": cpu_info(), "threads": args.threads, "load_1min_before": load_before[0],
               "load_1min": [load_start[0], load_end[0]],
               "busy": busy, "torch": torch.__version__, "python": platform.python_version(),
               "transformers": __import__("transformers").__version__, "dtype": str(hf.dtype),
               "when": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    flags = ", ".join(f for f, on in machine["cpu"]["flags"].items() if on) or "none of " + ", ".join(FLAGS)
    lines = [f"# Engines side by side: {args.drafter} on {args.target}, {len(prompts)} {args.benchmark} prompts "
             f"(tuning split), {args.tokens} tokens, {args.threads} thread(s), {args.repeats} repeats",
             "", f"CPU {machine['cpu']['model']} ({machine['cpu']['cores']} cores; flags: {flags}); {hf.dtype}; "
                 f"load before the run {load_before[0]:.2f}{' (BUSY: timings are not clean)' if busy else ' (idle)'}, "
                 f"during {load_start[0]:.2f} → {load_end[0]:.2f}; "
                 f"torch {torch.__version__}, transformers {machine['transformers']}.", "",
             "| contender | s (median of repeats) | tokens | tok/s | × HF greedy [95 % CI] | τ | = HF greedy |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        tau = f"{r['tau']:.2f}" if r["tau"] is not None else "–"
        lines.append(f"| {r['contender']} | {r['seconds']:.2f} | {r['tokens']} | {r['tok_per_s']:.1f} | "
                     f"{r['speed_vs_hf_greedy']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {tau} | "
                     f"{r['equals_hf_greedy']} |")
    lines += ["", f"A round's parts (first prompt's context, {k} drafts; medians of 15, ms):", "",
              "| engine | AR step | verify k+1 | in AR steps | propose k | round in AR steps |",
              "|---|---:|---:|---:|---:|---:|"]
    for eng, p in parts.items():
        lines.append(f"| {eng} | {p['ar_step_ms']:.1f} | {p['verify_ms']:.1f} | {p['verify_in_ar']:.2f} | "
                     f"{p['propose_ms']:.1f} | {p['round_in_ar']:.2f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_engine.md").write_text(md)
        (args.out / "bench_engine.json").write_text(json.dumps(
            {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "machine": machine, "rows": rows, "round_parts": parts,
             "seconds_by_prompt_and_repeat": times}, indent=1) + "\n")


if __name__ == "__main__":
    main()
