"""`target.engine=static`: the target's forward over a preallocated KV cache (gpt-fast style), beside the HF-eager
path (`target.engine=hf`, targets/hf.py), which stays the reference the tests compare against token for token.

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

`target.compile=true` (`StaticTarget.of(..., compile=True)`): every block after the prefill runs through a
fixed-shape step, so that one compiled function (and on CUDA one captured graph) serves every step of a shape:
- The attention window is the whole cache capacity S, not the slice `[:length + T]`: a mask lets row r see the
  cached positions `< length` and its block's columns `length + j` that `visible[r, j]` allows. A masked score is
  -inf before the softmax, so its weight is exactly 0 (not a small number); buffers start zeroed and every written
  row is finite, so a masked value adds exactly 0 too (0 × finite). What the window costs is reading S keys
  instead of length + T.
- The cache length and the positions are device tensors (inputs of the step), the rows are written in place with
  `index_copy_` at `length .. length+T-1`: nothing in the step is a Python int that changes as the context grows.
- Shapes: a block of T rows runs padded to `step_rows(T)` rows (1, 2, 4, 8, then multiples of 8: a chain's
  k + 1 = 16 stays 16, the shorter blocks at the end of a token budget fall into a few shapes). A padded row sees
  the cache and itself, its outputs are dropped, and the keys it writes lie past the new length, never attended
  before the next block overwrites them. The capacity is a power of two (`window(n)`, at least 256), and a
  cache's buffers are reused by the next cache of the same capacity once the first is gone (a pool), so one
  compiled function per (row count, capacity) serves every prompt.
- The prefill (the first forward into a cache), a block of more than `MAX_STEP_ROWS` rows and a block whose
  padded rows would not fit in the cache run the eager step above (a cache grown past its hint leaves the pool).
- Compilation: `torch.compile(dynamic=False, fullgraph=True)` of the decoder layer (`unit="layer"`, the default):
  its code, compiled once per shape, serves every layer, whose weights and cache slices are its inputs, so a
  compilation costs one layer's (mini target, busy CPU: ~30 s a shape against ~140 s for the whole 30-layer step
  as one graph, `unit="step"`, which buys nothing measurable there: experiments/results/engine/). The embedding,
  mask, final norm and lm_head run as plain PyTorch around it.
- CUDA: each shape's whole step (every layer) is captured in one `torch.cuda.CUDAGraph` (kernels/graphs.GraphedLoop)
  with static input buffers (ids, positions, length, block mask) on the pooled cache, and replayed with its
  outputs copied out: no Python and no launch per kernel at replay, whatever the compilation unit. Explicit
  capture rather than `mode="reduce-overhead"`: the step mutates the KV cache in place, which CUDA-graph trees
  replay only for inputs they treat as static (else they skip the graph, with a warning a run would not show),
  their outputs are overwritten by the next replay unless every call marks a step, they would capture each
  compiled layer apart, and an explicit capture wraps the plain step too (`inductor=False`: a capture costs one
  forward, not a compilation), which the GPU check measures beside the compiled one (scripts/gpu_parts/static_graph.py).
"""
from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import check
from ..log import get as get_logger
from .cpu_linear import Joined, is_packed, join
from .hf import Target

LOG = get_logger(__name__)
MAX_STEP_ROWS = 1024            # blocks up to this many rows run through the fixed-shape step (trees: 1,024 nodes)
MIN_WINDOW = 256                # the smallest capacity of a cache of the fixed-shape step
RECOMPILE_LIMIT = 64            # compiled shapes (rows x capacity x taps) one target may hold (dynamo's default: 8)


