"""EAGLE-3 drafter: one Llama decoder layer over (token embedding, fused target features), drafting token by token,
as a chain or as an EAGLE-2-style dynamic tree. Training (training-time test): training/eagle3_module.py.

Own implementation of the public EAGLE-3 checkpoint layouts (SafeAILab/EAGLE `eagle/model/cnets.py`, SpecForge
`specforge/modeling/draft/llama3_eagle.py` `LlamaForCausalLMEagle3`), no remote code:
  config.json        Llama fields (hidden_size, intermediate_size, heads, head_dim, rms_norm_eps, rope_theta,
                     vocab_size) + `draft_vocab_size`, optional `target_hidden_size`, `fc_norm`, `norm_output`,
                     `eagle_config.eagle_aux_hidden_state_layer_ids`; `num_hidden_layers` must be 1
  model.safetensors  `fc.weight` [H, 3*Ht], `midlayer.{self_attn.{q,k,v}_proj [.., 2H], self_attn.o_proj,
                     mlp.{gate,up,down}_proj, input_layernorm, hidden_norm, post_attention_layernorm}.weight`,
                     `norm.weight`, `lm_head.weight` [Vd, H], `d2t` [Vd] int64, optional `t2d` [V] bool,
                     optional `embed_tokens.weight` [V, H] (else the target's embedding is used).
  pytorch_model.bin  instead of model.safetensors: EAGLE's own releases (`EaModel.from_pretrained` reads this name
                     first; its trainer saves the state dict with the frozen embedding left out, so fc, midlayer.*,
                     norm, lm_head, d2t and t2d, in fp16). Read by `checkpoints.read_torch_state`, i.e.
                     `torch.load(weights_only=True)`: a file that needs any class or function is refused in one line.
  Accepted spellings: `layers.0.` for `midlayer.` (vLLM-native), a leading `model.`, `draft_id_to_target_id` for d2t.

Conventions:
- Vocabulary: the lm_head scores the draft vocabulary; `d2t` holds offsets, target_id = draft_id + d2t[draft_id].
  `d2t` may be absent only when draft_vocab_size == vocab_size. `t2d` is training-only and not kept.
- Taps: three target layers, low/mid/high, in this repo's convention (tap i = output of decoder layer i =
  `hidden_states[i + 1]`). EAGLE's default reads hidden_states[2], [L//2], [L-3], i.e. taps (1, L//2-1, L-4)
  (clamped into 0..L-1 for tiny targets). `eagle_config.eagle_aux_hidden_state_layer_ids` (SpecForge/SGLang) are
  output-of-layer ids and used as they are; a top-level `eagle_aux_hidden_state_layer_ids` (vLLM indexing,
  j = output of layer j-1) is shifted by one.
- Alignment: draft position p holds the pair (target feature of position p, embedding of token p+1) and predicts
  token p+2; its RoPE position is p. After the anchor (position s), later steps feed (the draft's own pre-norm
  output at the parent, embedding of the drafted token) at positions s, s+1, ... (EAGLE's training-time test). `fc`
  applies to target features only (3*Ht wide), never to the draft's own hidden states (H wide).
- Draft KV cache: only pairs built from real target features. The pairs of a round need the next token, so
  `commit` just stores the accepted taps and tokens; the next `propose` runs them through the layer together with
  the new anchor (one forward, as EAGLE's `stable_kv`), then drafts. Speculative (chain or tree) entries are never
  kept: after a commit the accepted path is *recomputed* from the target's taps, which is what EAGLE does.
- Prompt tokens: the pairs of the prompt need its token ids, which `prefill(taps)` does not carry. `prefill(taps,
  ids)` takes them (`needs_prompt_ids = True`); without them the draft context starts at the last prompt position
  (still lossless, lower acceptance).
- mode=chain: k drafts, argmax (greedy, protocol A) or sampled at the temperature with their distributions q over
  the target vocabulary (protocol B; tokens outside the draft vocabulary have q = 0).
  mode=tree: EAGLE-2 dynamic tree with EAGLE's knobs: level 1 = the top_k of the first distribution; then `depth`
  expansion steps, each growing the top_k best beams (by cumulative draft log-prob) by their top_k children; of all
  candidates the `total_tokens - 1` best (the anchor is the 60th token EAGLE counts) are kept, in level order
  (parents before children). Paths are at most depth + 1 drafts (and at most the engine's k). Greedy/A only.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import checkpoints as ckpt
from .. import log
from ..errors import UserError, check, invariant
from ..schema import (
    MAX_BLOCK,
    MAX_TOKENS,
    Settings,
    choice,
    frozen,
    int_list,
    is_int,
    is_num,
    nonempty_str,
    null_or,
    setting,
    upto,
)
from .base import Proposal, Sampling, choose
from .layers import MLP, RMSNorm, init_weights, rotate  # MLP: the same gated SiLU layer

ARCH = "LlamaForCausalLMEagle3"


# ------------------------------------------------------------------------------------------- settings
# The dynamic tree (`_tree`): each level scores top_k beams over the draft vocabulary ([top_k, V] floats:
# 64 x 151,936 x 4 B = 39 MB) and ranks top_k^2 candidates; the target verifies total_tokens positions with a
# [total_tokens, context + total_tokens] mask; depth + 1 drafts per path. EAGLE's: 10, 60, 7. top_k is also at most
# the draft vocabulary (drafter.draft_vocab_size when set; config.validate checks the pair).
TREE_MAX_TOP_K = 64
TREE_MAX_TOKENS = 1024
TREE_MAX_DEPTH = 64


@frozen
class TreeSettings(Settings):
    """`drafter.tree`: the EAGLE-2 dynamic tree of `mode: tree`."""
    top_k: int = setting(10, is_int(1, TREE_MAX_TOP_K), "an int >= 1, and at most the draft vocabulary; "
                         + upto(TREE_MAX_TOP_K, "each level holds top_k x vocabulary floats"))
    depth: int = setting(7, is_int(0, TREE_MAX_DEPTH), f"an int >= 0 (expansion steps after the first level); "
                                                       f"{upto(TREE_MAX_DEPTH)}")
    total_tokens: int = setting(60, is_int(2, TREE_MAX_TOKENS), f"an int >= 2 (the anchor + at least one draft); "
                                                                f"{upto(TREE_MAX_TOKENS, 'verified per round')}")


@frozen
class Eagle3Settings(Settings):
    """The keys of `drafter=eagle3` (conf/drafter/eagle3.yaml holds the presets and their meaning)."""
    KEY = "drafter"
    name: str = "eagle3"
    mode: str = choice("chain", "tree")
    init: str = choice("auto", "random", "checkpoint")
    checkpoint: str | None = None
    revision: str | None = setting(None, null_or(nonempty_str), "a hub branch, tag or commit, or null")
    num_drafts: int = setting(7, is_int(1, MAX_BLOCK), f"an int >= 1; {upto(MAX_BLOCK)}")
    tree: TreeSettings = setting(factory=TreeSettings)
    tap_layers: list | None = setting(None, null_or(lambda v: int_list()(v) and len(v) == 3),
                                      "3 target layer ids >= 0, or null")
    draft_vocab_size: int | None = setting(None, null_or(is_int(1, MAX_TOKENS)),
                                           f"an int >= 1, or null (the full vocabulary); {upto(MAX_TOKENS)}")
    seed: int = setting(0, is_int(), "an int")
    ttt_length: int = setting(7, is_int(1, MAX_BLOCK), f"an int >= 1 (training-time test steps); {upto(MAX_BLOCK)}")
    ttt_decay: float = setting(0.8, is_num(0, lo_open=True), "a finite number > 0")
    labels: str = choice("soft", "hard", words="hard (the data tokens) or soft (the target's distribution)")

    @classmethod
    def check_values(cls, mine: dict, whole: dict) -> None:
        """The tree keeps top_k children per node, out of the draft vocabulary."""
        top_k, vocab = mine["tree"]["top_k"] if "tree" in mine else None, mine.get("draft_vocab_size")
        if mine.get("mode") == "tree" and top_k is not None and vocab is not None and top_k > vocab:
            raise UserError(f"drafter.tree.top_k={top_k} exceeds drafter.draft_vocab_size={vocab}; choose top_k <= "
                            f"{vocab}")
        batch = (whole.get("eval") or {}).get("batch_size", 1)
        if mine.get("mode") == "tree" and batch != 1:             # decoding/batch_spec.py runs chains only
            raise UserError(f"eval.batch_size={batch} with drafter.mode=tree ({mine.get('name')}): draft trees run at "
                            f"batch 1 only; use drafter.mode=chain or eval.batch_size=1")


# vLLM's top-level `eagle_aux_hidden_state_layer_ids` index the hidden states entering a layer (j = the output of
# layer j - 1); this repo's taps (and SGLang's / SpecForge's `eagle_config` ids) are output-of-layer ids.
VLLM_SHIFT = 1


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def vllm_layer_ids(taps) -> list[int]:
    """Output-of-layer taps as vLLM's top-level `eagle_aux_hidden_state_layer_ids` (the inverse of `from_dict`)."""
    return [int(i) + VLLM_SHIFT for i in taps]


