"""Hydra launchers as config options (conf/hydra/launcher/): a real two-job joblib multirun of sharded evals on the
tiny target that merges into one run, the SLURM job array submitit would submit (its sbatch file and job
pickles, nothing submitted), Ray's composed launcher where its plugin is installed, and one line for a launcher
whose plugin is missing."""
import importlib.util
import json
import os
import pickle
import subprocess
import sys

import pytest
from conftest import CONF, ROOT
from hydra import compose, initialize_config_dir

from specexp import cli
from specexp.errors import UserError

SWEEPS = ROOT / "sweeps"


def hydra_cfg(overrides, config_dir=CONF, name="config"):
    """The composed config with its `hydra` node, as a launcher receives it."""
    extra = [f"hydra.searchpath=[file://{CONF}]"] if config_dir != CONF else []
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(name, overrides=[*extra, *overrides], return_hydra_config=True)


def test_every_launcher_file_extends_a_known_launcher():
    from omegaconf import OmegaConf

    known = cli.launchers()
    for f in sorted((CONF / "hydra" / "launcher").glob("*.yaml")):
        base = OmegaConf.load(f).defaults[0]
        assert base in cli.LAUNCHER_PLUGINS and known[f.stem] == base, f.name
        assert f.read_text().startswith("# ") and "pip install -e '.[" in f.read_text(), f.name


def test_a_missing_launcher_plugin_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "installed_launchers", lambda: {"basic"})
    with pytest.raises(UserError) as e:
        cli.precheck(["-m", "hydra/launcher=local", "eval.max_new_tokens=4,8"])
    assert str(e.value) == ("hydra/launcher=local needs the hydra-joblib-launcher plugin, which is not installed: "
                            "pip install -e '.[joblib]' (or pip install hydra-joblib-launcher)")
    with pytest.raises(UserError, match="hydra/launcher=slrum is not an option; choose one of: basic, joblib, local"):
        cli.precheck(["-m", "hydra/launcher=slrum"])
    monkeypatch.undo()
    cli.precheck(["-m", "hydra/launcher=local"])                    # installed here (the test extra)


def test_local_launcher_composes_with_its_defaults():
    launcher = hydra_cfg(["hydra/launcher=local"]).hydra.launcher
    assert launcher._target_.endswith("JoblibLauncher") and launcher.n_jobs == 2 and launcher.prefer == "processes"


