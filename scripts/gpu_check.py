"""First contact with a GPU: one command, offline, whatever torch / Triton / transformers the machine has, one JSON
report. Each part runs in its own process (a CUDA fault, a hang or an out-of-memory in one part cannot take the
others down; each has a time limit) and is recorded as passed / failed / skipped with its figures, its checks and,
when it fails, the error text. The report is rewritten after every part, and a part killed at its limit keeps the
figures it saved before (`Ctx.save_partial`).

    bash scripts/gpu_check.sh --out gpu_check.json     # all parts on cuda:0, at most 9.5 minutes (BUDGET_S)
    bash scripts/gpu_check.sh --out r.json --sections oracle_decode,kernel_parity --layers 18   # a subset
    bash scripts/gpu_check.sh --dry-run                # what a CPU can run: kernels under TRITON_INTERPRET=1

Parts (`--list`), most valuable first (a run cut short loses the least):
  qwen3_8b_shape        a random-weight Qwen3-8B-shaped target in bf16 (built on the GPU, nothing downloaded): AR
                        ms/step, verify ms per 16-token block, host syncs per forward for the attention in use,
                        verify-vs-AR logit differences (what eval.near_tie must cover), DFlash draft ms (5 layers,
                        block 16), DeLS / Domino-FT propose eager vs graph + Triton, ratios to the HBM floor,
                        peak memory; FlashAttention-2 against SDPA when flash_attn imports; the same AR step and
                        verify through target.engine=static (preallocated KV cache), its syncs and logits vs HF
  static_graph          target.engine=static target.compile=true at Qwen3-8B shapes (random weights, bf16): the AR
                        step and a verify of 16 rows through the eager static engine, the fixed-shape step captured
                        as CUDA graphs (plain PyTorch) and compiled by inductor then captured; first-call seconds
                        (capture, compilation), host syncs per step (none on the graph paths), logits against the
                        eager static engine (argmax equal where the top-2 gap exceeds twice the difference), every
                        time over the HBM floor (weights but the embedding and the KV cache, over the read bandwidth
                        measured by a sum over 1 GiB)
  batched_ar            batched greedy AR on the static engine (StaticTarget.decode_rows, decoding/batch.py) at
                        Qwen3-8B shapes, B = 1, 8, 32, 64 rows at a context of --context tokens: ms per step,
                        tokens/s and its ratio to B = 1 (goal: >= 20x at B = 32), the HBM floor of a step (weights
                        but the embedding and B rows of KV over the measured read bandwidth), syncs per step, peak
                        memory; 8 rows of different prompt lengths against their own batch-1 decode over 16 tokens
                        (fp32 dry run: equal; bf16: the rows that differ are counted, not failed); generate_batched
                        end to end on 2 B random prompts (prefills and refills): tokens/s of the whole run
  batch_spec            batched speculation (decoding/batch_spec.speculate_batched) at Qwen3-8B shapes, bf16, random
                        weights: tokens/s of AR and of an oracle DFlash (5 layers, block 16; its proposals run for
                        real, including the rows' one batched block pass, then are forced to accept a mean of τ - 1
                        drafts a round, RowsOracle) at τ = 6.5 (DFlash's on Qwen3-8B) and τ = 3, on B = 1, 2, 4, 8,
                        16, 32, 64 rows (B random prompts of 16..48 tokens, 32 new tokens each); the crossover batch
                        of each τ (the smallest B no faster than AR through the same engine, and interpolated in
                        log2 B; on decode tokens/s, the rows' prefills left out, and end to end); every row's tokens
                        and accept lengths equal to AR's and to the forced ones (checked in bf16 too: the random
                        weights are made free of near-ties, _unambiguous, the compute unchanged). B's run as 1, 64,
                        16, 32, 4, 8, 2 and one that would not fit in the part's own limit is skipped (`not_run`)
  plan_calibration      what task=plan reads: plan.calibrate on the Qwen3-8B-shaped target as target.engine=auto
                        runs it (static engine, CUDA graphs) with DeLS Table 3's drafters (DFlash 5 layers, DeLS-
                        Markov, DeLS-RNN, Domino-FT; one shared backbone; random weights), B = 1, 8, 32, 64 at a
                        1,024-token context, written as calibration.json beside the report (the report's
                        `calibration_file`); then Table 3 projected from it (plan.project: eval=paper's 8
                        benchmarks, references at batch 32, 20 timed samples a benchmark, τ plan.DEFAULT_TAU) at the
                        2048-token answer bound and at an assumed typical 600 tokens: both tables, total hours, and
                        the goal (<= 1 device-hour) as an informative figure
  oracle_decode         end-to-end greedy decoding through the real engine (decoding/engine.py) at Qwen3-8B widths,
                        per drafter (DFlash, DeLS-RNN / Markov, Domino-FT, EAGLE-3 chain; random init), with an oracle
                        forcing n accepted drafts a round (n = 0, 3, 7, 15, up to the drafter's K): the drafter's
                        propose runs for real, then its drafts become the target's own greedy continuation (one AR
                        run) for n positions and a wrong token at n + 1, so accept / rollback / commit run at real
                        widths. Per drafter and n: output equal to AR's, τ = n + 1 per round, TPOT vs AR TPOT
                        (CUDA-synchronised), host syncs per round. fp32 at 4 layers: exactly AR's tokens; bf16 at
                        36 layers: a mismatch at a near-tie (top-2 gap < 0.5) is reported, not failed
  kernel_parity         every tile of kernels/fusion.TILES and the autotuned kernel at V = 151936, bf16 inputs,
                        against a float64 reference on fresh inputs: argmax (equal but at near-ties), sampled tokens
                        given the noise, probabilities, in-kernel Philox draws (the same tokens for every tile given
                        the seed), output buffers poisoned (NaN / -1) before each call so an unwritten tile shows,
                        a χ² test of the sampler against the exact distribution; µs per call of every tile, the
                        autotuner's pick and the fastest tile
  drafters_lossless     every drafter of the registry on tiny_qwen3, fp32, greedy, through task=eval (in-process
                        run_task): lossless against AR, exactly
  protocol_b_graph      DeLS-RNN under protocol B with the in-graph sampler (fusion.cuda_graph=true): χ² of the
                        first 3 tokens against the exact distribution of a 5-token Qwen3 (enumerated), and a
                        decoding=sample_b task=eval run on tiny_qwen3 (runs, valid records)
  head_loop_graph       the sequential head loops (DeLS RNN / Markov, Domino-FT) at Qwen3-8B shapes: eager torch,
                        eager Triton, CUDA graph + torch, CUDA graph + Triton; same greedy tokens, same sampled
                        tokens (eager Triton vs graph Triton, one seed), host syncs per block, ms per block
  fusion_tiles_compile  registers, stack and spills per thread of every tile as the runtime launches it: the
                        launch's own arguments (recorded from a TritonFusion call) and so its specialization
                        (tt.divisibility=16 on the pointers and V; seed_add 0 / 1 / other per draft position); on a
                        GPU the kernel `warmup` returns for them (the launch's cache entry: driver n_regs / n_spills
                        and cuobjdump), in a dry run the same binder compiling for sm_90. Rule = the launch's: the
                        tiles the autotuner can pick (AUTOTUNE) must not spill
  train_smoke           task=train target=tiny_qwen3 data=smoke train=smoke (flex attention, torch.compile,
                        bf16-mixed on GPU)

Time limits (PARTS; seconds on one H200, summing to BUDGET_S = 570 with the process start of each part, ~10 s for
torch + CUDA + transformers). Deadlines are cumulative: part i must end by the sum of the limits up to i, so what
a part leaves unused goes to the later ones and the whole run stays within 570 s. Set from the first H200 run
(2026-12-04, experiments/results/gpu/2026-12-04/; wall seconds per part, the limit then -> now) and the CPU dry run
(2 busy cores, the image's package set simulated, 542 s in all):
  qwen3_8b_shape 110 -> 65 -> 58  H200 93 s with 30-iteration timings and four host-side builds of the 5-layer
                         DFlash backbone at 8B widths (one per drafter; the stack samples found ~20 s there); now 10
                         iterations (~18 s less of timed calls) and one backbone drawn on the GPU, shared by the
                         three heads (_shared_dflash): ~55 s expected. CPU dry run 22 s
  static_graph  90 -> 80 -> 75  not yet run on a GPU; estimated: start + build ~15 s, eager timings (20 iterations
                         x 5 repeats of a ~35 ms step and a verify) ~10 s, two captures of the plain step ~5 s,
                         inductor compiling one decoder layer per shape (2 shapes) and capturing ~30-60 s. CPU dry
                         run 54 s
  batched_ar     new 40  not yet run on a GPU; estimated: start ~10 s, build ~7 s (qwen3_8b_shape's build_s), 4 B x
                         ~29 steps of ~30-50 ms, 8 x 16 batch-1 steps ~4 s, generate_batched on 2 B prompts of 32
                         tokens (210 prefills, ~260 steps) ~12 s: ~37 s. CPU dry run 25 s
  batch_spec     new 40  not yet run on a GPU; estimated: start ~10 s, build ~7 s, the 5-layer backbone on the GPU
                         ~2 s, warm-up ~2 s; then per B three runs of B prefills and 31 AR steps / ~5 rounds (τ 6.5)
                         / ~11 rounds (τ 3) at ~35 ms a forward plus ~1 ms of per-row drafter work a round: ~2 s at
                         B = 1, ~10 s at 64, ~30 s for all seven. It sizes itself to its own limit (from its
                         process's start, so it never takes the slack of the parts before it from the parts after
                         it): on an H200 expect B = 1, 64, 16 and perhaps 32, the rest in `not_run`. CPU dry run
                         20 s (B = 1, 2, 4)
  plan_calibration 54 -> 48  not yet run on a GPU; estimated: start + build ~17 s, the shared backbone on the GPU
                         and three heads ~5 s, calibrate (4 B, prefill and teacher-forced 1,024 tokens, 4 verify
                         captures, 4 drafters' proposals, Triton autotuning, propose_all at 64 anchors) ~20 s,
                         the projection ~1 s: ~45 s. CPU dry run 30 s
  oracle_decode 140 -> 110 -> 95  H200: the fp32 sweep (4 layers, 64 tokens, 5 drafters x 4 n) took ~60 s, the bf16
                         sweep at 36 layers did not finish in 165 s (4 of 5 drafters, each building its own 5-layer
                         backbone on the host); now 48 tokens, 3 n in bf16 and one backbone per sweep drawn on the
                         GPU: ~90 s expected. CPU dry run 112 s
  kernel_parity  30 -> 28  H200 26 s. CPU dry run 58 s (interpreter, V = 2048)
  drafters_lossless 55 -> 52 -> 51  H200 49 s. CPU dry run 145 s
  protocol_b_graph 70 -> 68 -> 67  H200 66 s (1,500 generations of 4 tokens). CPU dry run 105 s
  head_loop_graph 20 -> 18 -> 17  H200 16 s. CPU dry run 20 s
  fusion_tiles_compile 15 -> 13 -> 12  H200 11 s. CPU dry run 31 s
  train_smoke    40 -> 39  H200 37 s (torch.compile of flex attention). CPU dry run 38 s
batched_ar and plan_calibration (2026-12) took their 94 s from the parts above whose measured or expected time
leaves slack, mostly qwen3_8b_shape and oracle_decode, whose host-side drafter builds are gone. batch_spec (2026-12)
took its 40 s the same way: 15 from oracle_decode (~90 s expected), 7 from qwen3_8b_shape (~55 expected), 6 from
plan_calibration (~45 expected), 5 from static_graph, and 1 or 2 from each part measured on the H200 with 2 s or
more to spare (kernel_parity, drafters_lossless, protocol_b_graph, head_loop_graph, fusion_tiles_compile,
train_smoke). The margins are now a few seconds at most, 1 to 2 s on the measured parts, so the first GPU run of
this version should confirm them (a part that overruns shortens only the parts after it: the deadlines are
cumulative; `--timeout-scale` widens them all).

Host syncs are counted with torch.cuda.set_sync_debug_mode("warn"): every synchronising CUDA call (.item(),
.tolist(), a blocking copy, nonzero, ...) raises "called a synchronizing CUDA operation" warnings, and the
warnings of the measured region are counted. The report's `sync_counter` records a self-test: on torch 2.11 one
.item() raises 2 warnings, a device-only op 0, so a count is an upper bound on the synchronising calls and 0 means
none.

`--dry-run` runs every part on the CPU at small sizes, with Triton kernels in its interpreter: what it checks is
that the parts run and agree, not speed; CUDA-only measurements are null and said so.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()      # this process's start: a part that sizes its work to its limit counts from it
FORMAT = 1
TIME_REPS = 5                       # timing repetitions (1 in a dry run, where timings only show the code runs)
DRY_VOCAB, DRY_RANK = 2048, 64      # the fusion kernel's sizes under the interpreter (~0.1 s a call on 2 cores)


class Skip(Exception):
    """A part that cannot run here: recorded as skipped with this reason."""


# ------------------------------------------------------------------------------------------------ helpers
def _paths() -> None:
    """specexp from this checkout when it is not installed; tests/helpers (the micro target, the drafters' strong
    random-head options) and experiments/ (the head-loop bench) are reused, not copied."""
    try:
        import specexp  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "src"))
    for d in (ROOT / "tests", ROOT / "experiments"):
        if str(d) not in sys.path:
            sys.path.append(str(d))


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, iters: int, reps: int | None = None, warmup: int | None = None) -> float:
    """Median over `reps` of the mean wall time of `iters` back-to-back calls, synchronised around each rep: what a
    call costs in a loop, launch overhead included (first `warmup` calls untimed: compilation, autotuning, capture)."""
    for _ in range(min(3, iters) if warmup is None else warmup):
        fn()
    out = []
    for _ in range(TIME_REPS if reps is None else reps):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        out.append((time.perf_counter() - t0) / iters)
    return statistics.median(out) * 1e3


@contextlib.contextmanager
def count_syncs(device):
    """`box["n"]` = synchronising CUDA calls inside the block (None off CUDA), counted from the sync-debug warnings."""
    import torch

    box = {"n": None}
    if torch.device(device).type != "cuda":
        yield box
        return
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    box["n"] = sum("synchroniz" in str(w.message) for w in caught)


def syncs_of(fn, device) -> int | None:
    with count_syncs(device) as box:
        fn()
    return box["n"]


def sync_selftest(device) -> dict:
    import torch

    if torch.device(device).type != "cuda":
        return {"item": None, "device_op": None, "works": None}
    x = torch.ones(4, device=device)
    item = syncs_of(lambda: x.sum().item(), device)
    dev_op = syncs_of(lambda: x.mul_(1.0), device)
    # torch 2.11 warns twice for one .item() (the copy and the stream wait): counts are sync *warnings*, an upper
    # bound on synchronising calls; 0 means no host sync at all, which is what the checks rely on
    return {"item": item, "device_op": dev_op, "works": item >= 1 and dev_op == 0, "unit": "sync warnings"}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def run_specexp(overrides: list[str], out_dir: Path):
    """What `python -m specexp OVERRIDES hydra.run.dir=OUT` runs (config validation, dispatch), in this process."""
    from specexp import cli
    from specexp.__main__ import run_task

    cli.precheck(list(overrides))
    return run_task(compose(overrides), str(out_dir))


def chi2_pvalue(probs: dict, counts: dict, n: int, min_expected: float = 5.0) -> float:
    """χ² goodness of fit of `counts` against exact `probs` (bins expecting < 5 draws pooled), p from the regularised
    upper incomplete gamma function (torch; scipy is a test-only dependency)."""
    import torch

    big = [s for s in probs if probs[s] * n >= min_expected]
    small = [s for s in probs if probs[s] * n < min_expected]
    obs = [counts.get(s, 0) for s in big] + ([sum(counts.get(s, 0) for s in small)] if small else [])
    exp = [probs[s] * n for s in big] + ([sum(probs[s] for s in small) * n] if small else [])
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@contextlib.contextmanager
def step(figures: dict, checks: dict, name: str):
    """One measurement of a part: an exception is recorded (figures["errors"][name], check `<name>_ran` false) and
    the part goes on with its next measurement."""
    try:
        yield
    except (Exception, SystemExit) as e:                # SystemExit: a refused command line (cli.fail)
        figures.setdefault("errors", {})[name] = "".join(traceback.format_exception(e))[-3000:]
        checks[f"{name}_ran"] = False


def peak_memory(device) -> dict:
    import torch

    if torch.device(device).type != "cuda":
        return {"allocated_gib": None, "reserved_gib": None}
    return {"allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.max_memory_reserved() / 2**30}


def qwen3_dtype(ctx):
    import torch

    return torch.float32 if ctx.dry else torch.bfloat16


# ------------------------------------------------------------------------------------------------ parts
def _fusion_inputs(V: int, r: int, seed: int, dev, hot: list[int] | None = None):
    """Fresh bf16 inputs of one drafted position (what a drafter hands the kernel); `hot`: a few tokens, spread over
    the tiles, hold most of the mass (the χ² test needs bins with enough draws)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    long = torch.randn(V, generator=g) * 3                                                      # [V]
    if hot:
        long = long - 8.0
        long[hot] += torch.linspace(9.5, 7.5, len(hot))
    z = torch.randn(r, generator=g)                                                             # [r]
    w = torch.randn(V, r, generator=g) / r ** 0.5                                               # [V, r]
    lp = torch.log_softmax(torch.randn(V, generator=g), 0)                                      # [V]
    return tuple(x.to(dev, torch.bfloat16) for x in (long, z, w, lp))


