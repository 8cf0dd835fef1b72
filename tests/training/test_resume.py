"""Exact training resume (training/resume.py): a run interrupted after a checkpoint and resumed ends with the
same weights, bit for bit, as one never interrupted, whether the checkpoint fell mid-epoch or at an epoch end;
a torn `last.ckpt` is one clear error."""
import random

import lightning as L
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specexp.errors import UserError
from specexp.training import pipeline
from specexp.training.resume import EpochSampler, last_checkpoint


class Crash(Exception):
    pass


class Noise(L.Callback):
    """Nudges a weight with torch's, Python's and NumPy's global generators before every batch, so the final
    weights depend on those generators' states (the trainers themselves use per-step generators only)."""

    def on_train_batch_start(self, trainer, module, *a):
        p = next(module.parameters())
        with torch.no_grad():
            p.add_(1e-3 * (torch.randn(p.shape) + random.random() + float(np.random.rand())))


class CrashAt(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *a):
        if trainer.global_step == self.step:
            raise Crash


def train(cfg_factory, root, monkeypatch, ckpt_every, crash_at=None, extra=(), before_resume=None):
    """`train=smoke` for 12 steps (3 epochs of the 4 smoke sequences); returns the exported weights and the card.
    `before_resume(root)` runs between the crash and the resume."""
    cfg = cfg_factory("task=train", "train=smoke", "train.max_steps=12", f"train.ckpt_every={ckpt_every}",
                      "train.num_anchors=4", "train.export_dtype=float32", f"train.export_dir={root / 'export'}",
                      f"paths.cache={root / 'cache'}")
    real = L.Trainer
    extra = [Noise(), *extra] + ([CrashAt(crash_at)] if crash_at else [])
    monkeypatch.setattr(L, "Trainer", lambda *a, callbacks=(), **k: real(*a, callbacks=[*callbacks, *extra], **k))
    try:
        seed_everything(0)                               # as `python -m specexp` does: torch.manual_seed(cfg.seed)
        if crash_at:
            with pytest.raises(Crash):
                pipeline.run_train(cfg, root / "run")
            extra.pop()                                  # the rerun is not interrupted
            if before_resume:
                before_resume(root)
            seed_everything(123)                         # a new process: its generators start elsewhere
        card = pipeline.run_train(cfg, root / "run")
    finally:
        monkeypatch.setattr(L, "Trainer", real)
    assert card["steps"] == 12
    return load_file(root / "export" / "model.safetensors"), card


def seed_everything(seed):
    torch.manual_seed(seed), random.seed(seed), np.random.seed(seed)


@pytest.mark.slow
def test_resumed_training_equals_the_uninterrupted_run(cfg_factory, tmp_path, monkeypatch):
    whole, _ = train(cfg_factory, tmp_path / "whole", monkeypatch, ckpt_every=3)
    # Crash at step 7, resume from step 6 (mid-epoch 1); crash at step 5, resume from step 4 (end of epoch 0).
    for crash_at, every in ((7, 3), (5, 4)):
        resumed, _ = train(cfg_factory, tmp_path / f"crash{crash_at}", monkeypatch, ckpt_every=every,
                           crash_at=crash_at)
        assert whole.keys() == resumed.keys()
        diff = [k for k in whole if not torch.equal(whole[k], resumed[k])]
        assert not diff, (crash_at, diff)


class Clock(L.Callback):
    """A clock for resume.py that advances one second per trained batch, so a run's time counts its batches."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def on_train_batch_end(self, *a):
        self.t += 1.0


def strip_time(root):
    """Makes the stage's last.ckpt one written before checkpoints kept the time trained."""
    (ckpt,) = (root / "cache").rglob("last.ckpt")
    state = torch.load(ckpt, weights_only=True)
    (resume,) = [v for v in state["callbacks"].values() if "position" in v]
    del resume["train_seconds"], resume["timed_from_step"]
    torch.save(state, ckpt)


@pytest.mark.slow
@pytest.mark.parametrize("old_checkpoint", [False, True])
def test_a_resumed_runs_time_counts_every_segment(cfg_factory, tmp_path, monkeypatch, old_checkpoint):
    # Crash after step 7, resume from the checkpoint of step 6: 6 batches timed before it, 6 after, batch 7's
    # first try (lost with the crash) not counted. A checkpoint without a time: steps 6..12 only, and the card says so.
    clock = Clock()
    monkeypatch.setattr("specexp.training.resume.clock", clock)
    _, card = train(cfg_factory, tmp_path, monkeypatch, ckpt_every=3, crash_at=7, extra=[clock],
                    before_resume=strip_time if old_checkpoint else None)
    assert (card["train_seconds"], card["timed_from_step"]) == ((6.0, 6) if old_checkpoint else (12.0, 0))
    assert ("steps 6..12 only" in pipeline.card_markdown(card)) == old_checkpoint


def test_epoch_sampler_is_a_function_of_seed_and_epoch_and_skips_what_was_trained():
    n, seed = 7, 3
    loader = torch.utils.data.DataLoader(range(n), batch_size=1, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    # What a plain shuffling loader gives Lightning in epochs 0..2: len(loader) batches each, no exhaustion.
    old = [[int(x) for _, x in zip(range(n), loader)] for _ in range(3)]
    s = EpochSampler(n, seed)
    for e in range(3):
        s.set_epoch(e)
        assert list(s) == old[e]
    assert old[0] != old[1] != old[2]
    s.resume_at = (1, 3)
    s.set_epoch(1)
    assert list(s) == old[1][3:] and s.position == 3
    assert list(s) == old[1]                                      # only the resumed epoch is shortened


def test_a_torn_last_checkpoint_is_one_clear_error(tmp_path):
    assert last_checkpoint(tmp_path) is None
    torch.save({"global_step": 4, "state_dict": {"w": torch.randn(64, 64)}}, tmp_path / "last.ckpt")
    assert last_checkpoint(tmp_path) == str(tmp_path / "last.ckpt")
    data = (tmp_path / "last.ckpt").read_bytes()
    (tmp_path / "last.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"last\.ckpt is truncated or corrupt .*delete it"):
        last_checkpoint(tmp_path)
