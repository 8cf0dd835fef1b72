"""Batched speculation (decoding/batch_spec.py) against the batch-1 engine: every row's tokens and accept lengths equal
its batch-1 run in float32, for every registry drafter and for a drafter whose acceptance is ragged by design, with
prompts of different lengths, rows that stop at different rounds, two-turn samples and a batch that shrinks; protocol
B keeps the target's distribution at B = 4 (χ² against exact enumeration); trees are refused in one line."""
import zlib

import pytest
import torch

from helpers import STRONG, chi2_pvalue, exact_sequence_probs, micro_target
from specexp import registry
from specexp.benchmarks import Sample
from specexp.decoding.batch_spec import speculate_batched
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.base import Proposal
from specexp.errors import UserError
from specexp.eval.references import SampleJob, compute_references
from specexp.targets.static import StaticTarget

NAMES = [n for n, e in registry.DRAFTERS.items() if e.build is not None]


class Prompt:
    """A one-turn job (decoding/batch.py's protocol) that keeps its generation."""

    def __init__(self, ids):
        self.ids, self.gen = ids, None

    def next_prompt(self, previous):
        if previous is None:
            return self.ids
        self.gen = previous
        return None


class Turns(SampleJob):
    """A sample's turns as eval decodes them, each turn's generation kept."""

    def __init__(self, *a):
        super().__init__(*a)
        self.gens = []

    def next_prompt(self, previous):
        if previous is not None:
            self.gens.append(previous)
        return super().next_prompt(previous)


class RefDrafter:
    """Proposes the target's greedy continuation of each prompt (`refs`: prompt length -> answer tokens), each draft
    corrupted by a hash of (prompt length, position, draft): the same drafts whatever the batch, and acceptance that
    is ragged across rows and rounds. Keeps its prompt length as its state (one fork a row)."""

    name, tap_layers = "ref", (0,)

    def __init__(self, refs: dict, max_drafts: int, corrupt: float, vocab: int):
        self.refs, self.max_drafts, self.corrupt, self.vocab = refs, max_drafts, corrupt, vocab
        self.p = None

    def reset(self):
        self.p = None

    def prefill(self, taps):
        self.p = taps.shape[1]

    def commit(self, n, taps):
        assert taps.shape[1] == n + 1

    def propose(self, anchor, start, k, sampling):
        ref = self.refs[self.p]
        i = start - self.p
        assert ref[i] == anchor
        toks = (ref[i + 1: i + 1 + k] + [0] * k)[:k]
        for j in range(k):
            if zlib.crc32(f"{self.p}/{start}/{j}".encode()) % 1000 < 1000 * self.corrupt:
                toks[j] = (toks[j] + 1) % self.vocab
        return Proposal(torch.tensor(toks, dtype=torch.long))


def _samples():
    qs = ["What is 2+3?", "Write a haiku about rivers, then explain it.", "Count to five.", "Hi",
          "Name three prime numbers and say why each one of them is prime."]
    out = [Sample(f"s{i}", "gsm8k", [q]) for i, q in enumerate(qs)]
    # A long prompt taken by a refilled row: the batch's cache grows while other rows hold a verified block whose
    # accepted part they have not counted yet (a growth that kept only the counted positions lost it).
    out.insert(1, Sample("long", "gsm8k", ["Count these words: " + "river stone " * 30]))
    out.insert(4, Sample("longer", "gsm8k", ["Count these words: " + "river stone " * 120]))
    return out + [Sample("m0", "mt_bench", ["Tell me a fact.", "Now another one, shorter."])]


@pytest.fixture(scope="module")
def ragged(tiny_target):
    """Samples, a decode config whose stop ids end answers at different steps, and a RefDrafter over their turns."""
    t, samples = tiny_target, _samples()
    free = DecodeConfig(max_new_tokens=24)
    refs = {}
    compute_references(t, samples, free, 1, lambda r: refs.__setitem__(r["key"], r))
    answers = [tt["tokens"] for r in refs.values() for tt in r["turns"]]
    stops = tuple(dict.fromkeys(a[min(4 + 5 * i, 23)] for i, a in enumerate(answers[:3])))
    dc = DecodeConfig(max_new_tokens=24, stop_token_ids=stops)
    by_len = {}
    compute_references(t, samples, dc, 1, lambda r: by_len.update(
        {tt["prompt_len"]: tt["tokens"] for tt in r["turns"]}))
    assert len(by_len) == sum(len(s.turns) for s in samples)      # prompt lengths are distinct: the drafter's key
    return samples, dc, RefDrafter(by_len, 7, 0.3, t.vocab_size)


@pytest.mark.parametrize("batch", [2, 3, 5])
def test_ragged_rows_equal_their_batch_1_runs(tiny_target, static, ragged, batch):
    samples, dc, drafter = ragged
    one = {}
    for s in samples:
        job = Turns(tiny_target, s, dc)
        gen = None
        while (ids := job.next_prompt(gen)) is not None:
            gen = generate(tiny_target, drafter, ids, dc)
        one[s.id] = job.gens
    jobs, ended = [Turns(static, s, dc) for s in samples], []
    rounds = speculate_batched(static, drafter, jobs, dc, batch, ended.append)
    assert sorted(j.sample.id for j in ended) == sorted(one)
    lengths, accepts = set(), set()
    for job in jobs:
        for got, want in zip(job.gens, one[job.sample.id], strict=True):
            assert got.tokens == want.tokens and got.accept_lengths == want.accept_lengths, job.sample.id
            assert got.drafted == want.drafted and got.stop_reason == want.stop_reason
            lengths.add(len(got.tokens))
            accepts.update(got.accept_lengths)
    assert len(lengths) >= 3 and {1, 8} <= accepts and len(accepts) >= 4     # ragged stops and acceptance
    assert {g.stop_reason for gens in one.values() for g in gens} == {"stop", "length"}
    assert rounds < sum(len(g.accept_lengths) for gens in one.values() for g in gens)   # rows did share rounds


