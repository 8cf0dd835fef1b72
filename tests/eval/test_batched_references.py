"""Batched greedy generation (decoding/batch.py on the static engine) against the batch-1 references: the same
tokens for every row in float32 on the tiny target, with prompts of different lengths, two-turn samples whose second
prompt holds the first answer, rows that stop at different steps and a batch that shrinks in its tail; a batched
reference run interrupted mid-batch resumes without losing or repeating a reference."""
import json

import pytest
import torch

from specexp.benchmarks import Sample
from specexp.decoding.batch import generate_batched
from specexp.decoding.engine import DecodeConfig, generate
from specexp.errors import UserError
from specexp.eval import references, replay
from specexp.eval.references import SampleJob, compute_references

QUESTIONS = ["What is 2+3?", "Write a haiku about rivers, then explain it.", "Count to five.", "Hi",
             "Name three prime numbers and say why each is prime.", "Translate 'good morning' to French."]


def _samples():
    """Single-turn and two-turn samples with prompts of different lengths."""
    out = [Sample(f"s{i}", "gsm8k", [q]) for i, q in enumerate(QUESTIONS)]
    out += [Sample("m0", "mt_bench", ["Tell me a fact.", "Now another one, shorter."]),
            Sample("m1", "mt_bench", ["Say yes.", "Why?"])]
    return out


def _stops(target, samples, n):
    """Stop ids that end the answers at different steps: tokens the unstopped batch-1 answers produce at
    positions spread over the budget (a random-weight model rarely emits its real end-of-turn token)."""
    dc = DecodeConfig(max_new_tokens=n)
    seen = []
    for i, s in enumerate(samples[:4]):
        toks = generate(target, None, target.encode_chat([{"role": "user", "content": s.turns[0]}]), dc).tokens
        seen.append(toks[min(3 + 4 * i, n - 1)])
    return tuple(dict.fromkeys([*target.stop_token_ids, *seen]))


def _batch1(target, samples, dc):
    refs = {}
    compute_references(target, samples, dc, 1, lambda r: refs.__setitem__(r["key"], r))
    return refs


@pytest.fixture(scope="module")
def setting(tiny_target):
    samples = _samples()
    dc = DecodeConfig(max_new_tokens=20, stop_token_ids=_stops(tiny_target, samples, 20))
    return samples, dc, _batch1(tiny_target, samples, dc)


@pytest.mark.parametrize("batch", [2, 3, 5, 16])
def test_every_row_equals_its_batch_1_reference(tiny_target, setting, batch):
    samples, dc, ref = setting
    lengths = [len(t["tokens"]) for r in ref.values() for t in r["turns"]]
    assert len(set(lengths)) >= 3 and min(lengths) < dc.max_new_tokens     # rows do stop at different steps
    assert {t["stop_reason"] for r in ref.values() for t in r["turns"]} == {"stop", "length"}
    got, order = {}, []
    compute_references(tiny_target, samples, dc, batch, lambda r: (got.__setitem__(r["key"], r), order.append(r)))
    assert got == ref                                   # tokens, prompts (turn 2 holds turn 1's answer), stops
    assert len(order) == len(samples) and all(len(r["turns"]) == len(s.turns) for r, s in
                                              zip(sorted(order, key=lambda r: r["id"]),
                                                  sorted(samples, key=lambda s: s.id)))


def test_rows_refill_and_shrink(tiny_target, static):
    """More jobs than rows: every row is refilled as it finishes, then the tail shrinks the batch; the steps run
    are far fewer than the batch-1 engine's forwards."""
    dc = DecodeConfig(max_new_tokens=12)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(tiny_target.vocab_size, (n,), generator=g).tolist() for n in (4, 19, 7, 11, 2, 15, 9)]

    class Job:
        def __init__(self, p):
            self.p, self.out = p, None

        def next_prompt(self, previous):
            if previous is None:
                return self.p
            self.out = previous.tokens

    jobs, finished = [Job(p) for p in prompts], []
    steps = generate_batched(static, jobs, dc, 3, finished.append)
    assert sorted(map(id, finished)) == sorted(map(id, jobs))
    assert [j.out for j in jobs] == [generate(tiny_target, None, p, dc).tokens for p in prompts]
    assert steps < sum(len(j.out) - 1 for j in jobs) / 2


def test_sampling_is_refused(static):
    with pytest.raises(UserError, match="greedy"):
        generate_batched(static, [], DecodeConfig(protocol="B", temperature=1.0), 2, print)


@pytest.mark.slow
def test_an_interrupted_batched_run_resumes_without_losing_or_repeating(cfg_factory, tmp_path, monkeypatch):
    """The references task at batch 3, killed when the 9th prompt is asked for (some samples stored, three in
    flight); the rerun computes only what is missing, and the set equals a batch-1 run's (same fingerprint: the
    same store directory)."""
    base = ["task=replay", "benchmark=gsm8k", "eval.num_samples=7", "eval.max_new_tokens=10",
            "replay.references_only=true"]
    cache = f"paths.cache={tmp_path / 'c'}"
    real, asked = SampleJob.next_prompt, []

    def dying(self, previous):
        asked.append(self.sample.id)
        if len(asked) == 9:
            raise RuntimeError("killed")
        return real(self, previous)

    monkeypatch.setattr(SampleJob, "next_prompt", dying)
    with pytest.raises(RuntimeError, match="killed"):
        replay.run_replay(cfg_factory(*base, cache, "replay.batch_size=3"), tmp_path / "r")
    [store] = (tmp_path / "c" / "references").iterdir()
    kept = [json.loads(x)["key"] for x in (store / "references.jsonl").read_text().splitlines()]
    assert 0 < len(kept) < 7
    monkeypatch.setattr(SampleJob, "next_prompt", real)
    computed = []
    real_refs = references.compute_references
    monkeypatch.setattr(replay, "compute_references",
                        lambda t, samples, *a: computed.extend(samples) or real_refs(t, samples, *a))
    replay.run_replay(cfg_factory(*base, cache, "replay.batch_size=3"), tmp_path / "r")
    assert len(computed) == 7 - len(kept)
    lines = [json.loads(x) for x in (store / "references.jsonl").read_text().splitlines()]
    assert len(lines) == len({r["key"] for r in lines}) == 7
    replay.run_replay(cfg_factory(*base, f"paths.cache={tmp_path / 'b1'}", "replay.batch_size=1"), tmp_path / "r1")
    [one] = (tmp_path / "b1" / "references").iterdir()
    assert one.name == store.name                        # the batch size is not part of the fingerprint
    by_key = {json.loads(x)["key"]: json.loads(x) for x in (one / "references.jsonl").read_text().splitlines()}
    assert by_key == {r["key"]: r for r in lines}


def test_batch_size_auto_and_bad_values(cfg_factory, tiny_target):
    assert replay.reference_batch("auto", tiny_target) == replay.CPU_REFERENCE_BATCH
    assert replay.reference_batch(4, tiny_target) == 4
    for bad in (0, -1, "many", 1.5):
        with pytest.raises(UserError, match="replay.batch_size") as e:
            replay.run_replay(cfg_factory("task=replay", f"replay.batch_size={bad}"), "/nonexistent/never")
        assert "\n" not in str(e.value)
