"""Typed config at the edge: the composed config (command line + experiment file + sweep file) is checked once,
before any work, and every mistake is one `UserError` line naming the key and what would be valid.

The schema of a config group is its option files, conf/<group>/*.yaml:
  keys    the chosen option's keys (the drafter's differ per drafter); an experiment or sweep file, or the
          command line, may change values but not add keys (`OPTIONAL_KEYS` lists the few read only when set)
  types   the types a key has in any option of its group: an int where the options have ints, a list where
          they have lists; ints are accepted where floats are; a key that is null (or an interpolation) in
          some option accepts anything there, and `RULES` then says what it really takes
  ranges  `RULES`: an explicit table (cpu_threads >= 1, block_size >= 2, ...), plus the checks that need the
          target's size (tap layer ids within its layers) when the config alone tells it
  bounds  every size-like key has an upper bound too (`MAX_*` below, in its rule), so that an extreme value is one
          line before anything is allocated and before the run directory is claimed, not a 10 GB allocation later

`validate(cfg)` is the whole check; the frozen dataclasses below are typed views of the groups whose keys are
the same for every option (eval, decoding, train, data), built with `from_cfg` from a validated config.
"""
from __future__ import annotations

import errno
import functools
import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .engine_export import FORMATS as EXPORT_FORMATS
from .engine_export import REPO_ID as EXPORT_REPO_ID
from .errors import UserError
from .eval.shards import VALID as SHARD_VALID
from .eval.shards import is_valid as shard_is_valid
from .paths import CONF_DIR

ANY = "any"                                  # the type tag of a null or interpolated option value
FREE_FORM = {"target.chat_kwargs", "eval.num_samples", "eval.tune_samples"}  # mappings whose keys are the user's
OPTIONAL_KEYS: dict[str, str] = {}          # key -> type tag of keys read with .get(), absent from every option file


def _device_pattern():
    from .machine import DEVICE  # the device grammar lives with the code that parses it

    return DEVICE


# ------------------------------------------------------------------------------------------- the schema
def conf_roots() -> list[Path]:
    """conf/ and the config directories of the drafters that `SPECEXP_PLUGINS` modules register."""
    if not os.environ.get("SPECEXP_PLUGINS"):
        return [CONF_DIR]
    from . import registry

    registry.load_plugins()
    return [CONF_DIR, *registry.config_dirs()]


def group_names() -> list[str]:
    """specexp's config groups: conf/'s directories but experiment/ (delta files) and hydra/ (Hydra's own groups,
    e.g. hydra/launcher: they configure Hydra, not the job)."""
    return sorted({d.name for r in conf_roots() for d in r.iterdir() if d.is_dir()
                   and d.name not in ("experiment", "hydra")})


def options(group: str) -> list[str]:
    return sorted({p.stem for r in conf_roots() for p in (r / group).glob("*.yaml")})


def _option_file(group: str, name: str) -> Path:
    return next((f for r in conf_roots() if (f := r / group / f"{name}.yaml").is_file()), CONF_DIR / group / name)


@functools.cache
def _load(group: str | None, name: str) -> DictConfig:
    """One option file with its same-group defaults merged in (`defaults: [dflash, _self_]`), unresolved."""
    raw = OmegaConf.load(_option_file(group, name) if group else CONF_DIR / f"{name}.yaml")
    defaults = list(raw.pop("defaults", None) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")                # Hydra 1.1+: a file's own keys come last unless placed
    parts = [raw if d == "_self_" else _load(group, d) for d in defaults if isinstance(d, str) and group]
    return OmegaConf.merge(*parts) if parts else raw


@functools.cache
def is_global(group: str, name: str) -> bool:
    """Whether the option file is `# @package _global_`: its keys sit at the top level, not under the group."""
    for line in _option_file(group, name).read_text().splitlines():
        if not line.startswith("#"):
            return False
        if line.replace(" ", "") == "#@package_global_":
            return True
    return False


def option_tree(group: str | None, name: str) -> dict:
    """The option's keys and values as plain containers, interpolations left as `${...}` strings."""
    node = _load(group, name)
    if group is None:                            # the primary config: its own keys (seed, device, paths, ...)
        node = OmegaConf.masked_copy(node, [k for k in node if k != "hydra"])
    return OmegaConf.to_container(node, resolve=False)


def _tag(v) -> str:
    if v is None or (isinstance(v, str) and "${" in v):
        return ANY
    for t, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (list, "list"), (dict, "dict")):
        if isinstance(v, t):
            return name
    return type(v).__name__


