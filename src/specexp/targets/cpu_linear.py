"""`target.prepack`: the linear layers of a CPU model with their weights packed once, in bf16 and in fp32.

**bf16.** `F.linear` goes to oneDNN, which reorders the weight into its blocked layout on every call: for the mini
target's 49,152 x 576 lm_head that reorder costs more than the product (1 row: 3.9 ms a call, 1.1 ms with the
weight packed once; 8 rows: 5.4 against 1.9; 2-core AVX512-BF16 EPYC, 2 threads, one-off timings). In
experiments/bench_engine.py an AR step of the static engine took 38.3 ms unpacked and 29.2 ms packed, a verify of 4
rows 41.0 and 27.6 (experiments/results/engine/2026-12-05-epyc-avx512bf16-cap3/ and -prepack/). The packed product
is the same oneDNN kernel without the per-call reorder, so its outputs are the unpacked call's bit for bit
(tests/test_cpu_linear.py checks logits and greedy tokens against the unpacked model).

**fp32.** `F.linear` is MKL's sgemm, which packs its right-hand side on every call too: a verify of 8 rows cost 2.1
AR steps on a 2-core Xeon, most of it in products of 2-8 rows that read the same weights as a 1-row step. Which
product is fastest at a given number of rows depends on the CPU (on that Xeon the plain product wins at 1 row,
MKL's packed GEMM at 4-8; on an AVX2 EPYC oneDNN's packed product beat the plain one at 1 row too), so the fp32
path is **measured, not assumed**: for every weight shape of the model and every row bucket (`ROWS`: a block of m
rows runs at the smallest bucket >= m, padded with zero rows; more rows, e.g. a prefill, run `F.linear`) the
plain, the oneDNN-packed and the MKL-packed product (one pack per bucket: MKL's packed format is made for one
row count) are timed on weights streamed from memory as a forward reads them, and a packed kind is kept only where
it is at least `GAIN` faster. The plan is measured once per CPU, thread count, torch build and shape, and cached
(`plan_file`: `<cache>/cpu_linear/*.json`, with its timings; a few seconds the first time; checked on every read,
and measured again, saying so, when damaged or foreign). Each bucket's product is
one kernel at one row count, so row r of a block gives the same numbers whatever the block's real length (the
zero rows do not reach it). These products are **not** the plain one bit for bit: fp32 sums in another order
differ in the last bits (about 1e-7 relative), as they do between two CPUs' sgemm kernels or between `F.linear` at
1 row (a matrix-vector product) and at 8. The engine's contract stays what it was: the target's greedy output on
the path it runs, AR and verification through the same packed layers (tests/test_cpu_linear.py: every drafter's
greedy output equals packed AR's; packed AR equals plain AR on the test models). Models whose linear weights total
under `MIN_FP32_BYTES` (the tests' tiny models: 39 MB, nearly all of it a vocabulary head that a step reads once;
their forward is per-op overhead, which packing does not touch) and models whose packs would not fit in half the
free memory are left plain and nothing is measured.

Either dtype: a packed layer serves only what was checked: a contiguous input of the weight's dtype, outside grad
mode (the packed ops have no backward), a weight not written since it was packed. Anything else, e.g. a DFlash
training loss through the target's lm_head, runs the module's own `F.linear`. Each packed layer keeps its parameter
(state_dict, `.weight` readers and tied embeddings are unchanged) and holds the packed copies beside it. A packed
model cannot be deep-copied, pickled or `torch.save`d whole (oneDNN's opaque tensor has no storage); its state_dict
can. Packing once is what inductor's "freezing" does for a compiled CPU model; here it is done on the eager model,
so both engines and every drafter that calls the target's modules (DFlash's draft projection is the target's
lm_head) get it without a compilation.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROWS = (1, 2, 4, 8, 16)          # row buckets of the fp32 plan: a verify of k + 1 <= 16 rows; more rows run F.linear
KINDS = ("plain", "onednn", "mkl")
GAIN = 0.9                       # a packed kind is chosen where it takes at most this share of the plain time
MIN_FP32_BYTES = 64 << 20        # fp32 models with fewer bytes of linear weights stay plain (module docstring)
STREAM_BYTES = 64 << 20          # weights a timing reads per pass, in copies of the shape (past the CPU's caches)
# The measuring's wall-time budget (`measure`), shared by the row buckets: idle, the mini target's five rounds a
# bucket fit in it; busy, each bucket stops after its first timed round, so the cost stays about two rounds a bucket.
MEASURE_S = 10.0
_BUCKET = [next(b for b in ROWS if b >= m) for m in range(ROWS[-1] + 1)]      # rows -> their bucket


def _mkldnn():
    return getattr(torch.ops, "mkldnn", None)


def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch build can pack linear weights of `dtype` on this CPU: bf16 through oneDNN (with native
    bf16 support), fp32 through oneDNN or MKL."""
    mk = _mkldnn()
    try:
        dnn = (torch.backends.mkldnn.is_available() and hasattr(mk, "_reorder_linear_weight")
               and hasattr(mk, "_linear_pointwise"))
        if dtype == torch.bfloat16:
            return dnn and bool(mk._is_mkldnn_bf16_supported())
        return dtype == torch.float32 and (dnn or _has_mkl())
    except (AttributeError, RuntimeError):
        return False


