"""Lightning module that trains an EAGLE-3 drafter (drafters/eagle3.py) with the training-time test (TTT).

Learned from SpecForge (sgl-project/SpecForge @ a6b6b023: `specforge/algorithms/eagle3/model.py`
OnlineEagle3Model.forward, `specforge/modeling/draft/llama3_eagle.py` LlamaAttention with `cache_hidden`,
`specforge/modeling/target/target_head.py` preprocess, `specforge/training/strategies/base.py` ploss_decay,
`specforge/data/preprocessing.py` process_token_dict_to_mappings), itself "modified from" EAGLE's
`eagle/traineagle3/cnets.py`. Own implementation; nothing copied.

Data and labels. A sequence gives cached target taps `[S, 3*Ht]` (low, mid, high), `ids [S]` and `loss_mask [S]`
(response tokens). EAGLE-3 trains on the *target's* predictions, in one of two ways (`drafter.labels`):
- `soft` (EAGLE-3's own loss, as EAGLE's `traineagle3` and SpecForge compute it; the default, and the paper
  recipes'): the label of a step is the target's next-token distribution at that position restricted to the draft
  vocabulary and renormalised there, p = softmax(target logits[used]); the loss is the cross-entropy
  -sum_v p[v] log q[v] against the draft's distribution q over the draft vocabulary. The target's logits come from
  the real target: its last decoder layer's output (tap L-1 = HF's last hidden state, which transformers returns
  *after* the final norm) through its lm_head, `teacher()`. That tap rides along with the three EAGLE taps (the
  dataset carries taps + [L-1], cached or online), so the distribution is computed in each training step, in row
  chunks of [rows, V] logits, and only at the positions whose next token is a response token: nothing of the
  vocabulary's size is written to disk, and a step holds [response positions, Vd] fp32 probabilities.
- `hard` (the mini recipe's named deviation, mini_eagle3, which made the committed mini checkpoint): the label is
  the data token. The mini data are the target's own greedy answers, so ids[p+1] is the argmax of the target's
  distribution after position p (up to fp rounding at near-ties): the hard label is the soft label's mode.

TTT, for every position p of the sequence at once, steps j = 0 .. ttt_length-1:
  step 0  input (fc(taps[p]), embed(ids[p+1])) at RoPE position p            -> predicts ids[p+2]
  step j  input (out_{j-1}[p], embed(ids[p+1+j])) at RoPE position p+j       -> predicts ids[p+2+j]
where out_{j-1}[p] is the layer's own (pre-norm) output of step j-1 at the same index p: the chain started at p
feeds its own hidden states back, as drafting does after the anchor (drafters/eagle3.py: the pair at position p
predicts token p+2, the drafted steps run at positions p+1, p+2, ...). Attention at step j, index p: the keys of
step 0 at positions 0..p (causal: the real-feature pairs the draft KV cache holds at inference) plus the keys of
steps 1..j at the same index p (its own chain), one softmax over both; nothing of other chains. This is
SpecForge's `cache_hidden` attention (step-0 keys under the causal mask, then one diagonal score per later step,
RoPE at position_ids + step). Token inputs past the end are padded (id 0); they only reach positions whose labels
fall past the end, which have no loss.

Loss. Step j's label at index p is the target's prediction for token p+2+j: hard, ids[p+2+j] (SpecForge: the
target and input ids shifted left by one, then by one more per step); soft, the target's distribution at position
p+1+j (SpecForge's target logits shifted the same way). Index p counts at step j where p+2+j < S, loss_mask[p+2+j]
(the label is a response token; SpecForge reads loss_mask at p+j, one position earlier: the mask here is the label
token's own) and the label is in the draft vocabulary: hard, the data token ids[p+2+j]; soft, the target's argmax
at p+1+j over the *full* vocabulary (SpecForge's position_mask = t2d[argmax target] * loss_mask: a position whose
most likely token the draft cannot produce carries no loss, even though part of its mass is inside the draft
vocabulary). The hard label mapped to its draft id (t2d) gives -log q[label], the one-hot case of the soft loss.
CE_j = the mean over step j's counted positions (both kinds alike, so a one-hot target distribution gives exactly
the hard loss). SpecForge and EAGLE instead sum the masked per-position losses and divide by every position of the
batch (B x S, prompt and padding included), i.e. n_counted / S times the mean here with batch 1: a per-sequence
rescaling that weights long responses more; the mean is kept so both label kinds share one normalisation.
loss = sum_j ttt_decay**j * CE_j with ttt_decay = 0.8 (SpecForge `ploss_decay`; the weights are not normalised, as
there). Metrics: `acc_k{j}` = share of step j's response-token positions whose draft argmax is the label's token
(hard: the data token; soft: the target's argmax, SpecForge's acc; a label outside the draft vocabulary counts as
a miss), `tau_sim` = mean over indices p with a step-0 position of 1 + the leading run of correct steps (the chain
from p drafts exactly those tokens until its first miss, so this is the chain's acceptance length at depth
ttt_length under greedy verification when the data are the target's greedy answers).

Draft vocabulary (a new drafter), EAGLE-3's construction (EAGLE `eagle/traineagle3/cnets.py`, SpecForge
`generate_vocab_mapping_file` / `process_token_dict_to_mappings`): `drafter.draft_vocab_size` null = the full target
vocabulary (d2t = 0); else count the response (loss-masked) tokens of the training sequences, keep the
draft_vocab_size most frequent, sort them ascending; d2t holds offsets (target id = draft id + d2t[draft id]) and
t2d (saved as a bool mask over the target vocabulary, as both write it) marks them. If fewer distinct tokens occur,
the lowest unused ids fill the rest (SpecForge's top-up; EAGLE's own code would produce a short vocabulary). One
named difference: a tie at the cut goes to the lower id, where both take tied tokens in the order they first occur
in their data (a Counter's insertion order), so the vocabulary here does not depend on the order of the sequences.

Init: random N(0, 0.02) linears, unit norms (drafters/dflash.py init_weights, seeded by train.seed), or a checkpoint
(drafter.init=checkpoint: fine-tuning, its vocabulary and taps). `train.init_from_target=true` copies what fits from
the target's top decoder layer: the MLP, o_proj, post_attention_layernorm, the final norm and the target lm_head's
rows of the draft vocabulary (q/k/v take the 2H-wide input in EAGLE-3 and stay random).

The token embedding is the target's, frozen and held outside the module state (as DFlash: not saved in Lightning
checkpoints, not given to the optimizer); a checkpoint with its own embed_tokens keeps it frozen. Recipe: the
`train` group (AdamW + the shared warm-up/cosine schedule, clip by the Trainer); the DFlash-only keys num_anchors,
gamma and attention are not read and not in the stage hash. Each step is deterministic (no draws).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoints as ckpt
from ..drafters.eagle3 import (
    Eagle3Config,
    Eagle3DraftModel,
    Eagle3Settings,
    MidLayer,
    check_fits,
    default_tap_layers,
    resolve_eagle3,
)
from ..drafters.layers import init_weights, rotate
from ..errors import check
from .base import LitModule
from .data import step_taps
from .dflash_module import train_recipe
from .losses import CHUNK_ROWS, chunked_ce
from .pipeline import TrainPlan

DFLASH_ONLY_TRAIN_KEYS = ("num_anchors", "gamma", "attention")
LABELS = ("hard", "soft")


# ------------------------------------------------------------------------------------------ vocabulary
def draft_vocab(seqs, vocab_size: int, draft_vocab_size: int | None) -> torch.Tensor:
    """Target ids of the draft vocabulary `[Vd]`, ascending: the `draft_vocab_size` most frequent response tokens of
    `seqs`, ties (and unused ids, after every token that occurs) by lower id (module docstring)."""
    if draft_vocab_size is None or draft_vocab_size >= vocab_size:
        return torch.arange(vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.ids[s.loss_mask.bool()].long(), minlength=vocab_size)[:vocab_size]
    order = torch.sort(-counts, stable=True).indices          # most frequent first, ties (and zeros) by lower id
    return order[:draft_vocab_size].sort().values


def d2t_of(used: torch.Tensor) -> torch.Tensor:
    return used - torch.arange(len(used))


def t2d_index(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Target id -> draft id `[V]` (-1 outside the draft vocabulary)."""
    used = torch.arange(len(d2t), device=d2t.device) + d2t
    idx = torch.full((vocab_size,), -1, dtype=torch.long, device=d2t.device)
    idx[used] = torch.arange(len(d2t), device=d2t.device)
    return idx


