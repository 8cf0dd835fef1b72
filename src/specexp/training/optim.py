"""What every trainable part's training shares, whatever its layout (anchored blocks or EAGLE-3's training-time
test): the recipe's optimiser and learning-rate schedule, and the random generator of one training step."""
from __future__ import annotations

import math
import zlib

import torch

from .distributed import rank_and_world


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of one training step's draws (anchors, DEdit's mix): a function of (seed, step), which
    Lightning restores, so a resumed run draws what the uninterrupted one drew; and of the rank under DDP / FSDP,
    so ranks draw independently of each other (rank 0, and a single process, as ever)."""
    rank = rank_and_world()[0]
    key = f"{seed}/{step}" if rank == 0 else f"{seed}/{step}/rank{rank}"
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def cosine_with_warmup(step: int, total: int, warmup_ratio: float) -> float:
    """LR multiplier: linear warm-up over warmup_ratio * total steps, then cosine to 0."""
    warm = max(1, int(round(warmup_ratio * total)))
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


def adamw_cosine(params, trainer, lr: float, weight_decay: float, warmup_ratio: float) -> dict:
    """The recipe's optimizer for every trainable part: AdamW (0.9, 0.999, eps 1e-8), linear warm-up then
    cosine to 0, stepped per optimizer step; Lightning's `configure_optimizers` return value."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    total = max(1, int(trainer.estimated_stepping_batches))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_with_warmup(s, total, warmup_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
