"""Loaders for released checkpoints in other projects' layouts (docs/checkpoints.md): the DSpark-format DFlash
drafters of DeepSpec (`deepseek-ai/dflash_qwen3_*_block7`: own embedding and lm_head, shifted alignment, 7 drafts)
and the released Domino drafters (`Huang2020/Qwen3-*-Domino-b16`: DFlash backbone + Domino head in one file).
Each file is written here by hand, tensor by tensor, at tiny sizes for the tiny_qwen3 target; a wrong key, shape
or config field is one line naming it; the loaded drafters are lossless under greedy decoding."""
import json

import pytest
import torch
from safetensors.torch import save_file

from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.dflash import DFlashDraftModel
from specexp.errors import UserError

PROMPTS = ["Hello there, how are you?", "What is 17 * 23?"]
TAPS = [1, 2]


def _layer_tensors(t, n_layers: int, g) -> dict[str, torch.Tensor]:
    """The z-lab DFlash tensors (decoder layers, fc, norms) with their released names and shapes."""
    c = t.config
    h, i, hd = c.hidden_size, c.intermediate_size, h_dim(t)
    nq, nkv = c.num_attention_heads, c.num_key_value_heads
    rnd = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    out = {}
    for n in range(n_layers):
        p = f"layers.{n}."
        out |= {p + "self_attn.q_proj.weight": rnd(nq * hd, h), p + "self_attn.k_proj.weight": rnd(nkv * hd, h),
                p + "self_attn.v_proj.weight": rnd(nkv * hd, h), p + "self_attn.o_proj.weight": rnd(h, nq * hd),
                p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
                p + "mlp.gate_proj.weight": rnd(i, h), p + "mlp.up_proj.weight": rnd(i, h),
                p + "mlp.down_proj.weight": rnd(h, i), p + "input_layernorm.weight": torch.ones(h),
                p + "post_attention_layernorm.weight": torch.ones(h)}
    return out | {"fc.weight": rnd(h, len(TAPS) * h), "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}


def h_dim(t) -> int:
    return getattr(t.config, "head_dim", None) or t.config.hidden_size // t.config.num_attention_heads


def _qwen3_fields(t, n_layers: int) -> dict:
    c = t.config
    return {"model_type": "qwen3", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": n_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": h_dim(t), "vocab_size": t.vocab_size,
            "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
            "rope_theta": 1e6, "tie_word_embeddings": False}


def _write(path, config: dict, tensors: dict):
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


def dspark_dir(t, path, *, drop=(), config_edits=None, tensor_edits=None, lm_head=None):
    """A DeepSpec DFlash block-7 checkpoint: DSpark config fields at the top level, own embed_tokens and lm_head."""
    g = torch.Generator().manual_seed(3)
    config = {**_qwen3_fields(t, 1), "architectures": ["Qwen3DSparkModel"], "num_target_layers": t.num_layers,
              "block_size": 7, "mask_token_id": 151669, "target_layer_ids": TAPS, "num_anchors": 512,
              "enable_confidence_head": False, "markov_rank": 0, "layer_types": ["full_attention"]}
    tensors = _layer_tensors(t, 1, g) | {
        "embed_tokens.weight": t.embed_tokens.weight.detach().clone(),
        "lm_head.weight": (t.lm_head.weight if lm_head is None else lm_head).detach().clone()}
    config |= config_edits or {}
    tensors |= tensor_edits or {}
    return _write(path, config, {k: v for k, v in tensors.items() if k not in drop})


def domino_dir(t, path, *, prefix="", drop=(), dc_edits=None, tensor_edits=None):
    """A released Domino drafter: z-lab DFlash config + dflash_config's Domino fields; backbone + head tensors."""
    g = torch.Generator().manual_seed(4)
    h, v, gh, emb = t.hidden_size, t.vocab_size, 32, 16
    dc = {"mask_token_id": 151669, "target_layer_ids": TAPS, "projector_type": "domino", "pure_draft_prefix_len": 1,
          "emb_dim": emb, "gru_hidden_dim": gh, "shift_label": True} | (dc_edits or {})
    config = {**_qwen3_fields(t, 1), "architectures": ["DominoDraftModel"], "num_target_layers": t.num_layers,
              "block_size": 6, "emb_dim": emb, "dflash_config": dc}
    rnd = lambda *s: torch.randn(*s, generator=g) * 0.5  # noqa: E731
    head = {"prefix_gru.weight_ih_l0": rnd(3 * gh, h), "prefix_gru.weight_hh_l0": rnd(3 * gh, gh),
            "embed_proj.0.weight": rnd(emb, h + gh), "embed_proj.2.weight": rnd(v, emb)}
    tensors = _layer_tensors(t, 1, g) | {prefix + k: w for k, w in head.items()} | (tensor_edits or {})
    return _write(path, config, {k: w for k, w in tensors.items() if k not in drop})


def build(cfg_factory, t, *overrides):
    return registry.build_drafter(cfg_factory(*overrides).drafter, t)


def assert_lossless(t, drafter, n_max=24):
    for j, prompt in enumerate(PROMPTS):
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=n_max))
        for n in (1, n_max) if j == 0 else (n_max,):      # no drafts at all; several blocks
            out = generate(t, drafter, ids, DecodeConfig(max_new_tokens=n))
            assert out.tokens == ref.tokens[:n], (prompt, n)


