"""The layers the drafters share (DFlash and its family, EAGLE-3): Qwen3/Llama RMSNorm, the gated SiLU MLP, the
RoPE rotation, and the seeded random init of smoke runs and tests. Nothing here knows a checkpoint format."""
from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

M = TypeVar("M", bound=nn.Module)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        h = x.float()                                    # Qwen3: normalise in fp32, scale in the input dtype
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x, cos, sin):                                  # HF rotate_half convention
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class MLP(nn.Module):
    """The gated SiLU MLP of Qwen3 and Llama; `c` has `hidden_size` and `intermediate_size`."""

    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def init_weights(model: M, seed: int, std: float = 0.02) -> M:
    """Random init (tests and smoke runs): N(0, std) linears, unit norms; seeded, leaves global RNG alone."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * std)
                if m.bias is not None:
                    m.bias.zero_()
    return model
