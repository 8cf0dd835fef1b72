"""Batched greedy AR on the static engine (StaticTarget.decode_rows, decoding/batch.py) at
Qwen3-8B shapes, B = 1, 8, 32, 64 rows at a context of --context tokens: ms per step,
tokens/s and its ratio to B = 1 (goal: >= 20x at B = 32), the HBM floor of a step (weights
but the embedding and B rows of KV over the measured read bandwidth), syncs per step, peak
memory; 8 rows of different prompt lengths against their own batch-1 decode over 16 tokens
(fp32 dry run: equal; bf16: the rows that differ are counted, not failed); generate_batched
end to end on 2 B random prompts (prefills and refills): tokens/s of the whole run

Why: batched AR is the baseline of every batched speculation: how its tokens/s grows with B (while a step's weights
are read once for every row) is what leaves speculation less room as B grows. The rows against their batch-1 decode
show that batching changes no row's tokens in fp32, and count those it changes in bf16.

Time limit 40 s (new; PARTS in scripts/gpu_check.py; seconds on one H200): not yet run on a GPU; estimated: start
~10 s, build ~7 s (qwen3_8b_shape's build_s), 4 B x ~29 steps of ~30-50 ms, 8 x 16 batch-1 steps ~4 s,
generate_batched on 2 B prompts of 32 tokens (210 prefills, ~260 steps) ~12 s: ~37 s. CPU dry run 25 s
"""
import time

from gpu_parts.common import (
    BATCHES,
    BATCHES_DRY,
    PromptJob,
    build_qwen3,
    first_mismatch,
    peak_memory,
    qwen3_dtype,
    qwen3_shape,
    random_prompts,
    read_bandwidth,
    step,
    step_bytes,
    sync,
    syncs_of,
    time_ms,
)

BATCH_CHECK = (8, 16)                # rows checked against their batch-1 decode, new tokens each
BATCH_GEN_TOKENS = 32                # new tokens per prompt of the end-to-end generate_batched runs


