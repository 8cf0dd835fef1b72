"""`task=plan`: the projected device time of a run from a calibration of step costs (eval/plan.py): the formulas on
a hand-made calibration, a CPU calibration of the tiny target written and read back, the assumptions taken from a
shipped reference set, and bad input refused in one line with nothing written."""
import gzip
import json

import pytest

from specexp.benchmarks import Sample
from specexp.calibration import calibration_fault, read_calibration
from specexp.errors import UserError
from specexp.eval import plan

CAL = {"version": 1, "target": "t", "machine": {"device": "cuda", "gpu": "H100"}, "prefill_ms_per_token": 0.01,
       "teacher_forced_ms_per_token": 0.02, "ar_step_ms": {"1": 10.0, "8": 12.0, "32": 20.0},
       "verify_ms": {"2": 10.0, "16": 11.0},
       "drafters": {"dflash": {"max_drafts": 15, "taps": [1, 2], "propose_ms": 2.0, "replay_anchor_ms": 0.1},
                    "dels_rnn": {"max_drafts": 15, "taps": [1, 2], "propose_ms": 4.0, "replay_anchor_ms": 0.3}}}


def test_the_projection_is_the_documented_sum_of_step_costs():
    samples = [Sample("a", "gsm8k", ["x" * 35]), Sample("b", "gsm8k", ["x" * 35]),
               Sample("m", "mt_bench", ["x" * 70, "x" * 35])]
    work = plan.workload(samples, {"gsm8k": 101.0, "mt_bench": 51.0}, {"gsm8k": ["a"], "mt_bench": ["m"]})
    g, m = work
    assert (g.turns, g.prompt_tokens, g.timed_turns) == (2, 10.0, 1)
    assert (m.turns, m.prompt_tokens, m.timed_turns) == (2, (20 + (20 + 51 + 10)) / 2, 2)   # turn 2 holds turn 1
    rows = {(r["stage"], r["drafter"]): r["seconds"] for r in
            plan.project(CAL, work, ["none", "dflash", "dels_rnn"], {"dflash": 5.0, "dels_rnn": 6.0}, batch=4)}
    step = (10 + (12 - 10) * 3 / 7) / 4                                  # batch 4: between the 1- and 8-row steps
    refs = 2 * (0.01 * 10 + 100 * step) + 2 * (0.01 * 50.5 + 50 * step)
    assert rows[("references", "none")] == pytest.approx(refs / 1000)
    tf = 2 * 0.02 * (10 + 101) + 2 * 0.02 * (50.5 + 51)
    assert rows[("replay", "dflash")] == pytest.approx((tf + 0.1 * (2 * 101 + 2 * 51)) / 1000)
    assert rows[("replay", "dels_rnn")] == pytest.approx(0.3 * (2 * 101 + 2 * 51) / 1000)   # taps shared
    ar = 1 * (0.01 * 10 + 100 * 10) + 2 * (0.01 * 50.5 + 50 * 10)
    assert rows[("timed", "none")] == pytest.approx(ar / 1000)
    rnd = 11 + 2                                                          # verify of 16 rows + a proposal
    own = 1 * (0.01 * 10 + 100 / 5 * rnd) + 2 * (0.01 * 50.5 + 50 / 5 * rnd)
    assert rows[("timed", "dflash")] == pytest.approx((ar + own) / 1000)
    assert plan.best_batch(CAL) == 32 and plan._per_batch(CAL["ar_step_ms"], 64) == 40.0
    with pytest.raises(UserError, match="no step costs for drafter eagle3"):
        plan.project(CAL, work, ["eagle3"], {"eagle3": 2.0}, 1)


def test_task_plan_calibrates_the_cpu_and_reads_its_file_back(cfg_factory, tmp_path, monkeypatch):
    base = ["task=plan", "plan.drafters=[none,dflash]", "eval.max_new_tokens=16", "plan.batches=[1,4]",
            "plan.context=32", "benchmark=gsm8k"]
    first = plan.run_plan(cfg_factory(*base), tmp_path / "a")
    cal = json.loads((tmp_path / "a" / "calibration.json").read_text())
    assert set(cal["ar_step_ms"]) == {"1", "4"} and "dflash" in cal["drafters"] and cal["machine"]["device"] == "cpu"
    assert [(r["stage"], r["drafter"]) for r in first["rows"]] == [("references", "none"), ("replay", "dflash"),
                                                                  ("timed", "none"), ("timed", "dflash")]
    md = (tmp_path / "a" / "plan.md").read_text()
    assert "**total**" in md and "an upper bound" in md and "τ of the timed rounds: dflash 2" in md
    monkeypatch.setattr(plan, "calibrate", lambda *a, **k: pytest.fail("a calibration file was given"))
    again = plan.run_plan(cfg_factory(*base, f"plan.calibration={tmp_path / 'a' / 'calibration.json'}",
                                      "plan.tau=3"), tmp_path / "b")
    assert not (tmp_path / "b" / "calibration.json").exists()
    assert again["rows"][:3] == first["rows"][:3]                          # τ changes the drafter's timed row only
    assert again["rows"][3]["seconds"] < first["rows"][3]["seconds"]


