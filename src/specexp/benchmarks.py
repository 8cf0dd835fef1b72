"""Benchmarks: prompt files -> chat turns, with the prompt formats of the DFlash reference benchmark.

Files (`data/benchmarks/*.jsonl`, see its MANIFEST.md): one JSON object per line,
`{"id": str, "turns": [user message, ...]}`. Multi-turn samples (MT-Bench) are run turn by turn, each next
user turn following the model's own previous answer. Selection: the file's samples are shuffled with
`random.Random(shuffle_seed)` and the first `num_samples` kept (the reference's current main does the same
on its JSONL cache; its paper-era code used `datasets.shuffle(seed=0)`, a different subset).

Splits: every choice made from measurements (fusion weights α/β, recipes, thresholds) is made on a **tuning
split** disjoint from the **evaluation split**. Per benchmark, the tuning split is the last `tune_samples` prompts
of the shuffled order and the evaluation split everything before them, so `split=eval` with
`num_samples <= len - tune_samples` selects exactly what it selected before splits existed, and the two never
share a prompt. `tune_samples` is an int (every benchmark) or a mapping name -> int (absent names: 0); the mini
eval reserves 20 per benchmark except AIME25 (30 prompts, all of them evaluation prompts); the paper eval none.

Formats: math (gsm8k, math500, aime25) = question + MATH_SUFFIX; humaneval = HUMANEVAL_WRAPPER; mbpp and
livecodebench are staged already formatted (MBPP paper template; LCB "### Question / ### Format / ### Answer"
prompt); mt_bench and alpaca are used as they are.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import UserError, check

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_WRAPPER = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                     "```python\n{prompt}\n```")
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "benchmarks"


def _math(q: str) -> str:
    return q + MATH_SUFFIX


def _humaneval(q: str) -> str:
    return HUMANEVAL_WRAPPER.format(prompt=q)


def _same(q: str) -> str:
    return q


@dataclass(frozen=True)
class BenchmarkSpec:
    file: str
    format: Callable[[str], str]
    paper_samples: int                  # the DeLS-Spec / DFlash harness counts (eval=paper)
    hf: tuple | None = None             # (dataset, config, split, field) for benchmark.source=hf
    family: str = ""                    # math | code | chat: the DeLS paper's grouping (its claims compare them)


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec("gsm8k.jsonl", _math, 128, ("openai/gsm8k", "main", "test", "question"), "math"),
    "math500": BenchmarkSpec("math500.jsonl", _math, 128, ("HuggingFaceH4/MATH-500", None, "test", "problem"), "math"),
    "aime25": BenchmarkSpec("aime25.jsonl", _math, 30, ("MathArena/aime_2025", None, "train", "problem"), "math"),
    "humaneval": BenchmarkSpec("humaneval.jsonl", _humaneval, 164,
                               ("openai/openai_humaneval", None, "test", "prompt"), "code"),
    "mbpp": BenchmarkSpec("mbpp.jsonl", _same, 128, ("google-research-datasets/mbpp", "sanitized", "test", "prompt"),
                          "code"),
    "livecodebench": BenchmarkSpec("livecodebench_leetcode_subset.jsonl", _same, 128, family="code"),
    "mt_bench": BenchmarkSpec("mt_bench.jsonl", _same, 80, ("HuggingFaceH4/mt_bench_prompts", None, "train", "prompt"),
                              "chat"),
    "alpaca": BenchmarkSpec("alpaca.jsonl", _same, 128, family="chat"),
}


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
    check(path.exists(), f"benchmark file {path} does not exist")
    rows, first_line = [], {}
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
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


def _read_hf(name: str, spec: BenchmarkSpec) -> list[dict]:
    check(spec.hf is not None, f"benchmark.source=hf: no hub dataset is known for {name}; use benchmark.source=local")
    import datasets

    dataset, config, split, key = spec.hf
    try:
        ds = datasets.load_dataset(dataset, config, split=split)
    except Exception as e:
        raise UserError(f"benchmark.source=hf: cannot load {dataset} ({type(e).__name__}); "
                        f"use benchmark.source=local (the staged copies in data/benchmarks)") from None
    rows = []
    for i, r in enumerate(ds):
        turns = r[key] if isinstance(r[key], list) else [r[key]]
        rows.append({"id": f"{name}/{r.get('task_id', r.get('prompt_id', i))}", "turns": list(turns)})
    dup = [i for i, c in Counter(r["id"] for r in rows).items() if c > 1]
    check(not dup, f"benchmark.source=hf: {dataset} gives two samples the id {dup[0]!r}; use benchmark.source=local")
    return rows


SPLITS = ("eval", "tune")


def load(names: list[str], num_samples, shuffle_seed: int = 0, source: str = "local",
         data_dir: str | Path | None = None, split: str = "eval", tune_samples=0) -> list[Sample]:
    """Samples of each named benchmark's `split` ("eval" or "tune", see the module docstring), in benchmark order.

    `num_samples`: None (all), an int (per benchmark), `"paper"` (the harness counts) or a mapping
    name -> int | None; it counts within the split.
    """
    check(split in SPLITS, f"eval.split={split!r} is not valid; choose one of: {', '.join(SPLITS)}")
    check(source in ("local", "hf"), f"benchmark.source={source!r} is not valid; choose one of: local, hf")
    data_dir = Path(data_dir) if data_dir else DATA_DIR
    out = []
    for name in names:
        check(name in BENCHMARKS, f"benchmark {name!r} is not valid; choose from: {', '.join(BENCHMARKS)}")
        spec = BENCHMARKS[name]
        rows = read_jsonl(data_dir / spec.file) if source == "local" else _read_hf(name, spec)
        random.Random(shuffle_seed).shuffle(rows)
        t = tune_samples.get(name, 0) if hasattr(tune_samples, "get") else tune_samples
        check(isinstance(t, int) and 0 <= t < len(rows), f"eval.tune_samples={t!r} for {name} must be an int in "
                                                         f"[0, {len(rows)}) (it has {len(rows)} prompts)")
        rows = rows[len(rows) - t:] if split == "tune" else rows[:len(rows) - t]
        n = num_samples.get(name) if hasattr(num_samples, "get") else num_samples
        if n == "paper":
            n = spec.paper_samples
        check(n is None or (isinstance(n, int) and n > 0), f"eval.num_samples={n!r} must be a positive int or null")
        out += [Sample(r["id"], name, [spec.format(t) for t in r["turns"]]) for r in rows[:n]]
    return out
