"""Draft trees over one block of independently predicted positions (DFlash, `drafter.mode=tree`).

A DFlash block pass predicts every draft position i = 1..K from the anchor and the context alone, so the
probability the drafter gives a path t_1..t_d is the product of its positions' probabilities, q_1(t_1) ... q_d(t_d).
The tree keeps the `total_tokens - 1` paths of highest joint probability whose tokens are each among their
position's `top_k`; as every extra token multiplies by a probability <= 1, a path never scores above its prefix,
so these paths form a tree (prefix-closed) and a best-first search finds them: pop the best open path, add it, and
open its `top_k` one-token extensions. One block pass, no extra drafter forward: the whole tree costs what the chain
costs, plus the target's verification of more rows. Verification (decoding/tree.py) is lossless under greedy and
protocol A whatever the tree.

DeLS-Spec and Domino-FT (`SequentialDrafter.propose`, drafters/head_loop.py) grow their trees with the same search,
but a node's children come from the fused row its own branch gives: the local head's (or the prefix GRU's) state
after the branch's tokens, so position i depends on the token chosen at i − 1 on every branch. Each node added
below the last position costs one head step (a state update, a rank-r feature and one fused row over the
vocabulary), taken as the node joins the tree.
"""
from __future__ import annotations

import heapq
from typing import Callable

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


def grow(children: Callable[[int, int, int, int | None], list[tuple[float, int]]], nodes: int,
         device) -> Proposal:
    """A best-first tree of at most `nodes` drafts: `children(node, parent, depth, token)` gives the
    (log-probability, token) candidates after a node (node -1, depth -1, token None: the anchor), each scored as its
    parent's score plus its own log-probability; the best open candidate joins the tree next and opens its own
    children. Returns the tree in the order it was built (a parent before its children) as
    `Proposal(tokens [N], parents=[N])`."""
    heap = [(-lp, 0, -1, tok) for lp, tok in children(-1, -1, -1, None)]        # (-score, depth, parent, token)
    heapq.heapify(heap)
    tokens, parents = [], []
    while heap and len(tokens) < nodes:
        neg, depth, parent, tok = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        for lp, child in children(node, parent, depth, tok):
            heapq.heappush(heap, (neg - lp, depth + 1, node, child))
    return Proposal(torch.tensor(tokens, dtype=torch.long, device=device),
                    parents=torch.tensor(parents, dtype=torch.long, device=device))


def top(logits: torch.Tensor, top_k: int) -> list[list[tuple[float, int]]]:
    """Per row of `[n, V]` logits, its `top_k` (log-probability, token) pairs, in one copy to the host."""
    lp, ids = torch.log_softmax(logits.float(), dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)   # [n, k'] each
    return [list(zip(a, b)) for a, b in zip(lp.tolist(), ids.tolist())]


def best_first(logits: torch.Tensor, top_k: int, nodes: int) -> Proposal:
    """The tree of the `nodes` most probable paths (module docstring) from per-position draft logits `[K, V]` whose
    positions are independent (DFlash): every node at depth d has the same candidates, position d + 1's top_k."""
    k = logits.shape[0]
    pairs = top(logits, top_k)
    return grow(lambda node, parent, depth, tok: pairs[depth + 1] if depth + 1 < k else [], nodes, logits.device)
