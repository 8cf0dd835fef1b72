"""What a run's summary is made of, without running anything: the settings its results depend on (`run_settings`,
run.json), and summary.json from the records (`summarize`, `summarize_records`: τ with its bootstrap CI, speedup,
per-position acceptance, the drafter's own metrics). The engine's settings live in decoding/settings.py.

Evaluation (evaluator.py), replay (replay.py), the α/β grid (fusion_grid.py) and merging shards (merge.py) all
summarise through here, so a number means the same whichever task produced it.
"""
from __future__ import annotations

import os

from omegaconf import OmegaConf

from ..config import Config, EvalConfig, checked, resolve_auto
from ..decoding.engine import DecodeConfig, drafts_per_round
from ..decoding.settings import draft_vocab
from ..machine import describe
from ..paths import repo_path
from ..targets.hf import target_settings
from . import metrics
from .store import content_digest


def vocab_settings(ev: EvalConfig, drafter_name: str, device, timed: bool = True) -> dict:
    """`eval.draft_vocab` for a run's settings: N and its regeneration set, or {} for the whole vocabulary (so runs
    made before the key existed resume)."""
    vocab = draft_vocab(ev, drafter_name, device, timed)
    return {"draft_vocab": vocab[0], "draft_vocab_from": vocab[1]} if vocab else {}


def summarize(records: list[dict], names: list[str], target, drafter, dc: DecodeConfig, round_metrics=None,
              mode: str = "online", timed: dict | None = None, batch_size: int | None = None,
              references_source: dict | None = None) -> dict:
    """summary.json. `mode`: "online" (decoded by the engine) or "replay" (eval/replay.py: no timing fields,
    near-tie counts instead). τ comes with its 95% bootstrap CI over prompts, per benchmark and macro; the speedup
    too, over the timed prompts. `timed`: {"samples": eval.timed_samples, "seed": seed} of a run that times a subset
    (eval/shards.py), None when it times every prompt. `batch_size`: the rows an online run decoded side by side
    (eval.batch_size; its speedups are throughput ratios at that batch); replay's τ is the same at every batch.
    `references_source`: a replay's reference engine (eval/references.py `reference_source`)."""
    header = {
        "target": target.name, "drafter": drafter.name if drafter is not None else "none", "mode": mode,
        "decoding": {"temperature": dc.temperature, "protocol": dc.protocol},
        "max_new_tokens": dc.max_new_tokens, "num_draft_tokens": drafts_per_round(drafter, dc),
        "target_dtype": str(target.dtype).removeprefix("torch."), "machine": describe(target.device),
        **({"timed": timed} if timed is not None else {}),
        **({"references_source": references_source} if references_source is not None else {}),
        **({"batch_size": batch_size} if batch_size is not None else {}),
    }
    return summarize_records(records, names, header, round_metrics)


SUMMARY_HEADER = ("target", "drafter", "mode", "decoding", "max_new_tokens", "num_draft_tokens")
MACHINE_HEADER = ("target_dtype", "machine")    # where it ran; absent from summaries made before they were recorded
BATCH_HEADER = ("batch_size",)                   # online runs: the rows decoded side by side (absent before: 1)
REFERENCES_HEADER = ("references_source",)       # replays: the engine that decoded the references (absent before)


