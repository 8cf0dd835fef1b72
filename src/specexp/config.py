"""Typed config at the edge: the composed config (command line + experiment file + sweep file) is checked once,
before any work, and every mistake is one `UserError` line naming the key and what would be valid.

The schema is the frozen dataclasses below, one per config group (schema.py says how a field carries its type and
its rule), plus each drafter's own `settings` dataclass on its registry entry (drafters/dflash.py `DFlashSettings`,
...). The YAML files of conf/ are presets: values for these keys (tests/test_configs.py checks that every preset
key has its field). `validate(cfg)` checks a composed config against them:
  keys    a key without a field is refused; the task-specific groups (export, replay, ...) only with their task
  types   a field's annotation: an int where it says int (ints are accepted where floats are), a list, a mapping
  ranges  a field's rule (cpu_threads >= 1, block_size >= 2, ...), plus the checks that need several keys or the
          target's size (tap layer ids within its layers) when the config alone tells it
  bounds  every size-like key has an upper bound too (schema.MAX_*, in its rule), so that an extreme value is one
          line before anything is allocated and before the run directory is claimed, not a 10 GB allocation later

The code reads the same dataclasses: `validate` returns the checked `Config` (a frozen view per group), and the task's
runner reads `typed.eval`, `typed.decoding`, ... from it rather than rebuilding a view (`Settings.from_cfg`) of its own.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .errors import UserError
from .paths import CONF_DIR
from .schema import (
    CORES,
    DTYPES,
    MAX_BATCH,
    MAX_BLOCK,
    MAX_COUNT,
    MAX_SHARD_TOKENS,
    MAX_STEPS,
    MAX_TOKENS,
    FusionConfig,
    Settings,
    check,
    choice,
    frozen,
    int_list,
    ints,
    is_int,
    is_num,
    key_tree,
    nonempty_str,
    null_or,
    setting,
    upto,
)
from .targets.settings import TargetSettings as TargetConfig


# ------------------------------------------------------------------------------------------- predicates
def _device(v) -> bool:
    from .machine import DEVICE  # the device grammar lives with the code that parses it

    return isinstance(v, str) and DEVICE.fullmatch(v) is not None


def _num_samples(v):
    if v is None or v == "paper":
        return True
    if isinstance(v, dict):
        return bool(v) and all(isinstance(k, str) and is_int(1, MAX_COUNT)(n) for k, n in v.items())
    return is_int(1, MAX_COUNT)(v)


def _timed_samples(v):
    return v is None or is_int(1, MAX_COUNT)(v) or isinstance(v, dict) and bool(v) and all(
        isinstance(k, str) and is_int(1, MAX_COUNT)(n) for k, n in v.items())


def _tune_samples(v):
    return is_int(0, MAX_COUNT)(v) or isinstance(v, dict) and all(
        isinstance(k, str) and is_int(0, MAX_COUNT)(n) for k, n in v.items())


def _dirs(v):
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


def _num_list(v):
    return v is None or isinstance(v, list) and len(v) > 0 and all(is_num()(x) for x in v)


def _distinct_names(v):
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v) and len(set(v)) == len(v)


def _packed_regen(v) -> bool:
    from .files import stored
    from .paths import repo_path

    return v is None or isinstance(v, str) and (repo_path(v) / "manifest.json").is_file() and stored(
        repo_path(v) / "tokens.npy") is not None


def _data_files(v):
    return v is None or nonempty_str(v) or isinstance(v, list) and bool(v) and all(nonempty_str(x) for x in v)


def _corpus_dir(v):
    return v is None or isinstance(v, str) and Path(v).expanduser().is_dir()


# eval.shard's grammar (eval/shards.py selects a shard's samples by it)
SHARD_PATTERN = re.compile(r"(0|[1-9][0-9]*)/([1-9][0-9]*)")
SHARD_VALID = "null (unsharded) or 'I/N' with ints 0 <= I < N, e.g. eval.shard=0/2"


def shard_is_valid(value) -> bool:
    """Whether `value` is a valid `eval.shard`: None, or 'I/N' with 0 <= I < N (digits only, no sign or padding)."""
    if value is None:
        return True
    m = SHARD_PATTERN.fullmatch(value) if isinstance(value, str) else None
    return m is not None and int(m[1]) < int(m[2])


EXPORT_FORMATS = ("vllm", "sglang", "zlab", "hf")                    # export.format (export/engines.py writes them)
EXPORT_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")   # export.repo_id: a hub repo id


FSDP_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")     # Lightning's FSDPStrategy names
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", 32, 16, 64, "32", "16", "bf16")
NAMES = "a hub branch, tag or commit, or null"
GRID = "null or a non-empty list of finite numbers, e.g. '[0,0.1,0.2]'"


def _int_or_null(lo: int, hi: int, null: str = "") -> tuple:
    return null_or(is_int(lo, hi)), f"an int >= {lo}, or null{f' ({null})' if null else ''}; {upto(hi)}"


# ------------------------------------------------------------------------------------------- the groups
@frozen
class PathsConfig(Settings):
    KEY = "paths"
    cache: str = "~/.cache/specexp"


@frozen
class TaskConfig(Settings):
    """`task`: which job runs (`name`), and task=prior's own keys."""
    KEY = "task"
    name: str = "eval"
    out: str | None = None
    overwrite: bool = False
    smoothing: float = 1.0