@functools.cache
def group_types(group: str) -> dict[str, frozenset[str]]:
    """Dotted key under the group -> the type tags it has across the group's options."""
    out: dict[str, set[str]] = {}

    def visit(node, path):
        if path:
            out.setdefault(path, set()).add(_tag(node))
        if isinstance(node, dict) and path not in FREE_FORM:
            for k, v in node.items():
                visit(v, f"{path}.{k}" if path else str(k))

    for name in options(group):
        visit(option_tree(group, name), "" if is_global(group, name) else group)
    for key, tag in OPTIONAL_KEYS.items():
        if key.startswith(group + "."):
            out.setdefault(key, set()).add(tag)
    return {k: frozenset(v) for k, v in out.items()}


def chosen_option(cfg, group: str, choices: dict | None = None) -> str | None:
    """Which option of `group` the config was composed from: its `name` when that is an option (task, target,
    drafter, logger), else Hydra's record of the choice, else None (the union of the options is the schema)."""
    names = options(group)
    node = cfg.get(group) if hasattr(cfg, "get") else None
    name = node.get("name") if isinstance(node, (dict, DictConfig)) else None
    if isinstance(name, str) and name in names:
        return name
    choice = (choices or {}).get(group)
    return choice if choice in names else None


def hydra_choices() -> dict:
    """Group choices and command-line overrides of the running Hydra job ({} outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        return {"choices": dict(hc.runtime.choices), "overrides": list(hc.overrides.task),
                "config_name": hc.job.config_name}
    except (ValueError, AttributeError, ImportError):
        return {}


def schema(cfg, choices: dict | None = None) -> dict:
    """The tree of valid keys for `cfg`: the primary config's keys + each group's chosen option (or the union of
    its options when the choice is unknown)."""
    tree = option_tree(None, "config")
    for group in group_names():
        name = chosen_option(cfg, group, choices)
        for o in [name] if name is not None else options(group):
            _union(tree, option_tree(group, o) if is_global(group, o) else {group: option_tree(group, o)})
    for key in OPTIONAL_KEYS:
        group, _, leaf = key.partition(".")
        if isinstance(tree.get(group), dict):
            tree[group].setdefault(leaf, None)
    return tree


def _union(into: dict, other: dict) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _union(into[k], v)
        else:
            into.setdefault(k, v)


def unknown_key_message(tree: dict, key: str, source: str = "") -> str:
    """One line for a key that `tree` does not have: the valid keys under its deepest existing parent."""
    parts, node, at = key.split("."), tree, []
    for p in parts[:-1]:
        if not isinstance(node, dict) or p not in node:
            break
        node, at = node[p], [*at, p]
    valid = sorted(map(str, node)) if isinstance(node, dict) else []
    where = f"under '{'.'.join(at)}'" if at else "at the top level (config groups and keys)"
    src = f" (set {source})" if source else ""
    return f"unknown key '{key}'{src}; valid keys {where}: {', '.join(valid)}"


# ------------------------------------------------------------------------------------------- the rules
def _int(lo=None, hi=None):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (
        hi is None or v <= hi)


def _num(lo=None, hi=None, lo_open=False):
    def ok(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or v <= hi)
    return ok


def _null_or(pred):
    return lambda v: v is None or pred(v)


def _one_of(*valid):
    return lambda v: v in valid and type(v) is type(next(x for x in valid if x == v))


def _int_list(lo=0):
    return lambda v: isinstance(v, list) and len(v) > 0 and all(_int(lo)(x) for x in v)


def _num_samples(v):
    if v is None or v == "paper":
        return True
    if isinstance(v, dict):
        return bool(v) and all(isinstance(k, str) and _int(1, MAX_COUNT)(n) for k, n in v.items())
    return _int(1, MAX_COUNT)(v)


def _dirs(v):
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


def _fusion_weight(v):
    return v == "learned" or _num()(v) or (isinstance(v, list) and len(v) > 0 and all(_num()(x) for x in v))


def _distinct_names(v):
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v) and len(set(v)) == len(v)


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
# EAGLE-3 dynamic tree (drafters/eagle3.py `_tree`): each level scores top_k beams over the draft vocabulary
# ([top_k, V] floats: 64 x 151,936 x 4 B = 39 MB) and ranks top_k^2 candidates; the target verifies total_tokens
# positions with a [total_tokens, context + total_tokens] mask; depth + 1 drafts per path. EAGLE's: 10, 60, 7.
# top_k is also at most the draft vocabulary (drafter.draft_vocab_size when set; checked in `_check_tree`).
TREE_MAX_TOP_K = 64
TREE_MAX_TOKENS = 1024
TREE_MAX_DEPTH = 64


def _upto(hi: int, what: str = "") -> str:
    return f"at most {hi:,}{f' ({what})' if what else ''}"


DTYPES = ("float32", "bfloat16", "float16")
FSDP_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")     # Lightning's FSDPStrategy names
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", 32, 16, 64, "32", "16", "bf16")
# key -> (predicate, what would be valid). Applied where the key exists (drafter keys differ per drafter).
RULES = {
    "seed": (_int(), "an int"),
    "device": (lambda v: isinstance(v, str) and _device_pattern().fullmatch(v) is not None,
               "auto, cpu, cuda or cuda:N"),
    "cpu_threads": (_null_or(_int(1, CORES)), f"an int >= 1, or null (torch's default); at most this machine's "
                                              f"{CORES} cores (os.cpu_count())"),
    "eval.num_samples": (_num_samples, "an int >= 1, null (all), 'paper' or a mapping {benchmark: int >= 1} "
                                       f"of benchmark.names; {_upto(MAX_COUNT)}"),
    "eval.max_new_tokens": (_int(1, MAX_TOKENS), f"an int >= 1; {_upto(MAX_TOKENS)}"),
    "eval.max_drafts": (_null_or(_int(1, MAX_BLOCK)), "an int >= 1, or null (the drafter's own number of "
                                                            f"drafts); {_upto(MAX_BLOCK)}"),
    "eval.shuffle_seed": (_int(), "an int"),
    "eval.split": (_one_of("eval", "tune"), "eval or tune"),
    "eval.tune_samples": (lambda v: _int(0, MAX_COUNT)(v) or isinstance(v, dict) and all(
        isinstance(k, str) and _int(0, MAX_COUNT)(n) for k, n in v.items()),
        f"an int >= 0 or a mapping {{benchmark: int >= 0}} of benchmark.names; {_upto(MAX_COUNT)}"),
    "eval.warmup": (_int(0, MAX_COUNT), f"an int >= 0; {_upto(MAX_COUNT)}"),
    "eval.check_lossless": (_one_of("auto", True, False), "auto, true or false"),
    "eval.near_tie": (_num(0), "a finite number >= 0 (a logit gap)"),
    "eval.shard": (shard_is_valid, SHARD_VALID),            # the grammar lives with the code that parses it
    "merge.runs": (_dirs, "a list of shard directories (or directories holding them), e.g. "
                          "merge.runs='[DIR0,DIR1]'"),
    "decoding.protocol": (_one_of("greedy", "A", "B"), "greedy, A or B"),
    "decoding.temperature": (_num(0), "a finite number >= 0"),
    "benchmark.names": (_distinct_names, "a non-empty list of benchmark names, each named once"),
    "benchmark.source": (_one_of("local", "hf"), "local or hf"),
    "benchmark.edition": (_one_of("staged", "reference"), "staged or reference"),
    "target.dtype": (_one_of("auto", *DTYPES), "auto, " + ", ".join(DTYPES)),
    "target.engine": (_one_of("hf", "static"), "hf or static"),
    "target.compile": (_one_of(True, False), "true or false"),
    "target.hidden_size": (_int(1, MAX_WIDTH), f"an int >= 1; {_upto(MAX_WIDTH)}"),
    "target.intermediate_size": (_int(1, MAX_WIDTH), f"an int >= 1; {_upto(MAX_WIDTH)}"),
    "target.num_layers": (_int(1, MAX_LAYERS), f"an int >= 1; {_upto(MAX_LAYERS)}"),
    "target.num_heads": (_int(1, MAX_HEADS), f"an int >= 1; {_upto(MAX_HEADS)}"),
    "target.num_kv_heads": (_int(1, MAX_HEADS), f"an int >= 1; {_upto(MAX_HEADS)}"),
    "target.max_context": (_int(2, MAX_TOKENS), f"an int >= 2; {_upto(MAX_TOKENS)}"),
    "target.mask_token_id": (_null_or(_int(0)), "an int >= 0 or null"),
    "target.stop_token_ids": (_null_or(_int_list()), "a non-empty list of ints >= 0, or null"),
    "target.source": (_one_of("auto", "hub", "gguf"), "auto, hub or gguf"),
    "drafter.init": (_one_of("auto", "random", "checkpoint"), "auto, random or checkpoint"),
    "drafter.block_size": (_int(2, MAX_BLOCK), f"an int >= 2 (the anchor + at least one draft); {_upto(MAX_BLOCK)}"),
    "drafter.num_layers": (_int(1, MAX_LAYERS), f"an int >= 1; {_upto(MAX_LAYERS)}"),
    "drafter.target_layer_ids": (_null_or(_int_list()), "a non-empty list of target layer ids >= 0, or null"),
    "drafter.seed": (_int(), "an int"),
    "drafter.revision": (_null_or(lambda v: isinstance(v, str) and v != ""), "a hub branch, tag or commit, or null"),
    "drafter.head.init": (_one_of("auto", "random", "checkpoint"), "auto, random or checkpoint"),
    "drafter.head.gru_hidden": (_int(1, MAX_WIDTH), f"an int >= 1; {_upto(MAX_WIDTH)}"),
    "drafter.head.train.num_anchors": (_int(1, MAX_BATCH), f"an int >= 1; {_upto(MAX_BATCH)}"),
    "drafter.head.train.epochs": (_int(1, MAX_STEPS), f"an int >= 1; {_upto(MAX_STEPS)}"),
    "drafter.head.train.block_size": (_null_or(_int(2, MAX_BLOCK)), f"an int >= 2, or null; {_upto(MAX_BLOCK)}"),
    "drafter.edit.passes": (_int(0, MAX_BLOCK), f"an int >= 0; {_upto(MAX_BLOCK)}"),
    "drafter.edit.window": (_null_or(_int(1, MAX_BLOCK)), f"an int >= 1, or null; {_upto(MAX_BLOCK)}"),
    "drafter.edit.verify": (_null_or(_int(1, MAX_BLOCK)), f"an int >= 1, or null; {_upto(MAX_BLOCK)}"),
    "drafter.mode": (_one_of("chain", "tree"), "chain or tree"),
    "drafter.num_drafts": (_int(1, MAX_BLOCK), f"an int >= 1; {_upto(MAX_BLOCK)}"),
    "drafter.tree.top_k": (_int(1, TREE_MAX_TOP_K), "an int >= 1, and at most the draft vocabulary; "
                                                    + _upto(TREE_MAX_TOP_K, "each level holds top_k x vocabulary "
                                                                            "floats")),
    "drafter.tree.depth": (_int(0, TREE_MAX_DEPTH), f"an int >= 0 (expansion steps after the first level); "
                                                         f"{_upto(TREE_MAX_DEPTH)}"),
    "drafter.tree.total_tokens": (_int(2, TREE_MAX_TOKENS), f"an int >= 2 (the anchor + at least one draft); "
                                                                 f"{_upto(TREE_MAX_TOKENS, 'verified per round')}"),
    "drafter.tap_layers": (_null_or(lambda v: _int_list()(v) and len(v) == 3), "3 target layer ids >= 0, or null"),
    "drafter.draft_vocab_size": (_null_or(_int(1, MAX_TOKENS)), f"an int >= 1, or null (the full "
                                                                 f"vocabulary); {_upto(MAX_TOKENS)}"),
    "drafter.ttt_length": (_int(1, MAX_BLOCK), f"an int >= 1 (training-time test steps); {_upto(MAX_BLOCK)}"),
    "drafter.ttt_decay": (_num(0, lo_open=True), "a finite number > 0"),
    "drafter.labels": (_one_of("hard", "soft"), "hard (the data tokens) or soft (the target's distribution)"),
    "export.format": (_one_of(*EXPORT_FORMATS), ", ".join(EXPORT_FORMATS[:-1]) + " or " + EXPORT_FORMATS[-1]),
    "export.out": (_null_or(lambda v: isinstance(v, str) and v != ""), "null (<run dir>/model) or a directory path"),
    "export.dtype": (_one_of(None, *DTYPES), "null (the checkpoint's dtypes), " + ", ".join(DTYPES)),
    "export.repo_id": (_null_or(lambda v: isinstance(v, str) and EXPORT_REPO_ID.fullmatch(v) is not None),
                       "null or a hub repository id OWNER/NAME"),
    "fusion.alpha": (_fusion_weight, "a finite number, a list of them, or 'learned'"),
    "fusion.beta": (_fusion_weight, "a finite number, a list of them, or 'learned'"),
    "fusion.kernel": (_one_of("auto", "triton", "torch"), "auto, triton or torch"),
    "replay.fusion_grid.alpha": (_null_or(lambda v: isinstance(v, list) and len(v) > 0 and all(_num()(x) for x in v)),
                                 "null or a non-empty list of finite numbers, e.g. '[0,0.1,0.2]'"),
    "replay.fusion_grid.beta": (_null_or(lambda v: isinstance(v, list) and len(v) > 0 and all(_num()(x) for x in v)),
                                "null or a non-empty list of finite numbers, e.g. '[0,0.1,0.2]'"),
    "fusion.cuda_graph": (_one_of("auto", True, False), "auto, true or false"),
    "logger.mode": (_one_of(None, "online", "offline", "disabled"), "null, online, offline or disabled"),
    "data.source": (_one_of("corpus", "hub"), "corpus (files of data/corpus, data.corpus) or hub (data.hub)"),
    "data.hub.id": (_null_or(lambda v: isinstance(v, str) and v != ""),
                    "null or a hub dataset id (owner/name), a local directory or a local JSON/JSONL file"),
    "data.hub.revision": (_null_or(lambda v: isinstance(v, str) and v != ""), "a hub branch, tag or commit, or null"),
    "data.hub.name": (_null_or(lambda v: isinstance(v, str) and v != ""), "null or a dataset config name"),
    "data.hub.data_files": (_null_or(lambda v: isinstance(v, str) and v != "" or isinstance(v, list) and bool(v)
                                     and all(isinstance(x, str) and x for x in v)),
                            "null, a file name or a non-empty list of file names inside the data set"),
    "data.hub.split": (lambda v: isinstance(v, str) and v != "", "a split name, e.g. train"),
    "data.hub.format": (_one_of("sharegpt", "messages"),
                        "sharegpt (conversations: role/content or from/value) or messages (role/content)"),
    "data.corpus_dir": (_null_or(lambda v: isinstance(v, str) and Path(v).expanduser().is_dir()),
                        "null (data/corpus) or an existing directory holding the corpus files"),
    "data.max_samples": (_null_or(_int(1, MAX_COUNT)), f"an int >= 1, or null (all); {_upto(MAX_COUNT)}"),
    "data.shuffle_seed": (_int(), "an int"),
    "data.max_length": (_int(2, MAX_TOKENS), f"an int >= 2; {_upto(MAX_TOKENS)}"),
    "data.min_response_tokens": (_int(0, MAX_TOKENS), f"an int >= 0; {_upto(MAX_TOKENS)}"),
    "data.features": (_one_of("cache", "online"), "cache or online"),
    "data.feature_dtype": (_one_of(*DTYPES), ", ".join(DTYPES)),
    "data.shard_tokens": (_int(1, MAX_SHARD_TOKENS), f"an int >= 1; {_upto(MAX_SHARD_TOKENS)}"),
    "data.regen_import": (lambda v: v is None or isinstance(v, str) and _packed_regen(v),
                          "null or a directory written by data.regen_export (manifest.json + tokens.npy)"),
    "data.regen_export": (_null_or(lambda v: isinstance(v, str) and v != ""), "null or a directory path"),
    "data.regen.batch_size": (_int(1, MAX_BATCH), f"an int >= 1; {_upto(MAX_BATCH)}"),
    "data.regen.max_new_tokens": (_int(1, MAX_TOKENS), f"an int >= 1; {_upto(MAX_TOKENS)}"),
    "data.regen.temperature": (_num(0), "a finite number >= 0"),
    "data.regen.top_p": (_num(0, 1, lo_open=True), "a number in (0, 1]"),
    "data.regen.top_k": (_int(0, MAX_TOKENS), f"an int >= 0; {_upto(MAX_TOKENS)}"),
    "train.num_anchors": (_int(1, MAX_BATCH), f"an int >= 1; {_upto(MAX_BATCH)}"),
    "train.gamma": (_null_or(_num(0, lo_open=True)), "a number > 0 or null"),
    "train.lr": (_num(0, lo_open=True), "a finite number > 0"),
    "train.warmup_ratio": (_num(0, 1), "a number in [0, 1]"),
    "train.weight_decay": (_num(0), "a finite number >= 0"),
    "train.grad_clip": (_null_or(_num(0)), "a finite number >= 0 or null"),
    "train.epochs": (_int(1, MAX_STEPS), f"an int >= 1; {_upto(MAX_STEPS)}"),
    "train.max_steps": (lambda v: _int(1, MAX_STEPS)(v) or v == -1 and _int()(v),
                        f"-1 (no limit) or an int >= 1; {_upto(MAX_STEPS)}"),
    "train.accumulate": (_int(1, MAX_BATCH), f"an int >= 1; {_upto(MAX_BATCH)}"),
    "train.data_tokens": (_null_or(_int(1)), "an int >= 1 or null"),
    "train.ckpt_every": (_int(1), "an int >= 1"),
    "train.log_every": (_int(1), "an int >= 1"),
    "train.seed": (_int(), "an int"),
    "train.export_dtype": (_one_of(*DTYPES), ", ".join(DTYPES)),
    "train.devices": (lambda v: v == "auto" or _int(1)(v) or _int_list()(v), "auto, an int >= 1 or a list of ids"),
    "train.num_nodes": (_int(1), "an int >= 1"),
    # ddp_spawn / ddp_fork are left out: spawned ranks would need the training plan's closures pickled
    "train.strategy": (_one_of("auto", "ddp", "fsdp"), "auto, ddp or fsdp"),
    "train.fsdp.sharding_strategy": (_one_of(*FSDP_SHARDING), ", ".join(FSDP_SHARDING)),
    "train.fsdp.state_dict_type": (_one_of("full", "sharded"), "full or sharded"),
    "train.precision": (lambda v: v in ("auto", *PRECISIONS) and not isinstance(v, bool),
                        "auto or a Lightning precision (" + ", ".join(PRECISIONS[:6]) + ", or 32, 16, 64, bf16)"),
}


def _packed_regen(v: str) -> bool:
    from .paths import repo_path
    from .training.data import stored_file

    return (repo_path(v) / "manifest.json").is_file() and stored_file(repo_path(v) / "tokens.npy") is not None


def _target_layers(t: dict) -> int | None:
    """The target's decoder layer count when the config alone tells it (tiny_qwen3, or a local directory)."""
    if t.get("loader") == "tiny_qwen3":
        return t.get("num_layers")
    path = t.get("path")
    if isinstance(path, str) and (Path(path).expanduser() / "config.json").is_file():
        try:
            n = json.loads((Path(path).expanduser() / "config.json").read_text()).get("num_hidden_layers")
        except (OSError, ValueError, AttributeError):
            return None                          # the target loader reports an unreadable config itself
        return n if _int(1)(n) else None
    return None


