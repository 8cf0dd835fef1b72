"""sweeps/paper_grid.yaml: the jobs Hydra's basic sweeper makes of it (its own parsing of the sweep parameters),
each composed as its job would be and validated: every run of DeLS-Spec Tables 1, 3 and 4 once, 8 shards each."""
import pytest
from conftest import CONF, ROOT
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from specexp.config import validate

SWEEPS = ROOT / "sweeps"
SEARCH = f"hydra.searchpath=[file://{CONF}]"
# (drafter, decoding protocol, fusion α) of each run the three tables need, shared runs once
RUNS = {
    ("dflash", "greedy", None), ("dflash", "A", None),                            # Table 1, and Table 3 at T = 0
    ("dels_rnn", "greedy", 0.3), ("dels_rnn", "A", 0.3),                          # Table 1; 3, 4 (fixed) at T = 0
    ("dels_markov", "greedy", 0.3), ("dels_markov", "A", 0.3),
    ("domino_ft", "greedy", None),                                                # Table 3
    ("dels_rnn", "greedy", "learned"), ("dels_markov", "greedy", "learned"),      # Table 4 (learned)
}


def jobs(*command_line):
    """The override lists of every job, as `python -m specexp -m --config-name paper_grid ARGS` launches them."""
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        cfg = compose("paper_grid", overrides=[SEARCH, *command_line], return_hydra_config=True)
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()] + list(command_line)
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)
    return [list(job) for batch in batches for job in batch]


def configs(grid):
    """Each job's composed config (with Hydra's node, which holds its run directory), as its job composes it."""
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        for job in grid:
            yield job, compose("paper_grid", overrides=[SEARCH, *job], return_hydra_config=True)


def check(grid, target):
    """Every job validates and is one of the tables' runs on `target`; the runs, their shards and directories."""
    seen, dirs = {}, set()
    for job, cfg in configs(grid):
        task_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])        # what the task receives
        validate(task_cfg, job={"config_name": "paper_grid", "overrides": job})
        assert cfg.target.name == target and cfg.eval.num_samples == "paper" and cfg.eval.max_new_tokens == 2048
        assert cfg.benchmark.names == ["gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench",
                                       "mt_bench", "alpaca"] and cfg.eval.run_ar
        d = cfg.drafter
        run = (d.name, cfg.decoding.protocol, d.fusion.alpha if "fusion" in d and d.name != "domino_ft" else None)
        seen.setdefault(run, []).append(cfg.eval.shard)
        if "head" in d:                               # each head-based drafter reads its own head directory
            suffix = {"dels_rnn": "dels-rnn", "dels_markov": "dels-markov", "domino_ft": "domino-ft"}[d.name]
            assert d.head.checkpoint.endswith(f"heads/{target}-{suffix}"), d.head.checkpoint
        dirs.add(f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}")
    assert all(x.startswith(f"multirun/paper_grid/{target}/") for x in dirs) and len(dirs) == len(grid)
    return seen


def test_paper_grid_is_every_table_run_in_8_shards():
    grid = jobs()
    assert len(grid) == 9 * 8
    runs = {}
    for job in grid:
        runs.setdefault(next(o for o in job if o.startswith("paper_run=")), []).append(
            next(o for o in job if o.startswith("eval.shard=")))
    assert len(runs) == 9 and all(sorted(s) == [f"eval.shard={i}/8" for i in range(8)] for s in runs.values())
    first_shards = [job for job in grid if "eval.shard=0/8" in job]
    assert set(check(first_shards, "qwen3_8b")) == RUNS                          # one of each run, composed


@pytest.mark.slow
@pytest.mark.parametrize("target", ["qwen3_8b", "qwen3_4b"])
def test_every_job_of_the_paper_grid_validates(target):
    grid = jobs(*([] if target == "qwen3_8b" else [f"target={target}"]))
    assert len(grid) == 9 * 8
    seen = check(grid, target)
    assert set(seen) == RUNS and all(sorted(s) == [f"{i}/8" for i in range(8)] for s in seen.values())