@frozen
class BenchmarkConfig(Settings):
    KEY = "benchmark"
    names: list = setting(factory=list, rule=_distinct_names, valid="a non-empty list of benchmark names, each "
                                                                    "named once")
    source: str = choice("local", "hf")
    edition: str = choice("staged", "reference")
    data_dir: str | None = None


@frozen
class DecodingConfig(Settings):
    """`decoding`: greedy (T = 0) or a sampling protocol (A, B, block: T > 0; decoding/verify.py)."""
    KEY = "decoding"
    protocol: str = choice("greedy", "A", "B", "block")
    temperature: float = setting(0.0, is_num(0), "a finite number >= 0")

    @classmethod
    def check_values(cls, mine: dict, whole: dict) -> None:
        protocol, temp = mine.get("protocol"), mine.get("temperature")
        if (protocol == "greedy") != (temp == 0):
            raise UserError(f"decoding.protocol={protocol} with decoding.temperature={temp}: greedy needs T=0 and "
                            f"protocols A/B/block need T>0 (use decoding=greedy, decoding=sample_a, decoding=sample_b "
                            f"or decoding=sample_block)")
        drafter = whole.get("drafter")
        if isinstance(drafter, dict) and drafter.get("mode") == "tree":
            # the protocols a tree's walk verifies live with it
            from .decoding.tree import check_protocol

            check_protocol(protocol)


def _by_batch(v) -> bool:
    """eval.max_drafts as a table by batch size: {B: cap}, the cap of the largest B at or below the run's batch."""
    return isinstance(v, dict) and len(v) > 0 and all(is_int(1, MAX_BATCH)(k) and null_or(is_int(1, MAX_BLOCK))(x)
                                                      for k, x in v.items())


