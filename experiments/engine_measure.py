"""Measurement helpers of experiments/bench_engine.py: the parts of a real round, the host syncs per round, the
machine's read bandwidth and the memory floor of an AR step, HF's built-in DFlash loaded from a specexp DFlash
drafter, and the cost of a drafter's vocabulary projection in fp32, bf16 and over a pruned head.

Everything here times or counts on the CPU, where a Python timer around a call measures that call (no queued
kernels); on a GPU these timers would need a device synchronisation first.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specexp.decoding.engine import DecodeConfig, generate


def median_ms(f, reps: int, warmup: int = 1) -> float:
    """Median wall time of `f()` in ms over `reps` calls, after `warmup` untimed calls (first calls allocate)."""
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


# ------------------------------------------------------------------------------------------------ host syncs
# The hooks of tests/decoding/test_syncs.py, without pytest's monkeypatch: everything that would stall the host on a
# GPU (a device-to-host read, a blocking host-to-device copy) is counted where it is called.
READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


class SyncCounter:
    """`with SyncCounter() as s: ...` counts the calls of `READS`, `torch.equal` and `torch.tensor`/`as_tensor` of
    host data onto a device made inside the block (`s.n`, by name in `s.where`); everything is restored on exit."""

    def __init__(self):
        self.n, self.where, self._undo = 0, {}, []

    def _count(self, name: str) -> None:
        self.n += 1
        self.where[name] = self.where.get(name, 0) + 1

    def _patch(self, owner, name: str, new) -> None:
        own = name in vars(owner)                # inherited (Tensor from TensorBase): delete ours on exit instead
        self._undo.append((owner, name, getattr(owner, name) if own else None, own))
        setattr(owner, name, new)

    def __enter__(self) -> "SyncCounter":
        def counted(fn, name):
            def wrapper(*args, **kw):
                self._count(name)
                return fn(*args, **kw)
            return wrapper

        for name in READS:
            self._patch(torch.Tensor, name, counted(getattr(torch.Tensor, name), name))
        self._patch(torch, "equal", counted(torch.equal, "torch.equal"))
        for name in ("tensor", "as_tensor"):
            def copy(data, *args, _make=getattr(torch, name), _name=name, **kw):
                if kw.get("device") is not None and not isinstance(data, torch.Tensor):
                    self._count(f"torch.{_name}(host data, device=)")
                return _make(data, *args, **kw)
            self._patch(torch, name, copy)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, old, own in reversed(self._undo):
            if own:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self._undo = []


def syncs_per_round(target, drafter, ids: list[int], dc: DecodeConfig) -> list[int]:
    """Host syncs in each interval between consecutive target forwards from the first verification on (one round:
    its verification, the drafter's commit and the next proposal), as tests/decoding/test_syncs.py counts them."""
    marks, forward = [], target.forward
    with SyncCounter() as s:
        def marked(*args, **kw):
            marks.append(s.n)
            return forward(*args, **kw)
        target.forward = marked
        try:
            generate(target, drafter, ids, dc)
        finally:
            del target.forward                                  # the class's method again
        marks.append(s.n)
    return [b - a for a, b in zip(marks[1:-1], marks[2:-1])]   # complete rounds only (the last has no proposal)


# ---------------------------------------------------------------------------------------------- a round's parts
def projection_modules(drafter) -> list[torch.nn.Module]:
    """The vocabulary projections a drafter runs while proposing: its lm_head (DFlash: the target's, shared), its
    backbone's (DeLS, Domino), its model's own (EAGLE-3: the draft vocabulary)."""
    mods = []
    for owner in (drafter, getattr(drafter, "backbone", None), getattr(drafter, "model", None)):
        m = getattr(owner, "lm_head", None) if owner is not None else None
        if isinstance(m, torch.nn.Module) and all(m is not x for x in mods):
            mods.append(m)
    return mods


def timed_rounds(target, drafter, ids: list[int], dc: DecodeConfig):
    """One generation with every round cut into parts (s): `wall` (one target forward's start to the next's),
    `verify` (the target forward), `propose` and, inside it, `projection` (the drafter's vocabulary projections;
    DeLS: also the fused [V, r] head rows, `fuse_torch`), `commit`, and `rest` = wall - verify - propose - commit
    (acceptance, rollback, the loop's own Python). Rounds from the first verification to the last complete one.
    Returns the Generation and `{part: [seconds per round]}`."""
    from specexp.drafters import head_loop

    events, state = [], {"in_propose": False, "t": 0.0}
    clock = time.perf_counter

    def timed(kind, fn):
        def wrapper(*args, **kw):
            t0 = clock()
            if kind == "propose":
                state["in_propose"] = True
            try:
                return fn(*args, **kw)
            finally:
                if kind == "propose":
                    state["in_propose"] = False
                events.append((kind, t0, clock()))
        return wrapper

    undo = [(target, "forward")]
    target.forward = timed("verify", target.forward)
    hooks, fuse = [], head_loop.fuse_torch
    if drafter is not None:
        for name, kind in (("propose", "propose"), ("commit", "commit")):
            undo.append((drafter, name))
            setattr(drafter, name, timed(kind, getattr(drafter, name)))

        def pre(module, args):
            state["t"] = clock()

        def post(module, args, out):
            if state["in_propose"]:                # a shared lm_head also serves the target's forwards
                events.append(("projection", state["t"], clock()))
        for m in projection_modules(drafter):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        head_loop.fuse_torch = timed("projection", fuse)
    try:
        gen = generate(target, drafter, ids, dc)
    finally:
        for obj, name in undo:
            delattr(obj, name)                     # the class's method again
        for h in hooks:
            h.remove()
        head_loop.fuse_torch = fuse
    starts = [t0 for kind, t0, _ in events if kind == "verify"]
    parts = {p: [] for p in ("wall", "verify", "propose", "projection", "commit", "rest")}
    for a, b in zip(starts[1:], starts[2:]):      # forward 0 is the prefill
        inside = {p: sum(t1 - t0 for kind, t0, t1 in events if kind == p and a <= t0 < b)
                  for p in ("verify", "propose", "projection", "commit")}
        for p, v in inside.items():
            parts[p].append(v)
        parts["wall"].append(b - a)
        parts["rest"].append(b - a - inside["verify"] - inside["propose"] - inside["commit"])
    return gen, parts


# ------------------------------------------------------------------------------------------- bandwidth floor
def read_bandwidth(mib: int = 512, reps: int = 7) -> float:
    """The machine's read bandwidth in GB/s: the median over `reps` sums of a `mib`-MiB fp32 tensor (far larger
    than any cache, so it streams from memory), at torch's current thread count."""
    x = torch.ones(mib * 2 ** 20 // 4)                                                  # [N] fp32
    t = median_ms(lambda: x.sum(), reps) / 1000
    return x.numel() * 4 / t / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights, a tied embedding counted once (an AR step reads every weight once, the
    embedding table one row only, but a tied table is read whole as the lm_head)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes(config, context: int, dtype: torch.dtype) -> int:
    """Bytes of the keys and values one step reads at `context` positions."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_pos = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    return per_pos * context * torch.empty(0, dtype=dtype).element_size()


# ------------------------------------------------------------------------------------------ HF's built-in DFlash
def hf_dflash_assistant(drafter):
    """HF's built-in DFlash drafter (`generate(..., assistant_model=A, speculation_type="dflash")`) holding a
    specexp z-lab-format DFlash drafter's weights. In transformers 5.24 the only model that the DFlash candidate
    generator drives is `MuseGlimmerAssistantModel`: the same computation (fc + RMSNorm over the concatenated
    taps, every layer's K/V over [context; block] with q/k norms and RoPE at absolute positions, no causal mask,
    a final norm; the target's embedding and lm_head, drafts from block rows 1..B-1), with `fc`/`hidden_norm`
    named `encoder.fc`/`encoder.output_norm_enc`. Returns the model, or raises `RuntimeError(reason)` in one line."""
    import transformers

    from specexp.drafters.dflash import DFlashDraftModel, DSparkDFlashModel

    gen_cfg = transformers.GenerationConfig()
    if not hasattr(gen_cfg, "speculation_type"):
        raise RuntimeError(f"transformers {transformers.__version__} has no speculation_type='dflash'")
    cls = getattr(transformers, "MuseGlimmerAssistantModel", None)
    if cls is None:
        raise RuntimeError(f"transformers {transformers.__version__} has no DFlash assistant model class")
    model = getattr(drafter, "model", None)
    if not isinstance(model, DFlashDraftModel) or isinstance(model, DSparkDFlashModel):
        raise RuntimeError("HF's DFlash drafts from block rows 1..B-1 with the target's embedding and lm_head: "
                           "only a z-lab-format DFlash drafter maps onto it")
    c = model.config
    hc = transformers.MuseGlimmerAssistantConfig(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        max_position_embeddings=c.max_position_embeddings, layer_types=["full_attention"] * c.num_hidden_layers,
        attention_bias=c.attention_bias, block_size=c.block_size, mask_token_id=c.mask_token_id,
        target_layer_ids=list(c.target_layer_ids), bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if c.attention_bias:
        raise RuntimeError("HF's DFlash assistant has no attention biases; this drafter has them")
    rename = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
    state = {rename.get(k, k): v for k, v in model.state_dict().items()}
    with torch.device("meta"):
        hf = cls(hc)
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"HF's DFlash assistant does not take this drafter's weights (missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]})")
    hf.rotary_emb = type(hf.rotary_emb)(hc)       # its inverse frequencies are a buffer: built, not loaded
    w = model.fc.weight
    return hf.to(device=w.device, dtype=w.dtype).eval()


# ------------------------------------------------------------------------------- the vocabulary projection
def response_token_counts(regen_dir: Path, target) -> torch.Tensor:
    """How often each token id occurs in the responses of a packed regeneration set (data/regen/, README there):
    the target's own greedy answers. Refused (`RuntimeError`, one line) when the set was made by another target."""
    import io

    import numpy as np

    from specexp import files

    m = json.loads((regen_dir / "manifest.json").read_text())
    made_by = m["provenance"].get("target", {}).get("name")
    if made_by != target.name:
        raise RuntimeError(f"{regen_dir} holds {made_by}'s answers, not {target.name}'s")
    tokens = np.load(io.BytesIO(files.read_bytes(files.stored(regen_dir / "tokens.npy"), "regen set")),
                     allow_pickle=False)
    counts, off = torch.zeros(target.vocab_size, dtype=torch.long), 0
    for _, p, r, _ in m["rows"]:
        counts += torch.bincount(torch.from_numpy(tokens[off + p: off + p + r].astype("int64")),
                                 minlength=target.vocab_size)[:target.vocab_size]
        off += p + r
    return counts


def projection_study(hidden: torch.Tensor, blocks: list[torch.Tensor], w32: torch.Tensor,
                     counts: torch.Tensor | None, sizes: tuple[int, ...], reps: int) -> list[dict]:
    """What an argmax over the drafter's vocabulary projection costs and how often it keeps the fp32 full head's
    choice. `hidden [N, H]`: the drafter's final hidden rows of real proposals (fp32); `blocks`: some proposals'
    rows `[k, H]` each (one call = one proposal's k rows); `w32 [V, H]`: the head in fp32; `counts [V]`: token
    frequencies choosing a pruned head's rows (the `n` most frequent; None: no pruned heads).

    Per variant: ms per call (median over `reps` calls of each block, variants interleaved block by block),
    `agree` = the share of rows whose argmax equals the fp32 full head's, and for a pruned head `outside` = the
    share of rows whose fp32 full argmax is not in it (a draft the pruned head can never propose) and `certified`
    = the share of rows where the pruned maximum provably beats every row left out (max logit >= |h| times the
    largest norm of an excluded row, by Cauchy-Schwarz): there the pruned argmax is the full one without computing
    the rest, so a pruned head with a full fallback elsewhere stays exact at that share."""
    def chunked(f, h):                             # [N, V] logits at once would be N * 196 KiB
        return torch.cat([f(h[i: i + 256]) for i in range(0, len(h), 256)])

    full = chunked(lambda h: (h @ w32.T).argmax(-1), hidden)                             # [N]
    norms = w32.norm(dim=-1)                                                             # [V]
    variants = {"fp32 full head": (w32, None), "bf16 full head": (w32.bfloat16(), None)}
    if counts is not None:
        for n in sizes:
            keep = torch.sort(-counts, stable=True).indices[:n].sort().values            # [n] most frequent
            variants[f"fp32 top-{n} head"] = (w32[keep].contiguous(), keep)
            variants[f"bf16 top-{n} head"] = (w32[keep].bfloat16().contiguous(), keep)

    def pick(w, keep, h):
        best = F.linear(h.to(w.dtype), w).argmax(-1)                                     # [k]
        return best if keep is None else keep[best]

    times = {name: [] for name in variants}
    for h in blocks:
        for name, (w, keep) in variants.items():
            times[name].append(median_ms(lambda w=w, keep=keep, h=h: pick(w, keep, h), reps))
    out = []
    for name, (w, keep) in variants.items():
        row = {"variant": name, "rows": w.shape[0],
               "ms_per_call": statistics.median(times[name]) if times[name] else None,
               "agree": (chunked(lambda h, w=w, keep=keep: pick(w, keep, h), hidden) == full).float().mean().item()}
        if keep is not None:
            inside = torch.zeros(w32.shape[0], dtype=torch.bool)
            inside[keep] = True
            row["outside"] = (~inside[full]).float().mean().item()
            best = chunked(lambda h: (h @ w32[keep].T).max(-1).values, hidden)            # [N] fp32 pruned max
            bound = hidden.norm(dim=-1) * norms[~inside].max()                           # [N] |h| max |w_j|, j out
            row["certified"] = (best >= bound).float().mean().item()
        out.append(row)
    return out
