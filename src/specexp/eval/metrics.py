"""Every metric formula of specexp, in one place. Inputs are the per-turn records of `samples.jsonl`.

Conventions (the same as the DFlash, DeLS-Spec and Domino papers):
- tau (acceptance length) = tokens committed per target verification = accepted drafts + 1 bonus token,
  so tau is in [1, K+1]. A turn's tau is the mean over its verifications; a benchmark's tau is the
  macro average over turns (turns with no verification, e.g. a first token that is a stop token, are
  skipped). Acceptance is truncated at a stop token and at the token budget.
- Per-position acceptance, unconditional: P(draft k accepted) = #steps with >= k accepted drafts /
  #steps that verified >= k drafts. Conditional: P(k accepted | k-1 accepted).
- tau histogram: counts of verifications committing 1, 2, ..., K+1 tokens (index i <-> i+1 tokens).
- TPOT = decode time / tokens produced by the decode loop (the first token comes from prefill; the
  drafter's prefill over the prompt is excluded, as in the reference benchmark).
- Speedup = mean TPOT(AR) / mean TPOT(spec) over the same turns (a ratio of means), AR run through the
  same engine on the same prompts in the same process. Only timed turns count: a turn with both TPOTs (a run with
  `eval.timed_samples` records no timing outside its timed prompts, eval/shards.py); TPOT and TTFT means likewise.
- Macro over benchmarks: unweighted mean of the per-benchmark values.
- Drafter-specific round metrics (e.g. DEdit's edit outcomes) are defined by the drafter itself
  (its registry entry's `metrics`) and appear under their own keys; this module never reads them.
"""
from __future__ import annotations

import math
from statistics import fmean

import torch


def tpot(decode_s: float, decode_tokens: int) -> float | None:
    return decode_s / decode_tokens if decode_tokens > 0 else None


def turn_tau(accept_lengths: list[int]) -> float | None:
    return fmean(accept_lengths) if accept_lengths else None


def tau(records: list[dict]) -> float | None:
    taus = [t for t in (turn_tau(r["accept_lengths"]) for r in records) if t is not None]
    return fmean(taus) if taus else None


def _steps(records):
    for r in records:
        yield from zip(r["accept_lengths"], r["drafted"])


def accept_rate_per_position(records: list[dict], k_max: int) -> list[float | None]:
    hit, tried = [0] * k_max, [0] * k_max
    for committed, drafted in _steps(records):
        for k in range(min(drafted, k_max)):
            tried[k] += 1
            hit[k] += committed - 1 > k
    return [h / t if t else None for h, t in zip(hit, tried)]


def conditional_accept_rate(records: list[dict], k_max: int) -> list[float | None]:
    hit, reached = [0] * k_max, [0] * k_max
    for committed, drafted in _steps(records):
        for k in range(min(drafted, committed, k_max)):   # draft k+1 was reached: drafts 1..k accepted
            reached[k] += 1
            hit[k] += committed - 1 > k
    return [h / t if t else None for h, t in zip(hit, reached)]


def tau_histogram(records: list[dict], k_max: int) -> list[int]:
    hist = [0] * (k_max + 1)
    for committed, _ in _steps(records):
        hist[min(committed, k_max + 1) - 1] += 1
    return hist


def timed(records: list[dict]) -> list[dict]:
    """The records a run timed: all but those outside an `eval.timed_samples` subset (`"timed": false`, eval/shards.py;
    the evaluator records no timing there either, so this only guards hand-made or edited records)."""
    return [r for r in records if r.get("timed", True)]


def speedup(records: list[dict]) -> float | None:
    pairs = [(r["ar_tpot"], r["tpot"]) for r in timed(records) if r.get("ar_tpot") and r.get("tpot")]
    if not pairs:
        return None
    return fmean(a for a, _ in pairs) / fmean(s for _, s in pairs)


def _mean_ms(values) -> float | None:
    values = [v for v in values if v is not None]
    return 1000 * fmean(values) if values else None


def top2_gap(logits):
    """Target logits `[..., V]` -> the top-1 minus top-2 logit `[...]` in fp32: an argmax near-tie when small, where
    two computation orders of the same logits (a verify block and an AR step, a teacher-forced pass) may rank the
    two best tokens differently."""
    top2 = logits.float().topk(2, dim=-1).values                                               # [..., 2]
    return top2[..., 0] - top2[..., 1]


def tie_gap(logits, tokens) -> float:
    """How far the lower of `tokens` is below the best logit of `logits [V]`: `top2_gap` when they are the two best,
    larger otherwise (a token that is not near the top is no near-tie whatever the top-2 gap)."""
    lg = logits.float()
    return float(lg.max() - min(lg[t] for t in tokens))


