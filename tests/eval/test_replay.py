"""Replay gives the accept lengths the engine gives, round for round, without decoding: on oracle drafters that
are often right (long acceptances, stop tokens inside accepted blocks, the budget cap), on every real drafter class
(random init: the plumbing), end to end through the task against task=eval, and on the mini target (slow)."""
import json

import pytest
import torch

from helpers import OracleDrafter
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.errors import UserError
from specexp.eval.replay import replay_turn, teacher_forced

PROMPTS = ["Write a haiku about rivers.", "What is 2+3?", "def fib(n):"]


def reference(target, prompt, n, stops=()):
    ids = target.encode_chat([{"role": "user", "content": prompt}])
    return ids, generate(target, None, ids, DecodeConfig(max_new_tokens=n, stop_token_ids=tuple(stops))).tokens


def online_and_replay(target, make_drafter, ids, ref, dc):
    online = generate(target, make_drafter(), ids, dc)
    d = make_drafter()
    tf = teacher_forced(target, ids, ref, d.tap_layers if d is not None else ())
    gen, ties = replay_turn(d, ids, ref, tf, dc, near_tie=1e-3)
    return online, gen, ties


class TapRecorder(OracleDrafter):
    """The oracle, reading taps like a real drafter: records what prefill and commit hand it."""

    def __init__(self, *a, tap_layers=(1, 3), **kw):
        super().__init__(*a, **kw)
        self.tap_layers, self.seen = tap_layers, []

    def prefill(self, taps):
        self.seen.append(("prefill", taps.clone()))

    def commit(self, n, taps):
        assert taps.shape[1] == n + 1
        self.seen.append((n, taps.clone()))


@pytest.mark.parametrize("corrupt", [0.0, 0.2, 0.6])
@pytest.mark.parametrize("n", [1, 2, 9, 40])
def test_oracle_replay_equals_engine(tiny_target, corrupt, n):
    t = tiny_target
    ids, ref = reference(t, PROMPTS[0], n)
    dc = DecodeConfig(max_new_tokens=n)
    make = lambda: OracleDrafter(ref + [0] * 16, len(ids), 7, corrupt, t.vocab_size, seed=3)   # noqa: E731
    online, gen, _ = online_and_replay(t, make, ids, ref, dc)
    assert online.tokens == ref and gen.tokens == ref
    assert gen.accept_lengths == online.accept_lengths and gen.drafted == online.drafted
    if corrupt == 0.0 and n == 40:
        assert max(gen.accept_lengths) == 8             # full blocks: long acceptances are exercised


@pytest.mark.parametrize("stop_at", [0, 3, 8, 15])
@pytest.mark.parametrize("corrupt", [0.0, 0.3])
def test_stop_token_inside_an_accepted_block(tiny_target, stop_at, corrupt):
    t = tiny_target
    ids, free = reference(t, PROMPTS[1], 40)
    stop = free[stop_at]
    _, ref = reference(t, PROMPTS[1], 40, stops=[stop])
    dc = DecodeConfig(max_new_tokens=40, stop_token_ids=(stop,))
    make = lambda: OracleDrafter(free + [0] * 16, len(ids), 7, corrupt, t.vocab_size, seed=1)   # noqa: E731
    online, gen, _ = online_and_replay(t, make, ids, ref, dc)
    assert online.tokens == ref and gen.stop_reason == online.stop_reason == "stop"
    assert gen.accept_lengths == online.accept_lengths


