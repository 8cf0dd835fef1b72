"""DeLS-Spec local heads: plain next-token prediction on the head's training data (no target hidden states,
no DFlash in the loop), and the unigram prior of the same data. See docs/methods.md, DeLS-Spec.

- rnn: anchored blocks (anchors drawn as for DFlash, among response positions a <= S - B), inputs = the
  tokens at offsets 0..B-2, targets = offsets 1..B-1, zero GRU state per block (teacher forced), loss weight
  exp(-k / gamma) for offset k = 0..B-2, masked by the targets' loss mask, normalised by the weight sum.
- markov: dense over every position (previous token -> next token), weighted by the next token's loss mask.
The target's embedding and lm_head are shared and frozen (not in the module's state, not optimised).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from .. import checkpoints as ckpt
from .. import log
from ..config import Config, TaskConfig, checked
from ..drafters import dels
from ..drafters.dflash import DFlashDraftModel
from ..errors import check, one_of
from ..files import write_json
from ..rundir import claimed_for
from .anchors import sample_anchors
from .base import LitModule
from .data import step_taps
from .dflash_module import drafter_config
from .losses import chunked_ce
from .optim import step_generator
from .pipeline import TrainPlan, context, target_fingerprint


class LocalHeadLitModule(LitModule):
    shown = ("acc",)

    def __init__(self, head, target, *, block_size: int, num_anchors: int, gamma: float, lr: float,
                 warmup_ratio: float, weight_decay: float, seed: int):
        super().__init__(target, lr=lr, warmup_ratio=warmup_ratio, weight_decay=weight_decay)
        self.head = head
        self.block_size, self.num_anchors, self.gamma, self.seed = block_size, num_anchors, gamma, seed

    def _rows(self, ids, loss_mask, step: int):
        """(inputs [N, L], targets [N, L], weights [N, L]) for one sequence `[S]`."""
        if self.head.config.kind == "markov":
            return ids[None, :-1], ids[None, 1:], loss_mask[None, 1:].float()
        b, s = self.block_size, ids.numel()
        if s < b:
            return None
        g = step_generator(self.seed, step)
        anchors = sample_anchors(loss_mask[: s - b + 2].cpu(), self.num_anchors, g).to(ids.device)   # a <= S-B
        if anchors.numel() == 0:
            return None
        pos = anchors[:, None] + torch.arange(b, device=ids.device)                    # [n, B]
        k = torch.arange(b - 1, device=ids.device)                                       # [B-1]
        w = torch.exp(-k.float() / self.gamma) * loss_mask[pos[:, 1:]]                  # [n, B-1]
        return ids[pos[:, :-1]], ids[pos[:, 1:]], w

    def head_loss(self, ids, loss_mask, step: int):
        rows = self._rows(ids, loss_mask, step)
        if rows is None or not (rows[2] > 0).any():
            return None, {}
        inp, tgt, w = rows
        hidden = self.head.hidden(self.target.embed_tokens(inp))                        # [N, L, H]
        sel = w > 0
        ce, pred, _ = chunked_ce(self.target.lm_head, [hidden[sel]], tgt[sel])         # [M] each
        loss = (ce * w[sel]).sum() / w[sel].sum()
        with torch.no_grad():
            correct = pred == tgt[sel]
            m = {"acc": correct.float().mean(), "tokens": float(sel.sum())}
            if self.head.config.kind == "rnn":
                k = torch.arange(inp.shape[1], device=ids.device).expand_as(inp)[sel]
                m.update({f"acc_k{j}": correct[k == j].float().mean() for j in range(inp.shape[1]) if (k == j).any()})
        return loss, m

    def step_loss(self, batch):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        return self.head_loss(ids, lm, self.global_step)


def count_assistant_tokens(seqs, vocab_size: int) -> torch.Tensor:
    """Unigram counts `[V]` of the loss-masked (assistant) tokens of the sequences."""
    ids = torch.cat([s.ids[s.loss_mask] for s in seqs]) if seqs else torch.empty(0, dtype=torch.long)
    return torch.bincount(ids, minlength=vocab_size)


def head_block_size(drafter, target) -> int:
    """The head's training block: `drafter.head.train.block_size`, else the DFlash backbone's."""
    if drafter.head.train.block_size:
        return int(drafter.head.train.block_size)
    return drafter_config(drafter, target)[0].block_size


PRIOR_NOTE = (f"`{dels.PRIOR_FILE}`: counts of the assistant tokens of the same training sequences and their "
              "Laplace-smoothed natural log prior over the full vocabulary")


def plan(ctx):
    """`task=train drafter=dels_rnn|dels_markov`: the local head (+ its prior) by plain next-token prediction;
    with `drafter.head.train.part=fusion_weights`, the per-position alpha/beta instead."""
    part = ctx.drafter.head.train.part
    one_of("drafter.head.train.part", part, ("head", "fusion_weights"))
    return head_plan(ctx) if part == "head" else fusion_weights_plan(ctx)


def head_plan(ctx) -> TrainPlan:
    d, tc, target = ctx.drafter, ctx.train, ctx.target
    hc = dels.head_config(d, target)
    ht = d.head.train
    block = head_block_size(d, target)
    check(block >= 2, f"drafter.head.train.block_size={block} must be at least 2")
    recipe = {**ht.to_dict(), "block_size": block,
              **{k: getattr(tc, k) for k in ("lr", "warmup_ratio", "weight_decay", "grad_clip", "max_steps",
                                             "accumulate", "precision", "seed")}}
    counts = count_assistant_tokens(ctx.seqs, target.vocab_size)

    def module():
        with torch.random.fork_rng():
            torch.manual_seed(tc.seed)
            head = dels.make_head(hc)
        return LocalHeadLitModule(head.float(), target, block_size=block, num_anchors=ht.num_anchors, gamma=ht.gamma,
                                  lr=tc.lr, warmup_ratio=tc.warmup_ratio, weight_decay=tc.weight_decay, seed=tc.seed)

    def save(module, out: Path):
        dels.save_head(module.head, out, dtype=getattr(torch, tc.export_dtype))
        dels.save_prior(counts, out, 1.0, {"data_hash": ctx.data_hash, "sequences": len(ctx.seqs)})

    return TrainPlan(
        kind=d.name, title=f"DeLS-Spec {hc.kind} local head", dataset=ctx.token_dataset(), module=module, save=save,
        epochs=ht.epochs, payload={"head": hc.to_dict(), "recipe": recipe,
                                   "target": target_fingerprint(ctx.target_cfg, target)},
        facts={"head": {k: v for k, v in hc.to_dict().items() if k != "architecture"}, "recipe": recipe,
               "prior": PRIOR_NOTE},
        eval_overrides=lambda path: {"head": {"init": "checkpoint", "checkpoint": path}})


def prior_destination(task: TaskConfig, out_dir) -> Path:
    """The directory `task=prior` writes log_prior.safetensors into: `task.out`, a directory (a head's), which may
    already hold a prior only with `task.overwrite=true`; else the run directory (a rerun there replaces its own)."""
    overwrite = task.overwrite                       # a bool: config.py checked it
    if not task.out:
        return Path(out_dir)
    dest = Path(str(task.out)).expanduser()
    check(not dest.exists() or dest.is_dir(), f"task.out={str(dest)!r} is a file; expected a directory (the prior "
                                              f"is written to DIR/{dels.PRIOR_FILE}, e.g. a head's directory)")
    check(overwrite or not (dest / dels.PRIOR_FILE).exists(),
          f"task.out={str(dest)!r} already holds {dels.PRIOR_FILE}; choose another directory, or set "
          f"task.overwrite=true to replace it")
    return dest


def run_prior(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=prior`: the unigram prior of the data config's sequences, written to `task.out` (default: the
    run directory); point it at a head's directory to put the prior beside the head."""
    typed = checked(cfg, typed)
    dest = prior_destination(typed.task, out_dir)  # before any work: a refusal costs nothing
    with claimed_for(out_dir, "prior") as d:        # the run directory: never another run's (eval/store.py)
        ctx = context(cfg, lean=True, typed=typed)  # counts tokens: no decoder layer needed
        counts = count_assistant_tokens(ctx.seqs, ctx.target.vocab_size)
        path = dels.save_prior(counts, dest, typed.task.smoothing, {"data_hash": ctx.data_hash,
                                                                  "sequences": len(ctx.seqs)})
        summary = {"prior": str(path), "tokens": int(counts.sum()), "distinct": int((counts > 0).sum()),
                   "vocab_size": ctx.target.vocab_size, "smoothing": typed.task.smoothing, "data_hash": ctx.data_hash}
        write_json(d / "prior.json", summary)
    log.LOG.info(f"{summary}")
    return summary


# ------------------------------------------------------------------------- learned per-position α / β
FUSION_WEIGHTS_FILE = dels.FUSION_WEIGHTS_FILE


class FusionWeightsLitModule(LitModule):
    """Per-position alpha_k, beta_k (k = draft 2..B-1) trained on top of a frozen DFlash backbone, frozen
    local head and prior (the paper's learned-weights variant; the runtime's `position_gates`). Blocks and
    labels as DFlash training (training/anchors.py); the head is teacher forced from a zero state on the
    ground-truth drafts x_{a+1}, ..., as at inference it starts on draft 1. Loss: the fused logits' CE with
    weights exp(-(k-1)/gamma), normalised by the weight sum. Target taps come from the feature cache
    (`data.features=cache`, as the backbone's and Domino's training) or are computed in each step."""

    def __init__(self, backbone, head, log_prior, target, *, num_anchors: int, gamma: float, alpha, beta,
                 lr: float, warmup_ratio: float, seed: int):
        super().__init__(target, lr=lr, warmup_ratio=warmup_ratio, weight_decay=0.0)
        n = backbone.config.block_size - 2
        self.alpha = torch.nn.Parameter(torch.tensor(dels.per_position("alpha", alpha, n)))        # [B-2]
        self.beta = torch.nn.Parameter(torch.tensor(dels.per_position("beta", beta, n)))           # [B-2]
        self._frozen = (backbone.requires_grad_(False), head.requires_grad_(False), log_prior)
        self.num_anchors, self.gamma, self.seed = num_anchors, gamma, seed

    def fused_loss(self, ids, loss_mask, taps, step: int):
        from .anchors import build_blocks, dense_mask

        (backbone, head, lp), t = self._frozen, self.target
        c, s, dev = backbone.config, ids.numel(), ids.device
        b = c.block_size
        low_rank = head.config.lm_head_mode == "low_rank"
        g = step_generator(self.seed, step)
        anchors = sample_anchors(loss_mask.cpu(), self.num_anchors, g).to(dev)                    # [n]
        if anchors.numel() == 0:
            return None
        blk = build_blocks(ids, loss_mask, anchors, b, c.mask_token_id, self.gamma)
        w = blk.weights.view(-1, b)[:, 2:]                                                          # [n, B-2]
        if not (w > 0).any():
            return None
        with torch.no_grad():
            ctx = backbone.context_kv(taps[None].to(backbone.fc.weight.dtype), torch.arange(s, device=dev)[None])
            h = backbone(t.embed_tokens(blk.noise_ids)[None], blk.positions[None], ctx, dense_mask(anchors, s, b))
            long = h[0].view(-1, b, h.shape[-1])[:, 2:]                                             # [n, B-2, H]
            prev = ids[(anchors[:, None] + 1 + torch.arange(b - 2, device=dev)).clamp(max=s - 1)]   # [n, B-2]
            # a released (low_rank) head has its own [V, r] output table; the others go through W_lm
            e = t.embed_tokens(prev)                                                                # [n, B-2, H]
            short = head.features(e) if low_rank else head.hidden(e)                                # [n, B-2, r|H]
        j = torch.arange(b - 2, device=dev).expand_as(w)                                            # [n, B-2]
        log_prior = lp.to(dev).float()                                                              # [V]

        out_short = head.low_rank_lm_head if low_rank else t.lm_head

        def fused(hl, hs, k):                    # [m, V]: the fused logits of rows at draft positions k + 2
            return (t.lm_head(hl).float() + self.alpha[k, None] * out_short(hs).float()
                    - self.beta[k, None] * log_prior)

        sel = w > 0
        ce, _, _ = chunked_ce(fused, [long[sel], short[sel], j[sel]], blk.labels.view(-1, b)[:, 2:][sel])
        return (ce * w[sel]).sum() / w[sel].sum()

    def step_loss(self, batch):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        taps = step_taps(batch, self.target, self._frozen[0].config.target_layer_ids, self.device)
        loss = self.fused_loss(ids, lm, taps, self.global_step)
        return loss, {**{f"alpha_k{k + 2}": a for k, a in enumerate(self.alpha.detach())},
                      **{f"beta_k{k + 2}": v for k, v in enumerate(self.beta.detach())}}


def fusion_weights_plan(ctx) -> TrainPlan:
    """Per-position alpha/beta for the configured (trained) backbone and head. The artifact is
    `fusion_weights.json`; with `train.export_dir` = the head's directory it lands beside the head, where
    `fusion=learned` reads it."""
    d, tc, target = ctx.drafter, ctx.train, ctx.target
    check(bool(d.checkpoint) and bool(d.head.checkpoint),
          "drafter.head.train.part=fusion_weights needs trained parts: drafter.checkpoint=DIR and "
          "drafter.head.checkpoint=DIR")
    where = f"drafter.head.checkpoint={str(d.head.checkpoint)!r}"
    bpath = ckpt.resolve(str(d.checkpoint), d.revision)
    hpath = dels.resolve_head(str(d.head.checkpoint), d.head.revision, where)   # a release's subfolder too
    fu = ctx.fusion.to_dict()
    ht = d.head.train
    backbone = DFlashDraftModel.from_pretrained(bpath, dtype=target.dtype, device=target.device)

    def module():
        if dels.is_release(hpath):              # the authors' head + prior (dels.load_release)
            head, lp = dels.load_release(hpath, target.hidden_size, target.vocab_size, d.prior.smoothing, where)
        else:
            head = dels.load_head(hpath, where)
            lp = dels.load_prior(hpath, target.vocab_size, d.prior.smoothing, str(hpath))
        head = head.to(target.device, target.dtype)
        return FusionWeightsLitModule(backbone, head, lp, target, num_anchors=ht.num_anchors, gamma=ht.gamma,
                                      alpha=fu["alpha"], beta=fu["beta"], lr=tc.lr, warmup_ratio=tc.warmup_ratio,
                                      seed=tc.seed)

    def save(module, out: Path):
        weights = {"alpha": [round(float(x), 6) for x in module.alpha.detach()],
                   "beta": [round(float(x), 6) for x in module.beta.detach()],
                   "init": {"alpha": fu["alpha"], "beta": fu["beta"]}, "data_hash": ctx.data_hash,
                   "command": "python -m specexp " + " ".join(sys.argv[1:])}
        write_json(out / FUSION_WEIGHTS_FILE, weights)

    return TrainPlan(
        kind="fusion", title="DeLS-Spec learned fusion weights",
        dataset=ctx.dataset(list(backbone.config.target_layer_ids)), module=module, save=save, epochs=ht.epochs,
        card=False,
        payload={"backbone": str(bpath), "head": str(hpath), "init": [fu["alpha"], fu["beta"]],
                 "anchors": ht.num_anchors, "gamma": ht.gamma, "epochs": ht.epochs, "lr": tc.lr, "seed": tc.seed,
                 "max_steps": tc.max_steps, "features": ctx.data.features},
        facts={"init": {"alpha": fu["alpha"], "beta": fu["beta"]}})
