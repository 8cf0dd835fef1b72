"""Batched speculation (decoding/batch_spec.speculate_batched) at Qwen3-8B shapes, bf16, random
weights: tokens/s of AR and of an oracle DFlash (5 layers, block 16; its proposals run for
real, including the rows' one batched block pass, then are forced to accept a mean of τ - 1
drafts a round, RowsOracle) at τ = 6.5 (DFlash's on Qwen3-8B) and τ = 3, on B = 1, 2, 4, 8,
16, 32, 64 rows (B random prompts of 16..48 tokens, 32 new tokens each); the crossover batch
of each τ (the smallest B no faster than AR through the same engine, and interpolated in
log2 B; on decode tokens/s, the rows' prefills left out, and end to end); every row's tokens
and accept lengths equal to AR's and to the forced ones (checked in bf16 too: the random
weights are made free of near-ties, _unambiguous, the compute unchanged). B's run as 1, 64,
16, 32, 4, 8, 2 and one that would not fit in the part's own limit is skipped (`not_run`)

Why: speculation spends spare compute to take fewer steps, and batching uses that compute up: past some B a
speculative method is slower than AR. On a CPU the crossover comes at a few rows; this measures where it lies at
Qwen3-8B shapes on a GPU, the acceptance forced to a known τ so that random weights stand in for a trained drafter.

Time limit 40 s (new; PARTS in scripts/gpu_check.py; seconds on one H200): not yet run on a GPU; estimated: start
~10 s, build ~7 s, the 5-layer backbone on the GPU ~2 s, warm-up ~2 s; then per B three runs of B prefills and 31 AR
steps / ~5 rounds (τ 6.5) / ~11 rounds (τ 3) at ~35 ms a forward plus ~1 ms of per-row drafter work a round: ~2 s at
B = 1, ~10 s at 64, ~30 s for all seven. It sizes itself to its own limit (from its process's start, so it never
takes the slack of the parts before it from the parts after it): on an H200 expect B = 1, 64, 16 and perhaps 32, the
rest in `not_run`. CPU dry run 20 s (B = 1, 2, 4)
"""
import math
import time

from gpu_parts.common import (
    STARTED,
    PromptJob,
    build_qwen3,
    compose,
    first_mismatch,
    peak_memory,
    qwen3_dtype,
    qwen3_shape,
    random_prompts,
    shared_dflash,
    step,
    sync,
)
from gpu_parts.oracle_decode import ORACLE_NEAR_TIE, OracleDrafter, oracle_drafters

SPEC_BATCHES = (1, 64, 16, 32, 4, 8, 2)    # rows, in the order run: both ends, then where a crossover is likeliest
SPEC_BATCHES_DRY = (1, 4, 2)               # (a part short of time skips what won't fit, and still brackets it)
SPEC_EMBED_SCALE = 5000.0                  # _unambiguous: embedding rows of std 0.02 -> 100, the residual's bulk
SPEC_TAUS = (6.5, 3.0)                     # forced τ: DFlash's on Qwen3-8B (its paper), and a weaker drafter's
SPEC_TOKENS, SPEC_TOKENS_DRY = 32, 12      # new tokens per row (random weights: no stop token ends a row early)
SPEC_PROMPTS, SPEC_PROMPTS_DRY = (16, 48), (4, 16)    # prompt tokens per row, drawn at random in this range


