"""DFlash: the z-lab checkpoint format (strict load, exact round trip), the forward pass against an
independent computation from HF Qwen3 parts, and greedy losslessness through the engine."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specexp import checkpoints as ckpt
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.dflash import DFlashDrafter, DFlashDraftModel, build_target_layer_ids, check_fits
from specexp.drafters.layers import init_weights
from specexp.errors import UserError

H, I, NH, NKV, D, LAYERS, IDS = 64, 128, 4, 2, 16, 2, [0, 2]


def zlab_config(**over):
    """A config.json with the z-lab field set (tiny dimensions that fit the tiny_qwen3 target)."""
    c = {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "attention_bias": False, "attention_dropout": 0.0, "block_size": 8,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": IDS},
        "dtype": "bfloat16", "head_dim": D, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
        "intermediate_size": I, "layer_types": ["full_attention"] * LAYERS, "max_position_embeddings": 40960,
        "max_window_layers": LAYERS, "model_type": "qwen3", "num_attention_heads": NH, "num_hidden_layers": LAYERS,
        "num_key_value_heads": NKV, "num_target_layers": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "transformers_version": "4.57.3",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    }
    c.update(over)
    return c


def zlab_tensors(seed=0):
    """The exact key names and shapes of a z-lab drafter, written by hand (bf16, as released)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"fc.weight": [H, len(IDS) * H], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(LAYERS):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": [NH * D, H], p + "self_attn.k_proj.weight": [NKV * D, H],
            p + "self_attn.v_proj.weight": [NKV * D, H], p + "self_attn.o_proj.weight": [H, NH * D],
            p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
            p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I],
            p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
        })
    out = {}
    for k, s in shapes.items():
        t = 1 + 0.1 * torch.randn(s, generator=g) if len(s) == 1 else 0.1 * torch.randn(s, generator=g)
        out[k] = t.to(torch.bfloat16)
    return out


@pytest.fixture
def zlab_dir(tmp_path):
    d = tmp_path / "zlab"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(zlab_config(), indent=2))
    save_file(zlab_tensors(), d / "model.safetensors", metadata={"format": "pt"})
    return d


def test_reference_layer_rule():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]
    assert build_target_layer_ids(36, 1) == [18]


