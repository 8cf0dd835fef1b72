"""Lightning module that trains a DFlash drafter on anchored blocks (training/anchors.py).

The target's embedding and lm_head are shared and frozen; they are held outside the module's state (not
saved in Lightning checkpoints, not given to the optimizer). Target taps come from the batch (feature cache)
or from the frozen target inside the step (online).
Recipe (paper + SpecForge): AdamW (wd 0), lr 6e-4, linear warm-up over 4 % of the steps then cosine to 0,
gradient clipping 1.0 (Trainer), loss = sum(w * CE) / (sum(w) + 1e-6).
"""
from __future__ import annotations

import zlib

import lightning as L
import torch
import torch.nn.functional as F

from ..drafters.dflash import DFlashDraftModel
from .anchors import adamw_cosine, build_blocks, dense_mask, flex_mask, leading_correct, sample_anchors


class DFlashLitModule(L.LightningModule):
    def __init__(self, model: DFlashDraftModel, target, *, num_anchors: int, gamma: float, lr: float,
                 warmup_ratio: float, weight_decay: float, attention: str, seed: int):
        super().__init__()
        self.model = model
        self._target = (target,)          # a tuple: the frozen target is not a submodule
        self.num_anchors, self.gamma, self.lr = num_anchors, gamma, lr
        self.warmup_ratio, self.weight_decay, self.attention, self.seed = warmup_ratio, weight_decay, attention, seed

    @property
    def target(self):
        return self._target[0]

    def blocks_loss(self, ids, loss_mask, taps, step: int):
        """Loss and metrics for one sequence: ids/loss_mask `[S]`, taps `[S, n*H]`."""
        c, dev = self.model.config, ids.device
        g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{step}".encode()))
        anchors = sample_anchors(loss_mask.cpu(), self.num_anchors, g).to(dev)                 # [n]
        if anchors.numel() == 0:
            return None, {}
        blk = build_blocks(ids, loss_mask, anchors, c.block_size, c.mask_token_id, self.gamma)
        s = ids.numel()
        use_flex = self.attention == "flex" or (self.attention == "auto" and dev.type == "cuda")
        mask = flex_mask(anchors, s, c.block_size) if use_flex else dense_mask(anchors, s, c.block_size)
        ctx_kv = self.model.context_kv(taps[None].to(self.model.fc.weight.dtype), torch.arange(s, device=dev)[None])
        x = self.target.embed_tokens(blk.noise_ids)[None]                                      # [1, Q, H]
        h = self.model(x, blk.positions[None], ctx_kv, mask)[0]                                # [Q, H]
        sel = blk.weights > 0                                                                  # [Q]
        logits = self.target.lm_head(h[sel])                                                   # [M, V]
        ce = F.cross_entropy(logits.float(), blk.labels[sel], reduction="none")               # [M]
        w = blk.weights[sel]
        loss = (ce * w).sum() / (w.sum() + 1e-6)
        with torch.no_grad():
            correct = torch.zeros_like(sel)
            correct[sel] = logits.argmax(-1) == blk.labels[sel]
            k = torch.arange(c.block_size, device=dev).repeat(anchors.numel())                  # [Q]
            acc = {f"acc_k{j}": correct[sel & (k == j)].float().mean() for j in range(1, c.block_size)
                   if (sel & (k == j)).any()}
            tau = leading_correct(correct, sel, c.block_size).float().mean()
        return loss, {"tau_sim": tau, "blocks": float(anchors.numel()), **acc}

    def training_step(self, batch, batch_idx):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        taps = batch.get("taps")
        if taps is None:
            _, taps = self.target.forward(ids[None], 0, self.target.new_cache(), taps=self.model.config.target_layer_ids)
            taps = taps[0].clone()                 # an inference tensor cannot be saved for backward
        loss, m = self.blocks_loss(ids, lm, taps.to(self.device), self.global_step)
        if loss is None:
            return None
        self.log("train/loss", loss, prog_bar=True, batch_size=1)
        self.log("train/tau_sim", m.pop("tau_sim"), prog_bar=True, batch_size=1)
        self.log_dict({f"train/{k}": v for k, v in m.items()}, batch_size=1)
        return loss

    def configure_optimizers(self):
        return adamw_cosine(self.model.parameters(), self.trainer, self.lr, self.weight_decay, self.warmup_ratio)
