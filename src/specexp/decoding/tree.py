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

from ..errors import check
from .verify import Verdict

TREE_PROTOCOLS = ("greedy", "A")


@dataclass
class TreeLayout:
    depth: torch.Tensor      # [N+1] long: block row j's depth below the anchor (the anchor: 0)
    visible: torch.Tensor    # [N+1, N+1] bool: row j may attend to block row i (i is j or one of its ancestors)
    parents: list[int]       # [N] the parents, read once on the host (verification reuses them)


def check_parents(parents: list[int]) -> None:
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"draft tree parents[{i}] = {p} is not valid: it must be -1 (the anchor) or the index "
                             f"of an earlier draft (0..{i - 1})")


def layout(parents: torch.Tensor, max_depth: int) -> TreeLayout:
    """Depths and the ancestor-or-self mask of the block `[anchor, drafts]` (built on the host: N is tens; the
    parents are a tree round's one read besides its verdict). A tree deeper than `max_depth` (the engine's k: what the
    token budget allows) is refused: its path could overrun it."""
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
    return TreeLayout(to_device(depth, dev), to_device(visible, dev, torch.bool), par)


def check_protocol(protocol: str, key: str = "decoding.protocol") -> None:
    """A tree is verified by greedy or protocol A only: one `UserError` line otherwise, `key` naming the setting
    (config.py checks the config with it before any work; the API's `generate(decoding=...)` and the engine, as a
    last guard, before a prefill)."""
    check(protocol in TREE_PROTOCOLS,
          f"{key}={protocol!r} cannot verify draft trees (p/q acceptance of siblings drawn from one distribution is "
          f"not lossless); use {' or '.join(TREE_PROTOCOLS)} (decoding=greedy or decoding=sample_a), or a chain "
          f"drafter (drafter.mode=chain)")


def walk(drafts: list[int], parents: list[int], pick) -> tuple[list[int], int]:
    """Follow the tree from the anchor: `pick(row, depth)` is the token chosen after block row `row` (`depth` drafts
    deep); the walk moves to the child carrying it (the first such sibling) and stops where none does. Returns the
    accepted drafts' indices, root to leaf, and the last choice (the bonus token)."""
    children: dict[int, dict[int, int]] = {}                 # node -> {token: child}
    for i, (t, p) in enumerate(zip(drafts, parents)):
        children.setdefault(p, {}).setdefault(t, i)
    path, node = [], -1
    while True:
        y = pick(node + 1, len(path))
        nxt = children.get(node, {}).get(y)
        if nxt is None:
            return path, y
        path.append(nxt)
        node = nxt


@dataclass
class TreeVerdict(Verdict):
    """A verified tree: `path [n]` (on the device) the accepted drafts' indices, root to leaf; `tokens` and
    `anchor` as for a chain (decoding/verify.py)."""

    path: torch.Tensor | None = None


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A short host list on the device; on CUDA through pinned memory without blocking (the host does not wait for
    the queued work, as a plain copy from pageable memory would)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def verify_tree(protocol: str, logits: torch.Tensor, drafts: torch.Tensor, parents: torch.Tensor | list[int],
                temperature: float, generator: torch.Generator | None) -> TreeVerdict:
    """Verify a tree: `logits [N+1, V]` of the block `[anchor, drafts]`, `drafts [N]`, `parents [N]` (the layout's
    host list, or a tensor). Returns the accepted path, the committed tokens (path tokens, then the bonus) and the
    bonus on the device."""
    check_protocol(protocol)
    pars = parents if isinstance(parents, list) else parents.tolist()
    if protocol == "greedy":
        choice = logits.argmax(-1)                                                  # [N+1]
        host = torch.cat([choice, drafts]).tolist()                                 # the verdict's one sync
        toks = host[choice.numel():]

        def pick(row: int, depth: int) -> int:
            return host[row]
    else:
        toks, rows = drafts.tolist(), {}

        def pick(row: int, depth: int) -> int:               # one target sample at each visited node only
            p = torch.softmax(logits[row].float() / temperature, dim=-1)
            rows[row] = torch.multinomial(p, 1, generator=generator)                 # [1]
            return int(rows[row])
    path, bonus = walk(toks, pars, pick)
    last = path[-1] + 1 if path else 0                                              # the bonus's block row
    anchor = choice[last: last + 1] if protocol == "greedy" else rows[last]
    return TreeVerdict([toks[i] for i in path] + [bonus], anchor, to_device(path, drafts.device))


def follow(drafts: torch.Tensor, parents: torch.Tensor, truth: list[int]) -> list[int]:
    """The path greedy verification accepts when the target's choices are known (`truth`: the reference tokens
    after the anchor; replay): as deep as the tree matches them."""
    return walk(drafts.tolist(), parents.tolist(), lambda row, depth: truth[depth] if depth < len(truth) else -2)[0]
