"""`target.engine=static`: the target's forward over a preallocated KV cache (gpt-fast style), beside the HF-eager
path (`target.engine=hf`, targets.py), which stays the reference the tests compare against token for token.

What changes against HF eager with a `DynamicCache`:
- The keys and values of every layer live in two buffers `[L, 1, Hkv, S, D]` allocated once per generation
  (`new_cache(capacity)`); a forward writes its rows in place at `length .. length+T-1` instead of concatenating.
- Rollback is a length: `rollback(k)` moves `length` back, and the stale rows are overwritten by the next forward
  (a row at or past `length` is never attended to: the mask stops at `length + T`). A verified tree keeps its
  accepted path by copying those rows down (`keep`), in every layer with one indexed copy.
- The decoder layers are the HF modules' own weights and sub-modules (norms, projections, MLP, rotary embedding,
  `apply_rotary_pos_emb`), called in HF's order; only the cache and the attention call are ours
  (`scaled_dot_product_attention` with GQA and an explicit mask over the cached window).

Conventions: `taps` are layer outputs as HF's `hidden_states[i + 1]` gives them (the last layer's after the final
norm, as HF returns it); logits are those of the final
norm and `lm_head`. Supported: decoder-only models whose layers all use full attention and whose attention module
has `q_proj`/`k_proj`/`v_proj`/`o_proj` (Llama, Qwen2/3, Mistral without a sliding window); anything else is one
line naming what is missing.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .errors import check
from .targets import Target


@dataclass
class StaticKV:
    """Keys and values of every layer, `[L, 1, Hkv, S, D]`; positions `0 .. length-1` are valid."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def get_seq_length(self) -> int:        # the DynamicCache spelling, for callers that read either cache
        return self.length


class StaticTarget(Target):
    """A `Target` whose `forward`, `new_cache`, `rollback` and `keep` run on a `StaticKV` (module docstring)."""

    @classmethod
    def of(cls, target: Target) -> "StaticTarget":
        """The same model, tokenizer and settings, run by the static engine; unsupported models: one line."""
        cfg = target.config
        where = f"target.engine=static ({target.name}, {cfg.model_type})"
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        check(kinds == {"full_attention"}, f"{where}: layers of kind {sorted(kinds - {'full_attention'})} (a "
                                           f"sliding window) are not supported; use target.engine=hf")
        attn = target.model.model.layers[0].self_attn
        missing = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if not hasattr(attn, n)]
        check(not missing, f"{where}: its attention has no {', '.join(missing)}; use target.engine=hf")
        check(hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb"),
              f"{where}: its modeling module has no apply_rotary_pos_emb; use target.engine=hf")
        fields = {f: getattr(target, f) for f in ("name", "model", "tokenizer", "mask_token_id", "stop_token_ids",
                                                  "chat_kwargs", "source", "flash_varlen", "lean", "whole")}
        return cls(**fields)

    def __post_init__(self):
        super().__post_init__()
        if self.lean:
            return
        layers = self.model.model.layers
        attn = layers[0].self_attn
        self._rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.head_dim = attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.scaling = attn.scaling

    def new_cache(self, capacity: int | None = None) -> StaticKV:
        """Buffers for `capacity` positions (default: the model's context), grown by doubling if a forward needs
        more; the engine passes prompt + budget + one block."""
        size = min(capacity or self.max_context, self.max_context)
        shape = (self.num_layers, 1, self.kv_heads, size, self.head_dim)
        dev, dt = self.device, self.dtype
        return StaticKV(torch.zeros(shape, dtype=dt, device=dev), torch.zeros(shape, dtype=dt, device=dev))

    def _grow(self, cache: StaticKV, end: int) -> None:
        """Reallocate the buffers for at least `end` positions (doubling; a hint too small costs one copy)."""
        check(end <= self.max_context, f"target {self.name}: {end} positions exceed its context of "
                                       f"{self.max_context}")
        size = min(max(end, 2 * cache.capacity), self.max_context)
        for name in ("k", "v"):
            old = getattr(cache, name)
            new = old.new_zeros((*old.shape[:3], size, old.shape[4]))
            new[:, :, :, :cache.length] = old[:, :, :, :cache.length]
            setattr(cache, name, new)

    @staticmethod
    def rollback(cache: StaticKV, k: int) -> None:
        """Forget the last k positions (their rows are overwritten by the next forward)."""
        cache.length -= max(k, 0)

    @staticmethod
    @torch.inference_mode()
    def keep(cache: StaticKV, start: int, rows: torch.Tensor) -> None:
        """Of the block cached from `start` on, keep rows `rows [m]` (ascending) at `start .. start+m-1`."""
        m = rows.numel()
        for kv in (cache.k, cache.v):                                                   # [L, 1, Hkv, S, D]
            kv[:, :, :, start:start + m] = kv[:, :, :, start + rows]                    # the right side is a copy
        cache.length = start + m

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, cache: StaticKV, taps: Sequence[int] = (),
                last_only: bool = False, tree=None):
        """As `Target.forward`: `ids [1, T]` at `start ..` (or at `start + tree.depth`), appended to the cache."""
        check(not self.lean, f"target {self.name} was loaded without its decoder layers; it cannot run a forward")
        t, before = ids.shape[1], cache.length
        end = before + t
        if end > cache.capacity:
            self._grow(cache, end)
        dev = ids.device
        if tree is None:
            positions = torch.arange(start, start + t, device=dev)[None]                # [1, T]
            block = torch.ones(t, t, dtype=torch.bool, device=dev).tril()              # [T, T] causal
        else:
            positions, block = (start + tree.depth)[None], tree.visible                # [1, T], [T, T]
        mask = None
        if t > 1:                                     # one row sees every cached key: no mask needed
            mask = torch.cat([torch.ones(t, before, dtype=torch.bool, device=dev), block], 1)[None, None]
        body = self.model.model
        x = body.embed_tokens(ids)                                                      # [1, T, H]
        cos, sin = body.rotary_emb(x, positions)
        wanted, hidden = set(taps), {}
        for i, layer in enumerate(body.layers):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, cache, i, before, end,
                                    mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in wanted:
                hidden[i] = x
        cache.length = end
        x = body.norm(x[:, -1:] if last_only and not taps else x)
        if len(body.layers) - 1 in wanted:            # HF's last hidden state is the normed one
            hidden[len(body.layers) - 1] = x
        logits = self.model.lm_head(x[:, -1:] if last_only else x)                      # [1, T or 1, V]
        return logits, (torch.cat([hidden[i] for i in taps], dim=-1) if taps else None)  # [1, T, n*H]

    def _attention(self, attn, h, cos, sin, cache: StaticKV, i: int, before: int, end: int, mask):
        t, d = h.shape[1], self.head_dim
        q = attn.q_proj(h).view(1, t, -1, d)                                            # [1, T, Hq, D]
        k = attn.k_proj(h).view(1, t, -1, d)                                            # [1, T, Hkv, D]
        if hasattr(attn, "q_norm"):                   # Qwen3: RMSNorm over each head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)              # [1, H, T, D]
        cache.k[i, :, :, before:end] = k
        cache.v[i, :, :, before:end] = attn.v_proj(h).view(1, t, -1, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], attn_mask=mask,
                                             scale=self.scaling, enable_gqa=True)      # [1, Hq, T, D]
        return attn.o_proj(out.transpose(1, 2).reshape(1, t, -1))                       # [1, T, H]