def test_answer_tokens_come_from_a_shipped_reference_set(tmp_path):
    f = tmp_path / "refs.json.gz"
    refs = [{"benchmark": "gsm8k", "turns": [{"tokens": [1] * 10}, {"tokens": [1] * 30}]}]
    with gzip.open(f, "wt") as fh:
        json.dump({"manifest": {}, "references": refs}, fh)
    got, where = plan.answer_tokens_of(None, ["gsm8k", "mbpp"], 128, str(f))
    assert got == {"gsm8k": 20.0, "mbpp": 128.0} and "replay.references" in where
    assert plan.answer_tokens_of({"mbpp": 7}, ["gsm8k", "mbpp"], 128, None)[0] == {"gsm8k": 128.0, "mbpp": 7.0}
    with pytest.raises(UserError, match="not a reference file"):
        plan.answer_tokens_of(None, ["gsm8k"], 128, str(tmp_path))


@pytest.mark.parametrize("over, message", [
    (["plan.calibration=/nonexistent/cal.json"], "plan.calibration='/nonexistent/cal.json': no such file"),
    (["plan.drafters=[]"], "plan.drafters"),
    (["plan.tau=0.5"], "plan.tau"),
    (["plan.batches=[0]"], "plan.batches"),
])
def test_bad_input_is_one_line_and_writes_nothing(cfg_factory, tmp_path, over, message):
    from specexp.tasks import run_task

    with pytest.raises(UserError, match=message) as e:
        run_task(cfg_factory("task=plan", *over), str(tmp_path / "run"), job={"choices": {}, "overrides": over})
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "plan.json").exists()


def test_a_file_that_is_not_a_calibration_is_refused(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"version": 1, "ar_step_ms": {}}))
    with pytest.raises(UserError, match="not a calibration file"):
        read_calibration(bad)
    bad.write_text("{")
    with pytest.raises(UserError, match="not a calibration file"):
        read_calibration(bad)


def _damaged(change):
    """CAL (with two contexts and two measured lengths, as `calibrate` writes it) with `change(cal)` applied."""
    cal = json.loads(json.dumps({**CAL, "context": 100, "context_long": 200, "prefill_ms": {"100": 1.0, "200": 3.0},
                                 "ar_step_ms_long": {"1": 14.0, "8": 20.0, "32": 30.0}}))
    change(cal)
    return cal


def _set(path, value):
    def change(cal):
        *parents, last = path.split(".")
        node = cal
        for p in parents:
            node = node[p]
        node[last] = value
    return change


# issue #59 rows 4 and 5: each was an internal error or a printed plan of nan (or negative) hours
DAMAGED = [
    ("string_cost", _set("ar_step_ms.1", "10"), "ar_step_ms['1'] is \"10\"; expected ms, a finite number > 0"),
    ("string_per_token", _set("prefill_ms_per_token", "0.01"), "prefill_ms_per_token is \"0.01\"; expected ms"),
    ("empty_steps", _set("ar_step_ms", {}), "ar_step_ms is {}; expected a non-empty mapping {batch size: ms}"),
    ("list_steps", _set("ar_step_ms", [1, 2]), "ar_step_ms is [1, 2]; expected a non-empty mapping"),
    ("drafter_empty", _set("drafters.dflash", {}), "drafters.dflash.max_drafts is null; expected an int >= 1"),
    ("same_contexts", _set("context_long", 100), "context_long=100 is not longer than context=100"),
    ("one_prefill_length", _set("prefill_ms", {"100": 1.0}), "prefill_ms has 1 length(s); expected 2"),
    ("key_abc", _set("ar_step_ms.abc", 3.0), "ar_step_ms has the key 'abc'; expected batch sizes, ints >= 1"),
    ("max_drafts_str", _set("drafters.dflash.max_drafts", "many"), "drafters.dflash.max_drafts is \"many\""),
    ("verify_0", _set("verify_ms", {"0": 1}), "verify_ms has the key '0'; expected verified row counts"),
    ("nan_step", _set("ar_step_ms.8", float("nan")), "ar_step_ms['8'] is nan; expected ms, a finite number > 0"),
    ("negative_step", _set("ar_step_ms.32", -200.0), "ar_step_ms['32'] is -200.0; expected ms"),
    ("huge_step", _set("verify_ms.16", 1e308), "verify_ms['16'] is 1e+308; expected ms, a finite number > 0 and at "
                                               "most 3.6e+06"),
    ("max_drafts_0", _set("drafters.dflash.max_drafts", 0), "drafters.dflash.max_drafts is 0; expected an int >= 1"),
    ("batch_0", _set("ar_step_ms.0", 5.0), "ar_step_ms has the key '0'; expected batch sizes, ints >= 1"),
    ("negative_propose", _set("drafters.dflash.propose_ms", -1), "drafters.dflash.propose_ms is -1; expected ms"),
    ("machine_str", _set("machine", "cpu"), "machine is \"cpu\"; expected a mapping"),
    ("not_an_object", lambda cal: cal.clear() or cal.update(version=1), "no ar_step_ms, prefill_ms_per_token"),
]


