"""Anchored blocks, the DFlash training layout (shared by every drafter trained on the DFlash backbone).

Per sequence, up to `num_anchors` distinct random anchors a among positions whose token and next token are
response tokens. Each anchor opens a block `[ids[a], MASK x (B-1)]` at positions a .. a+B-1; block position
k >= 1 is trained to predict ids[a+k] (the z-lab "unshifted" alignment; position 0 has no loss) with weight
exp(-(k-1)/gamma), masked past the end of the sequence and on non-response tokens. All blocks of a sequence
are trained in one pass: a query of block b sees the context keys strictly before a_b (the anchor's own
hidden state is not visible, as at inference where the anchor has not been verified yet) and every key of
its own block (bidirectional), nothing of other blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}   # the paper's loss-decay constants


def default_gamma(block_size: int) -> float:
    return GAMMA_BY_BLOCK.get(block_size, 7.0 * block_size / 16)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Sorted anchor positions `[n]`, n = min(num_anchors, #candidates), drawn without replacement."""
    cand = (loss_mask[:-1] & loss_mask[1:]).nonzero()[:, 0]                       # [C]
    pick = torch.randperm(cand.numel(), generator=generator)[:num_anchors]
    return cand[pick].sort().values


@dataclass
class Blocks:
    noise_ids: torch.Tensor    # [n*B] block inputs: anchor token, then MASK
    positions: torch.Tensor    # [n*B] absolute positions a+k
    labels: torch.Tensor       # [n*B] ids[a+k] (clamped at the end; weight 0 there)
    weights: torch.Tensor      # [n*B] exp(-(k-1)/gamma) on valid supervised positions, else 0
    anchors: torch.Tensor      # [n]
    block_size: int


def build_blocks(ids, loss_mask, anchors, block_size: int, mask_token_id: int, gamma: float) -> Blocks:
    s, n, dev = ids.numel(), anchors.numel(), ids.device
    k = torch.arange(block_size, device=dev)                                     # [B]
    pos = anchors[:, None] + k                                                   # [n, B]
    inside = pos < s
    at = pos.clamp(max=s - 1)
    noise = torch.full((n, block_size), mask_token_id, dtype=ids.dtype, device=dev)
    noise[:, 0] = ids[anchors]
    decay = torch.exp(-(k - 1).clamp(min=0).float() / gamma)                     # [B]
    w = decay * inside * loss_mask[at] * (k >= 1)                                # [n, B]
    return Blocks(noise.flatten(), pos.flatten(), ids[at].flatten(), w.flatten(), anchors, block_size)


def dense_mask(anchors: torch.Tensor, seq_len: int, block_size: int, causal: bool = False) -> torch.Tensor:
    """Bool `[1, 1, Q, S+Q]` (True = attend) over keys [context S | blocks Q], Q = n*B. `causal` keeps only
    the block's keys at or before the query (DEdit's causal-editor ablation)."""
    q = anchors.numel() * block_size
    qi = torch.arange(q, device=anchors.device)
    qb = qi // block_size                                                        # [Q] block of each query
    ctx = torch.arange(seq_len, device=anchors.device)[None] < anchors[qb][:, None]    # [Q, S] strictly before
    own = qb[:, None] == qb[None]                                                # [Q, Q] same block
    if causal:
        own &= qi[None] <= qi[:, None]
    return torch.cat([ctx, own], dim=1)[None, None]


def flex_mask(anchors: torch.Tensor, seq_len: int, block_size: int, causal: bool = False):
    """The same pattern as a sparse flex-attention BlockMask (GPU training at 512 anchors x 3072 tokens)."""
    from torch.nn.attention.flex_attention import create_block_mask

    q = anchors.numel() * block_size

    def mask_mod(b, h, qi, ki):
        qb = qi // block_size
        own = (ki - seq_len) // block_size == qb
        if causal:
            own = own & (ki - seq_len <= qi)
        return torch.where(ki < seq_len, ki < anchors[qb], own)

    return create_block_mask(mask_mod, None, None, q, seq_len + q, device=anchors.device)


def leading_correct(correct: torch.Tensor, valid: torch.Tensor, block_size: int) -> torch.Tensor:
    """Simulated acceptance length per block: 1 + leading run of correct drafts (positions 1..B-1)."""
    c = (correct & valid).view(-1, block_size)[:, 1:]
    return 1 + c.to(torch.int32).cumprod(1).sum(1)