# ------------------------------------------------------------------------------------------- validate
def _fmt(v) -> str:
    return "null" if v is None else repr(v)


def _source(key: str, job: dict) -> str:
    """Where a key was most likely set, for the message: the command line, an experiment or a sweep file."""
    for o in job.get("overrides", []):
        if o.lstrip("+~").split("=", 1)[0] == key:
            return ""                            # the command line: the user just typed it
    exp = (job.get("choices") or {}).get("experiment")
    if exp:
        return f"by experiment={exp}"
    if job.get("config_name") not in (None, "config"):
        return f"by --config-name {job['config_name']}"
    return ""


def validate(cfg, job: dict | None = None) -> None:
    """Check the composed config: unknown keys, types, ranges. Raises `UserError` (one line) on the first fault.
    `job` = `hydra_choices()` (taken from the running Hydra job when not given)."""
    job = hydra_choices() if job is None else job
    try:
        values = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    except Exception as e:                        # a broken ${...}: OmegaConf raises several types
        raise UserError(f"cannot resolve the config: {str(e).splitlines()[0]}") from None
    values.pop("hydra", None)
    tree = schema(cfg, job.get("choices"))
    types = {"": {}}
    for g in group_names():
        types[g] = group_types(g)

    def walk(value, ref, path: str):
        if path in FREE_FORM or _tag(ref) == ANY or ref == {}:
            return                               # anything goes here; RULES below say more where they can
        if isinstance(ref, dict):
            if not isinstance(value, dict):
                raise UserError(f"{path}={_fmt(value)} must be a mapping with keys: {', '.join(map(str, ref))}")
            for k, v in value.items():
                sub = f"{path}.{k}" if path else str(k)
                if k not in ref:
                    raise UserError(unknown_key_message(tree, sub, _source(sub, job)))
                walk(v, ref[k], sub)
            return
        group = path.split(".", 1)[0]
        allowed = types.get(group, {}).get(path) or frozenset({_tag(ref)})
        tag = _tag(value)
        if ANY in allowed or tag == ANY or tag in allowed or (tag == "int" and "float" in allowed):
            return
        if path in RULES:                        # the rule below names what is valid, more precisely
            return
        want = " or ".join(sorted(allowed))
        raise UserError(f"{path}={_fmt(value)} has type {tag}; expected {want} (as in conf/{group}/)")

    walk(values, tree, "")
    for key, (ok, valid) in RULES.items():
        node, found = values, True
        for p in key.split("."):
            if not isinstance(node, dict) or p not in node:
                found = False
                break
            node = node[p]
        if found and not ok(node):
            raise UserError(f"{key}={_fmt(node)} is not valid; expected {valid}")
    _check_target_fit(values)
    _check_compile(values)
    _check_drafter_checkpoint(values)
    _check_shard(values)
    _check_hub(values)
    _check_sample_keys(values)
    _check_tree(values)
    _check_precision(values)


