"""`python -m specexp [group=option ...] [key=value ...]`: compose, validate, seed, dispatch on `task`.

Returns the metric a Hydra sweeper optimises (macro τ for task=eval).
"""
from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import cli
from .cli import CONF_DIR, fail, precheck
from .errors import UserError


def run_task(cfg: DictConfig, out_dir: str):
    from .config import check_run_dir, validate

    validate(cfg)                   # keys, types and ranges of the composed config, before any work
    check_run_dir(out_dir)
    import torch

    from . import registry
    from .errors import one_of
    from .eval.compare import run_compare
    from .eval.evaluator import run_eval
    from .eval.fusion_grid import run_grid
    from .eval.merge import run_merge
    from .eval.replay import grid_requested, run_replay
    from .report.dashboard import run_dashboard
    from .report.page import run_report
    from .training.local_heads import run_prior
    from .training.pipeline import run_regenerate, run_train

    def replay(cfg, out):                        # τ without decoding, on cached greedy references; with
        return (run_grid if grid_requested(cfg) else run_replay)(cfg, out)   # replay.fusion_grid: the α/β grid

    tasks = {"eval": run_eval, "train": run_train, "regenerate": run_regenerate, "prior": run_prior}
    tasks["replay"] = replay
    tasks["compare"] = run_compare               # paired comparison of two result directories
    tasks["merge"] = run_merge                   # the shards of one run (eval.shard=I/N) -> the unsharded run's files
    tasks["report"] = run_report                 # a static HTML page over kept result directories
    tasks["dashboard"] = run_dashboard           # the W&B workspace and reports as code (dashboard.json)
    one_of("task", cfg.task.name, tasks)
    # Which checkpoints a drafter uses for a target is the drafter's knowledge (its registry entry); filled here,
    # at the edge, so every later stage (fingerprints, training stages, cards) sees the resolved paths.
    cfg.drafter = registry.fill_default_checkpoints(cfg.drafter, cfg.target.name)
    torch.manual_seed(cfg.seed)
    if cfg.get("cpu_threads") is not None:
        torch.set_num_threads(cfg.cpu_threads)
    summary = tasks[cfg.task.name](cfg, out_dir)
    return summary.get("macro", {}).get("tau") if isinstance(summary, dict) else None


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    try:
        return run_task(cfg, HydraConfig.get().runtime.output_dir)
    except UserError as e:
        fail(str(e))
    except OSError as e:            # a full disk or a read-only file met while writing results: one line too
        from .config import environment_error_message

        message = environment_error_message(e)
        if message is None:
            raise
        fail(message)


def main() -> None:
    plugin_dirs = cli.plugin_config_dirs()
    if plugin_dirs:                 # plugins' YAML files join the conf tree (Hydra's search path)
        sys.argv.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in plugin_dirs) + "]")
    precheck(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
