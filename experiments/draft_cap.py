"""How many drafts a round should verify on this machine: online speed of one drafter at each `eval.max_drafts`.

A round costs one drafter pass plus one target pass over the anchor and its k drafts. On a GPU the target pass
costs about the same for 1 row as for 16; on a CPU it does not (a 1-row pass is a matrix-vector product, a
k+1-row pass a matrix product that costs about twice as much already at 2 rows), while a weak drafter's later
drafts are rarely accepted. Capping k keeps the output (greedy: the target's own, checked here token for token
against AR) and trades τ for a cheaper round.

For each prompt the script decodes greedily with AR and then with the drafter at every cap, interleaved prompt by
prompt so that a change of machine load hits every variant alike, and prints, per cap: τ (includes the bonus
token), decode ms per token, ms per round, a round's cost in AR steps, and the speedup (mean TPOT of AR / mean
TPOT of the variant, as eval/metrics.py defines it) with a 95% bootstrap CI over prompts (paired: every variant
runs on the same prompts against the same AR runs). With several benchmarks it also prints each benchmark's
speedup and the macro (their unweighted mean, as summary.json's), and every cap against the drafter's own K:
Δspeedup with a paired-bootstrap CI (metrics.paired_speedup). Choose the cap on the tuning split (`--split tune`),
then measure it on the evaluation split with the main evaluator (`python -m specexp ... eval.max_drafts=K`).

    python experiments/draft_cap.py --split tune --benchmarks gsm8k --num-samples 5 --threads 2 \
        --out experiments/results/draft_cap

CPU wall clock: run it on an otherwise idle machine; the load average before and after is recorded.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from statistics import fmean

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402


def setup(args):
    from hydra import compose, initialize_config_dir

    from specexp import benchmarks, registry
    from specexp.decoding.settings import decode_config
    from specexp.paths import CONF_DIR

    overrides = [f"target={args.target}", f"drafter={args.drafter}", "device=cpu", f"eval.split={args.split}",
                 f"eval.num_samples={args.num_samples}", f"eval.max_new_tokens={args.max_new_tokens}",
                 f"benchmark.names=[{','.join(args.benchmarks)}]", *args.overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides)
    target = registry.build_target(cfg.target, torch.device("cpu"))
    drafter = registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, target.name), target)
    samples = benchmarks.from_config(cfg.benchmark, cfg.eval)
    prompts = [target.encode_chat([{"role": "user", "content": s.turns[0]}]) for s in samples]
    return target, drafter, samples, prompts, decode_config(cfg.decoding, cfg.eval, target)


def table(per: dict) -> list[dict]:
    """One row per variant from the per-prompt timings, by eval/metrics.py's formulas (τ: mean over prompts; speedup:
    mean AR TPOT / mean TPOT, with its paired bootstrap CI)."""
    from specexp.eval import metrics

    ar, rows = per["AR"], []
    ar_tpot = [metrics.tpot(s, n) for s, n in zip(ar["decode_s"], ar["tokens"])]
    for name, p in per.items():
        recs = records(p, ar_tpot)
        ms_round = 1000 * sum(p["decode_s"]) / sum(p["rounds"])
        rows.append({"variant": name, "tau": metrics.tau(recs), "ms_per_token": 1000 * fmean(r["tpot"] for r in recs),
                     "ms_per_round": ms_round, "round_in_ar_steps": ms_round / 1000 / fmean(ar_tpot),
                     "speedup": metrics.speedup(recs),
                     "speedup_ci95": metrics.speedup_ci95(recs) if name != "AR" else None})
    return rows


def records(p: dict, ar_tpot: list[float], ids: list[str] | None = None) -> list[dict]:
    """A variant's prompts as metrics records (one turn each: τ = committed / rounds, TPOT, the paired AR TPOT)."""
    from specexp.eval import metrics

    ids = ids or [str(i) for i in range(len(ar_tpot))]
    return [{"id": i, "accept_lengths": [c / r], "tpot": metrics.tpot(s, n), "ar_tpot": a}
            for i, c, r, s, n, a in zip(ids, p["committed"], p["rounds"], p["decode_s"], p["tokens"], ar_tpot)]


