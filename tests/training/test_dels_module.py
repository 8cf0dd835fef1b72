"""DeLS local heads: the prior equals hand counts, a head trained (through Lightning) on one sequence
reproduces it through the merged inference path, and task=train / task=prior write a usable head + prior."""
import json
import math

import pytest
import torch

from specexp.drafters import dels
from specexp.training import data as D
from specexp.training.dels_module import LocalHeadLitModule, count_assistant_tokens, run_prior
from specexp.training.pipeline import lightning_fit, run_train


def test_prior_matches_hand_counts(tmp_path):
    seqs = [D.Sequence("a", torch.tensor([5, 1, 2, 2, 3]), torch.tensor([0, 0, 1, 1, 1]).bool()),
            D.Sequence("b", torch.tensor([2, 4, 4, 0]), torch.tensor([0, 1, 1, 1]).bool())]
    counts = count_assistant_tokens(seqs, 8)
    assert counts.tolist() == [1, 0, 2, 1, 2, 0, 0, 0]          # prompt tokens (5, 1, the first 2) not counted
    lp = dels.log_prior_from_counts(counts, 1.0)
    assert lp.shape == (8,) and math.isclose(float(lp[2]), math.log(3 / (6 + 8)), rel_tol=1e-6)
    assert math.isclose(float(lp[7]), math.log(1 / 14), rel_tol=1e-6)
    raw = dels.log_prior_from_counts(counts, 0.0)                  # unseen tokens: the smallest seen log-prob
    assert math.isclose(float(raw[5]), math.log(1 / 6), rel_tol=1e-6)
    assert float(raw[2]) == pytest.approx(math.log(2 / 6))
    dels.save_prior(counts, tmp_path, 1.0, {"data": "hand"})
    assert torch.equal(dels.load_prior(tmp_path, 8, 1.0, "x"), lp)
    assert torch.allclose(dels.load_prior(tmp_path, 8, 0.5, "x"), dels.log_prior_from_counts(counts, 0.5))
    assert dels.load_prior(tmp_path, 10, 1.0, "x").shape == (10,)  # padded to a larger vocabulary


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["rnn", "markov"])
def test_head_memorises_a_sequence_through_the_inference_path(cfg_factory, tiny_target, tmp_path, kind):
    t = tiny_target
    g = torch.Generator().manual_seed(0)
    resp = torch.randperm(3000, generator=g)[:40] + 1000        # distinct tokens: every successor is unique
    ids = torch.cat([torch.tensor([1, 2, 3]), resp])
    lm = torch.tensor([0, 0, 0] + [1] * 40).bool()
    c = dels.LocalHeadConfig(kind, t.hidden_size, t.vocab_size, input_rank=32, gru_hidden=64, output_rank=32)
    torch.manual_seed(0)
    head = dels.make_head(c)
    module = LocalHeadLitModule(head, t, block_size=8, num_anchors=12, gamma=7.0, lr=2e-2, warmup_ratio=0.04,
                                weight_decay=0.0, seed=0)
    cfg = cfg_factory("train=smoke", "train.max_steps=90", "train.epochs=1000", "train.ckpt_every=1000")
    trainer, _, _ = lightning_fit(cfg.train, None, module, [{"ids": ids, "loss_mask": lm}], tmp_path, t.device)
    assert trainer.global_step == 90
    merged = dels.MergedHead(head, t.embed_tokens.weight, t.lm_head.weight, torch.float32, "cpu")
    hits = total = 0
    with torch.no_grad():
        for a in range(3, len(ids) - 7):                          # zero state at every start, 7 steps
            state = merged.begin(ids[a])
            for j in range(1, 8):
                pred = int((merged.w_out @ merged.feature(state)).argmax())
                hits, total = hits + (pred == int(ids[a + j])), total + 1
                state = merged.advance(state, ids[a + j])
    assert hits / total > 0.9, (hits, total)
    # The trained head inside a DeLS drafter stays lossless (greedy == AR).
    from specexp.decoding.engine import DecodeConfig, generate

    drafter = dels.DeLSDrafter(registry_dflash(cfg_factory, t), merged, torch.zeros(t.vocab_size), 2.0, 0.0)
    prompt = t.encode_chat([{"role": "user", "content": "Continue the list."}])
    assert generate(t, drafter, prompt, DecodeConfig(max_new_tokens=24)).tokens == generate(
        t, None, prompt, DecodeConfig(max_new_tokens=24)).tokens


