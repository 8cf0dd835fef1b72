"""What one round's parts cost on this machine as the number of rows grows: the target's pass over T rows (T = 1 is
an AR step, T = k + 1 verifies k drafts) after a context of `--context` cached tokens, the drafter's pass that
proposes k drafts, and the target's linear layers alone (cache-resident weights, the model's own shapes).

On a GPU the target's pass costs about the same for 1 row as for 16; a CPU's does not, and this is where the mini
setting's break-even τ comes from: (draft + verify) / AR step, in AR steps, is the τ a drafter must reach to run at
AR speed. Medians of `--reps` timings each.

    python experiments/bench_verify_rows.py --threads 2 --out experiments/results/draft_cap

CPU wall clock: run it on an otherwise idle machine; the load average before and after is recorded.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import engine_measure  # noqa: E402  (a sibling module: experiments/ is on the path of a script run from it)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def median_ms(f, reps: int) -> float:
    return engine_measure.median_ms(f, reps, warmup=3)


def main() -> None:
    from hydra import compose, initialize_config_dir

    from specexp import registry
    from specexp.paths import CONF_DIR

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--drafter", default="dflash")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--max-rows", type=int, default=9)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("overrides", nargs="*", help="further config overrides (e.g. drafter.checkpoint=DIR)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"target={args.target}", f"drafter={args.drafter}", "device=cpu", *args.overrides])
    target = registry.build_target(cfg.target, torch.device("cpu"))
    drafter = registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, target.name), target)
    taps = drafter.tap_layers
    load_start = os.getloadavg()[0]

    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, target.vocab_size, (1, args.context), generator=g)                   # [1, C]
    cache = target.new_cache()
    rows = []
    with torch.inference_mode():
        _, hidden = target.forward(ctx, 0, cache, taps=taps)                                     # [1, C, n*H]
        drafter.reset()
        drafter.prefill(hidden)

        def verify(block):
            target.forward(block, args.context, cache, taps=taps)
            target.rollback(cache, block.shape[1])

        for t in range(1, args.max_rows + 1):
            block = torch.randint(100, target.vocab_size, (1, t), generator=g)                   # [1, T]
            k = t - 1
            rows.append({"rows": t, "verify_ms": median_ms(lambda: verify(block), args.reps),
                         "draft_ms": median_ms(lambda: drafter.propose(5, args.context, k, None), args.reps)
                         if 0 < k <= drafter.max_drafts else None})
        c = target.config
        shapes = {"q/o proj": (c.hidden_size, c.hidden_size),
                  "mlp up/gate": (c.intermediate_size, c.hidden_size),
                  "mlp down": (c.hidden_size, c.intermediate_size),
                  "lm_head": (target.vocab_size, c.hidden_size)}
        linear = {}
        for name, (n, kk) in shapes.items():
            w = torch.randn(n, kk, generator=g)
            linear[name] = [median_ms(lambda: F.linear(torch.randn(m, kk), w), 2 * args.reps)
                            for m in range(1, args.max_rows + 1)]
    load_end = os.getloadavg()[0]

    ar = rows[0]["verify_ms"]
    lines = [f"# Round parts by rows ({args.drafter} on {args.target}, context {args.context}, {args.threads} "
             f"thread(s); load {load_start:.1f} → {load_end:.1f})", "",
             "| rows T | drafts k = T − 1 | target pass ms | in AR steps | drafter pass ms (k drafts) | "
             "round in AR steps |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = r["draft_ms"]
        rnd = f"{(r['verify_ms'] + d) / ar:.2f}" if d is not None else "–"
        lines.append(f"| {r['rows']} | {r['rows'] - 1} | {r['verify_ms']:.1f} | {r['verify_ms'] / ar:.2f} | "
                     f"{f'{d:.1f}' if d is not None else '–'} | {rnd} |")
    lines += ["", "The target's linear layers alone (F.linear, weights cache-resident except lm_head), ms by rows M:",
              "", "| layer [out × in] | " + " | ".join(f"M={m}" for m in range(1, args.max_rows + 1)) + " |",
              "|---|" + "---:|" * args.max_rows]
    for name, ms in linear.items():
        n, kk = shapes[name]
        lines.append(f"| {name} [{n} × {kk}] | " + " | ".join(f"{v:.3f}" for v in ms) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "verify_rows.md").write_text(md)
        (args.out / "verify_rows.json").write_text(json.dumps(
            {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "load": [load_start, load_end], "rows": rows, "linear_ms": linear}, indent=1))


if __name__ == "__main__":
    main()
