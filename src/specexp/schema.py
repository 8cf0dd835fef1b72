"""The typed config's building blocks: a group of the config is a frozen dataclass whose fields are its keys,
whose annotations are their types and whose `setting(..., rule=...)` metadata says what values are valid.

One schema, read three ways:
  check      `check(values, cls)` walks a composed config (plain containers) against the dataclass: an unknown
             key, a wrong type or a value its rule refuses is one `UserError` line naming the key and what would
             be valid (config.validate calls it before any work)
  typed view `cls.from_cfg(node)` is the frozen object the code reads (`EvalConfig.max_new_tokens`)
  keys       `key_tree(cls)` lists the valid keys for the unknown-key message

The YAML files under conf/ are presets of these dataclasses (tests/test_configs.py checks that every preset key
has its field). A drafter's own keys are the `settings` dataclass of its registry entry, declared in its module,
so a new drafter touches no central table. This module imports nothing of specexp but `errors`: the drafters
(core) declare their settings with it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from dataclasses import MISSING, dataclass, field, fields

from .errors import UserError

# Upper bounds of the size-like keys: far above any real setting (the paper's recipes are in parentheses), low
# enough that a typo (an extra zero or three) is refused before it allocates memory or spins for hours.
CORES = os.cpu_count() or 1                  # torch threads beyond the machine's cores only contend
MAX_TOKENS = 1 << 20                         # one sequence's tokens: context, new tokens, length (Qwen3: 40,960)
MAX_SHARD_TOKENS = 1 << 24                   # tokens per feature shard on disk (paper: 1,048,576)
MAX_COUNT = 10 ** 7                          # prompts or records to take (the largest benchmark holds 1,319)
MAX_WIDTH = 1 << 16                          # hidden / MLP / GRU widths (Qwen3-8B: 4,096 and 12,288)
MAX_HEADS = 1024                             # attention heads (Qwen3-8B: 32)
MAX_LAYERS = 256                             # decoder layers (Qwen3-8B: 36; drafters: 1 to 5)
MAX_BLOCK = 1024                             # drafts per round: block size, chain drafts, edit windows (DFlash: 16)
MAX_BATCH = 4096                             # prompts per generation batch, anchors per training step (paper: 512)
MAX_STEPS = 10 ** 9                          # epochs, steps, passes: loops, not memory, but never a typo's 10^12
DTYPES = ("float32", "bfloat16", "float16")


# ------------------------------------------------------------------------------------------- predicates
def is_int(lo=None, hi=None):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (
        hi is None or v <= hi)


def is_num(lo=None, hi=None, lo_open=False):
    def ok(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or v <= hi)
    return ok


def null_or(pred):
    return lambda v: v is None or pred(v)


def one_of(*valid):
    return lambda v: v in valid and type(v) is type(next(x for x in valid if x == v))


def int_list(lo=0):
    return lambda v: isinstance(v, list) and len(v) > 0 and all(is_int(lo)(x) for x in v)


def nonempty_str(v) -> bool:
    return isinstance(v, str) and v != ""


def upto(hi: int, what: str = "") -> str:
    return f"at most {hi:,}{f' ({what})' if what else ''}"


# ------------------------------------------------------------------------------------------- settings
def setting(default=MISSING, rule=None, valid: str = "", *, factory=MISSING):
    """A key: its default (the YAML presets set the real values) and, optionally, `rule` (value -> bool) with
    `valid`, the words the error line uses for what it accepts. A key without a rule is checked by its type."""
    meta = {"rule": (rule, valid)} if rule is not None else {}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def choice(*valid, default=MISSING, words: str = ""):
    """A key that takes one of `valid` (the error line lists them: 'a, b or c')."""
    names = ["null" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in valid]
    return setting(default if default is not MISSING else valid[0], one_of(*valid),
                   words or (", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]))


class Settings:
    """Base of the typed config groups: `from_cfg` checks a group and builds the frozen view the code reads.
    `KEY` is the group's place in the config, for the error lines ("eval", "train.fsdp", "drafter")."""

    KEY = ""

    @classmethod
    def check_values(cls, mine: dict, whole: dict) -> None:
        """Rules over several of the group's keys (`mine`), or against the rest of the composed config (`whole`,
        plain containers; {} when a group is checked alone): raise a one-line `UserError`. A group overrides this;
        its field rules have passed before it is called."""

    def replaced(self, where: str = "", **changes):
        """A copy with `changes`, checked as the config would be (`where`: the group's key, e.g. "decoding")."""
        check(changes, type(self), where or self.KEY)
        new = dataclasses.replace(self, **changes)
        type(self).check_values(dataclasses.asdict(new), {})
        return new

    @classmethod
    def from_cfg(cls, node, where: str | None = None):
        """The checked, frozen view of a config group (a DictConfig or a mapping): the same one-line errors as
        config.validate, so code that is handed a group directly reads only valid values."""
        from omegaconf import OmegaConf

        d = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})
        check(d, cls, cls.KEY if where is None else where)
        cls.check_values(d, {})
        return cls.from_dict(d)

    @classmethod
    def of(cls, node):
        """`node` itself when it is already this view, else `from_cfg(node)`: functions that take a group accept
        either (the tasks hand them views; tests may hand them a composed DictConfig group)."""
        return node if isinstance(node, cls) else cls.from_cfg(node)

    def to_dict(self) -> dict:
        """Plain containers, nested groups included (what OmegaConf.to_container gives of the composed group)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        hints, kw = hints_of(cls), {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v, sub = d[f.name], nested(hints[f.name])
            kw[f.name] = sub.from_dict(v) if sub is not None and isinstance(v, dict) else v
        return cls(**kw)


@functools.cache
def hints_of(cls) -> dict:
    """Field name -> annotation, resolved in the module of the class that declares each field (a subclass in
    another module, e.g. DeLSSettings over DFlashSettings, resolves its base's names in the base's module)."""
    return typing.get_type_hints(cls)


def nested(annotation) -> type | None:
    """The Settings dataclass an annotation holds (`FsdpConfig`, `FsdpConfig | None`), else None."""
    for a in _members(annotation):
        if isinstance(a, type) and dataclasses.is_dataclass(a):
            return a
    return None


def _members(annotation) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", type(None): "null"}


def type_tag(v) -> str:
    for t, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (list, "list"), (dict, "dict")):
        if isinstance(v, t):
            return name
    return "null" if v is None else type(v).__name__


def _accepts(annotation, v) -> bool:
    if annotation is typing.Any:
        return True
    for a in _members(annotation):
        base = typing.get_origin(a) or a
        if base is typing.Any or (a is type(None) and v is None):
            return True
        if base is bool and isinstance(v, bool) or base is str and isinstance(v, str):
            return True
        if base is int and isinstance(v, int) and not isinstance(v, bool):
            return True
        if base is float and isinstance(v, (int, float)) and not isinstance(v, bool):    # ints are floats too
            return True
        if base is list and isinstance(v, list) or base is dict and isinstance(v, dict):
            return True
        if isinstance(base, type) and dataclasses.is_dataclass(base) and isinstance(v, dict):
            return True
    return False


def _expected(annotation) -> str:
    names = sorted({_NAMES.get(typing.get_origin(a) or a, "a mapping") for a in _members(annotation)})
    return " or ".join(names)


def _fmt(v, limit: int = 300) -> str:
    """A value as an error line shows it: null for None, else its repr, cut to `limit` characters (a 3,000-item
    list override must not become a 17 KB line), saying how many items or characters it had."""
    text = "null" if v is None else repr(v)
    if len(text) <= limit:
        return text
    size = f"{len(v):,} items" if isinstance(v, (list, dict, tuple)) else f"{len(text):,} characters"
    return f"{text[:limit]}… ({size})"


def key_tree(cls) -> dict:
    """Dotted-key tree of a Settings class (nested groups as sub-trees), for the unknown-key message."""
    hints = hints_of(cls)
    return {f.name: (key_tree(sub) if (sub := nested(hints[f.name])) is not None else None) for f in fields(cls)}


def rules(cls, prefix: str) -> dict[str, tuple]:
    """Dotted key -> (rule, valid) of a Settings class, nested groups included."""
    hints, out = hints_of(cls), {}
    for f in fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if "rule" in f.metadata:
            out[key] = f.metadata["rule"]
        if (sub := nested(hints[f.name])) is not None:
            out |= rules(sub, key)
    return out


def check(values: dict, cls, path: str = "", unknown=None) -> None:
    """Check a mapping against a Settings class: every key known, every value of its type and within its rule.
    Raises a one-line `UserError` on the first fault; `unknown(key)` words the unknown-key line."""
    hints = hints_of(cls)
    by_name = {f.name: f for f in fields(cls)}
    for k, v in values.items():
        key = f"{path}.{k}" if path else str(k)
        f = by_name.get(k)
        if f is None:
            raise UserError(unknown(key) if unknown else f"unknown key '{key}'; valid keys: {', '.join(by_name)}")
        if "rule" in f.metadata:
            ok, valid = f.metadata["rule"]
            if not ok(v):
                raise UserError(f"{key}={_fmt(v)} is not valid; expected {valid}")
            continue
        sub = nested(hints[k])
        if sub is not None and isinstance(v, dict):
            check(v, sub, sub.KEY or key, unknown)       # a group's own KEY: drafter.fusion is `fusion` (${fusion})
        elif sub is not None and v is not None and not _accepts(hints[k], v):
            raise UserError(f"{key}={_fmt(v)} must be a mapping with keys: {', '.join(key_tree(sub))}")
        elif not _accepts(hints[k], v):
            raise UserError(f"{key}={_fmt(v)} has type {type_tag(v)}; expected {_expected(hints[k])}")


def target_layers(target: dict) -> int | None:
    """The target's decoder layer count when the config alone tells it (tiny_qwen3, or a local directory)."""
    import json
    from pathlib import Path

    if target.get("loader") == "tiny_qwen3":
        return target.get("num_layers")
    path = target.get("path")
    if isinstance(path, str) and (Path(path).expanduser() / "config.json").is_file():
        try:
            n = json.loads((Path(path).expanduser() / "config.json").read_text()).get("num_hidden_layers")
        except (OSError, ValueError, AttributeError):
            return None                          # the target loader reports an unreadable config itself
        return n if is_int(1)(n) else None
    return None


