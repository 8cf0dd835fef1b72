"""What task=plan reads: plan.calibrate on the Qwen3-8B-shaped target as target.engine=auto
runs it (static engine, CUDA graphs) with DeLS Table 3's drafters (DFlash 5 layers, DeLS-
Markov, DeLS-RNN, Domino-FT; one shared backbone; random weights), B = 1, 8, 32, 64 at a
1,024-token context, written as calibration.json beside the report (the report's
`calibration_file`); then Table 3 projected from it (plan.project: eval=paper's 8
benchmarks, references at batch 32, 20 timed samples a benchmark, τ plan.DEFAULT_TAU) at the
2048-token answer bound and at an assumed typical 600 tokens: both tables, total hours, and
the goal (<= 1 device-hour) as an informative figure

Why: task=plan projects a paper table's device time from a calibration of the device's step costs, before anything
is spent: this writes the calibration of the GPU it runs on, and projects DeLS Table 3 from it (the goal: at most
one device-hour).

Time limit 54 -> 48 s (PARTS in scripts/gpu_check.py; seconds on one H200): not yet run on a GPU; estimated: start +
build ~17 s, the shared backbone on the GPU and three heads ~5 s, calibrate (4 B, prefill and teacher-forced 1,024
tokens, 4 verify captures, 4 drafters' proposals, Triton autotuning, propose_all at 64 anchors) ~20 s, the
projection ~1 s: ~45 s. CPU dry run 30 s
"""
import json
import math
import time
from pathlib import Path

from gpu_parts.common import (
    BATCHES,
    BATCHES_DRY,
    build_qwen3,
    compose,
    peak_memory,
    qwen3_dtype,
    qwen3_shape,
    shared_dflash,
    write_report,
)

# DeLS-Spec Table 3 at Qwen3-8B as conf/experiment/plan_dels_table3.yaml composes it: eval=paper, benchmark=all
TABLE3_BENCHMARKS = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt_bench", "alpaca")
TABLE3_DRAFTERS = ("none", "dflash", "dels_markov", "dels_rnn", "domino_ft")
TABLE3_BATCH, TABLE3_TIMED, TABLE3_MAX_NEW = 32, 20, 2048     # replay.batch_size, eval.timed_samples, max_new_tokens
TYPICAL_ANSWER_TOKENS = 600     # an assumption (not measured here): non-thinking Qwen3-8B answers of a few hundred
                                # tokens on most of these benchmarks, well under the 2048 budget


