"""`task=plan`: what a run of the composed config will cost on a device, before anything is spent.

A run of the papers' tables has three stages, each a sum of step costs that can be measured once per device:
  references   the target's greedy answers, `replay.batch_size` rows at a time (decoding/batch.py):
               per turn a batch-1 prefill of its prompt, then its answer's steps shared with B - 1 other rows
  replay       per drafter: one teacher-forced target pass over prompt + answer (shared by drafters reading the
               same taps) and the drafter's proposals at every anchor of the answer (`propose_all`)
  timed        per drafter, on `eval.timed_samples`: the AR baseline and the drafter decoding each timed turn at
               batch 1 (speedup's protocol): prefills, the AR steps, and answer/τ rounds of a verify of k + 1 rows
               plus one proposal

A *calibration* (`calibrate`, a JSON file) holds the measured step costs of one target on one device: the batched AR
step at several batch sizes, the prefill and teacher-forced pass per token, the verify of T rows, and per drafter the
proposal and the replay cost per anchor. `project` multiplies them by the workload (samples, turns, prompt lengths of
the selected benchmarks) and by two assumptions, printed with the table and overridable:
  answer tokens   per turn: `plan.answer_tokens` (an int, or a mapping per benchmark), default the answers of a
                  shipped reference set when `replay.references` names one, else `eval.max_new_tokens` (the bound)
  τ               per drafter: `plan.tau` (a number, or a mapping per drafter), default `DEFAULT_TAU` by target
Nothing here imports Hydra or OmegaConf: the GPU check (scripts/gpu_parts/plan_calibration.py, whose image has
neither) calls `calibrate` and `project` directly.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..calibration import CALIBRATION_VERSION, read_calibration
from ..clock import now
from ..errors import UserError, check, invariant
from ..machine import describe

# τ assumed for a drafter's timed rounds when `plan.tau` is not given: the DFlash paper's macro τ at T = 0 (Table 1,
# Qwen3-4B 6.54, Qwen3-8B 6.49; the DeLS family reports more, so this errs towards more rounds), and the mini DFlash
# b8's measured macro τ by replay (1.484 on 380 prompts, README). Elsewhere 2.0.
DEFAULT_TAU = {"qwen3_4b": 6.54, "qwen3_8b": 6.49, "smollm2_135m": 1.48}
CHARS_PER_TOKEN = 3.5       # prompt characters per token when the tokenizer is not at hand (English and code, BPE)


def _median_ms(f, device, reps: int, reset=None) -> float:
    """Median wall time of `f()` in ms over `reps` calls after one untimed call; `reset()` runs before each call,
    untimed (a cache's length put back)."""
    ts = []
    for i in range(reps + 1):
        if reset is not None:
            reset()
        t0 = now(device)
        f()
        if i:
            ts.append(1000 * (now(device) - t0))
    return statistics.median(ts)


@torch.inference_mode()
def calibrate(target, drafters: dict, batches=(1, 4, 8, 16, 32), context: int = 256, reps: int = 5,
              anchors: int = 64) -> dict:
    """The step costs of `target` (and of each built drafter in `drafters`, name -> drafter) on its device, at a
    context of `context` tokens (random ids: a step's cost does not depend on which tokens it reads)."""
    from .references import batch_engine

    dev = target.device
    g = torch.Generator().manual_seed(0)
    long = 2 * context                                 # a second context: what a step's cost grows by per token
    ids = torch.randint(target.vocab_size, (1, long + anchors + 1), generator=g).to(dev)           # [1, 2C + N + 1]
    rows = batch_engine(target)
    ar: dict[int, dict[str, float]] = {context: {}, long: {}}
    for b in batches:
        cache = rows.new_rows_cache(b, long + 2)
        newest = ids[0, :b] if b <= ids.shape[1] else ids[0, :1].expand(b)
        for c in (context, long):
            def back(cache=cache, b=b, c=c):
                cache.lengths = [c] * b
            ar[c][str(b)] = _median_ms(lambda: rows.decode_rows(newest, cache, [True] * b), dev, reps, back)
        del cache
    taps = sorted({t for d in drafters.values() for t in d.tap_layers})
    prefill, tf = {}, {}
    for c in (context, long):
        prompt = ids[:, :c]
        prefill[str(c)] = _median_ms(lambda: target.forward(prompt, 0, target.new_cache(c + 32), last_only=True),
                                     dev, reps)
        tf[str(c)] = _median_ms(lambda: target.forward(prompt, 0, target.new_cache(c + 32), taps=taps), dev, reps)
    prompt = ids[:, :context]
    write = _tap_write_ms(target, context, dev) if taps else 0.0
    cache = target.new_cache(context + 64)
    _, hidden = target.forward(prompt, 0, cache, taps=taps)
    ks = sorted({2, 4, 8, 16} | {d.max_drafts + 1 for d in drafters.values()})
    verify = {}
    for t in ks:
        block = ids[:, context:context + t]
        verify[str(t)] = _median_ms(lambda: target.forward(block, context, cache), dev, reps,
                                    lambda t=t: target.rollback(cache, cache.get_seq_length() - context))
    out_drafters = {}
    for name, d in drafters.items():
        ctx_taps = torch.cat([hidden[..., target.hidden_size * taps.index(t):
                                     target.hidden_size * (taps.index(t) + 1)] for t in d.tap_layers], -1) \
            if d.tap_layers else None                                                          # [1, C, n*H]

        def prefill_drafter(d=d, ctx_taps=ctx_taps):
            d.reset()
            if getattr(d, "needs_prompt_ids", False):
                d.prefill(ctx_taps, ids=prompt[0].tolist())
            else:
                d.prefill(ctx_taps)
        anchor = int(ids[0, context])
        propose = _median_ms(lambda d=d: d.propose(anchor, context, d.max_drafts, None), dev, reps, prefill_drafter)
        entry = {"max_drafts": d.max_drafts, "taps": list(d.tap_layers), "propose_ms": propose}
        if hasattr(d, "propose_all"):
            _, wide = target.forward(ids[:, :context + anchors], 0, target.new_cache(context + anchors + 8),
                                     taps=d.tap_layers)
            starts = context + torch.arange(anchors)
            kk = torch.full((anchors,), d.max_drafts)
            entry["replay_anchor_ms"] = _median_ms(lambda d=d, wide=wide: d.propose_all(wide, ids[0], starts, kk), dev,
                                                   max(1, reps // 2)) / anchors
        else:                                                  # replay drives propose round by round
            entry["replay_anchor_ms"] = propose
        out_drafters[name] = entry
    return {
        "version": CALIBRATION_VERSION, "machine": describe(dev), "target": target.name,
        "dtype": str(target.dtype).removeprefix("torch."), "engine": type(target).__name__,
        "context": context, "reps": reps, "torch": torch.__version__,
        "ar_step_ms": ar[context], "ar_step_ms_long": ar[long], "context_long": long,
        "prefill_ms": prefill, "teacher_forced_ms": tf, "tap_write_ms_per_token_layer": write,
        "prefill_ms_per_token": prefill[str(context)] / context,
        "teacher_forced_ms_per_token": tf[str(context)] / context,
        "verify_ms": verify, "drafters": out_drafters,
    }


def _tap_write_ms(target, tokens: int, dev) -> float:
    """ms to write one tap layer's hidden states of one token to a safetensors file (replay's tap cache)."""
    import tempfile

    from safetensors.torch import save_file

    x = torch.zeros(1, tokens, 4 * target.hidden_size, dtype=target.dtype)                  # 4 layers' taps
    with tempfile.TemporaryDirectory() as d:
        ms = _median_ms(lambda: save_file({"taps": x}, f"{d}/t.safetensors"), dev, 3)
    return ms / tokens / 4


def _curve(points: dict, length: float) -> float:
    """ms of a pass over `length` tokens from two measured lengths, as a·L + b·L² (projections, attention)."""
    (l1, t1), (l2, t2) = sorted((int(k), float(v)) for k, v in points.items())
    b = (t2 - t1 * l2 / l1) / (l2 * l2 - l1 * l2)
    a = (t1 - b * l1 * l1) / l1
    return max(a * length + b * length * length, 0.0)


# ------------------------------------------------------------------------------------------------ projection
@dataclass
class Workload:
    """One benchmark's share of a run: its samples, turns, mean prompt tokens of a turn (a later turn's prompt
    holds the earlier answers), answer tokens per turn (the assumption) and the turns of its timed samples."""

    benchmark: str
    samples: int
    turns: int
    prompt_tokens: float
    answer_tokens: float
    timed_turns: int


def workload(samples, answer_tokens: dict[str, float], timed: dict[str, list[str]] | None,
             prompt_tokens=None) -> list[Workload]:
    """The workload of `samples` (benchmarks.Sample); `prompt_tokens(sample, turn)` counts a turn's own user tokens
    (default: characters / CHARS_PER_TOKEN). `timed`: eval/shards.timed_subset's ids (None: all timed)."""
    count = prompt_tokens or (lambda s, i: len(s.turns[i]) / CHARS_PER_TOKEN)
    out: dict[str, Workload] = {}
    for s in samples:
        a = answer_tokens[s.benchmark]
        w = out.setdefault(s.benchmark, Workload(s.benchmark, 0, 0, 0.0, a, 0))
        w.samples += 1
        ctx = 0.0
        for i in range(len(s.turns)):
            ctx += count(s, i)
            w.prompt_tokens += ctx                       # summed here, a mean below
            ctx += a
        w.turns += len(s.turns)
        if timed is None or s.id in timed.get(s.benchmark, ()):
            w.timed_turns += len(s.turns)
    for w in out.values():
        w.prompt_tokens /= max(w.turns, 1)
    return list(out.values())


def _per_batch(table: dict, b: int) -> float:
    """A step's ms at batch `b` from a table measured at some batch sizes: linear between two measured sizes,
    beyond the largest in proportion to the batch (no better throughput assumed than measured)."""
    pts = sorted((int(k), float(v)) for k, v in table.items())
    if b <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return pts[-1][1] * b / pts[-1][0]


def best_batch(cal: dict) -> int:
    """The measured batch size with the most tokens per second."""
    return max((int(b) for b in cal["ar_step_ms"]), key=lambda b: b / float(cal["ar_step_ms"][str(b)]))


def project(cal: dict, work: list[Workload], drafters: list[str], tau: dict[str, float], batch: int,
            max_drafts: int | None = None) -> list[dict]:
    """Projected seconds of each stage (rows: stage, drafter, seconds, what it counts). `drafters` may include
    "none" (AR alone: references, and its timed run). A drafter missing from the calibration is one line."""
    missing = [d for d in drafters if d != "none" and d not in cal["drafters"]]
    check(not missing, f"the calibration ({cal.get('target')}, {cal.get('machine', {}).get('device')}) has no "
                       f"step costs for drafter {', '.join(missing)}; calibrate with it (task=plan without "
                       "plan.calibration)")
    turns = sum(w.turns for w in work)
    rows_b = reference_rows(batch, turns)
    ctx = {w.benchmark: w.prompt_tokens + w.answer_tokens / 2 for w in work}      # a turn's mean decoding context

    def prefill(w):
        return w.turns * pass_ms(cal, "prefill", w.prompt_tokens)

    ref_ms = sum(prefill(w) + w.turns * max(w.answer_tokens - 1, 0) * step_ms(cal, rows_b, ctx[w.benchmark]) / rows_b
                 for w in work)
    rows = [{"stage": "references", "drafter": "none", "seconds": ref_ms / 1000,
             "counts": f"{turns} turns, batch {rows_b}"}]
    seen_taps = set()
    write = float(cal.get("tap_write_ms_per_token_layer", 0.0))
    for d in drafters:
        if d == "none":
            continue
        c = cal["drafters"][d]
        taps = tuple(c["taps"])
        tf_ms = 0.0 if taps in seen_taps else sum(
            w.turns * (pass_ms(cal, "teacher_forced", w.prompt_tokens + w.answer_tokens)
                       + write * len(taps) * (w.prompt_tokens + w.answer_tokens)) for w in work)
        seen_taps.add(taps)
        rp = tf_ms + sum(w.turns * w.answer_tokens * float(c["replay_anchor_ms"]) for w in work)
        rows.append({"stage": "replay", "drafter": d, "seconds": rp / 1000,
                     "counts": "teacher-forced taps shared" if tf_ms == 0 else f"{turns} turns"})
    timed_turns = sum(w.timed_turns for w in work)
    for d in drafters:
        t_ms = sum(w.timed_turns / max(w.turns, 1) * prefill(w)
                   + w.timed_turns * max(w.answer_tokens - 1, 0) * step_ms(cal, 1, ctx[w.benchmark]) for w in work)
        if d != "none":                        # the drafter's own run beside AR (the speedup's pair)
            c = cal["drafters"][d]
            k = min(int(c["max_drafts"]), max_drafts) if max_drafts is not None else int(c["max_drafts"])
            rnd = _per_batch(cal["verify_ms"], k + 1) + float(c["propose_ms"])
            t_ms += sum(w.timed_turns / max(w.turns, 1) * prefill(w)
                        + w.timed_turns * max(w.answer_tokens - 1, 0) / tau[d] * rnd for w in work)
        rows.append({"stage": "timed", "drafter": d, "seconds": t_ms / 1000,
                     "counts": f"{timed_turns} turns at batch 1" + (f", τ {tau[d]:g}" if d != "none" else "")})
    return rows


def reference_rows(batch: int, turns: int) -> int:
    """The rows the references stage decodes side by side: the batch, at most the run's turns."""
    return max(1, min(batch, turns))


def pass_ms(cal: dict, kind: str, length: float) -> float:
    """ms of one batch-1 pass (`kind`: prefill or teacher_forced) over `length` tokens: the curve through the two
    measured lengths where the calibration has them, else its per-token cost times the length."""
    if f"{kind}_ms" in cal:
        return _curve(cal[f"{kind}_ms"], length)
    return float(cal[f"{kind}_ms_per_token"]) * length


def step_ms(cal: dict, b: int, context: float) -> float:
    """ms of one AR step of `b` rows at `context` tokens: linear in the context through the two measured contexts
    (a step reads every row's keys and values), never below half the shorter context's cost."""
    s1 = _per_batch(cal["ar_step_ms"], b)
    if "ar_step_ms_long" not in cal:
        return s1
    s2, c1, c2 = _per_batch(cal["ar_step_ms_long"], b), float(cal["context"]), float(cal["context_long"])
    return max(s1 + (s2 - s1) * (context - c1) / (c2 - c1), 0.5 * s1)


def table(rows: list[dict], cal: dict, assumptions: dict) -> str:
    """The plan as markdown: one row per stage and drafter, the total, and what it assumed."""
    m = cal.get("machine", {})
    where = m.get("gpu") or m.get("cpu") or m.get("device", "?")
    out = [f"Projected device time: {cal.get('target')} ({cal.get('dtype')}) on {where}, from the calibration of "
           f"{cal.get('measured_at', 'this run')}", "",
           "| stage | drafter | time | counts |", "|---|---|---:|---|"]
    for r in rows:
        out.append(f"| {r['stage']} | {r['drafter']} | {_hms(r['seconds'])} | {r['counts']} |")
    total = sum(r["seconds"] for r in rows)
    out.append(f"| **total** | | **{_hms(total)}** ({total / 3600:.2f} device-hours) | |")
    out += ["", "Assumptions (override with plan.answer_tokens=..., plan.tau=...):"]
    out += [f"- {k}: {v}" for k, v in assumptions.items()]
    return "\n".join(out) + "\n"


def _hms(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.2f} h"


# ------------------------------------------------------------------------------------------------ the task
def answer_tokens_of(value, names: list[str], max_new_tokens: int, references: str | None) -> tuple[dict, str]:
    """Answer tokens per turn for each benchmark, and where the figure came from (module docstring)."""
    if isinstance(value, dict):
        return {n: float(value.get(n, max_new_tokens)) for n in names}, "plan.answer_tokens (others: the budget)"
    if value is not None:
        return {n: float(value) for n in names}, "plan.answer_tokens"
    if references:
        import gzip

        try:
            with gzip.open(Path(references).expanduser(), "rt") as f:
                refs = json.load(f)["references"]
        except (OSError, EOFError, json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"replay.references={references!r}: not a reference file written by replay.export") \
                from None
        got: dict[str, list[int]] = {}
        for r in refs:
            got.setdefault(r["benchmark"], []).extend(len(t["tokens"]) for t in r["turns"])
        return ({n: statistics.fmean(got[n]) if got.get(n) else float(max_new_tokens) for n in names},
                f"the answers of replay.references={references} (the budget where it has none)")
    return {n: float(max_new_tokens) for n in names}, f"eval.max_new_tokens={max_new_tokens} (an upper bound)"


def drafter_group(name: str, cfg, random: bool = False):
    """The `drafter=<name>` group as the command line would compose it beside this config's target; `random`: with
    random weights of the group's default sizes (a step's cost depends on the sizes, not on the weights)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..paths import CONF_DIR

    over = [f"drafter={name}", f"fusion.alpha={cfg.fusion.alpha}", f"fusion.beta={cfg.fusion.beta}",
            *(["drafter.init=random"] if random else [])]
    if GlobalHydra.instance().is_initialized():          # inside a `python -m specexp` job
        group = compose("config", overrides=over).drafter
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            group = compose("config", overrides=over).drafter
    from .. import registry

    return group if random else registry.fill_default_checkpoints(group, cfg.target.name)


def build_for_cost(name: str, cfg, target):
    """The drafter whose step costs a calibration measures: the target's own (its default checkpoint: the real sizes,
    e.g. the released Qwen3-8B DFlash's 5 layers), else, where that cannot be loaded here (no checkpoint, no hub),
    random weights of the config's default sizes, said in the log."""
    from .. import log, registry

    try:
        return registry.build_drafter(drafter_group(name, cfg), target)
    except UserError as e:
        log.LOG.info(f"plan: {name} with random weights of its default sizes ({e})")
        return registry.build_drafter(drafter_group(name, cfg, random=True), target)


def run_plan(cfg, out_dir, typed=None) -> dict:
    """`task=plan`: the projected device time of each stage of the composed run, from `plan.calibration` or from a
    calibration measured here and now (written beside the plan); one table, nothing else run."""
    from .. import benchmarks, log, registry
    from ..config import checked
    from ..files import write_json, write_text_atomic
    from ..machine import resolve_device
    from ..rundir import claimed_for
    from .replay import CPU_REFERENCE_BATCH
    from .shards import timed_subset

    typed = checked(cfg, typed)
    pc, ev, rp = typed.plan, typed.eval, typed.replay
    drafters = list(pc.drafters) if pc.drafters is not None else [cfg.drafter.name]
    names = list(cfg.benchmark.names)
    samples = benchmarks.from_config(typed.benchmark, ev)
    answers, answers_from = answer_tokens_of(pc.answer_tokens, names, ev.max_new_tokens,
                                             rp.references if rp is not None else None)
    default_tau = DEFAULT_TAU.get(cfg.target.name, 2.0)
    tau = {d: float(pc.tau.get(d, default_tau)) if isinstance(pc.tau, dict) else
           float(pc.tau if pc.tau is not None else default_tau) for d in drafters if d != "none"}
    cal = read_calibration(pc.calibration) if pc.calibration is not None else None    # refused before the claim
    with claimed_for(out_dir, "plan") as d:
        if cal is None:
            device = resolve_device(cfg.device)
            target = registry.build_target(cfg.target, device)
            built = {n: build_for_cost(n, cfg, target) for n in drafters if n != "none"}
            log.LOG.info(f"plan: calibrating {target.name} and {', '.join(built) or 'no drafter'} on {device}")
            from datetime import datetime, timezone

            cal = calibrate(target, built, batches=tuple(pc.batches), context=pc.context)
            cal["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            write_json(d / "calibration.json", cal)
        value = pc.batch_size if pc.batch_size != "auto" else \
            (rp.batch_size if rp is not None and rp.batch_size != "auto" else "auto")
        on_cpu = cal.get("machine", {}).get("device") == "cpu"
        batch = int(value) if value != "auto" else CPU_REFERENCE_BATCH if on_cpu else 1
        timed = timed_subset(samples, ev.timed_samples, cfg.seed)
        work = workload(samples, answers, timed)
        rows = project(cal, work, drafters, tau, batch, ev.max_drafts if isinstance(ev.max_drafts, int) else None)
        invariant(all(math.isfinite(r["seconds"]) and r["seconds"] >= 0 for r in rows),
                  f"a projection of a checked calibration is not finite: {rows}")
        best = best_batch(cal)
        turns = sum(w.turns for w in work)
        source = "plan.batch_size" if pc.batch_size != "auto" else "replay.batch_size" if value != "auto" else \
            f"replay.batch_size=auto: {batch} on {'a CPU' if on_cpu else 'a GPU'}"
        refs = reference_rows(batch, turns)
        assumptions = {
            "answer tokens per turn": ", ".join(f"{w.benchmark} {w.answer_tokens:.0f}" for w in work)
                                      + f" (from {answers_from})",
            "prompt tokens per turn (mean)": ", ".join(f"{w.benchmark} {w.prompt_tokens:.0f}" for w in work)
                                             + f" (characters / {CHARS_PER_TOKEN})",
            "τ of the timed rounds": ", ".join(f"{k} {v:g}" for k, v in tau.items()) or "no drafter",
            "references batch": f"{refs} row{'s' * (refs != 1)} ({source}"
                                + (f", at most the run's {turns} turns" if refs < batch else "")
                                + f"); the calibration's fastest is {best} rows "
                                  f"({best / float(cal['ar_step_ms'][str(best)]) * 1000:.0f} tokens/s)",
            "timed samples": "every sample" if timed is None else
                             f"{sum(len(v) for v in timed.values())} (eval.timed_samples={ev.timed_samples})",
        }
        md = table(rows, cal, assumptions)
        result = {"calibration": cal, "workload": [asdict(w) for w in work], "rows": rows, "assumptions": assumptions,
                  "total_seconds": sum(r["seconds"] for r in rows)}
        write_json(d / "plan.json", result)
        write_text_atomic(d / "plan.md", md)
    log.table(md)
    return result
