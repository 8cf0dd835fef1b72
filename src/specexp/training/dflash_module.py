"""Lightning module that trains a DFlash drafter on anchored blocks (training/anchors.py).

The target's embedding and lm_head are shared and frozen; they are held outside the module's state (training/base.py:
not saved in Lightning checkpoints, not given to the optimizer, not wrapped by DDP / FSDP).
Target taps come from the batch (feature cache) or from the frozen target inside the step (online).
Recipe (paper + SpecForge): AdamW (wd 0), lr 6e-4, linear warm-up over 4 % of the steps then cosine to 0,
gradient clipping 1.0 (Trainer), loss = sum(w * CE) / (sum(w) + 1e-6).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import checkpoints as ckpt
from ..config import TrainConfig
from ..drafters.dflash import (
    DecoderLayer,
    DFlashConfig,
    DFlashDraftModel,
    build_target_layer_ids,
    check_fits,
)
from ..drafters.layers import init_weights
from .anchors import (
    build_blocks,
    default_gamma,
    dense_mask,
    flex_mask,
    leading_correct,
    sample_anchors,
)
from .base import LitModule
from .data import step_taps
from .losses import chunked_ce
from .optim import step_generator
from .pipeline import TrainPlan


class DFlashLitModule(LitModule):
    shown = ("tau_sim",)

    def __init__(self, model: DFlashDraftModel, target, *, num_anchors: int, gamma: float, lr: float,
                 warmup_ratio: float, weight_decay: float, attention: str, seed: int):
        super().__init__(target, lr=lr, warmup_ratio=warmup_ratio, weight_decay=weight_decay)
        self.model = model
        self.num_anchors, self.gamma, self.attention, self.seed = num_anchors, gamma, attention, seed

    def blocks_loss(self, ids, loss_mask, taps, step: int):
        """Loss and metrics for one sequence: ids/loss_mask `[S]`, taps `[S, n*H]`."""
        c, dev = self.model.config, ids.device
        g = step_generator(self.seed, step)
        anchors = sample_anchors(loss_mask.cpu(), self.num_anchors, g).to(dev)                 # [n]
        if anchors.numel() == 0:
            return None, {}
        blk = build_blocks(ids, loss_mask, anchors, c.block_size, c.mask_token_id, self.gamma)
        s = ids.numel()
        use_flex = self.attention == "flex" or (self.attention == "auto" and dev.type == "cuda")
        mask = flex_mask(anchors, s, c.block_size) if use_flex else dense_mask(anchors, s, c.block_size)
        # the context stream, not per-layer K/V: each layer takes its K/V inside its own call (an FSDP unit)
        context = self.model.context_stream(taps[None].to(self.model.fc.weight.dtype),
                                            torch.arange(s, device=dev)[None])
        x = self.target.embed_tokens(blk.noise_ids)[None]                                      # [1, Q, H]
        h = self.model(x, blk.positions[None], mask=mask, context=context)[0]                  # [Q, H]
        sel = blk.weights > 0                                                                  # [Q]
        ce, pred, _ = chunked_ce(self.target.lm_head, [h[sel]], blk.labels[sel])              # [M] each
        w = blk.weights[sel]
        loss = (ce * w).sum() / (w.sum() + 1e-6)
        with torch.no_grad():
            correct = torch.zeros_like(sel)
            correct[sel] = pred == blk.labels[sel]
            k = torch.arange(c.block_size, device=dev).repeat(anchors.numel())                  # [Q]
            acc = {f"acc_k{j}": correct[sel & (k == j)].float().mean() for j in range(1, c.block_size)
                   if (sel & (k == j)).any()}
            tau = leading_correct(correct, sel, c.block_size).float().mean()
        return loss, {"tau_sim": tau, "blocks": float(anchors.numel()), **acc}

    def step_loss(self, batch):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        taps = step_taps(batch, self.target, self.model.config.target_layer_ids, self.device)
        return self.blocks_loss(ids, lm, taps, self.global_step)


# ------------------------------------------------------------------------------------------------ the plan
# fsdp: how the same updates are laid out in memory (sharding, the checkpoint format), not what they are
RESULT_FREE_TRAIN_KEYS = ("export_dir", "export_dtype", "eval_after", "log_every", "ckpt_every", "fsdp")


def train_recipe(train) -> dict:
    """The `train` keys that change the trained weights (the stage hash); export, logging and eval do not.
    `num_nodes` counts at any value but 1 (it multiplies the ranks) and `data_tokens` at any value but null, so
    stages named before they existed keep their names."""
    recipe = {k: v for k, v in TrainConfig.of(train).to_dict().items() if k not in RESULT_FREE_TRAIN_KEYS}
    if recipe.get("num_nodes") == 1:
        del recipe["num_nodes"]
    if recipe.get("data_tokens", 0) is None:
        del recipe["data_tokens"]
    return recipe


def drafter_config(drafter, target) -> tuple[DFlashConfig, Path | None]:
    """The DFlash architecture to train: a checkpoint's (fine-tuning it) or a new one sized to the target."""
    if ckpt.resolve_init(drafter.init, drafter.checkpoint) == "checkpoint":
        where = f"drafter.checkpoint={str(drafter.checkpoint)!r}"
        path = ckpt.resolve(str(drafter.checkpoint), drafter.revision)
        config = DFlashConfig.from_dict(ckpt.read_config(path, where))    # the weights load when training runs
        check_fits(config, target, where)
        return config, path
    ids = list(drafter.target_layer_ids) if drafter.target_layer_ids else \
        build_target_layer_ids(target.num_layers, drafter.num_layers)
    return DFlashConfig.for_target(target, drafter.num_layers, drafter.block_size, ids), None


