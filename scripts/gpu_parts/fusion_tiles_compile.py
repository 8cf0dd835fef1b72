"""Registers, stack and spills per thread of every tile as the runtime launches it: the
launch's own arguments (recorded from a TritonFusion call) and so its specialization
(tt.divisibility=16 on the pointers and V; seed_add 0 / 1 / other per draft position); on a
GPU the kernel `warmup` returns for them (the launch's cache entry: driver n_regs / n_spills
and cuobjdump), in a dry run the same binder compiling for sm_90. Rule = the launch's: the
tiles the autotuner can pick (AUTOTUNE) must not spill

Why: a tile whose registers spill to local memory runs slower: the autotuner picks among AUTOTUNE only, so each of
those tiles must be spill-free as it is launched (the launch's specialization changes the code), which only the
compiled binary shows.

Time limit 15 -> 13 -> 12 s (PARTS in scripts/gpu_check.py; seconds on one H200): H200 11 s. CPU dry run 31 s
"""
import subprocess
import tempfile
import time
from pathlib import Path

from gpu_parts.common import fusion_inputs, step


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


def run(ctx) -> dict:
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
    long, z, w, lp = fusion_inputs(V, r, 0, dev)
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
