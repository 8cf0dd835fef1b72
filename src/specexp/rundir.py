"""The run directory: one home for what every task agrees on about it.

A run directory (`hydra.run.dir`) holds one run's files (`RUN_FILES`): `run.json` (what the run is: eval/store.py
writes and compares it), `samples.jsonl` (one record per turn, the REQUIRED fields at least), `summary.json` and the
files written from them, and `.lock`, the OS lock its holder keeps while it writes. This module is the part every
task shares, below eval, training, export and report, which all read or claim run directories:
  - the checks before a run starts: writable, no directory where a run file goes (`check_run_dir`), a run and a
    checkpoint it reads never nested (`check_run_layout`);
  - the lock (`lock`) and the claim of a task that writes files of its own (`claimed_for`);
  - the one reader of each file a run owns (`read_records`, `read_json`, `read_summary`, `run_records`,
    `progress`), each refusing a corrupt file in one line naming it;
  - the one line for a disk or permission fault met while writing (`environment_error_message`).
Opening a directory for a run of samples (fresh, resume, refuse) is `eval/store.ResultStore`, built on these.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
from pathlib import Path

from . import files
from .errors import UserError, check
from .tracking import record_command

LOCK, RUN, SAMPLES, SUMMARY = ".lock", "run.json", "samples.jsonl", "summary.json"
CONFIG, RUN_INFO, SUMMARY_MD = "config.yaml", "run_info.json", "summary.md"

# Files a run writes into its directory (the evaluator's results contract, the loggers, training summaries).
RUN_FILES = (SAMPLES, SUMMARY, SUMMARY_MD, CONFIG, RUN_INFO, RUN,
             "metrics.csv", "summary.csv", "train_summary.json", "data.json", "command.json")
# Faults of the machine rather than of the program: one line, no traceback.
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EISDIR,
                      errno.ENOTDIR, errno.ENAMETOOLONG, errno.EFBIG}      # EFBIG: a file-size limit (ulimit -f)


def check_run_dir(out_dir) -> None:
    """The run directory must be writable and none of the files a run writes may be a directory."""
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".specexp-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"run directory {d} is not writable ({e.strerror}); choose another hydra.run.dir") from None
    for name in RUN_FILES:
        if (d / name).is_dir():
            raise UserError(f"{d / name} is a directory but the run writes a file there; move it away or choose "
                            f"another hydra.run.dir")


def checkpoint_paths(drafter: dict) -> dict[str, Path]:
    """drafter.KEY -> the local directory of every `checkpoint` key (drafter.checkpoint, drafter.head.checkpoint)
    that names one (a committed checkpoint is relative to the repository; a hub id names none)."""
    from .paths import REPO_ROOT

    out = {}

    def visit(node: dict, at: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                visit(v, f"{at}.{k}")
            elif k == "checkpoint" and isinstance(v, str) and v:
                p = Path(v).expanduser()
                p = p if p.exists() or p.is_absolute() else REPO_ROOT / v
                if p.exists():
                    out[f"{at}.{k}"] = p.resolve()

    visit(drafter, "drafter")
    return out


def check_run_layout(drafter: dict, out_dir) -> None:
    """A run directory and a checkpoint it reads never nest: the run's files inside a checkpoint change its digest
    (an identical rerun is then refused as another checkpoint), and a checkpoint inside the run directory is
    mixed with (and counted among) the run's results. Checked before the run directory is claimed."""
    if drafter.get("init") == "random":
        return                                   # no checkpoint is read
    run = Path(out_dir).resolve()
    for key, ckpt in checkpoint_paths(drafter).items():
        if run == ckpt or ckpt in run.parents:
            raise UserError(f"the run directory {out_dir} is inside {key}={ckpt}: the run's files would change the "
                            f"checkpoint; choose a hydra.run.dir outside it")
        if run in ckpt.parents:
            raise UserError(f"{key}={ckpt} is inside the run directory {out_dir}: keep checkpoints out of run "
                            f"directories; choose another hydra.run.dir or move the checkpoint")


def environment_error_message(e: OSError) -> str | None:
    """One line for a disk or permission fault met while writing (a full disk, a read-only file system), else None."""
    if e.errno not in ENVIRONMENT_ERRNOS:
        return None
    what = f" {e.filename}" if e.filename else ""
    return f"cannot write{what}: {e.strerror or os.strerror(e.errno)}; {ENVIRONMENT_HINTS.get(e.errno, FIX)}"


