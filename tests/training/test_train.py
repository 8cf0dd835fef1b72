"""DFlash training: it learns (memorises one sequence until it drafts it), `train=smoke` lowers the loss
and its checkpoint reloads and evaluates, and an interrupted run resumes from its last checkpoint."""
import json

import pytest
import torch

from helpers import micro_target
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.dflash import DFlashDrafter, DFlashDraftModel
from specexp.drafters.layers import init_weights
from specexp.training import data as D
from specexp.training import pipeline
from specexp.training.dflash_module import DFlashLitModule, drafter_config


def test_memorising_one_sequence_drafts_it(cfg_factory, tmp_path):
    """On a real (HF Qwen3) target of a 2,048-token vocabulary: the loss over the vocabulary is what a training step
    costs, and the full Qwen3 vocabulary of tiny_qwen3 made this test the suite's slowest."""
    t = micro_target(vocab=2048, hidden=64, layers=4, std=0.1)
    ids = torch.randint(0, 2047, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = generate(t, None, ids, DecodeConfig(max_new_tokens=48))
    seq = D.Sequence("one", torch.tensor(ids + ref.tokens), torch.tensor([0] * len(ids) + [1] * 48).bool())
    cfg = cfg_factory("task=train", "train=smoke", "drafter.block_size=8", "train.num_anchors=12",
                      "drafter.target_layer_ids=[0,3]", "train.max_steps=300", "train.epochs=1000", "train.lr=3e-3",
                      "train.ckpt_every=1000")
    config, _ = drafter_config(cfg.drafter, t)
    tc = cfg.train
    module = DFlashLitModule(init_weights(DFlashDraftModel(config), tc.seed), t, num_anchors=tc.num_anchors, gamma=4.0,
                             lr=tc.lr, warmup_ratio=tc.warmup_ratio, weight_decay=0.0, attention="dense", seed=tc.seed)
    trainer, _, _ = pipeline.lightning_fit(tc, None, module, D.OnlineSequences([seq]), tmp_path, t.device)
    assert trainer.global_step == 300 and float(trainer.logged_metrics["train/tau_sim"]) > 6
    module.model.save_pretrained(tmp_path / "drafter")
    drafter = DFlashDrafter(DFlashDraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32), t)
    spec = generate(t, drafter, ids, DecodeConfig(max_new_tokens=48))
    assert spec.tokens == ref.tokens                                    # still lossless
    tau = sum(spec.accept_lengths) / len(spec.accept_lengths)
    assert tau > 6.0, spec.accept_lengths                               # block size 8: at most 8


@pytest.mark.slow
def test_smoke_training_lowers_the_loss_and_its_checkpoint_evaluates(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    cfg = cfg_factory("task=train", "train=smoke", "data=smoke", f"paths.cache={tmp_path / 'cache'}",
                      "train.eval_after=true", "benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=12",
                      f"train.export_dir={tmp_path / 'export'}")
    card = pipeline.run_train(cfg, tmp_path / "run")
    assert card["steps"] == 40
    # the run directory names the trained drafter and links to it
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["checkpoint"] == str((tmp_path / "export").resolve())
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").exists()
    # The loss on fixed blocks of the training sequences, before (the same seeded init) and after training.
    from specexp import registry
    target = registry.build_target(cfg.target, torch.device("cpu"))
    seqs = pipeline.context(cfg).seqs
    config, _ = drafter_config(cfg.drafter, target)

    def loss_of(model):
        m = DFlashLitModule(model.float(), target, num_anchors=8, gamma=7.0, lr=0, warmup_ratio=0, weight_decay=0,
                            attention="dense", seed=0)
        with torch.no_grad():
            return sum(float(m.blocks_loss(s.ids, s.loss_mask, target.forward(
                s.ids[None], 0, target.new_cache(), taps=config.target_layer_ids)[1][0], step=i)[0])
                for i, s in enumerate(seqs)) / len(seqs)

    before = loss_of(init_weights(DFlashDraftModel(config), cfg.train.seed))
    after = loss_of(DFlashDraftModel.from_pretrained(f"{card['run_dir']}/artifact"))
    assert after < before - 1.0, (before, after)
    assert card["eval"]["benchmarks"]["gsm8k"]["tau"] >= 1.0
    assert json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())["benchmarks"]["gsm8k"][
        "lossless_mismatches"] == 0
    reloaded = DFlashDraftModel.from_pretrained(tmp_path / "export")
    assert reloaded.config.block_size == 16 and reloaded.fc.weight.dtype == torch.bfloat16
    assert card["data_hash"] and card["train_seconds"] > 0
    exported = json.loads((tmp_path / "export" / "card.json").read_text())
    assert exported["eval"]["benchmarks"]["gsm8k"]["tau"] == card["eval"]["benchmarks"]["gsm8k"]["tau"]
    assert "python -m specexp" in (tmp_path / "export" / "README.md").read_text()
    # A second identical run reuses every stage.
    again = pipeline.run_train(cfg, tmp_path / "run2")
    assert again["run_dir"] == card["run_dir"] and again["train_seconds"] == card["train_seconds"]