def _block_rows(drafter, t, prompt, anchor):
    """The backbone's block hidden rows `[B, H]` for a block at the end of `prompt`, computed directly."""
    ids = t.encode_chat([{"role": "user", "content": prompt}])
    _, taps = t.forward(torch.tensor([ids]), 0, t.new_cache(), taps=drafter.tap_layers)
    drafter.reset()
    drafter.prefill(taps)
    bb = getattr(drafter, "backbone", drafter)
    hidden, _ = bb.block_logits(anchor, len(ids), 0)
    return ids, hidden[0]


def test_dspark_block7_loads_with_its_own_head_and_the_shifted_alignment(cfg_factory, tiny_target, tmp_path):
    t = tiny_target
    g = torch.Generator().manual_seed(0)
    own_lm = t.lm_head.weight.detach() + torch.randn(t.lm_head.weight.shape, generator=g) * 0.05
    path = dspark_dir(t, tmp_path / "b7", lm_head=own_lm)
    d = build(cfg_factory, t, "drafter.init=checkpoint", f"drafter.checkpoint={path}")
    assert d.max_drafts == 7 and d.block_size == 7 and d.first_row == 0
    assert torch.equal(d.lm_head.weight, own_lm) and not torch.equal(d.lm_head.weight, t.lm_head.weight)
    for anchor in (11, 151643):
        ids, rows = _block_rows(d, t, PROMPTS[0], anchor)
        # row k (k = 0..6) predicts x_{a+k+1}: all 7 rows are drafts, through the checkpoint's own lm_head
        want = (rows[:7] @ own_lm.T).argmax(-1)
        assert torch.equal(d.propose(anchor, len(ids), 7, None).tokens, want)
        assert torch.equal(d.propose(anchor, len(ids), 3, None).tokens, want[:3])


def test_dels_heads_plug_into_the_block7_backbone_with_six_fused_positions(cfg_factory, tiny_target, tmp_path):
    t = tiny_target
    path = dspark_dir(t, tmp_path / "b7")
    small = ["drafter.head.init=random", "drafter.head.input_rank=16", "drafter.head.gru_hidden=32",
             "drafter.head.output_rank=16", "drafter.head.init_std=0.5", "drafter.init=checkpoint",
             f"drafter.checkpoint={path}"]
    six = "[4.0,4.0,4.0,4.0,4.0,4.0]"
    for kind in ("rnn", "markov"):
        d = build(cfg_factory, t, f"drafter=dels_{kind}", *small, f"fusion.alpha={six}", "fusion.beta=1.0")
        assert d.max_drafts == 7 and d.first_row == 0 and len(d.alpha) == 6
        ids, rows = _block_rows(d, t, PROMPTS[1], 11)
        first = (rows[0] @ t.lm_head.weight.T).argmax()                     # draft 1 = DFlash row 0 alone
        assert d.propose(11, len(ids), 7, None).tokens[0] == first
    with pytest.raises(UserError, match="expected a number or a list of 6"):
        build(cfg_factory, t, "drafter=dels_rnn", *small, "fusion.alpha=[0.3,0.3]")
    # a head trained at block 16 with learned per-position weights (14 each): the first 6 are used
    from specexp.drafters import dels

    head_dir = tmp_path / "head"
    c = dels.LocalHeadConfig("rnn", t.hidden_size, t.vocab_size, input_rank=8, gru_hidden=8, output_rank=8)
    dels.save_head(dels.random_head(c, 0, 0.5), head_dir)
    dels.save_prior(torch.ones(t.vocab_size, dtype=torch.long), head_dir, 1.0, {})
    learned = {"alpha": [0.1 * i for i in range(14)], "beta": [0.01 * i for i in range(14)]}
    (head_dir / dels.FUSION_WEIGHTS_FILE).write_text(json.dumps(learned))
    d = build(cfg_factory, t, "drafter=dels_rnn", "drafter.init=checkpoint", f"drafter.checkpoint={path}",
              f"drafter.head.checkpoint={head_dir}", "fusion=learned")
    assert d.alpha == pytest.approx(learned["alpha"][:6]) and d.beta == pytest.approx(learned["beta"][:6])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash", "dels_rnn", "domino_ft"])
