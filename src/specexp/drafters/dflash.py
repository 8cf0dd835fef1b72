"""DFlash drafter: a few Qwen3 decoder layers that fill a block `[anchor, MASK x (B-1)]` in one
bidirectional pass, reading the target's fused hidden states through their K/V ("KV injection").

Own implementation of the z-lab checkpoint format (`z-lab/Qwen3-{4B,8B}-DFlash-b16`), no remote code:
  config.json        Qwen3 fields + `block_size`, `num_target_layers`,
                     `dflash_config.{mask_token_id, target_layer_ids}`
  model.safetensors  `layers.i.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj,
                     input_layernorm, post_attention_layernorm}.weight`, `fc.weight`, `hidden_norm.weight`,
                     `norm.weight`; no embedding and no lm_head (the target's are shared, frozen).

Forward (per call): ctx = hidden_norm(fc(concat taps)) is fed to every layer; each layer's queries come from
the block only, its keys/values are [k_proj(ctx); k_proj(block)] (same weights, k_norm on both, RoPE at
absolute positions), no causal mask. Block position k >= 1 predicts the token at anchor + k; position 0's
output is discarded. The draft cache keeps only context K/V; block K/V are recomputed every step.

Also read (read-only): the DSpark-format DFlash drafters of DeepSpec (`DSparkDFlashModel`, below): the same layers
plus their own embedding and lm_head, DFlash fields at the top level of config.json, and the shifted alignment
(row k >= 0 predicts anchor + k + 1, B drafts). `load_model` picks the class from config.json.
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
from ..paths import repo_path
from ..schema import (
    MAX_BLOCK,
    MAX_LAYERS,
    Settings,
    choice,
    frozen,
    int_list,
    is_int,
    nonempty_str,
    null_or,
    setting,
    target_layers,
    upto,
)
from .base import Proposal, Sampling, choose, sequence_at
from .block_tree import BlockTreeSettings, best_first
from .layers import MLP, RMSNorm, init_weights, rotate


# ------------------------------------------------------------------------------------------- settings
@frozen
class DFlashSettings(Settings):
    """The keys of `drafter=dflash` (conf/drafter/dflash.yaml holds the presets and their meaning); the DFlash-family
    drafters (DeLS, Domino-FT, DEdit) extend it."""
    KEY = "drafter"
    name: str = "dflash"
    init: str = choice("auto", "random", "checkpoint")
    checkpoint: str | None = None
    revision: str | None = setting(None, null_or(nonempty_str), "a hub branch, tag or commit, or null")
    num_layers: int = setting(1, is_int(1, MAX_LAYERS), f"an int >= 1; {upto(MAX_LAYERS)}")
    block_size: int = setting(16, is_int(2, MAX_BLOCK), f"an int >= 2 (the anchor + at least one draft); "
                                                        f"{upto(MAX_BLOCK)}")
    target_layer_ids: list | None = setting(None, null_or(int_list()),
                                            "a non-empty list of target layer ids >= 0, or null")
    seed: int = setting(0, is_int(), "an int")
    mode: str = choice("chain", "tree")
    tree: BlockTreeSettings = setting(factory=BlockTreeSettings)

    @classmethod
    def check_values(cls, mine: dict, whole: dict) -> None:
        if mine.get("mode") == "tree":
            name = mine.get("name")
            check(name in TREE_DRAFTERS, f"drafter.mode=tree with drafter={name}: its draft is not a tree of tokens "
                                         f"(DEdit edits a whole block); of the DFlash family "
                                         f"{', '.join(TREE_DRAFTERS)} draft trees; use drafter.mode=chain")
            grid = (((whole or {}).get("replay") or {}).get("fusion_grid") or {})
            check(grid.get("alpha") is None and grid.get("beta") is None,
                  f"replay.fusion_grid with drafter.mode=tree ({name}): the α/β grid replays chains (every anchor's "
                  f"chain matches at once); run it with drafter.mode=chain")
            batch = ((whole or {}).get("eval") or {}).get("batch_size", 1)
            check(batch == 1, f"eval.batch_size={batch} with drafter.mode=tree ({name}): draft trees run at "
                              f"eval.batch_size=1 only (decoding/batch_spec.py runs chains)")
        ids, target = mine.get("target_layer_ids"), whole.get("target") or {}
        n = target_layers(target)
        if n is not None and isinstance(ids, list) and any(i >= n for i in ids):
            raise UserError(f"drafter.target_layer_ids={ids} out of range for target {target.get('name')} (layers "
                            f"0..{n - 1})")
        # config.validate (`whole` given): a local checkpoint's config.json and weight index are read now, so a
        # malformed one is refused before the target is loaded (its tensors are checked when the drafter loads); a
        # hub id, or absent: the loader says. A view built later (`build`) leaves them to the loader.
        ckpt_dir = mine.get("checkpoint")
        if whole and mine.get("init") != "random" and isinstance(ckpt_dir, str) and repo_path(ckpt_dir).is_dir():
            where = f"drafter.checkpoint={ckpt_dir!r}"
            DFlashConfig.from_dict(ckpt.read_config(repo_path(ckpt_dir), where), f"{where}: config.json")
            ckpt.weight_files(repo_path(ckpt_dir), where)


TREE_DRAFTERS = ("dflash", "dels_rnn", "dels_markov", "domino_ft")      # drafter.mode=tree


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Reference rule: uniformly from the 2nd to the 3rd-to-last layer ([1, 9, 17, 25, 33] for 36, 5)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    extra: dict = field(default_factory=dict)           # other config.json fields, written back unchanged
    dflash_extra: dict = field(default_factory=dict)    # other dflash_config fields, likewise

    @classmethod
    def from_dict(cls, d: dict, where: str = "DFlash config.json") -> "DFlashConfig":
        """Parse and validate a z-lab config.json; every malformed field is one `UserError` line naming it."""
        check(isinstance(d, dict), f"{where} must hold a JSON object, found {type(d).__name__}")
        d = json.loads(json.dumps(d))                    # deep copy
        dc = d.pop("dflash_config", None) or {}
        check(isinstance(dc, dict), f"{where}: dflash_config must be an object, found {type(dc).__name__}")
        known = {f.name for f in fields(cls)} - {"extra", "dflash_extra", "target_layer_ids", "mask_token_id"}
        kw = {k: d.pop(k) for k in list(d) if k in known}
        if "rope_theta" not in kw:                       # transformers 5 writes rope_parameters instead
            rope = d.get("rope_parameters")
            kw["rope_theta"] = rope.get("rope_theta", 1e6) if isinstance(rope, dict) else 1e6
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "vocab_size", "block_size") if k not in kw]
        if missing:
            raise UserError(f"{where} lacks {', '.join(missing)}")
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "head_dim", "num_target_layers", "max_position_embeddings"):
            if k in kw:
                check(_is_int(kw[k]) and kw[k] >= 1, f"{where}: {k}={kw[k]!r} must be an int >= 1")
        check(_is_int(kw["block_size"]) and kw["block_size"] >= 2,
              f"{where}: block_size={kw['block_size']!r} must be an int >= 2")
        check(kw["num_attention_heads"] % kw["num_key_value_heads"] == 0,
              f"{where}: num_attention_heads={kw['num_attention_heads']} must be a multiple of "
              f"num_key_value_heads={kw['num_key_value_heads']}")
        for k in ("rms_norm_eps", "rope_theta"):
            v = kw.get(k, 1.0)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
                  f"{where}: {k}={v!r} must be a finite number > 0")
        check(isinstance(kw.get("attention_bias", False), bool),
              f"{where}: attention_bias={kw.get('attention_bias')!r} must be true or false")
        kw.setdefault("head_dim", kw["hidden_size"] // kw["num_attention_heads"])
        kw.setdefault("num_target_layers", kw["num_hidden_layers"])
        layer_ids = dc.pop("target_layer_ids", None)
        mask = dc.pop("mask_token_id", None)
        if mask is None:
            raise UserError(f"{where} has no dflash_config.mask_token_id (pre-Feb-2026 checkpoint?); "
                            "add it (151669 for Qwen3)")
        check(_is_int(mask) and mask >= 0, f"{where}: dflash_config.mask_token_id={mask!r} must be an int >= 0")
        check(layer_ids is None or (isinstance(layer_ids, list) and layer_ids and
                                    all(_is_int(i) and i >= 0 for i in layer_ids)),
              f"{where}: dflash_config.target_layer_ids={layer_ids!r} must be a non-empty list of ints >= 0")
        layer_ids = list(layer_ids) if layer_ids is not None else build_target_layer_ids(
            kw["num_target_layers"], kw["num_hidden_layers"])
        return cls(**kw, target_layer_ids=layer_ids, mask_token_id=int(mask), extra=d, dflash_extra=dc)

    def to_dict(self) -> dict:
        d = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **self.extra}
        for f in fields(self):
            if f.name not in ("extra", "dflash_extra", "target_layer_ids", "mask_token_id"):
                d[f.name] = getattr(self, f.name)
        if "rope_parameters" in self.extra:
            d.pop("rope_theta")
        d["dflash_config"] = {**self.dflash_extra, "mask_token_id": self.mask_token_id,
                              "target_layer_ids": list(self.target_layer_ids)}
        return d

    @classmethod
    def for_target(cls, target, num_layers: int, block_size: int, target_layer_ids=None) -> "DFlashConfig":
        """A drafter sized to `target` (same hidden size, heads and MLP width, as the z-lab drafters)."""
        tc = target.config
        rope = getattr(tc, "rope_parameters", None) or {}
        return cls(
            hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size, num_hidden_layers=num_layers,
            num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            vocab_size=target.vocab_size, block_size=block_size, num_target_layers=tc.num_hidden_layers,
            target_layer_ids=list(target_layer_ids) if target_layer_ids else
            build_target_layer_ids(tc.num_hidden_layers, num_layers),
            mask_token_id=target.mask_token_id, rms_norm_eps=tc.rms_norm_eps,
            rope_theta=rope.get("rope_theta", getattr(tc, "rope_theta", 1e6)),
            max_position_embeddings=tc.max_position_embeddings,
            # Fields the z-lab config.json carries, so the reference's Qwen3Config-based loader reads ours too.
            extra={"hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False, "rope_scaling": None,
                   "layer_types": ["full_attention"] * num_layers, "use_sliding_window": False,
                   "sliding_window": None, "max_window_layers": num_layers, "dtype": "bfloat16"},
        )


# ---------------------------------------------------------------------------------------------- modules
class Attention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)

    def kv(self, x, cos, sin):
        """Keys and values of a stream `x [B, T, H]` → `[B, Hkv, T, D]` each (keys normed and rotated)."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        return rotate(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.nh, self.hd)).transpose(1, 2)   # [B, Hq, Q, D]
        q = rotate(q, cos, sin)
        k, v = self.kv(x, cos, sin)                                                        # [B, Hkv, Q, D]
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)                  # [B, Hkv, C+Q, D]
        if mask is None or isinstance(mask, torch.Tensor):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd ** -0.5,
                                                 enable_gqa=self.nh != self.nkv)           # [B, Hq, Q, D]
        else:                                                                              # a flex BlockMask
            # Under bf16-mixed the fp32 norm weights make q and k fp32 while v is bf16: SDPA is cast by autocast,
            # flex is not, and older torch either refuses mixed dtypes or falls back to fp32 kernels.
            q, k = q.to(v.dtype), k.to(v.dtype)
            out = _flex(q.device)(q, k, v, block_mask=mask, scale=self.hd ** -0.5, enable_gqa=self.nh != self.nkv)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


