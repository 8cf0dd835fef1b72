"""Experiment tracking (W&B / CSV / none) and run metadata (git SHA, package versions, device).

W&B runs offline unless a key is configured (`WANDB_API_KEY`) or `WANDB_MODE` / `logger.mode` says
otherwise; offline runs land in `DIR/wandb/` and sync later with `wandb sync`. Nothing secret is logged:
the config holds no credentials and the environment is never recorded.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import torch

from .errors import one_of

PACKAGES = ("specexp", "torch", "transformers", "tokenizers", "hydra-core", "omegaconf", "lightning", "triton",
            "wandb", "datasets", "safetensors")


def git_sha() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
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
    dev = {"type": device.type, "name": torch.cuda.get_device_name(device) if device.type == "cuda"
           else platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads()}
    return {"git": git_sha(), "python": sys.version.split()[0], "platform": platform.platform(),
            "versions": versions, "device": dev}


class NoLogger:
    def log(self, metrics: dict, step: int | None = None) -> None:
        pass

    def summary(self, summary: dict) -> None:
        pass

    def finish(self) -> None:
        pass


class CSVLogger(NoLogger):
    """`DIR/metrics.csv` (step, key, value rows, appended) and `DIR/summary.csv` (one row per benchmark)."""

    def __init__(self, out_dir: Path):
        self.dir = Path(out_dir)

    def log(self, metrics, step=None):
        path = self.dir / "metrics.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["step", "key", "value"])
            w.writerows([step, k, v] for k, v in metrics.items())

    def summary(self, summary):
        keys = ["num_samples", "num_turns", "tau", "speedup", "tpot_ms", "tpot_ar_ms", "ttft_ms", "lossless_mismatches"]
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(["benchmark", *keys])
        for name, b in summary["benchmarks"].items():
            w.writerow([name, *(b[k] for k in keys)])
        write_text_atomic(self.dir / "summary.csv", buf.getvalue())


def _warn(message: str) -> None:
    print(f"specexp: warning: {message}", file=sys.stderr, flush=True)


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


class WandbLogger(NoLogger):
    def __init__(self, cfg, out_dir: Path, config: dict, name: str):
        import wandb

        mode = cfg.get("mode") or os.environ.get("WANDB_MODE") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline")
        one_of("logger.mode", mode, ("online", "offline", "disabled"))
        self.wandb = wandb
        server = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        offline = f"logging offline to {Path(out_dir) / 'wandb'} (sync later with `wandb sync`)"
        if mode == "online" and not _reachable(server):
            # wandb.init would retry for minutes and then raise; the run's results matter more than the dashboard
            _warn(f"W&B server {server} is unreachable; {offline}")
            mode = "offline"
        kw = dict(project=cfg.project, entity=cfg.get("entity"), name=name, dir=str(out_dir), config=config,
                  tags=list(cfg.get("tags") or []), reinit="finish_previous")
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
        cols = ["benchmark", "tau", "speedup", "tpot_ms", "tpot_ar_ms", "lossless_mismatches"]
        table = self.wandb.Table(columns=cols)
        for name, b in summary["benchmarks"].items():
            table.add_data(name, *(b[c] for c in cols[1:]))
            self.run.summary.update({f"eval/{name}/{k}": b[k] for k in ("tau", "speedup", "tpot_ms")})
        self.run.summary.update({f"eval/macro/{k}": v for k, v in summary["macro"].items()})
        self.run.log({"eval/summary": table})

    def finish(self):
        self.run.finish()


def make_logger(cfg, out_dir: Path, config: dict, name: str):
    one_of("logger.name", cfg.name, ("none", "csv", "wandb"))
    if cfg.name == "csv":
        return CSVLogger(out_dir)
    if cfg.name == "wandb":
        return WandbLogger(cfg, out_dir, config, name)
    return NoLogger()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` atomically: readers (and a crash, a full disk, a kill) see the old file or the
    new one, never a cut one. The temp file lives in the same directory (os.replace is atomic only within one
    file system), is fsynced before the rename, and is removed if anything fails."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)                # mkstemp makes 0600; results are as readable as any other file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    """Make the rename itself durable (POSIX); skipped where a directory cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")