@frozen
class EvalConfig(Settings):
    KEY = "eval"
    num_samples: Any = setting(2, _num_samples, "an int >= 1, null (all), 'paper' or a mapping {benchmark: int >= 1} "
                                                f"of benchmark.names; {upto(MAX_COUNT)}")
    max_new_tokens: int = setting(64, *ints(1, MAX_TOKENS))
    max_drafts: Any = setting(None, lambda v: v == "auto" or null_or(is_int(1, MAX_BLOCK))(v) or _by_batch(v),
                              "an int >= 1, null (the drafter's own number of drafts), auto, or a mapping {batch size: "
                              f"int >= 1 or null}} (e.g. '{{1: null, 8: 3, 32: 1}}'); {upto(MAX_BLOCK)}")
    batch_size: int = setting(1, *ints(1, MAX_BATCH))      # sequences decoded side by side (decoding/batch_spec.py)
    # DFlash drafting from the N most frequent answer tokens of a regeneration set (eval/summary.py `draft_vocab`)
    draft_vocab: Any = setting(None, lambda v: v == "auto" or null_or(is_int(1))(v),
                               "an int >= 1, null (the whole vocabulary) or auto")
    draft_vocab_from: str | None = setting(None, null_or(nonempty_str), "a regeneration set directory (data/regen/), "
                                                                        "or null")
    shuffle_seed: int = setting(0, is_int(), "an int")
    split: str = choice("eval", "tune")
    tune_samples: Any = setting(0, _tune_samples, "an int >= 0 or a mapping {benchmark: int >= 0} of "
                                                  f"benchmark.names; {upto(MAX_COUNT)}")
    # eval/shards.py: the prompts a run times (TPOT, speedup) out of all it measures τ on; null = all of them
    timed_samples: Any = setting(None, _timed_samples, "null (all), an int >= 1 or a mapping {benchmark: int >= 1} of "
                                                       f"benchmark.names; {upto(MAX_COUNT)}")
    run_ar: bool = True
    check_lossless: Any = choice("auto", True, False)
    near_tie: float = setting(0.01, is_num(0), "a finite number >= 0 (a logit gap)")
    warmup: int = setting(1, *ints(0, MAX_COUNT))
    save_text: bool = True
    shard: str | None = setting(None, shard_is_valid, SHARD_VALID)
    progress: bool = True

    @classmethod
    def check_values(cls, mine: dict, whole: dict) -> None:
        n, name = mine.get("draft_vocab"), (whole.get("drafter") or {}).get("name")
        # the drafter is another group's: checked where the whole config is at hand (validate), not when the group
        # is checked alone (`whole` = {}: resolve_auto's `replaced`, `from_cfg`)
        if whole and n is not None and n != "auto":
            if name != "dflash":
                raise UserError(f"eval.draft_vocab={n}: only drafter=dflash drafts from a restricted vocabulary "
                                f"(this is {name}); use eval.draft_vocab=null or auto")
            if not isinstance(mine.get("draft_vocab_from"), str):
                raise UserError(f"eval.draft_vocab={n} needs eval.draft_vocab_from=DIR, a regeneration set of the "
                                "target's own answers (data/regen/)")
            # the set's reader lives with the code that drafts from it
            from .drafters.dflash import regen_manifest

            regen_manifest(mine["draft_vocab_from"], (whole.get("target") or {}).get("name"))


@frozen
class LoggerConfig(Settings):
    KEY = "logger"
    name: str = "none"
    project: str = "specexp"
    entity: str | None = None
    mode: str | None = choice(None, "online", "offline", "disabled")
    tags: list = setting(factory=list)


@frozen
class HubDataConfig(Settings):
    KEY = "data.hub"
    id: str | None = setting(None, null_or(nonempty_str),
                             "null or a hub dataset id (owner/name), a local directory or a local JSON/JSONL file")
    revision: str | None = setting(None, null_or(nonempty_str), NAMES)
    name: str | None = setting(None, null_or(nonempty_str), "null or a dataset config name")
    data_files: Any = setting(None, _data_files, "null, a file name or a non-empty list of file names inside the "
                                                 "data set")
    split: str = setting("train", nonempty_str, "a split name, e.g. train")
    format: str = choice("sharegpt", "messages", words="sharegpt (conversations: role/content or from/value) or "
                                                       "messages (role/content)")


@frozen
class RegenConfig(Settings):
    """`data.regen`: how the target regenerates the training answers (task=regenerate, data.regenerate)."""
    KEY = "data.regen"
    batch_size: int = setting(32, *ints(1, MAX_BATCH))
    max_new_tokens: int = setting(256, *ints(1, MAX_TOKENS))
    temperature: float = setting(0.0, is_num(0), "a finite number >= 0")
    top_p: float = setting(1.0, is_num(0, 1, lo_open=True), "a number in (0, 1]")
    top_k: int = setting(0, *ints(0, MAX_TOKENS))