def _flex(device: torch.device):
    """flex_attention, compiled on GPU (its fused kernel); eager elsewhere (a slow reference, for tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    global _FLEX_COMPILED
    if _FLEX_COMPILED is None:
        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=True)
    return _FLEX_COMPILED


_FLEX_COMPILED = None


class DecoderLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None, context=None):
        """`context` = `DFlashDraftModel.context_stream(...)`: the layer computes its context K/V from it inside its
        own call instead of taking `ctx_k, ctx_v` (training: an FSDP unit's weights are whole only during its call)."""
        if context is not None:
            ctx_k, ctx_v = self.self_attn.kv(*context)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    first_row = 1                                        # block row of draft 1: row k predicts x_{a+k} (unshifted)

    def __init__(self, config: DFlashConfig):
        super().__init__()
        c = self.config = config
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin `[B, 1, T, D]` for absolute `positions [B, T]` (default RoPE, computed in fp32 as HF)."""
        d = self.config.head_dim
        inv_freq = 1.0 / self.config.rope_theta ** (
            torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d)      # [D/2]
        freqs = positions[..., None].float() * inv_freq                                    # [B, T, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]                                   # [B, 1, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def context_stream(self, taps: torch.Tensor, positions: torch.Tensor):
        """What every layer takes its context K/V from: `(hidden_norm(fc(taps)) [B, C, H], cos, sin)` for target
        taps `[B, C, n*H]` at `positions [B, C]`."""
        ctx = self.hidden_norm(self.fc(taps))                                              # [B, C, H]
        return (ctx, *self.rope(positions, ctx.dtype))

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context K/V from target taps `[B, C, n*H]` at `positions [B, C]`."""
        context = self.context_stream(taps, positions)
        return [layer.self_attn.kv(*context) for layer in self.layers]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_kv=None, mask=None, context=None) -> torch.Tensor:
        """Block stream `x [B, Q, H]` (target embeddings of the block ids) at `positions [B, Q]` → hidden
        `[B, Q, H]` after the final norm. `mask [B|1, 1, Q, C+Q]` (bool, True = attend) or None = full. The context:
        per-layer K/V `ctx_kv` (`context_kv`, what inference caches), or `context` (`context_stream`), from which
        each layer computes its own K/V inside its call: the same numbers, and the form training uses, since a
        layer wrapped as an FSDP unit has its sharded weights gathered only while it runs."""
        cos, sin = self.rope(positions, x.dtype)
        if context is not None:
            for layer in self.layers:
                x = layer(x, cos, sin, None, None, mask, context=context)
        else:
            for layer, (k, v) in zip(self.layers, ctx_kv):
                x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    # ------------------------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | None = None,
                        device: str | torch.device = "cpu", where: str | None = None,
                        raw: dict | None = None) -> "DFlashDraftModel":
        """Load a z-lab-format checkpoint directory strictly (specexp/checkpoints.py). `raw`: its config.json when the
        caller has read it already (it is read once per load)."""
        where = where or f"drafter.checkpoint={str(path)!r}"
        raw = ckpt.read_config(path, where) if raw is None else raw
        check(not is_dspark(raw), f"{where}: a DSpark-format DFlash drafter (shifted, own embedding and lm_head): "
                                  "it drafts (drafter.checkpoint) but is not a backbone anything trains on here")
        config = DFlashConfig.from_dict(raw, f"{where}: config.json")
        with torch.device("meta"):
            model = cls(config)
        ckpt.load_module(model, path, where)                   # weights keep the file's dtype
        return model.to(device=device, dtype=dtype).eval()

    def save_pretrained(self, path: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
        """Write config.json + model.safetensors (z-lab key names), each file replaced atomically."""
        ckpt.save_module(self, path, self.config.to_dict(), dtype)


# ------------------------------------------------------------------- DSpark-format (DeepSpec) DFlash drafters
# The DeepSpec DFlash releases (`deepseek-ai/dflash_qwen3_{4b,8b}_block7`, docs/checkpoints.md) are DSpark models
# with the Markov and confidence heads disabled: the same layers, `fc`, `hidden_norm` and `norm` as the z-lab
# format, plus their own `embed_tokens.weight` [V, H] and `lm_head.weight` [V, H] (copies of the target's, frozen
# in training), the DFlash fields at the top level of config.json, and the shifted alignment: block
# [a, MASK x (B-1)], row k (k = 0..B-1) predicts x_{a+k+1}, so B drafts per round.
DSPARK_ARCH = "Qwen3DSparkModel"
DSPARK_ONLY = ("num_anchors", "enable_confidence_head", "confidence_head_with_markov", "markov_rank",
               "markov_head_type")


def is_dspark(raw: dict) -> bool:
    archs = raw.get("architectures")
    return isinstance(archs, list) and DSPARK_ARCH in archs


def dspark_config(raw: dict, where: str) -> DFlashConfig:
    """A DSpark-format config.json as a DFlashConfig; only the plain DFlash variant (no Markov head, no confidence
    head, taps of decoder layers) is accepted, each other case one line naming the field."""
    d = json.loads(json.dumps(raw))
    for k in ("block_size", "num_target_layers", "mask_token_id", "target_layer_ids"):
        check(k in d, f"{where} lacks {k} (a DSpark-format DFlash config carries it at the top level)")
    markov = d.get("markov_rank", 0)
    check(_is_int(markov) and markov == 0,
          f"{where}: markov_rank={markov!r}: a DSpark drafter with its own Markov head is not a DFlash drafter; "
          "only markov_rank=0 (the deepseek-ai/dflash_* releases) loads")
    check(d.get("enable_confidence_head", False) is False,
          f"{where}: enable_confidence_head={d.get('enable_confidence_head')!r}: the confidence head is not "
          "supported; only enable_confidence_head=false loads")
    ids = d.get("target_layer_ids")
    check(not (isinstance(ids, list) and -1 in ids),
          f"{where}: target_layer_ids={ids!r}: -1 (the embedding output) is not a tap this project provides; "
          "use decoder layer ids 0..L-1")
    dc = {"mask_token_id": d.pop("mask_token_id"), "target_layer_ids": d.pop("target_layer_ids")}
    dc.update({k: d.pop(k) for k in DSPARK_ONLY if k in d})       # kept (written back by nobody), not used
    return DFlashConfig.from_dict({**d, "dflash_config": dc}, where)


class DSparkDFlashModel(DFlashDraftModel):
    """DFlashDraftModel with its own token embedding and lm_head, drafting from block row 0 (shifted)."""

    first_row = 0

    def __init__(self, config: DFlashConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | None = None,
                        device: str | torch.device = "cpu", where: str | None = None,
                        raw: dict | None = None) -> "DSparkDFlashModel":
        where = where or f"drafter.checkpoint={str(path)!r}"
        raw = ckpt.read_config(path, where) if raw is None else raw
        check(is_dspark(raw), f"{where}: config.json architectures {raw.get('architectures')!r}, expected "
                              f"[{DSPARK_ARCH!r}]")
        config = dspark_config(raw, f"{where}: config.json")
        with torch.device("meta"):
            model = cls(config)
        ckpt.load_module(model, path, where)
        return model.to(device=device, dtype=dtype).eval()

    def save_pretrained(self, path, dtype=None) -> None:
        raise UserError("a DSpark-format drafter is read-only here (it is not a format this project trains)")


def load_model(path: str | os.PathLike, where: str, raw: dict | None = None) -> DFlashDraftModel:
    """The drafter model of a checkpoint directory, by its format: z-lab DFlash, or DSpark-format DFlash. `raw`: its
    config.json when the caller has read it already."""
    raw = ckpt.read_config(path, where) if raw is None else raw
    if is_dspark(raw):
        return DSparkDFlashModel.from_pretrained(path, where=where, raw=raw)
    dc = raw.get("dflash_config")
    if isinstance(dc, dict) and dc.get("projector_type") is not None:
        raise UserError(f"{where}: dflash_config.projector_type={dc['projector_type']!r}: a DFlash drafter with a "
                        "head on top (Domino: load it with drafter=domino_ft drafter.checkpoint=...), not a plain "
                        "DFlash checkpoint")
    return DFlashDraftModel.from_pretrained(path, where=where, raw=raw)


# ----------------------------------------------------------------------------------------- the drafter
class RowsBlock:
    """The block hidden states of B rows from one pass (`DFlashDrafter.prepare_rows`) and, on first demand, the
    logits of every row's draft rows in one vocabulary product."""

    def __init__(self, hidden: torch.Tensor, lm_head, first_row: int, k: int):
        self.hidden, self.lm_head, self.rows, self._logits = hidden, lm_head, slice(first_row, first_row + k), None

    def logits(self) -> torch.Tensor:
        if self._logits is None:
            # contiguous: a strided bf16 input misses the packed oneDNN product (targets/cpu_linear.py), ~50x slower
            self._logits = self.lm_head(self.hidden[:, self.rows].contiguous())             # [n, K, V]
        return self._logits


class DraftVocabHead(nn.Module):
    """The drafter's vocabulary projection restricted to `ids` (`eval.draft_vocab`): the rows of the full head
    for those tokens, the logits of every other token -inf. Drafts are proposals, so restricting where they come
    from keeps the output the target's (the verification is unchanged, and a sampled draft's distribution q is 0
    outside `ids`, which protocols A and B allow); what it buys is the projection: for the mini target's 49,152 x 576
    head, 4,096 rows are 1/12 of the weights a proposal reads. The same idea as FR-Spec's frequency-ranked draft
    vocabulary and EAGLE-3's draft vocabulary. `proj` is an `nn.Linear`, so `target.prepack` packs it."""

    def __init__(self, head: nn.Linear, ids: torch.Tensor):
        super().__init__()
        self.vocab = head.out_features
        self.register_buffer("ids", ids.to(head.weight.device), persistent=False)                 # [N]
        self.proj = nn.Linear(head.in_features, len(ids), bias=False, device=head.weight.device,
                              dtype=head.weight.dtype).requires_grad_(False)
        with torch.no_grad():
            self.proj.weight.copy_(head.weight[self.ids])                                          # [N, H]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        sub = self.proj(h)                                                                         # [..., N]
        out = sub.new_full((*sub.shape[:-1], self.vocab), float("-inf"))                           # [..., V]
        return out.index_copy_(-1, self.ids, sub)


def regen_manifest(regen_dir: str, target_name: str) -> tuple[Path, dict]:
    """The directory and manifest of the regeneration set `eval.draft_vocab_from` names (data/regen/README.md's
    format), checked as far as they can be without the target: a directory the target `target_name` made, whose
    manifest lists its rows and whose tokens file is there. config.validate calls it before any work, so each fault
    is one line naming the path as given; `draft_vocab_ids` reads the tokens."""
    from .. import files

    where = f"eval.draft_vocab_from={regen_dir!r}"
    root = repo_path(regen_dir)
    here = os.path.abspath(Path(regen_dir).expanduser())
    looked = "" if here == os.path.abspath(root) else f" (neither {here} nor {os.path.abspath(root)})"
    check(root.exists(), f"{where} does not exist{looked}; name a regeneration set directory (data/regen/, "
                         "written by data.regen_export=DIR)")
    check(root.is_dir(), f"{where} is a file; expected a regeneration set directory (data/regen/)")
    check((root / "manifest.json").exists(), f"{where} holds no manifest.json: not a regeneration set (expected "
                                             "manifest.json and tokens.npy, as data.regen_export=DIR writes)")
    text = files.read_text(root / "manifest.json", f"{where}:")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: manifest.json is not valid JSON ({e.msg}, line {e.lineno}"
                        f"{'; the file is empty' if not text.strip() else ''})") from None
    check(isinstance(manifest, dict), f"{where}: manifest.json must hold a JSON object, found "
                                      f"{type(manifest).__name__}")
    rows = manifest.get("rows")
    check(isinstance(rows, list) and bool(rows) and all(
        isinstance(r, list) and len(r) == 4 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                   for x in r[1:3]) for r in rows),
          f"{where}: manifest.json needs 'rows', a non-empty list of [id, prompt_len, response_len, stopped]")
    prov = manifest.get("provenance")
    made_by = ((prov.get("target") if isinstance(prov, dict) else None) or {})
    made_by = made_by.get("name") if isinstance(made_by, dict) else None
    check(made_by == target_name, f"{where} holds {made_by}'s answers, not {target_name}'s")
    tokens = files.stored(root / "tokens.npy")
    check(tokens is not None, f"{where} holds no tokens.npy (nor tokens.npy.xz): not a whole regeneration set")
    check(tokens.stat().st_size > 0, f"{where}: {tokens.name} is empty")
    return root, manifest


