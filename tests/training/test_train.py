"""DFlash training: it learns (memorises one sequence until it drafts it), `train=smoke` lowers the loss
and its checkpoint reloads and evaluates, and an interrupted run resumes from its last checkpoint."""
import json

import pytest
import torch

from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.dflash import DFlashDrafter, DFlashDraftModel
from specexp.training import data as D
from specexp.training import tasks


def test_memorising_one_sequence_drafts_it(cfg_factory, tiny_target, tmp_path):
    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": "Tell me a story about a lighthouse."}])
    ref = generate(t, None, ids, DecodeConfig(max_new_tokens=48))
    seq = D.Sequence("one", torch.tensor(ids + ref.tokens), torch.tensor([0] * len(ids) + [1] * 48).bool())
    cfg = cfg_factory("task=train", "train=smoke", "drafter.block_size=8", "train.num_anchors=12",
                      "train.max_steps=300", "train.epochs=1000", "train.lr=3e-3", "train.ckpt_every=1000")
    config, _ = tasks.drafter_config(cfg, t)
    card = tasks.fit(cfg, t, D.OnlineSequences([seq]), config, None, tmp_path)
    assert card["steps"] == 300 and card["final_metrics"]["train/tau_sim"] > 6
    drafter = DFlashDrafter(DFlashDraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32), t)
    spec = generate(t, drafter, ids, DecodeConfig(max_new_tokens=48))
    assert spec.tokens == ref.tokens                                    # still lossless
    tau = sum(spec.accept_lengths) / len(spec.accept_lengths)
    assert tau > 6.0, spec.accept_lengths                               # block size 8: at most 8


def test_smoke_training_lowers_the_loss_and_its_checkpoint_evaluates(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    cfg = cfg_factory("task=train", "train=smoke", "data=smoke", f"paths.cache={tmp_path / 'cache'}",
                      "train.eval_after=true", "benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=12")
    card = tasks.run_train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in []]
    import csv

    log = list(csv.DictReader(open(f"{card['run_dir']}/logs/version_0/metrics.csv")))
    losses = [float(r["train/loss"]) for r in log if r.get("train/loss")]
    assert card["steps"] == 40 and len(losses) >= 6
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5
    assert card["eval"]["benchmarks"]["gsm8k"]["tau"] >= 1.0
    assert json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())["benchmarks"]["gsm8k"][
        "lossless_mismatches"] == 0
    reloaded = DFlashDraftModel.from_pretrained(f"{card['run_dir']}/drafter")
    assert reloaded.config.block_size == 16 and card["data_hash"] and card["train_seconds"] > 0
    # A second identical run reuses every stage.
    again = tasks.run_train(cfg, tmp_path / "run2")
    assert again["run_dir"] == card["run_dir"] and again["train_seconds"] == card["train_seconds"]
