"""Experiment tracking (W&B / CSV / none) and run metadata (git SHA, package versions, device).

W&B runs offline unless a key is configured (`WANDB_API_KEY`) or `WANDB_MODE` / `logger.mode` says
otherwise (when both are set, the more private of the two wins: `WANDB_MODE=offline` is never overridden by
`logger.mode=online`); offline runs land in `DIR/wandb/` and sync later with `wandb sync`. Nothing secret is logged:
the config holds no credentials and the environment is never recorded.
"""
from __future__ import annotations

import contextvars
import csv
import io
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from . import log
from .errors import one_of
from .files import append_text, write_json, write_text_atomic
from .machine import cpu_info, describe
from .overrides import hydra_quote
from .paths import REPO_ROOT

PACKAGES = ("specexp", "torch", "transformers", "tokenizers", "hydra-core", "omegaconf", "lightning", "triton",
            "wandb", "datasets", "safetensors")


def git_sha() -> dict:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}
    return {"sha": sha or None, "dirty": dirty if sha else None}


def run_info(device: torch.device) -> dict:
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    m = describe(device)
    dev = {"type": device.type, "name": m.get("gpu", m["cpu"]), "torch_threads": m["torch_threads"]}
    return {"git": git_sha(), "python": sys.version.split()[0], "platform": platform.platform(),
            "versions": versions, "device": dev, "cpu": cpu_info()}


# ------------------------------------------------------------------------------------------- the command line
COMMAND_FILE = "command.json"
# The command of the run in progress (tasks.run_task sets it): every run directory records it when it is claimed
# (eval/store.py), and W&B runs carry it in their config.
COMMAND: contextvars.ContextVar[dict | None] = contextvars.ContextVar("specexp_command", default=None)
# Hydra flags of a launching command line that a single rerun keeps (with their value when they take one).
_KEPT_FLAGS = {"--config-dir": 1, "-cd": 1, "--config-name": 1, "-cn": 1, "--config-path": 1, "-cp": 1}


def command_record(out_dir, job: dict | None, argv: list[str] | None) -> dict:
    """What `command.json` holds: `argv`, the exact command line of the process, and `command`, the same as a
    shell line (both None when the run came from the Python API); `cwd`, where it ran (relative paths are relative
    to it); `overrides`, the overrides this run's config was composed from (a multirun job's own values); `rerun`,
    a shell line that reruns this one run into the same directory (a resumed run continues it; for a multirun
    job, just that job). The last command to claim the directory wins (a resume records its own)."""
    job = job or {}
    overrides = [str(o) for o in job.get("overrides") or []]
    flags, args = [], list(argv[1:] if argv else [])
    for i, a in enumerate(args):                # --config-dir/--config-name (a sweep file) pick the config
        name = a.split("=", 1)[0]
        if name in _KEPT_FLAGS:
            flags += [a] if "=" in a else args[i:i + 1 + _KEPT_FLAGS[name]]
    if not argv and job.get("config_name") not in (None, "config"):
        flags = ["--config-name", str(job["config_name"])]
    rerun = ["python", "-m", "specexp", *flags, *overrides, f"hydra.run.dir={hydra_quote(str(out_dir))}"]
    return {"argv": list(argv) if argv else None,
            "command": shlex.join(["python", "-m", "specexp", *argv[1:]]) if argv else None,
            "cwd": os.getcwd(), "overrides": overrides, "rerun": shlex.join(rerun)}


def record_command(run_dir) -> None:
    """Write the running command (COMMAND) into `run_dir/command.json`; nothing outside a task."""
    record = COMMAND.get()
    if record is not None:
        write_json(Path(run_dir) / COMMAND_FILE, record)


