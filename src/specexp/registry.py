"""Explicit name -> builder tables. A config names an entry (`target.loader: hub`, `drafter.name: dflash`);
an unknown name is one clear error listing the valid ones."""
from __future__ import annotations

from . import targets
from .drafters import dedit, dels, dflash, domino
from .errors import one_of

TARGETS = {
    "tiny_qwen3": targets.load_tiny_qwen3,
    "hub": targets.load_hub,
    "smollm2": targets.load_smollm2,
    "local": targets.load_local,
}

DRAFTERS = {
    "none": None,          # the autoregressive baseline
    "dflash": dflash.build,
    "dels_rnn": dels.build,      # DeLS-Spec: DFlash + GRU local head + unigram prior
    "dels_markov": dels.build,   # DeLS-Spec: DFlash + rank-256 bigram head + unigram prior
    "domino_ft": domino.build,   # Domino-FT: DFlash + prefix GRU + low-rank residual head
    "dedit": dedit.build,        # DEdit: DFlash-architecture unmasking + token-to-token edit passes
}


def build_target(cfg, device):
    one_of("target.loader", cfg.loader, TARGETS)
    return TARGETS[cfg.loader](cfg, device)


def build_drafter(cfg, target):
    one_of("drafter.name", cfg.name, DRAFTERS)
    builder = DRAFTERS[cfg.name]
    return None if builder is None else builder(cfg, target)
