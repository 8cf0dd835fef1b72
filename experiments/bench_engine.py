"""specexp's decoding beside the peers, in one run on one machine. Peers: HF `generate` greedy (the baseline of
every ratio), HF `generate` with a static cache (`cache_implementation="static"`), HF prompt-lookup decoding and
HF's built-in DFlash (`speculation_type="dflash"`, holding the weights of specexp's DFlash drafter). specexp: AR and
each drafter of `--drafters` on the static engine (`target.engine=static`, targets/static.py), AR and the drafters
of `--hf-engine` also on the HF-eager reference engine. Same prompts, threads and token budget; the contenders
are interleaved prompt by prompt in every repeat, so a change of machine load falls on all of them. A peer that
cannot run here (this transformers has no such option, or it fails on this model) is a table row with the
one-line reason instead.

Printed and written (`--out`):
- Speed: per contender the median over repeats of the decode time summed over the prompts, tokens per second,
  its speed against HF greedy as a geometric mean over prompts with a bootstrap 95 % CI (prompts resampled; each
  prompt's time is its median over repeats), τ (tokens per verification after the first token; HF peers: from
  their count of target forwards) and how many outputs equal HF greedy's token for token.
- A round's parts, measured inside one more generation of every prompt per specexp contender, interleaved prompt
  by prompt as the contest (medians over its rounds, ms and AR steps): the wall time of a round (one target
  forward's start to the next's), the verify of k + 1 rows, the proposal and, within it, the drafter's vocabulary
  projection (DFlash: the 49,152-wide lm_head; DeLS: that and the fused [V, r] head rows; EAGLE-3: its
  draft-vocabulary head), the commit, the rest of the round (acceptance, rollback, the loop), and the host syncs
  per round (the hooks of tests/decoding/test_syncs.py). The AR step of an engine is the median 1-row forward of
  that engine's AR generations.
- The memory floor of an AR step: the machine's read bandwidth (median of 7 sums of a `--bw-mib` tensor), the
  bytes an AR step must read (the target's weights + the KV cache at the mean decoding context) and the measured
  AR step against their ratio.
- The drafter's vocabulary projection (issue #32 item 4), on the DFlash drafter's real proposal hidden states of
  the run: ms per proposal (k rows) and agreement with the fp32 full head's argmax, for the fp32 and bf16 full
  heads and heads pruned to the `--vocab-sizes` most frequent tokens of the target's own answers (`--regen`):
  the share of rows whose fp32 argmax falls outside, and the share a Cauchy-Schwarz bound certifies exact.
- The machine: CPU model and flags (avx2, avx512f, avx512_bf16, amx_bf16), threads, the target's dtype, the load
  before and during the run (BUSY when the 1-minute load before the run exceeds 0.5), library versions.

    python experiments/bench_engine.py --threads 2 --prompts 6 --tokens 96 --repeats 3 \
        --drafters dflash,dels_rnn,eagle3 --out experiments/results/engine/$(date +%F)

CPU wall clock: run it on an otherwise idle machine (the load is recorded, and a busy run is marked as such).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402

from specexp.machine import FLAGS, cpu_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def geo_ci(ratios: list[float], seed: int = 0, n: int = 2000) -> tuple[float, float, float]:
    """Geometric mean of per-prompt ratios and its bootstrap 95 % CI (prompts resampled)."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n))
    return math.exp(statistics.fmean(logs)), math.exp(means[int(0.025 * n)]), math.exp(means[int(0.975 * n) - 1])


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def cap_arg(value: str):
    """--max-drafts: auto, null or an int >= 1 (eval.max_drafts's values), else argparse's one-line error."""
    if value in ("auto", "null"):
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not valid; expected an int >= 1, null or auto")
    return int(value)


