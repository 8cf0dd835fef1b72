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


# ------------------------------------------------------------------------------ the reference edition
def test_reference_order_is_the_datasets_shuffle_permutation():
    """The paper-era harness's `dataset.shuffle(seed=0).select(range(N))`, run here on a real datasets.Dataset,
    picks the rows reference_order puts first; a benchmark no longer than its paper count keeps its file order."""
    import datasets

    for n_rows, seed in ((1319, 0), (257, 0), (52002, 0), (500, 3)):
        ds = datasets.Dataset.from_dict({"i": list(range(n_rows))})
        assert list(ds.shuffle(seed=seed).select(range(128))["i"]) == B.reference_order(n_rows, 128, seed)[:128]
    assert B.reference_order(164, 164, 0) == list(range(164))


def test_reference_edition_selects_as_the_harness_and_splits_stay_disjoint():
    rows = B.read_jsonl(B.DATA_DIR / "mbpp_sanitized.jsonl")
    assert len(rows) == 257 and all(r["id"].startswith("mbpp/") for r in rows)
    paper = B.load(["mbpp", "humaneval", "gsm8k"], "paper", edition="reference")
    mbpp = [s for s in paper if s.benchmark == "mbpp"]
    assert [s.id for s in mbpp] == [rows[i]["id"] for i in B.reference_order(257, 128, 0)[:128]]
    assert all(s.turns == rows[int(i)]["turns"] for s, i in zip(mbpp, B.reference_order(257, 128, 0)))
    assert not any(s.turns[0].startswith("You are an expert Python programmer") for s in mbpp)   # no paper template
    he = [s.id for s in paper if s.benchmark == "humaneval"]
    assert he == [f"HumanEval/{i}" for i in range(164)]                     # 164 = its paper count: file order
    gsm = [s.id for s in paper if s.benchmark == "gsm8k"]
    all_gsm = B.read_jsonl(B.DATA_DIR / "gsm8k.jsonl")
    assert gsm == [all_gsm[i]["id"] for i in B.reference_order(1319, 128, 0)[:128]]
    assert [s.id for s in B.load(["gsm8k"], 50, edition="reference")] == gsm[:50]    # a prefix of the paper's
    ev = B.load(["mbpp"], None, edition="reference", tune_samples=20)
    tu = B.load(["mbpp"], None, edition="reference", tune_samples=20, split="tune")
    assert len(ev) == 237 and len(tu) == 20 and not {s.id for s in ev} & {s.id for s in tu}
    assert [s.id for s in ev][:128] == [s.id for s in mbpp]


def test_hub_only_reference_benchmarks_are_one_line_errors_offline():
    from specexp.errors import UserError

    for name, hub in (("alpaca", "tatsu-lab/alpaca"), ("livecodebench", "json")):
        with pytest.raises(UserError, match=rf"benchmark {name} \(edition=reference\) has no staged file: its "
                                            rf"prompts \({hub}\) are loaded from the hub only") as e:
            B.load(["gsm8k", name], 5, edition="reference")
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="benchmark.edition='paper' is not valid; choose one of: staged, reference"):
        B.load(["gsm8k"], 5, edition="paper")


def test_hub_rows_take_the_harness_formats(monkeypatch):
    """benchmark.source=hf through a stand-in `datasets.load_dataset` (the hub is not reachable in tests): the
    Alpaca rows become `instruction\\n\\nInput:\\n{input}` (the instruction alone without input), LiveCodeBench's
    the harness's system line + Question / Format / Answer blocks, MBPP's full split the paper template."""
    import datasets

    hub = {
        "tatsu-lab/alpaca": [{"instruction": "Add.", "input": "2 and 3", "output": "5"},
                             {"instruction": "Say hi.", "input": "", "output": "hi"}],
        "json": [{"question_id": "abc1", "question_content": "Sum a and b.", "starter_code": "class S:\n    pass"},
                 {"question_id": "abc2", "question_content": "Read n.", "starter_code": ""}],
        "google-research-datasets/mbpp": [{"task_id": 11, "text": "Write f.", "test_list": ["assert f(1)"]}],
    }
    seen = []

    def fake(dataset, config=None, split=None, data_files=None, revision=None):
        seen.append((dataset, config, split, data_files))
        return hub[dataset]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    al = B.load(["alpaca"], None, source="hf", edition="reference")
    assert sorted((s.id, s.turns[0]) for s in al) == [("alpaca/0", "Add.\n\nInput:\n2 and 3"), ("alpaca/1", "Say hi.")]
    lcb = {s.id: s.turns[0] for s in B.load(["livecodebench"], None, source="hf", edition="reference")}
    system = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
              "generate a correct Python program that matches the specification and passes all tests. You will NOT "
              "return anything except for the program")
    assert lcb["livecodebench/abc1"] == (f"{system}\n\n### Question:\nSum a and b.\n\n### Format: Use the following "
                                         "code structure:\n```python\nclass S:\n    pass\n```\n\n### Answer: (use the "
                                         "provided format with backticks)")
    assert lcb["livecodebench/abc2"].endswith("### Format: Write your code in the following format:\n```python\n"
                                              "# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with "
                                              "backticks)")
    assert seen[1][0] == "json" and seen[1][3]["train"][0].endswith("code_generation_lite/resolve/main/test.jsonl")
    staged = B.read_jsonl(B.DATA_DIR / "mbpp.jsonl")[0]["turns"][0]
    hub["google-research-datasets/mbpp"][0] |= {"text": staged.split("your task: ")[1].split(" Your code")[0],
                                               "test_list": staged.split("tests:\n\n")[1].split("\n")}
    assert B.load(["mbpp"], None, source="hf")[0].turns[0] == staged        # the staged edition's template
    assert seen[-1][:3] == ("google-research-datasets/mbpp", "full", "test")


def test_staged_files_match_their_manifest_sums():
    """Every file a benchmark edition stages is listed in SHA256SUMS, and its bytes hash to the listed sum."""
    import hashlib

    sums = dict(reversed(line.split()) for line in (B.DATA_DIR / "SHA256SUMS").read_text().splitlines() if line)
    staged = {e.file for spec in B.BENCHMARKS.values() for e in (spec.staged, spec.reference) if e and e.file}
    assert staged <= set(sums), staged - set(sums)
    for name, digest in sums.items():
        assert hashlib.sha256((B.DATA_DIR / name).read_bytes()).hexdigest() == digest, name