# ------------------------------------------------------------------------------------------ soft labels
@dataclass
class Teacher:
    """The target's next-token distributions of one sequence (soft labels), at the positions that need one.
    Position q (the target's prediction for token q+1) has one when token q+1 is a response token:
    `row [S]` = its row in `p`, else -1; `p [R, Vd]` fp32 = softmax of the target's logits over the draft
    vocabulary (columns in draft-id order); `top [S]` = the draft id of the target's argmax over the full
    vocabulary, -1 when that token is outside the draft vocabulary or q has no row."""

    p: torch.Tensor
    top: torch.Tensor
    row: torch.Tensor


@torch.no_grad()
def teacher(logits_fn, hidden: torch.Tensor, loss_mask: torch.Tensor, used: torch.Tensor, t2d: torch.Tensor,
            chunk_rows: int = CHUNK_ROWS) -> Teacher:
    """Soft labels of one sequence: `logits_fn` maps rows of `hidden [S, *]` to the target's logits `[r, V]` (the
    target's lm_head on its last hidden state; a test may pass logits and the identity). `loss_mask [S]`, `used
    [Vd]` the draft vocabulary's target ids in draft-id order, `t2d [V]` target id -> draft id or -1. Rows run in
    chunks, so only `[chunk_rows, V]` full-vocabulary logits exist at once."""
    s, dev = hidden.shape[0], hidden.device
    need = torch.zeros(s, dtype=torch.bool, device=dev)
    need[:-1] = loss_mask[1:].bool().to(dev)                    # q predicts token q+1: a response token
    pos = need.nonzero().flatten()                                                           # [R]
    row = torch.full((s,), -1, dtype=torch.long, device=dev)
    row[pos] = torch.arange(len(pos), device=dev)
    top = torch.full((s,), -1, dtype=torch.long, device=dev)
    ps = []
    for i in range(0, len(pos), chunk_rows):
        at = pos[i: i + chunk_rows]
        logits = logits_fn(hidden[at]).float()                                               # [r, V]
        top[at] = t2d[logits.argmax(-1)]                                                     # -1: outside
        ps.append(torch.softmax(logits[:, used], -1))                                        # [r, Vd]
    p = torch.cat(ps) if ps else hidden.new_zeros(0, len(used), dtype=torch.float32)
    return Teacher(p, top, row)


