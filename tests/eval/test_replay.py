"""Replay gives the accept lengths the engine gives, round for round, without decoding: on oracle drafters that
are often right (long acceptances, stop tokens inside accepted blocks, the budget cap), on every real drafter class
(random init: the plumbing), end to end through the task against task=eval, and on the mini target (slow)."""
import json
from pathlib import Path

import pytest
import torch

from helpers import STRONG, OracleDrafter, ScriptedTarget, follow_script, micro_target
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters import dedit
from specexp.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashDraftModel
from specexp.drafters.layers import init_weights
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


@pytest.mark.parametrize("cap", [1, 2, 5])
def test_replay_under_a_draft_cap_equals_the_engine(tiny_target, cap):
    t = tiny_target
    ids, ref = reference(t, PROMPTS[2], 40)
    dc = DecodeConfig(max_new_tokens=40, max_drafts=cap)
    make = lambda: OracleDrafter(ref + [0] * 16, len(ids), 7, 0.3, t.vocab_size, seed=2)   # noqa: E731
    online, gen, _ = online_and_replay(t, make, ids, ref, dc)
    assert online.tokens == ref and gen.accept_lengths == online.accept_lengths and gen.drafted == online.drafted
    assert max(gen.drafted) == cap


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
        tf = teacher_forced(t, ids, ref, drafter.tap_layers)
        fast, _ = replay_turn(drafter, ids, ref, tf, dc, near_tie=1e-3, batched=True)      # propose_all
        assert fast.accept_lengths == gen.accept_lengths and _rounds(fast) == _rounds(gen), name


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
@pytest.mark.parametrize("cap", [None, 2])
def test_task_replay_equals_task_eval_turn_by_turn(cfg_factory, tmp_path, cap):
    """Multi-turn too: turn 2 follows the target's own turn-1 answer in both; under eval.max_drafts as well."""
    from specexp.eval.evaluator import run_eval
    from specexp.eval.replay import run_replay

    common = ["benchmark=mt_bench", "eval.num_samples=2", "eval.max_new_tokens=16", "drafter.block_size=4",
              f"paths.cache={tmp_path / 'cache'}", *([f"eval.max_drafts={cap}"] if cap else [])]
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
    assert summary["num_draft_tokens"] == _summary(tmp_path / "online")["num_draft_tokens"] == (cap or 3)
    assert max(d for r in rp for d in r["drafted"]) == (cap or 3)
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
    real = references.compute_references
    monkeypatch.setattr(replay, "compute_references",
                        lambda t, samples, *a: calls.extend(s.id for s in samples) or real(t, samples, *a))
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


# ------------------------------------------------------------------------ batched replay: propose_all
HEAD = STRONG["dels_rnn"][:4]                           # small ranks, a loud random head (no fusion weights)
VARIANTS = {                                            # config overrides, block size 8 (K = 7; shifted Domino 8)
    "dflash": [],
    "dels_rnn": ["drafter=dels_rnn", *STRONG["dels_rnn"]],
    "dels_markov": ["drafter=dels_markov", *STRONG["dels_markov"]],
    "dels_rnn-fusion_off": ["drafter=dels_rnn", *HEAD, "fusion=off"],
    "dels_markov-per_draft": ["drafter=dels_markov", *HEAD, "fusion.alpha=[4.0,0.0,2.0,8.0,1.0,3.0]",
                              "fusion.beta=[1.0,0.0,2.0,0.5,0.0,1.0]"],       # as fusion=learned reads them
    "domino_ft": ["drafter=domino_ft", *STRONG["domino_ft"]],
    "domino_ft-shifted": ["drafter=domino_ft", *STRONG["domino_ft"], "drafter.head.alignment=shifted"],
}
DEDIT = {                                               # DEditDrafter options on a loud random backbone
    "dedit": dict(passes=2),
    "dedit-threshold": dict(passes=3, rule="threshold", threshold=0.3),           # early stops after 1, 2, 3
    "dedit-low_confidence-causal": dict(passes=3, rule="low_confidence", confidence=0.3, editor="causal"),
    "dedit-window": dict(passes=3, window=9, verify=5),                             # W > K: right context
    "dedit-no_early_stop": dict(passes=3, rule="threshold", threshold=0.3, early_stop=False),
}


@pytest.fixture(scope="module")
def micro():
    """A random Qwen3 with a 2048-token vocabulary: the drafters' vocabulary projections (the bulk of their work)
    cost 1/74 of tiny_qwen3's, so every variant runs in the fast lane; the code paths are the same."""
    return micro_target(vocab=2048, hidden=32, layers=2)