def _fused64(long, z, w, a: float, b: float, lp):
    """The fused logits in float64 from the same bf16 inputs: the exact value the kernel's fp32 arithmetic rounds."""
    return long.double() + a * (w.double() @ z.double()) - b * lp.double()                     # [V] fp64


def _poison(k) -> None:
    """Fill the kernel's per-tile outputs with values no program writes (NaN, token -1): an entry the kernel left
    unwritten shows instead of passing for a stale, plausible value."""
    for buf in (k.best, k.tmax, k.tsum, k.sbest):
        buf.fill_(float("nan"))
    k.tok.fill_(-1)


def _tiles_written(k, V: int, sample: bool) -> bool:
    """Every tile of the latest call wrote its entries: finite scores, a token inside its own tile."""
    import torch
    from triton import cdiv

    from specexp.kernels.fusion import TILES

    block = TILES[k.chosen_tile][0]
    n = cdiv(V, block)
    lo = torch.arange(n, device=k.tok.device) * block                                           # [n] tile starts
    tok = k.tok[:n]                                                                             # [n]
    ok = torch.isfinite(k.best[:n]).all() & (tok >= lo).all() & (tok < (lo + block).clamp(max=V)).all()
    if sample:
        ok &= torch.isfinite(torch.stack([k.tmax[:n], k.tsum[:n], k.sbest[:n]])).all()
    return bool(ok)


PARITY_WEIGHTS = ((0.3, 0.3), (0.0, 0.0), (2.0, -1.0))     # (alpha, beta): the default, the plain argmax, extremes
PARITY_TOL = 1e-4        # fp32 accumulation over r = 256 bf16 products stays ~1e-6 of fused values of ~10


