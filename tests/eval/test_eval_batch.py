"""task=eval at eval.batch_size > 1 (decoding/batch_spec.py through eval/evaluator.py `run_batch`): the same records as
batch 1 (every turn's output and accept lengths, two-turn samples included), the batch in run.json, summary.json and
summary.md, a run interrupted between groups resumes without losing or repeating a sample; eval.max_drafts as a table
by batch size; task=compare refuses to pair online runs of different batches unless asked."""
import json

import pytest
import torch

from specexp.decoding.settings import max_drafts
from specexp.errors import UserError
from specexp.eval import evaluator
from specexp.eval.compare import run_compare

RUN = ["benchmark.names=[gsm8k,mt_bench]", "eval.num_samples=3", "eval.max_new_tokens=14", "drafter.block_size=4"]


def _records(d):
    return {(r["benchmark"], r["id"], r["turn"]): r for r in map(json.loads, (d / "samples.jsonl").open())}


@pytest.fixture(scope="module")
def batch_1(tmp_path_factory):
    from conftest import BASE, make_cfg

    d = tmp_path_factory.mktemp("b1")
    evaluator.run_eval(make_cfg([*BASE, "drafter=dflash", "drafter.init=random", *RUN]), d)
    return d


def test_batched_eval_records_equal_batch_1(cfg_factory, batch_1, tmp_path):
    summary = evaluator.run_eval(cfg_factory(*RUN, "eval.batch_size=3"), tmp_path)
    one, got = _records(batch_1), _records(tmp_path)
    assert got.keys() == one.keys() and len(got) == 9                 # 3 + 3 samples, mt_bench's with two turns
    for key, r in got.items():
        for field in ("text_sha256", "accept_lengths", "drafted", "new_tokens", "ar_new_tokens", "stop_reason"):
            assert r[field] == one[key][field], (key, field)
        assert r["lossless"] is True and r["tpot"] > 0 and r["ar_tpot"] > 0
    assert summary["batch_size"] == 3 and json.loads((batch_1 / "summary.json").read_text())["batch_size"] == 1
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["eval"]["batch_size"] == 3
    assert "3 sequences decoded side by side" in (tmp_path / "summary.md").read_text()


def test_a_batch_never_allocates_more_rows_than_live_turns(cfg_factory, batch_1, tmp_path, monkeypatch):
    """Issue #59 row 10: eval.batch_size=4096 on a few samples allocated 4,096 cache rows and drafter forks (the
    warmup's too) and ran for minutes; now a batch holds at most as many rows as it has jobs, and the records are
    the same."""
    from specexp.targets.static import StaticTarget

    real, sizes = StaticTarget.new_rows_cache, []

    def spy(self, rows, capacity):
        sizes.append(rows)
        assert rows <= 6, f"{rows} rows allocated for 6 samples"
        return real(self, rows, capacity)

    monkeypatch.setattr(StaticTarget, "new_rows_cache", spy)
    summary = evaluator.run_eval(cfg_factory(*RUN, "eval.batch_size=4096", "eval.warmup=1"), tmp_path)
    assert sizes and max(sizes) == 6 and summary["batch_size"] == 4096
    one, got = _records(batch_1), _records(tmp_path)
    assert got.keys() == one.keys()
    for key, r in got.items():
        assert (r["text_sha256"], r["accept_lengths"]) == (one[key]["text_sha256"], one[key]["accept_lengths"]), key


def test_batched_eval_resumes_between_groups(cfg_factory, batch_1, tmp_path, monkeypatch):
    cfg = cfg_factory(*RUN, "eval.batch_size=2")
    real, calls = evaluator.run_batch, []

    def crash_on_second(target, drafter, samples, *a, **k):
        calls.append([s.id for s in samples])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(target, drafter, samples, *a, **k)

    monkeypatch.setattr(evaluator, "run_batch", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        evaluator.run_eval(cfg, tmp_path)
    first = (tmp_path / "samples.jsonl").read_text()
    assert len(calls[0]) == 4 and len(first.splitlines()) == 4 + sum(s.startswith("mt_bench") for s in calls[0])
    calls.clear()
    monkeypatch.setattr(evaluator, "run_batch", lambda t, d, samples, *a, **k: calls.append(
        [s.id for s in samples]) or real(t, d, samples, *a, **k))
    evaluator.run_eval(cfg, tmp_path)
    text = (tmp_path / "samples.jsonl").read_text()
    assert text.startswith(first) and len(calls) == 1 and len(calls[0]) == 2      # only the unfinished samples
    one, got = _records(batch_1), _records(tmp_path)
    assert got.keys() == one.keys() and len(text.splitlines()) == len(one)
    assert all(got[k]["text_sha256"] == one[k]["text_sha256"] for k in one)


def test_max_drafts_by_batch():
    table = {1: None, 8: 3, 32: 1}
    cpu = torch.device("cpu")
    got = [max_drafts(table, cpu, torch.float32, b) for b in (1, 4, 8, 16, 32, 64)]
    assert got == [None, None, 3, 3, 1, 1]
    assert max_drafts({4: 2}, cpu, torch.float32, 2) is None              # no entry at or below: the drafter's own K
    assert max_drafts(5, cpu, torch.float32, 64) == 5


def test_a_table_caps_the_engine_at_the_run_batch(cfg_factory, tmp_path):
    cfg = cfg_factory(*RUN, "eval.num_samples=1", "benchmark.names=[gsm8k]", "eval.batch_size=2",
                      "eval.max_drafts={1: 3, 2: 1}")
    evaluator.run_eval(cfg, tmp_path)
    recs = _records(tmp_path)
    assert max(d for r in recs.values() for d in r["drafted"]) == 1
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["eval"]["max_drafts"] == 1


def test_compare_refuses_runs_of_different_batches(cfg_factory, batch_1, tmp_path):
    other = tmp_path / "b2"
    evaluator.run_eval(cfg_factory(*RUN, "eval.num_samples=1", "eval.batch_size=2"), other)
    pair = ["task=compare", f"compare.a={batch_1}", f"compare.b={other}"]
    with pytest.raises(UserError, match=r"eval.batch_size=1 and .* at 2; .*compare.allow_batch_mismatch=true"):
        run_compare(cfg_factory(*pair), tmp_path / "c")
    assert not (tmp_path / "c").exists()
    run_compare(cfg_factory(*pair, "compare.allow_batch_mismatch=true"), tmp_path / "c")
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["turns_compared"] > 0
