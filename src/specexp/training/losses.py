"""Cross-entropy over the target vocabulary in chunks of rows, so the `[rows, V]` fp32 logits never exist at once.

A training step scores M rows (anchors x block positions: 7,680 for DFlash at 512 anchors x 16) against the
target's vocabulary (V = 151,936 for Qwen3): full fp32 logits are M·V·4 bytes (4.7 GB there), and autograd keeps
them, their softmax and their gradient alive together. Here each chunk of rows is an activation checkpoint: its
logits are built, reduced to per-row numbers and freed; backward rebuilds one chunk at a time. The result and its
gradient are those of the unchunked computation (same operations per row; only the grouping of rows differs).
When all rows fit in one chunk nothing is checkpointed: backward would rebuild the same `[M, V]` logits it could
have kept, so recomputing them saves no peak memory and costs a third vocabulary matmul (a mini SmolLM2 step, 672
rows x 49,152, spends most of its time there).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_ROWS = 1024        # 1024 x 151,936 fp32 logits = 0.6 GB per chunk (x ~3 with softmax and gradient)


def _rows(logits_fn, labels, *parts):
    logits = logits_fn(*parts).float()                                                   # [m, V]
    ce = F.cross_entropy(logits, labels, reduction="none")                               # [m]; labels [m] or [m, V]
    with torch.no_grad():
        conf, arg = torch.softmax(logits, -1).max(-1)                                    # [m], [m]
    return ce, arg, conf


def chunked_ce(logits_fn: Callable[..., torch.Tensor], rows: Sequence[torch.Tensor], labels: torch.Tensor,
               chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row cross-entropy of `logits_fn(*row_chunk) [m, V]` (computed in fp32) against `labels`: class ids
    `[M]` (hard labels, -log q[label]) or a distribution per row `[M, V]` (soft labels, -sum_v p[v] log q[v], the
    EAGLE-3 distillation loss; `F.cross_entropy`'s probability targets, used as given, not renormalised).

    `rows` are tensors sharing their first dimension M (hidden states, head states, per-row scalars);
    `logits_fn` maps a chunk of each to logits and may use parameters (their gradients flow, as do those of
    the row tensors). Returns `(ce [M] fp32 with grad, argmax [M], max probability [M])`; the last two carry
    no gradient. Callers weight and normalise `ce` themselves. `chunk_rows` None = `CHUNK_ROWS`.
    """
    m, chunk_rows = labels.shape[0], chunk_rows or CHUNK_ROWS
    ces, args, confs = [], [], []
    for i in range(0, m, chunk_rows):
        parts = [r[i: i + chunk_rows] for r in rows]
        y = labels[i: i + chunk_rows]
        if torch.is_grad_enabled() and m > chunk_rows:
            ce, arg, conf = checkpoint(_rows, logits_fn, y, *parts, use_reentrant=False)
        else:
            ce, arg, conf = _rows(logits_fn, y, *parts)
        ces.append(ce)
        args.append(arg)
        confs.append(conf)
    if not ces:
        empty = labels.new_zeros(0, dtype=torch.float32)
        return empty, labels.new_zeros(0, dtype=torch.long), empty
    return torch.cat(ces), torch.cat(args), torch.cat(confs)