def _parity_one_tile(k, cases, T: float, seeds: list[int]) -> dict:
    """One tile on every case: greedy and noise-given sampled tokens against the float64 reference (equal, or the
    kernel's token within PARITY_TOL of the best: a tie the fp32 sum may break either way), Philox draws per seed
    (compared across tiles by the caller), probabilities, and every output entry written (poisoned before)."""
    import torch

    from specexp.kernels.fusion import gumbel

    row = {"greedy_equal": 0, "greedy_near_tie": 0, "greedy_wrong": 0, "sampled_equal": 0, "sampled_near_tie": 0,
           "sampled_wrong": 0, "prob_max_rel_err": 0.0, "all_written": True, "philox_tokens": []}
    for long, z, w, lp in cases:
        V = long.numel()
        for a, b in PARITY_WEIGHTS:
            ref = _fused64(long, z, w, a, b, lp)                                                # [V] fp64
            _poison(k)
            tok = int(k(long, z, w, a, b, lp)[0])
            row["all_written"] &= _tiles_written(k, V, False)
            short = float(ref.max() - ref[tok])                   # how far the kernel's pick is below the best
            row["greedy_equal" if tok == int(ref.argmax()) else
                "greedy_near_tie" if short <= PARITY_TOL else "greedy_wrong"] += 1
        a, b = PARITY_WEIGHTS[0]
        s = _fused64(long, z, w, a, b, lp) / T                                                  # [V] fp64
        noise = gumbel(V, torch.Generator(device=long.device).manual_seed(V), long.device)      # [V] fp32
        _poison(k)
        tok, prob = k(long, z, w, a, b, lp, T, noise)
        tok = int(tok)
        row["all_written"] &= _tiles_written(k, V, True)
        score = s + noise.double()                                                              # [V]
        row["sampled_equal" if tok == int(score.argmax()) else
            "sampled_near_tie" if float(score.max() - score[tok]) <= PARITY_TOL / T else "sampled_wrong"] += 1
        p64 = torch.softmax(s, 0)                                                               # [V] fp64
        row["prob_max_rel_err"] = max(row["prob_max_rel_err"], abs(float(prob) / float(p64[tok]) - 1))
        for seed in seeds:                                        # in-kernel Philox: keyed by the token, not the tile
            k.seed.fill_(seed)
            _poison(k)
            ph_tok, ph_prob = k(long, z, w, a, b, lp, T)
            ph_tok = int(ph_tok)
            row["all_written"] &= _tiles_written(k, V, True)
            row["philox_tokens"].append(ph_tok)
            row["prob_max_rel_err"] = max(row["prob_max_rel_err"], abs(float(ph_prob) / float(p64[ph_tok]) - 1))
    return row