def _has_mkl() -> bool:
    return torch.backends.mkl.is_available() and hasattr(getattr(torch.ops, "mkl", None), "_mkl_linear")


def wanted(setting, device: torch.device, dtype: torch.dtype, compiled: bool = False) -> bool:
    """`target.prepack` on this device and dtype: `auto` = a bf16 or fp32 model on a CPU whose torch can pack
    (`available`), unless `target.compile` (inductor packs a compiled step's weights itself); true = the same, or one
    clear line where it cannot; false = never. (In fp32 `pack` still leaves plain what its plan measures no faster.)"""
    from ..errors import check

    fits = torch.device(device).type == "cpu" and dtype in (torch.bfloat16, torch.float32)
    if setting == "auto":
        return fits and not compiled and available(dtype)
    if setting:
        check(fits, f"target.prepack=true needs a bf16 or float32 target on a CPU (this one: {dtype} on {device}); "
                    "use auto or false")
        check(not compiled, "target.prepack=true with target.compile=true: the compiled step packs its own weights; "
                            "use target.prepack=auto or false")
        check(available(dtype), f"target.prepack=true: this torch build cannot pack {dtype} weights on this CPU "
                                "(torch.ops.mkldnn / torch.ops.mkl); use auto or false")
    return bool(setting)


# ------------------------------------------------------------------------------------------------ the products
def _stale(self) -> bool:
    v = self.packed_version
    return v is not None and self.weight._version != v


def _forward_bf16(self, x: torch.Tensor) -> torch.Tensor:
    # F.linear instead: in grad mode (the packed op has no backward; the engines run in inference mode), for another
    # dtype, for a strided input (F.linear itself takes another path for it, with other rounding) and for a weight
    # written since it was packed (an optimizer step, load_state_dict: the packed copy would be stale). Checked in
    # this order on every call, so the common case costs a few attribute reads.
    if torch.is_grad_enabled() or x.dtype is not torch.bfloat16 or not x.is_contiguous() or _stale(self):
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def _forward_fp32(self, x: torch.Tensor) -> torch.Tensor:
    m = x.numel() // x.shape[-1] if x.dim() else 0
    if (m == 0 or m > ROWS[-1] or torch.is_grad_enabled() or x.dtype is not torch.float32 or not x.is_contiguous()
            or _stale(self)):
        return F.linear(x, self.weight, self.bias)
    b = _BUCKET[m]
    kind = self.plan[b]
    if kind == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
    if kind == "plain":
        return F.linear(x, self.weight, self.bias)
    rows = x.reshape(m, x.shape[-1])                                                       # [m, K]
    if m < b:                              # MKL's pack is made for b rows; the zero rows' outputs are dropped
        rows = torch.cat([rows, rows.new_zeros(b - m, rows.shape[1])])                     # [b, K]
    out = torch.ops.mkl._mkl_linear(rows, self.mkl_packs[b], self.weight, self.bias, b)   # [b, N]
    return out[:m].reshape(*x.shape[:-1], out.shape[1])


