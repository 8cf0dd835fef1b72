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
REQUIRED fields, is refused in one line naming the file and line: it is not ours to guess. The readers of a
run directory's files, the lock, and `claimed_for` (a task that writes files of its own there: compare, prior)
live one floor below, in rundir.py, which every task shares.
The caller validates everything (config, models, benchmark files) before it opens the store, so a run
that fails validation leaves the directory as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import files, log
from ..errors import UserError, check
from ..files import write_json, write_text_atomic
from ..rundir import LOCK, RUN, SAMPLES, SUMMARY, lock, read_records
from ..tracking import record_command

_log = log.get(__name__)
FORMAT = 2                   # run.json layout; format 1 (a flat fingerprint, no samples) is refused as different


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