def run(ctx) -> dict:
    """The calibration `task=plan` reads (`plan.calibrate`: batched AR steps, prefill and teacher-forced tokens,
    verifies, each Table 3 drafter's proposal and replay per anchor) for the Qwen3-8B-shaped target as
    target=qwen3_8b runs on this device (the static engine; on CUDA its steps after the prefill CUDA graphs), written
    as calibration.json beside the report; then DeLS Table 3's projected device time from it (`plan.project`), at
    the 2048-token answer bound and at a typical answer length."""
    from datetime import datetime, timezone

    from specexp import benchmarks, registry
    from specexp.eval import plan
    from specexp.eval.shards import timed_subset
    from specexp.targets.static import StaticTarget

    dev, dtype = ctx.device, qwen3_dtype(ctx)
    cuda = dev.type == "cuda"
    shape = qwen3_shape(ctx)
    scaled = ctx.dry or shape["num_hidden_layers"] != 36
    t0 = time.perf_counter()
    t, impl = build_qwen3(ctx, shape, dtype, name="qwen3_8b_scaled" if scaled else "qwen3_8b")
    # what registry.build_target makes of target.engine=auto: the static engine, every step shape after the prefill
    # a CUDA graph on CUDA (inductor only with target.compile=true), eager on a CPU
    st = StaticTarget.of(t, compile=cuda, inductor=False)
    layers = 1 if ctx.dry else 5         # the released Qwen3-8B DFlash (z-lab, block 16) has 5 layers
    backbones: dict = {}
    with shared_dflash(dev, backbones):
        drafters = {n: registry.build_drafter(compose([f"drafter={n}", "drafter.init=random",
                                                       f"drafter.num_layers={layers}", "drafter.block_size=16"]
                                                      ).drafter, st) for n in TABLE3_DRAFTERS if n != "none"}
    f = {"shape": shape, "scaled": scaled, "dtype": str(dtype), "attn_implementation": impl,
         "engine": "static, CUDA graphs" if cuda else "static, eager", "drafter_layers": layers,
         "build_s": time.perf_counter() - t0}
    checks, notes = {}, []
    batches, context = (BATCHES_DRY, 64) if ctx.dry else (BATCHES, ctx.args.context)
    t1 = time.perf_counter()
    cal = plan.calibrate(st, drafters, batches=batches, context=context, reps=1 if ctx.dry else 5,
                         anchors=8 if ctx.dry else 64)
    f["calibrate_s"] = time.perf_counter() - t1
    cal["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cal["source"] = ("scripts/gpu_check.py plan_calibration: random weights at the target's shapes (a step's cost "
                     "does not depend on them)" + (f", scaled: {shape}" if scaled else ""))
    path = Path(ctx.args.out).resolve().parent / "calibration.json"
    write_report(path, cal)
    f["calibration_file"], f["calibration"] = str(path), cal
    checks["calibration_reads_back"] = plan.read_calibration(path) == json.loads(json.dumps(cal, default=str))
    ctx.save_partial(f, checks, notes)

    samples = benchmarks.load(list(TABLE3_BENCHMARKS), "paper")
    timed = timed_subset(samples, TABLE3_TIMED, 0)
    tau = {d: plan.DEFAULT_TAU["qwen3_8b"] for d in TABLE3_DRAFTERS if d != "none"}
    best = plan.best_batch(cal)
    f["workload"] = {"samples": len(samples), "turns": sum(len(s.turns) for s in samples),
                     "timed_samples": sum(len(v) for v in timed.values()), "batch": TABLE3_BATCH, "tau": tau}
    f["projection"], f["headline"] = {}, []
    for label, answer, why in (("bound", TABLE3_MAX_NEW, f"eval.max_new_tokens={TABLE3_MAX_NEW} (an upper bound, "
                                                            "task=plan's default without reference answers)"),
                               ("typical", TYPICAL_ANSWER_TOKENS, "assumed typical answer length (not measured)")):
        work = plan.workload(samples, {n: float(answer) for n in TABLE3_BENCHMARKS}, timed)
        rows = plan.project(cal, work, list(TABLE3_DRAFTERS), tau, TABLE3_BATCH)
        total = sum(r["seconds"] for r in rows)
        f["workload"]["per_benchmark"] = {w.benchmark: {"samples": w.samples, "turns": w.turns,
                                                        "timed_turns": w.timed_turns} for w in work}
        assumptions = {
            "answer tokens per turn": f"{answer} on every benchmark ({why})",
            "prompt tokens per turn (mean)": ", ".join(f"{w.benchmark} {w.prompt_tokens:.0f}" for w in work)
                                             + f" (characters / {plan.CHARS_PER_TOKEN})",
            "τ of the timed rounds": ", ".join(f"{k} {v:g}" for k, v in tau.items())
                                    + " (plan.DEFAULT_TAU: the DFlash paper's macro τ at Qwen3-8B)",
            "references batch": f"{TABLE3_BATCH} (replay.batch_size); the calibration's fastest is {best} rows",
            "timed samples": f"{f['workload']['timed_samples']} (eval.timed_samples={TABLE3_TIMED}, seed 0)",
            "weights": "random (step costs only)" + ("; SCALED shapes: not Qwen3-8B's costs" if scaled else ""),
        }
        md = plan.table(rows, cal, assumptions)
        f["projection"][label] = {"answer_tokens": answer, "rows": rows, "total_seconds": total,
                                  "total_hours": total / 3600, "assumptions": assumptions, "markdown": md}
        line = (f"plan: DeLS Table 3 projected {total / 3600:.2f} device-hours at {answer} answer tokens a turn "
                f"({label}: {why})")
        f["headline"].append(line)
        print(line + "\n" + md, flush=True)                             # the child's log holds both tables
    hours = {k: v["total_hours"] for k, v in f["projection"].items()}
    f["goals"] = {"table3_le_1_gpu_hour": hours["bound"] <= 1.0,
                  "table3_le_1_gpu_hour_at_typical_answers": hours["typical"] <= 1.0}
    checks["projection_finite"] = all(math.isfinite(h) and h > 0 for h in hours.values())
    f["peak_memory"] = peak_memory(dev)
    notes += [f"workload: benchmarks.load({list(TABLE3_BENCHMARKS)}, 'paper') = {f['workload']['samples']} samples, "
              f"{f['workload']['turns']} turns (the staged editions' counts where a file holds fewer than the "
              "paper's)",
              "DFlash, DeLS-Markov, DeLS-RNN and Domino-FT share one DFlash backbone (_shared_dflash), as they do "
              "in a real run; calibration.json is what task=plan plan.calibration=PATH reads",
              "goals are informative, not checks: the projection's total at the bound (what task=plan prints by "
              "default) and at the typical length"]
    if scaled:
        notes.append(f"scaled shape: {shape}: the calibration and the hours are not Qwen3-8B's")
    if not cuda:
        notes.append("dry run: a CPU calibration of the scaled target; its hours say the code runs, nothing else")
    return {"figures": f, "checks": checks, "notes": notes}
