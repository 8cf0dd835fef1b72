"""Replay vs online speculative decoding on the same prompts: agreement of the accept lengths and the cost.

For each drafter, every turn of the selected prompts is run twice from the same cached greedy reference:
  online  the engine (`decoding.engine.generate`), greedy, no AR baseline (as `eval.run_ar=false`)
  replay  `eval.replay`: one teacher-forced target pass (timed apart: it is cached on disk and shared by every
          drafter reading the same taps) + the drafter's rounds (propose / commit timed apart)
  batched the same replay through the drafter's `propose_all` (every built-in drafter has one), its time split
          into the backbone's context K/V and block passes, the vocabulary projections and the rest
and the per-turn accept lengths are compared; a difference is "explained" when replay flagged a near-tie round
at or before the first differing round. Per-round info (DEdit: passes, pre-edit and final drafts) is compared
too. Prints markdown tables and writes them (and the raw numbers) to --out.

    python experiments/bench_replay.py --drafters dflash dels_rnn dels_markov --num-samples 1 --max-new-tokens 64
    python experiments/bench_replay.py --benchmarks gsm8k mt_bench --num-samples 3 --out experiments/results/replay_mini
    python experiments/bench_replay.py --drafters domino_ft dedit --drafter-override domino_ft:drafter.head.init=random

Wall times are CPU wall clock on whatever the machine runs besides; compare ratios, not absolute values.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from specexp import benchmarks, registry  # noqa: E402
from specexp.config import ReplayConfig  # noqa: E402
from specexp.decoding.engine import generate  # noqa: E402
from specexp.decoding.settings import decode_config  # noqa: E402
from specexp.eval.references import turns_with_prompts  # noqa: E402
from specexp.eval.replay import build_references, replay_turn, teacher_forced  # noqa: E402
from specexp.paths import CONF_DIR  # noqa: E402


class Timed:
    """The drafter with its propose and commit calls timed (everything else passes through)."""

    def __init__(self, drafter):
        self.d, self.t = drafter, {"propose": 0.0, "commit": 0.0, "prefill": 0.0}

    def __getattr__(self, name):
        return getattr(self.d, name)

    def _timed(self, name, *a):
        t0 = time.perf_counter()
        out = getattr(self.d, name)(*a)
        self.t[name] += time.perf_counter() - t0
        return out

    def reset(self):
        self.d.reset()

    def prefill(self, taps):
        return self._timed("prefill", taps)

    def propose(self, *a):
        return self._timed("propose", *a)

    def commit(self, *a):
        return self._timed("commit", *a)


class Parts:
    """Times the parts of a batched replay (`with Parts(drafter) as parts: ...`, then `parts.t`): propose_all, and
    inside it the backbone's context K/V and block passes and the vocabulary projection (the backbone's lm_head,
    the target's, wrapped on the drafter side only). Instance attributes shadow the methods and are removed after."""

    def __init__(self, drafter):
        bb = getattr(drafter, "backbone", drafter)                  # DFlash is its own backbone
        self.spots = [(drafter, "propose_all"), (bb, "context"), (bb, "blocks"), (bb, "lm_head")]
        self.t = {name: 0.0 for _, name in self.spots}

    def _wrap(self, name, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            self.t[name] += time.perf_counter() - t0
            return out
        return timed

    def __enter__(self):
        self.saved = [vars(obj).get(name) for obj, name in self.spots]     # None: a method of the class
        for obj, name in self.spots:
            setattr(obj, name, self._wrap(name, getattr(obj, name)))
        return self

    def __exit__(self, *exc):
        for (obj, name), old in zip(self.spots, self.saved):
            delattr(obj, name) if old is None else setattr(obj, name, old)


def round_info(gen, verified: bool = False) -> list[tuple]:
    """What each round's proposal said about itself (DEdit: passes, pre-edit draft) and its drafts; `verified` adds
    what verification made of them (online verification may accept past the final stop token, replay cannot)."""
    skip = () if verified else ("accepted", "bonus")
    return [tuple((k, v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in sorted(r.items()) if k not in skip)
            for r in gen.rounds]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--drafters", nargs="+", default=["dflash", "dels_rnn", "dels_markov"])
    ap.add_argument("--benchmarks", nargs="+", default=None, help="default: all eight")
    ap.add_argument("--num-samples", type=int, default=1, help="per benchmark")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="a directory for bench.md and bench.json")
    ap.add_argument("--override", nargs="*", default=[], help="extra config overrides (key=value)")
    ap.add_argument("--drafter-override", nargs="*", default=[], metavar="NAME:KEY=VALUE",
                    help="an override for one drafter only, e.g. domino_ft:drafter.head.init=random")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"target={args.target}", "task=replay", "device=cpu", "eval.progress=false",
                                 f"eval.num_samples={args.num_samples}", f"eval.max_new_tokens={args.max_new_tokens}",
                                 *args.override])
    names = args.benchmarks or list(cfg.benchmark.names)
    samples = benchmarks.load(names, args.num_samples, cfg.eval.shuffle_seed)
    target = registry.build_target(cfg.target, torch.device("cpu"))
    dc = decode_config(cfg.decoding, cfg.eval, target)
    refs = build_references(cfg, target, samples, dc, ReplayConfig.from_cfg(cfg.replay))
    turns = [(s, t, ids, ref) for s in samples for t, ids, ref in turns_with_prompts(target, s, refs.get(s))]

    rows = []
    for name in args.drafters:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            own = [o.split(":", 1)[1] for o in args.drafter_override if o.split(":", 1)[0] == name]
            dcfg = compose("config", [f"target={args.target}", f"drafter={name}", *args.override, *own]).drafter
        drafter = Timed(registry.build_drafter(registry.fill_default_checkpoints(dcfg, target.name), target))
        generate(target, drafter.d, turns[0][2], dc.__class__(dc.protocol, 0.0, 8, dc.stop_token_ids))   # warm-up
        r = {"drafter": name, "overrides": own, "turns": len(turns), "equal": 0, "differ": 0, "explained": 0,
             "rounds": 0, "near_tie_rounds": 0, "online_s": 0.0, "tf_s": 0.0, "replay_s": 0.0, "tau_online": [],
             "tau_replay": [], "round_info_equal": 0, "load_start": os.getloadavg()[0]}
        on = Timed(drafter.d)                             # the online run's own propose time: replay's floor
        for s, t, ids, ref in turns:
            t0 = time.perf_counter()
            online = generate(target, on, ids, dc)
            r["online_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            tf = teacher_forced(target, ids, ref, drafter.tap_layers)
            r["tf_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            gen, ties = replay_turn(drafter, ids, ref, tf, dc, cfg.replay.near_tie, batched=False)
            r["replay_s"] += time.perf_counter() - t0
            r["round_info_equal"] += round_info(online) == round_info(gen)
            if hasattr(drafter.d, "propose_all"):          # the batched path too, where the drafter has it
                with Parts(drafter.d) as parts:
                    t0 = time.perf_counter()
                    fast, _ = replay_turn(drafter.d, ids, ref, tf, dc, cfg.replay.near_tie, batched=True)
                    r["batched_s"] = r.get("batched_s", 0.0) + time.perf_counter() - t0
                for k, v in parts.t.items():
                    r[f"batched_{k}_s"] = r.get(f"batched_{k}_s", 0.0) + v
                same = fast.accept_lengths == gen.accept_lengths and round_info(fast, True) == round_info(gen, True)
                r["batched_equal"] = r.get("batched_equal", 0) + same
            r["rounds"] += len(gen.accept_lengths)
            r["near_tie_rounds"] += len(ties)
            r["tau_online"] += online.accept_lengths
            r["tau_replay"] += gen.accept_lengths
            if online.accept_lengths == gen.accept_lengths and online.tokens == ref:
                r["equal"] += 1
            else:
                r["differ"] += 1
                i = first_difference(online.accept_lengths, gen.accept_lengths)
                r["explained"] += bool(ties) and (i is None or min(ties) <= i)
                print(f"  {name} {s.benchmark}/{s.id} turn {t}: differs at round {i}; near-tie rounds {ties}; "
                      f"online output == reference: {online.tokens == ref}", flush=True)
        r |= {f"{k}_s": v for k, v in drafter.t.items()} | {"online_propose_s": on.t["propose"],
                                                              "load_end": os.getloadavg()[0]}
        r["tau_online"] = sum(r["tau_online"]) / max(len(r["tau_online"]), 1)
        r["tau_replay"] = sum(r["tau_replay"]) / max(len(r["tau_replay"]), 1)
        rows.append(r)
        print(json.dumps(r), flush=True)
        report(rows, target, samples, turns, args)           # after every drafter: a long run keeps what it has


def report(rows, target, samples, turns, args) -> None:
    head = (f"Replay vs online on {target.name}, {len(samples)} prompts ({len(turns)} turns), "
            f"{args.max_new_tokens} new tokens, greedy, {args.threads} CPU thread(s). τ here = tokens per round "
            f"pooled over all rounds. Ratio = online wall time / replay wall time; 'cached' excludes the "
            f"teacher-forced pass (on disk, shared by drafters with the same taps). Machine load (1-minute "
            f"average, {os.cpu_count()} CPUs) per drafter, start → end: "
            + ", ".join(f"{r['drafter']} {r['load_start']:.1f} → {r['load_end']:.1f}" for r in rows) + ".\n\n")
    lines = ["| drafter | turns | equal | differ | explained by near-tie | τ online | τ replay | online s | "
             "TF pass s | replay s (propose + commit) | ratio cached | ratio with TF | batched replay s "
             "(turns equal to the loop) | batched ratio cached | batched ratio with TF |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['drafter']} | {r['turns']} | {r['equal']} | {r['differ']} | {r['explained']} | "
                     f"{r['tau_online']:.3f} | {r['tau_replay']:.3f} | {r['online_s']:.1f} | {r['tf_s']:.1f} | "
                     f"{r['replay_s']:.1f} ({r['propose_s']:.1f} + {r['commit_s']:.1f}) | "
                     f"{r['online_s'] / r['replay_s']:.1f}× | {r['online_s'] / (r['replay_s'] + r['tf_s']):.1f}× | "
                     + (f"{r['batched_s']:.1f} ({r['batched_equal']}) | "
                        f"{r['online_s'] / r['batched_s']:.1f}× | "
                        f"{r['online_s'] / (r['batched_s'] + r['tf_s']):.1f}× |"
                        if "batched_s" in r else "– | – | – |"))
    lines += ["", "Where the batched replay's time goes (seconds, all turns): `propose_all` = the backbone's context "
              "K/V (one pass over the turn's taps) + its batched block passes + the vocabulary projections (lm_head) + "
              "the rest (fusion, loop states, DEdit's softmaxes and edit rules, bookkeeping); walk = the rounds' "
              "comparison with the reference. Round info equal: turns whose per-round proposal info (DEdit: passes, "
              "pre-edit and final drafts) equals online (replay loop vs engine). Online propose: the drafter's own "
              "work inside the online runs (the rest is the target's verification passes).", "",
              "| drafter | online s | online propose s | batched s | propose_all | context K/V | block passes | "
              "lm_head | rest | walk | round info equal |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "batched_s" not in r:
            continue
        pa = r["batched_propose_all_s"]
        rest = pa - r["batched_context_s"] - r["batched_blocks_s"] - r["batched_lm_head_s"]
        lines.append(f"| {r['drafter']} | {r['online_s']:.1f} | {r['online_propose_s']:.1f} | "
                     f"{r['batched_s']:.1f} | {pa:.1f} | {r['batched_context_s']:.1f} | "
                     f"{r['batched_blocks_s']:.1f} | {r['batched_lm_head_s']:.1f} | {rest:.1f} | "
                     f"{r['batched_s'] - pa:.1f} | {r['round_info_equal']} / {r['turns']} |")
    text = head + "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.md").write_text(text)
        (args.out / "bench.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
