"""Verification rules: which drafted tokens the target accepts, and the bonus token after them.

Every rule takes the target's logits at the verified block `[anchor, d1..dK]` (row j predicts the token
after block position j, so row j is compared with draft d_{j+1}) and returns a `Verdict`: the first n drafts
are committed, then the bonus token. With K = 0 drafts every rule is one plain decoding step
of the target, which is how the autoregressive baseline runs through the same engine.

All rules are lossless: every committed token is distributed exactly as the target's own next token.
- greedy (T = 0): accept while the draft equals the target argmax.
- protocol A, "sample-and-match" (DFlash / DeLS-Spec / Domino runtimes): drafts are the drafter's argmax;
  the target samples y_j at every position and drafts are accepted while d_{j+1} == y_j. This is
  Leviathan sampling with a one-hot draft distribution: per-token acceptance = p(d).
- protocol B, standard speculative sampling (DSpark / DeepSpec): drafts are sampled from q; accept d with
  probability min(1, p(d)/q(d)); at the first rejection resample from norm(max(0, p - q)); if all K are
  accepted the bonus is drawn from p at the last row. Per-token acceptance = 1 - TV(p, q).
- block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding"; vLLM's
  `rejection_sample_method="block"`): the drafts are sampled from q as in protocol B, but judged as one block. A
  weight w_i = min(1, w_{i-1} p(d_i)/q(d_i)) (w_0 = 1) follows the drafted prefix; the prefix of length i is a
  candidate end with probability h_i = r_i / (r_i + 1 - w_i), r_i = sum_x max(0, w_i p_i(x) - q_i(x)) (h_K = w_K),
  the longest candidate wins (n = max{i : u_i <= h_i}, 0 if none), and the bonus is drawn from
  norm(max(0, w_n p_n - q_n)) (from p_K when n = K). The output is distributed as the target's, and the expected
  accepted length, over the drafts, is at least protocol B's (tests/decoding/test_verify.py checks both exactly on
  a toy target). A draft protocol B rejects can be kept here when a later draft makes up for it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PROTOCOLS = ("greedy", "A", "B", "block")
SAMPLED_DRAFTS = ("B", "block")       # protocols whose drafts are sampled from q (the others draft the argmax)


@dataclass
class Verdict:
    """What one verification commits: `tokens` = the accepted drafts, then the bonus token (host ints), and
    `anchor` `[1]` = the bonus on the target's device, the next block's first token (kept there, so the engine
    never copies a token back to the device)."""

    tokens: list[int]
    anchor: torch.Tensor

    @property
    def n(self) -> int:
        """Drafts accepted."""
        return len(self.tokens) - 1

    @property
    def bonus(self) -> int:
        return self.tokens[-1]


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def match(drafts: torch.Tensor, y: torch.Tensor) -> Verdict:
    """Accept drafts while they equal the target's choices `y [K+1]` (one per block row); the bonus is y[n]. The
    round's one device-to-host copy: the accepted count and the choices travel together."""
    n = (drafts == y[:-1]).long().cumprod(0).sum(0, keepdim=True)                   # [1] leading matches
    host = torch.cat([n, y]).tolist()                                               # [1 + K+1] one sync
    n = host[0]
    return Verdict(host[1: n + 2], y[n: n + 1])                  # y[:n] equals the accepted drafts


def greedy(logits: torch.Tensor, drafts: torch.Tensor) -> Verdict:
    return match(drafts, logits.argmax(-1))                                         # [K+1]


def protocol_a(logits, drafts, temperature: float, generator: torch.Generator) -> Verdict:
    p = _probs(logits, temperature)                                                 # [K+1, V]
    return match(drafts, torch.multinomial(p, 1, generator=generator)[:, 0])         # one sample per position


