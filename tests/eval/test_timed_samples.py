"""`eval.timed_samples`: τ and the lossless check over every prompt, TPOT and speedup over a seeded subset
(eval/shards.py); what the records, the summary and run.json say about it."""
import json
import random
from statistics import fmean

import pytest
from conftest import TINY, make_cfg
from omegaconf import OmegaConf

from specexp.benchmarks import Sample
from specexp.config import EvalConfig
from specexp.decoding.engine import DecodeConfig
from specexp.errors import UserError
from specexp.eval import evaluator, metrics, shards
from specexp.eval.summary import summarize_records

GSM = [Sample(f"g{i}", "gsm8k", [f"q {i}"]) for i in range(10)]
MT = [Sample(f"m{i}", "mt_bench", [f"a {i}", f"b {i}"]) for i in range(6)]
CLOCK = ("tpot", "ttft", "ar_tpot", "ar_ttft")


def records(d):
    return [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------- the draw
def test_the_subset_is_a_seeded_draw_per_benchmark_in_selection_order():
    got = shards.timed_subset(GSM + MT, 3, seed=0)
    assert {b: len(ids) for b, ids in got.items()} == {"gsm8k": 3, "mt_bench": 3}
    for bench, pool in (("gsm8k", GSM), ("mt_bench", MT)):
        order = [s.id for s in pool]
        assert got[bench] == sorted(got[bench], key=order.index)           # listed in the selection's order
        ranked = sorted(order, key=lambda i: shards.timed_rank(0, bench, i))
        assert set(got[bench]) == set(ranked[:3])                          # the first 3 of the seeded ranking
    assert shards.timed_subset(GSM + MT, 3, seed=0) == got                        # a rerun draws the same
    shuffled = GSM + MT
    random.Random(1).shuffle(shuffled)
    assert {b: set(v) for b, v in shards.timed_subset(shuffled, 3, 0).items()} == {b: set(v) for b, v in got.items()}
    assert shards.timed_subset(GSM + MT, 3, seed=1) != got                        # another seed, another draw
    assert shards.timed_subset(GSM + MT, None, 0) is None and shards.timed_members(None) is None
    mapped = shards.timed_subset(GSM + MT, {"gsm8k": 2}, 0)                       # a benchmark not named: timed whole
    assert set(mapped["gsm8k"]) <= set(got["gsm8k"]) and len(mapped["gsm8k"]) == 2
    assert mapped["mt_bench"] == [s.id for s in MT]
    assert shards.timed_subset(GSM[:2], 5, 0) == {"gsm8k": ["g0", "g1"]}          # more than selected: all of them


def test_a_sample_is_timed_by_its_own_rank_among_the_selected():
    """A larger selection keeps a timed sample timed unless a new one outranks it (such a rerun is then refused by
    run.json's timed ids, never silently mixed)."""
    ranked = sorted((s.id for s in GSM), key=lambda i: shards.timed_rank(0, "gsm8k", i))
    five = {s.id for s in GSM[:5]}
    assert set(shards.timed_subset(GSM[:5], 2, 0)["gsm8k"]) == set([i for i in ranked if i in five][:2])
    assert set(shards.timed_subset(GSM, 2, 0)["gsm8k"]) == set(ranked[:2])


def test_run_settings_gain_the_subset_only_when_there_is_one():
    base = {"eval": {"max_new_tokens": 8}, "seed": 0}
    assert shards.with_timed(base, None, None) is base                      # runs made before the key still resume
    got = shards.with_timed(base, {"gsm8k": 1}, {"gsm8k": ["g3"]})
    assert got == {"eval": {"max_new_tokens": 8, "timed_samples": {"gsm8k": 1}}, "seed": 0,
                   "timed": {"gsm8k": ["g3"]}} and base == {"eval": {"max_new_tokens": 8}, "seed": 0}


@pytest.mark.parametrize("value", [None, 1, 40, {"gsm8k": 3}])
def test_valid_values(value):
    node = OmegaConf.to_container(make_cfg(TINY).eval)
    assert EvalConfig.from_cfg({**node, "timed_samples": value}).timed_samples == value


def test_the_presets_time_every_prompt():
    assert make_cfg(TINY).eval.timed_samples is None and make_cfg([*TINY, "eval=paper"]).eval.timed_samples is None


# ------------------------------------------------------------------------------------------- the summary
def rec(id, bench="b", turn=0, tpot=0.01, ar=0.02, timed_=None):
    r = {"id": id, "benchmark": bench, "turn": turn, "accept_lengths": [2], "drafted": [3], "new_tokens": 3,
         "tpot": tpot, "ar_tpot": ar, "ttft": 0.1, "lossless": True}
    if timed_ is not None:
        r["timed"] = timed_
        if not timed_:
            r.update(tpot=None, ar_tpot=None, ttft=None)
    return r


HEADER = {"target": "t", "drafter": "d", "mode": "online", "decoding": {"temperature": 0.0, "protocol": "greedy"},
          "max_new_tokens": 8, "num_draft_tokens": 3}


def test_speedup_tpot_and_their_cis_come_from_the_timed_records_alone():
    recs = [rec("p0", tpot=0.01, ar=0.03, timed_=True), rec("p1", timed_=False), rec("p2", tpot=0.02, ar=0.03,
                                                                                      timed_=True)]
    s = summarize_records(recs, ["b"], {**HEADER, "timed": {"samples": 2, "seed": 0}})
    b = s["benchmarks"]["b"]
    assert b["num_samples"] == 3 and b["timed_samples"] == 2 and b["tau"] == 2.0      # τ over every prompt
    assert b["speedup"] == pytest.approx(0.03 / 0.015) and b["tpot_ms"] == pytest.approx(15.0)
    assert b["speedup_ci95"] == metrics.speedup_ci95(recs) and b["speedup_ci95"][0] <= b["speedup"]
    assert s["timed"] == {"samples": 2, "seed": 0, "ids": {"b": ["p0", "p2"]}}
    assert s["macro"]["speedup_ci95"] is not None
    # a record flagged untimed never counts, even one that carries a clock's numbers (edited by hand)
    forged = [*recs[:1], {**recs[1], "tpot": 1.0, "ar_tpot": 0.001, "ttft": 9.0}, recs[2]]
    assert summarize_records(forged, ["b"], HEADER)["benchmarks"]["b"] == {**b}
    # a run that times every prompt says nothing about a subset; replay has no timing at all
    assert "timed" not in summarize_records([rec("p0"), rec("p1")], ["b"], HEADER)
    replay = summarize_records(recs, ["b"], {**HEADER, "mode": "replay", "timed": {"samples": 2, "seed": 0}})
    assert "timed" not in replay and not set(metrics.TIMING_KEYS) & (set(replay["benchmarks"]["b"])
                                                                    | set(replay["macro"]))


def test_speedup_ci_resamples_prompts_with_all_their_turns():
    """Each prompt's two turns sum to the same AR and drafter seconds: resampling prompts cannot move the speedup,
    resampling the turns one by one would."""
    recs = [r for i in range(8) for r in (rec(f"p{i}", turn=0, tpot=0.01, ar=0.03),
                                          rec(f"p{i}", turn=1, tpot=0.03, ar=0.01))]
    assert metrics.speedup(recs) == pytest.approx(1.0)
    assert metrics.speedup_ci95(recs) == pytest.approx([1.0, 1.0])
    per, macro = metrics.speedup_ci95s({"b": recs, "c": [rec("q", timed_=False)]})
    assert per == {"b": pytest.approx([1.0, 1.0]), "c": None} and macro == pytest.approx([1.0, 1.0])


# ------------------------------------------------------------------------------------------- one turn
@pytest.mark.parametrize("protocol,temperature,flag,ar_runs", [
    ("greedy", 0.0, False, True),       # outside the subset AR runs for the lossless check, its clock unread
    ("A", 1.0, False, False),           # at T > 0 AR would only be timed: not run outside the subset
    ("A", 1.0, True, True),
    ("greedy", 0.0, None, True),        # no subset: the record is what it was before the key existed
])
def test_a_turn_outside_the_subset_records_no_clock(tiny_target, tiny_dflash, protocol, temperature, flag, ar_runs):
    ev = EvalConfig.from_cfg(make_cfg(TINY).eval)
    dc = DecodeConfig(protocol, temperature, 4, tuple(tiny_target.stop_token_ids))
    (r,) = evaluator.run_sample(tiny_target, tiny_dflash, GSM[0], dc, ev, 0, None, flag)
    assert r.get("timed", "absent") == ("absent" if flag is None else flag)
    assert (r["ar_new_tokens"] is not None) == ar_runs
    assert (r["lossless"] is not None) == (protocol == "greedy")
    clock = [r[k] for k in CLOCK]
    assert all(v is None for v in clock) if flag is False else all(v is not None for v in clock)


# ------------------------------------------------------------------------------------------- task=eval
COMMON = [*TINY, "benchmark.names=[gsm8k,humaneval]", "eval.num_samples=3", "eval.max_new_tokens=6"]


def run(out, *overrides):
    return evaluator.run_eval(make_cfg([*COMMON, *overrides]), out)


@pytest.mark.slow
def test_a_run_times_its_subset_and_measures_tau_everywhere(tmp_path, monkeypatch):
    d = tmp_path / "run"
    s = run(d, "eval.timed_samples={gsm8k: 1}")
    recs = records(d)
    chosen = shards.timed_subset([Sample(r["id"], r["benchmark"], []) for r in recs], {"gsm8k": 1}, 0)
    assert {b: len(v) for b, v in chosen.items()} == {"gsm8k": 1, "humaneval": 3}
    run(tmp_path / "all")                                 # every prompt online and timed: the reference run
    online = {(r["id"], r["turn"]): r for r in records(tmp_path / "all")}
    for r in recs:
        inside = r["id"] in chosen[r["benchmark"]]
        assert r["timed"] is inside and r["tau"] is not None
        assert all((r.get(k) is not None) == inside for k in CLOCK), r
        # outside the subset τ comes from replay on the batched references: the online run's rounds exactly
        assert r["lossless"] is True if inside else (r["lossless"] is None and r["replayed"] is True)
        o = online[(r["id"], r["turn"])]
        assert r["accept_lengths"] == o["accept_lengths"] or r["near_tie_rounds"]
        assert r["text_sha256"] == o["text_sha256"]
    for bench, b in s["benchmarks"].items():            # the summary's speedup, recomputed from samples.jsonl
        t = [r for r in recs if r["benchmark"] == bench and r["timed"]]
        assert b["speedup"] == pytest.approx(fmean(r["ar_tpot"] for r in t) / fmean(r["tpot"] for r in t))
        assert b["tpot_ms"] == pytest.approx(1000 * fmean(r["tpot"] for r in t))
        assert b["timed_samples"] == len(chosen[bench]) and b["num_samples"] == 3
        assert b["speedup_ci95"] == metrics.speedup_ci95(t)
    assert s["timed"] == {"samples": {"gsm8k": 1}, "seed": 0, "ids": chosen}
    assert json.loads((d / "summary.json").read_text()) == s
    assert "| speedup | timed |" in (d / "summary.md").read_text()
    settings = json.loads((d / "run.json").read_text())["settings"]
    assert settings["eval"]["timed_samples"] == {"gsm8k": 1} and settings["timed"] == chosen

    # another subset is another run: refused, nothing touched; the same command resumes with nothing to run
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    with pytest.raises(UserError, match=r"different run \(eval.timed_samples: recorded unset, now 2; "
                                        r"eval.timed_samples.gsm8k: recorded 1, now unset; timed.gsm8k: recorded"):
        run(d, "eval.timed_samples=2")
    with pytest.raises(UserError, match=r"different run \(eval.timed_samples.gsm8k: recorded 1, now unset; timed"):
        run(d)
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"} == before
    calls, real = [], evaluator.run_sample
    monkeypatch.setattr(evaluator, "run_sample", lambda *a, **k: calls.append(a[2].id) or real(*a, **k))
    assert run(d, "eval.timed_samples={gsm8k: 1}") == s and calls == []


@pytest.mark.slow
def test_shards_time_what_the_unsharded_run_times_and_merge_says_so(tmp_path, monkeypatch):
    """Which samples are timed does not depend on the shard: the shards' timed flags are the unsharded run's, and
    the merged summary names the same timed prompts (no model decodes here: run_sample is a stand-in)."""
    seen = []

    def fake(target, drafter, sample, dc, ev, seed, round_metrics=None, flag=None):
        seen.append((sample.id, flag))
        clock = {"tpot": None, "ar_tpot": None, "ttft": None, "ar_ttft": None} if flag is False else {
            "tpot": 0.01, "ar_tpot": 0.02, "ttft": 0.1, "ar_ttft": 0.1}
        return [{"id": sample.id, "benchmark": sample.benchmark, "turn": t, "accept_lengths": [1], "drafted": [1],
                 "new_tokens": 2, "tau": 1.0, "lossless": True, **clock, "timed": flag}
                for t in range(len(sample.turns))]

    monkeypatch.setattr(evaluator, "run_sample", fake)
    full = run(tmp_path / "full", "eval.timed_samples=2")
    unsharded = dict(seen)
    seen.clear()
    for i in (0, 1):
        run(tmp_path / f"s{i}", "eval.timed_samples=2", f"eval.shard={i}/2")
    # 2 a benchmark, whichever shard holds them; under greedy decoding only they run online (the rest replay)
    assert dict(seen) == unsharded and len(seen) == 4 and all(unsharded.values())
    flags = {r["id"]: r["timed"] for i in (0, 1) for r in records(tmp_path / f"s{i}")}
    assert len(flags) == 6 and {i for i, f in flags.items() if f} == set(unsharded)
    from specexp.eval.merge import run_merge

    merged = run_merge(make_cfg([*TINY, "task=merge", f"merge.runs=[{tmp_path / 's0'},{tmp_path / 's1'}]"]),
                       tmp_path / "merged")
    assert merged["timed"] == full["timed"] and full["timed"]["seed"] == 0
    assert {b: v["timed_samples"] for b, v in merged["benchmarks"].items()} == {"gsm8k": 2, "humaneval": 2}