def test_replay_hands_the_drafter_the_engines_taps(tiny_target):
    """prefill/commit receive the same positions as online; the values agree up to float rounding."""
    t = tiny_target
    ids, ref = reference(t, PROMPTS[2], 30)
    dc = DecodeConfig(max_new_tokens=30)
    make = lambda: TapRecorder(ref + [0] * 16, len(ids), 5, 0.25, t.vocab_size, seed=2)      # noqa: E731
    on, rp = make(), make()
    online = generate(t, on, ids, dc)
    gen, _ = replay_turn(rp, ids, ref, teacher_forced(t, ids, ref, rp.tap_layers), dc, near_tie=0.0)
    assert gen.accept_lengths == online.accept_lengths and max(gen.accept_lengths) > 2
    # replay skips the last round's commit (the turn is over; nothing reads it)
    assert [s[0] for s in rp.seen] == [s[0] for s in on.seen][: len(rp.seen)] and len(rp.seen) == len(on.seen) - 1
    for (_, a), (_, b) in zip(on.seen, rp.seen):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def _build(cfg_factory, target, name):
    small = {"dels_rnn": ["drafter.head.input_rank=16", "drafter.head.gru_hidden=32", "drafter.head.output_rank=16",
                          "drafter.head.init_std=0.5", "fusion.alpha=4.0", "fusion.beta=1.0"],
             "domino_ft": ["drafter.head.gru_hidden=32", "drafter.head.emb_dim=16", "drafter.head.init_std=0.5",
                           "drafter.head.guidance=3.0"],
             "dedit": ["drafter.edit.passes=2"]}
    small["dels_markov"] = small["dels_rnn"]
    return registry.build_drafter(cfg_factory(f"drafter={name}", "drafter.block_size=8", *small.get(name, [])).drafter,
                                  target)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dflash", "dels_rnn", "dels_markov", "domino_ft", "dedit"])
def test_every_drafter_replays_as_the_engine_runs(cfg_factory, tiny_target, name):
    t = tiny_target
    drafter = _build(cfg_factory, t, name)
    for prompt in PROMPTS[:2]:
        ids, ref = reference(t, prompt, 24)
        dc = DecodeConfig(max_new_tokens=24)
        online, gen, ties = online_and_replay(t, lambda: drafter, ids, ref, dc)
        assert online.tokens == ref
        assert gen.accept_lengths == online.accept_lengths or ties, (name, gen.accept_lengths, online.accept_lengths)
        assert [r["accepted"] for r in gen.rounds] == [r["accepted"] for r in online.rounds]


def test_no_drafter_replays_to_one_token_per_round(tiny_target):
    ids, ref = reference(tiny_target, PROMPTS[0], 12)
    tf = teacher_forced(tiny_target, ids, ref, ())
    gen, _ = replay_turn(None, ids, ref, tf, DecodeConfig(max_new_tokens=12), near_tie=0.0)
    assert gen.accept_lengths == [1] * 11 and gen.drafted == [0] * 11


def test_near_ties_are_flagged_by_the_threshold(tiny_target):
    t = tiny_target
    ids, ref = reference(t, PROMPTS[0], 20)
    tf = teacher_forced(t, ids, ref, ())
    assert (tf["argmax"] == torch.tensor(ref)).all()   # teacher forcing reproduces the greedy reference here
    dc = DecodeConfig(max_new_tokens=20)
    _, none = replay_turn(None, ids, ref, tf, dc, near_tie=0.0)
    _, every = replay_turn(None, ids, ref, tf, dc, near_tie=float("inf"))
    _, some = replay_turn(None, ids, ref, tf, dc, near_tie=float(tf["gap"][1:].median()))
    assert none == [] and every == list(range(19)) and 0 < len(some) < 19


# ------------------------------------------------------------------------------------------ the task
def _summary(d):
    return json.loads((d / "summary.json").read_text())