def _chi2_philox(k, V: int, r: int, dev, draws: int, T: float = 1.0) -> dict:
    """The in-kernel sampler's tokens over `draws` seeds against the exact float64 distribution (five hot tokens in
    different tiles carry most of the mass, the rest is one pooled bin)."""
    import torch

    hot = [3, V // 3, V // 2 + 1, 2 * V // 3, V - 1]
    long, z, w, lp = _fusion_inputs(V, r, 7, dev, hot)
    p = torch.softmax(_fused64(long, z, w, 0.5, 0.2, lp) / T, 0)                               # [V] fp64
    probs = {str(h): float(p[h]) for h in hot}
    probs["rest"] = 1.0 - sum(probs.values())
    counts: dict = {}
    for i in range(draws):
        k.seed.fill_(10_000 + i)
        tok = int(k(long, z, w, 0.5, 0.2, lp, T)[0])
        key = str(tok) if str(tok) in probs else "rest"
        counts[key] = counts.get(key, 0) + 1
    return {"pvalue": chi2_pvalue(probs, counts, draws), "draws": draws, "counts": counts, "probs": probs}


def part_kernel_parity(ctx) -> dict:
    """Every tile of kernels/fusion.TILES (and the autotuned kernel) against a float64 reference on fresh inputs,
    outputs poisoned before each call; Philox draws identical across tiles; χ² of the sampler; µs per call."""
    from specexp.eval.metrics import top2_gap
    from specexp.kernels import fusion as F

    dev = ctx.device
    cuda = dev.type == "cuda"
    V, r = (DRY_VOCAB, DRY_RANK) if ctx.dry else (151936, 256)
    T = 0.8
    cases = [_fusion_inputs(V, r, seed, dev) for seed in range(1 if ctx.dry else 4)]
    seeds = [12345, 777] if ctx.dry else [12345, 777, 31337, 4242]
    tiles = ("auto", *F.TILES)
    iters, reps, warm = (1, 1, 0) if ctx.dry else (200, 5, 3)
    long, z, w, lp = cases[0]
    rows, checks = {}, {}
    for tile in tiles:
        with step(rows, checks, tile):
            k = F.TritonFusion(V, dev, tile)
            row = _parity_one_tile(k, cases, T, seeds)
            row["chosen"] = k.chosen_tile
            if cuda or tile == "auto":                  # the interpreter: ~0.1 s a draw, one tile's χ²
                row["chi2"] = _chi2_philox(k, V, r, dev, 100 if ctx.dry else 2000)
            if tile == "auto" and not F.interpreted():         # the tuner's own µs per config (greedy, then sampled)
                row["autotune_us"] = {F.tile_name(c.kwargs["BLOCK"], c.kwargs["BLOCK_R"], c.num_warps):
                                      1e3 * (t[0] if isinstance(t, (list, tuple)) else t)
                                      for c, t in (getattr(F._fuse_tiles_tuned, "configs_timings", None) or {}).items()}
            row["greedy_us"] = 1e3 * time_ms(lambda: k(long, z, w, 0.3, 0.3, lp), dev, iters, reps, warm)
            row["sampled_us"] = 1e3 * time_ms(lambda: k(long, z, w, 0.3, 0.3, lp, T), dev, iters, reps, warm)
            rows[tile] = row
            ctx.save_partial({"vocab": V, "rank": r, "tiles": rows}, checks)
    done = {n: t for n, t in rows.items() if n in tiles}
    checks["every_tile_ran"] = len(done) == len(tiles)
    checks["greedy_matches_float64"] = all(t["greedy_wrong"] == 0 for t in done.values())
    checks["sampled_matches_float64"] = all(t["sampled_wrong"] == 0 for t in done.values())
    checks["probs_match_float64"] = all(t["prob_max_rel_err"] < 1e-3 for t in done.values())
    checks["every_output_written"] = all(t["all_written"] for t in done.values())
    checks["philox_same_tokens_every_tile"] = len({tuple(t["philox_tokens"]) for t in done.values()}) == 1
    checks["chi2_pvalue_above_1e-3"] = all(t["chi2"]["pvalue"] > 1e-3 for t in done.values() if "chi2" in t)
    named = {n: t for n, t in done.items() if n in F.TILES}
    fastest = min(named, key=lambda n: named[n]["greedy_us"]) if named else None
    ref_us = 1e3 * time_ms(lambda: F.fuse_torch(long, z, w, 0.3, 0.3, lp), dev, iters, reps, warm)
    floor_us = (V * r + 2 * V) * 2 / (ctx.args.hbm_tbs * 1e12) * 1e6          # W, long and the prior, bf16
    return {"figures": {
        "vocab": V, "rank": r, "dtype": "bfloat16", "temperature": T, "interpreted": F.interpreted(), "tiles": rows,
        "cases": len(cases), "weights": PARITY_WEIGHTS, "tie_tolerance": PARITY_TOL, "shipped_tile": "1024x64w4",
        "autotune_set": list(F.AUTOTUNE), "autotune_pick": rows.get("auto", {}).get("chosen"),
        "fastest_tile_greedy": fastest,
        "fastest_tile_sampled": min(named, key=lambda n: named[n]["sampled_us"]) if named else None,
        "torch_reference_us": ref_us, "hbm_floor_us": floor_us,
        "fastest_over_floor": named[fastest]["greedy_us"] / floor_us if fastest else None,
        "reference_top2_gap": float(top2_gap(_fused64(long, z, w, 0.3, 0.3, lp)))},
        "checks": checks,
        "notes": ["reference: the fused logits in float64 from the same bf16 inputs; a token within "
                  f"{PARITY_TOL} of the best counts as a near-tie, not a failure",
                  "outputs poisoned (NaN, token -1) before every call; µs per call = the kernel and the few torch "
                  "ops combining its tiles, back to back"]
        + ([] if cuda else [f"interpreter: V = {V}, the χ² on the auto tile ({F.INTERPRETED}) alone; the timings "
                            "measure numpy"])}


def _res_usage(cubin: bytes) -> dict:
    """REG / STACK / SHARED / LOCAL per thread from `cuobjdump -res-usage` (Triton's bundled copy)."""
    import re

    import triton.backends.nvidia as nv

    tool = Path(nv.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if "REG:" in x)
    return {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


class _LaunchRecorder:
    """Stands in for `fusion._fuse_tiles` during one TritonFusion call: keeps the grid, arguments and keywords the
    runtime launches the kernel with (nothing runs)."""

    def __init__(self):
        self.launch = None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launch = (grid, args, kwargs)
        return launch


def _launch_of(F, k, inputs, temperature: float, seed_add: int):
    """(grid, args, kwargs) of the launch `k(*inputs, temperature, seed_add=...)` makes (a named tile)."""
    real, rec = F._fuse_tiles, _LaunchRecorder()
    F._fuse_tiles = rec
    try:
        k(*inputs, temperature, seed_add=seed_add)        # then it reads its (unwritten) buffers: harmless
    finally:
        F._fuse_tiles = real
    return rec.launch


def _compile_as_launched(jit, args, kwargs, target):
    """What `JITFunction.run` compiles for these arguments, without a driver: the same binder (the launch's
    specialization: 16-byte aligned pointers and integers divisible by 16 get tt.divisibility=16, an integer 1
    becomes a constant), the same options, the same ASTSource. On a GPU `jit.warmup` gives the launch's own kernel;
    this is the dry run's way, checked against it there."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    kw = dict(kwargs)
    kw["debug"] = kw.get("debug", jit.debug) or knobs.runtime.debug
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):      # what run() adds (3.6: the first)
        if hasattr(knobs.compilation, name):
            kw[name] = getattr(knobs.compilation, name)
    bound, spec, opts = create_function_from_signature(jit.signature, jit.params, backend)(*args, **kw)
    options, signature, constexprs, attrs = jit._pack_args(backend, kw, bound, spec, opts)
    return triton.compile(ASTSource(jit, signature, constexprs, attrs), target=target, options=options.__dict__)


def _kernel_usage(kernel, t0: float) -> dict:
    row = {**_res_usage(kernel.asm["cubin"]), "compile_s": time.perf_counter() - t0}
    if hasattr(kernel, "_init_handles"):
        try:                                            # loading the binary needs the driver: GPU only
            kernel._init_handles()
            row.update(n_regs=kernel.n_regs, n_spills=kernel.n_spills)
        except Exception:
            pass
    return row


def part_fusion_tiles_compile(ctx) -> dict:
    """Registers, stack and spills of every tile as the runtime launches it (same arguments, same specialization):
    on a GPU the kernel `warmup` returns for the recorded launch (the one the launch runs, from the same cache),
    in a dry run the same compilation for sm_90 without a driver. Rule = the launch's: the tiles the autotuner can
    pick (AUTOTUNE) must not spill, at any specialization the draft loop launches."""
    import hashlib

    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from specexp.kernels import fusion as F

    cuda = ctx.device.type == "cuda"
    major, minor = torch.cuda.get_device_capability() if cuda else (9, 0)
    arch = 10 * major + minor
    V, r = 151936, 256
    dev = ctx.device if cuda else torch.device("cpu")
    long, z, w, lp = _fusion_inputs(V, r, 0, dev)
    inputs = (long, z, w, 0.3, 0.3, lp)
    # seed_add = the draft position: 0 (divisible by 16), 1 (a constant) and 2 (a plain i32) are the three
    # specializations a block's loop launches; only the sampler reads the seed, so greedy compiles position 0.
    variants = [("greedy", 0.0, 0), ("sampled", 1.0, 0), ("sampled@1", 1.0, 1), ("sampled@2", 1.0, 2)]
    out, launch_check = {}, None
    for name in F.TILES:
        k = F.TritonFusion(V, dev, name)
        for mode, temperature, seed_add in variants:
            if "@" in mode and name not in F.AUTOTUNE:
                continue
            with step(out, {}, f"{name}/{mode}"):
                grid, args, kwargs = _launch_of(F, k, inputs, temperature, seed_add)
                t0 = time.perf_counter()
                if cuda:
                    kernel = F._fuse_tiles.warmup(*args, grid=grid, **kwargs)       # the launch's own kernel
                else:
                    kernel = _compile_as_launched(F._fuse_tiles, args, kwargs, GPUTarget("cuda", arch, 32))
                out[f"{name}/{mode}"] = _kernel_usage(kernel, t0)
                if cuda and launch_check is None and name in F.AUTOTUNE:        # the dry run's way, checked once
                    emu = _compile_as_launched(F._fuse_tiles, args, kwargs, triton.runtime.driver.active
                                               .get_current_target())
                    launch_check = {"tile": f"{name}/{mode}", "same_cubin": hashlib.sha256(
                        emu.asm["cubin"]).hexdigest() == hashlib.sha256(kernel.asm["cubin"]).hexdigest()}
        ctx.save_partial({"per_thread": out}, {})
    tuned = {k: v for k, v in out.items() if isinstance(v, dict) and k.split("/")[0] in F.AUTOTUNE}
    checks = {"every_tile_compiled": "errors" not in out,
              "autotuned_tiles_spill_free": bool(tuned) and all(
                  v["stack"] == 0 and v.get("n_spills", 0) == 0 for v in tuned.values())}
    if launch_check is not None:
        checks["dry_run_compile_equals_launch"] = launch_check["same_cubin"]
    return {"figures": {"arch": f"sm_{arch}", "vocab": V, "rank": r, "dtype": "bfloat16", "triton": triton.__version__,
                        "per_thread": out, "launch_check": launch_check,
                        "specialization": "as launched: pointers and V with tt.divisibility=16, seed_add per position"},
            "checks": checks,
            "notes": ["per thread, from cuobjdump -res-usage of the cubin (stack > 0 = local-memory spills)"
                      + (", and the driver's n_regs / n_spills of the loaded kernel" if cuda else
                         "; dry run: compiled for sm_90 by the launch's binder")]}


def part_head_loop_graph(ctx) -> dict:
    import bench_dels_head_loop as hl
    import torch

    dev = ctx.device
    cuda = dev.type == "cuda"
    V, H, K = (2048, 128, 5) if ctx.dry else (151936, 4096, 15)
    dtype = torch.bfloat16 if cuda else torch.float32
    variants = [("eager", "torch", False), ("eager", "triton", False)]
    if cuda:
        variants += [("graph", "torch", True), ("graph", "triton", True)]
    iters = 1 if ctx.dry else 100
    g = torch.Generator().manual_seed(0)
    long = (torch.randn(K, V, generator=g) * 3).to(dev, dtype)                                  # [K, V]
    hidden = (torch.randn(K, H, generator=g) * 0.5).to(dev, dtype)                              # [K, H]
    figures, checks = {}, {}
    for kind in ("rnn", "markov", "domino"):
        x = {"long": long} if kind != "domino" else {"long": long, "hidden": hidden,
                                                     "anchor": torch.tensor(7, device=dev)}
        rows = figures[kind] = {}
        for loop, backend, graph in variants:
            with step(figures, checks, f"{kind}/{loop}/{backend}"):
                d = hl.make(kind, V, H, K, dtype, dev, backend, graph)
                ms, tokens = hl.bench(d, x, iters)
                bufs = (torch.empty(K, dtype=torch.long, device=dev), torch.empty(K, device=dev),
                        torch.empty(K, d.rank, dtype=d.zero_z.dtype, device=dev))

                def block(temperature=0.0, gen=None, d=d, bufs=bufs):
                    if d.graphs is not None:
                        return d._replay(x, temperature, gen)[0]
                    if d.kernel is not None and temperature > 0:
                        d.kernel.reseed(gen)
                    with torch.inference_mode():
                        d.draft(x, *bufs, temperature, gen)
                    return bufs[0].clone()

                row = {"ms_per_block": ms, "us_per_position": ms * 1e3 / K, "tokens": tokens.tolist(),
                       "syncs_per_block": syncs_of(block, dev)}
                if backend == "triton":                            # the kernel's Philox sampler, one seed
                    row["sampled_tokens"] = block(1.0, torch.Generator(device=dev).manual_seed(5)).tolist()
                rows[f"{loop}/{backend}"] = row
            d = block = None
            if cuda:
                torch.cuda.empty_cache()
        for row in rows.values():
            if "eager/torch" in rows:
                row["speedup_vs_eager_torch"] = rows["eager/torch"]["ms_per_block"] / row["ms_per_block"]
        checks[f"{kind}_same_greedy_tokens"] = len({tuple(r["tokens"]) for r in rows.values()}) == 1
        if cuda:                                                   # one seed: eager and graph draw the same
            sampled = {tuple(r["sampled_tokens"]) for r in rows.values() if "sampled_tokens" in r}
            checks[f"{kind}_same_sampled_tokens_eager_and_graph"] = len(sampled) == 1
            checks[f"{kind}_graph_replay_has_no_host_sync"] = rows.get("graph/triton", {}).get("syncs_per_block") == 0
    return {"figures": {"vocab": V, "hidden": H, "drafts": K, "dtype": str(dtype).split(".")[-1], **figures},
            "checks": checks,
            "notes": [] if cuda else ["CPU: eager loops only (a CUDA graph needs a GPU), Triton in its interpreter"]}


def part_drafters_lossless(ctx) -> dict:
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


def part_protocol_b_graph(ctx) -> dict:
    import json as _json

    import torch

    from helpers import STRONG, exact_sequence_probs, micro_target
    from specexp import registry
    from specexp.decoding.engine import DecodeConfig, generate

    dev = ctx.device
    cuda = dev.type == "cuda"
    steps, n_runs, temp = 3, (150 if ctx.dry else 1500), 1.0
    t = micro_target()
    exact = exact_sequence_probs(t, [0, 1], steps, temp)                 # enumerated on the CPU
    t.model.to(dev)
    over = ["target=tiny_qwen3", "drafter=dels_rnn", "drafter.init=random", *STRONG["dels_rnn"],
            f"fusion.kernel={'triton' if cuda else 'torch'}", f"fusion.cuda_graph={'true' if cuda else 'false'}",
            f"device={dev.type}"]
    drafter = registry.build_drafter(compose(over).drafter, t)
    dc = DecodeConfig(protocol="B", temperature=temp, max_new_tokens=steps + 1)
    gen = torch.Generator(device=dev).manual_seed(1234)
    counts, accepted, bad = {}, 0, 0
    t0 = time.perf_counter()
    for _ in range(n_runs):
        out = generate(t, drafter, [0, 1], dc, gen)
        key = tuple(out.tokens[:steps])
        bad += any(not 0 <= x < t.vocab_size for x in out.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(a - 1 for a in out.accept_lengths)
    seconds = time.perf_counter() - t0
    p = chi2_pvalue(exact, counts, n_runs)
    graphs = sorted(drafter.graphs) if getattr(drafter, "graphs", None) is not None else None
    o = ["task=eval", "target=tiny_qwen3", "drafter=dels_rnn", "drafter.init=random", *STRONG["dels_rnn"],
         "decoding=sample_b", "benchmark=gsm8k", f"eval.num_samples={1 if ctx.dry else 2}",
         f"eval.max_new_tokens={8 if ctx.dry else 48}",
         "eval.warmup=0", "eval.progress=false", "logger=none", f"device={dev.type}",
         f"fusion.kernel={'triton' if cuda else 'torch'}", f"fusion.cuda_graph={'true' if cuda else 'false'}"]
    out_dir = ctx.work / "sample_b"
    run_specexp(o, out_dir)
    recs = [_json.loads(x) for x in (out_dir / "samples.jsonl").read_text().splitlines()]
    valid = all(r["new_tokens"] > 0 and sum(r["accept_lengths"]) == r["new_tokens"] - 1 for r in recs)
    s = _json.loads((out_dir / "summary.json").read_text())["benchmarks"]["gsm8k"]
    return {"figures": {"chi2": {"pvalue": p, "runs": n_runs, "steps": steps, "temperature": temp,
                                 "accepted_drafts": accepted, "seconds": seconds, "graphs_captured": graphs,
                                 "distinct_sequences": len(counts)},
                        "eval_sample_b": {"records": len(recs), "tau": s["tau"], "overrides": o}},
            "checks": {"chi2_pvalue_above_1e-3": p > 1e-3, "drafts_accepted": accepted > n_runs // 20,
                       "tokens_in_vocabulary": bad == 0, "eval_records_valid": bool(recs) and valid,
                       **({"sampled_in_a_graph": graphs == [temp]} if cuda else {})},
            "notes": ["χ²: first 3 tokens of 5-token Qwen3 (random, micro_target of tests/helpers) against exact "
                      "enumeration" + ("" if cuda else "; CPU: the torch reference sampler, no graph (the kernel's "
                                                       "sampler under the interpreter: tests/kernels' χ² test)")]}


def part_train_smoke(ctx) -> dict:
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


def _qwen3_shape(ctx, layers: int | None = None) -> dict:
    a = ctx.args
    if ctx.dry:
        return dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    intermediate_size=768, vocab_size=151936)
    return dict(hidden_size=4096, num_hidden_layers=layers or a.layers, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, intermediate_size=12288, vocab_size=151936)


def _build_qwen3(ctx, shape: dict, dtype, name: str = "qwen3_8b_shape"):
    """A random-init Qwen3 of `shape` in `dtype`, built on the device (nothing downloaded, no host copy of 8B
    weights) and wrapped as specexp's Target; returns (target, attention implementation)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specexp.targets.hf import QWEN3_MASK_ID, Target, attn_implementation

    dev = ctx.device
    cuda = dev.type == "cuda"
    config = Qwen3Config(**shape, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6}, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    # FlashAttention-2 (when it imports) serves bf16 / fp16 only: an fp32 target runs SDPA
    impl = attn_implementation("auto") if cuda and dtype != torch.float32 else "sdpa"
    config._attn_implementation = impl
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev), torch.random.fork_rng(devices=[dev.index or 0] if cuda else []):
            torch.manual_seed(0)
            model = Qwen3ForCausalLM(config).eval().requires_grad_(False)                # random init, on the device
    finally:
        torch.set_default_dtype(old)
    return Target(name, model, None, QWEN3_MASK_ID, [], source="random init"), impl


@contextlib.contextmanager
def _shared_dflash(dev, backbones: dict):
    """Inside: every DFlash backbone built (drafter=dflash through the registry, and the one dels / domino build
    around their head) is drawn on `dev` and built once per settings, kept in `backbones` (one dict per target).
    DeLS-RNN / Markov and Domino-FT are heads on the target's one released DFlash, so sharing it is what a real run
    has; and with seed 0 each random build gave the same weights anyway. Why: a 5-layer backbone at 8B widths is
    ~1.1 B weights, built and drawn on the CPU (the modules' own init, then drafters/layers.init_weights), once per
    drafter: the H200 run's stack samples of qwen3_8b_shape (four builds) found ~20 s there."""
    import dataclasses

    import torch

    from specexp import registry
    from specexp.drafters import dflash

    real_build, real_init, entry = dflash.build, dflash.init_weights, registry.DRAFTERS["dflash"]

    def init_on_device(model, seed: int, std: float = 0.02):
        """init_weights' N(0, std) linears and zero biases, drawn where the weights are used."""
        g = torch.Generator(dev).manual_seed(seed)
        model.to(dev)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.normal_(0.0, std, generator=g)
                    if m.bias is not None:
                        m.bias.zero_()
        return model

    def build_once(cfg, target, *args, **kwargs):
        key = tuple(str(getattr(cfg, k, None)) for k in ("init", "checkpoint", "num_layers", "block_size",
                                                         "target_layer_ids", "seed"))
        if key not in backbones:
            with torch.device(dev):                    # the modules' own default init on the device too
                backbones[key] = real_build(cfg, target, *args, **kwargs)
        return backbones[key]

    dflash.build, dflash.init_weights = build_once, init_on_device
    registry.DRAFTERS["dflash"] = dataclasses.replace(entry, build=build_once)
    try:
        yield backbones
    finally:
        dflash.build, dflash.init_weights, registry.DRAFTERS["dflash"] = real_build, real_init, entry


def _step_bytes(model, shape: dict, dtype) -> tuple[int, int]:
    """(bytes of the weights a decode step reads: all but the embedding table, of which one row is read; KV bytes per
    cached position: keys and values of every layer)."""
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    return weights, 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * dtype.itemsize


def _read_bandwidth(dev, dtype) -> float:
    """Bytes per second the device reads: a sum over 1 GiB of `dtype` (64 MiB on a CPU), reads only."""
    import torch

    cuda = torch.device(dev).type == "cuda"
    buf = torch.ones((2**30 if cuda else 2**26) // dtype.itemsize, dtype=dtype, device=dev)
    ms = time_ms(lambda: buf.sum(), dev, 10 if cuda else 2)
    return buf.numel() * buf.element_size() / (ms / 1e3)


def part_qwen3_8b_shape(ctx) -> dict:
    import torch

    from specexp import registry
    from specexp.eval.metrics import top2_gap

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = _qwen3_shape(ctx)
    t0 = time.perf_counter()
    t, impl = _build_qwen3(ctx, shape, dtype)
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
    backbones: dict = {}                      # DFlash and the three heads on it: one backbone (_shared_dflash)
    with _shared_dflash(dev, backbones):
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
            with _shared_dflash(dev, backbones):
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


def part_static_graph(ctx) -> dict:
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
    shape = _qwen3_shape(ctx)
    t0 = time.perf_counter()
    t, impl = _build_qwen3(ctx, shape, dtype, name="static_graph")
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
    weights, kv_per_pos = _step_bytes(t.model, shape, dtype)
    with step(f, checks, "read_bandwidth"):
        bw = _read_bandwidth(dev, dtype)
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


BATCHES = (1, 8, 32, 64)             # batched_ar and the plan's calibration: rows per step
BATCHES_DRY = (1, 2, 4)
BATCH_CHECK = (8, 16)                # rows checked against their batch-1 decode, new tokens each
BATCH_GEN_TOKENS = 32                # new tokens per prompt of the end-to-end generate_batched runs


class _PromptJob:
    """One single-turn job of decoding/batch.generate_batched: its prompt, then the tokens it got."""

    def __init__(self, i: int, prompt: list[int]):
        self.i, self.prompt, self.tokens, self.gen = i, prompt, None, None

    def next_prompt(self, previous):
        if previous is None:
            return self.prompt
        self.tokens, self.gen = previous.tokens, previous
        return None


def _random_prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    import random

    rnd = random.Random(seed)
    return [[rnd.randrange(151643) for _ in range(rnd.randint(lo, hi))] for _ in range(n)]


def part_batched_ar(ctx) -> dict:
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
    shape = _qwen3_shape(ctx)
    t0 = time.perf_counter()
    t, impl = _build_qwen3(ctx, shape, dtype, name="batched_ar")
    st = StaticTarget.of(t)
    C = 64 if ctx.dry else ctx.args.context
    batches = BATCHES_DRY if ctx.dry else BATCHES
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "attn_implementation": impl, "build_s": time.perf_counter() - t0, "context_tokens": C, "steps": {}}
    checks, notes = {}, []
    iters = 1 if ctx.dry else 5             # ~30 ms a step at 36 layers: 5 x 5 reps + 3 warm-up ~ 1 s per B
    weights, kv_per_pos = _step_bytes(t.model, shape, dtype)
    bw = _read_bandwidth(dev, dtype)
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
        prompts = [_random_prompts(1, 5 + 13 * i, 5 + 13 * i, i)[0] for i in range(rows)]     # 5, 18, 31, ... tokens
        dc = DecodeConfig(max_new_tokens=new)
        ref = [generate(st, None, p, dc).tokens for p in prompts]
        jobs = [_PromptJob(i, p) for i, p in enumerate(prompts)]
        generate_batched(st, jobs, dc, rows, lambda j: None)
        differ = {j.i: _first_mismatch(j.tokens, r) for j, r in zip(jobs, ref) if j.tokens != r}
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
            jobs = [_PromptJob(i, p) for i, p in enumerate(_random_prompts(2 * b, lo, hi, 100 + b))]
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


# DeLS-Spec Table 3 at Qwen3-8B as conf/experiment/plan_dels_table3.yaml composes it: eval=paper, benchmark=all
TABLE3_BENCHMARKS = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt_bench", "alpaca")
TABLE3_DRAFTERS = ("none", "dflash", "dels_markov", "dels_rnn", "domino_ft")
TABLE3_BATCH, TABLE3_TIMED, TABLE3_MAX_NEW = 32, 20, 2048     # replay.batch_size, eval.timed_samples, max_new_tokens
TYPICAL_ANSWER_TOKENS = 600     # an assumption (not measured here): non-thinking Qwen3-8B answers of a few hundred
                                # tokens on most of these benchmarks, well under the 2048 budget


def part_plan_calibration(ctx) -> dict:
    """The calibration `task=plan` reads (`plan.calibrate`: batched AR steps, prefill and teacher-forced tokens,
    verifies, each Table 3 drafter's proposal and replay per anchor) for the Qwen3-8B-shaped target as
    target=qwen3_8b runs on this device (the static engine; on CUDA its steps after the prefill CUDA graphs), written
    as calibration.json beside the report; then DeLS Table 3's projected device time from it (`plan.project`), at
    the 2048-token answer bound and at a typical answer length."""
    from datetime import datetime, timezone

    from specexp import benchmarks, registry
    from specexp.eval import plan
    from specexp.eval.shards import timed_subset
    from specexp.targets.static import StaticTarget

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = _qwen3_shape(ctx)
    scaled = ctx.dry or shape["num_hidden_layers"] != 36
    t0 = time.perf_counter()
    t, impl = _build_qwen3(ctx, shape, dtype, name="qwen3_8b_scaled" if scaled else "qwen3_8b")
    # what registry.build_target makes of target.engine=auto: the static engine, every step shape after the prefill
    # a CUDA graph on CUDA (inductor only with target.compile=true), eager on a CPU
    st = StaticTarget.of(t, compile=cuda, inductor=False)
    layers = 1 if ctx.dry else 5         # the released Qwen3-8B DFlash (z-lab, block 16) has 5 layers
    backbones: dict = {}
    with _shared_dflash(dev, backbones):
        drafters = {n: registry.build_drafter(compose([f"drafter={n}", "drafter.init=random",
                                                       f"drafter.num_layers={layers}", "drafter.block_size=16"]
                                                      ).drafter, st) for n in TABLE3_DRAFTERS if n != "none"}
    f = {"shape": shape, "scaled": scaled, "dtype": str(dtype), "attn_implementation": impl,
         "engine": "static, CUDA graphs" if cuda else "static, eager", "drafter_layers": layers,
         "build_s": time.perf_counter() - t0}
    checks, notes = {}, []
    batches, context = (BATCHES_DRY, 64) if ctx.dry else (BATCHES, ctx.args.context)
    t1 = time.perf_counter()
    cal = plan.calibrate(st, drafters, batches=batches, context=context, reps=1 if ctx.dry else 5,
                         anchors=8 if ctx.dry else 64)
    f["calibrate_s"] = time.perf_counter() - t1
    cal["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cal["source"] = ("scripts/gpu_check.py plan_calibration: random weights at the target's shapes (a step's cost "
                     "does not depend on them)" + (f", scaled: {shape}" if scaled else ""))
    path = Path(ctx.args.out).resolve().parent / "calibration.json"
    write_report(path, cal)
    f["calibration_file"], f["calibration"] = str(path), cal
    checks["calibration_reads_back"] = plan.read_calibration(path) == json.loads(json.dumps(cal, default=str))
    ctx.save_partial(f, checks, notes)

    samples = benchmarks.load(list(TABLE3_BENCHMARKS), "paper")
    timed = timed_subset(samples, TABLE3_TIMED, 0)
    tau = {d: plan.DEFAULT_TAU["qwen3_8b"] for d in TABLE3_DRAFTERS if d != "none"}
    best = plan.best_batch(cal)
    f["workload"] = {"samples": len(samples), "turns": sum(len(s.turns) for s in samples),
                     "timed_samples": sum(len(v) for v in timed.values()), "batch": TABLE3_BATCH, "tau": tau}
    f["projection"], f["headline"] = {}, []
    for label, answer, why in (("bound", TABLE3_MAX_NEW, f"eval.max_new_tokens={TABLE3_MAX_NEW} (an upper bound, "
                                                            "task=plan's default without reference answers)"),
                               ("typical", TYPICAL_ANSWER_TOKENS, "assumed typical answer length (not measured)")):
        work = plan.workload(samples, {n: float(answer) for n in TABLE3_BENCHMARKS}, timed)
        rows = plan.project(cal, work, list(TABLE3_DRAFTERS), tau, TABLE3_BATCH)
        total = sum(r["seconds"] for r in rows)
        f["workload"]["per_benchmark"] = {w.benchmark: {"samples": w.samples, "turns": w.turns,
                                                        "timed_turns": w.timed_turns} for w in work}
        assumptions = {
            "answer tokens per turn": f"{answer} on every benchmark ({why})",
            "prompt tokens per turn (mean)": ", ".join(f"{w.benchmark} {w.prompt_tokens:.0f}" for w in work)
                                             + f" (characters / {plan.CHARS_PER_TOKEN})",
            "τ of the timed rounds": ", ".join(f"{k} {v:g}" for k, v in tau.items())
                                    + " (plan.DEFAULT_TAU: the DFlash paper's macro τ at Qwen3-8B)",
            "references batch": f"{TABLE3_BATCH} (replay.batch_size); the calibration's fastest is {best} rows",
            "timed samples": f"{f['workload']['timed_samples']} (eval.timed_samples={TABLE3_TIMED}, seed 0)",
            "weights": "random (step costs only)" + ("; SCALED shapes: not Qwen3-8B's costs" if scaled else ""),
        }
        md = plan.table(rows, cal, assumptions)
        f["projection"][label] = {"answer_tokens": answer, "rows": rows, "total_seconds": total,
                                  "total_hours": total / 3600, "assumptions": assumptions, "markdown": md}
        line = (f"plan: DeLS Table 3 projected {total / 3600:.2f} device-hours at {answer} answer tokens a turn "
                f"({label}: {why})")
        f["headline"].append(line)
        print(line + "\n" + md, flush=True)                             # the child's log holds both tables
    hours = {k: v["total_hours"] for k, v in f["projection"].items()}
    f["goals"] = {"table3_le_1_gpu_hour": hours["bound"] <= 1.0,
                  "table3_le_1_gpu_hour_at_typical_answers": hours["typical"] <= 1.0}
    checks["projection_finite"] = all(math.isfinite(h) and h > 0 for h in hours.values())
    f["peak_memory"] = peak_memory(dev)
    notes += [f"workload: benchmarks.load({list(TABLE3_BENCHMARKS)}, 'paper') = {f['workload']['samples']} samples, "
              f"{f['workload']['turns']} turns (the staged editions' counts where a file holds fewer than the "
              "paper's)",
              "DFlash, DeLS-Markov, DeLS-RNN and Domino-FT share one DFlash backbone (_shared_dflash), as they do "
              "in a real run; calibration.json is what task=plan plan.calibration=PATH reads",
              "goals are informative, not checks: the projection's total at the bound (what task=plan prints by "
              "default) and at the typical length"]
    if scaled:
        notes.append(f"scaled shape: {shape}: the calibration and the hours are not Qwen3-8B's")
    if not cuda:
        notes.append("dry run: a CPU calibration of the scaled target; its hours say the code runs, nothing else")
    return {"figures": f, "checks": checks, "notes": notes}


class OracleDrafter:
    """A drafter whose proposals are forced to an exact acceptance: its own `propose` runs (its cost is paid, its
    state advances), then its tokens are replaced by the target's greedy continuation `ar` (one AR run of the same
    prompt) for the first n drafts and a token that is not the target's at draft n+1. Verification then accepts
    exactly min(n, k) drafts, so accept, rollback and commit run at chosen widths. Everything else is the drafter's
    (`__getattr__`): reset, prefill, commit, tap_layers, max_drafts, needs_prompt_ids."""

    def __init__(self, inner, ar_tokens, prompt_len: int, n: int, vocab: int, device):
        import torch

        self.inner, self.n, self.P, self.V = inner, n, prompt_len, vocab
        self.ar = torch.tensor(ar_tokens, device=device)                                        # [G] at P..P+G-1

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, anchor: int, start: int, k: int, sampling):
        from specexp.drafters.base import Proposal

        prop = self.inner.propose(anchor, start, k, sampling)
        i = start - self.P + 1                             # the AR index of the first draft's position start + 1
        forced = self.ar[i: i + k].clone()                                                      # [k] on the device
        if self.n < k:
            forced[self.n] = (forced[self.n] + 1) % self.V  # the first draft the target rejects (no host sync)
        if hasattr(self.inner, "proposed"):                # EAGLE-3's commit reads its proposal's accepted tokens
            self.inner.proposed = forced
        return Proposal(forced, prop.q, prop.info, prop.parents)

    # Batched speculation (decoding/batch_spec.py) runs `drafters.base.fork(drafter)` per row, a `copy.copy` then
    # `reset()`: the copy must hold a fork of the inner drafter (else every row would reset and extend one shared
    # context), and the engine's one batched block pass (`prepare_rows`, called on the drafter it was given) must
    # reach the inner forks, whose next `propose` reads their share of it.
    def __copy__(self):
        from specexp.drafters.base import fork

        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.inner = fork(self.inner)
        return twin

    def prepare_rows(self, rows, anchors, starts, ks, argmax) -> None:
        prepare = getattr(self.inner, "prepare_rows", None)
        if prepare is not None:                            # EAGLE-3 has none: each row proposes alone
            prepare([r.inner for r in rows], anchors, starts, ks, argmax)