def _check_sample_keys(values: dict) -> None:
    """The keys of a mapping `eval.num_samples={gsm8k: 2}` are selected benchmarks: any other key would be ignored
    and the selected benchmark would run all its prompts. `eval.tune_samples`' shipped default names all eight
    benchmarks, so its keys need only be benchmarks (a typo's key would be ignored all the same)."""
    from .benchmarks import BENCHMARKS

    e, names = values.get("eval") or {}, (values.get("benchmark") or {}).get("names") or []
    _known_keys("eval.num_samples", e.get("num_samples"), names, "benchmark.names (the selected benchmarks)")
    _known_keys("eval.tune_samples", e.get("tune_samples"), [*BENCHMARKS],
                f"the benchmarks (selected: {', '.join(names)})")


def _known_keys(key: str, mapping, valid: list, what: str) -> None:
    extra = sorted(set(mapping) - set(valid)) if isinstance(mapping, dict) else []
    if extra:
        raise UserError(f"{key}: {', '.join(map(repr, extra))} is not among {what}; the keys must be one of: "
                        f"{', '.join(valid)}")


def _check_tree(values: dict) -> None:
    """EAGLE-3's tree keeps top_k children per node, out of the draft vocabulary (RULES bound it otherwise)."""
    d = values.get("drafter") or {}
    top_k, vocab = (d.get("tree") or {}).get("top_k"), d.get("draft_vocab_size")
    if d.get("mode") == "tree" and _int(1)(top_k) and _int(1)(vocab) and top_k > vocab:
        raise UserError(f"drafter.tree.top_k={top_k} exceeds drafter.draft_vocab_size={vocab}; choose top_k <= "
                        f"{vocab}")


