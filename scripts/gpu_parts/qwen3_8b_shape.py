"""A random-weight Qwen3-8B-shaped target in bf16 (built on the GPU, nothing downloaded): AR
ms/step, verify ms per 16-token block, host syncs per forward for the attention in use,
verify-vs-AR logit differences (what eval.near_tie must cover), DFlash draft ms (5 layers,
block 16), DeLS / Domino-FT propose eager vs graph + Triton, ratios to the HBM floor,
peak memory; FlashAttention-2 against SDPA when flash_attn imports; the same AR step and
verify through target.engine=static (preallocated KV cache), its syncs and logits vs HF

Why: a speculative method's speedup is set by what a verify of a block costs against an AR step, what the drafter's
proposal costs and the host syncs between them, at the target's own shapes on the device: none of it can be measured
on a CPU. The verify-vs-AR logit differences are what eval.near_tie has to cover in bf16, and the static engine and
SDPA are checked against the logits they replace.

Time limit 110 -> 65 -> 58 s (PARTS in scripts/gpu_check.py; seconds on one H200): H200 93 s with 30-iteration
timings and four host-side builds of the 5-layer DFlash backbone at 8B widths (one per drafter; the stack samples
found ~20 s there); now 10 iterations (~18 s less of timed calls) and one backbone drawn on the GPU, shared by the
three heads (common.shared_dflash): ~55 s expected. CPU dry run 22 s
"""
import time

from gpu_parts.common import (
    build_qwen3,
    compose,
    peak_memory,
    qwen3_dtype,
    qwen3_shape,
    shared_dflash,
    step,
    syncs_of,
    time_ms,
)


