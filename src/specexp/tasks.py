"""Run one task of a composed config into a run directory: the one path shared by the command line (`__main__`,
through Hydra) and the Python API (api.py). Returns the task's summary (a dict for eval, replay, compare, ...)."""
from __future__ import annotations

from omegaconf import DictConfig


def run_task(cfg: DictConfig, out_dir: str, job: dict | None = None):
    """Validate `cfg`, resolve the drafter's default checkpoints, check the run directory, seed, dispatch on
    `cfg.task.name`; returns what the task returns. `job`: the group choices and overrides `cfg` was composed from
    (config.hydra_choices; read from the running Hydra job when not given)."""
    from .config import validate
    from .rundir import check_run_dir, check_run_layout

    typed = validate(cfg, job)      # keys, types and ranges of the composed config, before any work
    import sys

    import torch
    from omegaconf import OmegaConf

    from . import config, registry, tracking
    from .errors import one_of
    from .eval.compare import run_compare
    from .eval.evaluator import run_eval
    from .eval.fusion_grid import run_grid
    from .eval.merge import run_merge
    from .eval.plan import run_plan
    from .eval.replay import grid_requested, run_replay
    from .eval.serve_check import run_serve_check
    from .export.engines import run_export
    from .report.dashboard import run_dashboard
    from .report.page import run_report
    from .training.dels_module import run_prior
    from .training.pipeline import run_regenerate, run_train

    # Which checkpoints a drafter uses for a target is the drafter's knowledge (its registry entry); filled here,
    # at the edge, so every later stage (fingerprints, training stages, cards) sees the resolved paths, and the
    # run directory is checked against them before it is claimed.
    cfg.drafter = registry.fill_default_checkpoints(cfg.drafter, cfg.target.name)
    check_run_layout(OmegaConf.to_container(cfg.drafter, resolve=True), out_dir)
    check_run_dir(out_dir)

    def replay(cfg, out, typed):                 # τ without decoding, on cached greedy references; with
        runner = run_grid if grid_requested(typed.replay) else run_replay   # replay.fusion_grid: the α/β grid
        return runner(cfg, out, typed)

    tasks = {"eval": run_eval, "train": run_train, "regenerate": run_regenerate, "prior": run_prior}
    tasks["replay"] = replay
    tasks["compare"] = run_compare               # paired comparison of two result directories
    tasks["merge"] = run_merge                   # the shards of one run (eval.shard=I/N) -> the unsharded run's files
    tasks["report"] = run_report                 # a static HTML page over kept result directories
    tasks["dashboard"] = run_dashboard           # the W&B workspace and reports as code (dashboard.json)
    tasks["export"] = run_export                 # a trained drafter for vLLM / SGLang (docs/export.md)
    tasks["plan"] = run_plan                     # the projected device time of a run, before anything is spent
    tasks["serve_check"] = run_serve_check       # each export run by vLLM itself beside specexp (docs/export.md)
    one_of("task", typed.task.name, tasks)
    torch.manual_seed(typed.seed)
    if typed.cpu_threads is not None:
        torch.set_num_threads(typed.cpu_threads)
    # The command every run directory records when it is claimed (tracking.command_record): the process's own
    # command line from the CLI (no `job` given), none from the Python API; the overrides either way.
    command = tracking.command_record(out_dir, job or config.hydra_choices(), None if job is not None else sys.argv)
    token = tracking.COMMAND.set(command)
    try:
        return tasks[typed.task.name](cfg, out_dir, typed)    # every runner reads the typed config validate returned
    finally:
        tracking.COMMAND.reset(token)


def sweeper_metric(summary) -> float | None:
    """What a Hydra sweeper optimises: the macro τ of an eval or replay summary (None for other tasks)."""
    return summary.get("macro", {}).get("tau") if isinstance(summary, dict) else None
