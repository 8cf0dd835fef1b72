"""W&B runs carry what the dashboards read (report/dashboard.py docstring), offline: eval runs (job type, config +
run_info, per-benchmark keys, acceptance and τ-histogram tables and plots), multirun jobs (group = the sweep, the
swept keys in config) and training runs (Lightning's W&B logger, cost keys, the checkpoint as an artifact)."""
from __future__ import annotations

import json
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

wandb = pytest.importorskip("wandb")
from wandb.sdk import wandb_run  # noqa: E402

SMALL = ["target=tiny_qwen3", "drafter.init=random", "benchmark=gsm8k", "eval.num_samples=1",
         "eval.max_new_tokens=6", "eval.warmup=0", "eval.progress=false", "device=cpu", "logger=wandb"]


@pytest.fixture
def spy(monkeypatch):
    """Offline W&B; records every wandb.init's arguments, each run's summary at finish and logged artifacts."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    seen = {"init": [], "summary": [], "artifacts": [], "logged": set()}
    init, finish, log_artifact, log = wandb.init, wandb_run.Run.finish, wandb_run.Run.log_artifact, wandb_run.Run.log

    def spy_init(*a, **kw):
        seen["init"].append(kw)
        return init(*a, **kw)

    def spy_finish(self, *a, **kw):
        seen["summary"].append(dict(self.summary))
        return finish(self, *a, **kw)

    def spy_artifact(self, art, *a, **kw):
        seen["artifacts"].append((art.name, art.type, sorted(art.manifest.entries)))
        return log_artifact(self, art, *a, **kw)

    def spy_log(self, data, *a, **kw):
        seen["logged"].update(data)
        return log(self, data, *a, **kw)

    monkeypatch.setattr(wandb, "init", spy_init)
    monkeypatch.setattr(wandb_run.Run, "finish", spy_finish)
    monkeypatch.setattr(wandb_run.Run, "log_artifact", spy_artifact)
    monkeypatch.setattr(wandb_run.Run, "log", spy_log)
    return seen


@pytest.mark.slow
def test_eval_run_logs_the_dashboard_keys(spy, cfg_factory, tmp_path):
    from specexp.eval import evaluator

    evaluator.run_eval(cfg_factory(*SMALL), tmp_path)
    (kw,) = spy["init"]
    assert kw["job_type"] == "eval" and kw["group"] is None and kw["config"]["run_info"]["git"]
    summary = spy["summary"][-1]
    for key in ("eval/gsm8k/tau", "eval/gsm8k/tau_ci_lo", "eval/gsm8k/ttft_ms", "eval/gsm8k/lossless_mismatches",
                "eval/macro/tau", "eval/macro/accept_k1"):
        assert key in summary, key
    assert {"eval/summary", "eval/acceptance", "eval/tau_histogram", "eval/acceptance_curves",
            "eval/tau_histogram_plot"} <= spy["logged"]
    assert any((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    ((name, files),) = [(n, f) for n, kind, f in spy["artifacts"] if kind == "results"]   # (tables travel as others)
    assert name.startswith("eval-") and files == ["samples.jsonl", "summary.json"]


@pytest.mark.slow
def test_replay_grid_merge_and_compare_runs_log_like_eval(spy, cfg_factory, tmp_path, monkeypatch):
    """Every task with results logs: replay (job type replay), its shards merged (merge), the two compared
    (compare), and a fusion grid (one run per cell, job type grid, each cell's weights in its config)."""
    from helpers import DELS
    from specexp.eval.compare import run_compare
    from specexp.eval.fusion_grid import run_grid
    from specexp.eval.merge import run_merge
    from specexp.eval.replay import run_replay

    common = [*SMALL, "task=replay", "benchmark=all", "benchmark.names=[gsm8k,mbpp]", "eval.num_samples=2",
              "eval.max_drafts=null", f"paths.cache={tmp_path / 'cache'}"]         # the drafter's own K = 15
    full = run_replay(cfg_factory(*common), tmp_path / "full")
    for i in (0, 1):
        run_replay(cfg_factory(*common, "logger=none", f"eval.shard={i}/2"), tmp_path / f"s{i}")
    merged = run_merge(cfg_factory("task=merge", "logger=wandb", f"merge.runs=[{tmp_path / 's0'},{tmp_path / 's1'}]"),
                       tmp_path / "merged")
    run_compare(cfg_factory("task=compare", "logger=wandb", f"compare.a={tmp_path / 'full'}",
                            f"compare.b={tmp_path / 'merged'}"), tmp_path / "cmp")
    grid = [*common, "drafter=dels_rnn", *DELS, "replay.fusion_grid.alpha=[0,1]", "replay.fusion_grid.beta=[0.5]"]
    run_grid(cfg_factory(*grid), tmp_path / "grid")
    assert [kw["job_type"] for kw in spy["init"]] == ["replay", "merge", "compare", "grid", "grid"]
    assert [kw["config"]["fusion"]["alpha"] for kw in spy["init"][3:]] == [0.0, 1.0]
    assert [kw["name"] for kw in spy["init"][3:]] == ["dels_rnn-tiny_qwen3 a0_b0.5", "dels_rnn-tiny_qwen3 a1_b0.5"]
    replay, merge, compare, *cells = spy["summary"]
    for summary, expected in ((replay, full), (merge, merged)):        # the summary.json numbers, key by key
        assert summary["eval/macro/tau"] == expected["macro"]["tau"]
        assert summary["eval/gsm8k/tau_ci_lo"] == expected["benchmarks"]["gsm8k"]["tau_ci95"][0]
        assert summary["eval/num_draft_tokens"] == expected["num_draft_tokens"] == 15
        rates = [b["accept_rate_per_position"] for b in expected["benchmarks"].values()]
        k = max(i + 1 for r in rates for i, x in enumerate(r) if x is not None)     # the positions the budget reached
        assert f"eval/macro/accept_k{k}" in summary and f"eval/macro/accept_k{k + 1}" not in summary and k < 15
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert compare["compare/macro/delta"] == result["macro"]["delta"] == 0.0      # the same run, sharded or not
    assert compare["compare/gsm8k/delta_ci_lo"] == result["benchmarks"]["gsm8k"]["delta_ci95"][0]
    assert all("eval/macro/tau" in c for c in cells) and "compare/summary" in spy["logged"]
    kinds = [(name.split("-")[0], files) for name, kind, files in spy["artifacts"] if kind == "results"]
    assert kinds == [("replay", ["samples.jsonl", "summary.json"]), ("merge", ["samples.jsonl", "summary.json"]),
                     ("compare", ["compare.json", "compare.md"]), ("grid", ["samples.jsonl", "summary.json"]),
                     ("grid", ["samples.jsonl", "summary.json"])]


@pytest.mark.slow
def test_multirun_jobs_are_one_group_with_the_swept_keys(spy, tmp_path, monkeypatch):
    from specexp.__main__ import main

    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["specexp", "-m", *SMALL, "eval.max_new_tokens=4,5",
                                      f"hydra.sweep.dir={tmp_path / 'my_sweep'}"])
    try:
        main()
    finally:
        GlobalHydra.instance().clear()
    assert [kw["group"] for kw in spy["init"]] == ["my_sweep", "my_sweep"]
    assert [kw["config"]["sweep"]["overrides"]["eval.max_new_tokens"] for kw in spy["init"]] == ["4", "5"]
    names = [kw["name"] for kw in spy["init"]]                     # one name per job: its overrides
    assert len(set(names)) == 2 and all(n.startswith("dflash-tiny_qwen3 ") for n in names)
    assert [[o for o in n.split(" ", 1)[1].split(",") if o.startswith("eval.max_new")] for n in names] == [
        ["eval.max_new_tokens=4"], ["eval.max_new_tokens=5"]]
    assert [kw["config"]["command"]["rerun"].split()[-1] for kw in spy["init"]] == [
        f"hydra.run.dir={tmp_path / 'my_sweep' / str(i)}" for i in (0, 1)]


@pytest.mark.slow
def test_training_logs_through_lightning_and_stores_the_checkpoint(spy, cfg_factory, tmp_path, monkeypatch):
    from specexp.training import pipeline

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    cfg = cfg_factory("task=train", "train=smoke", "data=smoke", "train.max_steps=4", "train.log_every=2",
                      "logger=wandb", f"paths.cache={tmp_path / 'cache'}")
    pipeline.run_train(cfg, tmp_path / "run")
    (kw,) = spy["init"]
    assert kw["job_type"] == "train" and kw["config"]["drafter"]["name"] == "dflash"
    summary = spy["summary"][-1]
    assert summary["train/steps"] == 4 and summary["train/train_seconds"] > 0
    assert "train/loss" in summary and "train/throughput" in summary and any(k.startswith("lr-") for k in summary)
    ((name, kind, files),) = spy["artifacts"]
    assert kind == "model" and "model.safetensors" in files and "card.json" in files
    assert any((tmp_path / "run" / "wandb").glob("offline-run-*/*.wandb"))