FIX = "fix the permissions or choose another directory"
ENVIRONMENT_HINTS = {errno.ENOSPC: "free some space and rerun the same command",
                     errno.EDQUOT: "free some space within your quota and rerun the same command",
                     errno.EFBIG: "raise the file-size limit (ulimit -f) and rerun the same command",
                     errno.ENAMETOOLONG: "choose a shorter path (a name has at most 255 bytes)",
                     errno.EISDIR: "a directory stands where this file goes; move it away",
                     errno.ENOTDIR: "a file stands where a directory of this path goes; move it away",
                     errno.EROFS: "the file system is read-only; choose another directory"}


# Every field a reader of samples.jsonl relies on (compare, merge, summaries, the experiment scripts), and its type.
REQUIRED = {"id": str, "benchmark": str, "turn": int, "accept_lengths": list}
MAX_ACCEPT = 4096               # tokens one verification can commit: a tree's depth + 1 at most, far below this
TIMES = ("tpot", "ar_tpot")     # optional timing fields: finite seconds >= 0 (or null) where present


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _bad_field(rec) -> str | None:
    """Why a parsed line is not a sample record (a phrase that follows "line N: "), or None."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a sample record (a JSON object)"
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        return f"a record without {', '.join(repr(k) for k in missing)}"
    for key, kind in REQUIRED.items():
        v = rec[key]
        if not isinstance(v, kind) or isinstance(v, bool):          # bool is an int to isinstance, never a turn
            return f"{key}={v!r} is {_a(type(v).__name__)}; expected {_a(kind.__name__)}"
    if rec["turn"] < 0:
        return f"turn={rec['turn']}; expected an int >= 0"
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in rec["accept_lengths"]):
        return "accept_lengths holds a value that is not an int; expected a list of ints"
    bad = next((a for a in rec["accept_lengths"] if not 1 <= a <= MAX_ACCEPT), None)
    if bad is not None:
        shown = str(bad) if len(str(bad)) <= 24 else f"{str(bad)[:24]}… ({len(str(bad))} digits)"
        return (f"accept_lengths holds {shown}; expected ints from 1 to {MAX_ACCEPT:,} (the tokens one "
                f"verification committed, the bonus included)")
    for key in TIMES:
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v < 0):
            return f"{key}={v!r}; expected a finite number of seconds >= 0, or null"
    return None


def read_text(path: Path) -> str:
    """A results file as text: plain, or gzipped (`.gz`, an archived copy); a directory, unreadable bytes or bytes
    that are not UTF-8 are one line naming the file (and line)."""
    return files.read_text(path, "results file")


def read_json(path) -> dict:
    """A run's JSON file (summary.json, run.json, a card) as an object; anything else is one line naming it."""
    path = Path(path)
    try:
        obj = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is corrupt (not JSON: {e.msg} at line {e.lineno}); rerun what wrote it or move "
                        f"it away") from None
    check(isinstance(obj, dict), f"{path} is corrupt (a JSON {type(obj).__name__}, expected an object); rerun "
                                 f"what wrote it or move it away")
    return obj


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bad_summary_entry(name: str, e) -> str | None:
    if not isinstance(e, dict):
        return f"{name} is {_a(type(e).__name__)}, expected an object"
    for k, v in e.items():
        if k.endswith("_ci95"):
            if v is not None and not (isinstance(v, list) and len(v) == 2 and all(map(_finite, v))):
                return f"{name}.{k} is {v!r:.40}; expected null or two finite numbers"
        elif (k in ("tau", "speedup") or k.endswith("_ms")) and v is not None and not _finite(v):
            return f"{name}.{k} is {v!r:.40}; expected null or a finite number"
    return None


def read_summary(path) -> dict:
    """A run's summary.json as the readers of results use it (the report, its sweep tables): an object with a
    `benchmarks` table {name: {...}} and a `macro` entry, whose τ, speedups, times and CIs are finite numbers (or
    null); anything else (`{}`, a NaN, a string τ) is one line naming the file."""
    s, path = read_json(path), Path(path)
    why = None if isinstance(s.get("benchmarks"), dict) else "no 'benchmarks' table"
    why = why or (None if isinstance(s.get("macro"), dict) else "no 'macro' entry")
    for name, e in ([*s["benchmarks"].items(), ("macro", s["macro"])] if why is None else []):
        why = why or _bad_summary_entry(name, e)
    check(why is None, f"{path} is not a run summary ({why}); expected the summary.json that task=eval, task=replay "
                       f"or task=merge writes: rerun what wrote it or leave the directory out")
    return s


