"""Sharded runs (eval.shard=I/N) and task=merge: the shards partition the unsharded selection, a merge of them
writes what the unsharded run writes (records in its order, its run.json, its summary but for timing), and every
mismatch (another run, a missing or repeated shard, an unfinished shard, an occupied output) is one refused line
that changes nothing."""
import json
import random
import shutil

import pytest
from conftest import TINY, make_cfg

from specexp.benchmarks import Sample
from specexp.errors import UserError
from specexp.eval import evaluator, shards
from specexp.eval.metrics import TIMING_KEYS
from specexp.eval.store import ResultStore
from specexp.eval.summary import summarize_records
from specexp.files import write_json
from specexp.report.tables import summary_markdown

COMMON = ["benchmark.names=[gsm8k,mt_bench]", "eval.num_samples=3", "eval.max_new_tokens=8", "drafter.block_size=4",
          "cpu_threads=1"]
RECORD_TIMING = {"ttft", "tpot", "ar_ttft", "ar_tpot"}


def run(*overrides, out):
    """`python -m specexp TINY COMMON OVERRIDES hydra.run.dir=OUT` past Hydra (validation, dispatch); its summary."""
    from specexp.__main__ import run_task

    run_task(make_cfg([*TINY, *COMMON, *overrides]), str(out))
    return json.loads((out / "summary.json").read_text())


def merge(out, *dirs):
    return run("task=merge", f"merge.runs=[{','.join(map(str, dirs))}]", out=out)


def records(d):
    return [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]


def untimed(summary):
    """summary.json without the fields only a clock gives (speedup, TPOT, TTFT)."""
    strip = lambda b: {k: v for k, v in b.items() if k not in TIMING_KEYS}               # noqa: E731
    return {**summary, "benchmarks": {n: strip(b) for n, b in summary["benchmarks"].items()},
            "macro": strip(summary["macro"])}


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


# ------------------------------------------------------------------------------------------- the split
@pytest.mark.parametrize("value", [None, "0/1", "0/2", "1/2", "7/8", "12/13"])
def test_valid_shards(value):
    assert shards.is_valid(value) and str(shards.parse(value)) == str(value) if value else shards.parse(value) is None


@pytest.mark.parametrize("value", ["2/2", "3/2", "-1/2", "1/0", "0/0", "01/2", "0/02", " 0/2", "0/2/3", "a/b", "1",
                                   1, 0.5, "", [0, 2]])
def test_invalid_shards_are_one_line_naming_the_value(value):
    with pytest.raises(UserError) as e:
        shards.parse(value)
    assert str(e.value) == f"eval.shard={value!r} is not valid; expected {shards.VALID}"


def test_shards_partition_the_selection_round_robin_per_benchmark():
    samples = [Sample(f"g{i}", "gsm8k", ["q"]) for i in range(7)] + [Sample(f"m{i}", "mt_bench", ["q"])
                                                                     for i in range(3)]
    parts = [shards.select(samples, shards.Shard(i, 3)) for i in range(3)]
    assert [s.id for s in parts[0]] == ["g0", "g3", "g6", "m0"] and [s.id for s in parts[2]] == ["g2", "g5", "m2"]
    assert sorted(s.id for p in parts for s in p) == sorted(s.id for s in samples)           # each exactly once
    sel = shards.selection(samples)
    for i, p in enumerate(parts):
        for bench, ids in sel.items():
            assert shards.part(ids, shards.Shard(i, 3)) == [s.id for s in p if s.benchmark == bench]
    # a larger selection (eval.num_samples 7 -> 9) keeps every shard's samples in it: shards extend like runs
    more = samples[:7] + [Sample(f"g{i}", "gsm8k", ["q"]) for i in (7, 8)] + samples[7:]
    for i in range(3):
        assert {s.id for s in parts[i]} <= {s.id for s in shards.select(more, shards.Shard(i, 3))}
    assert shards.select(samples, None) == samples


def test_shard_is_validated_before_any_work(tmp_path):
    from specexp.config import validate

    with pytest.raises(UserError, match=r"eval.shard='2/2' is not valid; expected null \(unsharded\) or 'I/N'"):
        validate(make_cfg([*TINY, "eval.shard=2/2"]), job={})
    with pytest.raises(UserError, match="eval.shard='0/2' applies to task=eval and task=replay only"):
        validate(make_cfg([*TINY, "task=train", "eval.shard=0/2"]), job={})
    with pytest.raises(UserError, match=r"merge.runs='DIR' is not valid; expected a list of shard directories"):
        validate(make_cfg([*TINY, "task=merge", "merge.runs=DIR"]), job={})
    validate(make_cfg([*TINY, "eval.shard=1/2"]), job={})
    validate(make_cfg([*TINY, "task=replay", "eval.shard=0/3"]), job={})