def run(ctx) -> dict:
    """Batched AR on the static engine (`StaticTarget.decode_rows`, decoding/batch.py) at Qwen3-8B shapes: ms per step
    of B rows at a context of `--context` tokens, tokens/s and its ratio to B = 1, each beside the HBM floor of a
    step (weights but the embedding, and B rows of KV, over the measured read bandwidth), peak memory; every row's
    greedy tokens against its own batch-1 decode; generate_batched end to end (prefills, refills) on 2 B prompts."""
    import torch

    from specexp.decoding.batch import generate_batched
    from specexp.decoding.engine import DecodeConfig, generate
    from specexp.targets.static import StaticTarget

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = qwen3_shape(ctx)
    t0 = time.perf_counter()
    t, impl = build_qwen3(ctx, shape, dtype, name="batched_ar")
    st = StaticTarget.of(t)
    C = 64 if ctx.dry else ctx.args.context
    batches = BATCHES_DRY if ctx.dry else BATCHES
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "attn_implementation": impl, "build_s": time.perf_counter() - t0, "context_tokens": C, "steps": {}}
    checks, notes = {}, []
    iters = 1 if ctx.dry else 5             # ~30 ms a step at 36 layers: 5 x 5 reps + 3 warm-up ~ 1 s per B
    weights, kv_per_pos = step_bytes(t.model, shape, dtype)
    bw = read_bandwidth(dev, dtype)
    f["hbm"] = {"read_bandwidth_gbs": bw / 1e9, "weight_bytes": weights, "kv_bytes_per_row": kv_per_pos * (C + 1)}
    g = torch.Generator().manual_seed(0)
    for b in batches:
        with step(f, checks, f"step_b{b}"):
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            cache = st.new_rows_cache(b, C + 1)
            ids = torch.randint(0, 151643, (b,), generator=g).to(dev)                          # [B]
            live = [True] * b

            def one(cache=cache, ids=ids, b=b):
                cache.lengths = [C] * b          # every row back at the context: each call is the same step
                st.decode_rows(ids, cache, live)
            ms = time_ms(one, dev, iters)
            floor = (weights + b * kv_per_pos * (C + 1)) / bw * 1e3
            f["steps"][str(b)] = {"ms_per_step": ms, "tokens_per_s": b / ms * 1e3, "floor_ms": floor,
                                  "over_floor": ms / floor, "syncs_per_step": syncs_of(one, dev),
                                  "peak_memory": peak_memory(dev)}
            cache = ids = one = None          # freed before the next B: its peak memory is its own
            ctx.save_partial(f, checks, notes)
    one_row = f["steps"].get("1", {}).get("tokens_per_s")
    for row in f["steps"].values():
        row["tokens_per_s_vs_b1"] = row["tokens_per_s"] / one_row if one_row else None
    b32 = f["steps"].get("32", {}).get("tokens_per_s_vs_b1")
    f["goals"] = {"b32_tokens_per_s_ge_20x_b1": None if b32 is None else b32 >= 20,
                  "b32_tokens_per_s_vs_b1": b32}

    # each row of a batch against its own batch-1 decode (decoding.engine.generate, no drafter), prompts of
    # different lengths: fp32 must be equal; in bf16 a row's products among B rows may round apart (reported)
    rows, new = (4, 8) if ctx.dry else BATCH_CHECK
    with step(f, checks, "rows_vs_batch1"):
        prompts = [random_prompts(1, 5 + 13 * i, 5 + 13 * i, i)[0] for i in range(rows)]     # 5, 18, 31, ... tokens
        dc = DecodeConfig(max_new_tokens=new)
        ref = [generate(st, None, p, dc).tokens for p in prompts]
        jobs = [PromptJob(i, p) for i, p in enumerate(prompts)]
        generate_batched(st, jobs, dc, rows, lambda j: None)
        differ = {j.i: first_mismatch(j.tokens, r) for j, r in zip(jobs, ref) if j.tokens != r}
        f["rows_vs_batch1"] = {"rows": rows, "new_tokens": new, "prompt_tokens": [len(p) for p in prompts],
                               "rows_differing": len(differ), "first_mismatch": differ}
        if dtype == torch.float32:
            checks["rows_equal_batch1"] = not differ
        elif differ:
            notes.append(f"bf16: {len(differ)} of {rows} rows left their batch-1 tokens (rounding among B rows; "
                         "reported, not failed)")
        ctx.save_partial(f, checks, notes)

    # end to end: 2 B prompts of 16..128 tokens through generate_batched (a batch-1 prefill per row, refills as
    # rows finish, the tail shrinking), tokens/s of the whole run
    f["generate_batched"] = {}
    lo, hi, new = (4, 16, 6) if ctx.dry else (16, 128, BATCH_GEN_TOKENS)
    for b in batches:
        with step(f, checks, f"generate_b{b}"):
            jobs = [PromptJob(i, p) for i, p in enumerate(random_prompts(2 * b, lo, hi, 100 + b))]
            sync(dev)
            t1 = time.perf_counter()
            n_steps = generate_batched(st, jobs, DecodeConfig(max_new_tokens=new), b, lambda j: None)
            sync(dev)
            s = time.perf_counter() - t1
            tokens = sum(len(j.tokens) for j in jobs)
            f["generate_batched"][str(b)] = {"prompts": len(jobs), "prompt_tokens": sum(len(j.prompt) for j in jobs),
                                             "new_tokens": tokens, "steps": n_steps, "seconds": s,
                                             "tokens_per_s": tokens / s}
            checks[f"generate_b{b}_every_prompt_answered"] = all(len(j.tokens or ()) == new for j in jobs)
            ctx.save_partial(f, checks, notes)
    one_row = f["generate_batched"].get("1", {}).get("tokens_per_s")
    for row in f["generate_batched"].values():
        row["tokens_per_s_vs_b1"] = row["tokens_per_s"] / one_row if one_row else None
    f["peak_memory"] = peak_memory(dev)
    notes.append(f"ms_per_step: one decode_rows call of B rows, each at position {C} (its KV of {C} positions "
                 "read); floor = (weights + B rows of KV) / the read bandwidth measured here; generate_batched: "
                 f"{new} new tokens a prompt (random weights: no stop token), prefills included")
    if f["scaled"]:
        notes.append(f"scaled shape: {shape} (Qwen3-8B: hidden 4096, 36 layers, 32/8 heads, 12288, 151936)")
    if not cuda:
        notes.append("dry run: CPU timings, no sync counts or peak memory; B = 32 not run, so its goal is null")
    return {"figures": f, "checks": checks, "notes": notes}