def by_benchmark(per: dict, samples) -> tuple[list[str], dict[str, dict[str, list[dict]]]]:
    """Per variant, its records grouped by benchmark (summary.json's grouping, for macro speedups and paired Δ)."""
    from specexp.eval import metrics

    ar = per["AR"]
    ar_tpot = [metrics.tpot(s, n) for s, n in zip(ar["decode_s"], ar["tokens"])]
    names = list(dict.fromkeys(s.benchmark for s in samples))
    out = {}
    for variant, p in per.items():
        recs = records(p, ar_tpot, [s.id for s in samples])
        out[variant] = {b: [r for r, s in zip(recs, samples) if s.benchmark == b] for b in names}
    return names, out


def benchmark_lines(per: dict, samples, own: str) -> tuple[list[str], dict]:
    """Markdown: each variant's speedup per benchmark and macro, then every cap against `own` (the drafter's own K):
    macro Δspeedup and Δτ with paired-bootstrap CIs."""
    from specexp.eval import metrics

    names, grouped = by_benchmark(per, samples)
    out, lines = {}, ["| variant | " + " | ".join(names) + " | macro speedup | macro τ |",
                      "|---|" + "---:|" * (len(names) + 2)]
    for variant, g in grouped.items():
        if variant == "AR":
            continue
        sp = {b: metrics.speedup(g[b]) for b in names}
        ta = {b: metrics.tau(g[b]) for b in names}
        out[variant] = {"speedup": sp, "tau": ta, "macro_speedup": fmean(sp.values()), "macro_tau": fmean(ta.values())}
        lines.append(f"| {variant} | " + " | ".join(f"{sp[b]:.2f}×" for b in names)
                     + f" | {out[variant]['macro_speedup']:.3f}× | {out[variant]['macro_tau']:.3f} |")
    lines += ["", f"Against {own}, paired on the same prompts and AR runs, 95% bootstrap "
                  "CIs:", "",
              "| variant | macro Δspeedup | macro Δτ | " + " | ".join(f"{b} Δspeedup" for b in names) + " |",
              "|---|---:|---:|" + "---:|" * len(names)]
    for variant, g in grouped.items():
        if variant in ("AR", own):
            continue
        per_b, macro = metrics.paired_speedup(g, grouped[own])
        reps = metrics.paired_replicates(g, grouped[own])
        dtau = fmean(row["delta"] for row, _ in reps.values())
        dtau_ci = metrics.percentiles95(sum(r for _, r in reps.values()) / len(reps))
        out[variant] |= {"vs_own": {"macro_delta": macro["delta"], "macro_delta_ci95": macro["delta_ci95"],
                                    "macro_delta_tau": dtau, "macro_delta_tau_ci95": dtau_ci,
                                    "per_benchmark": per_b}}
        ci = lambda c: f"[{c[0]:+.3f}, {c[1]:+.3f}]"                                        # noqa: E731
        lines.append(f"| {variant} | {macro['delta']:+.3f} {ci(macro['delta_ci95'])} | {dtau:+.3f} {ci(dtau_ci)} | "
                     + " | ".join(f"{per_b[b]['delta']:+.2f} {ci(per_b[b]['delta_ci95'])}" for b in names) + " |")
    return lines, out


