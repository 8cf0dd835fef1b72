"""Batched greedy generation: B sequences decoded side by side by the static engine, the batch kept full.

What the references of replay (eval/references.py) need is the target's greedy continuation of many prompts; at
batch 1 a step reads every weight to produce one token, at batch B the same read produces B. The loop:

  rows = B slots of one cache `[L, B, Hkv, S, D]` (targets.static.RowsKV), each with its own length
  while any work is left:
      every free row takes the next prompt: a prefill of its own (the batch-1 forward, on the row's slice of the
          cache), whose last logits give the row's first token
      one step over all B rows (`StaticTarget.forward_rows`, one token a row): each row's newest token at its
          own position
      a row whose token is a stop id or whose answer reached the budget is finished; its job may hand it the
          next turn of the same sample (multi-turn answers are kept in order), else the row takes the next job
      once no job is left to start and at most half the rows are live, the batch shrinks to the live rows

Each row's tokens follow the batch-1 engine's rule exactly (`decoding.engine.generate` with no drafter: the
prefill's argmax first, then one argmax a step, stop ids included, at most `max_new_tokens`); what can differ is
float rounding, since a row's products are computed among B rows instead of one (see docs/batched.md for what
was measured: in float32 the rows equal their batch-1 tokens).

A job is anything with `next_prompt(previous: Generation | None) -> list[int] | None`: called with None for its
first turn and with each finished turn after; None ends the job, which is then handed to `on_done`.

The loop itself is batched speculation's (decoding/batch_spec.py) with no drafter: K = 0, one token a row a step.
"""
from __future__ import annotations

from typing import Callable, Iterable

from ..errors import check
from .batch_spec import Job, speculate_batched
from .engine import DecodeConfig

__all__ = ["Job", "generate_batched"]


def generate_batched(target, jobs: Iterable[Job], dc: DecodeConfig, batch_size: int,
                     on_done: Callable[[Job], None], capacity: int = 0) -> int:
    """Run every job's turns greedily, `batch_size` rows at a time (module docstring); `target` must have
    `forward_rows` (targets.static.StaticTarget). `on_done(job)` is called as each job ends, in the order they
    end. `capacity`: the first cache size a row gets (grown as prompts need). Returns the steps run."""
    check(dc.protocol == "greedy", f"batched generation is greedy only (got decoding.protocol={dc.protocol})")
    return speculate_batched(target, None, jobs, dc, batch_size, on_done, capacity=capacity)
