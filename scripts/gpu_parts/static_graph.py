"""target.engine=static target.compile=true at Qwen3-8B shapes (random weights, bf16): the AR
step and a verify of 16 rows through the eager static engine, the fixed-shape step captured
as CUDA graphs (plain PyTorch) and compiled by inductor then captured; first-call seconds
(capture, compilation), host syncs per step (none on the graph paths), logits against the
eager static engine (argmax equal where the top-2 gap exceeds twice the difference), every
time over the HBM floor (weights but the embedding and the KV cache, over the read bandwidth
measured by a sum over 1 GiB)

Why: at batch 1 on a GPU a step's many small launches, not the bytes it reads, can set its time: the static engine's
fixed-shape steps are there to be replayed as CUDA graphs (on a CPU they buy nothing measurable). Only a GPU shows
how far each path stays above the HBM floor, and that the captured steps compute the eager engine's logits without a
host sync.

Time limit 90 -> 80 -> 75 s (PARTS in scripts/gpu_check.py; seconds on one H200): not yet run on a GPU; estimated:
start + build ~15 s, eager timings (20 iterations x 5 repeats of a ~35 ms step and a verify) ~10 s, two captures of
the plain step ~5 s, inductor compiling one decoder layer per shape (2 shapes) and capturing ~30-60 s. CPU dry run
54 s
"""
import time

from gpu_parts.common import (
    build_qwen3,
    peak_memory,
    qwen3_dtype,
    qwen3_shape,
    read_bandwidth,
    step,
    step_bytes,
    sync,
    syncs_of,
    time_ms,
)


def run(ctx) -> dict:
    """`target.engine=static target.compile=true` at Qwen3-8B shapes: the AR step and a verify of 16 rows through
    the eager static engine, the fixed-shape step captured as CUDA graphs (plain PyTorch, `inductor=False`) and the
    same compiled by inductor (its decoder layer, `unit="layer"`) and captured; first-call seconds (capture,
    compilation), host syncs per step, logits against the eager static engine, each beside the HBM floor: the bytes
    a step must read (every weight but the embedding table, and the KV cache) over the device's measured read
    bandwidth."""
    import torch

    from specexp.eval.metrics import top2_gap
    from specexp.kernels import graphs
    from specexp.targets.static import StaticTarget

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = qwen3_shape(ctx)
    t0 = time.perf_counter()
    t, impl = build_qwen3(ctx, shape, dtype, name="static_graph")
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "build_s": time.perf_counter() - t0, "engines": {}}
    checks, notes = {}, []
    P, B = (64 if ctx.dry else ctx.args.context), 16
    iters = 1 if ctx.dry else 20
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 151643, (1, P), generator=g).to(dev)                             # [1, P]
    block = torch.randint(0, 151643, (1, B), generator=g).to(dev)                              # [1, B]
    if not cuda:                               # the graph path's buffers and pool, with the capture a plain call
        from helpers import EagerLoop

        graphs.GraphedLoop = EagerLoop
        notes.append("dry run: the CUDA-graph path runs with its capture replaced by a plain call of the captured "
                     "body (tests/helpers.EagerLoop): static buffers, pool and shapes are exercised, CUDA graphs not")
    variants = {"eager": dict(compile=False), "graph": dict(compile=True, inductor=False),
                "compiled_graph": dict(compile=True, inductor=True)}
    ref, window = {}, P
    for name, kw in variants.items():
        with step(f, checks, name):
            st = StaticTarget.of(t, **kw)
            st.graphs = st.compiled                     # on a CPU too (EagerLoop above)
            cache = st.new_cache(P + 2 * B)
            window = max(window, cache.capacity)
            with torch.inference_mode():
                st.forward(prompt, 0, cache)

            def run(rows, st=st, cache=cache):
                out = st.forward(block[:, :rows], P, cache)
                st.rollback(cache, rows)
                return out
            row = f["engines"][name] = {"capacity": cache.capacity}
            for rows, key in ((1, "ar"), (B, "verify")):
                sync(dev)
                t1 = time.perf_counter()
                logits = run(rows)[0][0].float()                                                 # [rows, V]
                sync(dev)
                row[f"{key}_first_call_s"] = time.perf_counter() - t1
                row[f"{key}_ms"] = time_ms(lambda rows=rows: run(rows), dev, iters)
                row[f"{key}_syncs"] = syncs_of(lambda rows=rows: run(rows), dev)
                if name == "eager":
                    ref[key] = logits
                    continue
                diff = float((logits - ref[key]).abs().max())
                same = logits.argmax(-1) == ref[key].argmax(-1)                                   # [rows]
                clear = top2_gap(ref[key]) > 2 * diff            # no rounding within `diff` can flip these argmaxes
                row[f"{key}_max_abs_logit_diff_vs_eager"] = diff
                row[f"{key}_argmax_agreement_vs_eager"] = float(same.float().mean())
                checks[f"{name}_{key}_matches_eager"] = bool(same[clear].all())
                if cuda:
                    checks[f"{name}_{key}_has_no_sync"] = row[f"{key}_syncs"] == 0
            row["verify_in_ar_steps"] = row["verify_ms"] / row["ar_ms"]
            if name != "eager" and "eager" in f["engines"]:
                row["ar_speedup_vs_eager"] = f["engines"]["eager"]["ar_ms"] / row["ar_ms"]
                row["verify_speedup_vs_eager"] = f["engines"]["eager"]["verify_ms"] / row["verify_ms"]
            ctx.save_partial(f, checks, notes)
            st = cache = None
            if cuda:
                torch.cuda.empty_cache()

    # the floor: the bytes of one step (weights but the embedding table, the KV cache of the context or of the padded
    # window) over the measured read bandwidth (a sum over 1 GiB of the model's dtype: reads only)
    weights, kv_per_pos = step_bytes(t.model, shape, dtype)
    with step(f, checks, "read_bandwidth"):
        bw = read_bandwidth(dev, dtype)
        floor = {"read_bandwidth_gbs": bw / 1e9, "weight_bytes": weights, "kv_bytes_context": kv_per_pos * P,
                 "kv_bytes_window": kv_per_pos * window, "window": window,
                 "floor_ms": (weights + kv_per_pos * P) / bw * 1e3,
                 "floor_ms_window": (weights + kv_per_pos * window) / bw * 1e3,
                 "assumed_tbs": ctx.args.hbm_tbs, "floor_ms_assumed": (weights + kv_per_pos * P)
                 / (ctx.args.hbm_tbs * 1e12) * 1e3}
        for name, row in f["engines"].items():
            for key in ("ar", "verify"):
                if f"{key}_ms" in row:
                    row[f"{key}_over_floor"] = row[f"{key}_ms"] / floor["floor_ms"]
        f["hbm"] = floor
    f["peak_memory"] = peak_memory(dev)
    if f["scaled"]:
        notes.append(f"scaled shape: {shape} (Qwen3-8B: hidden 4096, 36 layers, 32/8 heads, 12288, 151936)")
    if not cuda:
        notes.append("dry run: CPU timings and bandwidth (a 64 MiB reduction), no sync counts")
    return {"figures": f, "checks": checks, "notes": notes}