@pytest.fixture(scope="module")
def micro():
    """A random Qwen3 over 8 tokens: random drafters' argmax drafts often match its greedy tokens, so every drafter's
    acceptance is ragged across rows without training."""
    return micro_target(vocab=8, hidden=32, layers=2)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", NAMES)
def test_every_drafter_rows_equal_batch_1(cfg_factory, micro, name):
    extra = ["drafter.mode=chain"] if name == "eagle3" else ["drafter.block_size=6"]
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random", *STRONG.get(name, []), *extra)
    drafter = registry.build_drafter(cfg.drafter, micro)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 7, (n,), generator=g).tolist() for n in (3, 9, 5, 14, 7)]
    dc = DecodeConfig(max_new_tokens=30)
    one = [generate(micro, drafter, p, dc) for p in prompts]
    jobs = [Prompt(p) for p in prompts]
    speculate_batched(StaticTarget.of(micro), drafter, jobs, dc, 3, lambda j: None)
    for job, want in zip(jobs, one):
        assert job.gen.tokens == want.tokens and job.gen.accept_lengths == want.accept_lengths, name
    assert max(a for w in one for a in w.accept_lengths) > 1, name      # drafts were accepted


def test_trees_are_refused_at_batch(cfg_factory, tiny_target, static):
    cfg = cfg_factory("drafter=eagle3", "drafter.init=random", "drafter.mode=tree")
    drafter = registry.build_drafter(cfg.drafter, tiny_target)
    with pytest.raises(UserError, match="draft trees.*eval.batch_size=1"):
        speculate_batched(static, drafter, [Prompt([1, 2, 3])], DecodeConfig(max_new_tokens=4), 2, lambda j: None)


@pytest.mark.slow
@pytest.mark.parametrize("name, protocol", [("dflash", "B"), ("dels_rnn", "B"), ("dels_rnn", "block")])
def test_sampled_drafts_keep_the_target_distribution_at_batch_4(cfg_factory, name, protocol):
    """Four rows decode the same prompt side by side from one sampling stream; the first tokens' joint distribution
    is the target's (χ², as the batch-1 test in tests/drafters/test_matrix.py)."""
    t = micro_target()
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random", *STRONG.get(name, []))
    drafter = registry.build_drafter(cfg.drafter, t)
    steps, n_runs, temp = 3, 1500, 1.0
    dc = DecodeConfig(protocol=protocol, temperature=temp, max_new_tokens=steps + 1)
    jobs = [Prompt([0, 1]) for _ in range(n_runs)]
    speculate_batched(StaticTarget.of(t), drafter, jobs, dc, 4, lambda j: None, torch.Generator().manual_seed(99))
    counts, accepted = {}, 0
    for job in jobs:
        key = tuple(job.gen.tokens[:steps])
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(a - 1 for a in job.gen.accept_lengths)
    assert accepted > n_runs // 20, accepted
    pvalue = chi2_pvalue(exact_sequence_probs(t, [0, 1], steps, temp), counts, n_runs)
    assert pvalue > 1e-3, (name, protocol, pvalue)


def test_a_growth_mid_round_keeps_the_uncounted_blocks(tiny_target, static):
    """Row 0 ends early and takes a prompt that grows the batch's cache while row 1, the longest row, has written its
    round's block but not yet counted it: the growth must keep it (it once copied only the counted positions)."""
    t = tiny_target
    enc = lambda text: t.encode_chat([{"role": "user", "content": text}])      # noqa: E731
    prompts = [enc("Hi"), enc("Describe " + "a river " * 20), enc("Count: " + "stone " * 200)]
    free = DecodeConfig(max_new_tokens=16)
    stop = generate(t, None, prompts[0], free).tokens[2]                       # row 0's answer ends at its 3rd token
    dc = DecodeConfig(max_new_tokens=16, stop_token_ids=(stop,))
    want = [generate(t, None, p, dc) for p in prompts]
    assert len(want[0].tokens) == 3 and len(want[1].tokens) > 4          # row 0 ends while row 1 decodes on
    jobs, grown = [Prompt(p) for p in prompts], []
    real = static.grow_rows

    def grow(cache, end):
        if end > cache.capacity:
            grown.append(max(cache.lengths) == cache.lengths[1])
        return real(cache, end)

    static.grow_rows = grow
    try:
        speculate_batched(static, None, jobs, dc, 2, lambda j: None)
    finally:
        del static.grow_rows
    assert True in grown                                                  # the case: row 1 the longest at a growth
    for job, w in zip(jobs, want):
        assert job.gen.tokens == w.tokens


def test_grow_rows_keeps_positions_past_the_counted_length(static):
    """What a growth mid-round needs: a row's block written past its counted length survives the reallocation."""
    cache = static.new_rows_cache(2, 16)
    cache.lengths = [3, 9]
    with torch.inference_mode():
        cache.k[:, 1, :, 9:12] = 1.5                                      # row 1's verified block, not yet counted
        static.grow_rows(cache, 40)
    assert cache.capacity >= 40 and bool((cache.k[:, 1, :, 9:12] == 1.5).all())
