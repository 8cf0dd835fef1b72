"""`task=merge`: the shard directories of one sharded run (`eval.shard=I/N`, eval/shards.py) -> one run directory
holding what the unsharded run would have written.

  python -m specexp task=merge merge.runs='[DIR0,DIR1]' hydra.run.dir=OUT

Checked first, each refusal one line, nothing written: every entry is a shard directory (or holds some), none in
use by a running process; every shard finished (all the samples of its run.json recorded, every turn once, no
torn line, a summary.json that counts them); the shards belong to one run (run.json settings equal but for the
shard index, one shard count, one unsharded selection) and cover shards 0..N-1 exactly once; OUT is not one of
them and holds no other results (rerunning the same merge into OUT rewrites the same files).

Written into OUT (atomically, the evaluator's files): run.json = the unsharded run's (settings without the shard,
the samples of the whole selection in its order), so OUT is the unsharded run's directory and the unsharded
command resumes there with nothing left to run; samples.jsonl = every shard's records in the unsharded order
(benchmark, then the selection's order, then turn), which the bootstrap CIs depend on; summary.json from those
records by the evaluator's own summary code (`summary.summarize_records`): τ, CIs, histograms, acceptance and
lossless mismatches equal the unsharded run's on the same records; speedup, TPOT and TTFT use the same formulas
over all timed turns (each turn's AR and drafter timings come from one process, on its shard's machine; with
`eval.timed_samples` the shards time the unsharded run's subset, eval/shards.py); summary.md;
config.yaml (the first shard's, eval.shard null); run_info.json (the merging process's, plus every shard's).
No model is loaded.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from .. import log, registry
from ..config import Config, checked
from ..errors import UserError, check
from ..files import write_json, write_text_atomic
from ..rundir import CONFIG, LOCK, RUN, RUN_INFO, SAMPLES, SUMMARY, lock, read_records, read_text
from ..tracking import record_command, run_info
from . import run as run_skeleton
from .shards import Shard, part
from .store import FORMAT, settings_diff
from .summary import SUMMARY_HEADER, summarize_records


@dataclass
class ShardRun:
    dir: Path
    shard: Shard
    settings: dict                          # run.json settings without the shard
    selection: dict[str, list[str]]         # the unsharded selection, in order
    plan: dict[str, dict[str, str]]         # this shard's samples: {benchmark: {id: prompt digest}}
    records: list[dict]
    summary: dict
    config: str
    info: dict | None


def _runs_below(root: Path) -> list[Path]:
    """The directories below `root` holding a run.json, symlinked directories followed (a folder of links to the
    shards is a directory of runs) but each real directory visited once (a link cycle ends), hidden ones skipped."""
    out, seen = [], set()
    for here, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(here)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        if RUN in names and Path(here) != root:
            out.append(Path(here))
    return out


def run_dirs(entries) -> list[Path]:
    """The run directories that `merge.runs` names: each entry itself when it holds a run.json, else the run
    directories below it (any depth; hidden directories such as a launcher's .submitit/ skipped), sorted."""
    out = []
    for entry in entries:
        d = Path(str(entry)).expanduser()
        check(d.is_dir(), f"merge.runs: {entry} is not a directory")
        if (d / RUN).is_file():
            out.append(d)
            continue
        found = sorted(_runs_below(d))
        check(bool(found), f"merge.runs: {entry} holds no {RUN}: neither a run directory nor a directory of runs")
        out += found
    seen: dict[Path, Path] = {}
    for d in out:
        check(d.resolve() not in seen, f"merge.runs names {d} twice (also as {seen.get(d.resolve())}); keep one")
        seen[d.resolve()] = d
    return out


def _unfinished(d: Path, shard, why: str) -> UserError:
    return UserError(f"{d} (shard {shard}) is unfinished: {why}; rerun its command to finish it, then merge")


def _json(path: Path) -> dict:
    """A shard's JSON file (run.json, summary.json, run_info.json) as an object, or one line naming it."""
    try:
        obj = json.loads(read_text(path))
    except json.JSONDecodeError:
        raise UserError(f"{path} is corrupt (not JSON); it is not a directory this merge can read") from None
    check(isinstance(obj, dict), f"{path} is corrupt (not a JSON object); it is not a directory this merge can read")
    return obj


def read_shard(d: Path) -> ShardRun:
    """One shard directory, checked to be a finished shard (see the module docstring)."""
    run = _json(d / RUN)
    check(run.get("format") == FORMAT, f"{d / RUN} is of an older format than this merge")
    sh = (run.get("settings") or {}).get("shard")
    check(isinstance(sh, dict) and "selection" in run and "samples" in run,
          f"{d} is not a shard: its {RUN} has no eval.shard (merge takes the directories of a run made with "
          f"eval.shard=I/N for I = 0..N-1)")
    shard = Shard(sh["index"], sh["count"])
    records, torn = read_records(d / SAMPLES)
    if torn:
        raise _unfinished(d, shard, f"its {SAMPLES} ends in a torn line")
    for name in (SUMMARY, CONFIG):
        if not (d / name).is_file():
            raise _unfinished(d, shard, f"it has no {name}")
    plan = run["samples"]
    turns: dict[tuple[str, str], list[int]] = {}
    for r in records:
        turns.setdefault((r["benchmark"], r["id"]), []).append(r.get("turn", 0))
    outside = [k for k in turns if k[1] not in plan.get(k[0], {})]
    if outside:
        raise UserError(f"{d} (shard {shard}) holds records of a sample its {RUN} does not list, e.g. "
                        f"{outside[0][1]!r}; it is not a directory this merge can read")
    missing = [(b, i) for b, ids in plan.items() for i in ids if (b, i) not in turns]
    if missing:
        n = sum(map(len, plan.values()))
        raise _unfinished(d, shard, f"{len(missing)} of its {n} samples have no results, e.g. {missing[0][1]!r}")
    repeated = next(((k, t) for k, t in turns.items() if len(set(t)) < len(t)), None)
    if repeated:
        (bench, i), t = repeated
        turn = next(x for x in t if t.count(x) > 1)
        raise UserError(f"{d / SAMPLES} holds turn {turn} of {bench}/{i} twice (shard {shard}); a run holds one "
                        f"record a turn: rerun the shard's command (it drops the repeat and keeps the rest), then "
                        f"merge")
    gaps = [k for k, t in turns.items() if sorted(t) != list(range(len(t)))]
    if gaps:
        raise _unfinished(d, shard, f"sample {gaps[0][1]!r} has turns {sorted(turns[gaps[0]])}")
    summary = _json(d / SUMMARY)
    counted = {b: v.get("num_turns") for b, v in (summary.get("benchmarks") or {}).items()}
    recorded = {b: sum(len(t) for (bb, _), t in turns.items() if bb == b) for b in plan if plan[b]}
    if counted != recorded:
        raise _unfinished(d, shard, f"its {SUMMARY} counts other turns than its {SAMPLES} holds")
    info = _json(d / RUN_INFO) if (d / RUN_INFO).is_file() else None
    settings = {k: v for k, v in run["settings"].items() if k != "shard"}
    return ShardRun(d, shard, settings, run["selection"], plan, records, summary,
                    (d / CONFIG).read_text(encoding="utf-8"), info)


def check_one_run(runs: list[ShardRun]) -> None:
    """The shards belong to one run and cover each of its N shards exactly once."""
    first = runs[0]
    for s in runs[1:]:
        diff = settings_diff(first.settings, s.settings, (str(first.dir), str(s.dir)))
        check(diff is None, f"merge.runs: {first.dir} and {s.dir} are shards of different runs ({diff}); merge the "
                            f"shards of one run")
        check(s.shard.count == first.shard.count,
              f"merge.runs: {first.dir} is shard {first.shard} and {s.dir} is shard {s.shard}: different splits")
        check(list(s.selection.items()) == list(first.selection.items()),
              f"merge.runs: {first.dir} and {s.dir} split different prompt selections (eval.num_samples, "
              f"eval.shuffle_seed, the benchmarks or their files differ); merge the shards of one run")
        for key in SUMMARY_HEADER:
            check(s.summary.get(key) == first.summary.get(key),
                  f"merge.runs: {first.dir} and {s.dir} have different summaries ({key}: "
                  f"{first.summary.get(key)!r} vs {s.summary.get(key)!r})")
    by_index: dict[int, ShardRun] = {}
    for s in runs:
        other = by_index.setdefault(s.shard.index, s)
        check(other is s, f"merge.runs: shard {s.shard} is given twice ({other.dir} and {s.dir}); keep one")
    n = first.shard.count
    missing = [f"{i}/{n}" for i in range(n) if i not in by_index]
    check(not missing, f"merge.runs: shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing "
                       f"(given: {', '.join(str(s.shard) for s in sorted(runs, key=lambda s: s.shard.index))}); "
                       f"add {'their directories' if len(missing) > 1 else 'its directory'}")
    for s in runs:
        for bench, ids in s.selection.items():
            check(list(s.plan.get(bench, {})) == part(ids, s.shard),
                  f"{s.dir} (shard {s.shard}) does not hold shard {s.shard} of its selection ({bench}); it was not "
                  f"written by eval.shard={s.shard}")


def merged(runs: list[ShardRun]) -> tuple[dict, list[dict]]:
    """The unsharded run's run.json and its records in the unsharded order."""
    first = runs[0]
    owner = {(b, i): s for s in runs for b, ids in s.plan.items() for i in ids}
    by_sample: dict[tuple[str, str], list[dict]] = {}
    for s in runs:
        for r in s.records:
            by_sample.setdefault((r["benchmark"], r["id"]), []).append(r)
    records = [r for b, ids in first.selection.items() for i in ids
               for r in sorted(by_sample[(b, i)], key=lambda r: r.get("turn", 0))]
    plan = {b: {i: owner[(b, i)].plan[b][i] for i in ids} for b, ids in first.selection.items()}
    return {"format": FORMAT, "settings": first.settings, "samples": plan}, records


def _claim(out: Path, run: dict, text: str) -> None:
    """OUT may hold nothing but (from an earlier run of this merge) these very files."""
    old_records, torn = read_records(out / SAMPLES)
    if not (old_records or torn or (out / SUMMARY).exists()):
        return
    why = None
    try:
        old = json.loads((out / RUN).read_text(encoding="utf-8")) if (out / RUN).is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        old = None
    if old != run:
        why = (settings_diff(old.get("settings", {}), run["settings"], ("there", "merged"))
               if isinstance(old, dict) else None) or "another run"
    elif (out / SAMPLES).read_text(encoding="utf-8") != text:
        why = f"the same run, with other records in its {SAMPLES}"
    check(why is None, f"hydra.run.dir={out} holds other results ({why}); choose an empty directory for the merge")


def run_merge(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=merge`: see the module docstring. Returns the merged summary."""
    out, typed = Path(out_dir), checked(cfg, typed)
    mg = typed.merge
    check(mg is not None and len(mg.runs) > 0, "merge.runs is empty; name the shard directories of one run, e.g. "
                                               "merge.runs='[DIR0,DIR1]', or the directory holding them")
    dirs = run_dirs(mg.runs)
    check(not any(d.resolve() == out.resolve() for d in dirs),
          f"hydra.run.dir={out} is one of merge.runs; the merged run needs a directory of its own")
    held = []
    try:
        for d in dirs:                        # no run may write into a shard while it is read
            try:
                held.append(lock(d / LOCK))
            except PermissionError:           # a read-only copy of a shard: nothing can write there either
                pass
        out.mkdir(parents=True, exist_ok=True)
        held.append(lock(out / LOCK))
        runs = [read_shard(d) for d in dirs]
        check_one_run(runs)
        run, records = merged(runs)
        text = "".join(json.dumps(r) + "\n" for r in records)
        _claim(out, run, text)
        record_command(out)
        first = runs[0]
        header = {k: first.summary[k] for k in SUMMARY_HEADER}
        if all("target_dtype" in r.summary for r in runs):         # one dtype: run.json's settings are the same
            header["target_dtype"] = first.summary["target_dtype"]
        if "batch_size" in first.summary:                           # shards of one run: one batch (run.json's eval)
            header["batch_size"] = first.summary["batch_size"]
        if "references_source" in first.summary:                    # replays: one reference set (run.json's)
            header["references_source"] = first.summary["references_source"]
        if "timed" in first.summary:                                # a timed subset: its ids come from the records
            header["timed"] = {k: v for k, v in first.summary["timed"].items() if k != "ids"}
        machines = [r.summary["machine"] for r in runs if "machine" in r.summary]
        if machines:                                                # shards may have run on different machines
            distinct = [m for i, m in enumerate(machines) if m not in machines[:i]]
            header["machine"] = distinct[0] if len(distinct) == 1 else distinct
        metrics = registry.drafter_entry(first.settings["drafter"]["name"]).metrics
        summary = summarize_records(records, list(first.selection), header, metrics)
        config = OmegaConf.create(first.config)
        OmegaConf.update(config, "eval.shard", None)
        import torch

        info = {"merged_by": run_info(torch.device("cpu")),
                "shards": [{"dir": str(s.dir), "shard": str(s.shard), **(s.info or {})}
                           for s in sorted(runs, key=lambda s: s.shard.index)]}
        # run.json first: a merge cut short leaves OUT claimable by the same merge (or empty of results)
        write_json(out / RUN, run)
        write_text_atomic(out / SAMPLES, text)
        run_skeleton.start(config, out, info)
        # W&B (job type merge): the merged run's config (the shards' task, drafter, ...) and summary
        logger = run_skeleton.logger(typed, config, out, f"{summary['drafter']}-{summary['target']}", "merge")
        md = run_skeleton.publish(out, summary, logger, "merge")
    finally:
        for f in held:
            f.close()
    log.LOG.info(f"merged {len(runs)} shards into {out}")
    log.table(md)
    return summary
