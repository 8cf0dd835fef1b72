"""Sharded evaluation: `eval.shard=I/N` runs the I-th of N disjoint parts of a run's prompts (task=eval, replay);
and the timed subset of the same selection (`eval.timed_samples`, below).

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

The timed subset (`eval.timed_samples`, task=eval), a rule over the same unsharded selection: the prompts whose TPOT
and speedup a run measures, out of all it measures τ and the lossless check on (the speedup needs the drafter's and
AR's timings interleaved turn by turn at batch 1, which cost as much again as the drafter's run):
  value   null (every selected prompt is timed: what runs made before the key did), an int n (per benchmark), or a
          mapping {benchmark: n} (a benchmark it does not name is timed whole), as `eval.num_samples` takes;
  draw    per benchmark, the selected samples ranked by sha256 of "{seed}/{benchmark}/{id}" with `seed` the
          config's top-level `seed` (already a result-changing setting in run.json; `eval.shuffle_seed` only
          selects prompts, the store compares the selection instead), and the first n kept;
  scope   the draw is over the whole selection before the shards split it, so whether a sample is timed does not
          depend on which shard runs it, nor on the rerun: the shards of one run time what the unsharded run times.
A larger selection (a larger `eval.num_samples`) may rank a new sample into the first n, so the timed ids join the
run's settings (`with_timed`): a rerun that would time other samples is a different run, refused by the store.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..config import SHARD_VALID as VALID
from ..config import shard_is_valid as is_valid
from ..errors import check


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


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


# ------------------------------------------------------------------------------------ the timed subset
def timed_count(value, benchmark: str) -> int | None:
    """How many of `benchmark`'s samples `eval.timed_samples=value` times (None: all of them)."""
    return value.get(benchmark) if isinstance(value, dict) else value


def timed_rank(seed: int, benchmark: str, sample_id: str) -> str:
    """A sample's place in the seeded draw (smallest first): independent of the other samples and their order."""
    return hashlib.sha256(f"{seed}/{benchmark}/{sample_id}".encode()).hexdigest()


def timed_subset(samples, value, seed: int) -> dict[str, list[str]] | None:
    """{benchmark: [ids]} of the timed samples among `samples` (the unsharded selection), in the selection's order;
    None when `value` is null (every sample timed)."""
    if value is None:
        return None
    ids: dict[str, list[str]] = {}
    for s in samples:
        ids.setdefault(s.benchmark, []).append(s.id)
    out = {}
    for bench, names in ids.items():
        n = timed_count(value, bench)
        keep = set(names if n is None else sorted(names, key=lambda i: timed_rank(seed, bench, i))[:n])
        out[bench] = [i for i in names if i in keep]
    return out


def timed_members(timed: dict[str, list[str]] | None) -> set[tuple[str, str]] | None:
    """(benchmark, id) of every timed sample, or None when every sample is timed."""
    return None if timed is None else {(b, i) for b, ids in timed.items() for i in ids}


def with_timed(settings: dict, value, timed: dict[str, list[str]] | None) -> dict:
    """run.json's `settings` with the subset: unchanged when every sample is timed (so that the directories of runs
    made before the key existed still resume), else `eval.timed_samples` and `timed`, the timed ids."""
    if value is None:
        return settings
    return {**settings, "eval": {**settings["eval"], "timed_samples": value}, "timed": timed}