# ------------------------------------------------------------------------- merge, on written directories
HEADER = {"target": "tiny_qwen3", "drafter": "dflash", "mode": "online",
          "decoding": {"temperature": 0.0, "protocol": "greedy"}, "max_new_tokens": 8, "num_draft_tokens": 3}
SETTINGS = {"target": {"name": "tiny_qwen3"}, "drafter": {"name": "dflash"}, "seed": 0}
SAMPLES = [Sample(f"gsm8k/{i}", "gsm8k", [f"q{i}"]) for i in range(7)] + [
    Sample(f"mt_bench/{i}", "mt_bench", [f"a{i}", f"b{i}"]) for i in range(3)]
NAMES = ["gsm8k", "mt_bench"]


def fake_turns(sample):
    """Records of one sample as the evaluator writes them, τ and timings varying by sample."""
    rng = random.Random(sample.id)
    out = []
    for turn in range(len(sample.turns)):
        acc = [rng.randint(1, 4) for _ in range(rng.randint(1, 6))]
        out.append({"id": sample.id, "benchmark": sample.benchmark, "turn": turn, "new_tokens": sum(acc),
                    "accept_lengths": acc, "drafted": [3] * len(acc), "tau": sum(acc) / len(acc),
                    "ttft": rng.random(), "tpot": rng.random(), "ar_tpot": rng.random(), "lossless": True})
    return out


def write_run(d, shard=None, settings=SETTINGS, samples=SAMPLES, finish=True):
    """A run directory (the unsharded run, or shard `shard` of it) written through the store and the evaluator's
    summary, as task=eval writes it."""
    sh = shards.parse(shard)
    mine = shards.select(samples, sh)
    with ResultStore(d, settings, mine, shards.entry(samples, sh)) as store:
        (d / "config.yaml").write_text(f"eval:\n  shard: {shard or 'null'}\ntask:\n  name: eval\n")
        for s in mine:
            store.append(fake_turns(s))
    if finish:
        write_json(d / "summary.json", summarize_records(store.records, NAMES, HEADER))
    return d


def merge_dirs(out, *dirs):
    from specexp.eval.merge import run_merge

    return run_merge(make_cfg(["task=merge", f"merge.runs=[{','.join(map(str, dirs))}]"]), out)


def test_merged_shards_are_the_unsharded_run(tmp_path):
    full = write_run(tmp_path / "full")
    parts = [write_run(tmp_path / f"s{i}", f"{i}/3") for i in (2, 0, 1)]           # any order
    merged = merge_dirs(tmp_path / "out", *parts)
    # the same records in the same order: the same summary to the digit, timing fields included
    assert merged == json.loads((full / "summary.json").read_text()) == json.loads(
        (tmp_path / "out" / "summary.json").read_text())
    assert records(tmp_path / "out") == records(full)
    assert (tmp_path / "out" / "run.json").read_bytes() == (full / "run.json").read_bytes()
    assert (tmp_path / "out" / "summary.md").read_text() == summary_markdown(merged)
    assert "shard: null" in (tmp_path / "out" / "config.yaml").read_text()
    # the CIs depend on the order of the prompts: another order would have given another interval
    flipped = [r for b in NAMES for r in reversed([r for r in records(full) if r["benchmark"] == b])]
    assert summarize_records(flipped, NAMES, HEADER)["benchmarks"]["gsm8k"]["tau_ci95"] != merged["benchmarks"][
        "gsm8k"]["tau_ci95"]
    # a shard with no sample of a benchmark (or none at all) is a shard too
    few = SAMPLES[:2]
    parts = [write_run(tmp_path / f"few{i}", f"{i}/4", samples=few) for i in range(4)]
    assert merge_dirs(tmp_path / "few", *parts)["benchmarks"]["gsm8k"]["num_samples"] == 2
    # rerunning the merge into its directory rewrites the same files; a parent directory names its shards
    before = snapshot(tmp_path / "out")
    merge_dirs(tmp_path / "out", tmp_path / "s0", tmp_path / "s1", tmp_path / "s2")
    assert snapshot(tmp_path / "out") == {**before, "run_info.json": snapshot(tmp_path / "out")["run_info.json"]}
    (tmp_path / "sweep" / ".submitit" / "1").mkdir(parents=True)
    (tmp_path / "sweep" / ".submitit" / "1" / "run.json").write_text("{}")          # a launcher's files: skipped
    for i in range(3):
        shutil.copytree(tmp_path / f"s{i}", tmp_path / "sweep" / f"job{i}")
    assert merge_dirs(tmp_path / "sweep_out", tmp_path / "sweep") == merged
    # a folder of links to the shards is a directory of runs too (a link cycle inside it ends)
    (tmp_path / "links").mkdir()
    for i in range(3):
        (tmp_path / "links" / f"s{i}").symlink_to(tmp_path / f"s{i}", target_is_directory=True)
    (tmp_path / "links" / "s0" / "loop").symlink_to(tmp_path / "links", target_is_directory=True)
    assert merge_dirs(tmp_path / "links_out", tmp_path / "links") == merged


