"""Training cost of the DeLS-Spec local head against Domino-FT at equal anchors and equal steps (DeLS-Spec Table 5's
comparison) on the mini target, measured side by side on one machine:

    python experiments/train_cost.py --steps 8 --repeats 3 --threads 2 --out experiments/results/mini_claims/train_cost

(the folder experiments/mini_claims.py reads for Table 5's row).

Arms (both by §5.7's recipe: 256 anchored blocks per sequence, batch 1 x gradient accumulation 4, bf16-mixed, the
same 1,928 mini_regen sequences in the same order, the frozen b8 backbone for Domino-FT):
  dels_rnn          experiment=mini_dels_rnn_paper: the RNN head reads tokens only
  domino_ft         experiment=mini_domino_ft_256, target features read from the feature cache (as the kept run)
  domino_ft-online  the same with data.features=online: the target's forward pass inside every step, where Table 5's
                    Domino-FT cost sits at Qwen3 scale (on a 135M target it is small; that is the scale caveat)
Each run trains `--steps` optimizer steps from scratch in a process of its own (peak RSS is per process), with a
fresh stage directory (a temporary cache that links the shared regen and feature stages, so nothing is rebuilt and
nothing trained is reused); the arms are interleaved, `--repeats` rounds. Reported per arm: seconds per optimizer
step (the card's train_seconds / steps: from Lightning's train start, after setup and data loading, so the first
step's warm-up is included for every arm alike), median and range over the repeats, peak RSS, trainable
parameters; and the ratios to dels_rnn paired within a round. The machine (CPU, flags, threads) and the load
average before and after are recorded.
Outputs: <out>/train_cost.json and train_cost.md (a failed run leaves the finished repeats in
train_cost.partial.json). Needs the regen stage of data=mini_regen and Domino-FT's feature cache in the cache
(`python -m specexp experiment=mini_domino_ft_256` builds both); a stage missing there is built again inside every
run's temporary cache: slow (about 20 min for the features), though outside the time measured.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = {
    "dels_rnn": ["experiment=mini_dels_rnn_paper"],
    "domino_ft": ["experiment=mini_domino_ft_256"],
    "domino_ft-online": ["experiment=mini_domino_ft_256", "data.features=online"],
}
SHARED = ("regen-", "features-")      # stages a run reads and never trains: linked, not rebuilt


def run_arm(arm: str, steps: int, threads: int, shared: Path, scratch: Path) -> dict:
    """One training run of `arm` for `steps` steps in a fresh cache under `scratch`; its card plus wall seconds."""
    stages = scratch / "cache" / "stages"
    stages.mkdir(parents=True)
    for p in shared.glob("*"):
        if p.name.startswith(SHARED) and ((p / "DONE").exists() or (p / "index.json").exists()):
            (stages / p.name).symlink_to(p)
    cmd = [sys.executable, "-m", "specexp", *ARMS[arm], f"train.max_steps={steps}", "train.eval_after=false",
           f"train.export_dir={scratch / 'export'}", f"paths.cache={scratch / 'cache'}", f"cpu_threads={threads}",
           "logger=none", f"hydra.run.dir={scratch / 'run'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled"}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{arm}: training failed ({done.returncode}):\n{done.stderr[-3000:]}")
    card = json.loads((scratch / "export" / "card.json").read_text())
    if card["steps"] != steps:
        raise RuntimeError(f"{arm}: trained {card['steps']} steps, not {steps}")
    return {"seconds_per_step": card["train_seconds"] / card["steps"], "train_seconds": card["train_seconds"],
            "steps": card["steps"], "peak_memory_mb": card["peak_memory_mb"],
            "trainable_params": card["trainable_params"], "anchors": card["facts"]["recipe"]["num_anchors"],
            "accumulate": card["train"]["accumulate"], "precision": card["precision"], "wall_seconds": wall}


def summarize(rounds: list[dict]) -> dict:
    """Per arm: median and range of s/step and peak RSS; ratios to dels_rnn paired within each round."""
    out = {}
    for arm in rounds[0]:
        sps = [r[arm]["seconds_per_step"] for r in rounds]
        mem = [r[arm]["peak_memory_mb"] for r in rounds]
        ratio = [r[arm]["seconds_per_step"] / r["dels_rnn"]["seconds_per_step"] for r in rounds]
        mratio = [r[arm]["peak_memory_mb"] / r["dels_rnn"]["peak_memory_mb"] for r in rounds]
        first = rounds[0][arm]
        out[arm] = {"seconds_per_step": statistics.median(sps), "seconds_per_step_range": [min(sps), max(sps)],
                    "peak_memory_mb": statistics.median(mem), "peak_memory_mb_range": [min(mem), max(mem)],
                    "time_ratio": statistics.median(ratio), "time_ratio_range": [min(ratio), max(ratio)],
                    "memory_ratio": statistics.median(mratio), "memory_ratio_range": [min(mratio), max(mratio)],
                    **{k: first[k] for k in ("trainable_params", "anchors", "accumulate", "precision")}}
    return out


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"# Training cost at equal anchors and equal steps ({res['steps']} optimizer steps per run, "
             f"{res['repeats']} interleaved repeats, {res['threads']} thread(s); load {res['load_start']:.2f} → "
             f"{res['load_end']:.2f})", "",
             f"CPU {m['cpu']} ({m['cores']} cores; flags: {', '.join(m['cpu_flags']) or 'none'}); torch "
             f"{res['torch']}. Command: `{res['command']}`", "",
             "| arm | anchors | batch × accumulation | precision | trainable parameters | s / optimizer step "
             "(median [range]) | × RNN head [range] | peak RSS MiB (median) | × RNN head [range] |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for arm, s in res["arms"].items():
        rng = s["seconds_per_step_range"]
        lines.append(f"| {arm} | {s['anchors']} | 1 × {s['accumulate']} | {s['precision']} | "
                     f"{s['trainable_params']:,} | {s['seconds_per_step']:.2f} [{rng[0]:.2f}, {rng[1]:.2f}] | "
                     f"{s['time_ratio']:.2f}× [{s['time_ratio_range'][0]:.2f}, {s['time_ratio_range'][1]:.2f}] | "
                     f"{s['peak_memory_mb']:,.0f} | {s['memory_ratio']:.2f}× [{s['memory_ratio_range'][0]:.2f}, "
                     f"{s['memory_ratio_range'][1]:.2f}] |")
    lines += ["", "Ratios are paired within a repeat (the arms run back to back), median and range over repeats. "
              "The load average (1 min) is read before the first run and after the last; the runs themselves put "
              "about their threads on it. Peak RSS is the training process's whole resident peak (the target, the "
              "data, the module); "
              "DeLS-Spec Table 5 reports GPU memory at Qwen3 scale, where the target's activations dominate."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    arms = args.arms.split(",")
    bad = [a for a in arms if a not in ARMS] or ([] if len(set(arms)) == len(arms) else ["an arm repeated"])
    if bad or "dels_rnn" not in arms:
        ap.error(f"--arms {args.arms!r}: {bad or 'dels_rnn missing'}; choose each at most once from "
                 f"{', '.join(ARMS)} (dels_rnn included: the ratios are to it)")
    if args.steps < 1 or args.repeats < 1:
        ap.error(f"--steps {args.steps} / --repeats {args.repeats}: both must be at least 1")
    import torch
    from tqdm import tqdm

    from specexp import machine
    from specexp.paths import cache_root

    shared = cache_root(os.environ.get("SPECEXP_CACHE", "~/.cache/specexp")) / "stages"
    load_start, rounds = os.getloadavg()[0], []
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train_cost-") as tmp, \
            tqdm(total=args.repeats * len(arms), desc="training runs", unit="run") as bar:
        for r in range(args.repeats):
            done = {}
            for arm in arms:
                try:
                    done[arm] = run_arm(arm, args.steps, args.threads, shared, Path(tmp) / f"{r}-{arm}")
                except RuntimeError as e:       # keep what finished; the complete outputs stay as they were
                    (args.out / "train_cost.partial.json").write_text(json.dumps({"rounds": rounds}, indent=1))
                    sys.exit(f"{e}\n({len(rounds)} finished repeat(s) in {args.out / 'train_cost.partial.json'})")
                bar.update()
            rounds.append(done)
    res = {"steps": args.steps, "repeats": args.repeats, "threads": args.threads, "load_start": load_start,
           "load_end": os.getloadavg()[0], "machine": machine.describe(torch.device("cpu")), "torch": torch.__version__,
           "command": "python experiments/train_cost.py " + " ".join(sys.argv[1:]), "arms": summarize(rounds),
           "runs": rounds}
    (args.out / "train_cost.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "train_cost.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