def default_tap_layers(num_target_layers: int) -> list[int]:
    """EAGLE's hidden_states[2], [L//2], [L-3] as output-of-layer taps (1, L//2-1, L-4), clamped to 0..L-1."""
    n = num_target_layers
    return [min(max(i, 0), n - 1) for i in (1, n // 2 - 1, n - 4)]


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    tap_layers: list[int] | None = None      # None = default_tap_layers(target layers), decided at build time
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 40960
    fc_norm: bool = False                     # SpecForge option: RMSNorm each of the 3 taps before fc
    norm_output: bool = True                  # SpecForge option: norm before lm_head (EAGLE: always)
    extra: dict = field(default_factory=dict)  # other config.json fields, written back unchanged

    @classmethod
    def from_dict(cls, d: dict, where: str = "EAGLE-3 config.json") -> "Eagle3Config":
        """Parse and validate an EAGLE-3 config.json; every malformed or unsupported field is one `UserError` line."""
        check(isinstance(d, dict), f"{where} must hold a JSON object, found {type(d).__name__}")
        d = json.loads(json.dumps(d))
        check("transformer_layer_config" not in d,
              f"{where}: a speculators-format config (transformer_layer_config); convert it to the flat EAGLE-3 "
              "layout (Llama fields + draft_vocab_size at the top level)")
        for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
            check(k in d, f"{where} lacks {k}")
        kw = {k: d.pop(k) for k in list(d) if k in {f.name for f in fields(cls)} - {"extra", "tap_layers"}}
        kw.setdefault("head_dim", kw["hidden_size"] // kw["num_attention_heads"])
        kw.setdefault("draft_vocab_size", kw["vocab_size"])
        kw["draft_vocab_size"] = kw["draft_vocab_size"] or kw["vocab_size"]      # null = the full vocabulary
        kw.setdefault("target_hidden_size", kw["hidden_size"])
        kw["target_hidden_size"] = kw["target_hidden_size"] or kw["hidden_size"]
        for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "vocab_size", "draft_vocab_size", "target_hidden_size", "max_position_embeddings"):
            if k in kw:
                check(_is_int(kw[k]) and kw[k] >= 1, f"{where}: {k}={kw[k]!r} must be an int >= 1")
        check(kw["draft_vocab_size"] <= kw["vocab_size"],
              f"{where}: draft_vocab_size={kw['draft_vocab_size']} exceeds vocab_size={kw['vocab_size']}")
        check(kw["num_attention_heads"] % kw["num_key_value_heads"] == 0,
              f"{where}: num_attention_heads={kw['num_attention_heads']} must be a multiple of "
              f"num_key_value_heads={kw['num_key_value_heads']}")
        layers = d.get("num_hidden_layers", 1)
        check(layers == 1, f"{where}: num_hidden_layers={layers!r}: an EAGLE-3 drafter has exactly 1 decoder layer")
        act = d.get("hidden_act", "silu")
        check(act == "silu", f"{where}: hidden_act={act!r} is not supported (only silu)")
        for k in ("attention_bias", "mlp_bias", "norm_before_residual"):
            check(not d.get(k, False), f"{where}: {k}={d.get(k)!r} is not supported (only false)")
        if "rope_theta" not in kw:                        # transformers 5 writes rope_parameters instead
            rope = d.get("rope_parameters")
            kw["rope_theta"] = rope.get("rope_theta", 1e6) if isinstance(rope, dict) else 1e6
        for rope in (d.get("rope_scaling"), d.get("rope_parameters")):
            kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
            check(kind in (None, "default"), f"{where}: rope type {kind!r} is not supported (only default RoPE)")
        for k in ("rms_norm_eps", "rope_theta"):
            v = kw.get(k, 1.0)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
                  f"{where}: {k}={v!r} must be a finite number > 0")
        for k in ("fc_norm", "norm_output"):
            check(isinstance(kw.get(k, False), bool), f"{where}: {k}={kw.get(k)!r} must be true or false")
        ec = d.get("eagle_config") or {}
        check(isinstance(ec, dict), f"{where}: eagle_config must be an object, found {type(ec).__name__}")
        taps = ec.get("eagle_aux_hidden_state_layer_ids")            # SpecForge / SGLang: output-of-layer ids
        if taps is None and d.get("eagle_aux_hidden_state_layer_ids") is not None:
            top = d["eagle_aux_hidden_state_layer_ids"]              # vLLM: hidden_states index = output of j-1
            taps = [i - VLLM_SHIFT for i in top] if isinstance(top, list) and all(_is_int(i) for i in top) else top
        check(taps is None or (isinstance(taps, list) and len(taps) == 3 and all(_is_int(i) and i >= 0 for i in taps)),
              f"{where}: eagle_aux_hidden_state_layer_ids={taps!r} must be 3 target layer ids >= 0")
        return cls(**kw, tap_layers=list(taps) if taps is not None else None, extra=d)

    def to_dict(self) -> dict:
        d = {"architectures": [ARCH], "model_type": "llama", **self.extra, "num_hidden_layers": 1}
        for f in fields(self):
            if f.name not in ("extra", "tap_layers"):
                d[f.name] = getattr(self, f.name)
        ec = dict(d.get("eagle_config") or {})
        if self.tap_layers is not None:
            ec["eagle_aux_hidden_state_layer_ids"] = list(self.tap_layers)
        d.pop("eagle_aux_hidden_state_layer_ids", None)              # written once, in eagle_config's convention
        if ec:
            d["eagle_config"] = ec
        return d

    @classmethod
    def for_target(cls, target, draft_vocab_size: int | None = None, tap_layers=None) -> "Eagle3Config":
        """A drafter sized to `target` (its hidden size, heads and MLP width, as the released EAGLE-3 drafters)."""
        tc = target.config
        rope = getattr(tc, "rope_parameters", None) or {}
        return cls(
            hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
            num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            vocab_size=target.vocab_size, draft_vocab_size=draft_vocab_size or target.vocab_size,
            target_hidden_size=tc.hidden_size,
            tap_layers=list(tap_layers) if tap_layers else default_tap_layers(tc.num_hidden_layers),
            rms_norm_eps=tc.rms_norm_eps, rope_theta=rope.get("rope_theta", getattr(tc, "rope_theta", 1e6)),
            max_position_embeddings=tc.max_position_embeddings)


# ---------------------------------------------------------------------------------------------- modules
class Attention(nn.Module):
    """Llama attention over the 2H-wide layer input (no q/k norm, no bias)."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, past, mask):
        """`x [1, Q, 2H]`; `past` = cached (k, v) `[1, Hkv, C, D]` or None; `mask [Q, C+Q]` bool (True = attend).
        Returns the output `[1, Q, H]` and the new rows' (k, v) `[1, Hkv, Q, D]`."""
        b, q_len, _ = x.shape
        q = rotate(self.q_proj(x).view(b, q_len, self.nh, self.hd).transpose(1, 2), cos, sin)   # [1, Hq, Q, D]
        k = rotate(self.k_proj(x).view(b, q_len, self.nkv, self.hd).transpose(1, 2), cos, sin)  # [1, Hkv, Q, D]
        v = self.v_proj(x).view(b, q_len, self.nkv, self.hd).transpose(1, 2)                    # [1, Hkv, Q, D]
        keys, vals = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=self.hd ** -0.5,
                                             enable_gqa=self.nh != self.nkv)                    # [1, Hq, Q, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1)), (k, v)