@frozen
class DataConfig(Settings):
    KEY = "data"
    source: str = choice("corpus", "hub", words="corpus (files of data/corpus, data.corpus) or hub (data.hub)")
    hub: HubDataConfig = setting(factory=HubDataConfig)
    corpus: list = setting(factory=list)
    corpus_dir: str | None = setting(None, _corpus_dir, "null (data/corpus) or an existing directory holding the "
                                                        "corpus files")
    max_samples: int | None = setting(None, *_int_or_null(1, MAX_COUNT, "all"))
    shuffle_seed: int = setting(0, is_int(), "an int")
    regenerate: bool = False
    corpus_answers: bool = True
    regen: RegenConfig = setting(factory=RegenConfig)
    regen_import: str | None = setting(None, _packed_regen, "null or a directory written by data.regen_export "
                                                           "(manifest.json + tokens.npy)")
    regen_export: str | None = setting(None, null_or(nonempty_str), "null or a directory path")
    max_length: int = setting(512, *ints(2, MAX_TOKENS))
    min_response_tokens: int = setting(8, *ints(0, MAX_TOKENS))
    features: str = choice("online", "cache", words="cache or online")
    feature_dtype: str = choice(*DTYPES, default="bfloat16", words=", ".join(DTYPES))
    shard_tokens: int = setting(65536, *ints(1, MAX_SHARD_TOKENS))


@frozen
class FsdpConfig(Settings):
    KEY = "train.fsdp"
    sharding_strategy: str = choice(*FSDP_SHARDING, words=", ".join(FSDP_SHARDING))
    state_dict_type: str = choice("full", "sharded")


@frozen
class TrainConfig(Settings):
    KEY = "train"
    num_anchors: int = setting(512, *ints(1, MAX_BATCH))
    gamma: float | None = setting(None, null_or(is_num(0, lo_open=True)), "a number > 0 or null")
    lr: float = setting(6e-4, is_num(0, lo_open=True), "a finite number > 0")
    warmup_ratio: float = setting(0.04, is_num(0, 1), "a number in [0, 1]")
    weight_decay: float = setting(0.0, is_num(0), "a finite number >= 0")
    grad_clip: float | None = setting(1.0, null_or(is_num(0)), "a finite number >= 0 or null")
    epochs: int = setting(6, *ints(1, MAX_STEPS))
    max_steps: int = setting(-1, lambda v: is_int(1, MAX_STEPS)(v) or v == -1 and is_int()(v),
                             f"-1 (no limit) or an int >= 1; {upto(MAX_STEPS)}")
    accumulate: int = setting(1, *ints(1, MAX_BATCH))
    data_tokens: int | None = setting(None, null_or(is_int(1)), "an int >= 1 or null")
    precision: Any = setting("auto", lambda v: v in ("auto", *PRECISIONS) and not isinstance(v, bool),
                             "auto or a Lightning precision (" + ", ".join(PRECISIONS[:6]) + ", or 32, 16, 64, bf16)")
    devices: Any = setting("auto", lambda v: v == "auto" or is_int(1)(v) or int_list()(v),
                           "auto, an int >= 1 or a list of ids")
    num_nodes: int = setting(1, is_int(1), "an int >= 1")
    # ddp_spawn / ddp_fork are left out: spawned ranks would need the training plan's closures pickled
    strategy: str = choice("auto", "ddp", "fsdp")
    fsdp: FsdpConfig = setting(factory=FsdpConfig)
    attention: str = "auto"
    init_from_target: bool = False
    ckpt_every: int = setting(200, is_int(1), "an int >= 1")
    log_every: int = setting(10, is_int(1), "an int >= 1")
    seed: int = setting(0, is_int(), "an int")
    export_dtype: str = choice(*DTYPES, default="bfloat16", words=", ".join(DTYPES))
    export_dir: str | None = None
    eval_after: bool = False


# The task-specific groups: at the top level, present only with their task (conf/task/<task>.yaml).
@frozen
class ExportConfig(Settings):
    KEY = "export"
    format: str = choice(*EXPORT_FORMATS, words=", ".join(EXPORT_FORMATS[:-1]) + " or " + EXPORT_FORMATS[-1])
    out: str | None = setting(None, null_or(nonempty_str), "null (<run dir>/model) or a directory path")
    overwrite: bool = False
    dtype: str | None = choice(None, *DTYPES, words="null (the checkpoint's dtypes), " + ", ".join(DTYPES))
    force: bool = False                          # export what the engine would run differently (the card says so)
    push: bool = False
    repo_id: str | None = setting(None, null_or(lambda v: isinstance(v, str) and EXPORT_REPO_ID.fullmatch(v)
                                                is not None), "null or a hub repository id OWNER/NAME")
    private: bool = True