LOCAL_RAY = ["hydra.launcher.ray.remote.num_gpus=0", "hydra.launcher.ray.remote.num_cpus=1",
             "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher, extra, launched", [
    ("local", [], "Joblib.Parallel(n_jobs=2"),
    pytest.param("ray_cluster", LOCAL_RAY, "Ray Launcher is launching 2 jobs", marks=pytest.mark.skipif(
        importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None,
        reason="hydra-ray-launcher is not installed (the `ray` extra is not in the test set)")),
])
def test_a_launcher_runs_two_sharded_jobs_in_other_processes_and_they_merge(tmp_path, launcher, extra, launched):
    """A real multirun on the tiny target: joblib's worker processes, or a local Ray instance (no GPU)."""
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    args = ["-m", f"hydra/launcher={launcher}", *extra, "target=tiny_qwen3", "drafter.init=random",
            "drafter.block_size=4", "benchmark=gsm8k", "eval.num_samples=3", "eval.max_new_tokens=8",
            "eval.warmup=0", "eval.progress=false", "logger=none", "device=cpu", "cpu_threads=1",
            "eval.shard=0/2,1/2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen([sys.executable, "-m", "specexp", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert launched in out                                                       # that launcher ran them
    for job, shard, n in ((0, 0, 2), (1, 1, 1)):
        d = sweep / str(job)
        summary = json.loads((d / "summary.json").read_text())
        assert summary["benchmarks"]["gsm8k"]["num_samples"] == n and summary["benchmarks"]["gsm8k"]["tau"] >= 1
        assert json.loads((d / "run.json").read_text())["settings"]["shard"] == {"index": shard, "count": 2}
        assert len((d / "samples.jsonl").read_text().splitlines()) == n
    # each run was held by a worker process (its pid stays in .lock), not by the command's own process
    pids = {int((sweep / str(j) / ".lock").read_text()) for j in (0, 1)}
    assert proc.pid not in pids and os.getpid() not in pids
    from conftest import make_cfg

    from specexp.__main__ import run_task

    run_task(make_cfg(["task=merge", f"merge.runs=[{sweep}]"]), str(tmp_path / "merged"))
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert merged["benchmarks"]["gsm8k"]["num_samples"] == 3 and merged["benchmarks"]["gsm8k"]["num_turns"] == 3


def test_slurm_launcher_submits_one_gpu_job_per_shard(tmp_path, monkeypatch):
    """The paper grid through hydra/launcher=slurm, two of its jobs: the real Hydra submitit launcher and submitit's
    SLURM executor write the job pickles and the sbatch file; only the `sbatch` call itself is replaced."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    import submitit
    from hydra.utils import instantiate

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")          # submitit looks for srun to know it is on SLURM
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sweep = tmp_path / "multirun"
    cfg = hydra_cfg(["hydra/launcher=slurm", f"hydra.sweep.dir={sweep}", "hydra.launcher.partition=gpu"],
                    SWEEPS, "paper_grid")
    submitted = {}

    class Submitted(Exception):
        pass

    def fake_sbatch(executor, command):
        submitted["sbatch"] = executor._make_submission_file_text(command, "uid")
        submitted["pickles"] = sorted(executor.folder.parent.rglob("*.pkl"))
        raise Submitted

    monkeypatch.setattr(submitit.SlurmExecutor, "_submit_command", fake_sbatch)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    jobs = [["paper_run=dels_rnn_t0", "eval.shard=0/8"], ["paper_run=dels_rnn_t0", "eval.shard=1/8"]]
    with pytest.raises(Submitted):
        launcher.launch(jobs, initial_job_idx=0)
    sbatch = submitted["sbatch"].splitlines()
    for line in ["#SBATCH --array=0-1%2", "#SBATCH --gpus-per-node=1", "#SBATCH --nodes=1", "#SBATCH --time=720",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=64GB",
                 "#SBATCH --partition=gpu", "#SBATCH --signal=USR2@120", "#SBATCH --job-name=specexp",
                 f"#SBATCH --output={sweep}/.submitit/%A_%a/%A_%a_0_log.out"]:
        assert line in sbatch, (line, submitted["sbatch"])
    assert sbatch[-1].endswith(f"-u -m submitit.core._submit {sweep}/.submitit/%j") and sys.executable in sbatch[-1]
    # the pickled jobs: this launcher, each job's overrides and number, requeued up to 3 times on a timeout
    assert len(submitted["pickles"]) == 2
    calls = []
    for p in submitted["pickles"]:
        with p.open("rb") as f:
            d = pickle.load(f)
        assert type(d.function).__name__ == "SlurmLauncher" and d._timeout_countdown == 3 and d._timeout_min == 720
        calls.append((d.args[2], d.args[0]))
    assert sorted(calls) == [(i, job) for i, job in enumerate(jobs)]


def test_ray_launcher_composes_one_gpu_per_job(monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher",
                        reason="hydra-ray-launcher is not installed (the `ray` extra is not in the test set)")
    from hydra.utils import instantiate

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    cfg = hydra_cfg(["hydra/launcher=ray_cluster"], SWEEPS, "paper_grid")
    assert cfg.hydra.launcher.ray.remote.num_gpus == 1 and cfg.hydra.launcher.ray.init.address == "10.0.0.1:6379"
    launcher = instantiate(cfg.hydra.launcher)
    assert launcher.ray_cfg.remote.num_gpus == 1