class MidLayer(nn.Module):
    """EAGLE-3's decoder layer: attention input cat(input_layernorm(embed), hidden_norm(h)); residual = h."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, h, emb, cos, sin, past, mask):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(h)], dim=-1)                # [1, Q, 2H]
        a, kv = self.self_attn(x, cos, sin, past, mask)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class Eagle3DraftModel(nn.Module):
    def __init__(self, config: Eagle3Config, own_embedding: bool = False):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size) if own_embedding else None
        self.fc_norm = nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps) for _ in range(3)) \
            if c.fc_norm else None
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin `[1, 1, Q, D]` for absolute `positions [Q]` (default RoPE in fp32, as HF)."""
        d = self.config.head_dim
        inv_freq = 1.0 / self.config.rope_theta ** (
            torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d)      # [D/2]
        freqs = positions[:, None].float() * inv_freq                                      # [Q, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)[None, None]                                # [1, 1, Q, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def features(self, taps: torch.Tensor) -> torch.Tensor:
        """Target taps `[1, T, 3*Ht]` (low, mid, high) -> the layer's hidden input `[1, T, H]`."""
        if self.fc_norm is not None:
            taps = torch.cat([n(t) for n, t in zip(self.fc_norm, taps.chunk(3, dim=-1))], dim=-1)
        return self.fc(taps)

    def forward(self, h, emb, positions, past=None, mask=None):
        """One pass of the layer: hidden `h [1, Q, H]` (features() of target taps, or the draft's own outputs),
        token embeddings `emb [1, Q, H]`, RoPE `positions [Q]`, cached (k, v) `[1, Hkv, C, D]` or None, `mask
        [Q, C+Q]` bool or None (= attend to everything). Returns the pre-norm output `[1, Q, H]` (what the next
        step feeds back) and the new rows' (k, v)."""
        cos, sin = self.rope(positions, h.dtype)
        return self.midlayer(h, emb, cos, sin, past, mask)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits `[.., Vd]` of layer outputs `[.., H]`."""
        return self.lm_head(self.norm(out) if self.config.norm_output else out)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # ------------------------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, where: str | None = None) -> "Eagle3DraftModel":
        where = where or f"drafter.checkpoint={str(path)!r}"
        config = Eagle3Config.from_dict(ckpt.read_config(path, where), f"{where}: config.json")
        state = read_state(Path(path), config, where)
        with torch.device("meta"):
            model = cls(config, own_embedding="embed_tokens.weight" in state)
        model.load_state_dict(state, strict=True, assign=True)
        return model.eval()

    def save_pretrained(self, path, dtype=None, config: dict | None = None) -> None:
        """The EAGLE/SpecForge layout (`midlayer.*`, d2t and t2d; embed_tokens only when the model owns one).
        `config`: the config.json to write (default `self.config.to_dict()`; export adds the engines' fields).
        A drafter whose map is the identity over the whole vocabulary writes no d2t / t2d: vLLM has no parameter to
        load them into then (it refuses the file), and every reader takes their absence as the identity."""
        state = {k: v for k, v in self.state_dict().items() if k != "d2t"}
        if dtype is not None:
            state = {k: v.to(dtype) for k, v in state.items()}
        if self.config.draft_vocab_size < self.config.vocab_size or bool(self.d2t.any()):
            state["d2t"] = self.d2t
            t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
            t2d[self.to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device)).cpu()] = True
            state["t2d"] = t2d
        ckpt.save(path, state, config if config is not None else self.config.to_dict())


def _canonical(key: str) -> str:
    """A tensor name in any accepted spelling -> this module's name."""
    if key.startswith("model."):
        key = key[len("model."):]
    if key.startswith("layers.0."):
        key = "midlayer." + key[len("layers.0."):]
    return "d2t" if key == "draft_id_to_target_id" else key


def read_state(path: Path, config: Eagle3Config, where: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under this module's names, strictly checked against `config`: every fault (missing,
    unexpected or misshapen tensor, missing or invalid d2t) is one line naming the file, the tensor and what was
    expected."""
    safetensors = ckpt.stored(path / ckpt.WEIGHTS_FILE) is not None or (path / ckpt.INDEX_FILE).exists()
    if not safetensors and (path / ckpt.TORCH_WEIGHTS_FILE).is_file():
        files = [ckpt.TORCH_WEIGHTS_FILE]                   # EAGLE's own releases: torch.save of the state dict
    else:
        pickles = sorted(p.name for p in path.glob("*") if p.suffix in (".bin", ".pt", ".pth"))
        check(safetensors or not pickles,
              f"{where}: {pickles[0] if pickles else ''} is a PyTorch file under a name EAGLE-3 checkpoints do not "
              f"use; {ckpt.WEIGHTS_FILE} (safetensors) or {ckpt.TORCH_WEIGHTS_FILE} (read with weights_only=True) "
              "are loaded")
        files = ckpt.weight_files(path, where)
    state, origin = {}, {}
    for fname in files:
        raw = (ckpt.read_torch_state(path / fname, where) if fname == ckpt.TORCH_WEIGHTS_FILE
               else ckpt.read_tensors(path / fname, where)[0])
        for k, t in raw.items():
            name = _canonical(k)
            check(name not in state, f"{where}: {fname}: tensor {k} duplicates {origin.get(name, ('', name))[1]}")
            state[name], origin[name] = t, (fname, k)
    state.pop("t2d", None)                             # training-only, derivable from d2t
    with torch.device("meta"):
        expected = Eagle3DraftModel(config, own_embedding="embed_tokens.weight" in state).state_dict()
    files_txt = "+".join(files)
    if "d2t" not in state:
        check(config.draft_vocab_size == config.vocab_size,
              f"{where}: {files_txt}: no d2t tensor, but draft_vocab_size={config.draft_vocab_size} < vocab_size="
              f"{config.vocab_size} needs the draft-to-target map d2t [{config.draft_vocab_size}] (int64 offsets)")
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if unexpected:                                 # first: a foreign name explains the missing one it replaces
        fname, k = origin[unexpected[0]]
        raise UserError(f"{where}: {fname}: unexpected tensor {k} (an EAGLE-3 drafter has fc, midlayer.* or "
                        "layers.0.*, norm, lm_head, d2t, t2d and optionally embed_tokens, fc_norm.*)")
    check(not missing, f"{where}: {files_txt}: missing tensor {missing[0] if missing else ''}"
                       f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    for name, t in state.items():
        fname, k = origin.get(name, (files_txt, name))
        check(t.shape == expected[name].shape, f"{where}: {fname}: {k} has shape {list(t.shape)}, expected "
                                               f"{list(expected[name].shape)} from config.json")
    d2t = state["d2t"]
    check(not d2t.is_floating_point() and d2t.dtype != torch.bool,
          f"{where}: {origin['d2t'][0] if 'd2t' in origin else files_txt}: d2t has dtype {d2t.dtype}, expected int64 "
          "offsets (target_id = draft_id + d2t[draft_id])")
    ids = torch.arange(len(d2t)) + d2t.long()
    check(bool(((ids >= 0) & (ids < config.vocab_size)).all()),
          f"{where}: d2t maps draft ids outside the target vocabulary (0..{config.vocab_size - 1}); it must hold "
          "offsets, target_id = draft_id + d2t[draft_id]")
    state["d2t"] = d2t.long()
    return state


def check_fits(model: Eagle3DraftModel, target, tap_layers, where: str) -> None:
    """A checkpoint must match the target it drafts for; each mismatch is one clear line."""
    c = model.config
    check(c.vocab_size == target.vocab_size,
          f"{where}: vocab_size {c.vocab_size} does not fit target {target.name} (vocab {target.vocab_size})")
    check(c.target_hidden_size == target.hidden_size,
          f"{where}: target_hidden_size {c.target_hidden_size} does not fit target {target.name} "
          f"(hidden {target.hidden_size})")
    check(model.embed_tokens is not None or c.hidden_size == target.hidden_size,
          f"{where}: hidden_size {c.hidden_size} differs from target {target.name}'s {target.hidden_size} and the "
          "checkpoint has no embed_tokens of its own")
    bad = [i for i in tap_layers if not 0 <= i < target.num_layers]
    check(len(tap_layers) == 3 and not bad, f"{where}: tap layers {list(tap_layers)} out of range for target "
                                            f"{target.name} (3 ids in 0..{target.num_layers - 1})")


# ----------------------------------------------------------------------------------------- the drafter
class Eagle3Drafter:
    """Engine adapter (drafters/base.py). State: the draft KV of real-feature pairs at positions [base, pos), and the
    pending taps of positions pos.. with the tokens after them (the last one's next token is the coming anchor)."""

    name = "eagle3"
    needs_prompt_ids = True                   # prefill(taps, ids): the prompt's pairs need its tokens

    def __init__(self, model: Eagle3DraftModel, target, mode: str = "chain", num_drafts: int = 7,
                 top_k: int = 10, depth: int = 7, total_tokens: int = 60, tap_layers=None):
        check(mode in ("chain", "tree"), f"drafter.mode={mode!r} is not valid; choose chain or tree")
        self.model, self.mode = model, mode
        self.embed = model.embed_tokens if model.embed_tokens is not None else target.embed_tokens
        self.tap_layers = tuple(tap_layers or model.config.tap_layers or default_tap_layers(target.num_layers))
        self.vocab_size = model.config.vocab_size
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        self.proposes_trees = mode == "tree"
        self.max_drafts = depth + 1 if mode == "tree" else num_drafts       # tree: k bounds the depth
        self.reset()

    def reset(self) -> None:
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None            # [1, Hkv, C, D] each
        self.pos = 0                                                        # next draft position to compute
        self.pending: torch.Tensor | None = None                            # [1, m, 3*Ht] taps of pos .. pos+m-1
        self.pending_ids: torch.Tensor | list[int] = []                     # tokens at pos+1 .. pos+m-1
        self.proposed: torch.Tensor | None = None                           # [N] the last proposal's tokens
        self.stale = False                                                  # a commit came without its propose

    def prefill(self, taps: torch.Tensor | None, ids=None) -> None:
        """Taps of the prompt (positions 0..P-1) and, when given, its token ids `[P]`."""
        p = taps.shape[1]
        if ids is not None:
            ids = [int(t) for t in ids]
            check(len(ids) == p, f"eagle3 prefill: {len(ids)} prompt ids for {p} taps")
            self.pending, self.pending_ids, self.pos = taps, ids[1:], 0
        else:                                         # no prompt tokens: context starts at the last prompt position
            self.pending, self.pending_ids, self.pos = taps[:, -1:], [], p - 1

    def commit(self, n_accepted: int, taps: torch.Tensor | None, path: torch.Tensor | None = None) -> None:
        """Taps of [anchor, accepted drafts] (chain: the first n; tree: the nodes `path`, root to leaf) wait for the
        next anchor; the speculative KV of the proposal is dropped (recomputed from these taps next round)."""
        if self.proposed is None:                 # k = 0 (the token budget's last step): the anchor was never seen
            self.stale = True                     # so the next pairs are unknown; generation ends here anyway
            return
        idx = path if path is not None else torch.arange(n_accepted, device=self.proposed.device)
        invariant(taps.shape[1] == n_accepted + 1 == len(idx) + 1, "eagle3: one tap row per committed token")
        self.pending, self.pending_ids = taps, self.proposed[idx]          # stays on the device: no sync
        self.proposed = None

    @torch.inference_mode()
    def _context(self, anchor: int, start: int) -> torch.Tensor:
        """Run the pending pairs (their last token is the anchor) into the draft KV; the last output `[1, 1, H]`."""
        invariant(not self.stale, "eagle3: propose after a commit whose anchor was never proposed from")
        m = self.pending.shape[1]
        invariant(self.pos + m == start, "eagle3: the pending taps must end just before the anchor")
        dev = self.model.fc.weight.device
        before = torch.as_tensor(self.pending_ids, dtype=torch.long, device=dev)         # prompt: a host list
        ids = torch.cat([before, torch.full((1,), anchor, device=dev)])[None]               # [1, m]
        h = self.model.features(self.pending.to(self.model.fc.weight.dtype))                # [1, m, H]
        c = 0 if self.kv is None else self.kv[0].shape[2]
        mask = torch.ones(m, c + m, dtype=torch.bool, device=dev)
        mask[:, c:] = torch.ones(m, m, dtype=torch.bool, device=dev).tril()                 # [m, C+m] causal
        out, (k, v) = self.model(h, self.embed(ids), torch.arange(self.pos, start, device=dev), self.kv, mask)
        self.kv = (k, v) if self.kv is None else (torch.cat([self.kv[0], k], 2), torch.cat([self.kv[1], v], 2))
        self.pos, self.pending, self.pending_ids = start, None, []
        return out[:, -1:]                                                                  # [1, 1, H]

    def propose(self, anchor: int, start: int, k: int, sampling: Sampling | None) -> Proposal:
        h = self._context(anchor, start)
        prop = self._tree(h, start, k) if self.mode == "tree" else self._chain(h, start, k, sampling)
        self.proposed = prop.tokens
        return prop

    @torch.inference_mode()
    def _chain(self, h: torch.Tensor, start: int, k: int, sampling: Sampling | None) -> Proposal:
        m, dev = self.model, self.model.fc.weight.device
        kv, toks, qs = self.kv, [], []
        for j in range(k):
            logits = m.logits(h[0])                                                         # [1, Vd]
            if sampling is None:
                tok = m.to_target(logits.argmax(-1))                                        # [1]
            else:                                     # q over the target vocabulary: 0 outside the draft vocabulary
                full = logits.new_full((1, self.vocab_size), float("-inf"))
                full[:, m.to_target(torch.arange(logits.shape[-1], device=dev))] = logits
                p = choose(full, sampling)
                tok = p.tokens
                qs.append(p.q[0])
            toks.append(tok)
            if j + 1 < k:                              # the next step: (own output, this draft) at start + j
                pos = torch.full((1,), start + j, device=dev)                               # a fill, not a copy
                h, (kn, vn) = m(h, self.embed(tok[None]), pos, kv)                          # [1, 1, H]
                kv = (torch.cat([kv[0], kn], 2), torch.cat([kv[1], vn], 2))
        return Proposal(torch.cat(toks), torch.stack(qs) if qs else None)

    @torch.inference_mode()
    def _tree(self, h: torch.Tensor, start: int, k: int) -> Proposal:
        """EAGLE-2 dynamic tree (module docstring). Candidates are numbered in level order; the kept ones stay in
        that order, so every parent precedes its children."""
        m, dev, tk = self.model, self.model.fc.weight.device, self.top_k
        levels = min(self.depth + 1, k)
        logp = torch.log_softmax(m.logits(h[0, 0]).float(), -1)                             # [Vd]
        top = logp.topk(min(tk, logp.numel()))
        scores, beam_tok, beam_idx = top.values, top.indices, torch.arange(len(top.values), device=dev)  # [b]
        cand_score, cand_tok, cand_parent = [scores], [beam_tok], [torch.full_like(beam_idx, -1)]
        n_cand, beam_h = len(scores), h.expand(1, len(scores), -1)                          # [1, b, H]
        ctx_k, ctx_v = self.kv
        tree_k = tree_v = None                                                              # [1, Hkv, T, D]
        anc = torch.zeros(len(scores), 0, dtype=torch.bool, device=dev)                     # [b, T] ancestors
        for lvl in range(1, levels):
            b, c = len(beam_tok), ctx_k.shape[2]
            eye = torch.eye(b, dtype=torch.bool, device=dev)
            mask = torch.cat([torch.ones(b, c, dtype=torch.bool, device=dev), anc, eye], 1)  # [b, C+T+b]
            past = (ctx_k, ctx_v) if tree_k is None else (torch.cat([ctx_k, tree_k], 2), torch.cat([ctx_v, tree_v], 2))
            pos = torch.full((b,), start + lvl - 1, device=dev)                             # one depth, one position
            out, (kn, vn) = m(beam_h, self.embed(m.to_target(beam_tok))[None], pos, past, mask)   # [1, b, H]
            tree_k = kn if tree_k is None else torch.cat([tree_k, kn], 2)
            tree_v = vn if tree_v is None else torch.cat([tree_v, vn], 2)
            anc = torch.cat([anc, eye], 1)                                                  # [b, T+b]
            lp = torch.log_softmax(m.logits(out[0]).float(), -1).clamp(max=0.0)            # [b, Vd]
            top = lp.topk(min(tk, lp.shape[-1]))                                            # [b, k']
            cu = (top.values + scores[:, None]).flatten()                                   # [b*k'] cumulative
            cand_score.append(cu)
            cand_tok.append(top.indices.flatten())
            cand_parent.append(beam_idx.repeat_interleave(top.values.shape[1]))
            sel = cu.topk(min(tk, cu.numel())).indices                                      # the next beams
            row = sel // top.values.shape[1]                                                # their parents' rows
            scores, beam_tok, beam_idx = cu[sel], top.indices.flatten()[sel], n_cand + sel
            beam_h, anc = out[:, row], anc[row]
            n_cand += cu.numel()
        score, tok, parent = torch.cat(cand_score), torch.cat(cand_tok), torch.cat(cand_parent)   # [M]
        # Best first; ties go to the earlier candidate, so a parent (score >= its child's) always ranks first
        # and the kept set is closed under parents.
        order = torch.sort(-score, stable=True).indices[: min(self.total_tokens - 1, len(score))]
        keep = order.sort().values                                                          # [N] level order
        par = parent[keep]
        local = torch.searchsorted(keep, par.clamp(min=0))                                  # parent's index in keep
        parents = torch.where(par < 0, -1, local)
        return Proposal(m.to_target(tok[keep]), parents=parents)


def resolve_eagle3(path_or_id: str, revision: str | None = None) -> Path:
    """`checkpoints.resolve` for an EAGLE-3 checkpoint: a hub download also fetches EAGLE's `pytorch_model.bin`
    (its releases ship no safetensors), which `read_state` reads with weights_only=True."""
    return ckpt.resolve(path_or_id, revision, extra=(ckpt.TORCH_WEIGHTS_FILE,))


def build(cfg: Eagle3Settings, target) -> Eagle3Drafter:
    """From the `drafter` config group: `init=random` (sized to the target), `init=checkpoint`, or `init=auto`
    (the checkpoint when one is set, else random)."""
    init = ckpt.resolve_init(cfg.init, cfg.checkpoint)
    if init == "random" and cfg.init == "auto":
        log.LOG.info(f"no EAGLE-3 checkpoint for target {target.name}: using a random-init drafter (τ ≈ 1); "
                     "pass drafter.checkpoint=DIR for a trained one")
    taps = cfg.tap_layers
    if init == "random":
        model = Eagle3DraftModel(Eagle3Config.for_target(target, cfg.draft_vocab_size, taps))
        init_weights(model, cfg.seed)
        if model.config.draft_vocab_size < target.vocab_size:         # a seeded subset of the target vocabulary
            g = torch.Generator().manual_seed(cfg.seed)
            used = torch.randperm(target.vocab_size, generator=g)[: model.config.draft_vocab_size].sort().values
            model.d2t.copy_(used - torch.arange(len(used)))
        where = "drafter"
    else:
        where = f"drafter.checkpoint={str(cfg.checkpoint)!r}"
        model = Eagle3DraftModel.from_pretrained(resolve_eagle3(str(cfg.checkpoint), cfg.revision), where)
    taps = list(taps or model.config.tap_layers or default_tap_layers(target.num_layers))
    check_fits(model, target, taps, where)
    model = model.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)   # d2t stays int64
    tree = cfg.tree
    return Eagle3Drafter(model, target, cfg.mode, cfg.num_drafts, tree.top_k, tree.depth, tree.total_tokens, taps)