@frozen
class FusionGridConfig(Settings):
    KEY = "replay.fusion_grid"
    alpha: list | None = setting(None, _num_list, GRID)
    beta: list | None = setting(None, _num_list, GRID)


REFERENCE_ENGINES = ("specexp", "vllm")   # replay.reference_engine: specexp's own engine, or vLLM (eval/references.py)


@frozen
class ReplayConfig(Settings):
    KEY = "replay"
    cache_dir: str | None = None
    references: str | None = None
    export: str | None = None
    overwrite: bool = False
    references_only: bool = False
    tap_cache: bool = True
    tap_cache_dir: str | None = None
    batched: bool = True
    batch_size: Any = setting("auto", lambda v: v == "auto" or is_int(1, MAX_BATCH)(v),
                              f"an int >= 1 or auto; {upto(MAX_BATCH)}")
    near_tie: float = setting(0.01, is_num(0), "a finite number >= 0 (a top-2 logit gap)")
    fusion_grid: FusionGridConfig = setting(factory=FusionGridConfig)
    reference_engine: str = setting("specexp", lambda v: v in REFERENCE_ENGINES,
                                    f"one of {', '.join(REFERENCE_ENGINES)} (what decodes the references)")
    vllm_python: str = setting(".venv-serve/bin/python", nonempty_str, "the Python of an environment with vLLM (bash "
                                                                        "scripts/install.sh serve makes .venv-serve)")
    vllm_timeout_s: int = setting(3600, *ints(10, 7 * 24 * 3600))


@frozen
class MergeConfig(Settings):
    KEY = "merge"
    runs: list = setting(factory=list, rule=_dirs, valid="a list of shard directories (or directories holding them), "
                                                          "e.g. merge.runs='[DIR0,DIR1]'")


@frozen
class ReportConfig(Settings):
    KEY = "report"
    runs: list = setting(factory=list)
    title: str | None = None


@frozen
class CompareConfig(Settings):
    KEY = "compare"
    a: str | None = None
    b: str | None = None
    allow_mismatch: bool = False                # pair runs of another target, decoding, budget or prompts anyway
    allow_batch_mismatch: bool = False          # pair runs decoded at different eval.batch_size anyway


def _plan_map(v, rule) -> bool:
    """null, one value for every key, or a mapping of names to such values (plan.answer_tokens, plan.tau)."""
    return v is None or rule(v) or (isinstance(v, dict) and all(isinstance(k, str) and rule(x) for k, x in v.items()))


@frozen
class PlanConfig(Settings):
    KEY = "plan"
    calibration: str | None = None
    drafters: list | None = setting(None, lambda v: v is None or (isinstance(v, list) and len(v) > 0 and all(
        isinstance(x, str) for x in v)), "null (the composed drafter) or a non-empty list of drafter names, "
                                         "e.g. plan.drafters='[none,dflash,dels_rnn]'")
    answer_tokens: Any = setting(None, lambda v: _plan_map(v, is_num(1, MAX_TOKENS)),
                                 f"null, a number >= 1 or a mapping {{benchmark: number >= 1}}; {upto(MAX_TOKENS)}")
    tau: Any = setting(None, lambda v: _plan_map(v, is_num(1, MAX_BLOCK + 1)),
                       "null, a number >= 1 (tokens per verification, the bonus included) or a mapping {drafter: "
                       f"number}}; {upto(MAX_BLOCK + 1)}")
    batch_size: Any = setting("auto", lambda v: v == "auto" or is_int(1, MAX_BATCH)(v),
                              f"an int >= 1 or auto (replay.batch_size's rule); {upto(MAX_BATCH)}")
    batches: list = setting(factory=lambda: [1, 4, 8, 16, 32], rule=lambda v: isinstance(v, list) and len(v) > 0
                            and all(is_int(1, MAX_BATCH)(x) for x in v),
                            valid=f"a non-empty list of ints >= 1; {upto(MAX_BATCH)}")
    context: int = setting(256, *ints(16, MAX_TOKENS))

    @classmethod
    def check_values(cls, mine: dict, whole: dict) -> None:
        # config.validate (`whole` given): the calibration file is read and checked now, a missing or damaged one
        # refused before the benchmarks are read or a target is built
        if whole and mine.get("calibration") is not None:
            from .calibration import read_calibration

            read_calibration(mine["calibration"])


