"""task=train target=tiny_qwen3 data=smoke train=smoke (flex attention, torch.compile,
bf16-mixed on GPU)

Why: training takes GPU-only paths (flex attention compiled by torch.compile, bf16-mixed precision) where the CPU
tests use a dense attention mask in fp32: a few steps of them run here.

Time limit 40 -> 39 s (PARTS in scripts/gpu_check.py; seconds on one H200): H200 37 s (torch.compile of flex
attention). CPU dry run 38 s
"""
import math
import time

from gpu_parts.common import run_specexp


def run(ctx) -> dict:
    import json as _json
    import shutil

    dev = ctx.device
    cache = ctx.work / "train-cache"                                    # a fresh cache: the stage trains, not reuses
    tok = ctx.cache / "qwen3-tokenizer-v1"                              # ... but the tokenizer need not be rebuilt
    if tok.is_dir() and not (cache / tok.name).exists():
        shutil.copytree(tok, cache / tok.name)
    o = ["task=train", "target=tiny_qwen3", "data=smoke", "train=smoke", f"device={dev.type}", "logger=none",
         f"paths.cache={cache}", *(["train.max_steps=6"] if ctx.dry else [])]
    out = ctx.work / "train"
    t0 = time.perf_counter()
    run_specexp(o, out)
    s = _json.loads((out / "train_summary.json").read_text())
    loss = {k: v for k, v in (s.get("final_metrics") or {}).items() if "loss" in k}
    checks = {"trained_steps": (s.get("steps") or 0) > 0,
              "finite_loss": bool(loss) and all(math.isfinite(v) for v in loss.values())}
    if dev.type == "cuda":
        checks["bf16_mixed"] = s.get("precision") == "bf16-mixed"
    return {"figures": {"seconds": time.perf_counter() - t0, "steps": s.get("steps"), "precision": s.get("precision"),
                        "train_seconds": s.get("train_seconds"), "peak_memory_mb": s.get("peak_memory_mb"),
                        "final_loss": loss, "overrides": o},
            "checks": checks,
            "notes": ["GPU: flex attention (train.attention=auto), compiled (drafters/dflash._flex), bf16-mixed"
                      if dev.type == "cuda" else "CPU: dense attention mask, fp32"]}