ORACLE_NS = (0, 3, 7, 15)          # forced accepted drafts per round (clipped to the drafter's K)
ORACLE_NS_BF16 = (0, 7, 15)        # the 36-layer bf16 sweep: fewer points (its four took > 105 s on an H200)
ORACLE_NS_DRY = (0, 3, 15)         # dry run: reject all, a partial and a full accept (~10 s per n and drafter)
ORACLE_NEAR_TIE = 0.5              # bf16: eval=paper's near_tie (logits of 16..64 are 0.125..0.25 apart)


def _oracle_drafters(ctx, layers: int) -> dict:
    """name -> overrides, the drafters of part_qwen3_8b_shape (random init, block 16) plus EAGLE-3's chain."""
    cuda = ctx.device.type == "cuda"
    backbone = ["drafter.init=random", f"drafter.num_layers={layers}", "drafter.block_size=16"]
    loop = [f"fusion.kernel={'triton' if cuda else 'torch'}", f"fusion.cuda_graph={'true' if cuda else 'false'}"]
    return {"dflash": ["drafter=dflash", *backbone],
            **{n: [f"drafter={n}", *backbone, *loop] for n in ("dels_rnn", "dels_markov", "domino_ft")},
            "eagle3": ["drafter=eagle3", "drafter.init=random", "drafter.mode=chain"]}