SERVED = ("dflash", "eagle3")      # what task=serve_check runs in vLLM (vLLM has no Domino drafter; DeLS, DEdit none)


@frozen
class ServeConfig(Settings):
    KEY = "serve_check"
    python: str = setting(".venv-serve/bin/python", nonempty_str, "the Python of an environment with vLLM (bash "
                                                                   "scripts/install.sh serve makes .venv-serve)")
    drafters: list = setting(factory=lambda: list(SERVED), rule=lambda v: isinstance(v, list) and len(v) > 0 and all(
        x in SERVED for x in v) and len(set(v)) == len(v), valid=f"a non-empty list of distinct drafters vLLM serves: "
                                                                 f"{', '.join(SERVED)}")
    num_drafts: int = setting(7, *ints(1, MAX_BLOCK))
    exports: Any = setting(None, lambda v: v is None or (isinstance(v, dict) and all(
        k in SERVED and isinstance(x, str) and Path(x).expanduser().is_dir() for k, x in v.items())),
        f"null or a mapping {{drafter: an existing export directory}}, drafters among {', '.join(SERVED)}")
    enforce_eager: bool = True
    max_model_len: int = setting(1024, *ints(64, MAX_TOKENS))
    timeout_s: int = setting(3600, *ints(10, 7 * 24 * 3600))
    strict: bool = True


@frozen
class DashboardConfig(Settings):
    KEY = "dashboard"
    project: str = "specexp"
    entity: str | None = None
    sweep_group: str | None = None
    max_position: int | None = setting(None, *_int_or_null(1, MAX_BLOCK, "the largest block_size - 1 configured"))
    push: bool = False


GROUPS = {"paths": PathsConfig, "task": TaskConfig, "target": TargetConfig, "fusion": FusionConfig,
          "benchmark": BenchmarkConfig, "decoding": DecodingConfig, "eval": EvalConfig, "logger": LoggerConfig,
          "data": DataConfig, "train": TrainConfig}
TASK_GROUPS = {"export": ExportConfig, "replay": ReplayConfig, "merge": MergeConfig, "report": ReportConfig,
               "compare": CompareConfig, "dashboard": DashboardConfig, "plan": PlanConfig, "serve_check": ServeConfig}
TASK_READS = {"plan": ("replay",)}                # another task's group a task reads (plan: replay's batch and set)


@frozen
class Config(Settings):
    """The whole composed config (Hydra's own `hydra` node aside). `drafter` is checked against the chosen drafter's
    `settings` (registry.py)."""
    seed: int = setting(0, is_int(), "an int")
    device: str = setting("auto", _device, "auto, cpu, cuda or cuda:N")
    cpu_threads: int | None = setting(None, null_or(is_int(1, CORES)), f"an int >= 1, or null (torch's default); at "
                                                                        f"most this machine's {CORES} cores "
                                                                        f"(os.cpu_count())")
    paths: PathsConfig = setting(factory=PathsConfig)
    task: TaskConfig = setting(factory=TaskConfig)
    target: TargetConfig = setting(factory=TargetConfig)
    drafter: Any = None
    fusion: FusionConfig = setting(factory=FusionConfig)
    benchmark: BenchmarkConfig = setting(factory=BenchmarkConfig)
    decoding: DecodingConfig = setting(factory=DecodingConfig)
    eval: EvalConfig = setting(factory=EvalConfig)
    logger: LoggerConfig = setting(factory=LoggerConfig)
    data: DataConfig = setting(factory=DataConfig)
    train: TrainConfig = setting(factory=TrainConfig)
    export: ExportConfig | None = None
    replay: ReplayConfig | None = None
    merge: MergeConfig | None = None
    report: ReportConfig | None = None
    compare: CompareConfig | None = None
    dashboard: DashboardConfig | None = None
    plan: PlanConfig | None = None
    serve_check: ServeConfig | None = None


# ------------------------------------------------------------------------------------------- the presets
def conf_roots() -> list[Path]:
    """conf/ and the config directories of the drafters that `SPECEXP_PLUGINS` modules register."""
    if not os.environ.get("SPECEXP_PLUGINS"):
        return [CONF_DIR]
    from . import registry

    registry.load_plugins()
    return [CONF_DIR, *registry.config_dirs()]