def summarize_records(records: list[dict], names: list[str], header: dict, round_metrics=None) -> dict:
    """summary.json from the records alone and the run's `header` (the SUMMARY_HEADER keys of a summary, and `timed`
    when the run timed a subset), without the models: what `summarize` computes, and what task=merge (eval/merge.py)
    computes over merged shards. The bootstrap CIs depend on the order of the prompts within each benchmark (the
    records' order). Speedup, TPOT, TTFT and the speedup's CI come from the timed turns alone (metrics.py); a
    summary of a timed subset says which prompts were timed (`timed.ids`, from the records)."""
    k, mode = header["num_draft_tokens"], header["mode"]
    by_bench = {n: [r for r in records if r["benchmark"] == n] for n in names}
    by_bench = {n: rs for n, rs in by_bench.items() if rs}
    benches = {n: metrics.summarize_benchmark(rs, k) for n, rs in by_bench.items()}
    ci, macro_ci = metrics.tau_ci95(by_bench)
    sci, macro_sci = metrics.speedup_ci95s(by_bench)
    macro = metrics.macro(benches) | {"tau_ci95": macro_ci, "speedup_ci95": macro_sci}
    for n, b in benches.items():                        # the drafter's own per-benchmark fields, keys its own
        b["tau_ci95"] = ci.get(n)
        b["speedup_ci95"] = sci.get(n)
        b.update((round_metrics.benchmark(by_bench[n]) or {}) if round_metrics is not None else {})
        if mode == "replay":
            for key in metrics.TIMING_KEYS:
                b.pop(key, None)
            b.update(metrics.near_tie_summary(by_bench[n]))
    if mode == "replay":
        for key in metrics.TIMING_KEYS:
            macro.pop(key, None)
    head = {key: header[key] for key in (*SUMMARY_HEADER, *MACHINE_HEADER, *BATCH_HEADER, *REFERENCES_HEADER)
            if key in header}
    if mode != "replay" and header.get("timed") is not None:
        head["timed"] = {**header["timed"], "ids": {n: metrics.timed_ids(rs) for n, rs in by_bench.items()}}
    return {**head, "benchmarks": benches, "macro": macro}


def capped(ev: EvalConfig) -> dict:
    """`eval.max_drafts` (resolved: config.resolve_auto) and the batch size for a run's settings, each absent when it
    is the default, so that the directories of runs made before the keys existed still resume, and a run made with
    `auto` resumes under the number it meant."""
    batch = {"batch_size": ev.batch_size} if ev.batch_size != 1 else {}      # batch 1: as before the key existed
    return ({"max_drafts": ev.max_drafts} if ev.max_drafts is not None else {}) | batch


def run_settings(cfg, device, typed: Config | None = None) -> dict:
    """Every setting that changes a result, for run.json (the samples and their prompts are added by the store).
    Not here: benchmark names, source, data_dir, num_samples and shuffle_seed, which only select samples (the
    store compares the selected samples and their prompt text instead), and progress/logger/warmup. task=eval adds
    the timed subset when there is one (eval/shards.py `with_timed`): it depends on the selection too."""
    container = OmegaConf.to_container
    typed = resolve_auto(checked(cfg, typed), device)
    drafter, ev = container(cfg.drafter, resolve=True), typed.eval
    vocab = vocab_settings(ev, drafter.get("name"), device)
    return {
        "target": target_settings(cfg.target, device), "drafter": drafter,
        "checkpoint_content": checkpoint_digests(drafter) | checkpoint_digests(vocab, "eval"),
        "decoding": container(cfg.decoding, resolve=True),
        "eval": {k: getattr(ev, k) for k in ("max_new_tokens", "run_ar", "check_lossless", "near_tie", "save_text")}
        | capped(ev) | vocab,
        "seed": typed.seed, "device": device.type, "cpu_threads": typed.cpu_threads,
    }


def checkpoint_digests(node: dict, prefix: str = "drafter") -> dict[str, str]:
    """{dotted key: content digest} of every `*checkpoint` setting (and `draft_vocab_from`, whose answers rank the
    draft vocabulary) that names a local file or directory (a hub id is pinned by its name alone)."""
    out = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(checkpoint_digests(v, f"{prefix}.{k}"))
        elif str(k).endswith("checkpoint") and isinstance(v, str) and os.path.exists(os.path.expanduser(v)):
            out[f"{prefix}.{k}"] = content_digest(os.path.expanduser(v))
        elif k == "draft_vocab_from" and isinstance(v, str) and repo_path(v).exists():
            out[f"{prefix}.{k}"] = content_digest(str(repo_path(v)))
    return out