def test_merge_refuses_what_is_not_one_finished_run_and_writes_nothing(tmp_path):
    s0, s1 = write_run(tmp_path / "s0", "0/2"), write_run(tmp_path / "s1", "1/2")
    other = write_run(tmp_path / "other", "1/2", settings={**SETTINGS, "seed": 1})
    fewer = write_run(tmp_path / "fewer", "1/2", samples=SAMPLES[:5] + SAMPLES[7:])
    three = write_run(tmp_path / "three", "1/3")
    unfinished = write_run(tmp_path / "unfinished", "1/2", finish=False)
    full = write_run(tmp_path / "full")
    torn = tmp_path / "torn"
    shutil.copytree(s1, torn)
    with (torn / "samples.jsonl").open("a") as f:
        f.write('{"id": "gsm8k/9')
    short = tmp_path / "short"
    shutil.copytree(s1, short)
    lines = (short / "samples.jsonl").read_text().splitlines()
    (short / "samples.jsonl").write_text("".join(x + "\n" for x in lines[:-2]))       # the last mt_bench sample
    stale = tmp_path / "stale"
    shutil.copytree(s1, stale)
    write_json(stale / "summary.json", summarize_records(records(stale)[:1], NAMES, HEADER))
    twice = tmp_path / "twice"
    shutil.copytree(s1, twice)
    with (twice / "samples.jsonl").open("a") as f:
        f.write((twice / "samples.jsonl").read_text().splitlines()[0] + "\n")          # its first record again
    (tmp_path / "empty").mkdir()
    cases = [
        ([s0, other], f"merge.runs: {s0} and {other} are shards of different runs (seed: {s0} 0, {other} 1)"),
        ([s0, fewer], "split different prompt selections (eval.num_samples, eval.shuffle_seed"),
        ([s0, three], f"merge.runs: {s0} is shard 0/2 and {three} is shard 1/3: different splits"),
        ([s0], "merge.runs: shard 1/2 missing (given: 0/2); add its directory"),
        ([three], "merge.runs: shards 0/3, 2/3 missing (given: 1/3); add their directories"),
        ([s0, s1, s0 / "."], f"merge.runs names {s0 / '.'} twice"),
        ([s0, s1, write_run(tmp_path / "again", "1/2")], f"shard 1/2 is given twice ({s1} and {tmp_path / 'again'})"),
        ([s0, unfinished], f"{unfinished} (shard 1/2) is unfinished: it has no summary.json; rerun its command to "
                           f"finish it, then merge"),
        ([s0, torn], "(shard 1/2) is unfinished: its samples.jsonl ends in a torn line"),
        ([s0, short], "(shard 1/2) is unfinished: 1 of its 4 samples have no results, e.g. 'mt_bench/1'"),
        ([s0, twice], f"{twice / 'samples.jsonl'} holds turn 0 of gsm8k/gsm8k/1 twice (shard 1/2); a run holds one "
                      f"record a turn: rerun the shard's command"),
        ([s0, stale], "(shard 1/2) is unfinished: its summary.json counts other turns than its samples.jsonl holds"),
        ([s0, full], f"{full} is not a shard: its run.json has no eval.shard"),
        ([s0, tmp_path / "nothing"], f"merge.runs: {tmp_path / 'nothing'} is not a directory"),
        ([s0, tmp_path / "empty"], "holds no run.json: neither a run directory nor a directory of runs"),
    ]
    for dirs, message in cases:
        with pytest.raises(UserError) as e:
            merge_dirs(tmp_path / "out", *dirs)
        assert message in str(e.value) and "\n" not in str(e.value), (dirs, str(e.value))
        assert not any((tmp_path / "out" / f).exists() for f in ("samples.jsonl", "run.json", "summary.json"))
    # an output that holds other results (the unsharded run itself, which measured other timings) stays as it was
    timed = [{**r, "tpot": r["tpot"] + 1} for r in records(full)]
    (full / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timed))
    before = snapshot(full)
    with pytest.raises(UserError, match=f"hydra.run.dir={full} holds other results .*; choose an empty directory"):
        merge_dirs(full, s0, s1)
    assert snapshot(full) == before
    with pytest.raises(UserError, match=f"hydra.run.dir={s1} is one of merge.runs"):
        merge_dirs(s1, s0, s1)
    # a shard that a run still writes into
    from specexp.rundir import lock

    held = lock(s1 / ".lock")
    try:
        with pytest.raises(UserError, match="is in use by another run"):
            merge_dirs(tmp_path / "out", s0, s1)
    finally:
        held.close()