def read_records(path: Path) -> tuple[list[dict], bool]:
    """The records of a samples.jsonl (or samples.jsonl.gz), and whether its tail was torn (an unterminated last
    line, dropped even when it parses: the writer did not finish it). Every other line must be a sample record with
    the REQUIRED fields; anything else is a one-line error naming the file and line (it is not ours to guess).
    This is the one reader of samples.jsonl: the store, compare, merge and the experiment scripts use it."""
    path = Path(path)
    if not path.exists():
        return [], False
    lines = read_text(path).split("\n")
    torn = lines.pop() != ""                # the piece after the last "\n": empty for a well-terminated file
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{path} line {n} is corrupt (not JSON); move the file away or choose another "
                            f"directory") from None
        why = _bad_field(rec)
        check(why is None, f"{path} line {n}: {why}; move the file away or choose another directory")
        records.append(rec)
    return records, torn


def samples_path(run_dir) -> Path | None:
    """`samples.jsonl` of a run directory, or `samples.jsonl.gz` of an archived copy, or None."""
    path = Path(run_dir) / SAMPLES
    packed = path.with_name(SAMPLES + ".gz")
    return path if path.exists() else packed if packed.exists() else None


def progress(run_dir) -> tuple[int, int] | None:
    """(finished samples, samples planned) of a run directory, from its run.json plan and its records (a sample's
    turns are appended together, so a sample with records is finished); None without a plan."""
    run, path = Path(run_dir) / RUN, samples_path(run_dir)
    plan = (read_json(run).get("samples") or {}) if run.is_file() else {}
    planned = {(b, i) for b, ids in plan.items() for i in ids}
    if not planned:
        return None
    done = {(r["benchmark"], r["id"]) for r in read_records(path)[0]} if path is not None else set()
    return len(done & planned), len(planned)


def run_records(run_dir) -> list[dict]:
    """The records of a run directory (a finished run, or one in progress: its torn last line dropped), for the
    readers of results (compare, report, experiment scripts); a directory without results is one line."""
    d = Path(run_dir)
    check(d.is_dir(), f"{run_dir!s} is not a directory; expected a run directory of task=replay or task=eval")
    path = samples_path(d)
    check(path is not None, f"{run_dir!s}: no {SAMPLES} (a run directory of task=replay or task=eval)")
    records, seen = read_records(path)[0], set()
    for n, r in enumerate(records, 1):      # the store itself drops repeats when it resumes; a reader refuses them
        key = (r["benchmark"], r["id"], r["turn"])
        check(key not in seen, f"{path}: record {n} repeats {r['benchmark']}/{r['id']} turn {r['turn']}; a run "
                               f"holds one record a turn (resume the run to repair it, or move the file away)")
        seen.add(key)
    return records


@contextlib.contextmanager
def claimed_for(out_dir, task: str):
    """Hold `out_dir` for a task that writes files of its own there rather than samples (compare, report,
    dashboard, prior, train, regenerate): the same lock as a run (busy -> refused), and a directory holding another
    run's results (its run.json, samples.jsonl or summary.json) is refused before anything is written, as a run with
    other settings would be."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    held = lock(d / LOCK)
    try:
        found = [n for n in (RUN, SAMPLES, SAMPLES + ".gz", SUMMARY) if (d / n).exists()]
        if found:
            raise UserError(f"hydra.run.dir={d} holds another run's results ({found[0]}); task={task} writes its "
                            f"files into a directory of its own: choose another hydra.run.dir")
        yield d
        # Recorded once the task succeeded: these tasks may still refuse their input after claiming (a training
        # corpus is read inside), and a refused command leaves the directory as it was.
        record_command(d)
    finally:
        held.close()


def lock(path: Path):
    """An exclusive, non-blocking flock on `path`. The lock file itself is never removed (removing it would let a
    second process lock a new file while the first still holds the old one); a leftover file does not block."""
    f = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise UserError(f"{path.parent} is in use by another run{f' (pid {holder})' if holder else ''}; wait for it "
                        f"to finish or choose another hydra.run.dir") from None
    return f
