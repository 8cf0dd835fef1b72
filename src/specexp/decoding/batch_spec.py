"""Speculative decoding of B sequences at once: every round, each row drafts from its own anchor, one target forward
verifies all rows' blocks `[B, K+1]`, and each row keeps its own accepted length.

At batch 1 (decoding/engine.py) a verify reads every weight to check K + 1 tokens of one sequence; here the same read
checks B (K + 1). Whether speculation still pays at batch B depends on τ, on the drafter's cost and on when the
B (K + 1) rows stop being free (the matrix units fill): experiments/bench_batch.py measures where it stops.

  rows = B slots of one target cache `[L, B, Hkv, S, D]` (targets.static.RowsKV), each with its own length, and one
         drafter fork each (drafters/base.py `fork`: shared weights, a context of its own)
  a free row takes the next prompt: its own prefill (the batch-1 forward on the row's slice), whose last logits give
      the first token, and its fork's prefill on the prompt's taps
  one round:
      every live row proposes k_b <= K drafts at its anchor (a drafter with `prepare_rows` first runs all rows'
          block passes as one); rows with fewer drafts are padded to the longest block
      one target forward of the blocks `[B, N]` (`StaticTarget.forward_rows`), row b at its own positions
      each row's verdict by `decoding.protocol` (greedy: every row's in one device-to-host copy), n_b drafts kept
      rollback per row: its length moves by n_b + 1 (what lies past it is overwritten by its next block); its fork
          commits the taps of `[anchor, d_1..d_n]`
      a row whose answer ends (stop id, budget) is refilled: the next turn of its job, else the next job
  once no job is left and at most half the rows are live, the batch shrinks to them

Each row follows the batch-1 engine's rules exactly (the same K, budget, stop truncation and verdicts), so its
tokens are the target's greedy tokens up to float rounding among B rows (tests/decoding/test_batch_spec.py:
equal to batch 1 in float32, every drafter). Draft trees run at batch 1 only. Jobs are `Job`s (below); a job
with a `generator` attribute has its rows sampled from it (per-turn seeds, as at batch 1).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import torch
from torch.nn.utils.rnn import pad_sequence

from ..clock import now
from ..drafters.base import Sampling, fork
from ..errors import check
from .engine import DecodeConfig, Generation, drafts_per_round
from .verify import PROTOCOLS, SAMPLED_DRAFTS, Verdict, verify


class Job(Protocol):
    """One sample's turns (decoding/batch.py's module docstring): `next_prompt(None)` is its first prompt,
    `next_prompt(finished turn)` the next one, None when it has no more."""

    def next_prompt(self, previous: Generation | None) -> list[int] | None: ...


@dataclass
class Row:
    job: Job
    gen: Generation
    drafter: object | None          # this row's fork
    start: int                      # the anchor's position
    anchor: torch.Tensor            # [1] the anchor on the device (the last verdict's bonus)
    token: int                      # the same token on the host
    generator: torch.Generator | None
    t0: float                       # when its decoding began (after its prefill)


def greedy_rows(logits: torch.Tensor, block: torch.Tensor, ks: list[int]) -> list[Verdict]:
    """Every row's greedy verdict in one device-to-host copy: `logits [B, N, V]`, `block [B, N]` (anchor, drafts,
    padding), row b's first `ks[b]` drafts verified."""
    y = logits.argmax(-1)                                                                   # [B, N]
    n_cols = block.shape[1]
    k = torch.tensor(ks, device=block.device)[:, None]                                      # [B, 1]
    hit = (block[:, 1:] == y[:, :-1]) & (torch.arange(n_cols - 1, device=block.device) < k)   # [B, N-1]
    n = hit.long().cumprod(1).sum(1)                                                        # [B] leading matches
    host = torch.cat([n, y.flatten()]).tolist()
    out = []
    for b, n_b in enumerate(host[: len(ks)]):
        row = host[len(ks) + b * n_cols: len(ks) + (b + 1) * n_cols]
        out.append(Verdict(row[: n_b + 1], y[b, n_b: n_b + 1]))                # y[:n] equals the accepted drafts
    return out


