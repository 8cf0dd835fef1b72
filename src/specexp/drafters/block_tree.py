"""Draft trees over one block of independently predicted positions (DFlash, `drafter.mode=tree`).

A DFlash block pass predicts every draft position i = 1..K from the anchor and the context alone, so the
probability the drafter gives a path t_1..t_d is the product of its positions' probabilities, q_1(t_1) ... q_d(t_d).
The tree keeps the `total_tokens - 1` paths of highest joint probability whose tokens are each among their
position's `top_k`; as every extra token multiplies by a probability <= 1, a path never scores above its prefix,
so these paths form a tree (prefix-closed) and a best-first search finds them: pop the best open path, add it, and
open its `top_k` one-token extensions. One block pass, no extra drafter forward: the whole tree costs what the chain
costs, plus the target's verification of more rows. Verification (decoding/tree.py) is lossless under greedy and
protocol A whatever the tree.
"""
from __future__ import annotations

import heapq

import torch

from ..schema import Settings, frozen, is_int, setting, upto
from .base import Proposal

MAX_TOP_K = 64
MAX_TOKENS = 1024


@frozen
class BlockTreeSettings(Settings):
    """`drafter.tree` of a DFlash drafter in `mode: tree`."""
    top_k: int = setting(4, is_int(1, MAX_TOP_K), f"an int >= 1 (tokens considered per position); "
                                                  f"{upto(MAX_TOP_K)}")
    total_tokens: int = setting(32, is_int(2, MAX_TOKENS), f"an int >= 2 (the anchor + at least one draft); "
                                                           f"{upto(MAX_TOKENS, 'verified per round')}")


def best_first(logits: torch.Tensor, top_k: int, nodes: int) -> Proposal:
    """The tree of the `nodes` most probable paths (module docstring) from per-position draft logits `[K, V]`, in
    the order they were found (a parent before its children), as `Proposal(tokens [N], parents=[N])`."""
    k = logits.shape[0]
    logp = torch.log_softmax(logits.float(), dim=-1)                                 # [K, V]
    top_lp, top_ids = logp.topk(min(top_k, logp.shape[-1]), dim=-1)                  # [K, k'] each
    lp, ids = top_lp.tolist(), top_ids.tolist()                                      # one copy to the host
    heap = [(-lp[0][r], 0, -1, r) for r in range(len(lp[0]))] if k else []         # (-score, depth, parent, rank)
    heapq.heapify(heap)
    tokens, parents, scores = [], [], []
    while heap and len(tokens) < nodes:
        neg, depth, parent, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids[depth][rank])
        parents.append(parent)
        scores.append(-neg)
        if depth + 1 < k:
            for r, x in enumerate(lp[depth + 1]):
                heapq.heappush(heap, (neg - x, depth + 1, node, r))
    dev = logits.device
    return Proposal(torch.tensor(tokens, dtype=torch.long, device=dev),
                    parents=torch.tensor(parents, dtype=torch.long, device=dev))
