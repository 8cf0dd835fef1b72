"""Loggers write where they say, W&B offline without a key; run metadata names versions and device."""
import json

import pytest
import torch

from specexp.eval import evaluator
from specexp.tracking import run_info


@pytest.mark.slow
def test_csv_logger(cfg_factory, tmp_path):
    evaluator.run_eval(cfg_factory("benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=6", "logger=csv"),
                       tmp_path)
    assert (tmp_path / "metrics.csv").read_text().startswith("step,key,value")
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert rows[0].startswith("benchmark,num_samples") and rows[1].startswith("gsm8k,2,2,")


@pytest.mark.slow
def test_wandb_offline_run(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    evaluator.run_eval(cfg_factory("benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=6",
                                   "logger=wandb"), tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_run_info():
    info = run_info(torch.device("cpu"))
    assert info["versions"]["torch"] == torch.__version__ and info["device"]["type"] == "cpu"
    json.dumps(info)