def registry_dflash(cfg_factory, t):
    from specexp import registry

    return registry.build_drafter(cfg_factory().drafter, t)


@pytest.mark.slow
def test_train_task_writes_head_and_prior_and_evaluates(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    common = ["data=smoke", f"paths.cache={tmp_path / 'cache'}"]
    cfg = cfg_factory("task=train", "drafter=dels_rnn", "train=smoke", *common, "drafter.head.train.num_anchors=8",
                      "drafter.head.gru_hidden=64", "train.eval_after=true", "benchmark=gsm8k",
                      "eval.num_samples=1", "eval.max_new_tokens=12", f"train.export_dir={tmp_path / 'head'}")
    card = run_train(cfg, tmp_path / "run")
    assert card["steps"] == 4 and card["facts"]["recipe"]["block_size"] == 16 and card["trainable_params"] > 0
    out = tmp_path / "head"
    assert {"config.json", "model.safetensors", "log_prior.safetensors", "card.json", "README.md"} <= {
        p.name for p in out.iterdir()}
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["drafter"] == "dels_rnn" and summary["benchmarks"]["gsm8k"]["lossless_mismatches"] == 0
    # task=prior on the same data gives the same counts as the prior written beside the head.
    pcfg = cfg_factory("task=prior", *common, f"task.out={tmp_path / 'prior'}")
    s = run_prior(pcfg, tmp_path / "prior_run")
    from safetensors.torch import load_file

    assert torch.equal(load_file(out / "log_prior.safetensors")["counts"],
                       load_file(tmp_path / "prior" / "log_prior.safetensors")["counts"])
    assert s["tokens"] == card["response_tokens"]


def _fused_losses(bb, head, lp, t, seqs, w) -> list[float]:
    """The fused CE summed over `seqs` at α = β = 0.3 and at the learned weights `w` (same anchors: seed 0)."""
    from specexp.training.dels_module import FusionWeightsLitModule

    losses = []
    for a, b in ((0.3, 0.3), (w["alpha"], w["beta"])):
        m = FusionWeightsLitModule(bb, head, lp, t, num_anchors=8, gamma=7.0, alpha=a, beta=b, lr=0,
                                   warmup_ratio=0, seed=0)
        with torch.no_grad():
            losses.append(sum(float(m.fused_loss(s.ids, s.loss_mask, t.forward(
                s.ids[None], 0, t.new_cache(), taps=bb.config.target_layer_ids)[1][0], i))
                for i, s in enumerate(seqs)))
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("features", ["online", "cache"])
def test_learned_fusion_weights_train_and_load(cfg_factory, tiny_target, tmp_path, monkeypatch, features):
    """Per-position alpha/beta on frozen parts, target taps computed in each step or read from the feature
    cache: the CE of the fused drafts drops, the weights move away from their init, and fusion=learned reads
    them back into a lossless drafter."""
    from specexp import registry
    from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
    from specexp.drafters.layers import init_weights

    t = tiny_target
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    bb = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 8, None)), 0)
    bb.save_pretrained(tmp_path / "dflash")
    c = dels.LocalHeadConfig("rnn", t.hidden_size, t.vocab_size, input_rank=16, gru_hidden=32, output_rank=16)
    dels.save_head(dels.random_head(c, 0, 0.5), tmp_path / "head")
    dels.save_prior(torch.ones(t.vocab_size, dtype=torch.long), tmp_path / "head", 1.0, {})
    parts = ["drafter=dels_rnn", f"drafter.checkpoint={tmp_path / 'dflash'}", "drafter.init=checkpoint",
             f"drafter.head.checkpoint={tmp_path / 'head'}", "drafter.head.init=checkpoint"]
    cfg = cfg_factory("task=train", *parts, "drafter.head.train.part=fusion_weights", "train=smoke", "data=smoke",
                      f"data.features={features}", f"paths.cache={tmp_path / 'cache'}", "drafter.head.train.epochs=5",
                      "train.lr=0.05",
                      "drafter.head.train.num_anchors=8", f"train.export_dir={tmp_path / 'head'}")
    card = run_train(cfg, tmp_path / "run")
    w = json.loads((tmp_path / "head" / "fusion_weights.json").read_text())
    assert len(w["alpha"]) == len(w["beta"]) == 6 and card["steps"] == 20
    assert max(abs(a - 0.3) for a in w["alpha"] + w["beta"]) > 0.05
    from specexp.training.pipeline import context

    seqs = context(cfg).seqs
    head, lp = dels.load_head(tmp_path / "head", "h"), dels.load_prior(tmp_path / "head", t.vocab_size, 1.0, "p")
    losses = _fused_losses(bb, head, lp, t, seqs, w)
    assert losses[1] < losses[0], losses
    ecfg = cfg_factory(*parts, "fusion=learned")
    drafter = registry.build_drafter(ecfg.drafter, t)
    assert drafter.alpha == pytest.approx(w["alpha"]) and drafter.beta == pytest.approx(w["beta"])
    from specexp.decoding.engine import DecodeConfig, generate

    ids = t.encode_chat([{"role": "user", "content": "Name three rivers."}])
    assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=20)).tokens == generate(
        t, None, ids, DecodeConfig(max_new_tokens=20)).tokens