def test_loaded_release_drafters_are_lossless(cfg_factory, tiny_target, tmp_path, kind):
    """Greedy == AR through the engine: the DSpark block-7 DFlash alone and under a DeLS head, the Domino release."""
    t = tiny_target
    if kind == "domino_ft":
        opts = [f"drafter.checkpoint={domino_dir(t, tmp_path / 'd')}", "drafter.head.alignment=shifted",
                "drafter.head.guidance=3.0"]
    else:
        opts = [f"drafter.checkpoint={dspark_dir(t, tmp_path / 'd')}"]
    if kind == "dels_rnn":
        opts += ["drafter.head.init=random", "drafter.head.input_rank=16", "drafter.head.gru_hidden=32",
                 "drafter.head.output_rank=16", "drafter.head.init_std=0.5", "fusion.alpha=4.0", "fusion.beta=1.0"]
    assert_lossless(t, build(cfg_factory, t, f"drafter={kind}", "drafter.init=checkpoint", *opts))


def test_dspark_format_errors_are_one_line(cfg_factory, tiny_target, tmp_path):
    t = tiny_target
    cases = {
        "markov": (dict(config_edits={"markov_rank": 4}), "markov_rank=4"),
        "confidence": (dict(config_edits={"enable_confidence_head": True}), "enable_confidence_head=True"),
        "embed_tap": (dict(config_edits={"target_layer_ids": [-1, 2]}), r"target_layer_ids=\[-1, 2\]"),
        "block": (dict(config_edits={"block_size": 1}), "block_size=1 must be an int >= 2"),
        "depth": (dict(config_edits={"num_target_layers": 36}), "num_target_layers 36 does not fit"),
        "no_head": (dict(drop=("lm_head.weight",)), "missing tensor lm_head.weight"),
        "embed_shape": (dict(tensor_edits={"embed_tokens.weight": torch.zeros(100, t.hidden_size)}),
                        r"embed_tokens.weight has shape \[100, 64\]"),
        "extra": (dict(tensor_edits={"markov_head.down_proj": torch.zeros(2)}), "unexpected tensor markov_head"),
    }
    for name, (kw, needle) in cases.items():
        path = dspark_dir(t, tmp_path / name, **kw)
        with pytest.raises(UserError, match=needle) as e:
            build(cfg_factory, t, "drafter.init=checkpoint", f"drafter.checkpoint={path}")
        assert "\n" not in str(e.value), name
    ok = dspark_dir(t, tmp_path / "ok")
    with pytest.raises(UserError, match="drafter=dedit needs an unshifted"):
        build(cfg_factory, t, "drafter=dedit", "drafter.init=checkpoint", f"drafter.checkpoint={ok}")
    with pytest.raises(UserError, match="not a backbone anything trains on"):
        DFlashDraftModel.from_pretrained(ok)                                # what the training stages load


@pytest.mark.parametrize("prefix", ["", "logit_head."])
def test_released_domino_drafter_loads_backbone_and_head_from_one_file(cfg_factory, tiny_target, tmp_path, prefix):
    t = tiny_target
    path = domino_dir(t, tmp_path / "dom", prefix=prefix)
    opts = ["drafter=domino_ft", "drafter.init=checkpoint", f"drafter.checkpoint={path}", "drafter.head.guidance=3.0"]
    d = build(cfg_factory, t, *opts, "drafter.head.alignment=shifted")
    assert d.max_drafts == 6 and d.first_row == 0 and d.config.gru_hidden == 32 and d.config.emb_dim == 16
    from safetensors.torch import load_file

    w = load_file(str(path / "model.safetensors"))
    assert torch.equal(d.w_out, w[prefix + "embed_proj.2.weight"])          # the file's head, not a random one
    assert torch.equal(d.backbone.model.fc.weight, w["fc.weight"])
    if prefix:
        return
    with pytest.raises(UserError, match="set drafter.head.alignment=shifted"):
        build(cfg_factory, t, *opts)                                          # the YAML default: unshifted


