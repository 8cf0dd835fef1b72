"""Draft trees over one block of independently predicted positions (DFlash, `drafter.mode=tree`).

A DFlash block pass predicts every draft position i = 1..K from the anchor and the context alone, so the
probability the drafter gives a path t_1..t_d is the product of its positions' probabilities, q_1(t_1) ... q_d(t_d).
The tree keeps the `total_tokens - 1` paths of highest joint probability whose tokens are each among their
position's `top_k`; as every extra token multiplies by a probability <= 1, a path never scores above its prefix,
so these paths form a tree (prefix-closed), the tree a best-first search (pop the best open path, add it, open its
`top_k` one-token extensions) builds. One block pass, no extra drafter forward: the tree costs what the chain costs,
plus the target's verification of more rows. Verification (decoding/tree.py) is lossless under greedy and
protocol A whatever the tree.

DeLS-Spec and Domino-FT (`SequentialDrafter.propose`, drafters/head_loop.py) grow their trees to the same rule,
but a node's children come from the fused row its own branch gives: the local head's (or the prefix GRU's) state
after the branch's tokens, so position i depends on the token chosen at i − 1 on every branch. A best-first search
would take one head step per node, each a pass over the vocabulary; `grow` instead goes level by level, one
batched head step for all of a level's nodes that can still make the tree, and finds the same paths: a path among
the N best overall is among the N best of its own depth, and is never below the N-th best score of the paths
already scored (a subset of all paths, so that score is at most the tree's cut-off).
"""
from __future__ import annotations

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


Candidates = list[tuple[float, int]]                             # (log-probability, token) pairs


def grow(roots: Candidates, expand: Callable[[int, list[int], list[int], list[int]], list[Candidates]], nodes: int,
         depth_max: int, device) -> Proposal:
    """The `nodes` paths of highest score (the sum of their tokens' log-probabilities), grown level by level:
    `roots` are the candidates after the anchor (depth 0); `expand(depth, ids, parents, tokens)` gives the
    candidates after each of a level's nodes (ids numbered as they are scored; a root's parent is -1), in one call
    per level; nothing grows below `depth_max - 1`. Returns the tree best path first, a parent before its children,
    as `Proposal(tokens [N], parents=[N])`."""
    score, token, parent, depth = [], [], [], []                 # every scored node
    cands = [(lp, -1, tok) for lp, tok in roots]                 # (score, parent, token) at depth d
    for d in range(depth_max):
        cands = sorted(cands, key=lambda c: -c[0])[:nodes]       # the N best of the level at most
        if len(score) + len(cands) > nodes:                      # the N-th best score so far bounds the cut-off
            cut = sorted(score + [c[0] for c in cands], reverse=True)[nodes - 1]
            cands = [c for c in cands if c[0] >= cut]
        if not cands:
            break
        ids = list(range(len(score), len(score) + len(cands)))
        for s, p, t in cands:
            score.append(s), parent.append(p), token.append(t), depth.append(d)
        if d + 1 == depth_max:
            break
        below = expand(d, ids, [p for _, p, _ in cands], [t for _, _, t in cands])
        cands = [(score[i] + lp, i, t) for i, kids in zip(ids, below) for lp, t in kids]
    keep = sorted(range(len(score)), key=lambda i: (-score[i], depth[i], i))[:nodes]     # parents first on ties
    new = {old: n for n, old in enumerate(keep)}
    return Proposal(torch.tensor([token[i] for i in keep], dtype=torch.long, device=device),
                    parents=torch.tensor([new.get(parent[i], -1) for i in keep], dtype=torch.long, device=device))


def top(logits: torch.Tensor, top_k: int) -> list[Candidates]:
    """Per row of `[n, V]` logits, its `top_k` (log-probability, token) pairs, in one copy to the host."""
    lp, ids = torch.log_softmax(logits.float(), dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)   # [n, k'] each
    return [list(zip(a, b)) for a, b in zip(lp.tolist(), ids.tolist())]


def best_first(logits: torch.Tensor, top_k: int, nodes: int) -> Proposal:
    """The tree of the `nodes` most probable paths (module docstring) from per-position draft logits `[K, V]` whose
    positions are independent (DFlash): every node at depth d has the same candidates, position d + 1's top_k."""
    pairs = top(logits, top_k)
    same = lambda d, ids, parents, toks: [pairs[d + 1]] * len(ids)              # noqa: E731
    return grow(pairs[0], same, nodes, logits.shape[0], logits.device)
