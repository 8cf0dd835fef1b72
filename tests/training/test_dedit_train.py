"""DEdit training: the ProposalMix rules mix what they say they mix, and `task=train drafter=dedit` runs end
to end on the tiny target (both objectives fall, the checkpoint loads as a DEdit drafter, and its eval logs
passes and edit outcomes)."""
import csv
import json

import pytest
import torch

from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
from specexp.drafters.layers import init_weights
from specexp.training.dedit_module import DEditLitModule
from specexp.training.pipeline import run_train


def _module(t, mix, **kw):
    model = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 8, None)), 0)
    return DEditLitModule(model, t, mix=mix, mix_threshold=kw.get("mix_threshold", 0.5),
                          plain_rate=kw.get("plain_rate", 0.3), edit_weight=1.0, causal=False, num_anchors=8,
                          gamma=4.0, lr=1e-3, warmup_ratio=0.0, weight_decay=0.0, attention="dense", seed=0)


def test_proposal_mix_rules(tiny_target):
    conf = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    keep = _module(tiny_target, "confidence_threshold", mix_threshold=0.7).keep_proposal(conf, g)
    assert torch.equal(keep, conf >= 0.7)
    keep = _module(tiny_target, "confidence_sample").keep_proposal(conf, g)
    hi, lo = keep[conf > 0.8].float().mean(), keep[conf < 0.2].float().mean()
    assert hi > 0.85 and lo < 0.15, (hi, lo)                    # kept with probability = confidence
    keep = _module(tiny_target, "plain", plain_rate=0.3).keep_proposal(conf, g)
    hi, lo = keep[conf > 0.8].float().mean(), keep[conf < 0.2].float().mean()
    assert abs(hi - 0.3) < 0.03 and abs(lo - 0.3) < 0.03, (hi, lo)   # independent of confidence


@pytest.mark.slow
def test_train_task_end_to_end(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    cfg = cfg_factory("task=train", "drafter=dedit", "drafter.block_size=8", "train=smoke", "data=smoke",
                      f"paths.cache={tmp_path / 'cache'}", "train.max_steps=30", "train.log_every=1",
                      "train.eval_after=true", "benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=16",
                      f"train.export_dir={tmp_path / 'dedit'}")
    card = run_train(cfg, tmp_path / "run")
    assert card["steps"] == 30 and card["kind"] == "dedit" and card["facts"]["edit"]["mix"] == "confidence_sample"
    rows = list(csv.DictReader(open(next((tmp_path / "cache").rglob("metrics.csv")))))
    mean = lambda key, rs: sum(float(r[key]) for r in rs) / len(rs)  # noqa: E731
    assert mean("train/loss0", rows[-5:]) < mean("train/loss0", rows[:5]) - 0.5        # the unmasking objective
    # lr 1e-2 first breaks the random model's copy of its input at the edit pass, then the edit loss recovers
    assert mean("train/loss_edit", rows[-5:]) < mean("train/loss_edit", rows[5:15]) - 1.0
    assert "# DEdit drafter" in (tmp_path / "dedit" / "README.md").read_text()
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    b = summary["benchmarks"]["gsm8k"]
    assert summary["drafter"] == "dedit" and b["lossless_mismatches"] == 0
    assert b["edits"]["rounds"] > 0 and sum(b["edits"]["rounds_by_passes"].values()) == b["edits"]["rounds"]
    # the causal editor is a different training stage (its mask is part of the recipe)
    from specexp.training.dedit_module import edit_recipe

    assert edit_recipe(cfg_factory("drafter=dedit", "drafter.edit.editor=causal").drafter)["editor"] == "causal"
    with pytest.raises(Exception, match="drafter.train_edit.mix"):
        edit_recipe(cfg_factory("drafter=dedit", "drafter.train_edit.mix=sometimes").drafter)
