"""Verification rules: which drafted tokens the target accepts, and the bonus token after them.

Every rule takes the target's logits at the verified block `[anchor, d1..dK]` (row j predicts the token
after block position j, so row j is compared with draft d_{j+1}) and returns `(n_accepted, bonus)`:
`drafts[:n_accepted]` are committed, then `bonus`. With K = 0 drafts every rule is one plain decoding step
of the target, which is how the autoregressive baseline runs through the same engine.

All rules are lossless: every committed token is distributed exactly as the target's own next token.
- greedy (T = 0): accept while the draft equals the target argmax.
- protocol A, "sample-and-match" (DFlash / DeLS-Spec / Domino runtimes): drafts are the drafter's argmax;
  the target samples y_j at every position and drafts are accepted while d_{j+1} == y_j. This is
  Leviathan sampling with a one-hot draft distribution: per-token acceptance = p(d).
- protocol B, standard speculative sampling (DSpark / DeepSpec): drafts are sampled from q; accept d with
  probability min(1, p(d)/q(d)); at the first rejection resample from norm(max(0, p - q)); if all K are
  accepted the bonus is drawn from p at the last row. Per-token acceptance = 1 - TV(p, q).
"""
from __future__ import annotations

import torch

PROTOCOLS = ("greedy", "A", "B")


def _leading(ok: torch.Tensor) -> int:
    """Length of the all-True prefix of a bool vector."""
    return int(ok.to(torch.int32).cumprod(0).sum()) if ok.numel() else 0


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def greedy(logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    y = logits.argmax(-1)                                   # [K+1]
    n = _leading(drafts == y[:-1])
    return n, int(y[n])


def protocol_a(logits, drafts, temperature: float, generator: torch.Generator) -> tuple[int, int]:
    p = _probs(logits, temperature)                         # [K+1, V]
    y = torch.multinomial(p, 1, generator=generator)[:, 0]  # [K+1] one target sample per position
    n = _leading(drafts == y[:-1])
    return n, int(y[n])


def protocol_b(logits, drafts, q, temperature: float, generator: torch.Generator) -> tuple[int, int]:
    """`q`: `[K, V]`, or a LazyDist (drafted tokens' probabilities + rows on demand)."""
    p = _probs(logits, temperature)                         # [K+1, V]
    k = drafts.numel()
    if k:
        rows = torch.arange(k, device=p.device)
        q_tok = q[rows, drafts] if isinstance(q, torch.Tensor) else q.token_probs
        ratio = p[rows, drafts] / q_tok.float().clamp_min(1e-8)                 # [K]
        u = torch.rand(k, generator=generator, device=p.device)
        n = _leading(u < ratio)
    else:
        n = 0
    if n < k:
        q_n = q[n] if isinstance(q, torch.Tensor) else q.row(n)
        residual = (p[n] - q_n.float()).clamp_min(0)        # [V]
        dist = residual if residual.sum() > 1e-8 else p[n]
    else:
        dist = p[k]
    return n, int(torch.multinomial(dist, 1, generator=generator))


def verify(protocol: str, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None,
           temperature: float, generator: torch.Generator | None) -> tuple[int, int]:
    """Dispatch on `decoding.protocol`. `logits [K+1, V]`, `drafts [K]`, `q [K, V]` or LazyDist (protocol B only)."""
    if protocol == "greedy":
        return greedy(logits, drafts)
    if protocol == "A":
        return protocol_a(logits, drafts, temperature, generator)
    if protocol == "B":
        return protocol_b(logits, drafts, q, temperature, generator)
    raise ValueError(f"unknown protocol {protocol!r}")