def _records(d):
    return [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_task_replay_equals_task_eval_turn_by_turn(cfg_factory, tmp_path):
    """Multi-turn too: turn 2 follows the target's own turn-1 answer in both."""
    from specexp.eval.evaluator import run_eval
    from specexp.eval.replay import run_replay

    common = ["benchmark=mt_bench", "eval.num_samples=2", "eval.max_new_tokens=16", "drafter.block_size=4",
              f"paths.cache={tmp_path / 'cache'}"]
    run_eval(cfg_factory(*common, "eval.run_ar=false"), tmp_path / "online")
    summary = run_replay(cfg_factory("task=replay", *common), tmp_path / "replay")
    on, rp = _records(tmp_path / "online"), _records(tmp_path / "replay")
    key = lambda r: (r["id"], r["turn"])                                                        # noqa: E731
    assert sorted(map(key, on)) == sorted(map(key, rp)) and {r["turn"] for r in rp} == {0, 1}
    on = {key(r): r for r in on}
    for r in rp:
        assert r["accept_lengths"] == on[key(r)]["accept_lengths"] or r["near_tie_rounds"]
        assert r["text_sha256"] == on[key(r)]["text_sha256"] and len(r["tokens"]) == r["new_tokens"]
        assert "tpot" not in r and "ttft" not in r
    assert summary["mode"] == "replay" and _summary(tmp_path / "online")["mode"] == "online"
    b = summary["benchmarks"]["mt_bench"]
    assert "speedup" not in b and "tpot_ms" not in b and "speedup" not in summary["macro"]
    lo, hi = b["tau_ci95"]
    assert lo <= b["tau"] <= hi and summary["macro"]["tau_ci95"] == [lo, hi]
    assert b["rounds"] == sum(len(r["accept_lengths"]) for r in rp)
    assert "τ 95% CI" in (tmp_path / "replay" / "summary.md").read_text()


@pytest.mark.slow
def test_references_are_cached_resumed_exported_and_imported(cfg_factory, tmp_path, monkeypatch):
    from specexp.eval import references, replay

    calls = []
    real = references.compute_reference
    monkeypatch.setattr(replay, "compute_reference", lambda *a: calls.append(a[1].id) or real(*a))
    base = ["task=replay", "benchmark=gsm8k", "eval.max_new_tokens=12", "drafter.block_size=4"]
    c1 = [*base, f"paths.cache={tmp_path / 'c1'}"]
    replay.run_replay(cfg_factory(*c1, "eval.num_samples=2"), tmp_path / "r1")
    assert len(calls) == 2
    export = tmp_path / "refs.json.gz"
    s3 = replay.run_replay(cfg_factory(*c1, "eval.num_samples=3", f"replay.export={export}"), tmp_path / "r3")
    assert len(calls) == 3                              # the first two came from the cache
    # another machine: an empty cache, the shipped file, a different drafter
    c2 = [*base, f"paths.cache={tmp_path / 'c2'}", f"replay.references={export}", "eval.num_samples=3"]
    s = replay.run_replay(cfg_factory(*c2, "drafter.seed=1"), tmp_path / "other")
    assert len(calls) == 3
    assert [r["tokens"] for r in _records(tmp_path / "other")] == [r["tokens"] for r in _records(tmp_path / "r3")]
    assert s["benchmarks"]["gsm8k"]["num_samples"] == s3["benchmarks"]["gsm8k"]["num_samples"] == 3
    # resuming the same run directory replays nothing again; a different drafter into it is refused
    before = (tmp_path / "r3" / "samples.jsonl").read_text()
    replay.run_replay(cfg_factory(*c1, "eval.num_samples=3"), tmp_path / "r3")
    assert (tmp_path / "r3" / "samples.jsonl").read_text() == before
    with pytest.raises(UserError, match="different run"):
        replay.run_replay(cfg_factory(*c1, "eval.num_samples=3", "drafter.seed=1"), tmp_path / "r3")
    # a reference file of another budget is refused in one line
    with pytest.raises(UserError, match="max_new_tokens"):
        replay.run_replay(cfg_factory(*c2, "eval.max_new_tokens=13"), tmp_path / "bad")


def test_sampling_protocols_are_refused(cfg_factory, tmp_path):
    from specexp.eval.replay import run_replay

    for d in ("sample_a", "sample_b"):
        with pytest.raises(UserError, match="greedy") as e:
            run_replay(cfg_factory("task=replay", f"decoding={d}"), tmp_path / d)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "sample_a").exists()