def tie_tolerance(logits, dtype: torch.dtype, floor: float) -> float:
    """The logit gap below which two tokens are a near-tie of the target computed in `dtype`: `floor`
    (`eval.near_tie`), or 2 units in the last place of `dtype` at the best logit of `logits [V]` if that is more (bf16
    rounds a logit of 16..32 to steps of 0.125, so a 16-row verify and a 1-row step may order two tokens within a
    step differently; in fp32 the steps are ~1e-6 and the floor decides)."""
    top = float(logits.float().abs().max())
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(top)) if top > 0 else 0.0
    return max(floor, 2 * ulp)


def is_near_tie(gap: float, tolerance: float) -> bool:
    """Whether a top-2 gap is within `tolerance` (inclusive: in bf16 every logit moves by up to one step between a
    k-row and a 1-row pass, so two of them can close a gap of exactly two steps to a tie)."""
    return gap <= tolerance


def lossless_counts(records: list[dict]) -> dict:
    """Greedy outputs that differ from AR's, split by what their first differing position is: a near-tie of the
    target's logits (`lossless_near_tie`, eval/evaluator.py: the two tokens within `eval.near_tie` of the best logit)
    or a failure (`lossless_mismatches`); None for both when no output was compared."""
    checked = [r for r in records if r.get("lossless") is not None]
    if not checked:
        return {"lossless_mismatches": None, "lossless_near_ties": None}
    ties = sum(not r["lossless"] and bool(r.get("lossless_near_tie")) for r in checked)
    return {"lossless_mismatches": sum(not r["lossless"] for r in checked) - ties, "lossless_near_ties": ties}


def timed_ids(records: list[dict]) -> list[str]:
    """The ids of the timed prompts (`timed`), in first-seen order."""
    return list(dict.fromkeys(r["id"] for r in timed(records)))


def summarize_benchmark(records: list[dict], k_max: int) -> dict:
    return {
        "num_samples": len({r["id"] for r in records}),
        "num_turns": len(records),
        "tau": tau(records),
        "speedup": speedup(records),
        "timed_samples": len(timed_ids(records)),
        "tpot_ms": _mean_ms(r.get("tpot") for r in timed(records)),
        "tpot_ar_ms": _mean_ms(r.get("ar_tpot") for r in timed(records)),
        "ttft_ms": _mean_ms(r.get("ttft") for r in timed(records)),
        "new_tokens": sum(r["new_tokens"] for r in records),
        "accept_rate_per_position": accept_rate_per_position(records, k_max),
        "accept_rate_conditional": conditional_accept_rate(records, k_max),
        "tau_histogram": tau_histogram(records, k_max),
        **lossless_counts(records),
    }


# summary fields only an online run measures
TIMING_KEYS = ("speedup", "speedup_ci95", "timed_samples", "tpot_ms", "tpot_ar_ms", "ttft_ms")


def near_tie_summary(records: list[dict]) -> dict:
    """Replay diagnostics of one benchmark: rounds, rounds with a target top-2 logit gap below the threshold among
    their verified positions, turns with any such round, and reference tokens the teacher-forced pass ranks second."""
    return {"rounds": sum(len(r["accept_lengths"]) for r in records),
            "near_tie_rounds": sum(len(r.get("near_tie_rounds") or []) for r in records),
            "near_tie_turns": sum(bool(r.get("near_tie_rounds")) for r in records),
            "tf_argmax_mismatches": sum(r.get("tf_argmax_mismatches") or 0 for r in records)}


def macro(benchmarks: dict[str, dict]) -> dict:
    def mean_of(key):
        values = [b[key] for b in benchmarks.values() if b[key] is not None]
        return fmean(values) if values else None

    return {"tau": mean_of("tau"), "speedup": mean_of("speedup")}


# ------------------------------------------------------------------------------------- uncertainty
# 95% intervals are percentile bootstraps over prompts (a multi-turn prompt is resampled with all its turns,
# since its turns are not independent). The statistic is the summary's own τ: the mean of per-turn τ over the
# resampled turns. Macro: every benchmark resampled independently, then the unweighted mean of the benchmark τs.
# Speedup: the same resampling over the timed prompts, each with its own AR TPOTs (paired), the statistic the
# summary's speedup (summed AR TPOT / summed TPOT of the resampled turns).
# Paired (two runs on the same references): the same resampled prompts for both runs, Δτ = τ_A − τ_B.
# Fixed seed and BOOTSTRAP_REPLICATES draws, so a summary is reproducible to the digit.
BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0


