"""What a run's summary is made of, without running anything: the decoding settings (`decode_config`), the settings
its results depend on (`run_settings`, run.json), and summary.json from the records (`summarize`,
`summarize_records`: τ with its bootstrap CI, speedup, per-position acceptance, the drafter's own metrics).

Evaluation (evaluator.py), replay (replay.py), the α/β grid (fusion_grid.py) and merging shards (merge.py) all
summarise through here, so a number means the same whichever task produced it.
"""
from __future__ import annotations

import dataclasses
import os

import torch
from omegaconf import OmegaConf

from ..config import Config, DecodingConfig, EvalConfig, checked
from ..decoding.engine import DecodeConfig, drafts_per_round
from ..machine import describe
from ..paths import repo_path
from ..targets.hf import resolve_dtype, target_settings
from . import metrics
from .store import content_digest

# `eval.max_drafts=auto` on a CPU running the target in bf16: the cap measured fastest on the tuning split there
# (DFlash, mini target, 2-core AVX512-BF16 EPYC; 2, 3, 4 and 7 drafts paired on 70 prompts: 3 gave macro +0.11x
# [+0.08, +0.14] over the drafter's own 7 for -0.015 tau; experiments/results/draft_cap/dflash-tune-bf16-all.md).
CPU_BF16_MAX_DRAFTS = 3
# ... and in fp32, with the linear layers packed by the measured plan (targets/cpu_linear.py): 2, 3, 4 and 7 drafts
# paired on 56 tuning prompts of 7 benchmarks (2-core Xeon, idle): 3 gave macro +0.118x [+0.108, +0.130] over 7 for
# -0.020 tau, ahead of 2 (+0.085) and 4 (+0.012) (experiments/results/draft_cap/dflash-tune-fp32-packed.md).
CPU_FP32_MAX_DRAFTS = 3


def max_drafts(value, device, dtype, batch: int = 1) -> int | None:
    """`eval.max_drafts` as the engine's cap (None: the drafter's own K). `auto`: on a CPU, at most
    `CPU_BF16_MAX_DRAFTS` (bf16) or `CPU_FP32_MAX_DRAFTS` (fp32), since there a verify of k+1 rows grows with k (a
    matrix product against a 1-row step's matrix-vector product) while the later drafts are rarely accepted;
    elsewhere the drafter's own K (on a GPU a verify of 16 rows costs about one step). A mapping {B: cap}
    is a table by batch size (`eval.batch_size`): the entry of the largest B at or below the run's batch, none below
    it meaning the drafter's own K; at batch B a verify is B (k+1) rows, so the cap that pays shrinks as B grows
    (experiments/bench_batch.py measures it). The output is the target's whatever the cap; τ and a round's cost
    change. It caps every drafter (a tree's depth, for EAGLE-3's trees), though `auto` was chosen on DFlash chains."""
    if isinstance(value, dict):
        at = [b for b in value if b <= batch]
        return value[max(at)] if at else None
    if value != "auto":
        return value
    if torch.device(device).type != "cpu":
        return None
    return {torch.bfloat16: CPU_BF16_MAX_DRAFTS, torch.float32: CPU_FP32_MAX_DRAFTS}.get(dtype)


def resolve_auto(typed: Config, device) -> Config:
    """`typed` with `eval.max_drafts` as the concrete cap the run uses on `device` (`auto` or a per-batch table
    resolved by `max_drafts`: an int, or None for the drafter's own K). A runner resolves it once, at its edge, so
    the engine's settings (`decode_config`) and run.json (`capped`) read the same number; both still accept `auto`
    from callers outside a task (the experiment scripts)."""
    ev = typed.eval
    cap = max_drafts(ev.max_drafts, device, resolve_dtype(typed.target.dtype, device), ev.batch_size)
    return dataclasses.replace(typed, eval=ev.replaced(max_drafts=cap))


# `eval.draft_vocab=auto` on a CPU: DFlash drafting from the 8,192 most frequent answer tokens. Chosen on the tuning
# split (fp32, packed, 3 drafts, 2-core Xeon; 56 prompts of 7 benchmarks, paired): 2,048 / 4,096 / 8,192 tokens gave
# macro +0.100 / +0.093 / +0.092x over the whole vocabulary, within each other's CIs; 8,192 is the one whose τ did not
# move (Δτ +0.000 [+0.000, +0.000]: every draft the same), +0.092x [+0.076, +0.110]
# (experiments/results/draft_cap/dflash-tune-fp32-vocab.md).
CPU_DRAFT_VOCAB = 8192


def draft_vocab(ev: EvalConfig, drafter_name: str, device, timed: bool = True) -> tuple[int, str] | None:
    """`eval.draft_vocab` as (N, the regeneration set) or None (the whole vocabulary). `auto`: `CPU_DRAFT_VOCAB` on a
    CPU for drafter=dflash where `eval.draft_vocab_from` names an existing directory (eval=mini: the target's own
    answers in data/regen/, which only the mini target has), else None: on a GPU the projection of a few rows costs
    about nothing; and None where nothing is `timed` (replay, the α/β grid: τ alone, which a speed setting should
    not move). The drafts change, never the output; τ may (where the target's token lies outside the N)."""
    n, src = ev.draft_vocab, ev.draft_vocab_from
    if n == "auto":
        if not timed:
            return None
        fits = (torch.device(device).type == "cpu" and drafter_name == "dflash" and isinstance(src, str)
                and repo_path(src).is_dir())
        return (CPU_DRAFT_VOCAB, src) if fits else None
    return None if n is None else (n, src)