@pytest.mark.parametrize("change, why", [d[1:] for d in DAMAGED], ids=[d[0] for d in DAMAGED])
def test_a_damaged_calibration_is_refused_by_the_field_before_any_work(cfg_factory, tmp_path, monkeypatch, change,
                                                                         why):
    """One line 'FILE is not a calibration file: <field> <why>', from config.validate: nothing read or written."""
    from specexp import benchmarks
    from specexp.tasks import run_task

    f = tmp_path / "cal.json"
    f.write_text(json.dumps(_damaged(change)))
    monkeypatch.setattr(benchmarks, "from_config", lambda *a, **k: pytest.fail("work before the calibration check"))
    over = ["task=plan", "plan.drafters=[none,dflash]", f"plan.calibration={f}"]
    with pytest.raises(UserError) as e:
        run_task(cfg_factory(*over), str(tmp_path / "run"), job={"choices": {}, "overrides": over})
    assert str(e.value).startswith(f"plan.calibration={str(f)!r} is not a calibration file: ") and why in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()
    assert calibration_fault(_damaged(lambda cal: None)) is None          # the same file, undamaged, reads


def test_a_missing_calibration_is_refused_by_validate(cfg_factory):
    """Issue #59 row 6: refused with the config, not after the benchmarks were read (40-56 s on a busy machine)."""
    from specexp.config import validate

    with pytest.raises(UserError, match=r"^plan.calibration='/nonexistent/cal.json': no such file"):
        validate(cfg_factory("task=plan", "plan.calibration=/nonexistent/cal.json"), job={})
    with pytest.raises(UserError, match=r"^plan.answer_tokens=1e\+300 is not valid"):
        validate(cfg_factory("task=plan", "plan.answer_tokens=1e300"), job={})


def test_the_plan_names_the_references_batch_its_table_uses(cfg_factory, tmp_path):
    """Issue #59 row 7: 'references batch: 32 (replay.batch_size)' above a table projected at batch 1 (1 turn)."""
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({**CAL, "machine": {"device": "cpu"}}))
    out = plan.run_plan(cfg_factory("task=plan", "plan.drafters=[none]", "benchmark=gsm8k", "eval.num_samples=1",
                                    f"plan.calibration={f}"), tmp_path / "run")
    refs = next(r for r in out["rows"] if r["stage"] == "references")
    assert refs["counts"] == "1 turns, batch 1"
    said = out["assumptions"]["references batch"]
    assert said.startswith("1 row (replay.batch_size=auto: 32 on a CPU, at most the run's 1 turns)"), said
    out = plan.run_plan(cfg_factory("task=plan", "plan.drafters=[none]", "benchmark=gsm8k", "eval.num_samples=8",
                                    "plan.batch_size=4", f"plan.calibration={f}"), tmp_path / "run2")
    assert out["assumptions"]["references batch"].startswith("4 rows (plan.batch_size)")
    assert next(r for r in out["rows"] if r["stage"] == "references")["counts"] == "8 turns, batch 4"


def test_passes_and_steps_grow_with_the_context_as_measured():
    """A calibration measured at two contexts: a pass is a·L + b·L² through both points, a step linear in the
    context between them (and beyond), never below half the shorter context's cost."""
    cal = {**CAL, "context": 100, "context_long": 200, "prefill_ms": {"100": 10.0, "200": 24.0},
           "ar_step_ms": {"1": 10.0, "8": 12.0}, "ar_step_ms_long": {"1": 14.0, "8": 20.0}}
    assert plan.pass_ms(cal, "prefill", 100) == pytest.approx(10.0)
    assert plan.pass_ms(cal, "prefill", 200) == pytest.approx(24.0)
    assert plan.pass_ms(cal, "prefill", 400) == pytest.approx(0.08 * 400 + 0.0002 * 400 ** 2)     # a = .08, b = 2e-4
    assert plan.pass_ms(cal, "teacher_forced", 50) == pytest.approx(0.02 * 50)     # one point: per token
    assert plan.step_ms(cal, 8, 150) == pytest.approx(16.0) and plan.step_ms(cal, 1, 300) == pytest.approx(18.0)
    assert plan.step_ms(cal, 8, 0) == pytest.approx(6.0)                            # the floor: half of 12
