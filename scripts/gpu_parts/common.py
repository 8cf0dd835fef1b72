"""What every part of scripts/gpu_check.py shares: the part's context (`Ctx`: device, scratch directory, time limit,
partial results), timing and host-sync counting, a measurement that records its error and lets the part go on
(`step`), composing and running specexp as `python -m specexp` would, a χ² p-value, and the pieces several parts
build on: the random Qwen3-8B-shaped target, one DFlash backbone shared by the drafters built on it, a step's bytes
and the measured read bandwidth (its floor), random prompts and the job that carries one through batched decoding,
and the fusion kernel's inputs.

Nothing here imports torch, transformers or specexp at module level: the runner imports this module to parse its
command line and list the parts, and each part imports what it needs when it runs (in its own process).
"""
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]      # the repository (this file is scripts/gpu_parts/common.py)
STARTED = time.perf_counter()      # this process's start: a part that sizes its work to its limit counts from it
TIME_REPS = 5                       # timing repetitions (1 in a dry run, where timings only show the code runs)


class Skip(Exception):
    """A part that cannot run here: recorded as skipped with this reason."""


class Ctx:
    """What a part runs with: the command line (`args`), `dry` (a CPU dry run), its `device`, its scratch directory
    (`work`), specexp's cache and `limit_s`, the part's own time limit (what a part that sizes its work to its limit
    counts from STARTED)."""

    def __init__(self, args, limit_s: float):
        import torch

        global TIME_REPS
        self.args, self.dry, self.limit_s = args, args.dry_run, limit_s
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


def write_report(path: Path, report: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ helpers
def setup_paths() -> None:
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


# ----------------------------------------------------------------------------- the Qwen3-8B-shaped target
def qwen3_shape(ctx, layers: int | None = None) -> dict:
    a = ctx.args
    if ctx.dry:
        return dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    intermediate_size=768, vocab_size=151936)
    return dict(hidden_size=4096, num_hidden_layers=layers or a.layers, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, intermediate_size=12288, vocab_size=151936)


def build_qwen3(ctx, shape: dict, dtype, name: str = "qwen3_8b_shape"):
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
def shared_dflash(dev, backbones: dict):
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


def step_bytes(model, shape: dict, dtype) -> tuple[int, int]:
    """(bytes of the weights a decode step reads: all but the embedding table, of which one row is read; KV bytes per
    cached position: keys and values of every layer)."""
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    return weights, 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * dtype.itemsize


def read_bandwidth(dev, dtype) -> float:
    """Bytes per second the device reads: a sum over 1 GiB of `dtype` (64 MiB on a CPU), reads only."""
    import torch

    cuda = torch.device(dev).type == "cuda"
    buf = torch.ones((2**30 if cuda else 2**26) // dtype.itemsize, dtype=dtype, device=dev)
    ms = time_ms(lambda: buf.sum(), dev, 10 if cuda else 2)
    return buf.numel() * buf.element_size() / (ms / 1e3)


# ------------------------------------------------------------------------------------------------ batches
BATCHES = (1, 8, 32, 64)             # batched_ar and the plan's calibration: rows per step
BATCHES_DRY = (1, 2, 4)


class PromptJob:
    """One single-turn job of decoding/batch.generate_batched: its prompt, then the tokens it got."""

    def __init__(self, i: int, prompt: list[int]):
        self.i, self.prompt, self.tokens, self.gen = i, prompt, None, None

    def next_prompt(self, previous):
        if previous is None:
            return self.prompt
        self.tokens, self.gen = previous.tokens, previous
        return None


def random_prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """`n` prompts of lo..hi random token ids (below Qwen3's special tokens), the same for the same seed."""
    import random

    rnd = random.Random(seed)
    return [[rnd.randrange(151643) for _ in range(rnd.randint(lo, hi))] for _ in range(n)]


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter's length when one is the other's prefix), else None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


# -------------------------------------------------------------------------------------- the fusion kernel
def fusion_inputs(V: int, r: int, seed: int, dev, hot: list[int] | None = None):
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

