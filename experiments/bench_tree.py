"""What the tree path of the engine costs: the same drafts verified as a chain and as a chain-shaped tree.

For each prompt, the committed mini DFlash drafter (or `--drafter`) decodes greedily twice, interleaved, with
identical drafts: once as the chain it is, once wrapped so that every proposal carries `parents = [-1, 0, 1, ...]`
(the tree path: host-built layout, 4D ancestor mask, depth positions, the tree walk and KV compaction instead of
a crop). Outputs and accept lengths must be equal (they are checked); the difference of the per-round wall time
is the tree machinery's overhead. `--baseline SRC` also times the chain through another checkout's engine (e.g.
`git worktree add /tmp/pre-tree a725a95` and `--baseline /tmp/pre-tree/src`, the engine before trees existed),
in a subprocess, to show the chain path kept its speed.

    python experiments/bench_tree.py --num-samples 2 --max-new-tokens 96
    python experiments/bench_tree.py --baseline /tmp/pre-tree/src --out experiments/results/tree_overhead

CPU wall clock: compare within a run (the variants alternate prompt by prompt), and mark figures taken on a busy
machine as such.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402


class AsTree:
    """The wrapped drafter's chains, proposed as chain-shaped trees."""

    proposes_trees = True

    def __init__(self, drafter):
        self.d = drafter

    def __getattr__(self, name):
        return getattr(self.d, name)

    def propose(self, anchor, start, k, sampling):
        p = self.d.propose(anchor, start, k, sampling)
        p.parents = torch.arange(p.tokens.numel(), device=p.tokens.device) - 1
        return p

    def commit(self, n, taps, path=None):
        self.d.commit(n, taps)


def setup(args):
    from hydra import compose, initialize_config_dir

    from specexp import benchmarks, registry
    from specexp.decoding.settings import decode_config
    from specexp.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"target={args.target}", f"drafter={args.drafter}", "device=cpu",
                                 f"eval.max_new_tokens={args.max_new_tokens}"])
    target = registry.build_target(cfg.target, torch.device("cpu"))
    drafter = registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, target.name), target)
    samples = benchmarks.load(args.benchmarks, args.num_samples, cfg.eval.shuffle_seed)
    prompts = [target.encode_chat([{"role": "user", "content": s.turns[0]}]) for s in samples]
    return target, drafter, prompts, decode_config(cfg.decoding, cfg.eval, target)


def timed(target, drafter, ids, dc):
    from specexp.decoding.engine import generate

    t0 = time.perf_counter()
    g = generate(target, drafter, ids, dc)
    return time.perf_counter() - t0, g


def chain_only(args) -> dict:
    """The chain, timed through whatever `specexp` is importable (the --baseline checkout in the subprocess)."""
    target, drafter, prompts, dc = setup(args)
    timed(target, drafter, prompts[0], dc.__class__(dc.protocol, 0.0, 8, dc.stop_token_ids))            # warm-up
    out = {"seconds": 0.0, "rounds": 0, "tokens": []}
    for ids in prompts:
        s, g = timed(target, drafter, ids, dc)
        out["seconds"] += s
        out["rounds"] += len(g.accept_lengths)
        out["tokens"].append(g.tokens)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--drafter", default="dflash")
    ap.add_argument("--benchmarks", nargs="*", default=["gsm8k", "humaneval", "mt_bench"])
    ap.add_argument("--num-samples", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--baseline", type=Path, help="another checkout's src/ whose engine times the chain too")
    ap.add_argument("--chain-only", action="store_true", help=argparse.SUPPRESS)     # the baseline subprocess
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.chain_only:
        print(json.dumps(chain_only(args)))
        return

    target, drafter, prompts, dc = setup(args)
    timed(target, drafter, prompts[0], dc.__class__(dc.protocol, 0.0, 8, dc.stop_token_ids))            # warm-up
    tree = AsTree(drafter)
    r = {"chain_s": 0.0, "tree_s": 0.0, "rounds": 0, "equal": 0, "prompts": len(prompts),
         "load_start": os.getloadavg()[0]}
    tokens = []
    for ids in prompts:
        sc, gc = timed(target, drafter, ids, dc)
        st, gt = timed(target, tree, ids, dc)
        r["chain_s"] += sc
        r["tree_s"] += st
        r["rounds"] += len(gc.accept_lengths)
        r["equal"] += gc.tokens == gt.tokens and gc.accept_lengths == gt.accept_lengths
        tokens.append(gc.tokens)
    r["load_end"] = os.getloadavg()[0]
    if args.baseline:
        cmd = [sys.executable, __file__, "--chain-only", "--target", args.target, "--drafter", args.drafter,
               "--num-samples", str(args.num_samples), "--max-new-tokens", str(args.max_new_tokens),
               "--threads", str(args.threads), "--benchmarks", *args.benchmarks]
        env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
        base = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                          .strip().splitlines()[-1])
        r["baseline_s"], r["baseline_equal"] = base["seconds"], base["tokens"] == tokens
    ms = {k: 1000 * r[k] / r["rounds"] for k in ("chain_s", "tree_s", "baseline_s") if k in r}
    lines = [f"# Tree-path overhead ({args.drafter} on {args.target}, greedy, {args.max_new_tokens} new tokens, "
             f"{len(prompts)} prompts, {args.threads} thread(s); load {r['load_start']:.1f} → {r['load_end']:.1f})",
             "", "| variant | total | per round | vs chain |", "|---|---:|---:|---:|"]
    for k, label in (("baseline_s", f"chain, engine of {args.baseline}"), ("chain_s", "chain (this engine)"),
                     ("tree_s", "the same drafts as a chain-shaped tree")):
        if k in r:
            lines.append(f"| {label} | {r[k]:.1f} s | {ms[k]:.1f} ms | {r[k] / r['chain_s']:.3f}× |")
    lines += ["", f"{r['rounds']} rounds; chain and tree equal (tokens and accept lengths) on {r['equal']} / "
              f"{len(prompts)} prompts" + (f"; baseline tokens equal: {r['baseline_equal']}" if args.baseline else "")]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.md").write_text(md)
        (args.out / "bench.json").write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
