"""The results directory of one run, and the rules for running into a directory that already holds one.

A run directory belongs to one run, described by `run.json`:
  {"format": 2, "settings": {...every setting that changes a result...},
   "samples": {benchmark: {id: digest of the formatted prompt turns}}}
(a shard of a run, `eval.shard=I/N`, adds `settings.shard = {index, count}` and `selection`, the unsharded
run's samples {benchmark: [ids]} in order: eval/shards.py), and its results are `samples.jsonl` (one record per
turn, appended as each sample finishes) plus the files written from them. A run that opens a directory
(`ResultStore(dir, settings, samples)`) gets, in this order:
  busy      another process holds `dir/.lock` (an OS lock, gone when its holder dies) -> refused;
  fresh     no results yet (no `samples.jsonl` content, no `summary.json`) -> claimed, whatever `run.json` says;
  same      same settings, and every recorded sample (one with records in samples.jsonl) is among this run's
            samples with the same prompt -> resumed: finished samples are kept, the rest are run. This covers
            the same command and a larger selection (a larger `eval.num_samples`, another benchmark next to
            the recorded ones): the directory then holds exactly what a fresh run of this command would;
  other     anything else (a setting, a selection that leaves a recorded sample out, a changed prompt)
            -> refused, nothing in `dir` touched.
A sample counts as done only when all its turns are recorded; on opening, an unterminated last line (a crash or
a full disk mid-append), the records of a partly written sample and repeated records are dropped (the file is
rewritten atomically), so those samples are redone. A corrupt line anywhere else, or a record without the
REQUIRED fields, is refused in one line naming the file and line: it is not ours to guess. `read_records` is the
one reader of samples.jsonl (plain or gzipped): compare, merge, the report and the experiment scripts read run
directories through it (`run_records`). A task that writes its own files into a run directory (compare, prior)
holds it by `claimed_for`: the same lock, and never a directory holding another run's results.
The caller validates everything (config, models, benchmark files) before it opens the store, so a run
that fails validation leaves the directory as it was.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
from pathlib import Path

from .. import files, log
from ..errors import UserError, check
from ..files import write_json, write_text_atomic
from ..tracking import record_command

_log = log.get(__name__)
FORMAT = 2                   # run.json layout; format 1 (a flat fingerprint, no samples) is refused as different
LOCK, RUN, SAMPLES, SUMMARY = ".lock", "run.json", "samples.jsonl", "summary.json"


def prompt_digest(sample) -> str:
    """Digest of what the model is asked: benchmark, id and every formatted user turn."""
    blob = json.dumps([sample.benchmark, sample.id, list(sample.turns)], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _is_doc(p: Path) -> bool:
    return p.name.startswith(".") or p.suffix == ".md" or p.name == "card.json"


def content_digest(path: str | os.PathLike) -> str:
    """Digest of a file, or of the files under a directory (relative names and bytes; the card, READMEs and hidden
    files left out): a checkpoint retrained in place is a different run even though its path is the same."""
    root = Path(path)
    h = hashlib.sha256()
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not _is_doc(p)]
    for f in sorted(files):
        h.update(f"{f.relative_to(root) if f != root else f.name}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()[:16]


def sample_plan(samples) -> dict[str, dict[str, str]]:
    """{benchmark: {id: prompt digest}}, the `samples` entry of run.json."""
    plan: dict[str, dict[str, str]] = {}
    for s in samples:
        plan.setdefault(s.benchmark, {})[s.id] = prompt_digest(s)
    return plan


def _flat(d, prefix="") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def settings_diff(recorded: dict, wanted: dict, labels: tuple[str, str] = ("recorded", "now")) -> str | None:
    """The settings that differ, as dotted keys with both values (`seed: recorded 0, now 1`), or None."""
    a, b = _flat(recorded), _flat(wanted)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))
    if not keys:
        return None

    def show(v):
        text = "unset" if v == "<unset>" else repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [f"{k}: {labels[0]} {show(a.get(k, '<unset>'))}, {labels[1]} {show(b.get(k, '<unset>'))}"
             for k in keys[:3]]
    return "; ".join(parts) + (f"; and {len(keys) - 3} more" if len(keys) > 3 else "")


def samples_diff(recorded: dict, wanted: dict, keys: set[tuple[str, str]]) -> str | None:
    """Why the recorded samples `keys` ((benchmark, id) with records) cannot continue into the plan `wanted`,
    or None when every one of them is in it with the prompt `recorded` (the old plan) names."""
    benches = {b for b, _ in keys}
    if not benches <= set(wanted):
        return f"benchmarks recorded: {', '.join(sorted(benches))}; this run: {', '.join(sorted(wanted))}"
    for bench in sorted(benches):
        ids = sorted(i for b, i in keys if b == bench)
        missing = [i for i in ids if i not in wanted[bench]]
        if missing:
            return (f"{len(missing)} of the {len(ids)} recorded {bench} samples are not in this run's selection, "
                    f"e.g. {missing[0]!r}: a smaller eval.num_samples, another eval.shuffle_seed or benchmark.source")
        changed = [i for i in ids if recorded.get(bench, {}).get(i) != wanted[bench][i]]
        if changed:
            return (f"the prompt of {len(changed)} recorded {bench} sample(s) differs, e.g. {changed[0]!r}: the "
                    f"benchmark file changed")
    return None


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


class ResultStore:
    """Claims a run directory for one run (see the module docstring) and appends its samples.

    `settings`: every setting that changes a result (JSON-able). `samples`: the run's benchmark samples (the
    prompts are hashed into run.json, and a multi-turn sample counts as done only with all its turns); without
    them the recorded settings must match exactly and a sample is done when its recorded turns have no gap.
    `shard`: `shards.entry(...)` of a sharded run (its index and count join the settings), or None.
    Holds `dir/.lock` until `close()` (also a context manager; the OS drops the lock if the process dies).
    """

    def __init__(self, out_dir, settings: dict, samples=None, shard: dict | None = None):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.samples_file = self.dir / SAMPLES
        self._lock = lock(self.dir / LOCK)
        try:
            self._open(settings, samples, shard)
        except BaseException:
            self.close()
            raise

    def _open(self, settings: dict, samples, shard: dict | None = None) -> None:
        plan = sample_plan(samples) if samples is not None else None
        self.turns = {(s.benchmark, s.id): len(s.turns) for s in samples} if samples is not None else None
        if shard is not None:               # `shards.entry`: the shard is a setting, the full selection is not
            settings = {**settings, "shard": {"index": shard["index"], "count": shard["count"]}}
        wanted = {"format": FORMAT, "settings": settings, **({"samples": plan} if plan is not None else {}),
                  **({"selection": shard["selection"]} if shard is not None else {})}
        records, torn = read_records(self.samples_file)
        run_file = self.dir / RUN
        has_results = bool(records) or torn or (self.dir / SUMMARY).exists()
        if has_results:
            check(run_file.exists(), f"{self.dir} holds results but no {RUN}; choose another hydra.run.dir")
            try:
                old = json.loads(run_file.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise UserError(f"{run_file} is corrupt; choose another hydra.run.dir") from None
            why = self._why_not(old, wanted, {(r["benchmark"], r["id"]) for r in records})
            check(why is None, f"{self.dir} holds results of a different run ({why}); choose another hydra.run.dir "
                               f"or rerun with the recorded settings to resume")
        # Claimed from here on: repair, then record what this run is.
        self.records = self._complete(records)
        dropped = len(records) - len(self.records) + bool(torn)
        if torn or len(self.records) != len(records):
            write_text_atomic(self.samples_file, "".join(json.dumps(r) + "\n" for r in self.records))
        if has_results and self.turns is not None:          # said on the console and in specexp.log
            kept, total = len(self.done()), len(self.turns)
            _log.info(f"resuming {self.dir}: {kept} of {total} samples kept, {total - kept} to run"
                      + (f" ({dropped} unfinished record(s) dropped)" if dropped else ""))
        write_json(run_file, wanted)
        record_command(self.dir)            # command.json: the command line that wrote (or resumed) the run
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"{os.getpid()}\n")
        self._lock.flush()

    @staticmethod
    def _why_not(old: dict, wanted: dict, keys: set) -> str | None:
        if not isinstance(old, dict) or old.get("format") != FORMAT:
            return f"{RUN} is of an older format"
        diff = settings_diff(old.get("settings", {}), wanted["settings"])
        if diff:
            return diff
        if ("samples" in old) != ("samples" in wanted):
            return "one of them records its samples and the other does not"
        return samples_diff(old["samples"], wanted["samples"], keys) if "samples" in wanted else None

    def _complete(self, records: list[dict]) -> list[dict]:
        """The records of finished samples, each turn once (the first copy), in file order."""
        by_sample: dict[tuple, dict[int, dict]] = {}
        for r in records:
            by_sample.setdefault((r["benchmark"], r["id"]), {}).setdefault(r.get("turn", 0), r)
        done = set()
        for key, turns in by_sample.items():
            n = self.turns.get(key) if self.turns is not None else None
            if n is None:                   # not in the plan (no plan given): its records are all we know
                n = max(turns) + 1
            if set(turns) == set(range(n)):
                done.add(key)
        kept, seen = [], set()
        for r in records:
            key = (r["benchmark"], r["id"])
            if key in done and (key, r.get("turn", 0)) not in seen:
                seen.add((key, r.get("turn", 0)))
                kept.append(r)
        return kept

    def done(self) -> set[tuple[str, str]]:
        """(benchmark, id) of every finished sample."""
        return {(r["benchmark"], r["id"]) for r in self.records}

    def append(self, recs: list[dict]) -> None:
        """All turns of one finished sample, in one write (fsynced): a crash leaves at most a torn last line."""
        if len({(r["benchmark"], r["id"]) for r in recs}) != 1:
            raise ValueError("ResultStore.append takes the records of exactly one sample")
        files.append_text(self.samples_file, "".join(json.dumps(r) + "\n" for r in recs))
        self.records += recs

    def close(self) -> None:
        if self._lock is not None and not self._lock.closed:
            self._lock.close()              # closing the descriptor releases the flock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