def run(ctx) -> dict:
    import torch

    from specexp import registry
    from specexp.eval.metrics import top2_gap

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = qwen3_shape(ctx)
    t0 = time.perf_counter()
    t, impl = build_qwen3(ctx, shape, dtype)
    model = t.model
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "attn_implementation": impl, "build_s": time.perf_counter() - t0}
    checks, notes = {}, []
    P, B = (64 if ctx.dry else ctx.args.context), 16
    iters = 1 if ctx.dry else 10             # 36 layers: ~35 ms a call; 2026-12-04 H200: 30 iters took the part to 93 s
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 151643, (1, P), generator=g).to(dev)                             # [1, P]
    block = torch.randint(0, 151643, (1, B), generator=g).to(dev)                              # [1, B]
    anchor = int(block[0, 0])
    layers = ["drafter.init=random", f"drafter.num_layers={1 if ctx.dry else 5}", "drafter.block_size=16"]
    backbones: dict = {}                      # DFlash and the three heads on it: one backbone (common.shared_dflash)
    with shared_dflash(dev, backbones):
        dflash = registry.build_drafter(compose(["drafter=dflash", *layers]).drafter, t)
    taps = dflash.tap_layers
    cache = t.new_cache()
    _, prompt_taps = t.forward(prompt, 0, cache, taps=taps)                                     # [1, P, n*H]

    def steps(t, cache):
        """(AR step, verify of the block) after the prompt, each rolled back: the timed calls of one engine."""
        def ar_step():
            t.forward(block[:, :1], P, cache)
            t.rollback(cache, 1)

        def verify():
            t.forward(block, P, cache, taps=taps)
            t.rollback(cache, B)
        return ar_step, verify

    ar_step, verify = steps(t, cache)

    with step(f, checks, "target"):
        f["context_tokens"] = P
        f["ar_ms_per_step"] = time_ms(ar_step, dev, iters)
        f["verify_ms_per_block"] = time_ms(verify, dev, iters)
        f["syncs"] = {impl: {"ar_step": syncs_of(ar_step, dev), "verify": syncs_of(verify, dev)}}
        if cuda:                               # a sync per layer (FA2's packed-sequence check) would be >= layers
            checks["verify_has_no_per_layer_sync"] = f["syncs"][impl]["verify"] < shape["num_hidden_layers"]
    if cuda and impl.startswith("flash_attention"):
        with step(f, checks, "fa2_without_lengths"):
            t.flash_varlen = False
            f["syncs"][f"{impl} without cu_seq_lens"] = {"ar_step": syncs_of(ar_step, dev),
                                                          "verify": syncs_of(verify, dev)}
        t.flash_varlen = True

    with step(f, checks, "verify_vs_ar"):     # the same 16 positions as one block and as 16 steps: the rounding
        with torch.inference_mode():          # difference eval.near_tie has to cover in bf16
            lb = t.forward(block, P, cache)[0][0].float()                                        # [B, V]
            t.rollback(cache, B)
            ls = torch.cat([t.forward(block[:, i: i + 1], P + i, cache)[0][0] for i in range(B)]).float()   # [B, V]
            t.rollback(cache, B)
        top = lb.argmax(-1)                                                                      # [B]
        f["verify_vs_ar"] = {
            "max_abs_logit_diff": float((lb - ls).abs().max()),
            "max_abs_diff_at_argmax": float((lb.gather(1, top[:, None]) - ls.gather(1, top[:, None])).abs().max()),
            "argmax_disagreements": int((top != ls.argmax(-1)).sum()), "positions": B,
            "min_top2_gap": float(top2_gap(lb).min()), "logit_std": float(lb.std())}

    with step(f, checks, "static_engine"):    # target.engine=static: the same weights over a preallocated KV cache
        from specexp.targets.static import StaticTarget

        st = StaticTarget.of(t)
        sc = st.new_cache(P + 2 * B)
        with torch.inference_mode():
            st.forward(prompt, 0, sc, taps=taps)
            l_st = st.forward(block, P, sc)[0][0].float()                                         # [B, V]
            st.rollback(sc, B)

        st_ar_step, st_verify = steps(st, sc)
        f["static_engine"] = {"ar_ms_per_step": time_ms(st_ar_step, dev, iters),
                              "verify_ms_per_block": time_ms(st_verify, dev, iters),
                              "syncs": {"ar_step": syncs_of(st_ar_step, dev), "verify": syncs_of(st_verify, dev)},
                              "max_abs_logit_diff_vs_hf": float((l_st - lb).abs().max()),
                              "argmax_agreement_vs_hf": float((l_st.argmax(-1) == top).float().mean())}
        clear = top2_gap(lb) > 2 * f["static_engine"]["max_abs_logit_diff_vs_hf"]
        checks["static_engine_matches_hf"] = bool((l_st.argmax(-1) == top)[clear].all())

    if cuda and impl != "sdpa":
        with step(f, checks, "sdpa"):         # FlashAttention-2 (with the lengths) against SDPA, same weights
            model.set_attn_implementation("sdpa")
            c2 = t.new_cache()
            with torch.inference_mode():
                t.forward(prompt, 0, c2)
                l_sdpa = t.forward(block, P, c2)[0][0].float()                                    # [B, V]
                t.rollback(c2, B)

            def verify_sdpa():
                t.forward(block, P, c2, taps=taps)
                t.rollback(c2, B)

            diff = float((l_sdpa - lb).abs().max())
            same = l_sdpa.argmax(-1) == top                                                       # [B]
            clear = top2_gap(l_sdpa) > 2 * diff          # no rounding within `diff` can flip these argmaxes
            f["sdpa"] = {"verify_ms_per_block": time_ms(verify_sdpa, dev, iters),
                         "syncs": {"verify": syncs_of(verify_sdpa, dev)}, "max_abs_logit_diff_vs_fa2": diff,
                         "argmax_agreement_vs_fa2": float(same.float().mean()), "clear_positions": int(clear.sum())}
            # a wrong mask or wrong lengths move logits by O(their spread); bf16 rounding by a small fraction of it
            checks["fa2_matches_sdpa"] = diff < 0.25 * f["verify_vs_ar"]["logit_std"] and bool(same[clear].all())
            c2 = None
        model.set_attn_implementation(impl)

    with step(f, checks, "dflash"):
        dflash.reset()
        dflash.prefill(prompt_taps)
        f["dflash_draft_ms"] = time_ms(lambda: dflash.propose(anchor, P, B - 1, None), dev, iters)
        f["dflash_syncs_per_propose"] = syncs_of(lambda: dflash.propose(anchor, P, B - 1, None), dev)
    dflash = None
    f["sequential_drafters"] = {}
    for name in ("dels_rnn", "dels_markov", "domino_ft"):             # DFlash + the loop, in three loop variants
        with step(f, checks, name):
            o = [f"drafter={name}", *layers, f"fusion.kernel={'triton' if cuda else 'torch'}",
                 f"fusion.cuda_graph={'true' if cuda else 'false'}"]
            with shared_dflash(dev, backbones):
                d = registry.build_drafter(compose(o).drafter, t)
            d.reset()
            d.prefill(prompt_taps)
            graphs, kernel = d.graphs, d.kernel
            variants = {"graph/triton": (graphs, kernel), "eager/triton": (None, kernel)} if cuda else {}
            rows = f["sequential_drafters"][name] = {}
            for v, (gr, kn) in {**variants, "eager/torch": (None, None)}.items():
                d.graphs, d.kernel = gr, kn

                def propose(d=d):
                    return d.propose(anchor, P, d.max_drafts, None)

                ms = time_ms(propose, dev, iters)
                rows[v] = {"propose_ms": ms, "loop_ms": ms - f.get("dflash_draft_ms", float("nan")),
                           "syncs_per_propose": syncs_of(propose, dev), "tokens": propose().tokens.tolist()}
            checks[f"{name}_same_tokens_every_variant"] = len({tuple(r["tokens"]) for r in rows.values()}) == 1
        d = None
        if cuda:
            torch.cuda.empty_cache()

    # the memory-bandwidth floor: every weight but the embedding table (one row is read) and the KV cache, per step
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    kv = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * P * dtype.itemsize
    floor_ms = (weights + kv) / (ctx.args.hbm_tbs * 1e12) * 1e3
    f["hbm"] = {"bandwidth_tbs_assumed": ctx.args.hbm_tbs, "bandwidth_tbs_measured_copy": None,
                "bytes_per_step": weights + kv, "floor_ms": floor_ms,
                "ar_over_floor": f.get("ar_ms_per_step", float("nan")) / floor_ms,
                "verify_over_floor": f.get("verify_ms_per_block", float("nan")) / floor_ms}
    if cuda:
        with step(f, checks, "copy_bandwidth"):
            buf = torch.empty(2**30, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(buf)
            ms = time_ms(lambda: dst.copy_(buf), dev, 10)
            f["hbm"]["bandwidth_tbs_measured_copy"] = 2 * buf.numel() / (ms / 1e3) / 1e12     # read + write
            buf = dst = None
    f["peak_memory"] = peak_memory(dev)
    n_layers = shape["num_hidden_layers"]
    if not ctx.dry and n_layers != 36:        # --layers below 36 (memory or time): what 36 would cost, roughly
        f["linear_in_layers_to_36"] = {k: f[k] * 36 / n_layers for k in ("ar_ms_per_step", "verify_ms_per_block")
                                       if k in f}
        notes.append(f"{n_layers} layers: linear_in_layers_to_36 scales by 36/{n_layers}, counting the lm_head "
                     f"36/{n_layers} times too (an overestimate)")
    if f["scaled"]:
        notes.append(f"scaled shape: {shape} (Qwen3-8B: hidden 4096, 36 layers, 32/8 heads, 12288, 151936)")
    return {"figures": f, "checks": checks, "notes": notes}
