"""Domino-FT training: the Domino head on a frozen DFlash backbone, with target hidden states (online or from
the feature cache) and the DFlash block layout (training/anchors.py). See docs/methods.md, Domino-FT.

Teacher forcing: the GRU reads the ground-truth block tokens [x_a, x_{a+1}, ...] from a zero state. Rows:
- unshifted: row k predicts x_{a+k}; rows k >= 2 are corrected with the state after x_a..x_{a+k-1};
  weights exp(-(k-1)/gamma) on rows k >= 1.
- shifted: row k predicts x_{a+k+1}; rows k >= 1 corrected with the state after x_a..x_{a+k};
  weights exp(-k/gamma) on rows k >= 0.
Loss = (1 - lam) * CE(corrected) + lam * CE(base), each normalised by the weight sum, with
lam(step) = clamp(lam_start * (1 - step / (decay_ratio * total)), 0, 1). With the backbone frozen (Domino-FT)
CE(base) carries no gradient and lam only rescales the loss; it is kept for the full-Domino recipe.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import checkpoints as ckpt
from ..drafters import domino
from ..drafters.dflash import DFlashDraftModel
from ..errors import check
from .anchors import dense_mask, flex_mask, sample_anchors
from .base import LitModule
from .data import step_taps
from .losses import chunked_ce
from .optim import step_generator
from .pipeline import TrainPlan


def lambda_at(step: int, total: int, start: float, decay_ratio: float) -> float:
    if decay_ratio <= 0:
        return min(1.0, max(0.0, start))
    return min(1.0, max(0.0, start * (1 - step / (decay_ratio * max(total, 1)))))


class DominoLitModule(LitModule):
    def __init__(self, head, backbone, target, *, num_anchors: int, gamma: float, lambda_start: float,
                 lambda_decay_ratio: float, lr: float, warmup_ratio: float, weight_decay: float, attention: str,
                 seed: int):
        super().__init__(target, lr=lr, warmup_ratio=warmup_ratio, weight_decay=weight_decay)
        self.head = head
        self._backbone = (backbone.requires_grad_(False).eval(),)     # frozen, like the target: not a submodule
        self.num_anchors, self.gamma = num_anchors, gamma
        self.lambda_start, self.lambda_decay_ratio = lambda_start, lambda_decay_ratio
        self.attention, self.seed = attention, seed

    def rows(self, ids, loss_mask, taps, step: int):
        """Per block: backbone hidden `[n, B, H]`, GRU states `[n, B, G]`, labels and weights `[n, B]`, and the
        bool `[n, B]` of corrected rows."""
        backbone, t = self._backbone[0], self.target
        c, dev, s = backbone.config, ids.device, ids.numel()
        b, shifted = c.block_size, self.head.config.alignment == "shifted"
        g = step_generator(self.seed, step)
        anchors = sample_anchors(loss_mask.cpu(), self.num_anchors, g).to(dev)                    # [n]
        if anchors.numel() == 0:
            return None
        k = torch.arange(b, device=dev)
        pos = anchors[:, None] + k                                                                 # [n, B]
        noise = torch.full_like(pos, c.mask_token_id)
        noise[:, 0] = ids[anchors]
        use_flex = self.attention == "flex" or (self.attention == "auto" and dev.type == "cuda")
        mask = flex_mask(anchors, s, b) if use_flex else dense_mask(anchors, s, b)
        with torch.no_grad():
            ctx = backbone.context_kv(taps[None].to(backbone.fc.weight.dtype), torch.arange(s, device=dev)[None])
            hidden = backbone(t.embed_tokens(noise.flatten())[None], pos.flatten()[None], ctx, mask)[0]
        hidden = hidden.view(-1, b, hidden.shape[-1])                                              # [n, B, H]
        # GRU over [x_a, x_{a+1}, ..., x_{a+B-1}] (clamped at the end; those rows get weight 0)
        toks = ids[pos.clamp(max=s - 1)]                                                          # [n, B]
        states = self.head.states(t.embed_tokens(toks))                                          # [n, B, G]
        off = 1 if shifted else 0
        tgt_pos = pos + off                                                                        # row k -> a+k(+1)
        inside = tgt_pos < s
        labels = ids[tgt_pos.clamp(max=s - 1)]
        first = 0 if shifted else 1
        w = torch.exp(-(k - first).clamp(min=0).float() / self.gamma) * (k >= first)               # [B]
        w = w * inside * loss_mask[tgt_pos.clamp(max=s - 1)]                                      # [n, B]
        corrected = (k >= first + 1)[None].expand_as(w)                                           # [n, B]
        # State for row k: after x_a..x_{a+k-1} (unshifted) / x_a..x_{a+k} (shifted) = states[:, k-1+off]
        idx = (k - 1 + off).clamp(min=0, max=b - 1)
        return hidden, states[:, idx], labels, w, corrected

    def domino_loss(self, ids, loss_mask, taps, step: int, total: int):
        out = self.rows(ids, loss_mask, taps, step)
        if out is None:
            return None, {}
        hidden, states, labels, w, corrected = out
        t = self.target
        sel = w > 0
        if not sel.any():
            return None, {}

        def final(h, s, c):                      # [m, V]: base logits + the head's correction (first row: base)
            return t.lm_head(h).float() + self.head.correction(h, s).float() * c[:, None]

        rows, y, ws = [hidden[sel], states[sel], corrected[sel]], labels[sel], w[sel]
        ce_f, pred_f, _ = chunked_ce(final, rows, y)                                               # [M] each
        ce_b, pred_b, _ = chunked_ce(t.lm_head, rows[:1], y)                                       # [M] each
        ce_final = (ce_f * ws).sum() / ws.sum()
        ce_base = (ce_b * ws).sum() / ws.sum()
        lam = lambda_at(step, total, self.lambda_start, self.lambda_decay_ratio)
        loss = (1 - lam) * ce_final + lam * ce_base
        with torch.no_grad():
            acc_final = (pred_f == y).float().mean()
            acc_base = (pred_b == y).float().mean()
        return loss, {"ce_final": ce_final.detach(), "ce_base": ce_base.detach(), "lambda": lam,
                      "acc_final": acc_final, "acc_base": acc_base}

    def step_loss(self, batch):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        taps = step_taps(batch, self.target, self._backbone[0].config.target_layer_ids, self.device)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        return self.domino_loss(ids, lm, taps, self.global_step, total)


def plan(ctx) -> TrainPlan:
    """`task=train drafter=domino_ft`: the Domino head on the frozen DFlash drafter `drafter.checkpoint`, with
    target taps (online or from the feature cache)."""
    d, tc, target = ctx.drafter, ctx.train, ctx.target
    ht = d.head.train
    check(bool(d.checkpoint), "task=train drafter=domino_ft trains on a frozen DFlash drafter: set "
                                     "drafter.checkpoint=DIR (a DFlash-format checkpoint)")
    bpath = ckpt.resolve(str(d.checkpoint), d.revision)
    backbone = DFlashDraftModel.from_pretrained(bpath, dtype=target.dtype, device=target.device)
    c = domino.DominoConfig(target.hidden_size, target.vocab_size, d.head.gru_hidden, d.head.emb_dim, d.head.alignment)
    recipe = {**ht.to_dict(),
              **{k: getattr(tc, k) for k in ("lr", "warmup_ratio", "weight_decay", "max_steps", "accumulate", "seed")}}

    def module():
        with torch.random.fork_rng():
            torch.manual_seed(tc.seed)
            head = domino.DominoHead(c)
        return DominoLitModule(head.float(), backbone, target, num_anchors=ht.num_anchors, gamma=ht.gamma,
                               lambda_start=ht.lambda_start, lambda_decay_ratio=ht.lambda_decay_ratio, lr=tc.lr,
                               warmup_ratio=tc.warmup_ratio, weight_decay=tc.weight_decay, attention=tc.attention,
                               seed=tc.seed)

    def save(module, out: Path):
        domino.save_head(module.head, out, dtype=getattr(torch, tc.export_dtype))

    return TrainPlan(
        kind="domino_ft", title="Domino-FT head", dataset=ctx.dataset(list(backbone.config.target_layer_ids)),
        module=module, save=save, epochs=ht.epochs,
        payload={"backbone": str(bpath), "head": c.to_dict(), "recipe": recipe, "features": ctx.data.features},
        facts={"head": {k: v for k, v in c.to_dict().items() if k != "architecture"}, "backbone": str(bpath),
               "recipe": recipe},
        eval_overrides=lambda path: {"head": {"init": "checkpoint", "checkpoint": path}})
