"""`target.prepack`: the linear layers of a bf16 model on a CPU with their weights packed once for oneDNN.

In bf16 on a CPU, `F.linear` goes to oneDNN, which reorders the weight into its blocked layout on every call: for the
mini target's 49,152 x 576 lm_head that reorder costs more than the product (1 row: 3.9 ms a call, 1.1 ms with the
weight packed once; 8 rows: 5.4 against 1.9; an AR step of the whole model 36.9 against 26.3 ms, a verify of 8 rows
44.0 against 29.3; 2-core AVX512-BF16 EPYC, experiments/results/engine/). Packing once is what inductor's
"freezing" does for a compiled CPU model; here it is done on the eager model, so both engines and every drafter
that calls the target's modules (DFlash's draft projection is the target's lm_head) get it without a compilation.

The packed product is the same oneDNN kernel without the per-call reorder, so its outputs are the unpacked call's bit
for bit (tests/test_cpu_linear.py checks logits and greedy tokens against the unpacked model). It applies only where
that has been checked: a bf16 weight, a contiguous bf16 input on the CPU, and no gradient to carry (the packed op
has no backward). Anything else, e.g. a DFlash training loss through the target's lm_head, runs the module's own
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
    # A strided input takes another path inside F.linear itself (other rounding), so only a contiguous one is packed;
    # a gradient (to the input or the weight) needs F.linear's backward; a weight written since it was packed
    # (an optimizer step, load_state_dict) would make the packed copy stale.
    w = self.weight
    if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or not x.is_contiguous()
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            or w._version != self.packed_version):
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
                vars(m)["packed_version"] = m.weight._version
                m.forward = types.MethodType(_forward, m)
                n += 1
    return n


def is_packed(model: torch.nn.Module) -> bool:
    """Whether `pack` packed any layer of `model`."""
    return any("packed_weight" in vars(m) for m in model.modules())