def draft_vocab_ids(regen_dir: str, target, n: int) -> torch.Tensor:
    """The `n` most frequent tokens (ascending ids) of the responses in a regeneration set made by `target`."""
    import io

    import numpy as np

    from .. import files

    where = f"eval.draft_vocab_from={regen_dir!r}"
    root, manifest = regen_manifest(regen_dir, target.name)
    check(n <= target.vocab_size, f"eval.draft_vocab={n} exceeds the vocabulary of {target.vocab_size}")
    stored = files.stored(root / "tokens.npy")
    raw = files.read_bytes(stored, f"{where}:")
    try:
        tokens = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise UserError(f"{where}: {stored.name} is not a NumPy array file ({e})") from None
    rows = manifest["rows"]
    total = sum(p + r for _, p, r, _ in rows)
    check(tokens.ndim == 1 and tokens.dtype.kind in "iu" and tokens.size == total,
          f"{where}: {stored.name} holds {tokens.size} {tokens.dtype} values in {tokens.ndim} dimension(s); its "
          f"manifest lists {total} token ids in one")
    check(tokens.size == 0 or 0 <= int(tokens.min()) and int(tokens.max()) < target.vocab_size,
          f"{where}: {stored.name} holds token ids outside 0..{target.vocab_size - 1} (another tokenizer's)")
    counts, off = torch.zeros(target.vocab_size), 0
    for _, p, r, _ in rows:
        counts += torch.bincount(torch.from_numpy(tokens[off + p: off + p + r].astype("int64")),
                                 minlength=target.vocab_size)[:target.vocab_size]
        off += p + r
    # most frequent first, ties to the lower id (a stable order: the same set on every machine)
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:n].sort().values