def read_command(run_dir) -> dict | None:
    """A run directory's `command.json`, or None when it has none (or an unreadable one)."""
    try:
        record = json.loads((Path(run_dir) / COMMAND_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class NoLogger:
    """What every logger takes: per-step metrics, an eval/replay summary (summary.json's content), a comparison
    (compare.json's), result files as one artifact, and the end of the run."""

    def log(self, metrics: dict, step: int | None = None) -> None:
        pass

    def summary(self, summary: dict) -> None:
        pass

    def comparison(self, result: dict) -> None:
        pass

    def artifact(self, kind: str, files: list) -> None:
        pass

    def finish(self) -> None:
        pass


class CSVLogger(NoLogger):
    """`DIR/metrics.csv` (step, key, value rows, appended) and `DIR/summary.csv` (one row per benchmark)."""

    def __init__(self, out_dir: Path):
        self.dir = Path(out_dir)

    def log(self, metrics, step=None):
        path = self.dir / "metrics.csv"
        buf = io.StringIO()
        w = csv.writer(buf)
        if not path.exists():
            w.writerow(["step", "key", "value"])
        w.writerows([step, k, v] for k, v in metrics.items())
        append_text(path, buf.getvalue(), durable=False)

    def summary(self, summary):
        keys = ["num_samples", "num_turns", "tau", "speedup", "tpot_ms", "tpot_ar_ms", "ttft_ms", "lossless_mismatches"]
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(["benchmark", *keys])
        for name, b in summary["benchmarks"].items():
            w.writerow([name, *(b.get(k) for k in keys)])       # replay summaries have no timing
        write_text_atomic(self.dir / "summary.csv", buf.getvalue())


def _warn(message: str) -> None:
    log.LOG.warning(message)


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to `url`'s host opens within `timeout` seconds, name lookup included (in a
    daemon thread: a resolver with no network can block far longer than its own timeout)."""
    import socket
    import threading
    from urllib.parse import urlparse

    u = urlparse(url)
    if not u.hostname:
        return False
    port, ok = u.port or (443 if u.scheme == "https" else 80), []

    def probe():
        try:
            socket.create_connection((u.hostname, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def hydra_sweep() -> dict | None:
    """The Hydra multirun this job belongs to, as W&B groups it: {"name": the sweep (its config name, or its
    directory's), "overrides": this job's command-line and swept values, "params": the sweep file's grid};
    None outside a multirun. W&B runs use `name` as their group, so a sweep is one object there."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ValueError, ImportError):
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    overrides = dict(o.lstrip("+~").split("=", 1) for o in hc.overrides.task if "=" in o)
    params = {str(k): str(v) for k, v in (hc.sweeper.get("params") or {}).items()}
    name = hc.job.config_name if hc.job.config_name not in (None, "config") else Path(hc.sweep.dir).name
    return {"name": name, "overrides": overrides, "params": params}


def run_name(base: str) -> str:
    """A W&B run's display name: `base` (drafter-target), and in a multirun the job's overrides after it, so that
    every job of a sweep has a name of its own."""
    sweep = hydra_sweep()
    if not sweep or not sweep["overrides"]:
        return base
    return f"{base} " + ",".join(f"{k}={v}" for k, v in sweep["overrides"].items())


def wandb_run_args(config: dict, out_dir: Path, job_type: str | None = None) -> dict:
    """group (the sweep), job_type (the task, or `job_type`: `grid` for the cells of replay.fusion_grid) and the
    config W&B runs get: the resolved config, `sweep` (its swept keys), `run_info` (DIR/run_info.json when written)
    and `command` (the running command, command_record). Shared by every task's runs and Lightning's logger."""
    sweep = hydra_sweep()
    info = Path(out_dir) / "run_info.json"
    extra = {"sweep": sweep} if sweep else {}
    if info.is_file():
        extra["run_info"] = json.loads(info.read_text())
    if COMMAND.get() is not None:
        extra["command"] = COMMAND.get()
    return {"group": sweep["name"] if sweep else None,
            "job_type": job_type or (config.get("task") or {}).get("name"), "config": {**config, **extra}}


MODES = ("online", "offline", "disabled")          # least private first


def wandb_mode(configured: str | None, environ) -> str:
    """The W&B mode of a run: `logger.mode` and `WANDB_MODE` both count, and the more private one wins (a machine
    or a CI job that sets WANDB_MODE=offline means nothing leaves it, whatever a config file says); neither set:
    online with a configured key (`WANDB_API_KEY`), else offline."""
    env = environ.get("WANDB_MODE") or None
    env = "offline" if env == "dryrun" else env          # wandb's older name for offline
    if env is not None:
        one_of("WANDB_MODE (environment)", env, MODES)
    if configured is not None:
        one_of("logger.mode", configured, MODES)
    chosen = [m for m in (configured, env) if m is not None]
    if not chosen:
        return "online" if environ.get("WANDB_API_KEY") else "offline"
    return max(chosen, key=MODES.index)


class WandbLogger(NoLogger):
    def __init__(self, cfg, out_dir: Path, config: dict, name: str, job_type: str | None = None):
        import wandb

        mode = wandb_mode(cfg.mode, os.environ)
        self.wandb = wandb
        server = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        offline = f"logging offline to {Path(out_dir) / 'wandb'} (sync later with `wandb sync`)"
        if mode == "online" and not _reachable(server):
            # wandb.init would retry for minutes and then raise; the run's results matter more than the dashboard
            _warn(f"W&B server {server} is unreachable; {offline}")
            mode = "offline"
        kw = dict(project=cfg.project, entity=cfg.entity, name=name, dir=str(out_dir),
                  tags=list(cfg.tags or []), reinit="finish_previous",
                  **wandb_run_args(config, out_dir, job_type))
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=30), **kw)
        except Exception as e:                           # wandb's own error types (CommError, UsageError, ...)
            if mode != "online":
                raise
            _warn(f"W&B init failed ({type(e).__name__}); {offline}")
            self.run = wandb.init(mode="offline", **kw)

    def log(self, metrics, step=None):
        self.run.log(metrics, step=step)

    def summary(self, summary):
        """What the dashboards read (report/dashboard.py): per-benchmark summary keys and table, macro keys,
        per-position acceptance (table + line plot, and its mean over benchmarks as `eval/macro/accept_k<k>`) and
        the τ histogram (table + bar plot)."""
        wandb = self.wandb
        cols = ["benchmark", "tau", "tau_ci_lo", "tau_ci_hi", "speedup", "tpot_ms", "tpot_ar_ms", "ttft_ms",
                "lossless_mismatches"]
        table = wandb.Table(columns=cols)
        acc = wandb.Table(columns=["benchmark", "position", "accepted", "accepted_given_previous"])
        hist = [0] * (1 + max((len(b.get("tau_histogram") or []) for b in summary["benchmarks"].values()), default=0))
        for name, b in summary["benchmarks"].items():
            ci = b.get("tau_ci95") or [None, None]
            row = {**b, "tau_ci_lo": ci[0], "tau_ci_hi": ci[1]}
            table.add_data(name, *(row.get(c) for c in cols[1:]))
            self.run.summary.update({f"eval/{name}/{k}": row.get(k) for k in cols[1:]})
            cond = b.get("accept_rate_conditional") or []
            for k, p in enumerate(b.get("accept_rate_per_position") or []):
                acc.add_data(name, k + 1, p, cond[k] if k < len(cond) else None)
            for k, n in enumerate(b.get("tau_histogram") or []):
                hist[k + 1] += n
        self.run.summary.update({f"eval/macro/{k}": v for k, v in summary["macro"].items()})
        if "batch_size" in summary:                 # online runs: the batch their speedups are throughputs at
            self.run.summary["eval/batch_size"] = summary["batch_size"]
        # K of this run (its block size - 1, or its draft cap): acceptance panels read positions 1..K of each run
        self.run.summary["eval/num_draft_tokens"] = summary.get("num_draft_tokens")
        rates = [b.get("accept_rate_per_position") or [] for b in summary["benchmarks"].values()]
        for k in range(max((len(r) for r in rates), default=0)):
            vals = [r[k] for r in rates if k < len(r) and r[k] is not None]
            self.run.summary[f"eval/macro/accept_k{k + 1}"] = sum(vals) / len(vals) if vals else None
        tau_hist = wandb.Table(columns=["tokens_committed", "rounds"], data=[[k, n] for k, n in enumerate(hist) if k])
        self.run.log({"eval/summary": table, "eval/acceptance": acc, "eval/tau_histogram": tau_hist,
                      "eval/acceptance_curves": wandb.plot.line(acc, "position", "accepted", stroke="benchmark",
                                                                title="P(draft k accepted) by benchmark"),
                      "eval/tau_histogram_plot": wandb.plot.bar(tau_hist, "tokens_committed", "rounds",
                                                                title="rounds by tokens committed")})

    def comparison(self, result):
        """task=compare: per benchmark and macro `compare/<benchmark>/<delta|delta_ci_lo|delta_ci_hi|tau_a|tau_b|
        a_wins|ties|b_wins|num_prompts>` in the summary, and the table `compare/summary`."""
        cols = ["benchmark", "num_prompts", "tau_a", "tau_b", "delta", "delta_ci_lo", "delta_ci_hi", "a_wins", "ties",
                "b_wins"]
        table = self.wandb.Table(columns=cols)
        for name, c in [*result["benchmarks"].items(), ("macro", result["macro"])]:
            ci = c.get("delta_ci95") or [None, None]
            row = {**c, "delta_ci_lo": ci[0], "delta_ci_hi": ci[1]}
            table.add_data(name, *(row.get(k) for k in cols[1:]))
            self.run.summary.update({f"compare/{name}/{k}": row.get(k) for k in cols[1:] if k in row})
        self.run.summary.update({"compare/a": result["a"], "compare/b": result["b"],
                                 "compare/turns_with_different_outputs": result["turns_with_different_outputs"]})
        self.run.log({"compare/summary": table})

    def artifact(self, kind, files):
        """The run's result files (summary.json, samples.jsonl, ...) as one artifact of type `results`, named
        after the task and the run (W&B versions it when the same run logs again, e.g. resumed)."""
        art = self.wandb.Artifact(f"{kind}-{self.run.id}", type="results")
        for f in files:
            if Path(f).is_file():
                art.add_file(str(f))
        self.run.log_artifact(art)

    def finish(self):
        self.run.finish()


def make_logger(cfg, out_dir: Path, config: dict, name: str, job_type: str | None = None):
    """The logger `cfg` (the checked `logger` group, config.LoggerConfig) names, for a run writing into `out_dir`;
    `config` is what the run records as its config; `name` is the W&B run's name (a multirun job's overrides are
    appended, run_name) and `job_type` overrides the task's name as its job type."""
    one_of("logger.name", cfg.name, ("none", "csv", "wandb"))
    if cfg.name == "csv":
        return CSVLogger(out_dir)
    if cfg.name == "wandb":
        return WandbLogger(cfg, out_dir, config, run_name(name), job_type)
    return NoLogger()
