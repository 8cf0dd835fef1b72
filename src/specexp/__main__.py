"""`python -m specexp [group=option ...] [key=value ...]`: compose, validate, seed, dispatch on `task`.

Returns the metric a Hydra sweeper optimises (macro τ for task=eval).

Every failure is one line on stderr: a user's mistake (`UserError`, a disk or permission fault) exits 2; a check
task's finding (`CheckFailed`: task=serve_check) exits 3; anything else is an internal error, exit 1, with its full
traceback in the run's `specexp.log`. In a multirun a failing job writes its line to its own `error.txt` and the
sweep goes on; the sweep then ends with one line listing the failed jobs (`cli.FailedJobs`, a Hydra callback of
conf/config.yaml).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import cli, log
from .cli import fail, precheck
from .config import hydra_choices
from .errors import CheckFailed, UserError
from .paths import CONF_DIR
from .tasks import run_task, sweeper_metric


def error_line(e: Exception, log: Path) -> tuple[str, int]:
    """The one line and exit code of a failure: 2 for the user's input or the machine (a full disk, a read-only
    file), 1 for anything else, whose full traceback is appended to `log` (named in the line)."""
    from .rundir import environment_error_message

    if isinstance(e, UserError):
        return str(e), 2
    if isinstance(e, CheckFailed):
        return str(e), 3
    if isinstance(e, OSError) and environment_error_message(e) is not None:
        return environment_error_message(e), 2
    where = cli.log_traceback(e, log)
    return f"internal error: {type(e).__name__}: {cli.first_line(e)} (full traceback in {where})", 1


def interrupted_line(out_dir=None) -> str:
    """The one line of a Ctrl-C: for a run with samples, how many are kept; and how to go on."""
    kept = ""
    if out_dir is not None:
        from .rundir import progress

        try:
            done = progress(out_dir)
        except Exception:           # an unreadable run.json or samples file: the line says less, never more
            done = None
        kept = f" after {done[0]} of {done[1]} samples" if done else ""
    return f"interrupted (Ctrl-C){kept}; rerun the same command to resume" + (
        f" (finished samples are kept in {out_dir})" if kept else "")


def _job(cfg: DictConfig, out_dir: str):
    try:
        return sweeper_metric(run_task(cfg, out_dir))
    except KeyboardInterrupt:
        fail(interrupted_line(out_dir), 130)
    except Exception as e:          # the last resort: no traceback reaches the terminal (error_line)
        fail(*error_line(e, Path(out_dir) / cli.LOG_NAME))


def _sweep_job(cfg: DictConfig, out_dir: str, num: int):
    """One job of a multirun: its failure is its own (error.txt in its directory, a warning line) and the sweep
    goes on; `cli.FailedJobs` lists the failed jobs when the sweep ends."""
    error = Path(out_dir) / cli.ERROR_FILE
    error.unlink(missing_ok=True)   # a resumed sweep: only this attempt's outcome counts
    try:
        return sweeper_metric(run_task(cfg, out_dir))
    except KeyboardInterrupt:       # the whole sweep stops; a rerun resumes every job
        fail(interrupted_line(out_dir), 130)
    except Exception as e:
        message, _ = error_line(e, Path(out_dir) / cli.LOG_NAME)
        cli.record_job_error(error, message)
        cli.record_job_command(Path(out_dir), hydra_choices())
        log.LOG.warning(f"job {num} failed, the sweep goes on: {message}")
        return None


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        return _sweep_job(cfg, hc.runtime.output_dir, hc.job.num)
    return _job(cfg, hc.runtime.output_dir)


def _main() -> None:
    plugin_dirs = cli.plugin_config_dirs()
    if plugin_dirs:                 # plugins' YAML files join the conf tree (Hydra's search path)
        sys.argv.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in plugin_dirs) + "]")
    # A single run: what the command line shows, then Hydra composes the config, once. A sweep is checked whole
    # first (its jobs compose one by one, later: an unknown key must stop it before any job, not fail each one).
    precheck(sys.argv[1:], keys=any(a in ("-m", "--multirun") for a in sys.argv[1:]))
    from hydra.errors import HydraException

    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"     # a failed composition raises here instead of printing several lines
    try:
        _hydra_main()
    except HydraException as e:              # an unknown key, a bad value for Hydra's grammar: one line
        raise cli.explain_failure(sys.argv[1:], e) from None
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


def main() -> None:
    try:
        _main()
    except KeyboardInterrupt:
        fail(interrupted_line(), 130)
    except Exception as e:          # before or after any job (no run directory): the traceback goes to a temp file
        import tempfile

        fail(*error_line(e, Path(tempfile.gettempdir()) / f"specexp-{os.getpid()}.log"))


if __name__ == "__main__":
    main()