def test_released_domino_errors_are_one_line(cfg_factory, tiny_target, tmp_path):
    t = tiny_target
    cases = {
        "prefix": (dict(dc_edits={"pure_draft_prefix_len": 2}), "pure_draft_prefix_len=2"),
        "gru": (dict(dc_edits={"gru_hidden_dim": "big"}), "gru_hidden_dim='big'"),
        "shift": (dict(dc_edits={"shift_label": "yes"}), "shift_label='yes'"),
        "missing": (dict(drop=("embed_proj.2.weight",)), "missing tensor embed_proj.2.weight"),
        "shape": (dict(tensor_edits={"embed_proj.0.weight": torch.zeros(16, 5)}),
                  r"embed_proj.0.weight has shape \[16, 5\]"),
        "stray": (dict(tensor_edits={"lm_head.weight": torch.zeros(2)}), "unexpected tensor lm_head.weight"),
    }
    for name, (kw, needle) in cases.items():
        path = domino_dir(t, tmp_path / name, **kw)
        with pytest.raises(UserError, match=needle) as e:
            build(cfg_factory, t, "drafter=domino_ft", "drafter.init=checkpoint", f"drafter.checkpoint={path}",
                  "drafter.head.alignment=shifted")
        assert "\n" not in str(e.value), name
    with pytest.raises(UserError, match="load it with drafter=domino_ft"):
        build(cfg_factory, t, "drafter.init=checkpoint", f"drafter.checkpoint={domino_dir(t, tmp_path / 'ok')}")


def test_replay_drafts_equal_the_protocol_on_the_block7_backbone(cfg_factory, tiny_target, tmp_path):
    """propose_all (greedy replay of a known sequence) reads the shifted rows as propose does: for DFlash alone and
    under a DeLS head, at several anchors, every computed draft equals propose's after prefill of the same taps."""
    t = tiny_target
    path = dspark_dir(t, tmp_path / "b7")
    dels_opts = ["drafter.head.init=random", "drafter.head.input_rank=16", "drafter.head.gru_hidden=32",
                 "drafter.head.output_rank=16", "drafter.head.init_std=0.5", "fusion.alpha=4.0", "fusion.beta=1.0"]
    prompt = t.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    ids = torch.tensor(prompt + generate(t, None, prompt, DecodeConfig(max_new_tokens=16)).tokens)
    for kind, extra in (("dflash", []), ("dels_rnn", dels_opts)):
        d = build(cfg_factory, t, f"drafter={kind}", "drafter.init=checkpoint", f"drafter.checkpoint={path}", *extra)
        _, taps = t.forward(ids[None, :-1], 0, t.new_cache(), taps=d.tap_layers)
        starts = torch.tensor([len(prompt) - 1, len(prompt) + 3, len(prompt) + 8])
        ks = torch.tensor([7, 7, 5])
        out = d.propose_all(taps, ids, starts, ks)
        assert out.shape == (3, 7)
        for row, s, k in zip(out, starts.tolist(), ks.tolist()):
            d.reset()
            d.prefill(taps[:, :s])
            want = d.propose(int(ids[s]), s, k, None).tokens
            got = row[:k]
            n = int((got >= 0).sum())
            assert n >= 1 and torch.equal(got[:n], want[:n]) and bool((got[n:] == -1).all()), (kind, s)
        # a sequence that continues with the drafter's own drafts: all 7 rows are computed and equal propose's
        s = len(prompt) - 1
        d.reset()
        d.prefill(taps[:, :s])
        own = d.propose(int(ids[s]), s, 7, None).tokens
        seq = torch.cat([ids[: s + 1], own, torch.tensor([0])])
        _, taps2 = t.forward(seq[None, :-1], 0, t.new_cache(), taps=d.tap_layers)
        assert torch.equal(d.propose_all(taps2, seq, torch.tensor([s]), torch.tensor([7]))[0], own), kind
