"""First contact with a GPU: one command, offline, whatever torch / Triton / transformers the machine has, one JSON
report. Each part runs in its own process (a CUDA fault, a hang or an out-of-memory in one part cannot take the
others down; each has a time limit) and is recorded as passed / failed / skipped with its figures, its checks and,
when it fails, the error text.

    bash scripts/gpu_check.sh                          # all parts on cuda:0, report gpu_check.json (~10 min)
    bash scripts/gpu_check.sh --out r.json --parts fusion_kernel,qwen3_8b_shape --layers 18
    bash scripts/gpu_check.sh --dry-run                # what a CPU can run: kernels under TRITON_INTERPRET=1

Parts (`--list`):
  fusion_kernel         Triton fusion kernel vs the torch reference at V = 151936, bf16: argmax tokens, sampled
                        tokens given the noise, in-kernel Philox draws (the same token for every tile, its
                        probability equal to the reference's); µs per call of every tile of kernels/fusion.TILES,
                        the autotuner's pick and the fastest tile
  fusion_tiles_compile  registers, stack and shared memory per thread of every tile compiled for this GPU's
                        architecture (sm_90 in a dry run), from cuobjdump; the autotuned tiles must not spill
  head_loop_graph       the sequential head loops (DeLS RNN / Markov, Domino-FT) at Qwen3-8B shapes: eager torch,
                        eager Triton, CUDA graph + torch, CUDA graph + Triton; same greedy tokens, same sampled
                        tokens (eager Triton vs graph Triton, one seed), host syncs per block, ms per block
  drafters_lossless     every drafter of the registry on tiny_qwen3, fp32, greedy, through task=eval (in-process
                        run_task): lossless against AR, exactly
  protocol_b_graph      DeLS-RNN under protocol B with the in-graph sampler (fusion.cuda_graph=true): χ² of the
                        first 3 tokens against the exact distribution of a 5-token Qwen3 (enumerated), and a
                        decoding=sample_b task=eval run on tiny_qwen3 (runs, valid records)
  train_smoke           task=train target=tiny_qwen3 data=smoke train=smoke (flex attention, torch.compile,
                        bf16-mixed on GPU)
  qwen3_8b_shape        a random-weight Qwen3-8B-shaped target in bf16 (built on the GPU, nothing downloaded): AR
                        ms/step, verify ms per 16-token block, host syncs per forward for the attention in use,
                        verify-vs-AR logit differences (what eval.near_tie must cover), DFlash draft ms (5 layers,
                        block 16), DeLS / Domino-FT propose eager vs graph + Triton, ratios to the HBM floor,
                        peak memory; FlashAttention-2 against SDPA when flash_attn imports

Host syncs are counted with torch.cuda.set_sync_debug_mode("warn"): every synchronising CUDA call (.item(),
.tolist(), a blocking copy, nonzero, ...) raises a "called a synchronizing CUDA operation" warning, and the
warnings of the measured region are counted (the report's `sync_counter` records a self-test: one .item()
counts 1, a device-only op 0).

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
    return {"item": item, "device_op": dev_op, "works": item == 1 and dev_op == 0}


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
def part_fusion_kernel(ctx) -> dict:
    import torch

    from specexp.eval.metrics import top2_gap
    from specexp.kernels import fusion as F

    dev, dtype = ctx.device, torch.bfloat16
    V, r = (DRY_VOCAB, DRY_RANK) if ctx.dry else (151936, 256)
    a, b, T = 0.3, 0.3, 0.8
    g = torch.Generator().manual_seed(0)
    long = (torch.randn(V, generator=g) * 3).to(dev, dtype)                                    # [V]
    z = torch.randn(r, generator=g).to(dev, dtype)                                              # [r]
    w = (torch.randn(V, r, generator=g) / r ** 0.5).to(dev, dtype)                              # [V, r]
    lp = torch.log_softmax(torch.randn(V, generator=g), 0).to(dev, dtype)                       # [V]
    noise = F.gumbel(V, torch.Generator(device=dev).manual_seed(1), dev)                        # [V]
    fused = F.fused_logits(long, z, w, a, b, lp)                                                # [V] fp32
    q = torch.softmax(fused / T, 0)
    ref_tok = int(F.fuse_torch(long, z, w, a, b, lp)[0])
    ref_s_tok, ref_s_prob = F.fuse_torch(long, z, w, a, b, lp, T, noise)
    iters, reps, warm = (1, 1, 0) if ctx.dry else (200, 5, 3)
    tiles, checks = {}, {}
    for tile in ("auto", *F.TILES):
        k = F.TritonFusion(V, dev, tile)
        tuned = lambda: {F.tile_name(c.kwargs["BLOCK"], c.kwargs["BLOCK_R"], c.num_warps):  # noqa: E731
                         1e3 * (t[0] if isinstance(t, (list, tuple)) else t)                 # the tuner's µs
                         for c, t in (getattr(F._fuse_tiles_tuned, "configs_timings", None) or {}).items()}
        tok = int(k(long, z, w, a, b, lp)[0])
        chosen = {"greedy": k.chosen_tile}
        autotune_us = {"greedy": tuned()} if tile == "auto" and not F.interpreted() else None
        s_tok, s_prob = k(long, z, w, a, b, lp, T, noise)
        k.seed.fill_(12345)
        ph_tok, ph_prob = k(long, z, w, a, b, lp, T)                                            # in-kernel Philox
        ph_tok, chosen["sampled"] = int(ph_tok), k.chosen_tile
        if autotune_us is not None:
            autotune_us["sampled"] = tuned()
        row = {"chosen": chosen, "greedy_token": tok, "sampled_token": int(s_tok),
               "sampled_prob_rel_err": abs(float(s_prob) / float(ref_s_prob) - 1),
               "philox_token": ph_tok, "philox_prob_rel_err": abs(float(ph_prob) / float(q[ph_tok]) - 1),
               "greedy_us": 1e3 * time_ms(lambda: k(long, z, w, a, b, lp), dev, iters, reps, warm),
               "sampled_us": 1e3 * time_ms(lambda: k(long, z, w, a, b, lp, T), dev, iters, reps, warm)}
        if autotune_us is not None:
            row["autotune_us"] = autotune_us
        tiles[tile] = row
    checks["greedy_tokens_equal_reference"] = all(t["greedy_token"] == ref_tok for t in tiles.values())
    checks["sampled_tokens_equal_reference"] = all(t["sampled_token"] == int(ref_s_tok) for t in tiles.values())
    checks["sampled_probs_match"] = all(t["sampled_prob_rel_err"] < 1e-3 for t in tiles.values())
    checks["philox_same_token_every_tile"] = len({t["philox_token"] for t in tiles.values()}) == 1
    checks["philox_probs_match"] = all(t["philox_prob_rel_err"] < 1e-3 for t in tiles.values())
    named = {n: t for n, t in tiles.items() if n != "auto"}
    fastest = min(named, key=lambda n: named[n]["greedy_us"])
    ref_us = 1e3 * time_ms(lambda: F.fuse_torch(long, z, w, a, b, lp), dev, iters, reps, warm)
    floor_us = (V * r + 2 * V) * 2 / (ctx.args.hbm_tbs * 1e12) * 1e6          # W, long and the prior, bf16
    return {"figures": {
        "vocab": V, "rank": r, "dtype": "bfloat16", "interpreted": F.interpreted(), "tiles": tiles,
        "shipped_tile": "1024x64w4", "autotune_set": list(F.AUTOTUNE), "autotune_pick": tiles["auto"]["chosen"],
        "fastest_tile_greedy": fastest,
        "fastest_tile_sampled": min(named, key=lambda n: named[n]["sampled_us"]),
        "torch_reference_us": ref_us, "hbm_floor_us": floor_us,
        "fastest_over_floor": named[fastest]["greedy_us"] / floor_us,
        "reference_top2_gap": float(top2_gap(fused))},
        "checks": checks,
        "notes": ["µs per call = the kernel and the few torch ops combining its tiles, back to back"]
        + (["interpreter: the timings measure numpy, not a GPU"] if F.interpreted() else [])}


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


def part_fusion_tiles_compile(ctx) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from specexp.kernels import fusion as F

    cuda = torch.cuda.is_available() and not ctx.dry
    major, minor = torch.cuda.get_device_capability() if cuda else (9, 0)
    arch = 10 * major + minor
    ptr = {"long_ptr": "*bf16", "z_ptr": "*bf16", "w_ptr": "*bf16", "lp_ptr": "*bf16", "noise_ptr": "*fp32",
           "seed_ptr": "*i64", "best_ptr": "*fp32", "tok_ptr": "*i64", "tmax_ptr": "*fp32", "tsum_ptr": "*fp32",
           "sbest_ptr": "*fp32", "alpha": "fp32", "beta": "fp32", "inv_t": "fp32", "seed_add": "i32", "V": "i32",
           "R": "constexpr", "BLOCK": "constexpr", "BLOCK_R": "constexpr", "SAMPLE": "constexpr",
           "HAS_NOISE": "constexpr"}
    out = {}
    for sample in (False,) if ctx.dry else (False, True):        # dry run: the greedy kernels (the spilling tile's
        for name, (block, block_r, warps) in F.TILES.items():     # ptxas run alone takes ~30 s on 2 cores)
            t0 = time.perf_counter()
            src = triton.compiler.ASTSource(fn=F._fuse_tiles, signature=ptr, constexprs={
                "R": 256, "BLOCK": block, "BLOCK_R": block_r, "SAMPLE": sample, "HAS_NOISE": False})
            k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
            out[f"{name}/{'sampled' if sample else 'greedy'}"] = {
                **_res_usage(k.asm["cubin"]), "compile_s": time.perf_counter() - t0}
    spill_free = all(v["stack"] == 0 for k, v in out.items() if k.split("/")[0] in F.AUTOTUNE)
    return {"figures": {"arch": f"sm_{arch}", "rank": 256, "dtype": "bfloat16", "triton": triton.__version__,
                        "per_thread": out},
            "checks": {"autotuned_tiles_spill_free": spill_free},
            "notes": ["per thread, from cuobjdump -res-usage of the cubin Triton compiles for this architecture "
                      "(stack > 0 = local-memory spills)"]}


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


def _qwen3_shape(ctx) -> dict:
    a = ctx.args
    if ctx.dry:
        return dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    intermediate_size=768, vocab_size=151936)
    return dict(hidden_size=4096, num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, intermediate_size=12288, vocab_size=151936)


def part_qwen3_8b_shape(ctx) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specexp import registry
    from specexp.eval.metrics import top2_gap
    from specexp.targets import QWEN3_MASK_ID, Target, attn_implementation

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = _qwen3_shape(ctx)
    config = Qwen3Config(**shape, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6}, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    impl = attn_implementation("auto") if cuda else "sdpa"
    config._attn_implementation = impl
    t0 = time.perf_counter()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev), torch.random.fork_rng(devices=[dev.index or 0] if cuda else []):
            torch.manual_seed(0)
            model = Qwen3ForCausalLM(config).eval().requires_grad_(False)                # random init, on the device
    finally:
        torch.set_default_dtype(old)
    t = Target("qwen3_8b_shape", model, None, QWEN3_MASK_ID, [], source="random init")
    f = {"shape": shape, "scaled": ctx.dry or shape["num_hidden_layers"] != 36, "dtype": str(dtype),
         "attn_implementation": impl, "build_s": time.perf_counter() - t0}
    checks, notes = {}, []
    P, B = (64 if ctx.dry else ctx.args.context), 16
    iters = 1 if ctx.dry else 30
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 151643, (1, P), generator=g).to(dev)                             # [1, P]
    block = torch.randint(0, 151643, (1, B), generator=g).to(dev)                              # [1, B]
    anchor = int(block[0, 0])
    layers = ["drafter.init=random", f"drafter.num_layers={1 if ctx.dry else 5}", "drafter.block_size=16"]
    dflash = registry.build_drafter(compose(["drafter=dflash", *layers]).drafter, t)
    taps = dflash.tap_layers
    cache = t.new_cache()
    _, prompt_taps = t.forward(prompt, 0, cache, taps=taps)                                     # [1, P, n*H]

    def ar_step():
        t.forward(block[:, :1], P, cache)
        t.rollback(cache, 1)

    def verify():
        t.forward(block, P, cache, taps=taps)
        t.rollback(cache, B)

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
    dflash = None                                                     # free it before the next drafters
    f["sequential_drafters"] = {}
    for name in ("dels_rnn", "dels_markov", "domino_ft"):             # DFlash + the loop, in three loop variants
        with step(f, checks, name):
            o = [f"drafter={name}", *layers, f"fusion.kernel={'triton' if cuda else 'torch'}",
                 f"fusion.cuda_graph={'true' if cuda else 'false'}"]
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


PARTS = {   # name: (function, time limit in seconds, Triton interpreted in a dry run)
    "fusion_kernel": (part_fusion_kernel, 300, True),
    "fusion_tiles_compile": (part_fusion_tiles_compile, 300, False),
    "head_loop_graph": (part_head_loop_graph, 300, True),
    "drafters_lossless": (part_drafters_lossless, 300, False),
    "protocol_b_graph": (part_protocol_b_graph, 300, True),
    "train_smoke": (part_train_smoke, 420, False),
    "qwen3_8b_shape": (part_qwen3_8b_shape, 480, False),
}


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default="gpu_check.json", help="the JSON report (default gpu_check.json)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, small sizes, Triton interpreted")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset (default: all)")
    ap.add_argument("--list", action="store_true", help="list the parts and exit")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth for the floor, TB/s (H200: 4.8)")
    ap.add_argument("--layers", type=int, default=36, help="decoder layers of the Qwen3-8B-shaped target")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens before the timed steps")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiplies every part's time limit")
    ap.add_argument("--work-dir", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--run-part", help=argparse.SUPPRESS)
    ap.add_argument("--part-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(PARTS))
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
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
        for name in parts:
            fn, limit, interpreted = PARTS[name]
            env = dict(os.environ)
            if args.dry_run and interpreted:
                env["TRITON_INTERPRET"] = "1"
            else:
                env.pop("TRITON_INTERPRET", None)
            res_file = work / f"{name}.json"
            log = work / f"{name}.log"
            cmd = [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:]),
                   "--run-part", name, "--part-json", str(res_file), "--work-dir", str(work / name)]
            print(f"gpu_check: {name} ...", flush=True)
            p0 = time.perf_counter()
            try:
                with log.open("w") as f:
                    rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                        timeout=limit * args.timeout_scale).returncode
                res = json.loads(res_file.read_text()) if res_file.exists() else {
                    "status": "failed", "figures": None, "checks": {}, "notes": [],
                    "error": f"the part's process exited with {rc} without a result"}
            except subprocess.TimeoutExpired:
                res = {"status": "failed", "figures": None, "checks": {}, "notes": [],
                       "error": f"timed out after {limit * args.timeout_scale:.0f} s"}
            res["wall_s"] = time.perf_counter() - p0
            if res["status"] == "failed":
                res["log_tail"] = log.read_text(errors="replace")[-4000:] if log.exists() else None
            report["parts"][name] = res
            print(f"gpu_check: {name} {res['status']} ({res['wall_s']:.0f} s)"
                  + (f": {str(res['error']).strip().splitlines()[-1]}" if res["error"] else ""), flush=True)
            report["summary"] = {s: sum(r["status"] == s for r in report["parts"].values())
                                 for s in ("passed", "failed", "skipped")}
            report["wall_s"] = time.perf_counter() - t0
            write_report(out, report)                                   # after every part: a kill keeps the rest
    print(f"gpu_check: {report['summary']} in {report['wall_s']:.0f} s -> {out}", flush=True)
    return 0 if report["summary"]["failed"] == 0 and report["summary"]["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