@pytest.mark.slow
def test_learned_fusion_weights_train_on_a_released_head(cfg_factory, tiny_target, tmp_path, monkeypatch):
    """drafter.head.checkpoint = a directory in the DeLS-Spec release layout (its own [V, r] output table, its
    prior): the α/β training reads it as dels.load_release does, the fused CE drops, fusion=learned reads the
    weights back."""
    from helpers import release_head_dir
    from specexp import registry
    from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
    from specexp.drafters.layers import init_weights
    from specexp.training.pipeline import context

    t = tiny_target
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    bb = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 8, None)), 0)
    bb.save_pretrained(tmp_path / "dflash")
    head_dir, _, _ = release_head_dir(tmp_path, t.vocab_size, t.hidden_size, seed=1)
    parts = ["drafter=dels_rnn", f"drafter.checkpoint={tmp_path / 'dflash'}", "drafter.init=checkpoint",
             f"drafter.head.checkpoint={head_dir}", "drafter.head.init=checkpoint"]
    cfg = cfg_factory("task=train", *parts, "drafter.head.train.part=fusion_weights", "train=smoke", "data=smoke",
                      f"paths.cache={tmp_path / 'cache'}", "drafter.head.train.epochs=5", "train.lr=0.05",
                      "drafter.head.train.num_anchors=8", f"train.export_dir={head_dir}")
    run_train(cfg, tmp_path / "run")
    w = json.loads((head_dir / "fusion_weights.json").read_text())
    assert max(abs(a - 0.3) for a in w["alpha"] + w["beta"]) > 0.05
    head, lp = dels.load_release(head_dir, t.hidden_size, t.vocab_size, 1.0, "h")
    losses = _fused_losses(bb, head, lp, t, context(cfg).seqs, w)
    assert losses[1] < losses[0], losses
    drafter = registry.build_drafter(cfg_factory(*parts, "fusion=learned").drafter, t)
    assert drafter.alpha == pytest.approx(w["alpha"]) and drafter.beta == pytest.approx(w["beta"])


@pytest.mark.slow
def test_head_training_loads_a_lean_target_and_trains_the_same_head(cfg_factory, tmp_path, monkeypatch):
    """task=train drafter=dels_rnn reads tokens alone: its target has no decoder layer, and the head equals the
    one trained beside the whole target (same data, seed and steps)."""
    from safetensors.torch import load_file

    from specexp import registry
    from specexp.training import pipeline

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    args = ["task=train", "drafter=dels_rnn", "train=smoke", "data=smoke", f"paths.cache={tmp_path / 'cache'}",
            "drafter.head.train.num_anchors=8", "drafter.head.gru_hidden=64", "train.max_steps=3"]
    built = []
    real = registry.build_target
    monkeypatch.setattr(pipeline.registry, "build_target",
                        lambda c, d, lean=False: built.append(lean) or real(c, d, lean=lean))
    card = run_train(cfg_factory(*args, f"train.export_dir={tmp_path / 'lean'}"), tmp_path / "run")
    assert built == [True] and card["target_parts"] == "embedding and lm_head only"
    monkeypatch.setattr(registry, "train_tokens_only", lambda d: False)      # the whole target, as before
    card = run_train(cfg_factory(*args, "train.seed=0", f"train.export_dir={tmp_path / 'whole'}",
                                 f"paths.cache={tmp_path / 'cache2'}"), tmp_path / "run2")
    assert built == [True, False] and card["target_parts"] == "whole"
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("lean", "whole"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
