"""One host synchronisation per greedy round. On a GPU every device-to-host read stalls the host until the queued
kernels finish, and a blocking host-to-device copy does too; the decode loop may read back only the verdict of each
round (the accepted count and the target's choices, in one copy). Without CUDA the syncs are counted through hooks
on everything that would be one: `item`, `tolist`, `cpu`, `numpy`, `int()`/`float()`/`bool()` of a tensor, a tensor
used as a Python index, `torch.equal`, and `torch.tensor`/`torch.as_tensor` of host data onto a device.

Counted between consecutive target forwards from the first block on, so each interval is one round: its
verification, the drafter's commit and the next proposal (the last interval: the last verification only)."""
from collections import Counter

import pytest
import torch

from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate

READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


class Syncs:
    def __init__(self, monkeypatch):
        self.n, self.where = 0, Counter()
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(torch, "equal", self._counted(torch.equal, "torch.equal"))
        for name in ("tensor", "as_tensor"):
            make = getattr(torch, name)

            def copy(data, *args, _make=make, _name=name, **kw):
                if kw.get("device") is not None and not isinstance(data, torch.Tensor):
                    self._count(f"torch.{_name}(host data, device=)")
                return _make(data, *args, **kw)
            monkeypatch.setattr(torch, name, copy)

    def _count(self, name):
        self.n += 1
        self.where[name] += 1

    def _counted(self, fn, name):
        def wrapper(*args, **kw):
            self._count(name)
            return fn(*args, **kw)
        return wrapper

    def per_round(self, target, drafter, ids, **dc) -> tuple[list[int], object]:
        """Syncs in each interval between target forwards, and the generation."""
        marks, forward = [], target.forward

        def marked(*args, **kw):
            marks.append(self.n)
            return forward(*args, **kw)
        target.forward = marked
        try:
            start = self.n
            gen = generate(target, drafter, ids, DecodeConfig(**dc))
        finally:
            del target.forward                                  # the class's method again
        marks = [m - start for m in marks] + [self.n - start]
        return [b - a for a, b in zip(marks[1:], marks[2:])], gen


CHAINS = [("none", ()), ("dflash", ()), ("dels_rnn", ()), ("dels_markov", ()), ("domino_ft", ()), ("eagle3", ()),
          ("dedit", ("drafter.edit.early_stop=false",))]


@pytest.mark.parametrize("name, extra", CHAINS, ids=[c[0] for c in CHAINS])
def test_a_greedy_chain_round_syncs_once_on_the_static_engine(name, extra, static, count_ids, cfg_factory, monkeypatch):
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random", *extra) if name != "none" else None
    drafter = registry.build_drafter(cfg.drafter, static) if cfg is not None else None
    syncs = Syncs(monkeypatch)
    counts, gen = syncs.per_round(static, drafter, count_ids, max_new_tokens=12)
    assert len(counts) == len(gen.accept_lengths) >= 3
    assert counts == [1] * len(counts), (counts, syncs.where)


def test_dedit_early_stop_reads_one_flag_per_pass(static, count_ids, cfg_factory, monkeypatch):
    """The early stop is a branch on the device's data: one read per editing pass, besides the verdict."""
    cfg = cfg_factory("drafter=dedit", "drafter.init=random", "drafter.edit.early_stop=true")
    drafter = registry.build_drafter(cfg.drafter, static)
    syncs = Syncs(monkeypatch)
    counts, gen = syncs.per_round(static, drafter, count_ids, max_new_tokens=10)
    passes = [r["passes"] for r in gen.rounds] + [0] * 2      # of each round's proposal (none where k = 0: the end)
    assert len(gen.rounds) >= 3 and counts == [1 + p for p in passes[1: len(counts) + 1]], (counts, passes)


def test_a_greedy_tree_round_syncs_twice(static, count_ids, cfg_factory, monkeypatch):
    """EAGLE-3's tree: the layout reads the tree's parents (its mask is built on the host and goes back without a
    blocking copy), the verdict is one copy (the target's choices with the tree's tokens), the accepted path goes back
    without a blocking copy. What the drafter's own tree search reads is counted apart (none)."""
    cfg = cfg_factory("drafter=eagle3", "drafter.init=random", "drafter.mode=tree")
    drafter = registry.build_drafter(cfg.drafter, static)
    syncs = Syncs(monkeypatch)
    propose = drafter.propose
    in_propose = []

    def counted_propose(*args, **kw):
        before = syncs.n
        out = propose(*args, **kw)
        in_propose.append(syncs.n - before)
        return out
    drafter.propose = counted_propose
    counts, gen = syncs.per_round(static, drafter, count_ids, max_new_tokens=12)
    assert in_propose[1:] == [0] * (len(in_propose) - 1)       # the first reads the prompt's token list
    layouts = [int(d > 0) for d in gen.drafted[1:]] + [0]      # the next round's tree (none where k = 0: the end)
    assert sum(layouts) >= 3 and counts == [1 + t for t in layouts], (counts, syncs.where)