def protocol_b(logits, drafts, q, temperature: float, generator: torch.Generator) -> Verdict:
    """`q`: `[K, V]`, or a LazyDist (drafted tokens' probabilities + rows on demand). Its branches read the accepted
    count on the host: a few syncs a round (greedy and protocol A have one)."""
    p = _probs(logits, temperature)                                                 # [K+1, V]
    k = drafts.numel()
    n = 0
    if k:
        rows = torch.arange(k, device=p.device)
        q_tok = q[rows, drafts] if isinstance(q, torch.Tensor) else q.token_probs
        ratio = p[rows, drafts] / q_tok.float().clamp_min(1e-8)                     # [K]
        u = torch.rand(k, generator=generator, device=p.device)
        n = int((u < ratio).long().cumprod(0).sum())
    if n < k:
        q_n = q[n] if isinstance(q, torch.Tensor) else q.row(n)
        residual = (p[n] - q_n.float()).clamp_min(0)                                # [V]
        dist = residual if residual.sum() > 1e-8 else p[n]
    else:
        dist = p[k]
    bonus = torch.multinomial(dist, 1, generator=generator)                         # [1]
    return Verdict(drafts[:n].tolist() + [int(bonus)], bonus)


def _rows(q, k: int) -> torch.Tensor:
    """Every draft distribution `[K, V]` (a LazyDist builds its rows: block verification reads them all)."""
    return q if isinstance(q, torch.Tensor) else torch.stack([q.row(i) for i in range(k)])


def block_weights(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's `h [K]` (the probability that the prefix of i+1 drafts is a candidate end) and the
    prefix weights `w [K+1]` (w_0 = 1), from the target's `p [K+1, V]` and the drafter's `q [K, V]`."""
    k = drafts.numel()
    rows = torch.arange(k, device=p.device)
    ratio = p[rows, drafts] / q[rows, drafts].clamp_min(1e-12)                        # [K]
    w = [torch.ones((), dtype=p.dtype, device=p.device)]
    for i in range(k):                                  # min(1, .) at every step: not a plain cumulative product
        w.append((w[-1] * ratio[i]).clamp(max=1.0))
    w = torch.stack(w)                                                                  # [K+1]
    r = (w[1:k, None] * p[1:k] - q[1:k]).clamp_min(0).sum(-1)                          # [K-1]
    den = r + 1 - w[1:k]
    h = torch.where(den > 0, r / den.clamp_min(1e-30), torch.zeros_like(r))             # 0/0: never end there
    return torch.cat([h, w[k:]]), w                                                     # [K], [K+1]


def block(logits, drafts, q, temperature: float, generator: torch.Generator) -> Verdict:
    """Block verification (module docstring). `q`: `[K, V]` or a LazyDist; a few syncs a round, as protocol B."""
    p = _probs(logits, temperature)                                                 # [K+1, V]
    k = drafts.numel()
    n = 0
    if k:
        q = _rows(q, k).float()                                                     # [K, V]
        h, w = block_weights(p, q, drafts)                                          # [K], [K+1]
        u = torch.rand(k, generator=generator, device=p.device)
        ends = (u <= h).nonzero()                                                   # candidate ends, 0-based
        n = int(ends[-1]) + 1 if ends.numel() else 0                                # the longest one
    if n < k:
        residual = (w[n] * p[n] - q[n]).clamp_min(0)                                # [V]
        dist = residual if residual.sum() > 1e-8 else p[n]
    else:
        dist = p[k]
    bonus = torch.multinomial(dist, 1, generator=generator)                         # [1]
    return Verdict(drafts[:n].tolist() + [int(bonus)], bonus)


def verify(protocol: str, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None,
           temperature: float, generator: torch.Generator | None) -> Verdict:
    """Dispatch on `decoding.protocol`. `logits [K+1, V]`, `drafts [K]`, `q [K, V]` or LazyDist (B and block only)."""
    if protocol == "greedy":
        return greedy(logits, drafts)
    if protocol == "A":
        return protocol_a(logits, drafts, temperature, generator)
    if protocol == "B":
        return protocol_b(logits, drafts, q, temperature, generator)
    if protocol == "block":
        return block(logits, drafts, q, temperature, generator)
    raise ValueError(f"unknown protocol {protocol!r}")