def step_rows(t: int) -> int:
    """The rows a block of `t` runs at in the fixed-shape step: 1, 2, 4, 8, then the next multiple of 8."""
    return 1 << (t - 1).bit_length() if t <= 8 else -(-t // 8) * 8


def _widened(kv: torch.Tensor, size: int, keep: int) -> torch.Tensor:
    """`kv [L, B, Hkv, S, D]` in new zeroed buffers of `size` positions, its first `keep` positions copied."""
    new = kv.new_zeros((*kv.shape[:3], size, kv.shape[4]))
    new[:, :, :, :keep] = kv[:, :, :, :keep]
    return new


def window(n: int) -> int:
    """The capacity of a fixed-shape cache holding `n` positions: a power of two, at least `MIN_WINDOW`."""
    return max(MIN_WINDOW, 1 << (max(n, 1) - 1).bit_length())


@dataclass
class StaticKV:
    """Keys and values of every layer, `[L, 1, Hkv, S, D]`; positions `0 .. length-1` are valid."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0
    pooled: bool = False          # the buffers are the target's pooled ones (fixed-shape step: graphs may replay)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def get_seq_length(self) -> int:        # the DynamicCache spelling, for callers that read either cache
        return self.length


@dataclass
class RowsKV:
    """The caches of B independent sequences in one pair of buffers `[L, B, Hkv, S, D]` (batched generation,
    decoding/batch.py): row b holds positions `0 .. lengths[b]-1` of its own sequence. A row is filled by a prefill
    of its own (`row(b)`, the batch-1 forward on a view of its slice), then advanced one token a step for all rows
    at once (`StaticTarget.decode_rows`)."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: list[int]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows, in this order (the batch shrinks: a finished batch's tail stops paying for its
        dead rows)."""
        idx = torch.tensor(rows, device=self.k.device)
        self.k, self.v = self.k.index_select(1, idx), self.v.index_select(1, idx)              # [L, B', Hkv, S, D]
        self.lengths = [self.lengths[r] for r in rows]

    def row(self, b: int) -> StaticKV:
        """Row b as an empty batch-1 cache on the same memory (a prefill writes the batched buffers)."""
        self.lengths[b] = 0
        return StaticKV(self.k[:, b:b + 1], self.v[:, b:b + 1])


class StaticTarget(Target):
    """A `Target` whose `forward`, `new_cache`, `rollback` and `keep` run on a `StaticKV` (module docstring)."""

    @classmethod
    def of(cls, target: Target, compile: bool = False, inductor: bool = True, unit: str = "layer") -> "StaticTarget":
        """The same model, tokenizer and settings, run by the static engine; unsupported models: one line.
        `compile`: the fixed-shape step (`set_compile`)."""
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
        out = cls(**fields)
        out.set_compile(compile, inductor, unit)
        return out

    def set_compile(self, compile: bool, inductor: bool = True, unit: str = "layer") -> None:
        """Run the blocks after the prefill through the fixed-shape step (module docstring): compiled by inductor
        when `inductor` (`unit`: see `_step_function`), and on CUDA captured as one graph per shape;
        `compile=False`: the eager step only."""
        check(unit in ("layer", "step"), f"unit={unit!r}: layer or step")
        check(not (compile and inductor and is_packed(self.model)),
              f"target {self.name}: target.compile=true on a model whose linear layers are packed for oneDNN "
              "(target.prepack): inductor packs a compiled step's weights itself; load it with target.prepack=false")
        self.compiled, self.inductor, self.unit = bool(compile), bool(inductor), unit
        self.graphs = self.compiled and self.device.type == "cuda"        # one CUDA graph per shape (`_replay`)
        self._pool, self._graphs, self._step_fn, self._layer_fn = {}, {}, None, None

    def __post_init__(self):
        super().__post_init__()
        self.set_compile(False)
        if self.lean:
            return
        layers = self.model.model.layers
        attn = layers[0].self_attn
        self._rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.head_dim = attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.scaling = attn.scaling
        self._joins: tuple[bool | None, list] = (None, [])

    def joins(self) -> list[tuple[Joined | None, Joined | None]]:
        """Per layer, its q/k/v and its gate/up projections as one packed product each (`cpu_linear.join`), or
        None where the layers are not packed alike: built once the model is packed (`target.prepack`), the same
        numbers as the separate products (cpu_linear.Joined). Read by the eager steps (`forward`, `forward_rows`)."""
        layers = self.model.model.layers
        packed = "packed_kind" in vars(layers[0].self_attn.q_proj)
        if self._joins[0] != packed:
            rows = []
            for layer in layers:
                a, m = layer.self_attn, layer.mlp
                qkv = join([a.q_proj, a.k_proj, a.v_proj]) if packed else None
                gu = (join([m.gate_proj, m.up_proj]) if packed and all(hasattr(m, n) for n in
                      ("gate_proj", "up_proj", "down_proj", "act_fn")) else None)
                rows.append((qkv, gu))
            self._joins = (packed, rows)
        return self._joins[1]

    @staticmethod
    def _mlp(mlp, h: torch.Tensor, gate_up: Joined | None) -> torch.Tensor:
        """The layer's MLP, its gate and up products joined where they are (HF's order: down(act(gate) * up))."""
        if gate_up is None:
            return mlp(h)
        gu = gate_up(h)                                                                  # [.., 2I]
        i = mlp.gate_proj.out_features
        return mlp.down_proj(mlp.act_fn(gu[..., :i]) * gu[..., i:])

    def new_cache(self, capacity: int | None = None) -> StaticKV:
        """Buffers for `capacity` positions (default: the model's context), grown by doubling if a forward needs
        more; the engine passes prompt + budget + one block. With the fixed-shape step and a `capacity`, the
        capacity is `window(capacity)` and the buffers are the pool's of that size when no earlier cache on them
        is alive (zeroed again), else new ones."""
        if not self.compiled or capacity is None:
            return self._buffers(min(capacity or self.max_context, self.max_context))
        size = min(window(capacity), self.max_context)
        held = self._pool.get(size)
        if held is not None and held[0]() is None:            # the last cache on these buffers is gone
            with torch.inference_mode():                      # buffers made in a generation are inference tensors
                held[1].zero_()
                held[2].zero_()
            cache = StaticKV(held[1], held[2], pooled=True)
        elif held is None:
            cache = self._buffers(size)
            cache.pooled = True
        else:                                                 # two live caches of one size: the second is not pooled
            return self._buffers(size)
        self._pool[size] = (weakref.ref(cache), cache.k, cache.v)
        return cache

    def _buffers(self, size: int) -> StaticKV:
        return StaticKV(*self._zeros(1, size))

    def _zeros(self, rows: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed key and value buffers `[L, rows, Hkv, size, D]`."""
        shape = (self.num_layers, rows, self.kv_heads, size, self.head_dim)
        return tuple(torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2))

    def _grow(self, cache: StaticKV, end: int) -> None:
        """Reallocate the buffers for at least `end` positions (doubling; a hint too small costs one copy)."""
        check(end <= self.max_context, f"target {self.name}: {end} positions exceed its context of "
                                       f"{self.max_context}")
        size = min(max(end, 2 * cache.capacity), self.max_context)
        if self.compiled:
            size = min(window(size), self.max_context)
        cache.pooled = False                          # graphs captured on the old buffers no longer apply
        cache.k, cache.v = _widened(cache.k, size, cache.length), _widened(cache.v, size, cache.length)

    def new_rows_cache(self, rows: int, capacity: int) -> RowsKV:
        """Buffers for `rows` sequences of up to `capacity` positions each (batched generation)."""
        check(rows >= 1, f"a batch of {rows} rows: at least 1")
        return RowsKV(*self._zeros(rows, min(capacity, self.max_context)), [0] * rows)

    def grow_rows(self, cache: RowsKV, end: int) -> None:
        """Reallocate a batch's buffers for at least `end` positions a row (doubling), keeping every row whole."""
        check(end <= self.max_context, f"target {self.name}: {end} positions exceed its context of "
                                       f"{self.max_context}")
        if end <= cache.capacity:
            return
        # Every position is kept, not only each row's counted ones: batched speculation grows the cache while a row's
        # verified block is written but not yet counted (its accepted part is counted after the growth).
        size = min(max(end, 2 * cache.capacity), self.max_context)
        cache.k, cache.v = _widened(cache.k, size, cache.capacity), _widened(cache.v, size, cache.capacity)

    @torch.inference_mode()
    def decode_rows(self, ids: torch.Tensor, cache: RowsKV, live: Sequence[bool]) -> torch.Tensor:
        """One greedy step of every row: `ids [B]` (each row's newest token) at position `lengths[b]`; returns the
        logits `[B, V]`. A row that is not `live` (its sequence ended, none left to refill it) runs along on its
        last token and keeps its length; its logits are to be ignored. The rows of a step share every matrix
        product, which is the point: on a memory-bound device a step of B rows costs about what one row costs."""
        logits, _ = self.forward_rows(ids[:, None], cache)                                      # [B, 1, V]
        for r, alive in enumerate(live):
            cache.lengths[r] += bool(alive)
        return logits[:, 0]

    @torch.inference_mode()
    def forward_rows(self, ids: torch.Tensor, cache: RowsKV, taps: Sequence[int] = ()):
        """A block of T tokens for every row: `ids [B, T]`, row b's at positions `lengths[b] .. lengths[b]+T-1`,
        written to the row's cache there. Row b's token j attends to its row's columns `0 .. lengths[b]+j` only (a
        mask over the batch's window of `max(lengths) + T` columns; a masked score is -inf, its weight exactly 0).
        Returns logits `[B, T, V]` and the taps `[B, T, n*H]` (None without taps). The lengths are the caller's
        to move: a decode step keeps all T = 1, a verified block keeps the anchor and its accepted drafts (the rest
        is rolled back by not counting it, and overwritten by the row's next block)."""
        check(not self.lean, f"target {self.name} was loaded without its decoder layers; it cannot run a forward")
        (b, t), dev, d = ids.shape, ids.device, self.head_dim
        end = max(cache.lengths) + t
        if end > cache.capacity:
            self.grow_rows(cache, end)
        slots = torch.tensor(cache.lengths, device=dev)[:, None] + torch.arange(t, device=dev)   # [B, T]
        rows = torch.arange(b, device=dev)[:, None]                                             # [B, 1]
        mask = torch.arange(end, device=dev)[None, None] <= slots[:, :, None]                   # [B, T, W]
        body = self.model.model
        x = body.embed_tokens(ids)                                                              # [B, T, H]
        cos, sin = body.rotary_emb(x, slots)
        g = None
        wanted, hidden = set(taps), {}
        for i, (layer, (qkv, gate_up)) in enumerate(zip(body.layers, self.joins())):
            attn, h = layer.self_attn, layer.input_layernorm(x)
            q, k, v = self._qkv(attn, h, qkv)                                                   # [B, T, H*, D]
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)                  # [B, H, T, D]
            cache.k[i, rows, :, slots] = k.transpose(1, 2)                                      # [B, T, Hkv, D]
            cache.v[i, rows, :, slots] = v
            if g is None:
                g = q.shape[1] // self.kv_heads
                m = mask[:, None].expand(b, g, t, end).reshape(b, 1, g * t, end)               # [B, 1, G*T, W]
            # The G query heads of a key-value head as G*T rows (query head h reads kv head h // G): one attention
            # without enable_gqa, which on a CPU copies K and V out G times per layer (2 of 3 ms a layer at B=16).
            q = q.reshape(b, self.kv_heads, g * t, d)                                           # [B, Hkv, G*T, D]
            out = F.scaled_dot_product_attention(q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], attn_mask=m,
                                                 scale=self.scaling)                            # [B, Hkv, G*T, D]
            out = out.view(b, self.kv_heads * g, t, d).transpose(1, 2).reshape(b, t, -1)        # [B, T, Hq*D]
            x = x + attn.o_proj(out)                                                            # [B, T, H]
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x), gate_up)
            if i in wanted:
                hidden[i] = x
        x = body.norm(x)
        if len(body.layers) - 1 in wanted:            # HF's last hidden state is the normed one
            hidden[len(body.layers) - 1] = x
        logits = self.model.lm_head(x)                                                          # [B, T, V]
        return logits, (torch.cat([hidden[i] for i in taps], dim=-1) if taps else None)        # [B, T, n*H]

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
        """As `Target.forward`: `ids [1, T]` at `start ..` (or at `start + tree.depth`), appended to the cache.
        Compiled (`set_compile`): a block after the prefill goes through the fixed-shape step (`_fixed_forward`)."""
        check(not self.lean, f"target {self.name} was loaded without its decoder layers; it cannot run a forward")
        t, before = ids.shape[1], cache.length
        end = before + t
        if self.compiled and 0 < before and t <= MAX_STEP_ROWS and before + step_rows(t) <= cache.capacity:
            return self._fixed_forward(ids, start, cache, tuple(taps), last_only, tree)
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
        for i, (layer, (qkv, gate_up)) in enumerate(zip(body.layers, self.joins())):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, cache, i, before, end,
                                    mask, qkv)
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x), gate_up)
            if i in wanted:
                hidden[i] = x
        cache.length = end
        x = body.norm(x[:, -1:] if last_only and not taps else x)
        if len(body.layers) - 1 in wanted:            # HF's last hidden state is the normed one
            hidden[len(body.layers) - 1] = x
        logits = self.model.lm_head(x[:, -1:] if last_only else x)                      # [1, T or 1, V]
        return logits, (torch.cat([hidden[i] for i in taps], dim=-1) if taps else None)  # [1, T, n*H]

    def _qkv(self, attn, h: torch.Tensor, qkv: Joined | None):
        """The layer's queries, keys and values of `h [B, T, H]`, each `[B, T, heads, D]`: one joined product
        where there is one, else the three projections."""
        b, t, d = *h.shape[:2], self.head_dim
        if qkv is None:
            return (attn.q_proj(h).view(b, t, -1, d), attn.k_proj(h).view(b, t, -1, d),
                    attn.v_proj(h).view(b, t, -1, d))
        nq, nk = attn.q_proj.out_features, attn.k_proj.out_features
        out = qkv(h)                                                                    # [B, T, Nq + 2 Nk]
        return (out[..., :nq].view(b, t, -1, d), out[..., nq:nq + nk].view(b, t, -1, d),
                out[..., nq + nk:].view(b, t, -1, d))

    def _attention(self, attn, h, cos, sin, cache: StaticKV, i: int, before: int, end: int, mask,
                   qkv: Joined | None = None):
        t, d = h.shape[1], self.head_dim
        q, k, v = self._qkv(attn, h, qkv)                                               # [1, T, H*, D]
        if hasattr(attn, "q_norm"):                   # Qwen3: RMSNorm over each head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)              # [1, H, T, D]
        cache.k[i, :, :, before:end] = k
        cache.v[i, :, :, before:end] = v.transpose(1, 2)
        if t == 1 and q.dtype is torch.bfloat16:
            # One bf16 row: the G query heads of a key-value head as G rows of one attention without enable_gqa,
            # 5x faster on a CPU than the GQA kernel (mini target, 200-400 cached positions: 31-48 against 160-330 us
            # a layer, 4 ms of a 30 ms step). The same arithmetic in another order: on random inputs 21 of 700 cache
            # lengths differ in the last bit of some output (torch 2.13), so bf16 steps are HF's to rounding, not
            # bit for bit (tests/decoding/test_static_target.py). Not in fp32 (there the GQA kernel is the faster
            # one, 24 against 29 us, and fp32 stays HF's bit for bit), nor for blocks of rows (a mask repeated G
            # times: slower from 8 rows on).
            g = q.shape[1] // self.kv_heads
            out = F.scaled_dot_product_attention(q.view(1, self.kv_heads, g, d), cache.k[i, :, :, :end],
                                                 cache.v[i, :, :, :end], scale=self.scaling)  # [1, Hkv, G, D]
            return attn.o_proj(out.reshape(1, 1, -1))                                    # [1, 1, H]
        out = F.scaled_dot_product_attention(q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], attn_mask=mask,
                                             scale=self.scaling, enable_gqa=True)      # [1, Hq, T, D]
        return attn.o_proj(out.transpose(1, 2).reshape(1, t, -1))                       # [1, T, H]

    # ------------------------------------------------------------------------------------ the fixed-shape step
    def _fixed_forward(self, ids: torch.Tensor, start: int, cache: StaticKV, taps: tuple, last_only: bool, tree):
        """`forward` through the fixed-shape step: the block padded to `step_rows(T)` rows, its inputs made device
        tensors, run compiled (and on CUDA replayed from a graph), the padding's outputs dropped."""
        t, before, dev = ids.shape[1], cache.length, ids.device
        tp = step_rows(t)
        if tree is None:
            positions = torch.arange(start, start + tp, device=dev)[None]                     # [1, Tp]
            block = torch.ones(t, t, dtype=torch.bool, device=dev).tril()                    # [T, T]
        else:
            positions = torch.cat([start + tree.depth, tree.depth.new_full((tp - t,), start)])[None]
            block = tree.visible
        if tp > t:                                  # a padded row sees the cache and itself; no real row sees it
            ids = torch.cat([ids, ids[:, -1:].expand(1, tp - t)], 1)                          # [1, Tp]
            visible = torch.eye(tp, dtype=torch.bool, device=dev)
            visible[:t, :t] = block
        else:
            visible = block                                                                    # [Tp, Tp]
        length = torch.full((), before, dtype=torch.long, device=dev)                         # no host sync
        if self.graphs and cache.pooled:
            logits, hidden = self._replay(ids, positions, length, visible, cache, taps)
        else:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                logits, hidden = self._step_function()(ids, positions, length, visible, cache.k, cache.v, taps)
        cache.length = before + t
        logits = logits[:, t - 1:t] if last_only else logits[:, :t]                          # [1, T or 1, V]
        return logits, (hidden[:, :t] if taps else None)                                       # [1, T, n*H]

    def _step_function(self):
        """The step as it runs. `unit="layer"` (the default): the decoder layer is compiled once per shape and that
        code serves every layer (their weights and cache slices are its inputs), the rest of the step (embedding,
        mask, final norm, lm_head) runs as plain PyTorch around it; `unit="step"`: the whole step is one compiled
        graph (cross-layer fusion, compilation time in proportion to the depth). Without inductor: plain PyTorch.
        `dynamic=False`: a shape is a constant of its code, and the context's growth changes no shape."""
        if self._step_fn is None:
            compile = lambda f: torch.compile(f, dynamic=False, fullgraph=True)      # noqa: E731
            self._layer_fn = compile(self._layer) if self.inductor and self.unit == "layer" else self._layer
            self._step_fn = compile(self._step) if self.inductor and self.unit == "step" else self._step
        return self._step_fn

    def _step(self, ids, positions, length, visible, k_cache, v_cache, taps: tuple):
        """The fixed-shape forward of `ids [1, Tp]` at `positions [1, Tp]`, written to the cache rows `length ..
        length+Tp-1` (`length`: a 0-dim device tensor); row r attends to every column `< length` and to the block's
        column j where `visible [Tp, Tp]` allows, over the whole window of S columns. Returns logits
        `[1, Tp, V]` and the taps `[1, Tp, n*H]` (None without taps)."""
        tp, s = ids.shape[1], k_cache.shape[3]
        dev = ids.device
        rel = torch.arange(s, device=dev) - length                   # [S] column -> its row of the block (< 0: cached)
        inside = (rel >= 0) & (rel < tp)
        mask = (rel < 0) | (inside & visible.index_select(1, rel.clamp(0, tp - 1)))          # [Tp, S]
        slots = length + torch.arange(tp, device=dev)                                         # [Tp]
        body = self.model.model
        x = body.embed_tokens(ids)                                                            # [1, Tp, H]
        cos, sin = body.rotary_emb(x, positions)
        wanted, hidden = set(taps), {}
        for i, layer in enumerate(body.layers):
            x = self._layer_fn(layer, x, cos, sin, k_cache[i], v_cache[i], slots, mask)
            if i in wanted:
                hidden[i] = x
        x = body.norm(x)
        if len(body.layers) - 1 in wanted:
            hidden[len(body.layers) - 1] = x
        logits = self.model.lm_head(x)                                                        # [1, Tp, V]
        return logits, (torch.cat([hidden[i] for i in taps], dim=-1) if taps else None)

    def _layer(self, layer, x, cos, sin, k_cache, v_cache, slots, mask):
        """One decoder layer of the step (HF's order: norm, attention, residual, norm, MLP, residual)."""
        x = x + self._window_attention(layer.self_attn, layer.input_layernorm(x), cos, sin, k_cache, v_cache, slots,
                                       mask)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _window_attention(self, attn, h, cos, sin, k_cache, v_cache, slots, mask):
        """One layer's attention over the whole window (`k_cache`, `v_cache`: [1, Hkv, S, D]). The G query heads
        of a key-value head are stacked along the rows ([1, Hkv, G*Tp, D]; HF's grouping: query head h reads
        key-value head h // G), so one masked attention without `enable_gqa` covers them: on CUDA the masked
        memory-efficient kernel takes it, where a mask with GQA would fall back to the math path."""
        t, d, hkv = h.shape[1], self.head_dim, self.kv_heads
        q = attn.q_proj(h).view(1, t, -1, d)                                                  # [1, T, Hq, D]
        k = attn.k_proj(h).view(1, t, -1, d)                                                  # [1, T, Hkv, D]
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)                    # [1, H, T, D]
        k_cache.index_copy_(2, slots, k)                                                      # in place, [1, Hkv, S, D]
        v_cache.index_copy_(2, slots, attn.v_proj(h).view(1, t, -1, d).transpose(1, 2))
        g = q.shape[1] // hkv
        q = q.reshape(1, hkv, g * t, d)                                                       # [1, Hkv, G*T, D]
        m = mask.repeat(g, 1)[None, None]                                                     # [1, 1, G*T, S]
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=m, scale=self.scaling)
        return attn.o_proj(out.view(1, hkv * g, t, d).transpose(1, 2).reshape(1, t, -1))      # [1, T, H]

    def _replay(self, ids, positions, length, visible, cache: StaticKV, taps: tuple):
        """The step of this shape on these (pooled) buffers as a captured graph (kernels/graphs.GraphedLoop: warmed
        up on a side stream, where compilation and autotuning happen, then captured): the inputs copied into its
        static buffers, one replay, the outputs copied out (the next replay overwrites them)."""
        from ..kernels import graphs

        key = (ids.shape[1], taps, cache.k.data_ptr(), cache.v.data_ptr())
        if key not in self._graphs:
            inputs = [x.clone() for x in (ids, positions, length, visible)]                 # the static buffers
            box, fn, k, v = {}, self._step_function(), cache.k, cache.v     # not `cache`: the pool must see it go

            def body():
                box["out"] = fn(*inputs, k, v, taps)
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                self._graphs[key] = (inputs, box, graphs.GraphedLoop(body))
            LOG.debug("static engine: captured the %d-row step (capacity %d)", ids.shape[1], cache.capacity)
        else:
            inputs, box, _ = self._graphs[key]
            for buf, x in zip(inputs, (ids, positions, length, visible)):
                buf.copy_(x)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):      # EagerLoop (tests) calls the step
            self._graphs[key][2]()
        logits, hidden = box["out"]
        return logits.clone(), (hidden.clone() if hidden is not None else None)