@pytest.mark.slow
def test_compare_two_replays(cfg_factory, tmp_path):
    from specexp.eval.compare import run_compare
    from specexp.eval.replay import run_replay

    base = ["task=replay", "benchmark=gsm8k", "eval.num_samples=3", "eval.max_new_tokens=12",
            f"paths.cache={tmp_path / 'c'}"]
    run_replay(cfg_factory(*base, "drafter.block_size=4"), tmp_path / "a")
    run_replay(cfg_factory(*base, "drafter=none"), tmp_path / "b")
    pair = lambda a, b: cfg_factory("task=compare", f"compare.a={tmp_path / a}", f"compare.b={tmp_path / b}")  # noqa
    run_compare(pair("a", "a"), tmp_path / "aa")
    same = json.loads((tmp_path / "aa" / "compare.json").read_text())
    g = same["benchmarks"]["gsm8k"]
    assert g["delta"] == 0 and g["delta_ci95"] == [0, 0] and g["ties"] == 1
    assert same["turns_with_different_outputs"] == 0
    run_compare(pair("a", "b"), tmp_path / "ab")
    ab = json.loads((tmp_path / "ab" / "compare.json").read_text())["benchmarks"]["gsm8k"]
    assert ab["tau_b"] == 1.0 and ab["delta"] == pytest.approx(ab["tau_a"] - 1.0) and ab["b_wins"] == 0
    assert "Δτ" in (tmp_path / "ab" / "compare.md").read_text()


# ------------------------------------------------------------------------------------- the mini target
@pytest.mark.slow
def test_mini_target_replay_equals_engine(cfg_factory):
    """SmolLM2-135M with the committed mini DFlash: replayed accept lengths equal the engine's, or a near-tie is
    flagged in that turn."""
    cfg = cfg_factory("target=smollm2_135m", "target.source=gguf", "drafter.init=auto")
    target = registry.build_target(cfg.target, torch.device("cpu"))
    drafter = registry.build_drafter(cfg.drafter, target)
    for prompt in ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                   "How many clips did Natalia sell altogether in April and May?", "def is_prime(n):"):
        ids, ref = reference(target, prompt, 48, stops=target.stop_token_ids)
        dc = DecodeConfig(max_new_tokens=48, stop_token_ids=tuple(target.stop_token_ids))
        online, gen, ties = online_and_replay(target, lambda: drafter, ids, ref, dc)
        assert online.tokens == ref
        assert gen.accept_lengths == online.accept_lengths or ties
        assert sum(gen.accept_lengths) == len(ref) - 1


def test_dflash_propose_all_equals_propose_after_commits(tiny_target, tiny_dflash):
    """The optional batched method: every anchor's drafts equal the protocol loop's (rows past the first draft that
    differs from the sequence are -1), including full blocks when the sequence continues with the drafts."""
    t, d = tiny_target, tiny_dflash
    ids, ref = reference(t, PROMPTS[0], 20)
    tf = teacher_forced(t, ids, ref, d.tap_layers)
    seq, p, k = ids + ref, len(ids), d.max_drafts
    loop = []
    for j in range(len(ref) - 1):                       # the loop, committing one position per round
        d.reset()
        d.prefill(tf["taps"][:, : p + j])
        loop.append(d.propose(seq[p + j], p + j, k, None).tokens.tolist())
    starts = p + torch.arange(len(ref) - 1)
    every = d.propose_all(tf["taps"], torch.tensor(seq), starts, torch.full((len(ref) - 1,), k), chunk=7).tolist()
    for j, (a, b) in enumerate(zip(every, loop)):
        m = next((i for i in range(k) if b[i] != seq[p + j + 1 + i]), k)
        assert a[: m + 1] == b[: m + 1] and all(x == -1 for x in a[m + 1:])
    for j in (0, 5, 17):                                # a sequence that goes on with the drafts: every row computed
        own = torch.tensor(seq[: p + j + 1] + loop[j])
        row = d.propose_all(tf["taps"][:, : p + j], own, torch.tensor([p + j]), torch.tensor([k]))
        assert row[0].tolist() == loop[j]


@pytest.mark.parametrize("n", [2, 9, 30])
def test_batched_replay_equals_the_loop_and_the_engine(tiny_target, tiny_dflash, n):
    t, d = tiny_target, tiny_dflash
    ids, ref = reference(t, PROMPTS[1], n)
    dc = DecodeConfig(max_new_tokens=n)
    tf = teacher_forced(t, ids, ref, d.tap_layers)
    batched, _ = replay_turn(d, ids, ref, tf, dc, near_tie=0.0, batched=True)
    loop, _ = replay_turn(d, ids, ref, tf, dc, near_tie=0.0, batched=False)
    online = generate(t, d, ids, dc)
    assert batched.accept_lengths == loop.accept_lengths == online.accept_lengths
    assert batched.drafted == online.drafted
