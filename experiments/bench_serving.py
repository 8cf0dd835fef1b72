"""specexp's decoding beside vLLM's CPU build, on one machine, the same prompts (token ids), drafter, K and dtype.

Contenders (batch 1, greedy, each prompt generated on its own, its wall time including the prefill):
  specexp AR                  the static engine (`target.engine=static`, CPU default: linear layers packed, q/k/v
                              and gate/up joined: targets/cpu_linear.py)
  specexp DFlash K=<k>        the same DFlash drafter and K as vLLM's, over the whole vocabulary
  specexp DFlash (default)    the main job's CPU setting: eval.max_drafts=auto, eval.draft_vocab=auto
  vLLM AR / DFlash K=<k>      vLLM's CPU build in the serving lane's side environment (`bash scripts/install.sh
                              serve`), the DFlash export specexp writes for it (task=export export.format=vllm),
                              `enforce_eager=True` ("eager") and its default torch.compile path ("compiled")

Each vLLM contender is a warm engine in its own process (export/vllm_runner.py --serve), built once before the
timing (startup and warm-up recorded, not timed). Then `--repeats` turns: in each, every contender generates every
prompt, contenders in a rotated order, so a change of load falls on all of them. Reported per contender: the
median over turns of the summed wall time, tokens/s, the prefill alone (a 1-token generation, median of the
turns) and the decode time per token after it, τ (specexp: tokens per verification; vLLM: 1 + accepted / drafts),
outputs equal to specexp AR's token for token; the memory floor of an AR step (the bytes it must read over the
machine's read bandwidth) and each AR contender's decode time per token against it; and the ratios specexp /
vLLM as geometric means over prompts with a bootstrap 95 % CI (each prompt's time its median over turns; paired:
the same prompts).

    python experiments/bench_serving.py --dtype bfloat16 --prompts 5 --tokens 64 --repeats 3 \\
        --out experiments/results/serving/$(date +%F)-bf16

CPU wall clock: the load before and during the run is recorded (BUSY above 0.5 before the run). On a shared
machine run it with priority (`nice -n -19`, and with the kernel's autogroups off,
`echo 0 > /proc/sys/kernel/sched_autogroup_enabled`, else nice has no effect across sessions).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import engine_measure as em  # noqa: E402
import torch  # noqa: E402
from bench_engine import geo_ci  # noqa: E402

from specexp.machine import FLAGS, cpu_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "src/specexp/export/vllm_runner.py"


class VllmWorker:
    """A warm vLLM engine in its own process (vllm_runner.py --serve): `generate(prompts, max_tokens)`."""

    def __init__(self, python: str, spec: dict, d: Path, name: str):
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").write_text(json.dumps(spec))
        self.log = open(d / f"{name}.log", "w")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.proc = subprocess.Popen([python, str(RUNNER), "--serve", str(d / f"{name}.json")], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM worker {name} exited {self.proc.wait()} at start; its log: {d / name}.log")
        self.ready = json.loads(line)

    def generate(self, prompts: list[list[int]], max_tokens: int | None = None) -> list[dict]:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM worker exited {self.proc.wait()}")
        return json.loads(line)["prompts"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        self.log.close()


def main() -> None:
    from hydra import compose, initialize_config_dir

    from specexp import benchmarks, registry
    from specexp.cli import CONF_DIR
    from specexp.config import EvalConfig
    from specexp.decoding.engine import DecodeConfig, generate
    from specexp.decoding.settings import draft_vocab, max_drafts
    from specexp.eval import metrics
    from specexp.eval.serve_check import export_for_vllm
    from specexp.eval.vllm_side import model_dir, side_python
    from specexp.targets import cpu_linear
    from specexp.targets.settings import TargetSettings

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--benchmark", default="gsm8k")
    ap.add_argument("--split", default="eval", choices=["eval", "tune"],
                    help="the prompts (a speed measurement chooses nothing; eval: those issue #61 measured on)")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=7, help="drafts a round for both engines' DFlash K=<k> contenders")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm-modes", default="eager,compiled", help="comma-separated: eager, compiled ('' = none)")
    ap.add_argument("--python", default=".venv-serve/bin/python", help="the side environment's Python (vLLM)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/specexp-bench-serving"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    modes = [m for m in args.vllm_modes.split(",") if m]

    def config(*more: str):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("config", [f"target={args.target}", f"target.dtype={args.dtype}", "drafter=dflash",
                                      "device=cpu", f"benchmark={args.benchmark}", *more])

    cfg = config()
    target = registry.build_target(cfg.target, torch.device("cpu"))
    samples = benchmarks.load([args.benchmark], args.prompts, split=args.split, tune_samples=args.prompts)
    prompts = [target.encode_chat([{"role": "user", "content": s.turns[0]}]) for s in samples]
    stops = tuple(target.stop_token_ids)
    full = registry.build_drafter(cfg.drafter, target)
    vocab = draft_vocab(EvalConfig.from_cfg(cfg.eval), "dflash", torch.device("cpu"))
    default = registry.build_drafter(cfg.drafter, target, vocab)
    cap = max_drafts("auto", torch.device("cpu"), target.dtype)
    dc_k = DecodeConfig(max_new_tokens=args.tokens, stop_token_ids=stops, max_drafts=args.k)
    dc_default = DecodeConfig(max_new_tokens=args.tokens, stop_token_ids=stops, max_drafts=cap)

    def ours(drafter, dc):
        def run(batch, max_tokens=None):
            out = []
            for ids in batch:
                d = dc if max_tokens is None else DecodeConfig(max_new_tokens=max_tokens, stop_token_ids=stops)
                t0 = time.perf_counter()
                g = generate(target, drafter, ids, d)
                out.append({"output_ids": list(g.tokens), "wall_s": time.perf_counter() - t0,
                            "accept_lengths": list(g.accept_lengths)})
            return out
        return run

    contenders = {"specexp AR": ours(None, dc_k), f"specexp DFlash K={args.k}": ours(full, dc_k),
                  f"specexp DFlash (default: {cap} drafts, {getattr(default.lm_head, 'ids', torch.empty(0)).numel()}"
                  "-token draft vocabulary)": ours(default, dc_default)}
    workers, ready = [], {}
    if modes:
        python = side_python(args.python, key="--python")
        scratch = args.scratch
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            scfg = compose("config", [f"target={args.target}", f"target.dtype={args.dtype}", "task=serve_check",
                                      "device=cpu", f"benchmark={args.benchmark}"])
        export = export_for_vllm(scfg, "dflash", scratch / "exports" / "dflash")
        spec = {"model": model_dir(target, TargetSettings.of(cfg.target), scratch / "target"), "prompts": prompts,
                "dtype": args.dtype, "max_model_len": 1024, "max_new_tokens": args.tokens,
                "stop_token_ids": list(stops)}
        for mode in modes:
            for name, sc in (("AR", None), (f"DFlash K={args.k}", {"method": "dflash", "model": export,
                                                                   "num_speculative_tokens": args.k})):
                label = f"vLLM {name} ({mode})"
                print(f"starting {label} ...", file=sys.stderr, flush=True)
                w = VllmWorker(python, {**spec, "runs": [{"name": label, "speculative_config": sc,
                                                          "enforce_eager": mode == "eager"}]},
                               scratch / "workers", label.replace(" ", "_").replace("(", "").replace(")", ""))
                workers.append(w)
                ready[label] = w.ready
                contenders[label] = w.generate

    load_during = []
    times = {c: [[] for _ in prompts] for c in contenders}          # contender -> prompt -> wall per turn
    prefill = {c: [] for c in contenders}                          # contender -> per turn, summed 1-token walls
    outputs, taus = {}, {}
    names = list(contenders)
    for turn in range(args.repeats):
        order = names[turn % len(names):] + names[:turn % len(names)]
        for c in order:
            rows = contenders[c](prompts)
            for i, r in enumerate(rows):
                times[c][i].append(r["wall_s"])
            outputs[c] = [r["output_ids"] for r in rows]
            if "accept_lengths" in rows[0]:
                taus[c] = metrics.tau([{"accept_lengths": r["accept_lengths"]} for r in rows])
            elif rows[0].get("num_drafts"):
                drafts, acc = sum(r["num_drafts"] for r in rows), sum(r["num_accepted"] for r in rows)
                taus[c] = 1 + acc / drafts if drafts else None
            prefill[c].append(sum(r["wall_s"] for r in contenders[c](prompts, 1)))
            load_during.append(os.getloadavg()[0])
        print(f"turn {turn + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    for w in workers:
        w.close()
    # The memory floor of an AR step: the bytes a step must read (the weights, a tied embedding once as the lm_head,
    # and the KV cache at the mean decoding context) over the machine's read bandwidth.
    bandwidth = em.read_bandwidth()
    context = round(statistics.fmean(len(ids) + args.tokens / 2 for ids in prompts))
    step_bytes = em.weight_bytes(target.model) + em.kv_bytes(target.config, context, target.dtype)
    floor_ms = 1000 * step_bytes / (bandwidth * 1e9)

    ref = outputs["specexp AR"]
    n_tok = {c: sum(len(o) for o in outputs[c]) for c in contenders}
    rows = []
    for c in contenders:
        total = statistics.median([sum(t[r] for t in times[c]) for r in range(args.repeats)])
        pre = statistics.median(prefill[c])
        rows.append({"contender": c, "wall_s": round(total, 4), "tokens": n_tok[c],
                     "tokens_per_s": round(n_tok[c] / total, 2),
                     "prefill_ms_per_prompt": round(1e3 * pre / len(prompts), 2),
                     "decode_ms_per_token": round(1e3 * (total - pre) / max(n_tok[c] - len(prompts), 1), 2),
                     "tau": taus.get(c), "equal_to_specexp_ar": sum(a == b for a, b in zip(outputs[c], ref)),
                     "per_prompt_median_s": [statistics.median(t) for t in times[c]],
                     "per_turn_s": [round(sum(t[r] for t in times[c]), 4) for r in range(args.repeats)]})
    by = {r["contender"]: r for r in rows}
    floor = {"read_bandwidth_gb_s": round(bandwidth, 2), "step_mb": round(step_bytes / 1e6, 1), "context": context,
             "floor_ms": round(floor_ms, 2),
             "ar_decode_over_floor": {c: round(by[c]["decode_ms_per_token"] / floor_ms, 2) for c in contenders
                                      if " AR" in c}}
    ratios = []
    for ours_name in [c for c in contenders if c.startswith("specexp")]:
        for theirs in [c for c in contenders if c.startswith("vLLM")]:
            # speed ratio per prompt (tokens/s ours over theirs), paired on the prompt
            per = [(len(a) / ta) / (len(b) / tb) for a, b, ta, tb in
                   zip(outputs[ours_name], outputs[theirs], by[ours_name]["per_prompt_median_s"],
                       by[theirs]["per_prompt_median_s"])]
            g, lo, hi = geo_ci(per)
            ratios.append({"specexp": ours_name, "vllm": theirs, "speed_ratio": round(g, 3),
                           "ci95": [round(lo, 3), round(hi, 3)]})
    info = cpu_info()
    busy = load_before[0] > 0.5
    machine = {"cpu": info["model"], "flags": {f: info["flags"].get(f) for f in FLAGS}, "threads": args.threads,
               "dtype": args.dtype, "load_before": [round(x, 2) for x in load_before],
               "load_during_max": round(max(load_during or [0]), 2), "busy": busy, "nice": os.nice(0),
               "torch": torch.__version__, "python": platform.python_version(),
               "prepacked": cpu_linear.describe(target.model),
               "vllm": next(iter(ready.values()), {}).get("vllm_version"), "vllm_ready": ready,
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine, "rows": rows, "ratios": ratios,
              "memory_floor": floor, "prompt_ids": prompts}
    lines = [f"# specexp beside vLLM {machine['vllm']} on one CPU: {args.target}, {args.dtype}, batch 1, "
             f"{len(prompts)} {args.benchmark} {args.split}-split prompts x {args.tokens} new tokens, "
             f"{args.repeats} turns" + (" (BUSY machine)" if busy else ""), "",
             f"CPU {machine['cpu']}, flags {', '.join(f for f, on in machine['flags'].items() if on)}, "
             f"{args.threads} threads, nice {machine['nice']}, load before {machine['load_before'][0]}, "
             f"max during {machine['load_during_max']}; torch {machine['torch']}.", "",
             "| contender | tokens/s | wall s (median of turns) | prefill ms/prompt | decode ms/token | τ | "
             "output = specexp AR |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        tau = "–" if r["tau"] is None else f"{r['tau']:.3f}"
        lines.append(f"| {r['contender']} | {r['tokens_per_s']:.1f} | {r['wall_s']:.2f} | "
                     f"{r['prefill_ms_per_prompt']:.1f} | {r['decode_ms_per_token']:.2f} | {tau} | "
                     f"{r['equal_to_specexp_ar']}/{len(prompts)} |")
    lines += ["", "Speed of specexp over vLLM (tokens/s ratio, geometric mean over prompts, bootstrap 95% CI):", "",
              "| specexp | vLLM | ratio [95% CI] |", "|---|---|---|"]
    lines += [f"| {r['specexp']} | {r['vllm']} | {r['speed_ratio']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] |"
              for r in ratios]
    lines += ["", f"Memory floor of an AR step: {floor['step_mb']} MB read (weights, a tied embedding once, and the KV "
              f"cache at {context} positions) at {floor['read_bandwidth_gb_s']} GB/s (median of 7 sums of a 512 MiB "
              f"tensor) = {floor['floor_ms']} ms; AR decode ms/token over it: "
              + ", ".join(f"{c} {x}×" for c, x in floor["ar_decode_over_floor"].items()) + "."]
    lines += ["", "vLLM engines (built before the timing): " + "; ".join(
        f"{k}: startup {v.get('startup_s')} s, warm-up {v.get('warmup_s')} s" for k, v in ready.items()), ""]
    md = "\n".join(lines)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_serving.json").write_text(json.dumps(result, indent=1))
        (args.out / "bench_serving.md").write_text(md)


if __name__ == "__main__":
    main()
