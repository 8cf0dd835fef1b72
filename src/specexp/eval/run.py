"""The skeleton every runner of prompts shares (task=eval, task=replay, the α/β grid; task=merge its start and
finish, the API its build), written once:

  select   the typed config (`auto` resolved for this device), the shard, the selected samples: no model yet, so
           a runner's own checks of its input come next, before anything is built or claimed;
  build    the target, the drafter, its per-round metrics and the engine's settings;
  start    a claimed run directory's config.yaml and run_info.json (`logger`: its logger);
  finish   the records of the selected samples summarised and published (`publish`: summary.json, summary.md, the
           logger's summary and artifact; task=merge publishes its merged summary the same way), and the table for
           the console.

What a runner does between start and finish (decode, replay, a grid of cells) is its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .. import benchmarks, registry
from ..config import Config, checked, resolve_auto
from ..decoding.settings import DecodeConfig, decode_config
from ..files import write_json, write_text_atomic
from ..machine import resolve_device
from ..report.tables import summary_markdown
from ..rundir import CONFIG, RUN_INFO, SAMPLES, SUMMARY, SUMMARY_MD
from ..tracking import make_logger
from . import shards
from .summary import summarize


@dataclass
class Selection:
    typed: Config                  # the checked config, target.dtype and eval.max_drafts resolved for `device`
    device: torch.device
    shard: shards.Shard | None
    selected: list                 # every selected sample (the unsharded run's)
    samples: list                  # this shard's share of them (all of them when unsharded)

    @property
    def wanted(self) -> set[tuple[str, str]]:
        return {(s.benchmark, s.id) for s in self.samples}


@dataclass
class Models(registry.Models):
    dc: DecodeConfig = None        # the engine's settings


def select(cfg, typed: Config | None = None) -> Selection:
    """The run's typed config and samples, from `cfg` (and `typed` as `validate` returned it, when given)."""
    device = resolve_device(cfg.device)
    typed = resolve_auto(checked(cfg, typed), device)
    shard = shards.parse(typed.eval.shard)
    selected = benchmarks.from_config(typed.benchmark, typed.eval)
    return Selection(typed, device, shard, selected, shards.select(selected, shard))


def build(cfg, sel: Selection, draft_vocab: tuple[int, str] | None = None) -> Models:
    """The target and drafter of `cfg` on the selection's device, and the engine's settings."""
    m = registry.build_models(sel.typed, cfg.drafter, sel.device, draft_vocab)
    return Models(m.target, m.drafter, m.round_metrics, decode_config(sel.typed.decoding, sel.typed.eval, m.target))


def start(cfg, out_dir: Path, info: dict) -> None:
    """A claimed run directory's config.yaml and run_info.json (`info`: tracking.run_info and the run's own)."""
    write_text_atomic(out_dir / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))
    write_json(out_dir / RUN_INFO, info)


def logger(typed: Config, cfg, out_dir: Path, name: str, job_type: str | None = None):
    """The run's logger (`typed.logger`; W&B holds one run at a time, so the α/β grid opens a cell's as it
    finishes), recording `cfg` as the run's config (a grid cell's, a merge's shards')."""
    return make_logger(typed.logger, out_dir, OmegaConf.to_container(cfg, resolve=True), name=name, job_type=job_type)


def finish(cfg, out_dir: Path, records: list[dict], sel: Selection, m: Models, logger, kind: str,
           **summary_kw) -> tuple[dict, str]:
    """summary.json and summary.md of the selected samples' records (`summary_kw`: `summarize`'s mode, timed and
    batch_size), the logger's summary, artifact and end; returns (summary, its table)."""
    summary = summarize([r for r in records if (r["benchmark"], r["id"]) in sel.wanted], list(cfg.benchmark.names),
                        m.target, m.drafter, m.dc, m.round_metrics, **summary_kw)
    return summary, publish(out_dir, summary, logger, kind)


def publish(out_dir: Path, summary: dict, logger, kind: str) -> str:
    """summary.json and summary.md of a finished run (or merge), its summary and artifact handed to `logger`, which
    then ends; returns the table for the console."""
    md = summary_markdown(summary)
    write_json(out_dir / SUMMARY, summary)
    write_text_atomic(out_dir / SUMMARY_MD, md)
    logger.summary(summary)
    logger.artifact(kind, [out_dir / SUMMARY, out_dir / SAMPLES])
    logger.finish()
    return md
