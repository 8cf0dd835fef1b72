"""The calibration files `task=plan` projects from (step costs measured on a device: `task=plan` without
`plan.calibration`, or scripts/gpu_check.sh on a GPU), read and checked field by field. Torch-free and at the
bottom floor, so config.validate refuses a damaged file before any work (eval/plan.py measures and projects)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import UserError, check
from .schema import MAX_BLOCK, MAX_TOKENS

CALIBRATION_VERSION = 1

# A step's cost in ms is a finite number above 0 and at most an hour (far above any device's): the projection
# multiplies it by up to millions of tokens, and a 1e308 would overflow to inf and nan, printed as a plan.
MAX_STEP_MS = 3.6e6


def _ms(v, zero: bool = False) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (v >= 0 if zero else v > 0) and v <= MAX_STEP_MS)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_TOKENS


def _by_size(cal: dict, key: str, what: str, points: int | None = None) -> str | None:
    """Why `cal[key]` is not a mapping {size: ms} (sizes: ints >= 1 written as strings, as JSON keys are), or None."""
    table = cal[key]
    if not isinstance(table, dict) or not table:
        return f"{key} is {_clip(table)}; expected a non-empty mapping {{{what}: ms}}"
    for k, v in table.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and _count(int(k)) and str(int(k)) == k):
            return f"{key} has the key {k!r}; expected {what}s, ints >= 1 (at most {MAX_TOKENS:,})"
        if not _ms(v):
            return f"{key}[{k!r}] is {_clip(v)}; expected ms, a finite number > 0 and at most {MAX_STEP_MS:g}"
    if points is not None and len(table) != points:
        return f"{key} has {len(table)} {what}(s); expected {points} (the two measured lengths)"
    return None


def _clip(v) -> str:
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return text if len(text) <= 60 else text[:60] + "…"


def calibration_fault(cal) -> str | None:
    """What makes `cal` not a calibration `project` can use (the field and why, for the one line), or None. Every
    field the projection reads is checked here, so a hand-edited or foreign file is refused before any work rather
    than failing deep in the arithmetic or printing a plan of nan hours."""
    if not isinstance(cal, dict):
        return f"it holds a JSON {type(cal).__name__}, not an object"
    if cal.get("version") != CALIBRATION_VERSION:
        return f"version is {_clip(cal.get('version'))}; this specexp reads {CALIBRATION_VERSION}"
    need = ("ar_step_ms", "prefill_ms_per_token", "teacher_forced_ms_per_token", "verify_ms", "drafters")
    missing = [k for k in need if k not in cal]
    if missing:
        return f"no {', '.join(missing)}"
    for key, what in (("ar_step_ms", "batch size"), ("verify_ms", "verified row count")):
        if (why := _by_size(cal, key, what)) is not None:
            return why
    if "ar_step_ms_long" in cal:                 # the second context: `step_ms` interpolates between the two
        if (why := _by_size(cal, "ar_step_ms_long", "batch size")) is not None:
            return why
        if set(cal["ar_step_ms_long"]) != set(cal["ar_step_ms"]):
            return "ar_step_ms_long is measured at other batch sizes than ar_step_ms"
        for key in ("context", "context_long"):
            if not _count(cal.get(key)):
                return f"{key} is {_clip(cal.get(key))}; expected an int >= 1 (tokens)"
        if cal["context_long"] <= cal["context"]:
            return f"context_long={cal['context_long']} is not longer than context={cal['context']}"
    for kind in ("prefill", "teacher_forced"):
        if f"{kind}_ms" in cal and (why := _by_size(cal, f"{kind}_ms", "length", points=2)) is not None:
            return why
        if not _ms(cal[f"{kind}_ms_per_token"]):
            return (f"{kind}_ms_per_token is {_clip(cal[f'{kind}_ms_per_token'])}; expected ms, a finite number > 0 "
                    f"and at most {MAX_STEP_MS:g}")
    if "tap_write_ms_per_token_layer" in cal and not _ms(cal["tap_write_ms_per_token_layer"], zero=True):
        return (f"tap_write_ms_per_token_layer is {_clip(cal['tap_write_ms_per_token_layer'])}; expected ms, a "
                f"finite number >= 0")
    if not isinstance(cal.get("machine", {}), dict):
        return f"machine is {_clip(cal['machine'])}; expected a mapping (device, cpu or gpu)"
    if not isinstance(cal["drafters"], dict):
        return f"drafters is {_clip(cal['drafters'])}; expected a mapping {{drafter: its step costs}}"
    for name, d in cal["drafters"].items():
        if not isinstance(d, dict):
            return f"drafters.{name} is {_clip(d)}; expected a mapping (max_drafts, taps, propose_ms, replay_anchor_ms)"
        if not (_count(d.get("max_drafts")) and d["max_drafts"] <= MAX_BLOCK):
            return f"drafters.{name}.max_drafts is {_clip(d.get('max_drafts'))}; expected an int >= 1 (at most " \
                   f"{MAX_BLOCK:,})"
        taps = d.get("taps")
        if not (isinstance(taps, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in taps)):
            return f"drafters.{name}.taps is {_clip(taps)}; expected a list of target layer ids (ints >= 0)"
        for key in ("propose_ms", "replay_anchor_ms"):
            if not _ms(d.get(key)):
                return (f"drafters.{name}.{key} is {_clip(d.get(key))}; expected ms, a finite number > 0 and at most "
                        f"{MAX_STEP_MS:g}")
    return None


def read_calibration(path) -> dict:
    """A calibration file, checked (`calibration_fault`): one line naming the file and what is wrong."""
    p = Path(path).expanduser()
    check(p.is_file(), f"plan.calibration={str(path)!r}: no such file (write one with task=plan and no "
                       "plan.calibration, or with scripts/gpu_check.sh)")
    try:
        cal = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"plan.calibration={str(path)!r} is not a calibration file ({type(e).__name__})") from None
    fault = calibration_fault(cal)
    check(fault is None, f"plan.calibration={str(path)!r} is not a calibration file: {fault}")
    return cal