# ------------------------------------------------------------------------- eval: real shards, then merge
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The unsharded run, its two shards and their merge (tiny target, greedy, a multi-turn benchmark)."""
    root = tmp_path_factory.mktemp("shards")
    full = run(out=root / "full")
    for i in (0, 1):
        run(f"eval.shard={i}/2", out=root / f"s{i}")
    merged = run("task=merge", f"merge.runs=[{root / 's0'},{root / 's1'}]", out=root / "merged")
    return root, full, merged


@pytest.mark.slow
def test_shards_of_a_real_run_merge_into_it(runs, monkeypatch):
    root, full, merged = runs
    s0, s1, f, m = records(root / "s0"), records(root / "s1"), records(root / "full"), records(root / "merged")
    key = lambda r: (r["benchmark"], r["id"], r["turn"])                                    # noqa: E731
    assert sorted(map(key, s0 + s1)) == sorted(map(key, f)) and not set(map(key, s0)) & set(map(key, s1))
    assert [r["id"] for r in s0 if r["benchmark"] == "gsm8k"] == [f[0]["id"], f[2]["id"]]   # round-robin
    rj = json.loads((root / "s1" / "run.json").read_text())
    assert rj["settings"]["shard"] == {"index": 1, "count": 2}
    full_rj = json.loads((root / "full" / "run.json").read_text())
    assert rj["selection"] == {b: list(ids) for b, ids in full_rj["samples"].items()} and "shard" not in full_rj[
        "settings"]
    # the merge: what the unsharded run wrote, but for what a clock measured
    assert untimed(merged) == untimed(full)
    assert merged["benchmarks"]["mt_bench"]["num_turns"] == 6 and merged["benchmarks"]["gsm8k"][
        "lossless_mismatches"] == 0 and merged["macro"]["speedup"] > 0
    drop = lambda r: {k: v for k, v in r.items() if k not in RECORD_TIMING}                 # noqa: E731
    assert [drop(r) for r in m] == [drop(r) for r in f]                                     # in the same order
    assert (root / "merged" / "run.json").read_bytes() == (root / "full" / "run.json").read_bytes()
    info = json.loads((root / "merged" / "run_info.json").read_text())
    assert [s["shard"] for s in info["shards"]] == ["0/2", "1/2"] and "git" in info["merged_by"]
    # the unsharded command finds nothing left to run in the merged directory
    calls, real = [], evaluator.run_sample
    monkeypatch.setattr(evaluator, "run_sample", lambda *a, **k: calls.append(a[2].id) or real(*a, **k))
    assert untimed(run(out=root / "merged")) == untimed(full) and calls == []
    # a shard is not the unsharded run, nor another shard
    before = snapshot(root / "s0")
    with pytest.raises(UserError, match="holds results of a different run .*shard.count: recorded 2, now unset"):
        run(out=root / "s0")
    with pytest.raises(UserError, match="shard.index: recorded 0, now 1"):
        run("eval.shard=1/2", out=root / "s0")
    assert snapshot(root / "s0") == before and calls == []


# ---------------------------------------------------------------------------------------------- replay
@pytest.mark.slow
def test_sharded_replay_merges_into_the_unsharded_replay(tmp_path):
    cache = f"paths.cache={tmp_path / 'cache'}"
    full = run("task=replay", cache, out=tmp_path / "full")
    for i in (0, 1, 2):
        run("task=replay", cache, f"eval.shard={i}/3", out=tmp_path / f"s{i}")
    merged = merge(tmp_path / "merged", *(tmp_path / f"s{i}" for i in (0, 1, 2)))
    assert merged == full and merged["mode"] == "replay"
    assert (tmp_path / "merged" / "run.json").read_bytes() == (tmp_path / "full" / "run.json").read_bytes()
    assert records(tmp_path / "merged") == records(tmp_path / "full")
