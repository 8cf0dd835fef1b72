"""Batched greedy generation: B sequences decoded side by side by the static engine, the batch kept full.

What the references of replay (eval/references.py) need is the target's greedy continuation of many prompts; at
batch 1 a step reads every weight to produce one token, at batch B the same read produces B. The loop:

  rows = B slots of one cache `[L, B, Hkv, S, D]` (static_target.RowsKV), each with its own length
  while any work is left:
      every free row takes the next prompt: a prefill of its own (the batch-1 forward, on the row's slice of the
          cache), whose last logits give the row's first token
      one step over all B rows (`StaticTarget.decode_rows`): each row's newest token at its own position
      a row whose token is a stop id or whose answer reached the budget is finished; its job may hand it the
          next turn of the same sample (multi-turn answers are kept in order), else the row takes the next job
      once no job is left to start and at most half the rows are live, the batch shrinks to the live rows

Each row's tokens follow the batch-1 engine's rule exactly (`decoding.engine.generate` with no drafter: the
prefill's argmax first, then one argmax a step, stop ids included, at most `max_new_tokens`); what can differ is
float rounding, since a row's products are computed among B rows instead of one (see docs/batched.md for what
was measured: in float32 the rows equal their batch-1 tokens).

A job is anything with `next_prompt(previous: Generation | None) -> list[int] | None`: called with None for its
first turn and with each finished turn after; None ends the job, which is then handed to `on_done`.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Protocol

import torch

from ..errors import check
from .engine import DecodeConfig, Generation


class Job(Protocol):
    def next_prompt(self, previous: Generation | None) -> list[int] | None: ...


@torch.inference_mode()
def generate_batched(target, jobs: Iterable[Job], dc: DecodeConfig, batch_size: int,
                     on_done: Callable[[Job], None], capacity: int = 0) -> int:
    """Run every job's turns greedily, `batch_size` rows at a time (module docstring); `target` must have
    `decode_rows` (static_target.StaticTarget). `on_done(job)` is called as each job ends, in the order they
    end. `capacity`: the first cache size a row gets (grown as prompts need). Returns the steps run."""
    check(dc.protocol == "greedy", f"batched generation is greedy only (got decoding.protocol={dc.protocol})")
    check(batch_size >= 1, f"batch size {batch_size}: at least 1")
    stops, budget = set(dc.stop_token_ids), dc.max_new_tokens
    queue = deque(jobs)
    rows: list[tuple[Job, Generation] | None] = [None] * batch_size
    cache = target.new_rows_cache(batch_size, max(capacity, 16))
    newest = torch.zeros(batch_size, dtype=torch.long, device=target.device)                # [B]

    def start(b: int, job: Job, gen: Generation | None) -> bool:
        """Give row b the job's next turn (prefilled, first token taken); False when the job has none left."""
        while True:
            prompt = job.next_prompt(gen)
            if prompt is None:
                rows[b] = None
                on_done(job)
                return False
            gen = Generation(prompt_len=len(prompt))
            target.grow_rows(cache, len(prompt) + budget + 1)
            logits, _ = target.forward(torch.tensor([prompt], device=target.device), 0, cache.row(b),
                                       last_only=True)                                      # [1, 1, V]
            cache.lengths[b] = len(prompt)
            first = int(logits[0, -1].argmax())
            gen.tokens.append(first)
            if first not in stops and len(gen.tokens) < budget:
                rows[b], newest[b] = (job, gen), first
                return True
            finish(gen)                                     # a one-token answer: the job's next turn, if any

    def finish(gen: Generation) -> None:
        gen.stop_reason = "stop" if gen.tokens[-1] in stops else "length"

    def refill(b: int) -> None:
        while queue and start(b, queue.popleft(), None) is False:
            pass

    for b in range(batch_size):
        refill(b)
    steps = 0
    while any(r is not None for r in rows):
        logits = target.decode_rows(newest, cache, [r is not None for r in rows])             # [B, V]
        newest = logits.argmax(-1)                    # [B] the next step's input; a refilled row's first token
        steps += 1                                    # is written over its entry by `start`
        for b, (row, t) in enumerate(zip(rows, newest.tolist())):
            if row is None:
                continue
            job, gen = row
            gen.tokens.append(t)
            if t in stops or len(gen.tokens) >= budget:
                finish(gen)
                if not start(b, job, gen):
                    refill(b)
        live = [b for b, r in enumerate(rows) if r is not None]
        if not queue and 0 < len(live) <= len(rows) // 2:      # the tail: no prompt left to refill a row with
            cache.keep_rows(live)
            rows[:] = [rows[b] for b in live]
            newest = newest[live]
    return steps
