"""Draft trees: their layout for one target forward, and the walk that verifies them.

A tree proposal is N draft tokens with `parents [N]`: `parents[i]` is the index of draft i's parent among the N
drafts, -1 when its parent is the anchor; `parents[i] < i` (topological order). A chain is the tree
`parents = [-1, 0, 1, ..., N-2]`. The verified block is `[anchor, d_0 .. d_{N-1}]`: block row 0 is the anchor,
row i + 1 is draft i, so a node's logits row predicts the token after that node.

In the target's forward, row j sits at position `start + depth(j)` (the anchor at depth 0) and attends to the
whole cache and to its own ancestors and itself in the block (`TreeLayout.visible`), so every row's logits are
those of the sequence "committed tokens + the path to that node", exactly as a chain verification of that path
would compute them. After verification the KV cache keeps the anchor and the accepted path only (`Target.keep`).

Verification walks from the anchor: at a node, the target chooses the next token y (greedy: its argmax; protocol
A: one sample from its distribution at that row); if a child of the node carries y, the walk moves there,
otherwise y is the bonus token and the walk ends. Every committed token is therefore the target's own choice
given the committed prefix, which is why both rules stay lossless on trees exactly as on chains. Protocol B
(accept with probability min(1, p/q)) is not valid for several siblings drafted from one distribution without a
multi-draft correction; trees under B are refused (`check_protocol`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TREE_PROTOCOLS = ("greedy", "A")


@dataclass
class TreeLayout:
    depth: torch.Tensor      # [N+1] long: block row j's depth below the anchor (the anchor: 0)
    visible: torch.Tensor    # [N+1, N+1] bool: row j may attend to block row i (i is j or one of its ancestors)


def check_parents(parents: list[int]) -> None:
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"draft tree parents[{i}] = {p} is not valid: it must be -1 (the anchor) or the index "
                             f"of an earlier draft (0..{i - 1})")


def layout(parents: torch.Tensor, max_depth: int) -> TreeLayout:
    """Depths and the ancestor-or-self mask of the block `[anchor, drafts]` (built on the host: N is tens). A tree
    deeper than `max_depth` (the engine's k: what the token budget allows) is refused: its path could overrun it."""
    par = parents.tolist()
    check_parents(par)
    n = len(par) + 1
    depth = [0] * n
    visible = [[False] * n for _ in range(n)]
    visible[0][0] = True
    for i, p in enumerate(par, start=1):                # row i = draft i-1, its parent's row is p + 1
        depth[i] = depth[p + 1] + 1
        visible[i] = list(visible[p + 1])
        visible[i][i] = True
    if max(depth) > max_depth:
        raise ValueError(f"a draft tree of depth {max(depth)} was proposed where at most {max_depth} drafts fit "
                         f"(the drafter must keep its tree within the k it is given)")
    dev = parents.device
    return TreeLayout(torch.tensor(depth, device=dev), torch.tensor(visible, device=dev))


def check_protocol(protocol: str) -> None:
    if protocol not in TREE_PROTOCOLS:
        raise ValueError(f"decoding.protocol={protocol!r} cannot verify draft trees (p/q acceptance of siblings "
                         f"drawn from one distribution is not lossless); use {' or '.join(TREE_PROTOCOLS)}, or a "
                         f"chain drafter (drafter.mode=chain)")


def walk(drafts: torch.Tensor, parents: torch.Tensor, pick) -> tuple[list[int], int]:
    """Follow the tree from the anchor: `pick(row, depth)` is the token chosen after block row `row` (`depth` drafts
    deep); the walk moves to the child carrying it (the first such sibling) and stops where none does. Returns the
    accepted drafts' indices, root to leaf, and the last choice (the bonus token)."""
    children: dict[int, dict[int, int]] = {}                 # node -> {token: child}
    for i, (t, p) in enumerate(zip(drafts.tolist(), parents.tolist())):
        children.setdefault(p, {}).setdefault(t, i)
    path, node = [], -1
    while True:
        y = pick(node + 1, len(path))
        nxt = children.get(node, {}).get(y)
        if nxt is None:
            return path, y
        path.append(nxt)
        node = nxt


def verify_tree(protocol: str, logits: torch.Tensor, drafts: torch.Tensor, parents: torch.Tensor,
                temperature: float, generator: torch.Generator | None) -> tuple[torch.Tensor, int]:
    """Verify a tree: `logits [N+1, V]` of the block `[anchor, drafts]`, `drafts [N]`, `parents [N]`. Returns
    `(path, bonus)`: `path [n]` the indices of the accepted drafts, root to leaf, then the bonus token."""
    check_protocol(protocol)
    if protocol == "greedy":
        choice = logits.argmax(-1).tolist()                  # [N+1] once: one device-to-host copy

        def pick(row: int, depth: int) -> int:
            return choice[row]
    else:
        def pick(row: int, depth: int) -> int:               # one target sample at each visited node only
            p = torch.softmax(logits[row].float() / temperature, dim=-1)
            return int(torch.multinomial(p, 1, generator=generator))
    path, bonus = walk(drafts, parents, pick)
    return torch.tensor(path, dtype=torch.long, device=drafts.device), bonus


def follow(drafts: torch.Tensor, parents: torch.Tensor, truth: list[int]) -> list[int]:
    """The path greedy verification accepts when the target's choices are known (`truth`: the reference tokens
    after the anchor; replay): as deep as the tree matches them."""
    return walk(drafts, parents, lambda row, depth: truth[depth] if depth < len(truth) else -2)[0]