def _pack_one(kind: str, w: torch.Tensor, rows: int = 1) -> torch.Tensor:
    if kind == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(w, 1)
    return torch.ops.mkl._mkl_reorder_linear_weight(w, rows)


# ------------------------------------------------------------------------------------------------ the fp32 plan
def _machine_key() -> dict:
    from ..machine import cpu_info

    info = cpu_info()
    env = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
                                      "MKL_DEBUG_CPU_TYPE") if k in os.environ}
    return {"cpu": info["model"], "flags": sorted(f for f, on in info["flags"].items() if on),
            "isa": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "env": env}


def plan_file(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the fp32 plan of this machine (CPU, ISA limits, threads, torch) is cached."""
    key = json.dumps(_machine_key(), sort_keys=True)
    root = Path(cache_dir or os.environ.get("SPECEXP_CACHE") or "~/.cache/specexp").expanduser()
    return root / "cpu_linear" / f"fp32-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


@torch.inference_mode()
def measure(weights: list, kinds=KINDS, passes: int = 5, budget_s: float | None = None) -> dict:
    """The fp32 plan of a model whose linear layers hold `weights` (in the order a forward reads them):
    `{"plan": {rows: kind}, "ms": {rows: {kind: ms}}, "passes": {rows: timed rounds}}`. For each bucket of `ROWS`,
    one pass runs every layer's product at that many rows, as a forward does (the weights streamed from memory, one
    after the other); the kinds are timed in turn within each of up to `passes` rounds (after one untimed round), so
    a change of load falls on all. Each bucket stops repeating once it has spent its share of `budget_s` (default
    `MEASURE_S`) and timed one round: on a busy machine the measurement costs its minimum, two rounds per bucket,
    instead of growing with the load (a 536 s measurement on a busy 2-core machine: issue #59). Timed on the whole
    model rather than shape by shape: in isolation the small products of 2-8 rows timed alike with and without
    packing, in a forward the packed ones were 20 % faster (mini target, Xeon)."""
    share = (MEASURE_S if budget_s is None else budget_s) / len(ROWS)
    g = torch.Generator().manual_seed(0)
    dnn = [_pack_one("onednn", w) for w in weights] if "onednn" in kinds else None
    plan, ms, done = {}, {}, {}
    for b in ROWS:
        xs = {k: torch.randn(1, b, k, generator=g) for k in {w.shape[1] for w in weights}}
        calls = {"plain": [(lambda x=xs[w.shape[1]], w=w: F.linear(x, w)) for w in weights]}
        if dnn is not None:
            calls["onednn"] = [(lambda x=xs[w.shape[1]], p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none",
                                                                                               [], ""))
                               for w, p in zip(weights, dnn)]
        if "mkl" in kinds:
            calls["mkl"] = [(lambda x=xs[w.shape[1]][0], p=_pack_one("mkl", w, b), w=w:
                             torch.ops.mkl._mkl_linear(x, p, w, None, b)) for w in weights]
        times = {k: [] for k in calls}
        start = time.perf_counter()
        for i in range(passes + 1):
            for k, fns in calls.items():
                t0 = time.perf_counter()
                for f in fns:
                    f()
                if i:
                    times[k].append(time.perf_counter() - t0)
            if i and time.perf_counter() - start > share:
                break
        del calls
        done[b] = len(times["plain"])
        ms[b] = {k: round(1e3 * sorted(t)[len(t) // 2], 3) for k, t in times.items()}
        best = min(ms[b], key=ms[b].get)
        plan[b] = best if ms[b][best] <= GAIN * ms[b]["plain"] else "plain"
    return {"plan": plan, "ms": ms, "passes": done}


def fp32_plan(weights: list, cache_dir=None) -> dict:
    """`{rows: kind}` for a model whose linear layers hold `weights`: read from this machine's plan file, where
    the same list of weight shapes was measured before, else measured (`measure`) and added to it (written whole to
    a temporary file, then renamed: a concurrent run reads the old plans or the new ones, never half of them; the
    write holds a lock and adds to the file as it is then, so runs measuring different models keep each other's). A
    damaged or foreign file or entry (`_plan_fault`: not JSON, another schema, other shapes, a kind this torch cannot
    run) is set aside with one warning line and measured again: the file is a cache, never trusted as it is. A plan
    measured on a busy machine (`_busy`) is kept and used, and measured again by the first run that finds the
    machine idle."""
    from ..log import get as get_logger

    path = plan_file(cache_dir)
    shapes = [tuple(w.shape) for w in weights]
    key = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    kinds = tuple(k for k in KINDS if k == "plain" or (k == "onednn" and available(torch.float32)
                                                       and hasattr(_mkldnn(), "_linear_pointwise"))
                  or (k == "mkl" and _has_mkl()))
    stored, fault = _read_plans(path)
    if fault is None and key in stored["models"]:
        fault = _plan_fault(stored["models"][key], weights, kinds)
        if fault is not None:
            del stored["models"][key]
    if fault is not None:
        get_logger(__name__).warning("target.prepack: the packing plan %s is damaged or foreign (%s); measuring it "
                                     "again", path, fault)
    load = _load()
    if key in stored["models"] and stored["models"][key].get("busy") and not _busy(load):
        # Timings taken on a busy machine choose at random (a 2-core EPYC's cached plan had kept the plain product at
        # 1 row, measured 137 ms against oneDNN's 140, where idle oneDNN takes 42 ms and plain 56): measured again
        # now that the machine is idle, once.
        get_logger(__name__).info("target.prepack: the packing plan in %s was measured on a busy machine (load "
                                  "%.1f); measuring it again at load %.1f", path, stored["models"][key].get("load"),
                                  load)
        del stored["models"][key]
    if key not in stored["models"]:
        t0 = time.perf_counter()
        stored["models"][key] = {"layers": len(shapes), "bytes": sum(w.numel() * 4 for w in weights),
                                 "load": round(load, 2), "busy": _busy(load), **measure(weights, kinds)}
        get_logger(__name__).info("target.prepack: fp32 products of %d linear layers measured on this CPU in %.1f s "
                                  "(plan by rows %s), cached in %s", len(shapes), time.perf_counter() - t0,
                                  stored["models"][key]["plan"], path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(path):
                # Another run may have added its model's plan since this one read the file: add this entry to what
                # is there now (under the lock, so two runs measuring different models both keep theirs).
                latest, fault = _read_plans(path)
                if fault is None:
                    latest["models"][key] = stored["models"][key]
                    stored = latest
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(stored, indent=1))
                tmp.replace(path)
        except OSError:                               # a read-only cache: measured again next time
            pass
    return {int(b): k for b, k in stored["models"][key]["plan"].items()}


class _locked:
    """An exclusive lock on `<path>.lock` for the duration of a `with` (fcntl; where there is none, no lock)."""

    def __init__(self, path: Path):
        self.path = path.with_suffix(".lock")

    def __enter__(self):
        self.f = open(self.path, "a")
        try:
            import fcntl
            fcntl.flock(self.f, fcntl.LOCK_EX)
        except (ImportError, OSError):
            pass
        return self

    def __exit__(self, *exc):
        self.f.close()                                # closing releases the lock


def _load() -> float:
    """The machine's 1-minute load average (0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _busy(load: float) -> bool:
    """Whether timings taken at this load are a busy machine's: above half a process per core."""
    return load > 0.5 * (os.cpu_count() or 1)


def _read_plans(path: Path) -> tuple[dict, str | None]:
    """The plan file's content, or a fresh one and why the file was set aside (None: absent, nothing to say)."""
    fresh = {"machine": _machine_key(), "models": {}}
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        return fresh, None
    except (OSError, ValueError) as e:                 # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return fresh, f"unreadable: {type(e).__name__}"
    if not (isinstance(stored, dict) and isinstance(stored.get("models"), dict)):
        return fresh, f"a JSON {type(stored).__name__} without a 'models' mapping"
    return stored, None


def _plan_fault(entry, weights: list, kinds: tuple) -> str | None:
    """Why a stored plan cannot serve the model of `weights` on this torch (the products it names must be ones this
    build runs, one per row bucket), or None."""
    if not isinstance(entry, dict):
        return f"its entry is a {type(entry).__name__}"
    if entry.get("layers") != len(weights) or entry.get("bytes") != sum(w.numel() * 4 for w in weights):
        return f"its entry is for {entry.get('layers')!r} layers of {entry.get('bytes')!r} bytes, not {len(weights)}"
    plan = entry.get("plan")
    if not isinstance(plan, dict) or sorted(plan) != sorted(str(b) for b in ROWS):
        return f"its plan is not one product per row bucket {', '.join(map(str, ROWS))}"
    bad = sorted({str(k) for k in plan.values() if k not in kinds})
    if bad:
        return f"product {bad[0]!r} is not one this torch runs ({', '.join(kinds)})"
    return None


# ------------------------------------------------------------------------------------------------ packing
def _linears(model: torch.nn.Module, dtype: torch.dtype) -> list:
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == dtype
            and m.weight.device.type == "cpu" and "packed_kind" not in vars(m)]


def _free_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 1 << 62


def pack(model: torch.nn.Module, plan: dict | None = None, cache_dir=None, whole_model: bool = True) -> int:
    """Pack the bf16 and fp32 CPU `nn.Linear` layers of `model` in place (module docstring); returns how many
    layers took a packed product. Idempotent. fp32: `plan` ({rows: kind}; tests force one) else this machine's
    measured plan for the model (`fp32_plan`); `whole_model=False` (a drafter's parts, beside a target already
    judged) skips the size floor."""
    n = 0
    with torch.no_grad():
        for m in _linears(model, torch.bfloat16):
            vars(m)["packed_weight"] = _pack_one("onednn", m.weight.detach())
            _attach(m, "bf16", _forward_bf16)
            n += 1
        lin = _linears(model, torch.float32)
        size = sum(m.weight.numel() * 4 for m in lin)
        if not lin or (plan is None and ((whole_model and size < MIN_FP32_BYTES)
                                         or len(ROWS) * size > _free_bytes() // 2)):
            return n
        plan = fp32_plan([m.weight.detach() for m in lin], cache_dir) if plan is None else plan
        chosen = {b: plan.get(b, "plain") for b in ROWS}
        for m in lin:
            if set(chosen.values()) == {"plain"}:
                continue
            w = m.weight.detach()
            if "onednn" in chosen.values():
                vars(m)["packed_weight"] = _pack_one("onednn", w)
            vars(m)["mkl_packs"] = {b: _pack_one("mkl", w, b) for b, k in chosen.items() if k == "mkl"}
            vars(m)["plan"] = {b: chosen[b] for b in ROWS}
            _attach(m, "fp32", _forward_fp32)
            n += 1
    return n


def _attach(m: torch.nn.Linear, kind: str, forward) -> None:
    # a weight made in inference mode keeps no write count (and cannot be written outside it)
    vars(m)["packed_version"] = None if m.weight.is_inference() else m.weight._version
    vars(m)["packed_kind"] = kind
    m.forward = types.MethodType(forward, m)


class Joined:
    """Linear layers that read the same input (q/k/v, gate/up), packed as one product whose output columns are
    theirs side by side: `Joined(parts)(x) == torch.cat([p(x) for p in parts], -1)`. One product instead of
    several saves the per-call cost of a small GEMM (a 1-row step of the mini target: 7 products a layer become 4).

    Each output column is its own dot product over the same input, computed by the same kernel the parts use (bf16:
    oneDNN's packed product; fp32: the plan's kind at each row bucket, packed for the joined shape), so the columns
    are the parts' bit for bit where the kernel's sum order does not depend on the number of columns
    (tests/test_cpu_linear.py checks logits and greedy tokens on both dtypes). Built only from parts that `pack`
    packed alike and without bias (`join` says None otherwise); whatever a part would not serve from its packed
    copy (grad mode, another dtype, a strided input, a weight written since it was packed, an fp32 bucket whose
    kind is plain) runs the parts' own forwards and concatenates them. Costs one more packed copy of the parts'
    weights in bf16, and in fp32 the joined weight and its packs (the parts keep theirs: the HF-eager engine and
    the drafters call them)."""

    def __init__(self, parts: list, bf16: torch.Tensor | None = None, fp32: torch.nn.Linear | None = None):
        self.parts, self.bf16, self.fp32 = parts, bf16, fp32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or not x.is_contiguous() or any(_stale(p) for p in self.parts):
            return torch.cat([p(x) for p in self.parts], -1)
        if self.bf16 is not None and x.dtype is torch.bfloat16:
            return torch.ops.mkldnn._linear_pointwise(x, self.bf16, None, "none", [], "")
        m = x.numel() // x.shape[-1] if x.dim() else 0
        if (self.fp32 is None or x.dtype is not torch.float32 or m == 0 or m > ROWS[-1]
                or self.fp32.plan[_BUCKET[m]] == "plain"):
            return torch.cat([p(x) for p in self.parts], -1)
        return _forward_fp32(self.fp32, x)


def join(parts: list) -> Joined | None:
    """`parts` as one packed product (`Joined`), or None where they are not packed alike (unpacked, a bias, other
    kinds or plans, another input width or dtype) or the joined copy would not fit in half the free memory."""
    kinds = {vars(p).get("packed_kind") for p in parts}
    if (len(parts) < 2 or kinds not in ({"bf16"}, {"fp32"}) or any(p.bias is not None for p in parts)
            or len({(p.in_features, p.weight.dtype) for p in parts}) != 1
            or len({json.dumps(vars(p).get("plan"), sort_keys=True) for p in parts}) != 1):
        return None
    bf16 = kinds == {"bf16"}
    size = sum(p.weight.numel() for p in parts) * parts[0].weight.element_size()
    if size * (1 if bf16 else 1 + len(ROWS)) > _free_bytes() // 2:
        return None
    with torch.no_grad():
        w = torch.cat([p.weight.detach() for p in parts])                                   # [sum(N), K]
        if bf16:                                   # only the packed copy: the parts serve every other case
            return Joined(parts, bf16=_pack_one("onednn", w))
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)      # fp32: the plan's products need the weight
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        plan = parts[0].plan
        if "onednn" in plan.values():
            vars(lin)["packed_weight"] = _pack_one("onednn", w)
        vars(lin)["mkl_packs"] = {b: _pack_one("mkl", w, b) for b, k in plan.items() if k == "mkl"}
        vars(lin)["plan"] = dict(plan)
        vars(lin)["packed_version"] = None
    return Joined(parts, fp32=lin)


def is_packed(model: torch.nn.Module) -> bool:
    """Whether `pack` packed any layer of `model`."""
    return any("packed_kind" in vars(m) for m in model.modules())


def describe(model: torch.nn.Module) -> dict:
    """What `pack` did to `model`, for run_info.json: layers packed per dtype, and the fp32 plan by rows."""
    out: dict = {}
    for m in model.modules():
        kind = vars(m).get("packed_kind")
        if kind is not None:
            out[kind] = out.get(kind, 0) + 1
            if kind == "fp32":
                out["fp32_plan"] = m.plan
    return out