class DFlashDrafter:
    """Engine adapter: keeps per-layer context K/V of every committed position before the anchor."""

    name = "dflash"

    def __init__(self, model: DFlashDraftModel, target):
        c = model.config
        # A DSpark-format model (block-7 DeepSpec checkpoints) brings its own embedding and lm_head and drafts
        # from block row 0 (shifted alignment); the z-lab format shares the target's and drafts from row 1.
        own = isinstance(model, DSparkDFlashModel)
        self.model = model
        self.embed = model.embed_tokens if own else target.embed_tokens
        self.lm_head = model.lm_head if own else target.lm_head
        self.first_row = model.first_row
        self.block_size, self.max_drafts = c.block_size, c.block_size - self.first_row
        self.tap_layers = tuple(c.target_layer_ids)
        self.mask_token_id = c.mask_token_id
        self.proposes_trees, self.tree_top_k, self.tree_nodes = False, 0, 0
        self.reset()

    def as_tree(self, top_k: int, total_tokens: int) -> "DFlashDrafter":
        """Draft best-first trees over the block (drafters/block_tree.py): `total_tokens` verified rows a round,
        the anchor included, `top_k` tokens considered per position."""
        self.proposes_trees, self.tree_top_k, self.tree_nodes = True, top_k, total_tokens - 1
        return self

    def reset(self) -> None:
        self.ctx: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.ctx_len = 0
        self.prepared: tuple | None = None        # (start, anchor, RowsBlock, row) from prepare_rows, read once

    @torch.inference_mode()
    def _append(self, taps: torch.Tensor) -> None:
        pos = torch.arange(self.ctx_len, self.ctx_len + taps.shape[1], device=taps.device)[None]   # [1, C]
        kv = self.model.context_kv(taps.to(self.model.fc.weight.dtype), pos)
        self.ctx = kv if self.ctx is None else [
            (torch.cat([k0, k], dim=2), torch.cat([v0, v], dim=2)) for (k0, v0), (k, v) in zip(self.ctx, kv)]
        self.ctx_len += taps.shape[1]

    def prefill(self, taps: torch.Tensor | None) -> None:
        self._append(taps)

    def commit(self, n_accepted: int, taps: torch.Tensor | None, path: torch.Tensor | None = None) -> None:
        self._append(taps)              # a tree's: the engine hands over the taps of the accepted path alone

    @torch.inference_mode()
    def block_logits(self, anchor: int, start: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden `[1, B, H]` of the block at positions start..start+B-1 and logits `[k, V]` of the k draft rows
        (rows 1..k, unshifted; rows 0..k-1, shifted: `first_row`)."""
        invariant(start == self.ctx_len, "context must be exactly the positions before the anchor")
        prepared, self.prepared = self.prepared, None
        if prepared is not None and prepared[:2] == (start, anchor):      # this row's share of a batched pass
            shared, i = prepared[2:]
            hidden = shared.hidden[i: i + 1]                                                # [1, B, H]
            return hidden, (shared.logits()[i, :k] if k else self.lm_head(hidden[0, :0]))    # [k, V]
        dev = self.model.fc.weight.device
        ids = torch.full((1, self.block_size), self.mask_token_id, device=dev)
        ids[0, 0] = anchor                                                                  # [1, B]
        pos = torch.arange(start, start + self.block_size, device=dev)[None]                # [1, B]
        hidden = self.model(self.embed(ids), pos, self.ctx)                                 # [1, B, H]
        r0 = self.first_row
        return hidden, self.lm_head(hidden[0, r0: r0 + k])                                  # [k, V]

    def propose(self, anchor: int, start: int, k: int, sampling: Sampling | None) -> Proposal:
        logits = self.block_logits(anchor, start, k)[1]                                     # [k, V]
        if self.proposes_trees:                                      # k bounds the depth (the token budget)
            return best_first(logits, self.tree_top_k, self.tree_nodes)
        return choose(logits, sampling)

    def restrict_vocab(self, regen_dir: str, target, n: int) -> None:
        """Draft from the `n` most frequent answer tokens of a regeneration set (`eval.draft_vocab`,
        `DraftVocabHead`)."""
        self.lm_head = DraftVocabHead(self.lm_head, draft_vocab_ids(regen_dir, target, n))

    @staticmethod
    @torch.inference_mode()
    def prepare_rows(rows: list["DFlashDrafter"], anchors: list[int], starts: list[int], ks: list[int] | None = None,
                     argmax: bool = True) -> None:
        """The block passes of B rows (forks, drafters/base.py) in one: row i's `[anchor, MASK x (B-1)]` at
        `starts[i]`, over its own context (the contexts padded to the longest, the padding masked out); each row's
        next `block_logits` at that anchor reads its share, the draft rows' logits of all rows in one product. `ks`,
        `argmax`: the base protocol's (drafters/base.py), unused: every row's block is the same whatever they are."""
        d, n = rows[0], len(rows)
        dev = d.model.fc.weight.device
        lens = torch.tensor([r.ctx_len for r in rows], device=dev)                          # [n]
        c = max(r.ctx_len for r in rows)
        pad = lambda x: F.pad(x, (0, 0, 0, c - x.shape[2]))                                # noqa: E731 [1, Hkv, C, D]
        kv = [(torch.cat([pad(r.ctx[i][0]) for r in rows]), torch.cat([pad(r.ctx[i][1]) for r in rows]))
              for i in range(len(d.model.layers))]                                         # [n, Hkv, C, D] each
        ids = torch.full((n, d.block_size), d.mask_token_id, device=dev)
        ids[:, 0] = torch.tensor(anchors, device=dev)                                       # [n, B]
        pos = torch.tensor(starts, device=dev)[:, None] + torch.arange(d.block_size, device=dev)   # [n, B]
        sees = torch.arange(c, device=dev)[None] < lens[:, None]                            # [n, C]
        q = d.block_size
        mask = torch.cat([sees[:, None].expand(n, q, c), sees.new_ones(n, q, q)], -1)[:, None]   # [n, 1, B, C+B]
        shared = RowsBlock(d.model(d.embed(ids), pos, kv, mask), d.lm_head, d.first_row, d.max_drafts)
        for i, (r, a, s) in enumerate(zip(rows, anchors, starts)):
            r.prepared = (s, a, shared, i)

    # --- many anchors of a known sequence at once (greedy replay: drafters/base.py, propose_all)
    @torch.inference_mode()
    def context(self, taps: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context K/V `[1, Hkv, C, D]` of a known sequence's taps `[1, C, n*H]` (positions 0..C-1)."""
        pos = torch.arange(taps.shape[1], device=taps.device)[None]                        # [1, C]
        return self.model.context_kv(taps.to(self.model.fc.weight.dtype), pos)

    @torch.inference_mode()
    def blocks(self, ctx, block: torch.Tensor, starts: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Hidden `[n, Q, H]` of n blocks `[n, Q]` in one pass, block i at positions starts[i] .. starts[i]+Q-1.
        Block i attends to the context before its own anchor (what `propose` sees after prefill/commit of exactly
        those positions) and to its own rows: all of them, or those at or before the query with `causal`."""
        n, q = block.shape
        dev, c = block.device, ctx[0][0].shape[2]
        pos = starts[:, None] + torch.arange(q, device=dev)                                 # [n, Q]
        sees = torch.arange(c, device=dev)[None] < starts[:, None]                          # [n, C] context < anchor
        own = torch.ones(q, q, dtype=torch.bool, device=dev)                                # [Q, Q]
        own = own.tril() if causal else own
        mask = torch.cat([sees[:, None].expand(n, q, c), own.expand(n, q, q)], -1)[:, None]   # [n, 1, Q, C+Q]
        kv = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in ctx]
        return self.model(self.embed(block), pos, kv, mask)                                 # [n, Q, H]

    def mask_blocks(self, ids: torch.Tensor, starts: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """`[anchor, MASK x (width-1)]` at each anchor position of `ids` → `[n, width]` (default: block size)."""
        block = torch.full((len(starts), width or self.block_size), self.mask_token_id, device=ids.device)
        block[:, 0] = ids[starts]
        return block

    @torch.inference_mode()
    def propose_all(self, taps: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, ks: torch.Tensor,
                    chunk: int = 64) -> torch.Tensor:
        """Greedy drafts at many anchors of a known sequence (drafters/base.py): every block in one batched pass,
        each attending to the context before its own anchor (as training does), then the lm_head row by row only
        for the blocks whose drafts so far equal the sequence: the vocabulary projection dominates a round's cost
        and acceptance usually ends at the first draft. Returns `[N, K]`, -1 where not computed."""
        dev = self.model.fc.weight.device
        ctx = self.context(taps)
        ids, starts, ks = ids.to(dev), starts.to(dev), ks.to(dev)
        out = torch.full((len(starts), self.max_drafts), -1, dtype=torch.long, device=dev)  # [N, K]
        for c0 in range(0, len(starts), chunk):
            s, k = starts[c0: c0 + chunk], ks[c0: c0 + chunk]                               # [n]
            hidden = self.blocks(ctx, self.mask_blocks(ids, s), s)                          # [n, B, H]
            alive = torch.arange(len(s), device=dev)
            for r in range(1, self.max_drafts + 1):
                alive = alive[k[alive] >= r]
                if alive.numel() == 0:
                    break
                d = self.lm_head(hidden[alive, self.first_row + r - 1]).argmax(-1)          # [a] draft r
                out[c0 + alive, r - 1] = d
                alive = alive[d == sequence_at(ids, s[alive] + r)]
        return out


def check_fits(config: DFlashConfig, target, where: str) -> None:
    """A checkpoint must match the target it drafts for; each mismatch is one clear line."""
    check(config.hidden_size == target.hidden_size,
          f"{where}: hidden_size {config.hidden_size} does not fit target {target.name} (hidden {target.hidden_size})")
    check(config.vocab_size == target.vocab_size,
          f"{where}: vocab_size {config.vocab_size} does not fit target {target.name} (vocab {target.vocab_size})")
    check(config.block_size >= 2, f"{where}: block_size {config.block_size} must be at least 2")
    check(config.num_target_layers == target.num_layers,
          f"{where}: num_target_layers {config.num_target_layers} does not fit target {target.name} "
          f"({target.num_layers} layers)")
    bad = [i for i in config.target_layer_ids if not 0 <= i < target.num_layers]
    check(not bad, f"{where}: target_layer_ids {config.target_layer_ids} out of range for target {target.name} "
                   f"(layers 0..{target.num_layers - 1})")
    check(0 <= config.mask_token_id < target.vocab_size,
          f"{where}: mask_token_id {config.mask_token_id} outside the target vocabulary (0..{target.vocab_size - 1})")


def build(cfg: DFlashSettings, target, path: Path | None = None, raw: dict | None = None) -> DFlashDrafter:
    """From the `drafter` config group: `init=random` (sized to the target), `init=checkpoint`, or
    `init=auto` (the checkpoint when one is set, else random). `path`, `raw`: the checkpoint's directory and
    config.json when the caller has already resolved and read them (Domino looks at it first)."""
    init = ckpt.resolve_init(cfg.init, cfg.checkpoint)
    if init == "random" and cfg.init == "auto":
        log.LOG.info(f"no DFlash checkpoint for target {target.name}: using a random-init drafter "
                     f"(τ ≈ 1); pass drafter.checkpoint=DIR for a trained one")
    if init == "random":
        config = DFlashConfig.for_target(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids)
        check_fits(config, target, "drafter")            # tap ids vs a target whose size the config did not tell
        model = init_weights(DFlashDraftModel(config), cfg.seed)
    else:
        path = ckpt.resolve(str(cfg.checkpoint), cfg.revision) if path is None else path
        where = f"drafter.checkpoint={str(cfg.checkpoint)!r}"
        model = load_model(path, where, raw)
        check_fits(model.config, target, where)
    model = model.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    drafter = DFlashDrafter(model, target)
    return as_mode(drafter, cfg) if cfg.name == "dflash" else drafter      # a backbone drafts as its owner says


def as_mode(drafter, cfg):
    """`drafter` set to draft trees when `drafter.mode=tree` (DFlash, and the head loops built on it)."""
    return drafter.as_tree(cfg.tree.top_k, cfg.tree.total_tokens) if cfg.mode == "tree" else drafter
