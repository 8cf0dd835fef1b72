"""The static engine's steps eager against compiled (`target.compile=true`, targets/static.py) on one machine: an AR
step (1 row) and a verify of k + 1 rows after a real prompt, each rolled back, per engine:

  eager       target.engine=static: the sliced window `[:length + T]`, plain PyTorch
  window      the fixed-shape step without inductor: the whole padded window, plain PyTorch (what the padding costs)
  layer       the fixed-shape step with its decoder layer compiled once by torch.compile(dynamic=False) and that
              code run for every layer (inductor's C++/OpenMP code on a CPU): target.compile=true
  step        the whole fixed-shape step as one compiled graph (`unit="step"`: compilation grows with the depth)

Compilation is timed apart (the first call of each shape, with inductor's caches in a fresh directory unless
--warm-cache). Then repeats, interleaved engine by engine so a change of load falls on all of them: each repeat
takes the median of --calls calls; reported is the median over repeats (and every repeat's value). Also: the
compiled logits against the eager ones (max |difference|, argmax agreement) and an AR generation on each engine,
token for token.

    python experiments/bench_compile.py --threads 1 --repeats 5 --out experiments/results/engine/$(date +%F)-compile

CPU wall clock: the load average before and during the run is recorded, and a busy machine is marked as such.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--benchmark", default="gsm8k")
    ap.add_argument("--verify", type=int, default=8, help="rows of the verify step (k + 1)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10, help="calls per repeat (their median is the repeat's value)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32, help="AR generation compared token for token")
    ap.add_argument("--units", default="layer,step", help="compiled variants to run: layer, step or both")
    ap.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk caches (default: a fresh one)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load_before = os.getloadavg()
    if not args.warm_cache:                      # cold compilation: nothing reused from an earlier run
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_compile_inductor-")

    import torch
    from hydra import compose, initialize_config_dir

    from specexp import benchmarks, registry
    from specexp.cli import CONF_DIR
    from specexp.decoding.engine import DecodeConfig, generate
    from specexp.machine import FLAGS, cpu_info
    from specexp.targets.static import StaticTarget

    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"target={args.target}", f"target.dtype={args.dtype}", "drafter=none", "device=cpu",
                                 "target.prepack=false",       # the compiled step packs its own weights
                                 f"benchmark={args.benchmark}"])
    hf = registry.build_target(cfg.target, torch.device("cpu"))
    engines = {"eager": StaticTarget.of(hf), "window": StaticTarget.of(hf, compile=True, inductor=False),
               **{u: StaticTarget.of(hf, compile=True, unit=u) for u in args.units.split(",")}}
    sample = benchmarks.load([args.benchmark], 1, split="tune", tune_samples=1)[0]
    prompt = hf.encode_chat([{"role": "user", "content": sample.turns[0]}])
    P, V = len(prompt), args.verify
    ids = torch.tensor([prompt])
    g = torch.Generator().manual_seed(0)
    block = torch.randint(0, 1000, (1, V), generator=g)
    caches, steps = {}, {}
    compile_s, logits = {}, {}
    with torch.inference_mode():
        for name, t in engines.items():
            c = caches[name] = t.new_cache(P + 64)
            t.forward(ids, 0, c)                                     # the prefill: eager on every engine

            def step(rows, t=t, c=c):
                out = t.forward(block[:, :rows], P, c)
                t.rollback(c, rows)
                return out
            steps[name] = step
            for rows in (1, V):                                      # first calls: compilation (and allocation)
                t0 = time.perf_counter()
                logits[name, rows] = step(rows)[0][0]
                compile_s[name, rows] = time.perf_counter() - t0
        load_start = os.getloadavg()
        reps = {(name, rows): [] for name in engines for rows in (1, V)}
        for _ in range(args.repeats):
            for rows in (1, V):
                for name in engines:
                    ts = []
                    for _ in range(args.calls):
                        t0 = time.perf_counter()
                        steps[name](rows)
                        ts.append(time.perf_counter() - t0)
                    reps[name, rows].append(1000 * statistics.median(ts))
        load_end = os.getloadavg()
        gens = {name: generate(t, None, prompt, DecodeConfig(max_new_tokens=args.tokens)).tokens
                for name, t in engines.items()}

    def ms(name, rows):
        return statistics.median(reps[name, rows])

    agree = {name: {str(rows): {"max_abs_logit_diff": float((logits[name, rows] - logits["eager", rows]).abs().max()),
                                "argmax_equal": bool(torch.equal(logits[name, rows].argmax(-1),
                                                                 logits["eager", rows].argmax(-1)))}
                    for rows in (1, V)} for name in engines}
    busy = load_before[0] > 0.5
    cpu = cpu_info()
    flags = ", ".join(f for f, on in cpu["flags"].items() if on) or "none of " + ", ".join(FLAGS)
    machine = {"cpu": cpu, "threads": args.threads, "load_1min_before": load_before[0],
               "load_1min": [load_start[0], load_end[0]], "busy": busy, "torch": torch.__version__,
               "python": platform.python_version(), "transformers": __import__("transformers").__version__,
               "dtype": str(hf.dtype), "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "inductor_cache": "warm (kept)" if args.warm_cache else "cold (fresh directory)"}
    lines = [f"# Static engine eager vs compiled: {args.target} ({hf.dtype}), context {P} tokens (first "
             f"{args.benchmark} prompt of the tuning split), {args.threads} thread(s)", "",
             f"CPU {cpu['model']} ({cpu['cores']} cores; flags: {flags}); load before the run {load_before[0]:.2f}"
             f"{' (BUSY: timings are not clean)' if busy else ' (idle)'}, during {load_start[0]:.2f} → "
             f"{load_end[0]:.2f}; torch {torch.__version__}, transformers {machine['transformers']}; inductor cache "
             f"{machine['inductor_cache']}.", "",
             f"ms per call: median over {args.repeats} repeats of the median of {args.calls} calls (each repeat's "
             f"value in the JSON); the window's capacity {caches['window'].capacity} positions.", "",
             f"| engine | AR step | verify-{V} | verify-{V} in AR steps | first call (1 row), s | first call ({V} "
             f"rows), s | logits vs eager (max abs) | argmax = eager | AR {args.tokens} tokens = eager |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for name in engines:
        a = agree[name]
        lines.append(f"| {name} | {ms(name, 1):.1f} | {ms(name, V):.1f} | {ms(name, V) / ms(name, 1):.2f} | "
                     f"{compile_s[name, 1]:.1f} | {compile_s[name, V]:.1f} | "
                     f"{max(a[k]['max_abs_logit_diff'] for k in a):.1e} | "
                     f"{'yes' if all(a[k]['argmax_equal'] for k in a) else 'NO'} | "
                     f"{'yes' if gens[name] == gens['eager'] else 'NO'} |")
    lines += [""] + [f"{u} / eager: AR step {ms(u, 1) / ms('eager', 1):.2f}×, verify-{V} "
                     f"{ms(u, V) / ms('eager', V):.2f}× the time." for u in args.units.split(",")]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_compile.md").write_text(md)
        (args.out / "bench_compile.json").write_text(json.dumps(
            {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "machine": machine, "context_tokens": P, "capacity": caches["window"].capacity,
             "ms_per_call": {f"{n}/{r}": {"median": ms(n, r), "repeats": reps[n, r]} for n, r in reps},
             "first_call_s": {f"{n}/{r}": s for (n, r), s in compile_s.items()}, "agreement": agree,
             "ar_tokens_equal_eager": {n: gens[n] == gens["eager"] for n in engines}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