class RowsOracle(OracleDrafter):
    """OracleDrafter for batched speculation (decoding/batch_spec.py: one fork a row). Each row forces its own
    prompt's continuation `refs[tuple(prompt ids)]` (it asks the engine for the ids, `needs_prompt_ids`), and a
    fractional mean `accept` of accepted drafts a round: at the row's r-th proposal floor((r + 1) a) - floor(r a)
    (a = 5.5: 5, 6, 5, 6, ...; a = 2: 2 every round), so τ = a + 1 over full rounds."""

    needs_prompt_ids = True

    def __init__(self, inner, refs: dict, accept: float, vocab: int, device):
        import torch

        self.inner, self.accept, self.V = inner, accept, vocab
        self.refs = {key: torch.tensor(tokens, device=device) for key, tokens in refs.items()}
        self.ar, self.P, self.r, self.n = None, 0, 0, 0

    def forced(self, r: int) -> int:
        """Drafts accepted at the row's r-th proposal."""
        return math.floor((r + 1) * self.accept) - math.floor(r * self.accept)

    def prefill(self, taps, ids=None) -> None:
        self.ar, self.P, self.r = self.refs[tuple(ids)], len(ids), 0
        if getattr(self.inner, "needs_prompt_ids", False):
            self.inner.prefill(taps, ids=ids)
        else:
            self.inner.prefill(taps)

    def propose(self, anchor: int, start: int, k: int, sampling):
        self.n, self.r = self.forced(self.r), self.r + 1
        return super().propose(anchor, start, k, sampling)


def _unambiguous(t) -> None:
    """Make a random-weight target's greedy continuation free of near-ties, its compute unchanged. With HF's init the
    logits are flat (std ~1.3 over 151,936 tokens): the first H200 run (experiments/results/gpu/2026-12-04/) saw bf16
    rows leave AR's text at token 9, where a 16-row verify and a 1-row step round apart, after which an oracle forcing
    AR's text accepts nothing (τ 1.1 instead of n + 1). Here every weight stays random, but the embedding is scaled
    (std 0.02 -> 100, so it dominates the residual stream over the 36 layers' outputs, std ~14) and the lm_head's row
    v is the (unscaled) embedding row of token v - 1: the greedy continuation of any prompt is t + 1, t + 2, ... with
    top-2 gaps of tens of logits (the part records the smallest), which no rounding among B rows can flip. Shapes,
    kernels and bytes read are the random Qwen3-8B's, so the timings are its."""
    import torch

    emb, head = t.embed_tokens.weight, t.lm_head.weight
    with torch.no_grad():
        head.copy_(torch.roll(emb, 1, 0))
        emb.mul_(SPEC_EMBED_SCALE)


def _spec_run(st, drafter, prompts: list[list[int]], b: int, dc, dev) -> tuple[list, dict]:
    """One speculate_batched run of `prompts` on `b` rows (synchronised around it): the jobs and its figures.
    decode_tokens_per_s leaves out the rows' prefills (the sum of their ttft_s, each a CUDA-synchronised batch-1
    forward, the same work for every method): with answers of a few dozen tokens they are a large share of the
    run, where a real answer of hundreds of tokens makes them small."""
    from specexp.decoding.batch_spec import speculate_batched

    jobs = [PromptJob(i, p) for i, p in enumerate(prompts)]
    sync(dev)
    t0 = time.perf_counter()
    rounds = speculate_batched(st, drafter, jobs, dc, b, lambda j: None)
    sync(dev)
    s = time.perf_counter() - t0
    gens = [j.gen for j in jobs]
    tokens, prefill = sum(len(g.tokens) for g in gens), sum(g.ttft_s for g in gens)
    acc = [a for g in gens for a in g.accept_lengths]
    return jobs, {"seconds": s, "tokens": tokens, "rounds": rounds, "tokens_per_s": tokens / s, "prefill_s": prefill,
                  "decode_tokens_per_s": (tokens - len(jobs)) / (s - prefill) if s > prefill else None,
                  "tau": sum(acc) / len(acc)}


