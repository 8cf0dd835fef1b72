"""Adaptive DeLS-Spec fusion weights (DeLS-Spec §7's suggestion, issue #62): alpha and beta of a drafted position
computed from how sure the experts are at that position, instead of one fixed number per position.

    fused_i = long_i + alpha(f_i) * short_i - beta(f_i) * log_prior

Two forms (`fusion.adaptive`, the parameters in `fusion.schedule`):

- `entropy`: a fixed schedule of the entropy H (nats) of softmax(long_i), the DFlash row alone,
      s = sigmoid((H - h0) / width),  alpha = a0 + a1 * s,  beta = b0 + b1 * s
  (six numbers; a1 > 0 lets the local head speak louder where DFlash is unsure).
- `gate`: a tiny gate over both experts' confidence: f = [H_long, maxp_long, H_short, maxp_short] (entropy in nats
  and largest probability of softmax(long_i) and of softmax(short_i), short_i = W z_i the local head's logits),
      alpha = alpha_max * sigmoid(c_alpha + w_alpha . f),  beta = beta_max * sigmoid(c_beta + w_beta . f)
  (12 numbers). The gate needs the local head's row materialised (`needs_short`); the entropy schedule does not.

A schedule maps rows to weights with device-side torch ops only (no host synchronisation), so the CUDA-graph loop
and the Triton kernel (which then reads alpha and beta from device memory) serve it as they serve fixed weights;
`long [V] | [a, V]` gives weights `[] | [a]` in fp32. Draft 1 is DFlash's alone, as with fixed weights.
"""
from __future__ import annotations

import math

import torch

from ..errors import check

KINDS = ("entropy", "gate")
ENTROPY_KEYS = ("a0", "a1", "b0", "b1", "h0", "width")
GATE_KEYS = ("w_alpha", "c_alpha", "alpha_max", "w_beta", "c_beta", "beta_max")
GATE_FEATURES = ("H_long", "maxp_long", "H_short", "maxp_short")


def entropy_maxp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (nats) and largest probability of softmax(logits) over the last axis, fp32; -inf entries allowed."""
    logp = torch.log_softmax(logits.float(), -1)
    p = logp.exp()
    return torch.special.entr(p).sum(-1), p.amax(-1)


def _num(where: str, v) -> float:
    check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          f"{where}={v!r} is not a finite number")
    return float(v)


class Schedule:
    """`(long, short) -> (alpha, beta)` per row; `short` is read only when `needs_short`."""
    kind: str
    needs_short = False

    def __call__(self, long: torch.Tensor, short: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class EntropySchedule(Schedule):
    kind = "entropy"

    def __init__(self, a0: float, a1: float, b0: float, b1: float, h0: float, width: float):
        check(width > 0, f"fusion.schedule.width={width} must be > 0 (the sigmoid's width in nats)")
        self.a0, self.a1, self.b0, self.b1, self.h0, self.width = a0, a1, b0, b1, h0, width

    def __call__(self, long, short=None):
        h, _ = entropy_maxp(long)
        s = torch.sigmoid((h - self.h0) / self.width)
        return self.a0 + self.a1 * s, self.b0 + self.b1 * s

    def describe(self) -> str:
        return (f"entropy: alpha = {self.a0:g} + {self.a1:g} s, beta = {self.b0:g} + {self.b1:g} s, "
                f"s = sigmoid((H - {self.h0:g}) / {self.width:g})")


class GateSchedule(Schedule):
    kind = "gate"
    needs_short = True

    def __init__(self, w_alpha, c_alpha: float, alpha_max: float, w_beta, c_beta: float, beta_max: float):
        self.w_alpha = torch.tensor(w_alpha, dtype=torch.float32)
        self.w_beta = torch.tensor(w_beta, dtype=torch.float32)
        self.c_alpha, self.c_beta, self.alpha_max, self.beta_max = c_alpha, c_beta, alpha_max, beta_max
        self._dev: dict = {}

    def features(self, long: torch.Tensor, short: torch.Tensor) -> torch.Tensor:
        """`[..., 4]` in the order of GATE_FEATURES."""
        hl, pl = entropy_maxp(long)
        hs, ps = entropy_maxp(short)
        return torch.stack([hl, pl, hs, ps], -1)

    def __call__(self, long, short=None):
        check(short is not None, "the fusion gate needs the local head's logits")
        f = self.features(long, short)
        dev = f.device
        if dev not in self._dev:
            self._dev[dev] = (self.w_alpha.to(dev), self.w_beta.to(dev))
        wa, wb = self._dev[dev]
        alpha = self.alpha_max * torch.sigmoid(self.c_alpha + (f * wa).sum(-1))
        beta = self.beta_max * torch.sigmoid(self.c_beta + (f * wb).sum(-1))
        return alpha, beta

    def describe(self) -> str:
        fmt = lambda w: "[" + ", ".join(f"{x:.3g}" for x in w.tolist()) + "]"   # noqa: E731
        return (f"gate over {list(GATE_FEATURES)}: alpha = {self.alpha_max:g} sigmoid({self.c_alpha:.3g} + "
                f"{fmt(self.w_alpha)} . f), beta = {self.beta_max:g} sigmoid({self.c_beta:.3g} + "
                f"{fmt(self.w_beta)} . f)")


def build_schedule(kind: str | None, params: dict | None) -> Schedule | None:
    """The schedule of `fusion.adaptive` with `fusion.schedule`'s parameters (None: fixed weights). Every missing,
    unknown or non-finite parameter is one line."""
    if kind is None:
        return None
    check(kind in KINDS, f"fusion.adaptive={kind!r}; valid: null, {', '.join(KINDS)}")
    params = dict(params or {})
    keys = ENTROPY_KEYS if kind == "entropy" else GATE_KEYS
    missing, unknown = [k for k in keys if k not in params], sorted(set(params) - set(keys))
    check(not missing and not unknown, f"fusion=... adaptive={kind}: fusion.schedule needs exactly {list(keys)} "
                                       f"(missing {missing}, unknown {unknown})")
    if kind == "entropy":
        return EntropySchedule(*(_num(f"fusion.schedule.{k}", params[k]) for k in keys))
    vals = {}
    for k in keys:
        if k.startswith("w_"):
            v = params[k]
            check(isinstance(v, (list, tuple)) and len(v) == len(GATE_FEATURES),
                  f"fusion.schedule.{k}={v!r}: expected a list of {len(GATE_FEATURES)} numbers {list(GATE_FEATURES)}")
            vals[k] = [_num(f"fusion.schedule.{k}", x) for x in v]
        else:
            vals[k] = _num(f"fusion.schedule.{k}", params[k])
    return GateSchedule(**vals)
