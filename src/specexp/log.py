"""specexp's messages go through one logger, `specexp` (children: `specexp.<module>`), never through `print`:

- On the console they read as they always have: `specexp: <message>` on stdout, `specexp: warning: <message>` on
  stderr, and a result table (`table(md)`) bare on stdout. The handler writes to whatever `sys.stdout`/`sys.stderr`
  are when a line is logged (a test's capture, a notebook cell), and it is the logger's own, so the Python API
  (no Hydra) shows the same lines as the command line.
- In a run directory, Hydra's job logging (conf/hydra/job_logging/specexp.yaml) files every record with its time,
  module and level in `specexp.log`, the DEBUG ones included when `hydra.verbose=specexp` (or `true`) is given.
- INFO: what a task did and where it wrote, and the start and end of the long silent phases (greedy references,
  teacher-forced taps). DEBUG: one line per item of those phases.
"""
from __future__ import annotations

import logging
import sys

LOG = logging.getLogger("specexp")
FILE = "specexp.log"            # the run directory's log (hydra.job.name + .log, conf/hydra/job_logging/specexp.yaml)


class _Console(logging.Handler):
    """INFO to the current stdout, WARNING and above to the current stderr, each line flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:                  # a closed stream must not turn a message into a crash
            self.handleError(record)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if getattr(record, "bare", False):
            return msg
        return f"specexp: warning: {msg}" if record.levelno >= logging.WARNING else f"specexp: {msg}"


if not any(isinstance(h, _Console) for h in LOG.handlers):     # once, whatever reloads the module
    _handler = _Console(logging.INFO)                             # DEBUG lines go to specexp.log only
    _handler.setFormatter(_Format())
    LOG.addHandler(_handler)
if LOG.level == logging.NOTSET:
    LOG.setLevel(logging.INFO)             # Python's default (WARNING) would hide what a task did


def get(name: str) -> logging.Logger:
    """The logger of a module: `get(__name__)` -> `specexp.<module>` (its records go through `LOG`'s handlers)."""
    return logging.getLogger(name if name.startswith("specexp") else f"specexp.{name}")


def table(md: str) -> None:
    """A result table, printed as it is (no prefix) and filed in specexp.log."""
    LOG.info(md.rstrip("\n"), extra={"bare": True})