def run(ctx) -> dict:
    """Batched speculation (`decoding/batch_spec.speculate_batched`) at Qwen3-8B shapes, random weights: tokens/s of
    AR and of an oracle DFlash (5 layers, block 16: its proposals run for real, then are forced to accept a mean of
    τ - 1 drafts a round) at τ = 6.5 and τ = 3, on B = 1 .. 64 rows; the crossover batch of each τ (the smallest B at
    which it is no faster than AR through the same engine); every row's tokens against AR's."""
    import torch
    from bench_batch import crossover  # experiments/, on the path (common.setup_paths)

    from specexp import registry
    from specexp.decoding.engine import DecodeConfig
    from specexp.targets.static import StaticTarget

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    limit = ctx.limit_s                             # this part's own limit (PARTS, --timeout-scale)
    shape = qwen3_shape(ctx)
    layers = 1 if ctx.dry else 5
    G = SPEC_TOKENS_DRY if ctx.dry else SPEC_TOKENS
    lo, hi = SPEC_PROMPTS_DRY if ctx.dry else SPEC_PROMPTS
    t0 = time.perf_counter()
    t, impl = build_qwen3(ctx, shape, dtype, name="batch_spec")
    _unambiguous(t)
    st = StaticTarget.of(t)
    with shared_dflash(dev, {}):
        d = registry.build_drafter(compose(oracle_drafters(ctx, layers)["dflash"]).drafter, t)
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "attn_implementation": impl, "drafter": {"name": "dflash", "layers": layers, "K": d.max_drafts},
         "build_s": time.perf_counter() - t0, "new_tokens": G, "prompt_tokens_range": [lo, hi],
         "taus": list(SPEC_TAUS), "batches": {}, "not_run": {}}
    checks, notes = {}, []
    with step(f, checks, "top2_gap"):             # _unambiguous at work: the target's greedy token is never a tie
        probe = random_prompts(1, hi, hi, 198)[0]
        with torch.inference_mode():
            logits = st.forward(torch.tensor([probe], device=dev), 0, st.new_cache())[0][0].float()   # [P, V]
        top = logits.topk(2, -1)
        gaps = top.values[:, 0] - top.values[:, 1]
        f["top2_gap"] = {"min": float(gaps.min()), "median": float(gaps.median()),
                         "argmax_is_next_id": float((top.indices[:, 0] == (torch.tensor(probe, device=dev) + 1)
                                                     % t.vocab_size).float().mean())}
        checks["greedy_has_no_near_tie"] = f["top2_gap"]["min"] > ORACLE_NEAR_TIE
    dc = DecodeConfig(max_new_tokens=G)
    with step(f, checks, "warmup"):                 # first calls: cuBLAS handles, the allocator, every kernel once
        warm = random_prompts(2, lo, hi, 199)
        ar_jobs, _ = _spec_run(st, None, warm, 2, DecodeConfig(max_new_tokens=8), dev)
        _spec_run(st, RowsOracle(d, {tuple(j.prompt): j.tokens for j in ar_jobs}, SPEC_TAUS[0] - 1, t.vocab_size,
                                 dev), warm, 2, DecodeConfig(max_new_tokens=8), dev)
    walls: dict[int, float] = {}                    # B -> seconds of its three runs, to size the next B
    for b in (SPEC_BATCHES_DRY if ctx.dry else SPEC_BATCHES):
        left = limit - (time.perf_counter() - STARTED) - 5      # 5 s to write the result
        est = max((w * (b + G / 2) / (m + G / 2) for m, w in walls.items()), default=0.0)
        if est > left:                             # prefills ~ B, rounds ~ G: a run grows about as B + G / 2
            f["not_run"][str(b)] = f"would take ~{est:.0f} s of the {max(left, 0):.0f} s left in the part's limit"
            continue
        with step(f, checks, f"b{b}"):
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            t1 = time.perf_counter()
            prompts = random_prompts(b, lo, hi, 300 + b)
            ar_jobs, ar = _spec_run(st, None, prompts, b, dc, dev)
            row = f["batches"][str(b)] = {"rows": b, "prompt_tokens": sum(len(p) for p in prompts), "ar": ar}
            refs = {tuple(j.prompt): j.tokens for j in ar_jobs}
            for tau in SPEC_TAUS:
                o = RowsOracle(d, refs, tau - 1, t.vocab_size, dev)
                jobs, r = _spec_run(st, o, prompts, b, dc, dev)
                differ = {j.i: first_mismatch(j.tokens, a.tokens) for j, a in zip(jobs, ar_jobs)
                          if j.tokens != a.tokens}
                off = [j.i for j in jobs if j.gen.accept_lengths != [min(o.forced(i), k) + 1 if k else 1 for i, k
                                                                     in enumerate(j.gen.drafted)]]
                full = [a for j in jobs for a, k in zip(j.gen.accept_lengths, j.gen.drafted) if k == d.max_drafts]
                r.update(forced_tau=tau, tau_full_rounds=sum(full) / len(full) if full else None,
                         speedup=r["tokens_per_s"] / ar["tokens_per_s"],
                         decode_speedup=(r["decode_tokens_per_s"] / ar["decode_tokens_per_s"]
                                         if r["decode_tokens_per_s"] and ar["decode_tokens_per_s"] else None),
                         rows_differing_from_ar=len(differ), first_mismatch=differ, rows_off_forced_acceptance=len(off))
                row[f"tau={tau}"] = r
                # lossless and exactly forced, in bf16 too: the target has no near-ties (_unambiguous)
                checks[f"b{b}/tau={tau}_rows_equal_ar"] = not differ
                checks[f"b{b}/tau={tau}_accept_exact"] = not off
            row["peak_memory"] = peak_memory(dev)
            walls[b] = time.perf_counter() - t1
            row["seconds"] = walls[b]
            ctx.save_partial(f, checks, notes)
    measured = sorted(int(b) for b in f["batches"] if all(f"tau={tau}" in f["batches"][b] for tau in SPEC_TAUS))
    f["crossover"], f["headline"] = {}, []
    for tau in SPEC_TAUS:
        rows = [f["batches"][str(b)][f"tau={tau}"] for b in measured]
        c = f["crossover"][f"tau={tau}"] = {
            "decode": crossover(measured, [r["decode_speedup"] for r in rows]),
            "end_to_end": crossover(measured, [r["speedup"] for r in rows]),
            "speedup_by_batch": {str(b): [r["speedup"], r["decode_speedup"]] for b, r in zip(measured, rows)}}
        f["headline"].append(f"batch_spec τ = {tau}: crossover {c['decode']['text']} (decode tokens/s; end to end "
                             f"with the prefills: {c['end_to_end']['text']}); measured B = {measured}")
    checks["some_batches_measured"] = bool(measured)
    f["peak_memory"] = peak_memory(dev)
    notes.append(f"one run per method and B (AR, then τ = {', '.join(map(str, SPEC_TAUS))}); B prompts per B (one wave "
                 f"of rows), {lo}..{hi} prompt tokens, {G} new tokens; AR's tokens are the continuation the oracle "
                 "forces. speedup: tokens/s over AR's at the same B; decode_speedup: the same without the rows' "
                 "prefills (identical work in every method); the crossover is the smallest B with speedup <= 1, "
                 "interpolated linearly in log2 B between the B's around it")
    notes.append(f"random weights made tie-free (_unambiguous: embedding x {SPEC_EMBED_SCALE:g}, lm_head = the "
                 "embedding shifted by one token): greedy text t + 1, t + 2, ...; the compute is the random "
                 "Qwen3-8B's. tau is over every round (the last ones cut by the budget), tau_full_rounds over "
                 "rounds of K drafts")
    if f["not_run"]:
        notes.append(f"not run for want of time: B = {', '.join(f['not_run'])}")
    if f["scaled"]:
        notes.append(f"scaled shape: {shape} (Qwen3-8B: hidden 4096, 36 layers, 32/8 heads, 12288, 151936)")
    if not cuda:
        notes.append("dry run: CPU timings (meaningless for the crossover), no peak memory; B = 1, 2, 4 only")
    return {"figures": f, "checks": checks, "notes": notes}