def _first_mismatch(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _gap_at(t, prompt: list[int], ar: list[int], j: int) -> float:
    """Top-2 logit gap of the target at AR output position j (teacher-forced over prompt + ar[:j])."""
    import torch

    from specexp.eval.metrics import top2_gap

    ids = torch.tensor([prompt + ar[:j]], device=t.device)                                      # [1, P+j]
    with torch.inference_mode():
        logits = t.forward(ids, 0, t.new_cache(), last_only=True)[0]                            # [1, 1, V]
    return float(top2_gap(logits[0, -1].float()))


def _decode_syncs(t, drafter, prompt, dc, dev) -> float | None:
    """Host syncs per round of the decode loop: a short run's count less a prefill-only run's, per round (None off
    CUDA, where nothing is counted and the two runs are skipped)."""
    import dataclasses

    from specexp.decoding.engine import generate

    if dev.type != "cuda":
        return None
    with count_syncs(dev) as full:
        g = generate(t, drafter, prompt, dc)
    with count_syncs(dev) as pre:
        generate(t, drafter, prompt, dataclasses.replace(dc, max_new_tokens=1))
    if full["n"] is None or not g.accept_lengths:
        return None
    return (full["n"] - pre["n"]) / len(g.accept_lengths)


def _oracle_case(t, d, prompt, ar, n: int, dc, dev, near_tie: float, ref: list[int] | None = None) -> dict:
    """One drafter at one forced acceptance: output vs AR, τ vs n + 1 per round, TPOT, syncs per round. `ref` is the
    continuation the oracle forces (default AR's): in bf16 the verify path's own greedy text, so that a near-tie
    where a k-row verify and a 1-row step round apart does not end the forced acceptance."""
    import dataclasses

    from specexp.decoding.engine import generate

    ref = ar.tokens if ref is None else ref
    o = OracleDrafter(d, ref, len(prompt), n, t.vocab_size, dev)
    g = generate(t, o, prompt, dc)
    j = _first_mismatch(g.tokens, ar.tokens)
    j_ref = _first_mismatch(g.tokens, ref)
    expect = [min(n, k) + 1 for k in g.drafted]           # a round drafting k <= n (the budget's end) takes k + 1
    done, ok = 0, True
    for got, want in zip(g.accept_lengths, expect):       # rounds wholly before a mismatch must accept exactly
        if j_ref is not None and done + got > j_ref:
            break
        ok &= got == want
        done += got
    full = [a for a, k in zip(g.accept_lengths, g.drafted) if k == d.max_drafts]
    row = {"n": n, "equal_to_ar": j is None, "tau": sum(g.accept_lengths) / len(g.accept_lengths),
           "tau_full_rounds": sum(full) / len(full) if full else None, "rounds": len(g.accept_lengths),
           "accept_exact": ok, "tpot_ms": 1e3 * g.decode_s / g.decode_tokens,
           "syncs_per_round": _decode_syncs(t, o, prompt, dataclasses.replace(
               dc, max_new_tokens=min(dc.max_new_tokens, 3 * (n + 1) + 2)), dev)}
    if j is not None:
        row["mismatch_at"] = j
        row["mismatch_gap"] = _gap_at(t, prompt, ar.tokens, j)
        row["near_tie"] = row["mismatch_gap"] < near_tie
    return row


def _oracle_sweep(ctx, t, label: str, layers: int, prompt: list[int], tokens: int, near_tie: float,
                  f: dict, checks: dict, exact: bool) -> None:
    """AR once (the oracle's continuation, TPOT, syncs), then every drafter at every n; figures into f[label]."""
    from specexp import registry
    from specexp.decoding.engine import DecodeConfig, generate

    dev = ctx.device
    dc = DecodeConfig(protocol="greedy", max_new_tokens=tokens)
    generate(t, None, prompt, DecodeConfig(protocol="greedy", max_new_tokens=4))                 # warm-up
    ar = generate(t, None, prompt, dc)
    res = f[label] = {"ar": {"tpot_ms": 1e3 * ar.decode_s / ar.decode_tokens, "tokens": len(ar.tokens),
                             "syncs_per_step": _decode_syncs(t, None, prompt, DecodeConfig(
                                 protocol="greedy", max_new_tokens=8), dev)}, "drafters": {}}
    backbones: dict = {}                     # one DFlash backbone for this target's drafters (_shared_dflash)
    for name, over in _oracle_drafters(ctx, layers).items():
        with step(res, checks, f"{label}/{name}"):
            with _shared_dflash(dev, backbones):
                d = registry.build_drafter(compose(over).drafter, t)
            grid = ORACLE_NS_DRY if ctx.dry else ORACLE_NS if exact else ORACLE_NS_BF16
            ns = sorted({min(n, d.max_drafts) for n in grid})
            generate(t, OracleDrafter(d, ar.tokens, len(prompt), ns[-1], t.vocab_size, dev), prompt,
                     DecodeConfig(protocol="greedy", max_new_tokens=2 * d.max_drafts + 2))   # warm-up: graphs, Triton
            rows = res["drafters"][name] = {"K": d.max_drafts}
            ref = None
            if not exact:        # bf16: force the verify path's own text (its n = 0 run), report AR's near-ties
                ref = generate(t, OracleDrafter(d, ar.tokens, len(prompt), 0, t.vocab_size, dev), prompt, dc).tokens
                rows["reference"] = "the verify path's greedy text (n = 0)"
            for n in ns:
                row = rows[f"n={n}"] = _oracle_case(t, d, prompt, ar, n, dc, dev, near_tie, ref)
                row["speedup_vs_ar"] = res["ar"]["tpot_ms"] / row["tpot_ms"]
                checks[f"{label}/{name}/n={n}_output"] = row["equal_to_ar"] or (not exact and row["near_tie"])
                checks[f"{label}/{name}/n={n}_accept_exact"] = row["accept_exact"]
                ctx.save_partial(f, checks)
        d = None
        if dev.type == "cuda":
            import torch

            torch.cuda.empty_cache()


def part_oracle_decode(ctx) -> dict:
    """End-to-end greedy decoding at Qwen3-8B widths through the real engine, each drafter forced by an oracle to
    accept n drafts a round: lossless (fp32, 4 layers: exactly AR's tokens), τ = n + 1, TPOT vs AR, syncs/round."""
    import random

    import torch

    dev = ctx.device
    cuda = dev.type == "cuda"
    P, G = (16, 12) if ctx.dry else (256, ctx.args.oracle_tokens)
    rnd = random.Random(0)
    prompt = [rnd.randrange(151643) for _ in range(P)]
    ns = ORACLE_NS_DRY if ctx.dry else ORACLE_NS
    f, checks, notes = {"prompt_tokens": P, "new_tokens": G, "ns": list(ns)}, {}, []
    # fp32, 4 layers at 8B widths: the engine's accept / rollback / commit must reproduce AR exactly
    with step(f, checks, "fp32"):
        t, f["attn_implementation"] = _build_qwen3(ctx, _qwen3_shape(ctx, 4), torch.float32)
        f["fp32_shape"] = _qwen3_shape(ctx, 4)
        _oracle_sweep(ctx, t, "fp32", 1, prompt, G, 0.0, f, checks, exact=True)
        t = None
        if cuda:
            torch.cuda.empty_cache()
    if ctx.dry:                             # on a CPU the second sweep would repeat the first (fp32, same shape)
        notes.append("dry run: one sweep (fp32, a 2-layer hidden-256 Qwen3), CPU timings, no sync counts; the bf16 "
                     "sweep at 8B widths is GPU-only")
        return {"figures": f, "checks": checks, "notes": notes}
    # the real widths and depth in the real dtype: TPOT and syncs; bf16 near-ties are reported, not failed
    with step(f, checks, "bf16"):
        dtype = qwen3_dtype(ctx)
        t0 = time.perf_counter()
        t, _ = _build_qwen3(ctx, _qwen3_shape(ctx), dtype)
        f["bf16_shape"], f["bf16_dtype"], f["build_s"] = _qwen3_shape(ctx), str(dtype), time.perf_counter() - t0
        _oracle_sweep(ctx, t, "bf16", 5, prompt, G, ORACLE_NEAR_TIE, f, checks, exact=False)
    f["peak_memory"] = peak_memory(dev)
    return {"figures": f, "checks": checks,
            "notes": notes + ["oracle: each round the drafter proposes for real, then its drafts become the AR "
                              "continuation for n positions and a wrong token after; τ counts the bonus token",
                              f"bf16: an output leaving AR's where the top-2 gap < {ORACLE_NEAR_TIE} is a near-tie "
                              "(reported); fp32 must equal AR exactly",
                              "syncs_per_round: a short run's CUDA syncs less a prefill-only run's, per round"]}


# ------------------------------------------------------------------------------------------------ batch_spec
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

    jobs = [_PromptJob(i, p) for i, p in enumerate(prompts)]
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


def part_batch_spec(ctx) -> dict:
    """Batched speculation (`decoding/batch_spec.speculate_batched`) at Qwen3-8B shapes, random weights: tokens/s of
    AR and of an oracle DFlash (5 layers, block 16: its proposals run for real, then are forced to accept a mean of
    τ - 1 drafts a round) at τ = 6.5 and τ = 3, on B = 1 .. 64 rows; the crossover batch of each τ (the smallest B at
    which it is no faster than AR through the same engine); every row's tokens against AR's."""
    import torch
    from bench_batch import crossover  # experiments/, on the path (_paths)

    from specexp import registry
    from specexp.decoding.engine import DecodeConfig
    from specexp.targets.static import StaticTarget

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    limit = (DRY_LIMIT_S if ctx.dry else PARTS["batch_spec"][1]) * ctx.args.timeout_scale
    shape = _qwen3_shape(ctx)
    layers = 1 if ctx.dry else 5
    G = SPEC_TOKENS_DRY if ctx.dry else SPEC_TOKENS
    lo, hi = SPEC_PROMPTS_DRY if ctx.dry else SPEC_PROMPTS
    t0 = time.perf_counter()
    t, impl = _build_qwen3(ctx, shape, dtype, name="batch_spec")
    _unambiguous(t)
    st = StaticTarget.of(t)
    with _shared_dflash(dev, {}):
        d = registry.build_drafter(compose(_oracle_drafters(ctx, layers)["dflash"]).drafter, t)
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "attn_implementation": impl, "drafter": {"name": "dflash", "layers": layers, "K": d.max_drafts},
         "build_s": time.perf_counter() - t0, "new_tokens": G, "prompt_tokens_range": [lo, hi],
         "taus": list(SPEC_TAUS), "batches": {}, "not_run": {}}
    checks, notes = {}, []
    with step(f, checks, "top2_gap"):             # _unambiguous at work: the target's greedy token is never a tie
        probe = _random_prompts(1, hi, hi, 198)[0]
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
        warm = _random_prompts(2, lo, hi, 199)
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
            prompts = _random_prompts(b, lo, hi, 300 + b)
            ar_jobs, ar = _spec_run(st, None, prompts, b, dc, dev)
            row = f["batches"][str(b)] = {"rows": b, "prompt_tokens": sum(len(p) for p in prompts), "ar": ar}
            refs = {tuple(j.prompt): j.tokens for j in ar_jobs}
            for tau in SPEC_TAUS:
                o = RowsOracle(d, refs, tau - 1, t.vocab_size, dev)
                jobs, r = _spec_run(st, o, prompts, b, dc, dev)
                differ = {j.i: _first_mismatch(j.tokens, a.tokens) for j, a in zip(jobs, ar_jobs)
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


PARTS = {   # name: (function, GPU time limit in s, Triton interpreted in a dry run); most valuable first (docstring)
    "qwen3_8b_shape": (part_qwen3_8b_shape, 58, False),
    "static_graph": (part_static_graph, 75, False),
    "batched_ar": (part_batched_ar, 40, False),
    "batch_spec": (part_batch_spec, 40, False),
    "plan_calibration": (part_plan_calibration, 48, False),
    "oracle_decode": (part_oracle_decode, 95, False),
    "kernel_parity": (part_kernel_parity, 28, True),
    "drafters_lossless": (part_drafters_lossless, 51, False),
    "protocol_b_graph": (part_protocol_b_graph, 67, True),
    "head_loop_graph": (part_head_loop_graph, 17, True),
    "fusion_tiles_compile": (part_fusion_tiles_compile, 12, False),
    "train_smoke": (part_train_smoke, 39, False),
}
ALIASES = {"fusion_kernel": "kernel_parity"}     # the former name of kernel_parity's timing half
BUDGET_S = 570                                   # the whole check on a GPU: the limits above sum to at most this
DRY_LIMIT_S = 900                                # per part in a dry run (CPU times, not budgeted)
assert sum(limit for _, limit, _ in PARTS.values()) <= BUDGET_S


# ------------------------------------------------------------------------------------------------ running
class Ctx:
    def __init__(self, args):
        import torch

        global TIME_REPS
        self.args, self.dry = args, args.dry_run
        TIME_REPS = 1 if self.dry else 5
        self.work = Path(args.work_dir)
        self.cache = Path(os.environ.get("SPECEXP_CACHE", "~/.cache/specexp")).expanduser()
        if self.dry:
            self.device = torch.device("cpu")
        else:
            if not torch.cuda.is_available():
                raise Skip("CUDA is not available (run with --dry-run on a CPU)")
            self.device = torch.device(args.device)
            torch.cuda.set_device(self.device)

    def save_partial(self, figures: dict, checks: dict, notes: list | None = None) -> None:
        """The part's figures so far, where the parent looks for its result: a part killed at its time limit still
        reports what it measured before (status failed, the timeout as its error)."""
        if self.args.part_json:
            write_report(Path(self.args.part_json), {
                "status": "failed", "figures": figures, "checks": checks, "notes": notes or [], "partial": True,
                "error": "incomplete: the part stopped before its end (figures up to its last checkpoint)"})


def run_one(name: str, args) -> dict:
    """One part in this process: {status, figures, checks, notes, error, seconds}."""
    t0 = time.perf_counter()
    res = {"status": "failed", "figures": None, "checks": {}, "notes": [], "error": None}
    try:
        _paths()
        ctx = Ctx(args)
        ctx.work.mkdir(parents=True, exist_ok=True)
        out = PARTS[name][0](ctx)
        res.update(out)
        failed = [k for k, v in res["checks"].items() if not v]
        res["status"] = "failed" if failed else "passed"
        if failed:
            res["error"] = "checks failed: " + ", ".join(failed)
    except Skip as e:
        res.update(status="skipped", error=str(e))
    except BaseException as e:               # a failing part must never stop the others
        res["error"] = "".join(traceback.format_exception(e))[-6000:]
    res["seconds"] = time.perf_counter() - t0
    return res


def environment(args) -> dict:
    import torch

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "dry_run": args.dry_run}
    for mod in ("triton", "transformers", "lightning", "hydra", "safetensors", "tokenizers"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:
            env[mod] = f"not importable ({type(e).__name__})"
    try:
        import flash_attn
        env["flash_attn"] = flash_attn.__version__
    except Exception as e:
        env["flash_attn"] = f"not importable ({type(e).__name__}: {str(e)[:200]})"
    if torch.cuda.is_available() and not args.dry_run:
        p = torch.cuda.get_device_properties(args.device)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=p.total_memory / 2**30,
                   sync_counter=sync_selftest(torch.device(args.device)))
    try:
        env["git"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                    timeout=10).stdout.strip() or None
    except Exception:
        env["git"] = None
    return env