HALF_TRUE = ("bf16-true", "16-true")              # weights and activations in half precision, no float32 master


def _check_compile(values: dict) -> None:
    """`target.compile=true` compiles the static engine's steps (static_target.py): with the HF engine it would
    change nothing, silently."""
    t = values.get("target") or {}
    if t.get("compile") is True and t.get("engine", "hf") != "static":
        raise UserError(f"target.compile=true needs target.engine=static (the compiled steps run on its "
                        f"preallocated KV cache), not target.engine={t.get('engine', 'hf')}; add target.engine=static")


def _check_precision(values: dict) -> None:
    """`train.precision=bf16-true` on CPU fails deep in the first step (float32 target features meet bf16 drafter
    weights): refuse it up front with what does run."""
    precision, device = (values.get("train") or {}).get("precision"), values.get("device")
    if (values.get("task") or {}).get("name") != "train" or precision not in HALF_TRUE or not _on_cpu(device):
        return
    raise UserError(f"train.precision={precision} does not run on the CPU (device={device}): the float32 target "
                    f"features meet half-precision weights; use train.precision=bf16-mixed or 32")


def _on_cpu(device) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


def _check_hub(values: dict) -> None:
    """`data.source=hub` names its data set (`data.hub.id`)."""
    d = values.get("data") or {}
    if d.get("source") == "hub" and not (d.get("hub") or {}).get("id"):
        raise UserError("data.source=hub needs data.hub.id: a hub dataset id (owner/name), a local directory or a "
                        "local JSON/JSONL file")