def frozen(cls):
    """`@frozen` = a frozen dataclass, keyword-only, that is a Settings group."""
    return dataclass(frozen=True, kw_only=True)(cls)


# ------------------------------------------------------------------------------------------- a shared group
def _fusion_weight(v):
    return v == "learned" or is_num()(v) or (isinstance(v, list) and len(v) > 0 and all(is_num()(x) for x in v))


FUSION_WEIGHT = "a finite number, a list of them, or 'learned'"


@frozen
class FusionConfig(Settings):
    """`fusion`: the DeLS fusion weights and the fused kernel's choices. The one group that lives here, not in
    config.py: the drafters that read it (DeLS, Domino-FT: `drafter.fusion: ${fusion}`) declare it in their
    settings, and they may not import config.py (it sits above them)."""
    KEY = "fusion"
    alpha: typing.Any = setting(0.3, _fusion_weight, FUSION_WEIGHT)
    beta: typing.Any = setting(0.3, _fusion_weight, FUSION_WEIGHT)
    kernel: str = choice("auto", "triton", "torch")
    cuda_graph: typing.Any = choice("auto", True, False)
    # adaptive weights (kernels/adaptive.py; fusion=entropy | gate): null = alpha / beta as given; the parameters
    # of the chosen form in `schedule` (checked when the drafter is built)
    adaptive: typing.Any = choice(None, "entropy", "gate")
    schedule: dict = setting(factory=dict)


def ints(lo: int, hi: int) -> tuple:
    """The rule and words of an int in [lo, hi] (`setting(default, *ints(lo, hi))`)."""
    return is_int(lo, hi), f"an int >= {lo}; {upto(hi)}"
