"""The drafter protocol the engine talks to. A drafter never imports verification.

Life of one generation (positions are absolute, as the target's):
  reset()                          forget the previous sequence
  prefill(taps)                    taps of the prompt, positions 0..P-1 (excluded from decode time)
  loop:
    propose(anchor, start, k, s)   anchor = last committed token, at position `start`, not yet seen by the
                                   target; return k drafts for positions start+1 .. start+k
    commit(n, taps)                n drafts were accepted; taps of [anchor, d1..dn] (positions
                                   start .. start+n) become context; the bonus is the next anchor

A drafter with `needs_prompt_ids = True` gets `prefill(taps, ids=prompt_ids)` (EAGLE-3 reads position p's
taps with token p+1, so it needs the prompt's tokens, not only its taps).

Draft trees: a drafter with `proposes_trees = True` may return `Proposal(tokens [N], parents=[N])`
(decoding/tree.py); `k` then bounds the tree's depth, not N, and the engine calls `commit(n, taps, path=path)`
with `path [n]` the accepted drafts' indices root to leaf (taps are those of [anchor, path tokens]).

Batched speculation (decoding/batch_spec.py) runs one `fork(drafter)` per row: the same weights, a state of its own,
each driven through the life above. A drafter may also have
  prepare_rows(rows, anchors, starts, ks, argmax)
                                   rows: the forks about to propose, each at its own anchor and position, k drafts;
                                   argmax: whether the drafts will be argmax (greedy, protocol A; protocol B samples).
                                   One batched pass for all rows, which each fork's next `propose` there reads instead
                                   of running its own (the DFlash block pass; DeLS-Spec's and Domino-FT's backbone and,
                                   for argmax drafts, their head loop). Without it every row proposes alone.

Optional, for drafters whose drafts at an anchor depend only on the tokens and taps before it (greedy replay of a
known sequence, eval/replay.py, uses it when present and the loop above otherwise):
  propose_all(taps, ids, starts, ks)   ids [T]: a known sequence; taps [1, T-1, n*H] of its positions 0..T-2;
                                   for each anchor position starts[i], the greedy drafts `[N, K]` that
                                   propose(ids[s], s, ks[i]) would return after prefill/commit of taps[:, :s].
                                   Drafts past the first one that differs from ids[s+1..] may be left at -1
                                   (never computed): acceptance stops there. A drafter whose proposals carry
                                   `info` returns `(drafts, infos)` instead: infos[i] = the `Proposal.info` of
                                   that propose call (None where ks[i] = 0: the engine does not propose there).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass
class Sampling:
    """Draft by sampling at `temperature` (protocol B, block verification). `None` in its place means argmax
    drafts."""

    temperature: float
    generator: torch.Generator


@dataclass
class LazyDist:
    """Draft distributions known by the probabilities of the drafted tokens; a full row is built only on
    demand (protocol B needs just the first rejected one, for its residual)."""

    token_probs: torch.Tensor                  # [K] q_j(d_j)
    row: Callable[[int], torch.Tensor]         # j -> q_j [V]


@dataclass
class Proposal:
    tokens: torch.Tensor                       # [K] long, on the target's device
    q: torch.Tensor | LazyDist | None = None   # [K, V] distributions the tokens were sampled from (B and block)
    info: dict | None = None                   # per-round diagnostics (DEdit: passes run, the pre-edit draft)
    parents: torch.Tensor | None = None        # [K] long: a draft tree (decoding/tree.py); None = a chain


class Drafter(Protocol):
    name: str
    max_drafts: int                   # K: drafts per step at most (block size - 1 for DFlash)
    tap_layers: tuple[int, ...]       # target hidden-state taps the drafter reads; () if none

    def reset(self) -> None: ...

    def prefill(self, taps: torch.Tensor | None) -> None: ...

    def propose(self, anchor: int, start: int, k: int, sampling: Sampling | None) -> Proposal: ...

    def commit(self, n_accepted: int, taps: torch.Tensor | None) -> None: ...


class OnBackbone:
    """A drafter built on a DFlash backbone that keeps the context for it (DEdit, the head loop of DeLS-Spec and
    Domino-FT): reset, prefill and commit are the backbone's; what it proposes is its own."""

    backbone: Drafter

    def reset(self) -> None:
        self.backbone.reset()

    def prefill(self, taps) -> None:
        self.backbone.prefill(taps)

    def commit(self, n_accepted: int, taps, path=None) -> None:
        self.backbone.commit(n_accepted, taps)          # a tree's: the taps of its accepted path (the engine's pick)


def choose(logits: torch.Tensor, sampling: Sampling | None) -> Proposal:
    """Drafts from per-position draft logits `[K, V]`: argmax, or samples with their distributions."""
    if sampling is None:
        return Proposal(logits.argmax(-1))
    q = torch.softmax(logits.float() / sampling.temperature, dim=-1)                  # [K, V]
    return Proposal(torch.multinomial(q, 1, generator=sampling.generator)[:, 0], q)


def sequence_at(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """`ids[pos]` of a known sequence `[T]` at positions `[n]`, -2 past its end (no token: never a draft's match)."""
    return torch.where(pos < len(ids), ids[pos.clamp(max=len(ids) - 1)], -2)


def fork(drafter):
    """A drafter with the same weights and a state of its own, reset (batched speculation: one per row). A drafter on
    a backbone gets a fork of the backbone too, which keeps its context."""
    twin = copy.copy(drafter)
    if isinstance(drafter, OnBackbone):
        twin.backbone = fork(drafter.backbone)
    twin.reset()
    return twin