SHARDED_TASKS = ("eval", "replay")          # the tasks that run a selection of prompts (eval/shards.py)


def _check_shard(values: dict) -> None:
    shard, task = (values.get("eval") or {}).get("shard"), (values.get("task") or {}).get("name")
    if shard is not None and task not in SHARDED_TASKS:
        raise UserError(f"eval.shard={shard!r} applies to task={' and task='.join(SHARDED_TASKS)} only (this is "
                        f"task={task}); drop eval.shard")


def _check_target_fit(values: dict) -> None:
    d, t = values.get("drafter") or {}, values.get("target") or {}
    n = _target_layers(t)
    ids = d.get("target_layer_ids")
    if n is not None and isinstance(ids, list):
        bad = [i for i in ids if i >= n]
        if bad:
            raise UserError(f"drafter.target_layer_ids={ids} out of range for target {t.get('name')} "
                            f"(layers 0..{n - 1})")
    if t.get("loader") == "tiny_qwen3" and t.get("hidden_size", 0) % max(1, t.get("num_heads", 1)):
        raise UserError(f"target.hidden_size={t['hidden_size']} must be a multiple of target.num_heads="
                        f"{t['num_heads']}")


def _check_drafter_checkpoint(values: dict) -> None:
    """A local DFlash-format checkpoint of a DFlash-family drafter: its config.json and weight index are read now,
    so a malformed one is refused before the target is loaded (its tensors are checked when the drafter loads)."""
    d = values.get("drafter") or {}
    ckpt = d.get("checkpoint")
    if d.get("init") == "random" or not isinstance(ckpt, str) or not set(option_tree("drafter", "dflash")) <= set(d):
        return
    from .checkpoints import read_config, weight_files
    from .drafters.dflash import DFlashConfig
    from .paths import REPO_ROOT

    path = Path(ckpt).expanduser()
    path = path if path.exists() or path.is_absolute() else REPO_ROOT / ckpt    # committed checkpoints
    if path.is_dir():                            # else a hub id, or absent: the drafter's loader says which
        where = f"drafter.checkpoint={ckpt!r}"
        DFlashConfig.from_dict(read_config(path, where), f"{where}: config.json")
        weight_files(path, where)


