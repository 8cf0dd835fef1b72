"""`task=train drafter=domino_ft` end to end on the tiny target: frozen DFlash checkpoint -> cached features ->
Lightning -> head + card, then a lossless eval with the trained head; the λ schedule."""
import json

import pytest

from specexp.drafters import domino
from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
from specexp.drafters.layers import init_weights
from specexp.training.domino_module import lambda_at
from specexp.training.pipeline import run_train


def test_lambda_schedule():
    assert lambda_at(0, 100, 0.8, 0.5) == pytest.approx(0.8)
    assert lambda_at(25, 100, 0.8, 0.5) == pytest.approx(0.4)
    assert lambda_at(50, 100, 0.8, 0.5) == 0.0 and lambda_at(90, 100, 0.8, 0.5) == 0.0
    assert lambda_at(70, 100, 0.3, 0.0) == pytest.approx(0.3)            # no decay: constant


@pytest.mark.slow
def test_train_task_writes_head_and_evaluates(cfg_factory, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    bb = tmp_path / "dflash"
    init_weights(DFlashDraftModel(DFlashConfig.for_target(tiny_target, 1, 8, None)), 0).save_pretrained(bb)
    cfg = cfg_factory("task=train", "drafter=domino_ft", "train=smoke", "data=smoke",
                      f"paths.cache={tmp_path / 'cache'}",
                      f"drafter.checkpoint={bb}", "drafter.head.train.num_anchors=8", "drafter.head.gru_hidden=64",
                      "drafter.head.emb_dim=32", "drafter.head.train.epochs=1", "drafter.head.train.lambda_start=0.5",
                      "train.eval_after=true",
                      "benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=12",
                      f"train.export_dir={tmp_path / 'head'}")
    card = run_train(cfg, tmp_path / "run")
    assert card["steps"] == 4 and card["trainable_params"] > 0 and card["peak_memory_mb"] > 0
    assert card["train_seconds"] > 0 and card["facts"]["head"]["alignment"] == "unshifted"
    # the card's train block holds what the head trained with, not the train group's DFlash values
    assert (card["train"]["num_anchors"], card["train"]["epochs"]) == (8, 1) and card["timed_from_step"] == 0
    out = tmp_path / "head"
    assert {"config.json", "model.safetensors", "card.json"} <= {p.name for p in out.iterdir()}
    assert domino.load_head(out, "x").config.gru_hidden == 64
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["drafter"] == "domino_ft" and summary["benchmarks"]["gsm8k"]["lossless_mismatches"] == 0
    # the finished stage is reused: a second run trains nothing and reports the same card
    again = run_train(cfg, tmp_path / "run2")
    assert again["steps"] == card["steps"] and again["train_seconds"] == card["train_seconds"]