def main() -> None:
    import engine_measure as em
    from hydra import compose, initialize_config_dir

    from specexp import benchmarks, registry
    from specexp.cli import CONF_DIR
    from specexp.config import EvalConfig
    from specexp.decoding.engine import DecodeConfig, drafts_per_round, generate
    from specexp.decoding.settings import draft_vocab, max_drafts
    from specexp.targets import cpu_linear
    from specexp.targets.static import StaticTarget

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--drafters", default="dflash", help="comma-separated specexp drafters, each on the static "
                                                         "engine with its default checkpoint for the target")
    ap.add_argument("--hf-engine", default="dflash", help="drafters also run on the HF-eager engine ('' = none)")
    ap.add_argument("--benchmark", default="gsm8k")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lookup", type=int, default=3, help="HF prompt lookup: tokens proposed per step")
    ap.add_argument("--bw-mib", type=int, default=512, help="size of the tensor the read bandwidth is timed on")
    ap.add_argument("--vocab-sizes", default="4096,8192,16384", help="rows of the pruned drafter heads")
    ap.add_argument("--regen", type=Path, default=REPO / "data/regen/smollm2_135m-greedy256",
                    help="packed target answers whose token frequencies choose a pruned head's rows")
    ap.add_argument("--max-drafts", default="auto", type=cap_arg,
                    help="drafts a specexp round verifies at most: an int, null (each drafter's own K) or auto "
                         "(eval.max_drafts=auto: 3 for a bf16 target on a CPU, else null); HF's peers keep their own")
    ap.add_argument("--out", type=Path)
    ap.add_argument("overrides", nargs="*", help="further config overrides for every drafter (e.g. "
                                                 "target.dtype=float32)")
    args = ap.parse_args()
    load_before = os.getloadavg()                # before this process loads or runs anything: the machine's own load
    torch.set_num_threads(args.threads)
    names = [d for d in args.drafters.split(",") if d]
    on_hf = [d for d in args.hf_engine.split(",") if d]

    def config(drafter: str, *more: str):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("config", [f"target={args.target}", f"drafter={drafter}", "device=cpu",
                                      f"benchmark={args.benchmark}", *args.overrides, *more])

    cfg = config(names[0] if names else "dflash")
    hf = registry.build_target(cfg.target, torch.device("cpu"))
    static = StaticTarget.of(hf)                               # the same modules and weights, another engine
    # HF's peers run stock transformers: where specexp packs the target's linear layers (target.prepack, bf16 on a
    # CPU), they get an unpacked copy of the same weights.
    peer = hf
    if cpu_linear.is_packed(hf.model):
        peer = registry.build_target(config(names[0] if names else "dflash", "target.prepack=false").target,
                                     torch.device("cpu"))
    drafters = {}                                              # (name, engine) -> drafter
    for d in dict.fromkeys(names + ["dflash"]):                # HF's DFlash borrows the DFlash drafter's weights
        dcfg = config(d).drafter
        # eval.draft_vocab as the main job resolves it (eval=mini: auto, 8,192 tokens for DFlash on a CPU)
        vocab = draft_vocab(EvalConfig.from_cfg(config(d).eval), d, torch.device("cpu"))
        drafters[d, "static"] = registry.build_drafter(dcfg, static, vocab)
        if d in on_hf:
            drafters[d, "hf"] = registry.build_drafter(dcfg, hf, vocab)
    # The tuning split: a speed measurement chooses nothing, but it stays off the evaluation prompts all the same.
    samples = benchmarks.load([args.benchmark], args.prompts, split="tune", tune_samples=args.prompts)
    prompts = [hf.encode_chat([{"role": "user", "content": s.turns[0]}]) for s in samples]
    stops = tuple(hf.stop_token_ids)
    cap = None if args.max_drafts == "null" else args.max_drafts
    dc = DecodeConfig(max_new_tokens=args.tokens, stop_token_ids=stops,
                      max_drafts=max_drafts(cap, torch.device("cpu"), hf.dtype))
    model = peer.model
    gen_kw = dict(do_sample=False, max_new_tokens=args.tokens, eos_token_id=list(stops), pad_token_id=stops[0])
    forwards = [0]                                             # target forwards of an HF peer (its τ)
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    def hf_generate(**kw):
        def run(ids):
            forwards[0] = 0
            t0 = time.perf_counter()
            out = model.generate(torch.tensor([ids]), **gen_kw, **kw)[0, len(ids):].tolist()
            return out, time.perf_counter() - t0, forwards[0]
        return run

    def ours(target, drafter):
        def run(ids):
            t0 = time.perf_counter()
            g = generate(target, drafter, ids, dc)
            return g.tokens, time.perf_counter() - t0, g
        return run

    not_run = {}                                               # contender -> why it has no timings
    peers = {"HF generate greedy": hf_generate(),
             "HF generate, static cache": hf_generate(cache_implementation="static"),
             f"HF prompt lookup ({args.lookup})": hf_generate(prompt_lookup_num_tokens=args.lookup)}
    try:
        assistant = em.hf_dflash_assistant(drafters["dflash", "static"])
        peers["HF built-in DFlash"] = hf_generate(assistant_model=assistant, speculation_type="dflash")
    except RuntimeError as e:
        not_run["HF built-in DFlash"] = str(e)
    specexp = {("AR", "hf"): (hf, None), ("AR", "static"): (static, None)}
    for d in names:
        specexp[d, "static"] = (static, drafters[d, "static"])
        if d in on_hf:
            specexp[d, "hf"] = (hf, drafters[d, "hf"])
    label = {key: f"specexp {key[0]}, engine={key[1]}" for key in specexp}
    contenders = {**peers, **{label[key]: ours(*td) for key, td in specexp.items()}}
    order = [*(n for n in ("HF generate greedy", "HF generate, static cache", f"HF prompt lookup ({args.lookup})",
                           "HF built-in DFlash")), *label.values()]

    load_start = os.getloadavg()
    t_start = time.perf_counter()
    tokens, taus, exact = {}, {}, {}
    with torch.inference_mode():
        for name, run in list(contenders.items()):             # warm-up: first calls allocate and dispatch
            try:
                run(prompts[0])
            except Exception as e:                             # a peer this transformers cannot run: one line
                if name.startswith("specexp"):
                    raise
                not_run[name] = one_line(e)
                del contenders[name]
        times = {name: [[0.0] * args.repeats for _ in prompts] for name in contenders}
        for r in range(args.repeats):
            for p, ids in enumerate(prompts):
                for name, run in contenders.items():
                    out = run(ids)
                    times[name][p][r] = out[1]
                    tokens.setdefault(name, [None] * len(prompts))[p] = len(out[0])
                    if r == 0:
                        if isinstance(out[2], int):            # an HF peer: verifications after the first token
                            taus.setdefault(name, []).append((len(out[0]) - 1, out[2] - 1))
                        else:
                            acc = out[2].accept_lengths
                            taus.setdefault(name, []).append((sum(acc), len(acc)))
                        exact.setdefault(name, []).append(out[0])
            print(f"repeat {r + 1}/{args.repeats} done ({time.perf_counter() - t_start:.0f} s)", flush=True)

        # A round's parts: one more generation of every prompt per specexp contender, each round cut into parts.
        hidden_rows, dflash_static, keeping = [], drafters["dflash", "static"], False
        block_logits = dflash_static.block_logits

        def keep_rows(anchor, start, k):                      # the real proposals' final hidden rows, for item 4
            hidden, logits = block_logits(anchor, start, k)
            if keeping:
                r0 = dflash_static.first_row
                hidden_rows.append(hidden[0, r0: r0 + k].float())                      # [k, H]
            return hidden, logits
        dflash_static.block_logits = keep_rows
        round_parts = {key: {} for key in specexp}
        for ids in prompts:                                    # interleaved as the contest: the AR step that is
            for key, (target, drafter) in specexp.items():    # the unit is timed beside the rounds it divides
                keeping = drafter is dflash_static
                _, parts = em.timed_rounds(target, drafter, ids, dc)
                keeping = False
                for part, v in parts.items():
                    round_parts[key].setdefault(part, []).extend(v)
        short = DecodeConfig(max_new_tokens=min(args.tokens, 32), stop_token_ids=stops, max_drafts=dc.max_drafts)
        syncs = {key: em.syncs_per_round(target, drafter, prompts[0], short)
                 for key, (target, drafter) in specexp.items()}
        del dflash_static.block_logits
        t_parts = time.perf_counter()

        # The memory floor of an AR step.
        bandwidth = em.read_bandwidth(args.bw_mib)
        context = statistics.fmean(len(ids) + args.tokens / 2 for ids in prompts)
        w_bytes, kv = em.weight_bytes(model), em.kv_bytes(hf.config, round(context), hf.dtype)

        # The drafter's vocabulary projection (issue #32 item 4), with the head's fp32 weights as loaded.
        if hf.dtype == torch.float32:
            w32 = hf.lm_head.weight.detach()
        else:                                                  # the bf16 copy lost bits: load the fp32 weights again
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                c32 = compose("config", [f"target={args.target}", "device=cpu", "target.dtype=float32",
                                         *[o for o in args.overrides if o.startswith("target.")]])
            w32 = registry.build_target(c32.target, torch.device("cpu")).lm_head.weight.detach().clone()
        counts, pruned_why = None, None
        try:
            counts = em.response_token_counts(args.regen, hf)
        except (RuntimeError, OSError) as e:
            pruned_why = str(e)
        hidden = torch.cat(hidden_rows) if hidden_rows else torch.zeros(0, hf.hidden_size)  # [N, H]
        k_dflash = drafts_per_round(dflash_static, dc)
        widest = [h for h in hidden_rows if len(h) == max(map(len, hidden_rows))]     # k rows, unless the budget
        blocks = widest[:: max(1, len(widest) // 5)][:5]                               # cut every proposal short
        vocab = em.projection_study(hidden, blocks, w32, counts,
                                    tuple(int(n) for n in args.vocab_sizes.split(",") if n), reps=15) \
            if len(hidden) else []
    load_end = os.getloadavg()
    t_end = time.perf_counter()

    greedy = exact["HF generate greedy"]
    base = "HF generate greedy"
    per_prompt = {name: [statistics.median(ts) for ts in times[name]] for name in contenders}
    rows = []
    for name in order:
        if name in not_run:
            rows.append({"contender": name, "not_run": not_run[name]})
            continue
        total = statistics.median(sum(times[name][p][r] for p in range(len(prompts))) for r in range(args.repeats))
        n_tok = sum(tokens[name])
        g, lo, hi = geo_ci([b / a for a, b in zip(per_prompt[name], per_prompt[base])])
        tau = taus[name]
        rows.append({"contender": name, "seconds": total, "tokens": n_tok, "tok_per_s": n_tok / total,
                     "speed_vs_hf_greedy": g, "ci95": [lo, hi],
                     "equals_hf_greedy": f"{sum(a == b for a, b in zip(exact[name], greedy))}/{len(prompts)}",
                     "tau": sum(a for a, _ in tau) / max(sum(b for _, b in tau), 1)})
    for name, why in not_run.items():                          # a peer that was never in the list
        if all(r["contender"] != name for r in rows):
            rows.append({"contender": name, "not_run": why})

    med = statistics.median
    regen_name = args.regen.relative_to(REPO) if args.regen.is_relative_to(REPO) else args.regen
    ar_step = {eng: med(round_parts["AR", eng]["verify"]) for eng in ("hf", "static")}
    parts = {}
    for key, per in round_parts.items():
        unit = ar_step[key[1]]
        parts[label[key]] = {
            "k": drafts_per_round(specexp[key][1], dc), "rounds": len(per["wall"]), "ar_step_ms": 1000 * unit,
            **{f"{p}_ms": 1000 * med(v) for p, v in per.items()},
            **{f"{p}_in_ar": med(v) / unit for p, v in per.items()},
            "syncs_per_round_median": med(syncs[key]) if syncs[key] else None,
            "syncs_per_round_max": max(syncs[key]) if syncs[key] else None}
    floor_ms = 1000 * (w_bytes + kv) / (bandwidth * 1e9)
    floor = {"read_bandwidth_gb_s": bandwidth, "weight_mb": w_bytes / 1e6, "kv_mb": kv / 1e6,
             "context": context, "floor_ms": floor_ms, "ar_step_static_ms": 1000 * ar_step["static"],
             "ar_step_hf_ms": 1000 * ar_step["hf"], "static_over_floor": 1000 * ar_step["static"] / floor_ms}

    busy = load_before[0] > 0.5                  # the run's own threads load the machine too: judged before it began
    machine = {"cpu": cpu_info(), "threads": args.threads, "load_1min_before": load_before[0],
               "load_1min": [load_start[0], load_end[0]],
               "busy": busy, "torch": torch.__version__, "python": platform.python_version(),
               "transformers": __import__("transformers").__version__, "dtype": str(hf.dtype),
               "prepacked": cpu_linear.is_packed(hf.model), "packing": cpu_linear.describe(hf.model),
               "draft_vocab": getattr(drafters["dflash", "static"].lm_head, "ids", torch.empty(0)).numel() or None,
               "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               # "contest": the warm-up, the repeats and the round-parts pass; "all": also the floor and item 4
               "minutes": {"contest": (t_parts - t_start) / 60, "all": (t_end - t_start) / 60}}
    flags = ", ".join(f for f, on in machine["cpu"]["flags"].items() if on) or "none of " + ", ".join(FLAGS)
    lines = [f"# Engines side by side on {args.target}: {len(prompts)} {args.benchmark} prompts (tuning split), "
             f"{args.tokens} tokens, {args.threads} thread(s), {args.repeats} repeats; specexp verifies "
             + (f"at most {dc.max_drafts} drafts a round (--max-drafts {args.max_drafts})"
                if dc.max_drafts is not None else
                "each drafter's own K drafts a round")
             + (f"; specexp's linear layers packed (target.prepack: {json.dumps(cpu_linear.describe(hf.model))}), "
                "HF's peers stock" if cpu_linear.is_packed(hf.model) else "")
             + (f"; specexp's DFlash drafts from the {machine['draft_vocab']:,} most frequent answer tokens "
                "(eval.draft_vocab)" if machine["draft_vocab"] else ""),
             "", f"CPU {machine['cpu']['model']} ({machine['cpu']['cores']} cores; flags: {flags}); {hf.dtype}; "
                 f"load before the run {load_before[0]:.2f}{' (BUSY: timings are not clean)' if busy else ' (idle)'}, "
                 f"during {load_start[0]:.2f} → {load_end[0]:.2f}; "
                 f"torch {torch.__version__}, transformers {machine['transformers']}.", "",
             "| contender | s (median of repeats) | tokens | tok/s | × HF greedy [95 % CI] | τ | = HF greedy |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        if "not_run" in r:
            lines.append(f"| {r['contender']} | not run: {r['not_run']} | | | | | |")
            continue
        lines.append(f"| {r['contender']} | {r['seconds']:.2f} | {r['tokens']} | {r['tok_per_s']:.1f} | "
                     f"{r['speed_vs_hf_greedy']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {r['tau']:.2f} | "
                     f"{r['equals_hf_greedy']} |")
    lines += ["", "τ: tokens per verification after the first token (HF peers: tokens − 1 over target forwards − 1).",
              "", "A round's parts (medians over the rounds of one more generation of every prompt; ms, and in AR "
                  "steps of the same engine; each part's median apart, so the parts need not sum to the wall):", "",
              "| contender | k | rounds | round wall | verify k+1 | propose | of it: projection | commit | rest "
              "| syncs / round |", "|---|---:|---:|---|---|---|---|---|---|---:|"]

    def cell(p, part):
        return f"{p[part + '_ms']:.1f} ({p[part + '_in_ar']:.2f})"
    for name, p in parts.items():
        s = "–" if p["syncs_per_round_median"] is None else \
            f"{p['syncs_per_round_median']:g} (max {p['syncs_per_round_max']})"
        lines.append(f"| {name} | {p['k']} | {p['rounds']} | {cell(p, 'wall')} | {cell(p, 'verify')} | "
                     f"{cell(p, 'propose')} | {cell(p, 'projection')} | {cell(p, 'commit')} | {cell(p, 'rest')} "
                     f"| {s} |")
    lines += ["", f"Memory floor of an AR step: read bandwidth {bandwidth:.1f} GB/s (median of 7 sums of "
                  f"{args.bw_mib} MiB, {args.threads} thread(s)); an AR step reads the weights ({w_bytes / 1e6:.0f} "
                  f"MB, {hf.dtype}) and the KV cache at the mean decoding context {context:.0f} ({kv / 1e6:.1f} MB): "
                  f"floor {floor_ms:.1f} ms. Measured AR step: static engine {1000 * ar_step['static']:.1f} ms "
                  f"({floor['static_over_floor']:.2f}× the floor), HF eager {1000 * ar_step['hf']:.1f} ms.", "",
              f"The DFlash drafter's vocabulary projection + argmax per proposal ({len(blocks[0]) if blocks else 0} "
              f"rows, k = {k_dflash}; medians of 15 "
              f"calls on each of {len(blocks)} real proposals), over the {len(hidden)} proposal rows of the run "
              f"(final hidden states of the {hf.dtype} drafter); `agree`: argmax equal to the fp32 full head's"
              + (f"; pruned heads: the most frequent tokens of the answers in {regen_name}" if counts is not None
                 else f"; pruned heads not measured: {pruned_why}") + ":", "",
              "| head | rows | ms / call | agree | fp32 argmax outside | certified exact |",
              "|---|---:|---:|---:|---:|---:|"]
    for v in vocab:
        extra = (f"{100 * v['outside']:.1f} % | {100 * v['certified']:.1f} %" if "outside" in v else "– | –")
        ms = "–" if v["ms_per_call"] is None else f"{v['ms_per_call']:.2f}"
        lines.append(f"| {v['variant']} | {v['rows']} | {ms} | {100 * v['agree']:.1f} % | "
                     f"{extra} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_engine.md").write_text(md)
        (args.out / "bench_engine.json").write_text(json.dumps(
            {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "machine": machine, "max_drafts": dc.max_drafts, "rows": rows, "round_parts": parts, "memory_floor": floor,
             "vocab_projection": vocab, "syncs_per_round": {label[k]: v for k, v in syncs.items()},
             "seconds_by_prompt_and_repeat": times}, indent=1) + "\n")


if __name__ == "__main__":
    main()
