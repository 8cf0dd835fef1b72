"""One speculative-decoding loop for every drafter; the autoregressive baseline is the same loop with no
drafter (K = 0 drafts, every step commits exactly the target's own next token).

Batch size 1, as in the reference runtimes (B rows at once: decoding/batch_spec.py, the same rules row by row). The
target's KV cache holds every committed token except the newest (the anchor), which is fed at the start of the next
verified block.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..clock import now
from ..drafters.base import Drafter, Proposal, Sampling
from .settings import DecodeConfig
from .tree import check_protocol, layout, verify_tree
from .verify import SAMPLED_DRAFTS, verify


def drafts_per_round(drafter: Drafter | None, dc: DecodeConfig) -> int:
    """K, the drafts one round verifies at most: the drafter's `max_drafts`, capped by `dc.max_drafts`. A cap
    keeps the first drafts of each proposal and drops the rest: the output stays the target's, only τ and the
    cost of a round change (on a CPU, verifying 9 rows costs about twice a 1-row step)."""
    k = drafter.max_drafts if drafter is not None else 0
    return min(k, dc.max_drafts) if dc.max_drafts is not None else k


@dataclass
class Generation:
    """One generated turn. `accept_lengths[i]` = tokens committed by verification i (accepted drafts + the
    bonus token, after truncation at a stop token or the token budget); `drafted[i]` = drafts verified."""

    prompt_len: int
    tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)   # drafts verified (a tree's: all its nodes)
    ttft_s: float = 0.0               # target prefill + first token
    decode_s: float = 0.0             # everything after the drafter's prefill
    stop_reason: str = "length"       # stop | length
    rounds: list[dict] = field(default_factory=list)   # the proposals' `info` + what verification made of them

    @property
    def decode_tokens(self) -> int:
        """Tokens produced by the decode loop (the first token comes from prefill)."""
        return max(len(self.tokens) - 1, 0)


@torch.inference_mode()
def generate(target, drafter: Drafter | None, prompt_ids: list[int], dc: DecodeConfig,
             generator: torch.Generator | None = None) -> Generation:
    dev = target.device
    taps = drafter.tap_layers if drafter is not None else ()
    sampling = Sampling(dc.temperature, generator) if dc.protocol in SAMPLED_DRAFTS else None
    stops = set(dc.stop_token_ids)
    no_drafts = Proposal(torch.empty(0, dtype=torch.long, device=dev))
    gen = Generation(prompt_len=len(prompt_ids))
    if drafter is not None and getattr(drafter, "proposes_trees", False):
        check_protocol(dc.protocol)                      # before the prefill, not at the first tree

    # Prefill: the first token is the target's own (no drafts), its logits from the last prompt position.
    k_max = drafts_per_round(drafter, dc)
    t0 = now(dev)
    cache = target.new_cache(len(prompt_ids) + dc.max_new_tokens + k_max + 1)      # a tree may grow it
    ids = torch.tensor([prompt_ids], device=dev)                                     # [1, P]
    logits, hidden = target.forward(ids, 0, cache, taps=taps, last_only=True)        # [1, 1, V], [1, P, nH]
    v = verify(dc.protocol, logits[0], no_drafts.tokens, None, dc.temperature, generator)
    gen.ttft_s = now(dev) - t0
    gen.tokens.append(v.bonus)
    if drafter is not None:
        drafter.reset()
        if getattr(drafter, "needs_prompt_ids", False):   # EAGLE-3 pairs each prompt position with the next token
            drafter.prefill(hidden, ids=prompt_ids)
        else:
            drafter.prefill(hidden)

    start = len(prompt_ids)                              # position of the anchor
    t0 = now(dev)
    done = v.bonus in stops
    while not done and len(gen.tokens) < dc.max_new_tokens:
        # Never draft past the budget: k drafts + 1 bonus must fit.
        k = min(k_max, dc.max_new_tokens - len(gen.tokens) - 1)
        prop = drafter.propose(v.bonus, start, k, sampling) if k > 0 else no_drafts
        block = torch.cat([v.anchor, prop.tokens])[None]                             # [1, N+1] no copy to host
        tree = layout(prop.parents, k) if prop.parents is not None else None      # k bounds a tree's depth
        where = {"tree": tree} if tree is not None else {}     # a chain needs no tree-aware target
        logits, hidden = target.forward(block, start, cache, taps=taps, **where)     # [1, N+1, V]
        if tree is None:                                 # a chain: keep anchor + n accepted drafts
            v = verify(dc.protocol, logits[0], prop.tokens, prop.q, dc.temperature, generator)
            target.rollback(cache, k - v.n)
            rows, path = slice(0, v.n + 1), {}
        else:                                            # a tree: keep anchor + the accepted path (compaction)
            v = verify_tree(dc.protocol, logits[0], prop.tokens, tree.parents, dc.temperature, generator)
            rows, path = torch.cat([v.path.new_zeros(1), v.path + 1]), {"path": v.path}
            target.keep(cache, start, rows)
        if drafter is not None:
            drafter.commit(v.n, hidden[:, rows] if hidden is not None else None, **path)
        new = v.tokens
        for i, t in enumerate(new):                      # truncate at the first stop token
            if t in stops:
                new, done = new[: i + 1], True
                break
        gen.tokens += new
        gen.accept_lengths.append(len(new))
        gen.drafted.append(k if tree is None else prop.tokens.numel())
        if prop.info is not None:
            gen.rounds.append({**prop.info, "tokens": prop.tokens, "accepted": v.n, "bonus": v.bonus, **path})
        start += v.n + 1
    gen.decode_s = now(dev) - t0
    gen.stop_reason = "stop" if gen.tokens[-1] in stops else "length"
    return gen
