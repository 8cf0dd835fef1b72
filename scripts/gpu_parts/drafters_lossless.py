"""Every drafter of the registry on tiny_qwen3, fp32, greedy, through task=eval (in-process
run_task): lossless against AR, exactly

Why: speculation must not change the greedy output: this checks it for every drafter through the path a run takes
(task=eval), on the GPU's kernels (the Triton fusion kernel and CUDA graphs for the sequential heads) where the CPU
tests run the torch reference.

Time limit 55 -> 52 -> 51 s (PARTS in scripts/gpu_check.py; seconds on one H200): H200 49 s. CPU dry run 145 s
"""
import time

from gpu_parts.common import run_specexp, step


def run(ctx) -> dict:
    import json as _json

    from helpers import STRONG
    from specexp import registry

    dev = ctx.device
    names = [n for n, e in registry.DRAFTERS.items() if e.build is not None]
    figures, checks = {}, {}
    for name in names:
        o = ["task=eval", "target=tiny_qwen3", f"drafter={name}", "drafter.init=random", *STRONG.get(name, []),
             "benchmark=gsm8k", f"eval.num_samples={1 if ctx.dry else 2}",
             f"eval.max_new_tokens={8 if ctx.dry else 48}", "eval.warmup=0", "eval.progress=false", "logger=none",
             f"device={dev.type}", "target.dtype=float32", "decoding=greedy"]
        if dev.type == "cuda" and name in ("dels_rnn", "dels_markov", "domino_ft"):
            o += ["fusion.kernel=triton", "fusion.cuda_graph=true"]
        out = ctx.work / "drafters" / name
        t0 = time.perf_counter()
        checks[f"{name}_lossless"] = False
        with step(figures, checks, name):
            run_specexp(o, out)
            s = _json.loads((out / "summary.json").read_text())["benchmarks"]["gsm8k"]
            figures[name] = {"tau": s["tau"], "speedup": s["speedup"], "tpot_ms": s["tpot_ms"],
                             "lossless_mismatches": s["lossless_mismatches"],
                             "lossless_near_ties": s.get("lossless_near_ties"), "seconds": time.perf_counter() - t0,
                             "overrides": o}
            checks[f"{name}_lossless"] = s["lossless_mismatches"] == 0      # near-ties are reported, not failed
    return {"figures": figures, "checks": checks,
            "notes": ["fp32: equality with AR expected; a verify-block vs AR-step near-tie (gap < eval.near_tie, "
                      "0.01) on GPU kernels is counted in lossless_near_ties and does not fail the check" +
                      ("; DeLS / Domino-FT with fusion.kernel=triton fusion.cuda_graph=true" if dev.type == "cuda"
                       else "; CPU: the fusion kernel's torch reference, no CUDA graph")]}