@torch.inference_mode()
def speculate_batched(target, drafter, jobs: Iterable[Job], dc: DecodeConfig, batch_size: int,
                      on_done: Callable[[Job], None], generator: torch.Generator | None = None,
                      capacity: int = 0) -> int:
    """Run every job's turns, `batch_size` rows at a time, with `drafter` (None: the autoregressive baseline, K = 0)
    under `dc` (module docstring). `target` must have `forward_rows` (targets.static.StaticTarget). `on_done(job)` as
    each job ends. `generator`: the sampling stream of rows whose job brings none. Returns the rounds run. At most
    as many rows as jobs are allocated."""
    check(dc.protocol in PROTOCOLS, f"decoding.protocol={dc.protocol!r}: one of {', '.join(PROTOCOLS)}")
    check(batch_size >= 1, f"batch size {batch_size}: at least 1")
    check(drafter is None or not getattr(drafter, "proposes_trees", False),
          f"drafter {getattr(drafter, 'name', '?')} proposes draft trees, which run at eval.batch_size=1 only "
          f"(got {batch_size} rows); use its chain mode or batch 1")
    dev, stops, budget = target.device, set(dc.stop_token_ids), dc.max_new_tokens
    k_max = drafts_per_round(drafter, dc)
    taps = drafter.tap_layers if drafter is not None else ()
    no_drafts = torch.empty(0, dtype=torch.long, device=dev)
    queue = deque(jobs)
    # a job holds one row at a time (its turns run in turn), so rows beyond the jobs would stay empty: never
    # allocated (eval.batch_size=4096 on one sample is a batch of 1, not 4,096 forks and cache rows)
    batch_size = min(batch_size, len(queue))
    if not batch_size:
        return 0
    rows: list[Row | None] = [None] * batch_size
    twins = [fork(drafter) if drafter is not None else None for _ in range(batch_size)]
    cache = target.new_rows_cache(batch_size, max(capacity, 16))

    def start(b: int, job: Job, gen: Generation | None) -> bool:
        """Give row b the job's next turn (prefilled, first token taken); False when the job has none left."""
        while True:
            prompt = job.next_prompt(gen)
            if prompt is None:
                rows[b] = None
                on_done(job)
                return False
            g = getattr(job, "generator", None) or generator
            gen, t0 = Generation(prompt_len=len(prompt)), now(dev)
            target.grow_rows(cache, len(prompt) + budget + k_max + 1)
            ids = torch.tensor([prompt], device=dev)                                            # [1, P]
            logits, hidden = target.forward(ids, 0, cache.row(b), taps=taps, last_only=True)    # [1, 1, V]
            cache.lengths[b] = len(prompt)
            v = verify(dc.protocol, logits[0], no_drafts, None, dc.temperature, g)
            gen.ttft_s = now(dev) - t0
            gen.tokens.append(v.bonus)
            twin = twins[b]
            if twin is not None:
                twin.reset()
                if getattr(twin, "needs_prompt_ids", False):
                    twin.prefill(hidden, ids=prompt)
                else:
                    twin.prefill(hidden)
            if v.bonus not in stops and len(gen.tokens) < budget:
                rows[b] = Row(job, gen, twin, len(prompt), v.anchor, v.bonus, g, now(dev))
                return True
            gen.stop_reason = "stop" if v.bonus in stops else "length"   # a one-token answer: the job's next turn

    def refill(b: int) -> None:
        while queue and start(b, queue.popleft(), None) is False:
            pass

    for b in range(batch_size):
        refill(b)
    rounds = 0
    while any(r is not None for r in rows):
        live = [b for b, r in enumerate(rows) if r is not None]
        ks = [min(k_max, budget - len(r.gen.tokens) - 1) if r is not None else 0 for r in rows]
        drafting = [b for b in live if ks[b] > 0]
        if drafting and hasattr(drafter, "prepare_rows"):          # one batched pass for every row's proposal
            drafter.prepare_rows([rows[b].drafter for b in drafting], [rows[b].token for b in drafting],
                                 [rows[b].start for b in drafting], [ks[b] for b in drafting],
                                 dc.protocol not in SAMPLED_DRAFTS)
        props = [None] * batch_size
        for b in drafting:
            r = rows[b]
            sampling = Sampling(dc.temperature, r.generator) if dc.protocol in SAMPLED_DRAFTS else None
            props[b] = r.drafter.propose(r.token, r.start, ks[b], sampling)
        block = pad_sequence([torch.cat([r.anchor, props[b].tokens]) if props[b] is not None else
                              (r.anchor if r is not None else no_drafts.new_zeros(1))
                              for b, r in enumerate(rows)], batch_first=True)                   # [B, N]
        logits, hidden = target.forward_rows(block, cache, taps)                                # [B, N, V]
        if dc.protocol == "greedy":
            verdicts = greedy_rows(logits, block, ks)
        else:
            verdicts = [verify(dc.protocol, logits[b, : ks[b] + 1], props[b].tokens if props[b] else no_drafts,
                               props[b].q if props[b] else None, dc.temperature, r.generator)
                        if r is not None else None for b, r in enumerate(rows)]
        rounds += 1
        for b in live:
            r, v = rows[b], verdicts[b]
            cache.lengths[b] += v.n + 1                                  # anchor + accepted drafts; the rest rolls back
            if r.drafter is not None:
                r.drafter.commit(v.n, hidden[b: b + 1, : v.n + 1] if hidden is not None else None)
            new, done = v.tokens, False
            for i, t in enumerate(new):                                  # truncate at the first stop token
                if t in stops:
                    new, done = new[: i + 1], True
                    break
            gen = r.gen
            gen.tokens += new
            gen.accept_lengths.append(len(new))
            gen.drafted.append(ks[b])
            prop = props[b]
            if prop is not None and prop.info is not None:
                gen.rounds.append({**prop.info, "tokens": prop.tokens, "accepted": v.n, "bonus": v.bonus})
            r.start, r.anchor, r.token = r.start + v.n + 1, v.anchor, v.bonus
            if done or len(gen.tokens) >= budget:
                gen.decode_s = now(dev) - r.t0
                gen.stop_reason = "stop" if gen.tokens[-1] in stops else "length"
                if not start(b, r.job, gen):
                    refill(b)
        live = [b for b, r in enumerate(rows) if r is not None]
        if not queue and 0 < len(live) <= len(rows) // 2:      # the tail: no prompt left to refill a row with
            cache.keep_rows(live)
            rows[:], twins[:] = [rows[b] for b in live], [twins[b] for b in live]
    return rounds