@pytest.mark.slow
def test_feature_cache_matches_online_taps_resumes_and_refuses_a_mismatch(tiny_target, tmp_path):
    from specexp.errors import UserError

    t = tiny_target
    seqs = [D.Sequence(f"s{i}", torch.arange(10 + i, 40 + 3 * i), torch.ones(30 + 2 * i, dtype=torch.bool))
            for i in range(3)]
    meta = {"target": "tiny", "layer_ids": [0, 2], "dtype": "float32", "data_hash": "abc"}
    cache = D.FeatureCache(tmp_path, meta)
    cache.build(t, seqs, [0, 2], torch.float32, shard_tokens=40)
    shards = sorted(tmp_path.glob("shard-*.safetensors"))
    assert len(shards) == 2
    extra = sum(p.stat().st_size for p in shards) - D.feature_bytes(sum(len(s.ids) for s in seqs), 2 * t.hidden_size,
                                                                    torch.float32)
    assert 0 <= extra < 1000, extra                    # the disk check's size: exact up to the shard headers
    ds = cache.dataset()
    for i, s in enumerate(seqs):
        _, taps = t.forward(s.ids[None], 0, t.new_cache(), taps=(0, 2))
        item = ds[i]
        assert torch.equal(item["ids"], s.ids) and torch.equal(item["loss_mask"], s.loss_mask)
        torch.testing.assert_close(item["taps"], taps[0])
    # Resume: a missing shard is rebuilt, an existing one is kept as it is.
    kept = shards[0].stat().st_mtime_ns
    shards[1].unlink()
    (tmp_path / "index.json").unlink()
    D.FeatureCache(tmp_path, meta).build(t, seqs, [0, 2], torch.float32, shard_tokens=40)
    assert shards[1].exists() and shards[0].stat().st_mtime_ns == kept
    with pytest.raises(UserError, match="was made with different layer_ids"):
        D.FeatureCache(tmp_path, {**meta, "layer_ids": [1, 3]})


def test_a_feature_cache_larger_than_the_free_disk_is_refused_before_any_target_pass(tmp_path, monkeypatch):
    """The size is exact (tokens x taps width x dtype + ids and mask); a resumed build counts only the shards it
    still has to write."""
    import shutil

    from specexp.errors import UserError

    class NoTarget:
        hidden_size = 64

        def forward(self, *a, **k):
            raise AssertionError("a target pass ran before the disk check")

    seqs = [D.Sequence(f"s{i}", torch.arange(30), torch.ones(30, dtype=torch.bool)) for i in range(4)]  # 2 shards
    assert D.feature_bytes(60, 2 * 64, torch.bfloat16) == 60 * (2 * 64 * 2 + 9)
    need = D.feature_bytes(120, 2 * 64, torch.bfloat16)                          # 31,080 bytes
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(D.shutil, "disk_usage", lambda p: usage._replace(free=need - 1))
    root = tmp_path / "features"                                                 # not made yet: its parent is read
    with pytest.raises(UserError, match=r"needs 0\.0 GB for the target taps of 120 tokens but .* 0\.0 GB free: use "
                                        r"data\.features=online"):
        D.FeatureCache(root, {}).build(NoTarget(), seqs, [0, 2], torch.bfloat16, shard_tokens=60)
    assert not root.exists()                                                     # nothing written
    root.mkdir()
    (root / "shard-00000.safetensors").touch()                                  # resumed: half of it is there
    monkeypatch.setattr(D.shutil, "disk_usage", lambda p: usage._replace(free=need // 2 - 1))
    with pytest.raises(UserError, match="of 60 tokens"):
        D.FeatureCache(root, {}).build(NoTarget(), seqs, [0, 2], torch.bfloat16, shard_tokens=60)


@pytest.mark.slow
def test_interrupted_training_resumes_from_its_last_checkpoint(cfg_factory, tmp_path, monkeypatch):
    import lightning as L

    cfg = cfg_factory("task=train", "train=smoke", "train.max_steps=12", "train.ckpt_every=4", "train.num_anchors=4",
                      f"paths.cache={tmp_path / 'cache'}")

    class Crash(Exception):
        pass

    class Stop(L.Callback):
        def on_train_batch_end(self, trainer, *a):
            if trainer.global_step == 6:
                raise Crash

    real = L.Trainer

    def with_stop(*a, callbacks=(), **k):
        return real(*a, callbacks=[*callbacks, Stop()], **k)

    monkeypatch.setattr(L, "Trainer", with_stop)
    with pytest.raises(Crash):
        pipeline.run_train(cfg, tmp_path / "run")
    ckpts = list((tmp_path / "cache").glob("stages/dflash-*/checkpoints/last.ckpt"))
    assert len(ckpts) == 1 and torch.load(ckpts[0], weights_only=True)["global_step"] == 4
    monkeypatch.setattr(L, "Trainer", real)
    card = pipeline.run_train(cfg, tmp_path / "run")
    assert card["steps"] == 12
    log = (ckpts[0].parent.parent / "logs" / "version_0" / "metrics.csv").read_text()
    assert log.count("\n") > 1
