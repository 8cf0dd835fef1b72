"""Explicit name -> builder tables. A config names an entry (`target.loader: hub`, `drafter.name: dflash`);
an unknown name is one clear error listing the valid ones.

A drafter is one module + one YAML (`conf/drafter/<name>.yaml`) + one `register_drafter` call. Its entry
carries everything the rest of the code needs to know about it:
  build        (drafter config, target) -> a `Drafter` (drafters/base.py); None = the AR baseline
  train        "module:function" returning its `TrainPlan` (training/pipeline.py); None = nothing to train.
               A string, so that evaluation never imports Lightning.
  metrics      per-round diagnostics it reports through `Proposal.info` (eval aggregates them blindly)
  checkpoints  target name -> {drafter key: value}: the default checkpoints it uses for that target
  tokens_only  (drafter config) -> True when its training reads tokens alone (the DeLS local heads): the target
               is then loaded without its decoder layers (targets/hf.py, `lean`)
  settings     its keys: a `schema.Settings` dataclass (types, defaults, the rules of valid values), which
               config.validate checks `drafter.*` against; the YAML file holds its presets. A plugin without one
               gets no key checks.
  conf_dir     a directory holding `drafter/<name>.yaml`, for drafters that live outside this package

Plugins: `SPECEXP_PLUGINS=pkg.module[,other]` names modules imported before the config is composed; each
registers its drafters (and their `conf_dir`), and they appear among the CLI's choices like built-in ones.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch
from omegaconf import OmegaConf

from .drafters import dedit, dels, dflash, domino, eagle3
from .errors import UserError, check, one_of
from .log import get as get_logger
from .schema import Settings, frozen
from .targets import cpu_linear
from .targets import hf as targets
from .targets.settings import TargetSettings

LOG = get_logger(__name__)

TARGETS = {
    "tiny_qwen3": targets.load_tiny_qwen3,
    "hub": targets.load_hub,
    "smollm2": targets.load_smollm2,
    "local": targets.load_local,
}


class RoundMetrics(Protocol):
    """What a drafter reports per verification round (`Proposal.info`), turned into numbers.

    `turn(rounds, greedy)` -> extra fields of a turn's record (JSON-able); each round is the proposal's `info`
    plus `tokens` (the drafts), `accepted` and `bonus`. `benchmark(records)` -> extra fields of a benchmark's
    summary (or None when the records carry none)."""

    def turn(self, rounds: list[dict], greedy: bool) -> dict: ...

    def benchmark(self, records: list[dict]) -> dict | None: ...


@dataclass(frozen=True)
class DrafterEntry:
    name: str
    build: Callable | None
    train: str | None = None
    metrics: RoundMetrics | None = None
    checkpoints: dict[str, dict[str, str]] = field(default_factory=dict)
    conf_dir: Path | None = None
    summary: str = ""
    tokens_only: Callable[[object], bool] | None = None
    settings: type[Settings] | None = None


@frozen
class ARSettings(Settings):
    """`drafter=none`: the autoregressive baseline has no keys but its name."""
    name: str = "none"


DRAFTERS: dict[str, DrafterEntry] = {}


def register_drafter(entry: DrafterEntry) -> DrafterEntry:
    """Add a drafter (a plugin's or a built-in one). Re-registering a name replaces it (module reloads)."""
    check(entry.name.isidentifier(), f"drafter name {entry.name!r} must be an identifier")
    DRAFTERS[entry.name] = entry
    return entry


MINI = "checkpoints/mini/smollm2_135m"
DFLASH_CHECKPOINTS = {
    "qwen3_4b": {"checkpoint": "z-lab/Qwen3-4B-DFlash-b16"},
    "qwen3_8b": {"checkpoint": "z-lab/Qwen3-8B-DFlash-b16"},
    "smollm2_135m": {"checkpoint": f"{MINI}-dflash-b8"},
}


DELS_RELEASE = "dt3t/DeLS-Spec-Weights"         # the DeLS-Spec authors' heads + priors, one subfolder per target


def _with(table: dict, target: str, **keys) -> dict:
    return {**table, target: {**table.get(target, {}), **keys}}


# dels_rnn on Qwen3: the authors' released heads and priors (dels.load_release), unpinned: no revision of
# dt3t/DeLS-Spec-Weights could be read from this project's machines (no hub access); pin with head.revision=COMMIT
DELS_RNN_CHECKPOINTS = {t: {**DFLASH_CHECKPOINTS[t], "head.checkpoint": head} for t, head in (
    ("smollm2_135m", f"{MINI}-dels-rnn"), ("qwen3_4b", f"{DELS_RELEASE}/qwen3-4b"),
    ("qwen3_8b", f"{DELS_RELEASE}/qwen3-8b"))}


def _head_part(d) -> bool:
    """DeLS training of the head itself (not of the fusion weights, which run the backbone on target features)."""
    return d.head.train.part == "head"


for _e in (
    DrafterEntry("none", None, summary="no drafter: the autoregressive baseline (τ = 1)", settings=ARSettings),
    DrafterEntry("dflash", dflash.build, train="specexp.training.dflash_module:plan", checkpoints=DFLASH_CHECKPOINTS,
                 settings=dflash.DFlashSettings,
                 summary="DFlash: a block [anchor, MASK×(B−1)] filled in one bidirectional pass"),
    DrafterEntry("dels_rnn", dels.build, train="specexp.training.dels_module:plan", checkpoints=DELS_RNN_CHECKPOINTS,
                 summary="DeLS-Spec: DFlash + GRU local head + unigram prior, fused per position",
                 tokens_only=_head_part, settings=dels.DeLSSettings),
    DrafterEntry("dels_markov", dels.build, train="specexp.training.dels_module:plan",
                 checkpoints=_with(DFLASH_CHECKPOINTS, "smollm2_135m", **{"head.checkpoint": f"{MINI}-dels-markov"}),
                 summary="DeLS-Spec: DFlash + rank-256 bigram local head + unigram prior", tokens_only=_head_part,
                 settings=dels.DeLSSettings),
    DrafterEntry("domino_ft", domino.build, train="specexp.training.domino_module:plan",
                 checkpoints=_with(DFLASH_CHECKPOINTS, "smollm2_135m", **{"head.checkpoint": f"{MINI}-domino-ft"}),
                 summary="Domino-FT: DFlash + prefix GRU + low-rank residual head", settings=domino.DominoSettings),
    DrafterEntry("dedit", dedit.build, train="specexp.training.dedit_module:plan", metrics=dedit.METRICS,
                 checkpoints={"smollm2_135m": {"checkpoint": f"{MINI}-dedit"}},
                 summary="DEdit: DFlash-architecture unmasking + token-to-token edit passes",
                 settings=dedit.DEditSettings),
    # EAGLE-3: the committed mini drafter on SmolLM2; none for Qwen3 (the releases' files are not verified here).
    DrafterEntry("eagle3", eagle3.build, train="specexp.training.eagle3_module:plan",
                 checkpoints={"smollm2_135m": {"checkpoint": f"{MINI}-eagle3"}},
                 summary="EAGLE-3: one layer over (embedding, fused target taps), chain or dynamic-tree drafts",
                 settings=eagle3.Eagle3Settings),
):
    register_drafter(_e)


def load_plugins() -> None:
    """Import the modules named by `SPECEXP_PLUGINS` (comma-separated); each registers its drafters."""
    for name in filter(None, (m.strip() for m in os.environ.get("SPECEXP_PLUGINS", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(f"SPECEXP_PLUGINS: cannot import {name!r} ({e})") from None
        except Exception as e:          # the module's own code raised: a plugin's bug, but one line naming it
            raise UserError(f"SPECEXP_PLUGINS: importing {name!r} raised {type(e).__name__}: "
                            f"{_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "(no message)"


def config_dirs() -> list[Path]:
    """Extra config directories of registered plugins (each holds `drafter/<name>.yaml`)."""
    return sorted({e.conf_dir for e in DRAFTERS.values() if e.conf_dir is not None})


def drafter_entry(name: str) -> DrafterEntry:
    one_of("drafter", name, DRAFTERS)
    return DRAFTERS[name]


def fill_default_checkpoints(drafter_cfg, target_name: str):
    """The drafter config with its unset checkpoint keys taken from the entry's table for this target.
    Keys set by the user (not null) are kept; `drafter.init=random` still wins at build time."""
    entry = drafter_entry(drafter_cfg.name)
    defaults = entry.checkpoints.get(target_name, {})
    if not defaults:
        return drafter_cfg
    plain = drafter_cfg.to_dict() if isinstance(drafter_cfg, Settings) else OmegaConf.to_container(drafter_cfg,
                                                                                                      resolve=True)
    out = OmegaConf.create(plain)
    for key, value in defaults.items():
        if OmegaConf.select(out, key, default="<absent>") is None:
            OmegaConf.update(out, key, value, merge=False)
    return out


def build_target(cfg, device, lean: bool = False):
    """The target of `cfg` (the `target` group, or its typed view); `lean`: without its decoder layers (token-only
    training). The loaders, the packing and the engine read the one typed view built here."""
    t = TargetSettings.of(cfg)
    one_of("target.loader", t.loader, TARGETS)
    if not lean:
        target = TARGETS[t.loader](t, device)
        if cpu_linear.wanted(t.prepack, target.device, target.dtype, t.compile):
            # packed once: bf16 bit-identical, fp32 where this CPU measured it faster (targets/cpu_linear)
            n = cpu_linear.pack(target.model, cache_dir=t.cache_dir)
            LOG.debug("target %s: %d linear layers packed (%s)", target.name, n, cpu_linear.describe(target.model))
        auto = t.engine == "auto"
        if targets.resolve_engine(t.engine, target.device) == "static":
            from .targets.static import StaticTarget  # the same weights, run over a preallocated KV cache

            graphed = auto and target.device.type == "cuda"                 # auto: every step shape a CUDA graph
            try:
                target = StaticTarget.of(target, compile=t.compile or graphed, inductor=t.compile)
            except UserError as e:
                if not auto:
                    raise
                LOG.info("target.engine=auto: the HF engine (%s)", e)        # a model the static engine cannot run
        return target
    target = TARGETS[t.loader](t, device, lean=True)
    target.whole = lambda: TARGETS[t.loader](t, device)        # e.g. answers still to regenerate
    return target


def train_tokens_only(drafter_cfg) -> bool:
    """Whether `task=train` of this drafter config reads tokens alone (so the target loads lean)."""
    entry = drafter_entry(drafter_cfg.name)
    return entry.tokens_only is not None and bool(entry.tokens_only(drafter_cfg))


def drafter_view(cfg):
    """The `drafter` group as its entry's settings view (checked, frozen); the group itself for a plugin without
    settings."""
    entry = drafter_entry(cfg.name)
    return cfg if entry.settings is None else entry.settings.of(cfg)


def build_drafter(cfg, target, draft_vocab: tuple[int, str] | None = None):
    """The drafter of `cfg` for `target`; `draft_vocab`: (N, regeneration set), DFlash drafting from that set's N
    most frequent answer tokens (`eval.draft_vocab`, which decoding/settings.draft_vocab resolves). Where the target's
    linear layers are packed (`target.prepack`), the drafter's own are too (targets/cpu_linear.py: bf16
    bit-identical, fp32 by the machine's measured plan)."""
    entry = drafter_entry(cfg.name)
    view = drafter_view(fill_default_checkpoints(cfg, target.name))     # the one typed view a builder reads
    drafter = None if entry.build is None else entry.build(view, target)
    if draft_vocab is not None:
        check(isinstance(drafter, dflash.DFlashDrafter) and drafter.name == "dflash",
              f"eval.draft_vocab={draft_vocab[0]}: only drafter=dflash drafts from a restricted vocabulary")
        drafter.restrict_vocab(draft_vocab[1], target, draft_vocab[0])
    if drafter is not None and not getattr(target, "lean", False) and cpu_linear.is_packed(target.model):
        _pack_parts(drafter, target)
    return drafter


@dataclass
class Models:
    """What a run decodes with: the target, the drafter (None: the target alone) and the drafter's per-round
    metrics (its entry's `metrics`, or None)."""
    target: object
    drafter: object
    round_metrics: object


def build_models(typed, drafter_cfg, device, draft_vocab: tuple[int, str] | None = None) -> Models:
    """The target of the typed config (`auto` resolved: config.resolve_auto) and the drafter of `drafter_cfg` on
    `device`: the one way a run (eval/run.build) and the API's `Pipeline` build them."""
    target = build_target(typed.target, device)
    return Models(target, build_drafter(drafter_cfg, target, draft_vocab), drafter_entry(drafter_cfg.name).metrics)


def _pack_parts(obj, target, depth: int = 2) -> None:
    """Pack the modules a drafter holds, and those of the specexp objects it holds (a DeLS head's DFlash backbone)."""
    for part in vars(obj).values():
        if isinstance(part, torch.nn.Module):
            cpu_linear.pack(part, whole_model=False)
        elif (depth and part is not target and type(part).__module__.startswith("specexp.")
              and hasattr(part, "__dict__")):
            _pack_parts(part, target, depth - 1)


def trainer(name: str) -> Callable:
    """The drafter's `plan` function (training/pipeline.py), imported on demand."""
    entry = drafter_entry(name)
    trainable = sorted(n for n, e in DRAFTERS.items() if e.train)
    check(entry.train is not None, f"task=train: drafter={name} has nothing to train; choose one of: "
                                   f"{', '.join(trainable)}")
    module, _, fn = entry.train.partition(":")
    return getattr(importlib.import_module(module), fn)