# ---------------------------------------------------------------------------------- the run directory
# Files a run writes into its directory (the evaluator's results contract, the loggers, training summaries).
RUN_FILES = ("samples.jsonl", "summary.json", "summary.md", "config.yaml", "run_info.json", "run.json",
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
    return f"cannot write{what}: {e.strerror or os.strerror(e.errno)}; free some space or fix the permissions"


# ------------------------------------------------------------------------------- typed views of groups
class _FromCfg:
    @classmethod
    def from_cfg(cls, node):
        d = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class EvalConfig(_FromCfg):
    num_samples: int | str | dict | None
    max_new_tokens: int
    max_drafts: int | None = None
    shuffle_seed: int = 0
    split: str = "eval"
    tune_samples: int | dict = 0
    run_ar: bool = True
    check_lossless: bool | str = "auto"
    near_tie: float = 0.01
    warmup: int = 1
    save_text: bool = True
    shard: str | None = None
    progress: bool = True


@dataclass(frozen=True)
class DecodingConfig(_FromCfg):
    protocol: str
    temperature: float


@dataclass(frozen=True)
class TrainConfig(_FromCfg):
    num_anchors: int
    lr: float
    epochs: int
    gamma: float | None = None
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    max_steps: int = -1
    accumulate: int = 1
    data_tokens: int | None = None
    precision: str = "auto"
    devices: int | str | list = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    fsdp: dict | None = None
    attention: str = "auto"
    init_from_target: bool = False
    ckpt_every: int = 200
    log_every: int = 10
    seed: int = 0
    export_dtype: str = "bfloat16"
    export_dir: str | None = None
    eval_after: bool = False


@dataclass(frozen=True)
class DataConfig(_FromCfg):
    corpus: list
    max_samples: int | None
    max_length: int
    shuffle_seed: int = 0
    regenerate: bool = False
    corpus_answers: bool = True
    regen: dict | None = None
    min_response_tokens: int = 8
    features: str = "online"
    feature_dtype: str = "bfloat16"
    shard_tokens: int = 65536
    corpus_dir: str | None = None
    regen_import: str | None = None
    regen_export: str | None = None
    source: str = "corpus"
    hub: dict | None = None