def init_from_target(model: DFlashDraftModel, target) -> int:
    """Copy the target's top decoder layers into the draft layers (same parameter names, same shapes)."""
    tl = target.model.model.layers
    copied = 0
    for i, layer in enumerate(model.layers):
        src = dict(tl[len(tl) - len(model.layers) + i].named_parameters())
        for name, p in layer.named_parameters():
            if name in src and src[name].shape == p.shape:
                p.data.copy_(src[name].data.to(p.dtype))
                copied += 1
    model.norm.weight.data.copy_(target.model.model.norm.weight.data.to(model.norm.weight.dtype))
    return copied


def backbone_plan(ctx, kind: str, title: str, make_module, extra: dict | None = None):
    """The DFlash-architecture plan shared by DFlash and DEdit: `make_module(model, **common)` is their
    LightningModule; `extra` joins the stage hash and the card (e.g. DEdit's editing recipe)."""
    tc, target = ctx.train, ctx.target
    config, init_path = drafter_config(ctx.drafter, target)
    gamma = tc.gamma if tc.gamma is not None else default_gamma(config.block_size)
    common = dict(num_anchors=tc.num_anchors, gamma=gamma, lr=tc.lr, warmup_ratio=tc.warmup_ratio,
                  weight_decay=tc.weight_decay, attention=tc.attention, seed=tc.seed)

    def module():
        if init_path is not None:
            model = DFlashDraftModel.from_pretrained(init_path, dtype=torch.float32)
        else:
            model = init_weights(DFlashDraftModel(config), tc.seed)
            if tc.init_from_target:
                init_from_target(model, target)
        return make_module(model.float(), target, **common)

    def save(module, out: Path):
        module.model.save_pretrained(out, dtype=getattr(torch, tc.export_dtype))     # bf16, as released drafters

    c = config
    arch = (f"{c.num_hidden_layers} layer(s), block {c.block_size}, taps {list(c.target_layer_ids)}, "
            f"mask id {c.mask_token_id}")
    facts = {"drafter": arch, "gamma": gamma, "init": str(init_path or "random"), **(extra or {})}
    return TrainPlan(
        kind=kind, title=title, facts=facts, dataset=ctx.dataset(list(config.target_layer_ids)), module=module,
        save=save, payload={"drafter": config.to_dict(), "init": str(init_path), "train": train_recipe(tc),
                            "features": ctx.data.features, **(extra or {})},
        eval_overrides=lambda path: {"init": "checkpoint", "checkpoint": path},
        fsdp_wrap=(DecoderLayer,))                    # train.strategy=fsdp: one FSDP unit per draft layer


def plan(ctx):
    """`task=train drafter=dflash`: a DFlash drafter on anchored blocks (the paper / SpecForge recipe)."""
    return backbone_plan(ctx, "dflash", "DFlash drafter", DFlashLitModule)