def write_report(path: Path, report: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    os.replace(tmp, path)


def run_child(name: str, args, argv, work: Path, limit: float) -> dict:
    """One part in its own process, killed at `limit` seconds; its result file, or what it saved before dying."""
    fn, _, interpreted = PARTS[name]
    env = dict(os.environ)
    if args.dry_run and interpreted:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    res_file, log = work / f"{name}.json", work / f"{name}.log"
    res_file.unlink(missing_ok=True)
    # --out as this process resolved it: the child runs in ROOT, and a part writes files beside the report
    cmd = [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:]),
           "--out", str(Path(args.out).resolve()), "--run-part", name, "--part-json", str(res_file),
           "--work-dir", str(work / name)]
    print(f"gpu_check: {name} ...", flush=True)
    p0 = time.perf_counter()
    timed_out = False
    try:
        with log.open("w") as f:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        timed_out, rc = True, None
    res = json.loads(res_file.read_text()) if res_file.exists() else {
        "status": "failed", "figures": None, "checks": {}, "notes": [], "error": None}
    if timed_out:
        res.update(status="failed", error=f"timed out after {limit:.0f} s"
                   + (" (figures: up to the part's last checkpoint)" if res.get("figures") else ""))
    elif res.get("partial") or not res_file.exists():
        res.update(status="failed", error=f"the part's process exited with {rc} before its end")
    res["wall_s"] = time.perf_counter() - p0
    res["limit_s"] = limit
    if res["status"] == "failed":
        res["log_tail"] = log.read_text(errors="replace")[-4000:] if log.exists() else None
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default="gpu_check.json", help="the JSON report (default gpu_check.json)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, small sizes, Triton interpreted")
    ap.add_argument("--parts", "--sections", dest="parts", default=",".join(PARTS),
                    help="comma-separated subset to run, in the given order (default: all, most valuable first)")
    ap.add_argument("--list", action="store_true", help="list the parts and exit")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth for the floor, TB/s (H200: 4.8)")
    ap.add_argument("--layers", type=int, default=36, help="decoder layers of the Qwen3-8B-shaped target")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens before the timed steps")
    ap.add_argument("--oracle-tokens", type=int, default=48, help="new tokens per oracle_decode generation")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiplies every part's time limit")
    ap.add_argument("--work-dir", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--run-part", help=argparse.SUPPRESS)
    ap.add_argument("--part-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(PARTS))
        return 0
    parts = [ALIASES.get(p.strip(), p.strip()) for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        print(f"gpu_check: unknown part {bad[0]!r}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    for k, v in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("WANDB_MODE", "disabled"),
                 ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    if args.run_part:                                                   # the child: one part, its result to a file
        Path(args.part_json).write_text(json.dumps(run_one(args.run_part, args), default=str))
        return 0

    out = Path(args.out).resolve()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = Path(args.work_dir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        report = {"specexp_gpu_check": FORMAT, "mode": "dry-run" if args.dry_run else "gpu",
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": [sys.executable, *sys.argv],
                  "environment": environment(args), "parts": {}, "summary": {}}
        deadline = 0.0
        for name in parts:
            # cumulative deadlines: part i must end by the sum of the limits up to i, so time a part leaves unused
            # goes to the later ones and the whole run never exceeds the sum (BUDGET_S)
            deadline += (DRY_LIMIT_S if args.dry_run else PARTS[name][1]) * args.timeout_scale
            limit = max(deadline - (time.perf_counter() - t0), 1.0)
            res = run_child(name, args, argv, work, limit)
            report["parts"][name] = res
            print(f"gpu_check: {name} {res['status']} ({res['wall_s']:.0f} s of {limit:.0f})"
                  + (f": {str(res['error']).strip().splitlines()[-1]}" if res["error"] else ""), flush=True)
            figures = res.get("figures") or {}
            for line in figures.get("headline", []):                   # a part's one-line results (the plan's)
                print(f"gpu_check:   {line}", flush=True)
            if figures.get("calibration_file"):                         # plan_calibration wrote it beside the report
                report["calibration_file"] = figures["calibration_file"]
            report["summary"] = {s: sum(r["status"] == s for r in report["parts"].values())
                                 for s in ("passed", "failed", "skipped")}
            report["wall_s"] = time.perf_counter() - t0
            write_report(out, report)                                   # after every part: a kill keeps the rest
    print(f"gpu_check: {report['summary']} in {report['wall_s']:.0f} s -> {out}", flush=True)
    return 0 if report["summary"]["failed"] == 0 and report["summary"]["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