def main() -> None:
    from dataclasses import replace

    from tqdm.auto import tqdm

    from specexp import machine
    from specexp.decoding.engine import generate
    from specexp.targets import cpu_linear

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--drafter", default="dflash")
    ap.add_argument("--benchmarks", nargs="*", default=["gsm8k"])
    ap.add_argument("--split", default="tune", choices=["tune", "eval"])
    ap.add_argument("--num-samples", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--caps", type=int, nargs="*", default=[1, 2, 3, 4, 5, 7])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-vocabs", type=int, nargs="*", default=[],
                    help="also DFlash drafting from the N most frequent answer tokens (eval.draft_vocab), at "
                         "--vocab-cap drafts, for each N")
    ap.add_argument("--vocab-cap", type=int, default=3)
    ap.add_argument("--regen", default="data/regen/smollm2_135m-greedy256",
                    help="the regeneration set whose answer tokens rank the draft vocabulary")
    ap.add_argument("--reference", default=None, help="the variant every other is paired against (default: the "
                                                      "drafter's own K, k=K)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--name", default="", help="suffix of the output files' stem (<drafter>-<split>-<name>)")
    ap.add_argument("overrides", nargs="*", help="further config overrides (e.g. drafter.checkpoint=DIR)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    target, drafter, samples, prompts, dc = setup(args)
    caps = sorted({min(c, drafter.max_drafts) for c in args.caps} | {drafter.max_drafts})   # K: the reference
    variants = [("AR", None, None)] + [(f"k={c}", drafter, c) for c in caps]
    if args.draft_vocabs:
        import copy

        for n in args.draft_vocabs:                     # the same drafter and weights, drafting from n tokens
            d = copy.copy(drafter)
            d.restrict_vocab(args.regen, target, n)
            if cpu_linear.is_packed(target.model):
                cpu_linear.pack(d.lm_head, whole_model=False)
            variants.append((f"k={args.vocab_cap} V={n}", d, args.vocab_cap))
    for name, d, cap in variants:                                                     # warm-up, untimed
        generate(target, d, prompts[0][:64], replace(dc, max_new_tokens=8, max_drafts=cap))
    per = {name: {"decode_s": [], "tokens": [], "rounds": [], "committed": []} for name, _, _ in variants}
    load_start, lossless = os.getloadavg()[0], 0
    for ids in tqdm(prompts, desc=f"{len(variants)} variants per prompt", unit="prompt"):
        ref = None
        for name, d, cap in variants:
            g = generate(target, d, ids, replace(dc, max_drafts=cap))
            ref = g.tokens if ref is None else ref
            lossless += d is not None and g.tokens == ref
            p = per[name]
            p["decode_s"].append(g.decode_s)
            p["tokens"].append(g.decode_tokens)
            p["rounds"].append(len(g.accept_lengths))
            p["committed"].append(sum(g.accept_lengths))
    load_end = os.getloadavg()[0]

    rows = table(per)
    best = max(rows[1:], key=lambda r: r["speedup"])
    mach = machine.describe(torch.device("cpu"))
    packing = (", linear layers packed: " + json.dumps(cpu_linear.describe(target.model))
               if cpu_linear.is_packed(target.model) else "")
    lines = [f"# Drafts per round ({args.drafter} on {args.target}, greedy, {args.split} split, "
             f"{', '.join(args.benchmarks)}, {len(prompts)} prompts, {args.max_new_tokens} new tokens, "
             f"{args.threads} thread(s); load {load_start:.1f} → {load_end:.1f})", "",
             f"CPU {mach['cpu']} ({mach['cores']} cores; flags: {', '.join(mach['cpu_flags']) or 'none'}); target "
             f"{target.dtype}, engine {type(target).__name__}"
             f"{packing}; "
             f"torch {torch.__version__}.", "",
             "All prompts pooled:", "",
             "| variant | τ | ms / token | ms / round | round in AR steps | speedup vs AR [95% CI] |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ci = f" [{r['speedup_ci95'][0]:.2f}, {r['speedup_ci95'][1]:.2f}]" if r["speedup_ci95"] else ""
        lines.append(f"| {r['variant']} | {r['tau']:.2f} | {r['ms_per_token']:.1f} | {r['ms_per_round']:.1f} | "
                     f"{r['round_in_ar_steps']:.2f} | {r['speedup']:.2f}×{ci} |")
    per_bench = None
    if len(variants) > 2:                                   # AR and at least two caps: pair them
        more, per_bench = benchmark_lines(per, samples, args.reference or f"k={drafter.max_drafts}")
        lines += ["", "Per benchmark (summary.json's speedup: mean AR TPOT / mean TPOT; macro: their mean):", "", *more]
    n_spec = len(prompts) * (len(variants) - 1)
    lines += ["", f"Greedy output equal to AR's on {lossless} / {n_spec} (prompt, cap) pairs (a k-row verify "
              f"and a 1-row step may round differently, so a difference at a near-tie is possible). Fastest pooled: "
              f"{best['variant']} ({best['speedup']:.2f}×)."]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{args.drafter}-{args.split}" + (f"-{args.name}" if args.name else "")
        (args.out / f"{stem}.md").write_text(md)
        (args.out / f"{stem}.json").write_text(json.dumps(
            {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "machine": mach, "target_dtype": str(target.dtype).removeprefix("torch."),
             "prepacked": cpu_linear.is_packed(target.model), "packing": cpu_linear.describe(target.model),
             "samples": [s.id for s in samples], "benchmarks": [s.benchmark for s in samples],
             "load": [load_start, load_end], "rows": rows, "per_benchmark": per_bench,
             "lossless": [lossless, n_spec], "per_prompt": per}, indent=1))


if __name__ == "__main__":
    main()