def _variant(cfg_factory, t, name):
    if name in DEDIT:
        model = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 8, None)), 0, 0.3)
        return dedit.DEditDrafter(DFlashDrafter(model.eval().requires_grad_(False), t), **DEDIT[name])
    return registry.build_drafter(cfg_factory(*VARIANTS[name], "drafter.block_size=8").drafter, t)


def _prompt(seed: int) -> list[int]:
    return torch.randint(0, 2047, (12,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", [*VARIANTS, *DEDIT])
def test_propose_all_equals_propose_at_every_anchor(cfg_factory, micro, name):
    """The optional batched method: at every anchor, under a random budget, the drafts equal what propose returns
    after prefill of the context (rows past the first draft that differs from the sequence are -1; DEdit: every
    row, and the round info). On a sequence that follows the drafter, so rows deep in the block (and the batched
    loop states behind them) are compared, across chunk boundaries."""
    t = micro
    d = _variant(cfg_factory, t, name)
    prompt = _prompt(0)
    seq = follow_script(t, d, prompt, 40, seed=1)
    p, k_max = len(prompt), d.max_drafts
    _, taps = t.forward(torch.tensor([seq[:-1]]), 0, t.new_cache(), taps=d.tap_layers)
    ks = torch.randint(0, k_max + 1, (len(seq) - p - 1,), generator=torch.Generator().manual_seed(0))
    ks[::2] = k_max
    out = d.propose_all(taps, torch.tensor(seq), p + torch.arange(len(ks)), ks, chunk=5)
    every, infos = out if isinstance(out, tuple) else (out, None)
    assert (infos is not None) == (name in DEDIT) and every.shape == (len(ks), k_max)
    depth, passes = [], []
    for j, k in enumerate(ks.tolist()):
        s, got = p + j, every[j].tolist()
        if k == 0:                                      # the engine does not propose there
            assert got == [-1] * k_max and (infos is None or infos[j] is None)
            continue
        d.reset()
        d.prefill(taps[:, :s])
        prop = d.propose(seq[s], s, k, None)
        loop = prop.tokens.tolist()
        m = next((i for i in range(k) if loop[i] != seq[s + 1 + i]), k)                # drafts equal to the sequence
        depth.append(m)
        if infos is None:
            assert got[: min(m + 1, k)] == loop[: m + 1] and got[m + 1:] == [-1] * (k_max - m - 1), (j, got, loop)
        else:
            assert got[:k] == loop and infos[j]["passes"] == prop.info["passes"], (j, got, loop, infos[j])
            assert torch.equal(infos[j]["pre_edit"], prop.info["pre_edit"])
            passes.append(prop.info["passes"])
    assert max(depth) >= 5 and sum(m >= 3 for m in depth) >= 3, depth    # deep rows were compared
    if name == "dedit-threshold":                       # blocks leave the batch at different passes
        assert set(passes) == {1, 2, 3}, passes


def _rounds(gen):
    return [{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in gen.rounds]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", [*VARIANTS, *DEDIT])
def test_batched_replay_equals_the_loop_and_the_engine(cfg_factory, micro, name):
    """Turn by turn, through the real engine and the real replay, with a target whose greedy output follows the
    drafter (acceptance goes deep): the accept lengths, drafts per round and DEdit's round info and edit metrics
    of batched replay equal the protocol loop's and the online engine's, under budget caps (a budget of 2: no
    drafts at all; partial blocks at the end) and stop tokens (the first token, inside accepted drafts, a bonus)."""
    t = micro
    d = _variant(cfg_factory, t, name)
    prompt = _prompt(2)
    script = follow_script(t, d, prompt, 40, seed=2)
    target, cont = ScriptedTarget(t, script), script[len(prompt):]
    full = generate(target, d, prompt, DecodeConfig(max_new_tokens=40))
    assert full.tokens == cont and max(full.accept_lengths) >= 6, full.accept_lengths
    if name == "dedit-threshold":                       # blocks leave the batch at different passes
        assert {r["passes"] for r in full.rounds} == {1, 2, 3}, full.rounds
    # stops (first occurrences in the output): the first token, an accepted draft followed by more accepted
    # drafts (online verification accepts past it, replay truncates there), a later round's bonus
    ends = [sum(full.accept_lengths[: i + 1]) for i in range(len(full.accept_lengths))]     # bonus index in cont
    first = [i for i in range(len(cont)) if cont[i] not in cont[:i]]
    inside = [i for e, n in zip(ends, full.accept_lengths) for i in range(e - n + 1, e - 1) if i in first]
    bonus = [e for e in ends[2:] if e in first]
    assert inside and bonus, (full.accept_lengths, cont)
    cases = [(40, ()), (2, ()), (13, ()), (40, (cont[0],)), (40, (cont[inside[0]],)), (40, (cont[bonus[0]],))]
    metrics = registry.drafter_entry("dedit").metrics
    for n, stops in cases:
        dc = DecodeConfig(max_new_tokens=n, stop_token_ids=stops)
        online = generate(target, d, prompt, dc)
        ref = cont[:n]
        ref = ref[: next((i + 1 for i, x in enumerate(ref) if x in stops), n)]
        assert online.tokens == ref, (n, stops)
        tf = teacher_forced(target, prompt, ref, d.tap_layers)
        batched, ties = replay_turn(d, prompt, ref, tf, dc, near_tie=0.5, batched=True)
        loop, _ = replay_turn(d, prompt, ref, tf, dc, near_tie=0.5, batched=False)
        assert ties == [], "a scripted target has no near-ties: every difference would be a bug"
        assert batched.accept_lengths == loop.accept_lengths == online.accept_lengths, (n, stops)
        assert batched.drafted == loop.drafted == online.drafted
        assert _rounds(batched) == _rounds(loop)
        if name not in DEDIT:
            assert batched.rounds == []
            continue
        assert len(batched.rounds) == len(online.rounds) == sum(k > 0 for k in online.drafted)
        for a, b in zip(_rounds(batched), _rounds(online)):
            assert (a["passes"], a["pre_edit"], a["tokens"]) == (b["passes"], b["pre_edit"], b["tokens"])
        assert metrics.turn(batched.rounds, True) == metrics.turn(loop.rounds, True)
        # Online verification may accept drafts past the final stop token, which no reference can show (it ends
        # there): the edit outcome of that last round is replay's own.
        last = len(online.rounds) - (online.stop_reason == "stop")
        assert (metrics.turn(batched.rounds, True)["edit_outcomes"][:last] ==
                metrics.turn(online.rounds, True)["edit_outcomes"][:last])


def test_archived_runs_load_from_gzipped_samples():
    """The committed mini replay runs keep `samples.jsonl.gz`: task=compare and experiments/replay_tau.py read it,
    and pairing a run with itself gives its own summary's τ with Δτ = 0 (single-turn benchmarks)."""
    from specexp.eval.compare import compare, load_records

    run = Path(__file__).resolve().parents[2] / "experiments" / "results" / "replay_mini" / "replay50" / "dflash"
    summary = json.loads((run / "summary.json").read_text())
    records = load_records(run)
    assert len(records) == sum(b["num_turns"] for b in summary["benchmarks"].values())
    result = compare(records, records)
    for name in ("gsm8k", "aime25"):
        assert result["benchmarks"][name]["tau_a"] == pytest.approx(summary["benchmarks"][name]["tau"], abs=1e-9)
        assert result["benchmarks"][name]["delta"] == 0


def test_cached_taps_of_more_layers_serve_a_subset(tiny_target, tmp_path):
    """A drafter tapping fewer layers (EAGLE-3's three of DFlash's five) reads the columns of the cached wider
    taps of the same turn: equal to its own teacher-forced pass, and nothing new is written."""
    from specexp.eval.replay import _tap_file, cached_teacher_forced

    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": "Name three rivers."}])
    ref = generate(t, None, ids, DecodeConfig(max_new_tokens=12)).tokens
    wide = _tap_file(tmp_path, "h", (0, 1, 3), "k", 0)
    cached_teacher_forced(t, ids, ref, (0, 1, 3), wide)
    narrow = _tap_file(tmp_path, "h", (3, 0), "k", 0)
    got = cached_teacher_forced(t, ids, ref, (3, 0), narrow)
    own = teacher_forced(t, ids, ref, (3, 0))
    torch.testing.assert_close(got["taps"], own["taps"])
    assert torch.equal(got["argmax"], own["argmax"]) and not narrow.exists()
    assert cached_teacher_forced(t, ids, ref, (2,), _tap_file(tmp_path, "h", (2,), "k", 0))["taps"].shape[-1] \
        == t.hidden_size                                       # a layer not cached: computed
