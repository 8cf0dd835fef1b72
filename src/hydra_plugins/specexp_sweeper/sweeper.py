"""Hydra's basic sweeper (the cartesian product of the swept values, in batches), except for jobs whose config
does not compose.

Hydra's own sweeper composes every job before launching any and aborts the whole sweep on the first that fails:
`-m drafter=dflash,none drafter.init=random` runs nothing, because the `none` drafter has no `init` key. Here such
a job is set aside instead, like a job that fails at run time: its one line goes to
`<sweep dir>/uncomposed/<k>/error.txt` (k = its place in the sweep) with a command.json naming its overrides, a
warning says so, the composable jobs run (numbered 0, 1, ... as Hydra numbers them), and `specexp.cli.FailedJobs`
lists the set-aside jobs with the failed ones when the sweep ends (exit 2).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

UNCOMPOSED = "uncomposed"             # where set-aside jobs' error.txt files go, under the sweep directory


def _why(e: BaseException) -> str:
    """Hydra's composition error in one line: its first line, and its cause's (which names the missing key)."""
    first = lambda x: next((ln.strip() for ln in str(x).splitlines() if ln.strip()), type(x).__name__)  # noqa: E731
    head = first(e).rstrip(".")
    cause = first(e.__cause__).rstrip(".") if e.__cause__ is not None else None
    return f"{head}: {cause}, an option this job chose has no such key" if cause and "not in struct" in cause \
        else f"{head}: {cause}" if cause else head


class SpecexpSweeper(BasicSweeper):
    def composes(self, overrides) -> str | None:
        """None when the job's config composes, else why not (one line)."""
        try:
            self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        except Exception as e:        # Hydra's and OmegaConf's composition errors alike: the job is set aside
            return _why(e)
        return None

    def set_aside(self, sweep_dir: Path, k: int, overrides, why: str) -> None:
        from specexp import cli, log

        job_dir = sweep_dir / UNCOMPOSED / str(k)
        line = f"cannot compose this job's config ({why}); the sweep went on without it"
        cli.record_job_error(job_dir / cli.ERROR_FILE, line)
        cli.record_job_command(job_dir, {"overrides": list(overrides)})
        log.LOG.warning(f"job {UNCOMPOSED}/{k} ({' '.join(overrides)}) not run: {line}")

    def sweep(self, arguments: list[str]) -> Any:
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides([*self._parse_config(), *arguments]),
                                              self.max_batch_size)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, launched, place = [], 0, 0
        while not self.is_done():
            ok = []
            for job in self.get_job_batch():
                why = self.composes(job)
                if why is None:
                    ok.append(job)
                else:
                    self.set_aside(sweep_dir, place, job, why)
                place += 1
            if ok:
                results = self.launcher.launch(ok, initial_job_idx=launched)
                for r in results:
                    _ = r.return_value        # a job's exception (not the failures it recorded) surfaces here
                launched += len(ok)
                returns.append(results)
        return returns