def test_zlab_checkpoint_loads_strictly_and_round_trips(zlab_dir, tmp_path):
    model = DFlashDraftModel.from_pretrained(zlab_dir)
    assert model.fc.weight.dtype == torch.bfloat16
    assert model.config.mask_token_id == 151669 and model.config.target_layer_ids == IDS
    assert model.config.block_size == 8 and model.config.rope_theta == 1000000
    out = tmp_path / "saved"
    model.save_pretrained(out)
    assert json.loads((out / "config.json").read_text()) == json.loads((zlab_dir / "config.json").read_text())
    a, b = load_file(zlab_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    for f in ("config.json", "model.safetensors"):      # readable like any file of the tree (safetensors writes 0600)
        assert (out / f).stat().st_mode & 0o777 == 0o644, f


def test_zlab_checkpoint_drafts_losslessly(zlab_dir, tiny_target):
    model = DFlashDraftModel.from_pretrained(zlab_dir, dtype=torch.float32)
    check_fits(model.config, tiny_target, "ckpt")
    drafter = DFlashDrafter(model, tiny_target)
    assert drafter.tap_layers == (0, 2) and drafter.max_drafts == 7
    ids = tiny_target.encode_chat([{"role": "user", "content": "Name three prime numbers."}])
    dc = DecodeConfig(max_new_tokens=30)
    assert generate(tiny_target, drafter, ids, dc).tokens == generate(tiny_target, None, ids, dc).tokens


@pytest.mark.parametrize("corruption, message", [
    ("drop", "missing tensor layers.1.mlp.up_proj.weight"),
    ("extra", "unexpected tensor embed_tokens.weight"),
    ("shape", "fc.weight has shape"),
    ("garbage", "cannot read model.safetensors"),
    ("no_mask", "no dflash_config.mask_token_id"),
    ("bad_json", "not valid JSON"),
])
def test_bad_checkpoints_are_named(zlab_dir, corruption, message):
    t = zlab_tensors()
    if corruption == "drop":
        del t["layers.1.mlp.up_proj.weight"]
    elif corruption == "extra":
        t["embed_tokens.weight"] = torch.zeros(4, H)
    elif corruption == "shape":
        t["fc.weight"] = torch.zeros(H, 3 * H)
    save_file(t, zlab_dir / "model.safetensors")
    if corruption == "garbage":
        (zlab_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    if corruption == "no_mask":
        (zlab_dir / "config.json").write_text(json.dumps(zlab_config(dflash_config={"target_layer_ids": IDS})))
    if corruption == "bad_json":
        (zlab_dir / "config.json").write_text("{")
    with pytest.raises(UserError, match=message):
        DFlashDraftModel.from_pretrained(zlab_dir)


@pytest.mark.parametrize("over, message", [
    ({"hidden_size": 32}, "hidden_size 32 does not fit"),
    ({"vocab_size": 1000}, "vocab_size 1000 does not fit"),
    ({"num_target_layers": 36}, "num_target_layers 36 does not fit"),
    ({"dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9]}}, "out of range"),
])
def test_checkpoint_must_fit_the_target(tiny_target, over, message):
    from specexp.drafters.dflash import DFlashConfig

    with pytest.raises(UserError, match=message):
        check_fits(DFlashConfig.from_dict(zlab_config(**over)), tiny_target, "ckpt")


def test_forward_matches_independent_hf_computation(zlab_dir):
    """One layer recomputed from transformers' own Qwen3 pieces (RMSNorm, RoPE, repeat_kv)."""
    from transformers.models.qwen3 import modeling_qwen3 as q3

    model = DFlashDraftModel.from_pretrained(zlab_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    C, Q = 5, 8
    taps, x = torch.randn(1, C, 2 * H, generator=g), torch.randn(1, Q, H, generator=g)
    ctx_pos, blk_pos = torch.arange(C)[None], torch.arange(C, C + Q)[None]
    ours = model(x, blk_pos, model.context_kv(taps, ctx_pos))

    def norm(w, t):
        n = q3.Qwen3RMSNorm(w.shape[0], eps=1e-6)
        n.weight.data = w.float()
        return n(t)

    cfg = q3.Qwen3Config(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=D,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    rope = q3.Qwen3RotaryEmbedding(cfg)
    sd = {k: v.float() for k, v in model.state_dict().items()}
    ctx = norm(sd["hidden_norm.weight"], taps @ sd["fc.weight"].T)
    pos = torch.cat([ctx_pos, blk_pos], 1)
    cos, sin = rope(x, pos)
    h = x
    for i in range(LAYERS):
        p = f"layers.{i}."
        a = norm(sd[p + "input_layernorm.weight"], h)
        q = norm(sd[p + "self_attn.q_norm.weight"], (a @ sd[p + "self_attn.q_proj.weight"].T).view(1, Q, NH, D))
        kin = torch.cat([ctx, a], 1)
        k = norm(sd[p + "self_attn.k_norm.weight"], (kin @ sd[p + "self_attn.k_proj.weight"].T).view(1, C + Q, NKV, D))
        v = (kin @ sd[p + "self_attn.v_proj.weight"].T).view(1, C + Q, NKV, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, _ = q3.apply_rotary_pos_emb(q, q, cos[:, C:], sin[:, C:])
        k, _ = q3.apply_rotary_pos_emb(k, k, cos, sin)
        k, v = q3.repeat_kv(k, NH // NKV), q3.repeat_kv(v, NH // NKV)
        att = torch.softmax(q @ k.transpose(-1, -2) / D ** 0.5, -1) @ v              # no mask: bidirectional
        h = h + att.transpose(1, 2).reshape(1, Q, NH * D) @ sd[p + "self_attn.o_proj.weight"].T
        m = norm(sd[p + "post_attention_layernorm.weight"], h)
        h = h + (torch.nn.functional.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
                 ) @ sd[p + "mlp.down_proj.weight"].T
    torch.testing.assert_close(ours, norm(sd["norm.weight"], h), rtol=1e-4, atol=1e-4)


def test_block_is_bidirectional_and_context_incremental(tiny_target, tiny_dflash):
    m = tiny_dflash.model
    g = torch.Generator().manual_seed(0)
    taps = torch.randn(1, 12, m.fc.in_features, generator=g)
    x = torch.randn(1, 16, m.config.hidden_size, generator=g)
    pos = torch.arange(12, 28)[None]
    full = m(x, pos, m.context_kv(taps, torch.arange(12)[None]))
    # Context appended in pieces (prefill, then commits) gives the same K/V as one pass.
    tiny_dflash.reset()
    tiny_dflash.prefill(taps[:, :5])
    tiny_dflash.commit(3, taps[:, 5:9])
    tiny_dflash.commit(2, taps[:, 9:12])
    torch.testing.assert_close(m(x, pos, tiny_dflash.ctx), full)
    # Perturbing the last block position changes the first one's output: attention is not causal.
    x2 = x.clone()
    x2[0, -1] += 1.0
    assert (m(x2, pos, m.context_kv(taps, torch.arange(12)[None]))[0, 0] - full[0, 0]).abs().max() > 1e-4


def test_random_init_is_seeded(tiny_target):
    from specexp.drafters.dflash import DFlashConfig

    c = DFlashConfig.for_target(tiny_target, 1, 16)
    a, b = init_weights(DFlashDraftModel(c), 3), init_weights(DFlashDraftModel(c), 3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert c.target_layer_ids == [2] and c.mask_token_id == 151669 and c.hidden_size == 64
    d = c.to_dict()   # the z-lab field set, for the reference loader
    assert d["hidden_act"] == "silu" and d["layer_types"] == ["full_attention"] and d["tie_word_embeddings"] is False


def test_flex_attention_gets_q_and_k_in_the_dtype_of_v(monkeypatch):
    """Under bf16 autocast the fp32 q/k norm weights make q and k fp32 while v is bf16; flex attention (unlike
    SDPA) is not cast by autocast, so the layer casts q and k itself, and the result equals the dense path."""
    from specexp.drafters import dflash
    from specexp.drafters.dflash import Attention, DFlashConfig
    from specexp.training.anchors import dense_mask, flex_mask

    c = DFlashConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, vocab_size=50, block_size=4, num_target_layers=1,
                     target_layer_ids=[0], mask_token_id=1)
    torch.manual_seed(0)
    att = Attention(c).requires_grad_(False)                  # flex has no CPU backward
    seen, real = [], dflash._flex
    monkeypatch.setattr(dflash, "_flex", lambda dev: lambda q, k, v, **kw: seen.append((q.dtype, k.dtype, v.dtype))
                        or real(dev)(q, k, v, **kw))
    anchors, s = torch.tensor([2, 6]), 10
    x, ctx = torch.randn(1, 8, 32), torch.randn(1, 2, s, 8, dtype=torch.bfloat16)  # [1, Q, H], [1, Hkv, S, D]
    cos, sin = torch.ones(1, 8, 8), torch.zeros(1, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dense = att(x, cos, sin, ctx, ctx, dense_mask(anchors, s, 4))
        flex = att(x, cos, sin, ctx, ctx, flex_mask(anchors, s, 4))
    assert seen == [(torch.bfloat16,) * 3]
    torch.testing.assert_close(flex.float(), dense.float(), rtol=2e-2, atol=2e-2)


def test_hub_checkpoint_is_downloaded_at_drafter_revision(zlab_dir, tiny_target, cfg_factory, monkeypatch):
    """`drafter.revision` reaches snapshot_download (faked: tests never touch the hub) and run.json records it."""
    import huggingface_hub
    from omegaconf import OmegaConf

    from specexp.drafters import dflash
    from specexp.eval.summary import run_settings

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, revision=None, allow_patterns=None: calls.append((repo_id, revision))
                        or str(zlab_dir))
    cfg = OmegaConf.create({"init": "checkpoint", "checkpoint": "org/drafter", "revision": "a1b2c3d"})
    assert dflash.build(dflash.DFlashSettings.of(cfg), tiny_target).max_drafts == 7
    assert ckpt.resolve("org/drafter") == zlab_dir
    assert calls == [("org/drafter", "a1b2c3d"), ("org/drafter", None)]
    with pytest.raises(UserError, match=r"drafter.revision='v1' pins a hub checkpoint.*local directory"):
        ckpt.resolve(str(zlab_dir), "v1")
    cfg = cfg_factory("drafter.revision=v1")
    assert run_settings(cfg, torch.device("cpu"))["drafter"]["revision"] == "v1"


def test_init_resolution_is_one_rule():
    """`drafter.init` (and `drafter.head.init`) mean the same for every drafter: auto = the checkpoint when one is
    set, else random; checkpoint without one, or an unknown value, is one line naming the key."""
    assert ckpt.resolve_init("auto", None) == "random" and ckpt.resolve_init("auto", "d") == "checkpoint"
    assert ckpt.resolve_init("random", "d") == "random" and ckpt.resolve_init("checkpoint", "d") == "checkpoint"
    with pytest.raises(UserError, match=r"^drafter.init=checkpoint needs drafter.checkpoint=DIR \(or a hub id\)"):
        ckpt.resolve_init("checkpoint", None)
    with pytest.raises(UserError, match=r"^drafter.head.init='x' is not valid; choose one of: auto, random, check"):
        ckpt.resolve_init("x", None, "drafter.head")


# ------------------------------------------------------------------------------ eval.draft_vocab
def _regen_set(root, target_name: str, rows: list[tuple[list[int], list[int]]]):
    """A regeneration set (data/regen/README.md's format) of (prompt ids, response ids) rows."""
    import numpy as np

    root.mkdir()
    flat = [t for p, r in rows for t in p + r]
    np.save(root / "tokens.npy", np.asarray(flat, dtype=np.int32))
    (root / "manifest.json").write_text(json.dumps({
        "format": "specexp-regen/1", "provenance": {"target": {"name": target_name}},
        "rows": [[f"r{i}", len(p), len(r), True] for i, (p, r) in enumerate(rows)]}))
    return root


def test_a_restricted_draft_vocabulary_drafts_only_its_tokens_and_keeps_the_targets_output(cfg_factory, tmp_path,
                                                                                        tiny_target):
    from specexp import registry
    from specexp.drafters.dflash import draft_vocab_ids

    prompt = tiny_target.encode_chat([{"role": "user", "content": "Count from one to twenty."}])
    ar = generate(tiny_target, None, prompt, DecodeConfig(max_new_tokens=24)).tokens
    # the answers' tokens: the AR output's own (so drafts can be accepted) and a few more; prompt tokens never count
    rows = [(prompt[:5], ar), (prompt[:3], ar[:10] + [7, 7, 7, 9])]
    regen = _regen_set(tmp_path / "regen", "tiny_qwen3", rows)
    ids = draft_vocab_ids(str(regen), tiny_target, 6)
    assert ids.tolist() == sorted(ids.tolist()) and len(ids) == 6 and 7 in ids.tolist()
    assert not set(ids.tolist()) & (set(prompt[:5]) - set(ar) - {7, 9})
    d = registry.build_drafter(cfg_factory().drafter, tiny_target, (6, str(regen)))
    assert torch.equal(d.lm_head.ids, ids)
    with torch.inference_mode():
        h = torch.randn(3, tiny_target.hidden_size)
        full, sub = tiny_target.lm_head(h), d.lm_head(h)                                     # [3, V]
        rows = torch.nn.functional.linear(h, tiny_target.lm_head.weight[ids])                 # [3, 6]
    # the sub-head is the full head's rows for `ids`, placed at `ids` (one product: bit for bit); against the full
    # head's columns only up to rounding, since a 6-row and a V-row GEMM may sum in another order on some CPUs
    assert torch.equal(sub[:, ids], rows) and bool((sub.isinf().sum(-1) == sub.shape[-1] - 6).all())
    torch.testing.assert_close(sub[:, ids], full[:, ids])
    seen = []
    real = d.propose
    d.propose = lambda *a: seen.append(p := real(*a)) or p
    out = generate(tiny_target, d, prompt, DecodeConfig(max_new_tokens=24))
    assert out.tokens == ar and seen and all(set(p.tokens.tolist()) <= set(ids.tolist()) for p in seen)
    seen.clear()                                     # protocol B: q is a distribution over the draft vocabulary
    g = torch.Generator().manual_seed(0)
    generate(tiny_target, d, prompt, DecodeConfig(protocol="B", temperature=1.0, max_new_tokens=16), generator=g)
    outside = torch.ones(tiny_target.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert seen and all(bool((p.q[:, outside] == 0).all()) and torch.allclose(p.q.sum(-1), torch.ones(len(p.q)))
                        and set(p.tokens.tolist()) <= set(ids.tolist()) for p in seen)


def test_auto_draft_vocabulary_is_a_cpu_dflash_speed_setting_recorded_as_resolved(cfg_factory, tmp_path):
    from specexp.config import EvalConfig
    from specexp.decoding.settings import CPU_DRAFT_VOCAB, draft_vocab
    from specexp.eval.summary import run_settings

    regen = _regen_set(tmp_path / "regen", "tiny_qwen3", [([1, 2], [3, 4])])
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cfg = cfg_factory("eval.draft_vocab=auto", f"eval.draft_vocab_from={regen}")
    ev = EvalConfig.from_cfg(cfg.eval)
    assert draft_vocab(ev, "dflash", cpu) == (CPU_DRAFT_VOCAB, str(regen))
    assert draft_vocab(ev, "dflash", cuda) is None and draft_vocab(ev, "dels_rnn", cpu) is None
    assert draft_vocab(ev, "dflash", cpu, timed=False) is None                # replay: τ alone, the whole vocabulary
    assert draft_vocab(EvalConfig.from_cfg(cfg_factory("eval.draft_vocab=auto", "eval.draft_vocab_from=nowhere").eval),
                       "dflash", cpu) is None
    # eval=mini points at data/regen/<target>-greedy256, which the tiny test target does not have: unchanged runs
    assert cfg_factory().eval.draft_vocab == "auto" and cfg_factory("eval=paper").eval.draft_vocab is None
    plain = run_settings(cfg_factory(), cpu)
    assert "draft_vocab" not in plain["eval"] and not any("draft_vocab" in k for k in plain["checkpoint_content"])
    got = run_settings(cfg, cpu)
    assert got["eval"]["draft_vocab"] == CPU_DRAFT_VOCAB and got["eval"]["draft_vocab_from"] == str(regen)
    assert "eval.draft_vocab_from" in got["checkpoint_content"]              # other answers: another run


@pytest.mark.parametrize("extra, message", [
    (["eval.draft_vocab=64", "eval.draft_vocab_from=null"], r"^eval.draft_vocab=64 needs eval.draft_vocab_from=DIR"),
    (["eval.draft_vocab=0"], r"^eval.draft_vocab=0 is not valid; expected an int >= 1, null"),
    (["drafter=dels_rnn", "eval.draft_vocab=64", "eval.draft_vocab_from=x"],
     r"^eval.draft_vocab=64: only drafter=dflash drafts from a restricted vocabulary \(this is dels_rnn\)"),
])
def test_a_bad_draft_vocabulary_is_one_line(cfg_factory, extra, message):
    from specexp.config import validate

    with pytest.raises(UserError, match=message):
        validate(cfg_factory(*extra))


def test_a_draft_vocabulary_from_another_targets_answers_is_refused(cfg_factory, tmp_path, tiny_target):
    from specexp import registry

    regen = _regen_set(tmp_path / "regen", "smollm2_135m", [([1, 2], [3, 4])])
    with pytest.raises(UserError, match=r"holds smollm2_135m's answers, not tiny_qwen3's$"):
        registry.build_drafter(cfg_factory().drafter, tiny_target, (2, str(regen)))