def options(group: str) -> list[str]:
    """The preset names of a config group (its YAML files, plugins' included)."""
    return sorted({p.stem for r in conf_roots() for p in (r / group).glob("*.yaml")})


@functools.cache
def _load(group: str, name: str) -> DictConfig:
    """One preset with its same-group defaults merged in (`defaults: [dflash, _self_]`), unresolved."""
    path = next((f for r in conf_roots() if (f := r / group / f"{name}.yaml").is_file()), CONF_DIR / group / name)
    raw = OmegaConf.load(path)
    defaults = list(raw.pop("defaults", None) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")                # Hydra 1.1+: a file's own keys come last unless placed
    parts = [raw if d == "_self_" else _load(group, d) for d in defaults if isinstance(d, str)]
    return OmegaConf.merge(*parts)


def option_tree(group: str, name: str) -> dict:
    """A preset's keys and values as plain containers, interpolations left as `${...}` strings (the dashboard
    reads block sizes from them; tests check every key has its field)."""
    return OmegaConf.to_container(_load(group, name), resolve=False)


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


def hydra_choices() -> dict:
    """Group choices and command-line overrides of the running Hydra job ({} outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        return {"choices": dict(hc.runtime.choices), "overrides": list(hc.overrides.task),
                "config_name": hc.job.config_name}
    except (ValueError, AttributeError, ImportError):
        return {}


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


def drafter_settings(name) -> type[Settings] | None:
    """The chosen drafter's settings class (its registry entry's); None for a plugin that declares none."""
    from .registry import drafter_entry

    return drafter_entry(name).settings


def validate(cfg, job: dict | None = None) -> Config:
    """Check the composed config: unknown keys, types, ranges. Raises `UserError` (one line) on the first fault.
    `job` = `hydra_choices()` (taken from the running Hydra job when not given). Returns the checked, typed config
    (`Config`: a frozen view per group; `drafter` stays the mapping its builder reads), the one object the task's
    runner reads its settings from."""
    job = hydra_choices() if job is None else job
    try:
        values = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    except Exception as e:                        # a broken ${...}: OmegaConf raises several types
        raise UserError(f"cannot resolve the config: {str(e).splitlines()[0]}") from None
    values.pop("hydra", None)
    task = (values.get("task") or {}).get("name") if isinstance(values.get("task"), dict) else None
    drafter = values.get("drafter")
    name = drafter.get("name") if isinstance(drafter, dict) else None
    settings = drafter_settings(name) if isinstance(name, str) else None
    own = {task, *TASK_READS.get(task, ())}
    tree = {k: v for k, v in key_tree(Config).items() if k not in TASK_GROUPS or k in own}
    if settings is not None:
        tree["drafter"] = key_tree(settings)

    def unknown(key: str) -> str:
        return unknown_key_message(tree, key, _source(key, job))

    try:
        _check_values(values, own, settings, drafter, unknown)
    except UserError as e:
        raise UserError(str(e) + _interpolation_hint(cfg, str(e))) from None
    return Config.from_dict(values)


def checked(cfg, s: Config | None = None) -> Config:
    """The typed config a runner reads: `s` as `validate` returned it on the task's way in (tasks.run_task, the
    API), else the typed view of `cfg` built here (a runner called directly, as the tests call them: every group
    checked alone, without validate's checks across groups)."""
    if s is not None:
        return s
    values = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    values.pop("hydra", None)
    typed = Config.from_cfg(values)                # keys and types
    _check_groups(values)
    return typed


def _interpolation_hint(cfg, message: str) -> str:
    """When the refused value came from an interpolation that resolves to a string (`${oc.env:N}` gives '8'), how
    to read it as the number, bool or list the key takes; else ""."""
    key = message.split("=", 1)[0]
    if not OmegaConf.is_config(cfg) or not re.fullmatch(r"[\w.]+", key) or "=" not in message:
        return ""
    raw: object = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    if not (isinstance(raw, str) and raw.startswith("${") and raw.endswith("}")) or "oc.decode" in raw:
        return ""
    return (f" ({key} is {raw}, which resolves to a string: write {key}='${{oc.decode:{raw}}}' to read it as a "
            f"number, bool or list)")


def _check_values(values: dict, own: set, settings, drafter, unknown) -> None:
    """The checks of `validate` on the resolved values."""
    for group in TASK_GROUPS:
        if group in values and group not in own:
            raise UserError(unknown(group))      # export.* etc. belong to their task's preset
    check(values, Config, unknown=unknown)
    if settings is not None and isinstance(drafter, dict):
        check(drafter, settings, "drafter", unknown)
        settings.check_values(drafter, values)
    elif drafter is not None and not isinstance(drafter, dict):
        raise UserError(f"drafter={_fmt(drafter)} must be a mapping with keys: name, ...")
    _check_groups(values)
    _check_target_fit(values)
    _check_compile(values)
    _check_shard(values)
    _check_hub(values)
    _check_sample_keys(values)
    _check_precision(values)


def resolve_auto(typed: Config, device) -> Config:
    """`typed` with the `auto` values that depend on the device resolved for `device`, once, at a run's edge:
    `target.dtype` as the dtype's name (targets/settings.resolve_dtype_name) and `eval.max_drafts` as the engine's
    cap at `eval.batch_size` (decoding/settings.max_drafts: an int, or None for the drafter's own K). The loader, the
    engine's settings (`decode_config`) and run.json then read the same concrete values; each still accepts `auto`
    from a caller outside a task (the experiment scripts) through the same two functions. Idempotent."""
    from .decoding.settings import max_drafts
    from .targets.settings import resolve_dtype_name

    dtype = resolve_dtype_name(typed.target.dtype, device)
    ev = typed.eval
    return dataclasses.replace(typed, target=typed.target.replaced(dtype=dtype),
                               eval=ev.replaced(max_drafts=max_drafts(ev.max_drafts, device, dtype, ev.batch_size)))


def _check_groups(values: dict) -> None:
    """Each group's own rules over its values (`Settings.check_values`), the whole config at hand."""
    for group, cls in (GROUPS | TASK_GROUPS).items():
        if isinstance(values.get(group), dict):
            cls.check_values(values[group], values)


def _check_sample_keys(values: dict) -> None:
    """The keys of a mapping `eval.num_samples={gsm8k: 2}` (`eval.timed_samples` likewise) are selected benchmarks:
    any other key would be ignored and the selected benchmark would run (time) all its prompts. `eval.tune_samples`'
    shipped default names all eight benchmarks, so its keys need only be benchmarks (a typo's key would be ignored
    all the same)."""
    from .benchmarks import BENCHMARKS

    e, names = values.get("eval") or {}, (values.get("benchmark") or {}).get("names") or []
    _known_keys("eval.num_samples", e.get("num_samples"), names, "benchmark.names (the selected benchmarks)")
    _known_keys("eval.timed_samples", e.get("timed_samples"), names, "benchmark.names (the selected benchmarks)")
    _known_keys("eval.tune_samples", e.get("tune_samples"), [*BENCHMARKS],
                f"the benchmarks (selected: {', '.join(names)})")


def _known_keys(key: str, mapping, valid: list, what: str) -> None:
    extra = sorted(set(mapping) - set(valid)) if isinstance(mapping, dict) else []
    if extra:
        raise UserError(f"{key}: {', '.join(map(repr, extra))} is not among {what}; the keys must be one of: "
                        f"{', '.join(valid)}")


HALF_TRUE = ("bf16-true", "16-true")              # weights and activations in half precision, no float32 master


def _check_compile(values: dict) -> None:
    """`target.compile=true` compiles the static engine's steps (targets/static.py): with the HF engine it would
    change nothing, silently."""
    t = values.get("target") or {}
    if t.get("compile") is True and t.get("engine", "hf") == "hf":
        raise UserError("target.compile=true needs target.engine=static or auto (the compiled steps run on its "
                        "preallocated KV cache), not target.engine=hf; add target.engine=static")


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
    t = values.get("target") or {}
    if t.get("loader") == "tiny_qwen3" and t.get("hidden_size", 0) % max(1, t.get("num_heads", 1)):
        raise UserError(f"target.hidden_size={t['hidden_size']} must be a multiple of target.num_heads="
                        f"{t['num_heads']}")