# ------------------------------------------------------------------------------------------ TTT forward
def _shift(ids: torch.Tensor, n: int, pad: int = 0) -> torch.Tensor:
    """ids[p + n] for every p (pad past the end)."""
    return torch.cat([ids[n:], ids.new_full((min(n, ids.numel()),), pad)])


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def ttt_forward(model: Eagle3DraftModel, embed, taps: torch.Tensor, ids: torch.Tensor, length: int) -> list:
    """The layer's outputs `[S, H]` of TTT steps 0..length-1 over one sequence (module docstring): taps `[S, 3*Ht]`,
    ids `[S]`, `embed` the (frozen) token embedding."""
    layer: MidLayer = model.midlayer
    attn = layer.self_attn
    s, dev = ids.numel(), ids.device
    nh, nkv, hd = attn.nh, attn.nkv, attn.hd
    groups, scale = nh // nkv, hd ** -0.5
    h = model.features(taps[None].to(model.fc.weight.dtype))                                # [1, S, H]
    pos = torch.arange(s, device=dev)
    causal = torch.ones(s, s, dtype=torch.bool, device=dev).tril()                          # [S, S]
    ks, vs, outs = [], [], []
    for j in range(length):
        emb = embed(_shift(ids, 1 + j))[None].to(h.dtype)                                   # [1, S, H]
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(h)], dim=-1)           # [1, S, 2H]
        cos, sin = model.rope(pos + j, x.dtype)
        q = rotate(attn.q_proj(x).view(1, s, nh, hd).transpose(1, 2), cos, sin)             # [1, Hq, S, D]
        k = rotate(attn.k_proj(x).view(1, s, nkv, hd).transpose(1, 2), cos, sin)            # [1, Hkv, S, D]
        v = attn.v_proj(x).view(1, s, nkv, hd).transpose(1, 2)
        ks.append(_expand(k, groups))
        vs.append(_expand(v, groups))
        scores = (q @ ks[0].transpose(2, 3)) * scale                                        # [1, Hq, S, S]
        scores = scores.masked_fill(~causal, float("-inf"))
        diag = [(q * ks[i]).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]         # [1, Hq, S, 1] each
        sc = torch.cat([scores, *diag], -1)                                                 # [1, Hq, S, S+j]
        w = torch.softmax(sc.to(torch.promote_types(sc.dtype, torch.float32)), -1).to(q.dtype)   # fp32 at least
        a = w[..., :s] @ vs[0]                                                              # [1, Hq, S, D]
        for i in range(1, j + 1):
            a = a + w[..., s + i - 1: s + i] * vs[i]
        h = h + attn.o_proj(a.transpose(1, 2).reshape(1, s, nh * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        outs.append(h[0])
    return outs


def ttt_labels(ids: torch.Tensor, loss_mask: torch.Tensor, j: int):
    """Step j's target-id labels ids[p+2+j] `[S]` and where they are response tokens inside the sequence."""
    s = ids.numel()
    lab = _shift(ids, 2 + j)
    inside = torch.arange(s, device=ids.device) + 2 + j < s
    return lab, inside & _shift(loss_mask.bool(), 2 + j, False)


# ------------------------------------------------------------------------------------------ the module
class Eagle3LitModule(LitModule):
    shown = ("tau_sim",)

    def __init__(self, model: Eagle3DraftModel, target, *, ttt_length: int, ttt_decay: float, lr: float,
                 warmup_ratio: float, weight_decay: float, tap_layers, labels: str = "hard"):
        check(labels in LABELS, f"drafter.labels={labels!r} is not valid; choose hard or soft")
        super().__init__(target, lr=lr, warmup_ratio=warmup_ratio, weight_decay=weight_decay)
        self.model = model
        self.ttt_length, self.ttt_decay, self.labels = ttt_length, ttt_decay, labels
        self.tap_layers = list(tap_layers)
        self.register_buffer("t2d", t2d_index(model.d2t, model.config.vocab_size), persistent=False)
        used = torch.arange(len(model.d2t), device=model.d2t.device) + model.d2t
        self.register_buffer("used", used, persistent=False)              # [Vd] target ids in draft-id order
        if model.embed_tokens is not None:
            model.embed_tokens.requires_grad_(False)

    @property
    def embed(self):
        return self.model.embed_tokens if self.model.embed_tokens is not None else self.target.embed_tokens

    @property
    def feature_layers(self) -> list[int]:
        """The taps a training step reads: the three EAGLE taps, and for soft labels the last layer (the target's
        final hidden state) after them."""
        return self.tap_layers + ([self.target.num_layers - 1] if self.labels == "soft" else [])

    def ttt_loss(self, ids, loss_mask, taps, soft: Teacher | None = None):
        """Loss and metrics for one sequence: ids/loss_mask `[S]`, taps `[S, 3*Ht]`; `soft` the target's
        distributions (soft labels) or None (hard labels: the data tokens)."""
        outs = ttt_forward(self.model, self.embed, taps, ids, self.ttt_length)
        loss, metrics, rows = None, {}, []
        s, dev = ids.numel(), ids.device
        for j, h in enumerate(outs):
            lab, resp = ttt_labels(ids, loss_mask, j)                                       # [S], [S]
            if soft is None:
                dlab = self.t2d[lab]                                                        # [S] draft ids / -1
            else:                                     # the target's prediction for token p+2+j is at p+1+j
                at = torch.arange(s, device=dev) + 1 + j
                inside = at < s
                dlab = torch.full_like(lab, -1)
                dlab[inside] = soft.top[at[inside]]                                         # argmax's draft id
            sel = resp & (dlab >= 0)
            correct = torch.zeros_like(resp)
            if sel.any():
                target = dlab[sel] if soft is None else soft.p[soft.row[at[sel]]]           # [M] or [M, Vd]
                ce, pred, _ = chunked_ce(self.model.logits, [h[sel]], target)               # [M] each
                step = self.ttt_decay ** j * ce.mean()
                loss = step if loss is None else loss + step
                correct[sel] = pred == dlab[sel]
            if resp.any():
                metrics[f"acc_k{j}"] = correct[resp].float().mean()
            rows.append(correct)
        if loss is None:
            return None, {}
        with torch.no_grad():
            _, start = ttt_labels(ids, loss_mask, 0)
            run = torch.stack(rows, 1).to(torch.int32).cumprod(1).sum(1)                    # [S] leading correct
            metrics["tau_sim"] = 1 + run[start].float().mean()
        return loss, metrics

    def step_loss(self, batch):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        feats = step_taps(batch, self.target, self.feature_layers, self.device)             # [S, (3 or 4)*Ht]
        width = 3 * self.model.config.target_hidden_size
        taps, soft = feats[:, :width], None
        if self.labels == "soft":                     # the last tap, post-norm: the target's lm_head gives its logits
            head = self.target.lm_head
            soft = teacher(lambda x: head(x.to(head.weight.dtype)), feats[:, width:], lm, self.used, self.t2d)
        return self.ttt_loss(ids, lm, taps, soft)


# ------------------------------------------------------------------------------------------------ the plan
def init_from_target(model: Eagle3DraftModel, target) -> list[str]:
    """Copy the target's top layer's MLP, o_proj and post-attention norm, its final norm and its lm_head rows of
    the draft vocabulary into `model` where the shapes fit; returns the copied parameter names."""
    top, copied = target.model.model.layers[-1], []
    src = dict(top.named_parameters())
    with torch.no_grad():
        for name, p in model.midlayer.named_parameters():
            if (name.startswith(("mlp.", "self_attn.o_proj.", "post_attention_layernorm."))
                    and name in src and src[name].shape == p.shape):
                p.copy_(src[name].to(p.dtype))
                copied.append(f"midlayer.{name}")
        norm = target.model.model.norm.weight
        if norm.shape == model.norm.weight.shape:
            model.norm.weight.copy_(norm.to(model.norm.weight.dtype))
            copied.append("norm.weight")
        head = target.lm_head.weight
        if head.shape[1] == model.lm_head.weight.shape[1]:
            used = (torch.arange(len(model.d2t)) + model.d2t).to(head.device)
            model.lm_head.weight.copy_(head[used].to(model.lm_head.weight.dtype))
            copied.append("lm_head.weight")
    return copied


def ttt_recipe(drafter) -> dict:
    """The TTT settings the module takes and the stage hash records. `labels` enters only when soft, so a hard-label
    recipe hashes as it did before the option existed (the committed mini checkpoint's stage stays reusable)."""
    d = Eagle3Settings.of(drafter)                     # ttt_length >= 1, ttt_decay > 0, labels: its rules
    length, decay, labels = d.ttt_length, d.ttt_decay, d.labels
    return {"ttt_length": int(length), "ttt_decay": float(decay), **({"labels": "soft"} if labels == "soft" else {})}


def plan(ctx):
    """`task=train drafter=eagle3`: an EAGLE-3 drafter with the training-time test (module docstring)."""
    tc, target, dc = ctx.train, ctx.target, ctx.drafter
    ttt = ttt_recipe(dc)
    init_path = None
    if ckpt.resolve_init(dc.init, dc.checkpoint) == "checkpoint":
        where = f"drafter.checkpoint={str(dc.checkpoint)!r}"
        init_path = resolve_eagle3(str(dc.checkpoint), dc.revision)
        loaded = Eagle3DraftModel.from_pretrained(init_path, where)
        config = loaded.config
        check(not tc.init_from_target, "train.init_from_target=true with an EAGLE-3 checkpoint to fine-tune: the "
                                       "checkpoint's weights would be overwritten; set one of them")
        used = None
    else:
        where = "drafter"
        used = draft_vocab(ctx.seqs, target.vocab_size, dc.draft_vocab_size)
        config = Eagle3Config.for_target(target, len(used), dc.tap_layers)
        with torch.device("meta"):
            loaded = Eagle3DraftModel(config)
    taps = list(dc.tap_layers or config.tap_layers or default_tap_layers(target.num_layers))
    check_fits(loaded, target, taps, where)
    del loaded
    config.tap_layers = taps
    coverage = None
    if used is not None:
        resp = torch.cat([s.ids[s.loss_mask.bool()] for s in ctx.seqs])
        inside = torch.zeros(target.vocab_size, dtype=torch.bool)
        inside[used] = True
        coverage = float(inside[resp].float().mean()) if resp.numel() else 0.0
    def module():
        if init_path is not None:
            model = Eagle3DraftModel.from_pretrained(init_path).float()
            model.config.tap_layers = taps
        else:
            model = init_weights(Eagle3DraftModel(config), tc.seed)
            model.d2t.copy_(d2t_of(used))
            if tc.init_from_target:
                init_from_target(model, target)
        return Eagle3LitModule(model, target, lr=tc.lr, warmup_ratio=tc.warmup_ratio, weight_decay=tc.weight_decay,
                               tap_layers=taps, **ttt)

    def save(module, out: Path):
        module.model.save_pretrained(out, dtype=getattr(torch, tc.export_dtype))     # bf16, as released drafters

    c = config
    arch = (f"1 layer (hidden {c.hidden_size}, {c.num_attention_heads} heads), taps {taps}, draft vocabulary "
            f"{c.draft_vocab_size} of {c.vocab_size}")
    vocab = ("the checkpoint's" if used is None else "the full target vocabulary" if len(used) == target.vocab_size
             else f"the {len(used)} most frequent response tokens of the training data")
    labels = ("soft: the target's distribution over the draft vocabulary (its lm_head on its last hidden state)"
              if ttt.get("labels") == "soft" else "hard: the data tokens")
    facts = {"drafter": arch, "draft_vocab": vocab, "labels": labels, "ttt_length": ttt["ttt_length"],
             "ttt_step_weights": f"{ttt['ttt_decay']}^j", "init": str(init_path or "random"),
             "init_from_target": ("the top layer's MLP, o_proj, post-attention norm, final norm, lm_head rows"
                                  if tc.init_from_target and init_path is None else False)}
    if coverage is not None:
        facts["draft_vocab_coverage"] = round(coverage, 6)      # share of response tokens inside the draft vocabulary
    recipe = {k: v for k, v in train_recipe(tc).items() if k not in DFLASH_ONLY_TRAIN_KEYS}
    features = taps + ([target.num_layers - 1] if ttt.get("labels") == "soft" else [])    # = module.feature_layers
    return TrainPlan(
        kind="eagle3", title="EAGLE-3 drafter", facts=facts, dataset=ctx.dataset(features), module=module, save=save,
        payload={"drafter": c.to_dict(), "init": str(init_path), "ttt": ttt, "train": recipe,
                 "features": ctx.data.features, "vocab": "checkpoint" if used is None else "frequency"},
        eval_overrides=lambda path: {"init": "checkpoint", "checkpoint": path},
        fsdp_wrap=())           # FSDP: the one layer stays in the root unit (ttt_forward calls its parts directly)