def _per_prompt(records: list[dict]) -> dict[str, tuple[float, int]]:
    """Prompt id -> (sum of its turns' τ, number of turns with a τ), in first-seen order."""
    out: dict[str, tuple[float, int]] = {}
    for r in records:
        t = turn_tau(r["accept_lengths"])
        s, n = out.get(r["id"], (0.0, 0))
        out[r["id"]] = (s + t, n + 1) if t is not None else (s, n)
    return out


def _resampled_tau(sums, counts, idx):
    """τ of each replicate: `sums`, `counts` `[P]`, `idx` `[R, P]` resampled prompt indices → `[R]` (nan if no turn).
    Also the ratio of summed seconds for `speedup_ci95`, so `counts` need not be integers (nor ≥ 1 in sum)."""
    import torch

    num, den = sums[idx].sum(1), counts[idx].sum(1)                                    # [R], [R]
    return torch.where(den > 0, num / den, torch.full_like(num, float("nan")))          # x / 0 is replaced


def _draws(n_prompts: int, generator):
    import torch

    return torch.randint(0, n_prompts, (BOOTSTRAP_REPLICATES, n_prompts), generator=generator)   # [R, P]


def _percentiles(x) -> list[float] | None:
    import torch

    x = x[~torch.isnan(x)]
    if x.numel() == 0:
        return None
    lo, hi = torch.quantile(x.double(), torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [lo, hi]


def _replicates(by_bench: dict[str, list[dict]], generator):
    """Per benchmark: τ of every bootstrap replicate `[R]`."""
    import torch

    out = {}
    for name, records in by_bench.items():
        pp = _per_prompt(records)
        if not any(n for _, n in pp.values()):
            continue
        sums = torch.tensor([s for s, _ in pp.values()], dtype=torch.float64)         # [P]
        counts = torch.tensor([n for _, n in pp.values()], dtype=torch.float64)       # [P]
        out[name] = _resampled_tau(sums, counts, _draws(len(pp), generator))
    return out


def tau_ci95(by_bench: dict[str, list[dict]]) -> tuple[dict[str, list[float] | None], list[float] | None]:
    """95% bootstrap CIs of τ per benchmark and of the macro τ (see above); None where there is no τ."""
    import torch

    g = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    reps = _replicates(by_bench, g)
    per = {name: _percentiles(r) for name, r in reps.items()}
    macro_ci = _percentiles(torch.stack(list(reps.values())).mean(0)) if reps else None
    return per, macro_ci


def _speedup_replicates(records: list[dict], generator):
    """Speedup of every bootstrap replicate `[R]` over the prompts of one benchmark (a prompt resampled with all its
    timed turns, its AR and drafter seconds together: paired), or None when no turn was timed."""
    import torch

    pp = _per_prompt_seconds(records)
    if not pp:
        return None
    ar, spec = (torch.tensor([p[k] for p in pp.values()], dtype=torch.float64) for k in (0, 1))   # [P], [P]
    return _resampled_tau(ar, spec, _draws(len(pp), generator))                                   # [R]


def speedup_ci95(records: list[dict]) -> list[float] | None:
    """95% bootstrap CI of `speedup` over the records' timed prompts, each resampled with all its turns and its own
    AR baseline (paired): the ratio of the resampled prompts' summed AR TPOTs to their summed TPOTs, i.e. `speedup`
    of the resampled turns. None when no turn was timed."""
    import torch

    reps = _speedup_replicates(records, torch.Generator().manual_seed(BOOTSTRAP_SEED))
    return _percentiles(reps) if reps is not None else None


def speedup_ci95s(by_bench: dict[str, list[dict]]) -> tuple[dict[str, list[float] | None], list[float] | None]:
    """95% bootstrap CIs of the speedup per benchmark (`speedup_ci95`'s replicates, one seeded generator drawn in
    benchmark order as `tau_ci95`) and of the macro speedup (every benchmark resampled independently, the unweighted
    mean of the benchmarks' replicates); None where no turn was timed."""
    import torch

    g = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    reps = {name: _speedup_replicates(records, g) for name, records in by_bench.items()}
    per = {name: _percentiles(r) if r is not None else None for name, r in reps.items()}
    kept = [r for r in reps.values() if r is not None]
    return per, _percentiles(torch.stack(kept).mean(0)) if kept else None


def _paired(a: list[dict], b: list[dict], generator):
    """One benchmark, the prompts both runs have: the summary row and the replicates of Δτ `[R]`."""
    import torch

    pa, pb = _per_prompt(a), _per_prompt(b)
    ids = [i for i in pa if i in pb and pa[i][1] and pb[i][1]]
    if not ids:
        return {"num_prompts": 0, "tau_a": None, "tau_b": None, "delta": None, "delta_ci95": None,
                "a_wins": None, "ties": None, "b_wins": None}, None
    sa, na = (torch.tensor([pa[i][k] for i in ids], dtype=torch.float64) for k in (0, 1))   # [P] each
    sb, nb = (torch.tensor([pb[i][k] for i in ids], dtype=torch.float64) for k in (0, 1))
    idx = _draws(len(ids), generator)
    reps = _resampled_tau(sa, na, idx) - _resampled_tau(sb, nb, idx)                   # [R]
    ta, tb = float(sa.sum() / na.sum()), float(sb.sum() / nb.sum())
    ma, mb, n = sa / na, sb / nb, len(ids)                                             # [P] per-prompt τ
    return {"num_prompts": n, "tau_a": ta, "tau_b": tb, "delta": ta - tb, "delta_ci95": _percentiles(reps),
            "a_wins": int((ma > mb).sum()) / n, "ties": int((ma == mb).sum()) / n,
            "b_wins": int((ma < mb).sum()) / n}, reps


def paired_replicates(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> dict[str, tuple[dict, object]]:
    """Per benchmark both runs have: (the `paired_comparison` row, the bootstrap replicates of Δτ `[R]` or None),
    from the one seeded generator, so sums of benchmarks' replicates (a family's mean Δτ, a difference between
    families) are bootstrap replicates of those sums."""
    import torch

    g = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    return {name: _paired(a[name], b[name], g) for name in a if name in b}


def percentiles95(replicates) -> list[float] | None:
    """The 95% percentile interval of bootstrap replicates `[R]`."""
    return _percentiles(replicates)


def _per_prompt_seconds(records: list[dict]) -> dict[str, tuple[float, float]]:
    """Prompt id -> (summed AR TPOT, summed TPOT) over its timed online turns (a turn without both is left out)."""
    out: dict[str, tuple[float, float]] = {}
    for r in timed(records):
        if r.get("ar_tpot") and r.get("tpot"):
            ar, tp = out.get(r["id"], (0.0, 0.0))
            out[r["id"]] = (ar + r["ar_tpot"], tp + r["tpot"])
    return out


def paired_speedup(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> tuple[dict[str, dict], dict] | None:
    """Online run A vs online run B per benchmark, over the prompts both timed: `speedup` of each (its own AR
    baseline, as in summary.json) and Δ = speedup_A − speedup_B with a paired-bootstrap 95% CI (the same prompts
    drawn for both runs); macro: the unweighted mean Δ over benchmarks, its CI from the mean of the replicates.
    None when either run has no timings (a replay). Speed compared across two runs also carries the machine's drift
    between them: run them back to back on an otherwise idle machine."""
    import torch

    g = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    per, reps = {}, []
    for name in a:
        pa, pb = _per_prompt_seconds(a[name]), _per_prompt_seconds(b.get(name, []))
        ids = [i for i in pa if i in pb]
        if not ids:
            continue
        ara, spa, arb, spb = (torch.tensor([p[i][k] for i in ids], dtype=torch.float64)
                              for p, k in ((pa, 0), (pa, 1), (pb, 0), (pb, 1)))            # [P] each
        idx = _draws(len(ids), g)
        r = _resampled_tau(ara, spa, idx) - _resampled_tau(arb, spb, idx)                 # [R]
        sa, sb = float(ara.sum() / spa.sum()), float(arb.sum() / spb.sum())
        per[name] = {"num_prompts": len(ids), "speedup_a": sa, "speedup_b": sb, "delta": sa - sb,
                     "delta_ci95": _percentiles(r)}
        reps.append(r)
    if not per:
        return None
    macro = {"delta": fmean(c["delta"] for c in per.values()), "delta_ci95": _percentiles(torch.stack(reps).mean(0))}
    return per, macro


def paired_comparison(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> tuple[dict[str, dict], dict]:
    """Run A vs run B per benchmark (records grouped by benchmark), over the prompts both have: Δτ = τ_A − τ_B
    with a paired-bootstrap 95% CI, and the shares of prompts whose mean per-turn τ is higher in A (`a_wins`),
    equal, or higher in B. Macro: the unweighted mean Δτ over benchmarks, its CI from the mean of the
    benchmarks' replicates."""
    import torch

    per, reps = {}, []
    for name, (row, r) in paired_replicates(a, b).items():
        per[name] = row
        if r is not None:
            reps.append(r)
    deltas = [c["delta"] for c in per.values() if c["delta"] is not None]
    macro = {"delta": fmean(deltas) if deltas else None,
             "delta_ci95": _percentiles(torch.stack(reps).mean(0)) if reps else None}
    return per, macro