def vocab_settings(ev: EvalConfig, drafter_name: str, device, timed: bool = True) -> dict:
    """`eval.draft_vocab` for a run's settings: N and its regeneration set, or {} for the whole vocabulary (so runs
    made before the key existed resume)."""
    vocab = draft_vocab(ev, drafter_name, device, timed)
    return {"draft_vocab": vocab[0], "draft_vocab_from": vocab[1]} if vocab else {}


def decode_config(decoding: DecodingConfig, ev: EvalConfig, target) -> DecodeConfig:
    """The engine's settings from the validated `decoding` and `eval` groups (config.py checked their values)."""
    return DecodeConfig(decoding.protocol, float(decoding.temperature), ev.max_new_tokens,
                        tuple(target.stop_token_ids),
                        max_drafts(ev.max_drafts, target.device, target.dtype, ev.batch_size))


def summarize(records: list[dict], names: list[str], target, drafter, dc: DecodeConfig, round_metrics=None,
              mode: str = "online", timed: dict | None = None, batch_size: int | None = None) -> dict:
    """summary.json. `mode`: "online" (decoded by the engine) or "replay" (eval/replay.py: no timing fields,
    near-tie counts instead). τ comes with its 95% bootstrap CI over prompts, per benchmark and macro; the speedup
    too, over the timed prompts. `timed`: {"samples": eval.timed_samples, "seed": seed} of a run that times a subset
    (eval/shards.py), None when it times every prompt. `batch_size`: the rows an online run decoded side by side
    (eval.batch_size; its speedups are throughput ratios at that batch); replay's τ is the same at every batch."""
    header = {
        "target": target.name, "drafter": drafter.name if drafter is not None else "none", "mode": mode,
        "decoding": {"temperature": dc.temperature, "protocol": dc.protocol},
        "max_new_tokens": dc.max_new_tokens, "num_draft_tokens": drafts_per_round(drafter, dc),
        "target_dtype": str(target.dtype).removeprefix("torch."), "machine": describe(target.device),
        **({"timed": timed} if timed is not None else {}),
        **({"batch_size": batch_size} if batch_size is not None else {}),
    }
    return summarize_records(records, names, header, round_metrics)


SUMMARY_HEADER = ("target", "drafter", "mode", "decoding", "max_new_tokens", "num_draft_tokens")
MACHINE_HEADER = ("target_dtype", "machine")    # where it ran; absent from summaries made before they were recorded
BATCH_HEADER = ("batch_size",)                   # online runs: the rows decoded side by side (absent before: 1)


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
    head = {key: header[key] for key in (*SUMMARY_HEADER, *MACHINE_HEADER, *BATCH_HEADER)
            if key in header}
    if mode != "replay" and header.get("timed") is not None:
        head["timed"] = {**header["timed"], "ids": {n: metrics.timed_ids(rs) for n, rs in by_bench.items()}}
    return {**head, "benchmarks": benches, "macro": macro}


def capped(ev: EvalConfig, target_cfg, device) -> dict:
    """`eval.max_drafts` for a run's settings, `auto` (or a table) as what it resolves to on `device` with the target
    group's dtype at `eval.batch_size`, and the batch size when not 1: each absent when it is the default, so that the
    directories of runs made before the key existed still resume, and a run made with `auto` resumes under the number
    it meant."""
    cap = max_drafts(ev.max_drafts, device, resolve_dtype(target_cfg.dtype, device), ev.batch_size)
    batch = {"batch_size": ev.batch_size} if ev.batch_size != 1 else {}      # batch 1: as before the key existed
    return ({"max_drafts": cap} if cap is not None else {}) | batch


def run_settings(cfg, device, typed: Config | None = None) -> dict:
    """Every setting that changes a result, for run.json (the samples and their prompts are added by the store).
    Not here: benchmark names, source, data_dir, num_samples and shuffle_seed, which only select samples (the
    store compares the selected samples and their prompt text instead), and progress/logger/warmup. task=eval adds
    the timed subset when there is one (eval/shards.py `with_timed`): it depends on the selection too."""
    container = OmegaConf.to_container
    drafter, ev = container(cfg.drafter, resolve=True), checked(cfg, typed).eval
    vocab = vocab_settings(ev, drafter.get("name"), device)
    return {
        "target": target_settings(cfg.target, device), "drafter": drafter,
        "checkpoint_content": checkpoint_digests(drafter) | checkpoint_digests(vocab, "eval"),
        "decoding": container(cfg.decoding, resolve=True),
        "eval": {k: getattr(ev, k) for k in ("max_new_tokens", "run_ar", "check_lossless", "near_tie", "save_text")}
        | capped(ev, cfg.target, device) | vocab,
        "seed": cfg.seed, "device": device.type, "cpu_threads": cfg.get("cpu_threads"),
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
