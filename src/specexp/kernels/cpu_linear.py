"""`target.prepack`: the linear layers of a bf16 model on a CPU with their weights packed once for oneDNN.

In bf16 on a CPU, `F.linear` goes to oneDNN, which reorders the weight into its blocked layout on every call: for the
mini target's 49,152 x 576 lm_head that reorder costs more than the product (1 row: 3.9 ms a call, 1.1 ms with the
weight packed once; 8 rows: 5.4 against 1.9; 2-core AVX512-BF16 EPYC, 2 threads, one-off timings). In
experiments/bench_engine.py an AR step of the static engine took 38.3 ms unpacked and 29.2 ms packed, a verify of 4
rows 41.0 and 27.6 (experiments/results/engine/2026-12-05-epyc-avx512bf16-cap3/ and -prepack/). Packing once is
what inductor's "freezing" does for a compiled CPU model; here it is done on the eager model, so both engines and
every drafter that calls the target's modules (DFlash's draft projection is the target's lm_head) get it without a
compilation.

The packed product is the same oneDNN kernel without the per-call reorder, so its outputs are the unpacked call's bit
for bit (tests/test_cpu_linear.py checks logits and greedy tokens against the unpacked model). It applies only where
that has been checked: a bf16 weight, a contiguous bf16 input on the CPU, outside grad mode (the packed op has no
backward). Anything else, e.g. a DFlash training loss through the target's lm_head, runs the module's own
`F.linear`. Each packed layer keeps its parameter (state_dict, `.weight` readers and tied embeddings are
unchanged) and holds the packed copy beside it: the weights' memory twice. A packed model cannot be deep-copied,
pickled or `torch.save`d whole (oneDNN's opaque tensor has no storage); its state_dict can.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch build can pack bf16 linear weights for oneDNN on this CPU."""
    mk = getattr(torch.ops, "mkldnn", None)
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(mk, "_reorder_linear_weight")
                and hasattr(mk, "_linear_pointwise") and bool(mk._is_mkldnn_bf16_supported()))
    except (AttributeError, RuntimeError):
        return False


def wanted(setting, device: torch.device, dtype: torch.dtype, compiled: bool = False) -> bool:
    """`target.prepack` on this device and dtype: `auto` = a bf16 model on a CPU whose torch can pack (`available`),
    unless `target.compile` (inductor packs a compiled step's weights itself); true = the same, or one clear line
    where it cannot; false = never."""
    from ..errors import check

    fits = torch.device(device).type == "cpu" and dtype == torch.bfloat16
    if setting == "auto":
        return fits and not compiled and available()
    if setting:
        check(fits, f"target.prepack=true needs a bf16 target on a CPU (this one: {dtype} on {device}); use auto "
                    "or false")
        check(not compiled, "target.prepack=true with target.compile=true: the compiled step packs its own weights; "
                            "use target.prepack=auto or false")
        check(available(), "target.prepack=true: this torch build cannot pack bf16 weights for oneDNN on this CPU "
                           "(torch.ops.mkldnn); use auto or false")
    return bool(setting)


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    # F.linear instead: in grad mode (the packed op has no backward; the engines run in inference mode), for another
    # dtype, for a strided input (F.linear itself takes another path for it, with other rounding) and for a weight
    # written since it was packed (an optimizer step, load_state_dict: the packed copy would be stale). Checked in
    # this order on every call, so the common case costs a few attribute reads.
    w, v = self.weight, self.packed_version
    if (torch.is_grad_enabled() or x.dtype is not torch.bfloat16 or not x.is_contiguous()
            or (v is not None and w._version != v)):
        return F.linear(x, w, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack(model: torch.nn.Module) -> int:
    """Pack every bf16 CPU `nn.Linear` of `model` in place (module docstring); returns how many. Idempotent."""
    n = 0
    with torch.no_grad():
        for m in model.modules():
            if (type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cpu"
                    and "packed_weight" not in vars(m)):
                vars(m)["packed_weight"] = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 1)
                # a weight made in inference mode keeps no write count (and cannot be written outside it)
                vars(m)["packed_version"] = None if m.weight.is_inference() else m.weight._version
                m.forward = types.MethodType(_forward, m)
                n += 1
    return n


def is_packed(model: torch.nn.Module) -> bool:
    """Whether `pack` packed any layer of `model`."""
    return any("packed_weight" in vars(m) for m in model.modules())

