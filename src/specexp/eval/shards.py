"""Sharded evaluation: `eval.shard=I/N` runs the I-th of N disjoint parts of a run's prompts (task=eval, replay).

The split, one rule for both tasks: the prompts the unsharded run would select (the shuffle and
`eval.num_samples` first, as always) are dealt round-robin within each benchmark, so shard I holds samples
I, I+N, I+2N, ... of every benchmark, in that order. Hence
  - the N shards of one run partition the unsharded selection exactly (every sample in exactly one shard);
  - every shard gets a similar share of every benchmark (long and short prompts alike), so they finish together;
  - a larger `eval.num_samples` extends every shard (its recorded samples stay in it), as it extends an unsharded
    run; contiguous blocks would move samples between shards instead.
A shard's directory records in run.json (eval/store.py) `settings.shard = {index, count}`, so a shard is a
different run from the other shards and from the unsharded run, and `selection`: the unsharded selection
({benchmark: [ids]}, in order), from which `task=merge` (eval/merge.py) checks that shards belong to one run
and restores the unsharded order of the samples.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import check

PATTERN = re.compile(r"(0|[1-9][0-9]*)/([1-9][0-9]*)")
VALID = "null (unsharded) or 'I/N' with ints 0 <= I < N, e.g. eval.shard=0/2"


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def is_valid(value) -> bool:
    """Whether `value` is a valid `eval.shard`: None, or 'I/N' with 0 <= I < N (digits only, no sign or padding)."""
    if value is None:
        return True
    m = PATTERN.fullmatch(value) if isinstance(value, str) else None
    return m is not None and int(m[1]) < int(m[2])


def parse(value) -> Shard | None:
    """`eval.shard` -> Shard, or None (unsharded). A bad value is one line naming it."""
    check(is_valid(value), f"eval.shard={value!r} is not valid; expected {VALID}")
    if value is None:
        return None
    i, n = value.split("/")
    return Shard(int(i), int(n))


def positions(samples) -> list[int]:
    """Each sample's index within its benchmark, in the order given."""
    seen: dict[str, int] = {}
    out = []
    for s in samples:
        out.append(seen.get(s.benchmark, 0))
        seen[s.benchmark] = out[-1] + 1
    return out


def select(samples, shard: Shard | None) -> list:
    """The samples of `shard` (all of them when None), in their order: index within benchmark ≡ shard.index mod N."""
    if shard is None:
        return list(samples)
    return [s for s, i in zip(samples, positions(samples)) if i % shard.count == shard.index]


def selection(samples) -> dict[str, list[str]]:
    """{benchmark: [ids]} of the unsharded selection, in order (run.json's `selection`)."""
    out: dict[str, list[str]] = {}
    for s in samples:
        out.setdefault(s.benchmark, []).append(s.id)
    return out


def part(ids: list[str], shard: Shard) -> list[str]:
    """The ids of one benchmark's selection that `shard` holds (what `select` keeps), in order."""
    return ids[shard.index::shard.count]


def entry(samples, shard: Shard | None) -> dict | None:
    """What a shard records in run.json (None when unsharded): its index, count and the unsharded selection."""
    if shard is None:
        return None
    return {"index": shard.index, "count": shard.count, "selection": selection(samples)}
