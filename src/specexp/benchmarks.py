"""Benchmarks: prompt files -> chat turns, in two editions.

Files (`data/benchmarks/*.jsonl`, see its MANIFEST.md): one JSON object per line,
`{"id": str, "turns": [user message, ...]}`. Multi-turn samples (MT-Bench) are run turn by turn, each next
user turn following the model's own previous answer.

Editions (`benchmark.edition`):
- `staged` (the default, offline): the files staged in data/benchmarks, selected as the DFlash reference's
  current main selects from its JSONL cache: the file's samples shuffled with `random.Random(shuffle_seed)`,
  the first `num_samples` kept. MBPP is the full test split in the MBPP paper's template, Alpaca is EAGLE's
  80-question set, LiveCodeBench a 127-problem LeetCode part of it.
- `reference`: the prompts and the selection of the DFlash paper-era harness, the one the DeLS-Spec and DFlash
  tables were measured with. MBPP is the sanitized test split's `prompt` field (257, staged), Alpaca the 52K
  tatsu-lab/alpaca rows as `instruction\n\nInput:\n{input}` (hub only), LiveCodeBench the
  `livecodebench/code_generation_lite` test files with the harness's prompt (hub only); the other five are the
  staged files themselves. Selection: `datasets.Dataset.shuffle(seed=shuffle_seed).select(range(num_samples))`
  when a benchmark has more prompts than asked (numpy's `default_rng(seed).permutation`, the same permutation,
  computed here without `datasets`), else every prompt in file order. It assumes the staged files list their
  prompts in the hub datasets' order (MANIFEST.md says where that is checked).

Splits: every choice made from measurements (fusion weights α/β, recipes, thresholds) is made on a **tuning
split** disjoint from the **evaluation split**. Per benchmark, the tuning split is the last `tune_samples` prompts
of the selection order and the evaluation split everything before them, so `split=eval` with
`num_samples <= len - tune_samples` selects exactly what it selected before splits existed, and the two never
share a prompt. `tune_samples` is an int (every benchmark) or a mapping name -> int (absent names: 0); the mini
eval reserves 20 per benchmark except AIME25 (30 prompts, all of them evaluation prompts); the paper eval none.

Formats: math (gsm8k, math500, aime25) = question + MATH_SUFFIX; humaneval = HUMANEVAL_WRAPPER; the staged mbpp
and livecodebench files are staged already formatted (MBPP paper template; LCB "### Question / ### Format /
### Answer" prompt); mt_bench and alpaca are used as they are.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import files, paths, pins
from .errors import UserError, check

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_WRAPPER = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                     "```python\n{prompt}\n```")
DATA_DIR = paths.DATA_DIR / "benchmarks"


def _math(q: str) -> str:
    return q + MATH_SUFFIX


def _humaneval(q: str) -> str:
    return HUMANEVAL_WRAPPER.format(prompt=q)


def _same(q: str) -> str:
    return q


LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
              "generate a correct Python program that matches the specification and passes all tests. You will NOT "
              "return anything except for the program")
LCB_REPO = "livecodebench/code_generation_lite"
LCB_FILES = [f"https://huggingface.co/datasets/{LCB_REPO}/resolve/main/{f}"
             for f in ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")]


def _alpaca_turns(row: dict) -> list[str]:
    return [f"{row['instruction']}\n\nInput:\n{row['input']}" if row["input"] else row["instruction"]]


def _lcb_turns(row: dict) -> list[str]:
    if row.get("starter_code"):
        fmt, code = "### Format: Use the following code structure:", f"```python\n{row['starter_code']}\n```"
    else:
        fmt, code = "### Format: Write your code in the following format:", "```python\n# YOUR CODE HERE\n```"
    return [f"{LCB_SYSTEM}\n\n### Question:\n{row['question_content']}\n\n{fmt}\n{code}\n\n"
            "### Answer: (use the provided format with backticks)"]


def _mbpp_template(row: dict) -> list[str]:
    tests = "\n".join(row["test_list"])
    return [f"You are an expert Python programmer, and here is your task: {row['text']} Your code should pass these "
            f"tests:\n\n{tests}"]


def _field(key: str) -> Callable[[dict], list[str]]:
    return lambda row: list(row[key]) if isinstance(row[key], list) else [row[key]]


@dataclass(frozen=True)
class Hub:
    """A hub dataset an edition can load instead of its staged file (benchmark.source=hf)."""
    dataset: str
    config: str | None
    split: str
    turns: Callable[[dict], list[str]]  # row -> user turns, before `format`
    id_key: str | None = None           # None: the row index
    data_files: tuple[str, ...] | None = None   # URLs of files in the repo `files_repo` (dataset = "json")
    files_repo: str | None = None


@dataclass(frozen=True)
class Edition:
    file: str | None                    # staged in data/benchmarks; None = hub only
    format: Callable[[str], str]
    hub: Hub | None


@dataclass(frozen=True)
class BenchmarkSpec:
    staged: Edition
    paper_samples: int                  # the DeLS-Spec / DFlash harness counts (eval=paper)
    family: str = ""                    # math | code | chat: the DeLS paper's grouping (its claims compare them)
    reference: Edition | None = None    # None: the reference edition is the staged one

    def edition(self, name: str) -> Edition:
        return self.staged if name == "staged" or self.reference is None else self.reference


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec(Edition("gsm8k.jsonl", _math, Hub("openai/gsm8k", "main", "test", _field("question"))),
                           128, "math"),
    "math500": BenchmarkSpec(Edition("math500.jsonl", _math,
                                     Hub("HuggingFaceH4/MATH-500", None, "test", _field("problem"), "unique_id")),
                             128, "math"),
    "aime25": BenchmarkSpec(Edition("aime25.jsonl", _math,
                                    Hub("MathArena/aime_2025", None, "train", _field("problem"))), 30, "math"),
    "humaneval": BenchmarkSpec(Edition("humaneval.jsonl", _humaneval,
                                       Hub("openai/openai_humaneval", None, "test", _field("prompt"), "task_id")),
                               164, "code"),
    "mbpp": BenchmarkSpec(Edition("mbpp.jsonl", _same,
                                  Hub("google-research-datasets/mbpp", "full", "test", _mbpp_template, "task_id")),
                          128, "code",
                          Edition("mbpp_sanitized.jsonl", _same,
                                  Hub("google-research-datasets/mbpp", "sanitized", "test", _field("prompt"),
                                      "task_id"))),
    "livecodebench": BenchmarkSpec(Edition("livecodebench_leetcode_subset.jsonl", _same, None), 128, "code",
                                   Edition(None, _same, Hub("json", None, "train", _lcb_turns, "question_id",
                                                            tuple(LCB_FILES), LCB_REPO))),
    "mt_bench": BenchmarkSpec(Edition("mt_bench.jsonl", _same,
                                      Hub("HuggingFaceH4/mt_bench_prompts", None, "train", _field("prompt"),
                                          "prompt_id")), 80, "chat"),
    "alpaca": BenchmarkSpec(Edition("alpaca.jsonl", _same, None), 128, "chat",
                            Edition(None, _same, Hub("tatsu-lab/alpaca", None, "train", _alpaca_turns))),
}
EDITIONS = ("staged", "reference")


def families() -> dict[str, list[str]]:
    """Benchmark family -> its benchmarks, in table order (math, code, chat)."""
    out: dict[str, list[str]] = {}
    for name, spec in BENCHMARKS.items():
        out.setdefault(spec.family, []).append(name)
    return out


@dataclass
class Sample:
    id: str
    benchmark: str
    turns: list[str]                    # user messages, already formatted


def read_jsonl(path: Path) -> list[dict]:
    """Read a benchmark file; any malformed line is one clear error naming file and line."""
    rows, first_line = [], {}
    # files.read_text: a missing file, a directory and bytes that are not UTF-8 are one line each
    for n, line in enumerate(files.read_text(path, "benchmark file").split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path} line {n}: not valid JSON ({e.msg})") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        check(isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns),
              f"{path} line {n}: expected {{\"id\": str, \"turns\": [non-empty str, ...]}}")
        sid = str(row.get("id", f"{path.stem}/{n}"))
        # Results are keyed by id (resume, paired comparisons): two samples with one id would be merged.
        check(sid not in first_line, f"{path} line {n}: duplicate id {sid!r} (also on line {first_line.get(sid)}); "
                                     f"every sample needs its own id")
        first_line[sid] = n
        rows.append({"id": sid, "turns": turns})
    check(bool(rows), f"benchmark file {path} is empty")
    return rows


def _read_hf(name: str, ed: Edition) -> list[dict]:
    check(ed.hub is not None, f"benchmark.source=hf: no hub dataset is known for {name}; use benchmark.source=local")
    import datasets

    h = ed.hub
    try:
        if h.data_files:            # files of a hub repo by URL: its pin replaces the branch in the URL
            rev = pins.pinned(h.files_repo, "dataset") or "main"
            files = [f.replace("/resolve/main/", f"/resolve/{rev}/") for f in h.data_files]
            ds = datasets.load_dataset(h.dataset, data_files={h.split: files}, split=h.split)
        else:
            ds = datasets.load_dataset(h.dataset, h.config, split=h.split, revision=pins.pinned(h.dataset, "dataset"))
    except Exception as e:
        raise UserError(f"benchmark.source=hf: cannot load {h.dataset} ({type(e).__name__}); use "
                        f"benchmark.source=local (the staged copies in data/benchmarks)") from None
    rows = [{"id": f"{name}/{r[h.id_key] if h.id_key else i}", "turns": h.turns(r)} for i, r in enumerate(ds)]
    dup = [i for i, c in Counter(r["id"] for r in rows).items() if c > 1]
    if dup:
        raise UserError(f"benchmark.source=hf: {h.dataset} gives two samples the id {dup[0]!r}; use "
                        f"benchmark.source=local")
    return rows


def reference_order(n_rows: int, max_samples: int, seed: int) -> list[int]:
    """The paper-era DFlash harness's order: `Dataset.shuffle(seed)`'s permutation (numpy `default_rng(seed)`)
    when the benchmark has more rows than the harness's `max_samples` (its paper count), else the rows as they
    are. Fixed by the paper count, not by `num_samples`, so that every selection is a prefix of the paper's and
    the tuning split (the last rows of this order) never meets an evaluation selection."""
    import numpy as np

    if n_rows <= max_samples:
        return list(range(n_rows))
    return np.random.default_rng(seed).permutation(n_rows).tolist()


SPLITS = ("eval", "tune")


def load(names: list[str], num_samples, shuffle_seed: int = 0, source: str = "local",
         data_dir: str | Path | None = None, split: str = "eval", tune_samples=0,
         edition: str = "staged") -> list[Sample]:
    """Samples of each named benchmark's `split` ("eval" or "tune", see the module docstring), in benchmark order.

    `num_samples`: None (all), an int (per benchmark), `"paper"` (the harness counts) or a mapping
    name -> int | None; it counts within the split. `edition`: staged | reference (the module docstring).
    """
    check(split in SPLITS, f"eval.split={split!r} is not valid; choose one of: {', '.join(SPLITS)}")
    check(source in ("local", "hf"), f"benchmark.source={source!r} is not valid; choose one of: local, hf")
    check(edition in EDITIONS, f"benchmark.edition={edition!r} is not valid; choose one of: {', '.join(EDITIONS)}")
    data_dir = Path(data_dir) if data_dir else DATA_DIR
    check(source != "local" or data_dir.is_dir(),
          f"benchmark.data_dir={str(data_dir)!r} is {'a file' if data_dir.exists() else 'missing'}; expected a "
          f"directory holding the benchmark JSONL files (e.g. gsm8k.jsonl)")
    for name in names:              # every name and staged file is checked before any file is read
        check(name in BENCHMARKS, f"benchmark {name!r} is not valid; choose from: {', '.join(BENCHMARKS)}")
        ed = BENCHMARKS[name].edition(edition)
        hub = ed.hub.dataset if ed.hub else "?"
        check(source == "hf" or ed.file is not None,
              f"benchmark {name} (edition={edition}) has no staged file: its prompts ({hub}) are loaded from the "
              f"hub only; use benchmark.source=hf, or benchmark.edition=staged offline")
    out = []
    for name in names:
        spec = BENCHMARKS[name]
        ed = spec.edition(edition)
        rows = read_jsonl(data_dir / ed.file) if source == "local" else _read_hf(name, ed)
        n = num_samples.get(name) if hasattr(num_samples, "get") else num_samples
        if n == "paper":
            n = spec.paper_samples
        check(n is None or (isinstance(n, int) and n > 0), f"eval.num_samples={n!r} must be a positive int or null")
        t = tune_samples.get(name, 0) if hasattr(tune_samples, "get") else tune_samples
        check(isinstance(t, int) and 0 <= t < len(rows), f"eval.tune_samples={t!r} for {name} must be an int in "
                                                         f"[0, {len(rows)}) (it has {len(rows)} prompts)")
        if edition == "reference":
            rows = [rows[i] for i in reference_order(len(rows), spec.paper_samples, shuffle_seed)]
        else:
            random.Random(shuffle_seed).shuffle(rows)
        rows = rows[len(rows) - t:] if split == "tune" else rows[:len(rows) - t]
        out += [Sample(r["id"], name, [ed.format(x) for x in r["turns"]]) for r in rows[:n]]
    return out


def from_config(bench, ev) -> list[Sample]:
    """`load` with the `benchmark` and `eval` config groups' typed views (config.BenchmarkConfig, EvalConfig: the
    evaluator, replay and the α/β grid)."""
    return load(list(bench.names), ev.num_samples, ev.shuffle_seed, bench.source, bench.data_dir, ev.split,
                ev.tune_samples, bench.edition)
