"""Benchmark prompts: formats as the DFlash reference, deterministic subsets, all 8 loadable offline."""
import pytest

from specexp import benchmarks as B


def test_all_benchmarks_load_with_their_formats():
    samples = B.load(list(B.BENCHMARKS), None)
    by = {n: [s for s in samples if s.benchmark == n] for n in B.BENCHMARKS}
    assert {n: len(v) for n, v in by.items()} == {"gsm8k": 1319, "math500": 500, "aime25": 30, "humaneval": 164,
                                                 "mbpp": 500, "livecodebench": 127, "mt_bench": 80, "alpaca": 80}
    for n in ("gsm8k", "math500", "aime25"):
        assert all(s.turns[0].endswith("\nPlease reason step by step, and put your final answer within \\boxed{}.")
                   for s in by[n])
    he = by["humaneval"][0].turns[0]
    assert he.startswith("Write a solution to the following problem and make sure that it passes the tests:\n"
                         "```python\n")
    assert he.endswith("\n```")
    assert all(len(s.turns) == 2 for s in by["mt_bench"]) and all(len(s.turns) == 1 for s in by["alpaca"])


def test_subsets_are_deterministic_and_seeded():
    a = B.load(["gsm8k"], 5, shuffle_seed=0)
    assert [s.id for s in a] == [s.id for s in B.load(["gsm8k"], 5, shuffle_seed=0)]
    assert [s.id for s in a] != [s.id for s in B.load(["gsm8k"], 5, shuffle_seed=1)]
    assert [s.id for s in B.load(["gsm8k"], 8)][:5] == [s.id for s in a]     # a larger subset extends a smaller one


def test_paper_counts_and_mappings():
    paper = B.load(["aime25", "mt_bench"], "paper")
    assert len(paper) == 30 + 80
    assert len(B.load(["gsm8k", "mbpp"], {"gsm8k": 2, "mbpp": None})) == 2 + 500
    assert len(B.load(["alpaca"], "paper")) == 80                              # 128 asked, 80 staged


def test_unknown_benchmark_is_named():
    from specexp.errors import UserError

    with pytest.raises(UserError, match="benchmark 'gsm9k' is not valid"):
        B.load(["gsm9k"], 1)


def test_tuning_and_evaluation_splits_are_disjoint_and_leave_small_selections_unchanged():
    names = ["mt_bench", "aime25", "gsm8k"]
    tune = {"mt_bench": 20, "gsm8k": 20}                                     # aime25 absent: 0, all evaluation
    ev = B.load(names, None, split="eval", tune_samples=tune)
    tu = B.load(names, None, split="tune", tune_samples=tune)
    count = {n: sum(s.benchmark == n for s in ev) for n in names}
    assert count == {"mt_bench": 60, "aime25": 30, "gsm8k": 1299}
    assert [s.benchmark for s in tu].count("mt_bench") == 20 and not any(s.benchmark == "aime25" for s in tu)
    assert not {s.id for s in ev} & {s.id for s in tu}
    assert {s.id for s in ev} | {s.id for s in tu} == {s.id for s in B.load(names, None)}
    # fewer than len - tune_samples: exactly the selection made before splits existed
    assert [s.id for s in B.load(names, 50, tune_samples=tune)] == [s.id for s in B.load(names, 50)]
    assert [s.id for s in B.load(["gsm8k"], 5, split="tune", tune_samples=20)] == [s.id for s in tu[-20:-15]]


@pytest.mark.parametrize("kw, match", [
    ({"split": "test"}, r"eval.split='test' is not valid; choose one of: eval, tune"),
    ({"tune_samples": 30}, r"eval.tune_samples=30 for aime25 must be an int in \[0, 30\)"),
    ({"tune_samples": -1}, r"eval.tune_samples=-1")])
def test_bad_split_settings_are_named(kw, match):
    from specexp.errors import UserError

    with pytest.raises(UserError, match=match):
        B.load(["aime25"], 5, **kw)
