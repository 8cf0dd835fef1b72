"""The mini data-scaling curve: τ of b8 DFlash drafters trained on growing nested subsets of SmolLM2's own greedy
answers, per benchmark family (math / code / chat) and macro, with 95% bootstrap CIs from replay.

Each point is a directory holding the training card (`card.json`, as `task=train` writes it) and a replay run of
that drafter on the fixed reference set (`replay/`: summary.json + samples.jsonl.gz). To rebuild the committed
points (experiments/results/data_scaling/; about 3.5 h of training, busy, on one core of a CPU with AVX512-BF16):

    for n in 50000 100000 200000 null; do
      python -m specexp experiment=mini_dflash_scale train.data_tokens=$n hydra.run.dir=runs/scale/train-$n
      python -m specexp task=replay drafter=dflash drafter.checkpoint=runs/scale/train-$n/checkpoint \\
          eval.num_samples=50 eval.max_new_tokens=128 hydra.run.dir=runs/scale/replay-$n \\
          replay.references=experiments/results/replay_mini/references-smollm2_135m-128tok-50.json.gz
    done
    # the fifth point: every answer of data=mini_regen_xl (1.00M response tokens after the length filter; 53 min
    # of target taps, then 131 min of training with 2 threads, busy), then its replay as above with tag xl
    python -m specexp experiment=mini_dflash_scale data=mini_regen_xl cpu_threads=2 hydra.run.dir=runs/scale/train-xl
    python experiments/data_scaling.py --collect runs/scale --out experiments/results/data_scaling
    python experiments/data_scaling.py experiments/results/data_scaling/points/* --out experiments/results/data_scaling

Writes `scaling.md` (per point: training tokens, steps, τ per benchmark, per family and macro with CIs; the local
slope of every segment, τ gained per 10× data between neighbouring points with a paired-bootstrap CI, and the data
mix each segment spans; where the last segment's slope would cross the goals GSM8K 2.0 / macro 1.6) and
`scaling.png`. The curve bends (the gain per decade falls as data grows), so a single line of τ on log10(tokens)
through every point is misspecified (its residuals run −, +, ..., +, −) and is not fitted; only local slopes are
reported. Family τ is the unweighted mean of its
benchmarks' τ, its CI from the same bootstrap as the macro (`specexp.eval.metrics.tau_ci95` on the family's
benchmarks). τ includes the bonus token. Never imported by the library.
"""
import argparse
import gzip
import json
import re
import shutil
from pathlib import Path

from specexp import benchmarks
from specexp.eval.compare import load_records
from specexp.eval.metrics import paired_replicates, percentiles95, tau_ci95
from specexp.report.plots import scaling_curve

REPLAY_FILES = ("summary.json", "summary.md", "config.yaml", "run.json")


def collect(src: Path, out: Path) -> None:
    """Copy each `train-N` card and `replay-N` run under `src` into `out/points/N/` (samples gzipped)."""
    for train in sorted(t for t in src.glob("train-*") if t.is_dir()):       # not the train-N.log files
        tag = train.name.split("-", 1)[1]
        replay = src / f"replay-{tag}"
        if not (train / "train_summary.json").exists() or not (replay / "summary.json").exists():
            print(f"skip {tag}: no training card or replay summary yet")
            continue
        dst = out / "points" / tag
        (dst / "replay").mkdir(parents=True, exist_ok=True)
        shutil.copy2(train / "train_summary.json", dst / "card.json")
        for name in REPLAY_FILES:
            if (replay / name).exists():
                shutil.copy2(replay / name, dst / "replay" / name)
        load_records(replay)                # checked by the store's one reader before it is copied
        with open(replay / "samples.jsonl", "rb") as f, \
                gzip.GzipFile(dst / "replay" / "samples.jsonl.gz", "wb", mtime=0) as g:     # mtime 0: reproducible
            shutil.copyfileobj(f, g)
        print(f"collected {tag} -> {dst}")


def point(d: Path) -> dict:
    card = json.loads((d / "card.json").read_text())
    summary = json.loads((d / "replay" / "summary.json").read_text())
    by_bench: dict[str, list[dict]] = {}
    for r in load_records(d / "replay"):
        by_bench.setdefault(r["benchmark"], []).append(r)
    fams = {}
    for fam, names in benchmarks.families().items():
        sub = {b: by_bench[b] for b in names if b in by_bench}
        taus = [summary["benchmarks"][b]["tau"] for b in sub]
        fams[fam] = (sum(taus) / len(taus), tau_ci95(sub)[1]) if taus else (None, None)
    data = re.search(r"(?:^|\s)data=(\S+)", card.get("command", ""))       # the experiment's own default otherwise
    return {"dir": d, "tokens": card["response_tokens"], "sequences": card["sequences"], "steps": card["steps"],
            "data": data.group(1) if data else "mini_regen",
            "epochs": card["train"]["epochs"], "seconds": card["train_seconds"], "summary": summary, "families": fams,
            "records": by_bench}


def ci(c) -> str:
    return "–" if not c else f"[{c[0]:.3f}, {c[1]:.3f}]"


def table(points: list[dict]) -> str:
    names = list(points[0]["summary"]["benchmarks"])
    fams = list(points[0]["families"])
    s0 = points[0]["summary"]
    n = {b: s0["benchmarks"][b]["num_samples"] for b in names}
    rows = ["# Mini data scaling: b8 DFlash on SmolLM2-135M-Instruct, τ by replay with 95% CIs", "",
            f"Greedy, {s0['max_new_tokens']} new tokens; prompts per benchmark: "
            + ", ".join(f"{b} {k}" for b, k in n.items())
            + ". Each point trains the same recipe (`conf/experiment/mini_dflash_scale.yaml`) on a nested random "
              "subset of the data config's answers or all of them (`data=mini_regen_xl` holds every `data=mini_regen` "
              "answer plus more GSM8K-train and ShareGPT ones, so its mix differs); families: "
            + "; ".join(f"{f} = {', '.join(v)}" for f, v in benchmarks.families().items()) + ".", "",
            "| response tokens | data | sequences | epochs | steps | train time | " + " | ".join(fams) + " | macro |",
            "|---:|---|---:|---:|---:|---:|" + "---:|" * (len(fams) + 1)]
    for p in points:
        m = p["summary"]["macro"]
        rows.append(f"| {p['tokens']:,} | {p['data']} | {p['sequences']:,} | {p['epochs']} | {p['steps']:,} | "
                    f"{p['seconds']:.0f} s | "
                    + " | ".join(f"{p['families'][f][0]:.3f} {ci(p['families'][f][1])}" for f in fams)
                    + f" | **{m['tau']:.3f}** {ci(m.get('tau_ci95'))} |")
    rows += ["", "Per benchmark:", "", "| response tokens | " + " | ".join(names) + " |",
             "|---:|" + "---:|" * len(names)]
    for p in points:
        b = p["summary"]["benchmarks"]
        rows.append(f"| {p['tokens']:,} | " + " | ".join(f"{b[x]['tau']:.3f} {ci(b[x].get('tau_ci95'))}"
                                                        for x in names) + " |")
    return "\n".join(rows) + "\n"


GOALS = (("gsm8k", 2.0), ("macro", 1.6))   # issue goals for the committed backbone (replay, 128 tokens)


def crossing(points: list[dict], key: str, goal: float, draws: int = 2000, seed: int = 0) -> dict | None:
    """Where a least-squares line tau = a + b log10(tokens) through the points crosses `goal`: the slope per
    decade and the crossing size, with a 95% interval from refitting on draws of each point's tau from a normal
    whose sd is its CI's width / 3.92 (a parametric bootstrap). An extrapolation of a fit, not a measurement; None
    with fewer than 2 points."""
    import numpy as np

    def tau_ci(p):
        if key == "macro":
            m = p["summary"]["macro"]
            return m["tau"], m.get("tau_ci95")
        b = p["summary"]["benchmarks"][key]
        return b["tau"], b.get("tau_ci95")

    if len(points) < 2:
        return None
    x = np.log10([p["tokens"] for p in points])
    y, sd = zip(*((t, (c[1] - c[0]) / 3.92 if c else 0.0) for t, c in map(tau_ci, points)))
    y, sd = np.array(y), np.array(sd)
    b, a = np.polyfit(x, y, 1)

    def cross(a_, b_):
        e = (goal - a_) / b_ if b_ > 0 else float("inf")
        return float(10 ** e) if e < 300 else float("inf")           # a slope near 0: past any data size

    rng = np.random.default_rng(seed)
    sims = [cross(*np.polyfit(x, y + rng.normal(0.0, sd), 1)[::-1]) for _ in range(draws)]
    lo, hi = np.percentile(sims, [2.5, 97.5], method="nearest")     # no interpolation: sims may be inf
    return {"slope": float(b), "tokens": cross(a, b), "ci": (float(lo), float(hi)), "reached": bool(y[-1] >= goal)}


def residual_signs(points: list[dict], key: str = "macro") -> str:
    """Signs of the residuals of one least-squares line of τ on log10(tokens) through every point: runs of one
    sign (−, +, +, +, −) say the line is the wrong shape, which is why it is not used."""
    import numpy as np

    x = np.log10([p["tokens"] for p in points])
    y = np.array([p["summary"]["macro"]["tau"] if key == "macro" else p["summary"]["benchmarks"][key]["tau"]
                  for p in points])
    b, a = np.polyfit(x, y, 1)
    return ", ".join("0" if abs(r) < 1e-9 else "+" if r > 0 else "−" for r in y - (a + b * x))   # 0: on the line


def crossings_md(points: list[dict]) -> str:
    """Where the goals would be crossed at the local slope of the last segment (an extrapolation: on a curve whose
    gain per decade keeps falling it is the earliest the goal could be reached, a lower bound on the data needed)."""
    if len(points) < 3:
        return ""
    mix = (f" (the data mix changes in it: `{points[-2]['data']}` → `{points[-1]['data']}`)"
           if points[-2]["data"] != points[-1]["data"] else "")
    rows = ["", "Where the goal would be reached at the last segment's local slope" + mix + ". An extrapolation, not "
            "a measurement; if the gain per 10× data keeps falling, it is the earliest the goal could be reached. "
            "Its 95% interval refits on draws of each point within its CI. A line through all "
            f"{len(points)} points is not used: its residuals run {residual_signs(points)} (macro), "
            f"{residual_signs(points, 'gsm8k')} (GSM8K), the signature of a curve that bends:", "",
            "| series | goal | fit through | τ gain per 10× data | crosses at (response tokens) | 95% interval |",
            "|---|---:|---|---:|---:|---:|"]
    fmt = lambda t: "never (no gain)" if t == float("inf") else f"{t:,.3g}"  # noqa: E731
    for key, goal in GOALS:
        c = crossing(points[-2:], key, goal)
        reached = " (reached)" if c["reached"] else ""
        rows.append(f"| {key} | {goal} | the last 2 points | {c['slope']:+.3f} | {fmt(c['tokens'])}{reached} | "
                    f"[{fmt(c['ci'][0])}, {fmt(c['ci'][1])}] |")
    return "\n".join(rows) + "\n"


def segment_slope(lo: dict, hi: dict, names: list[str]) -> tuple[float, list[float]]:
    """τ gained per 10× data between two points, over the benchmarks `names` (their unweighted mean), with the
    paired-bootstrap 95% CI of Δτ (the same prompts resampled for both drafters) divided by the decades apart."""
    import math

    import torch

    per = paired_replicates({n: hi["records"][n] for n in names}, {n: lo["records"][n] for n in names})
    delta = sum(per[n][0]["delta"] for n in names) / len(names)
    reps = torch.stack([per[n][1] for n in names]).mean(0)
    decades = math.log10(hi["tokens"] / lo["tokens"])
    ci = percentiles95(reps)
    return delta / decades, [ci[0] / decades, ci[1] / decades]


def slopes_md(points: list[dict]) -> str:
    """The local slope of every segment, per family, GSM8K and macro, and the data mix it spans: a slope comparison
    needs no model of the curve's shape."""
    names = list(points[0]["records"])
    series = {**{f: [n for n in ns if n in names] for f, ns in benchmarks.families().items()},
              "gsm8k": ["gsm8k"] if "gsm8k" in names else [], "macro": names}
    series = {k: v for k, v in series.items() if v}
    rows = ["", "Local slopes: τ gained per 10× data between neighbouring points (paired on the same prompts, 95% "
            "bootstrap CI). Every point trains 2 epochs, so data and steps grow together:", "",
            "| segment (response tokens) | data mix | " + " | ".join(series) + " |",
            "|---|---|" + "---:|" * len(series)]
    for lo, hi in zip(points, points[1:]):
        mix = f"`{lo['data']}`" if lo["data"] == hi["data"] else f"`{lo['data']}` → `{hi['data']}` (changes)"
        cells = []
        for names_ in series.values():
            s, ci = segment_slope(lo, hi, names_)
            cells.append(f"{s:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]")
        rows.append(f"| {lo['tokens']:,} → {hi['tokens']:,} | {mix} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("points", nargs="*", type=Path, help="point directories (card.json + replay/)")
    ap.add_argument("--collect", type=Path, help="copy runs/scale/{train,replay}-N into OUT/points/N first")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.collect:
        collect(a.collect, a.out)
        if not a.points:
            return
    pts = sorted((point(d) for d in a.points), key=lambda p: p["tokens"])
    a.out.mkdir(parents=True, exist_ok=True)
    md = table(pts) + (slopes_md(pts) if len(pts) > 1 else "") + crossings_md(pts)
    (a.out / "scaling.md").write_text(md)
    series = {f: [(p["tokens"], *p["families"][f]) for p in pts] for f in pts[0]["families"]}
    series["macro"] = [(p["tokens"], p["summary"]["macro"]["tau"], p["summary"]["macro"].get("tau_ci95"))
                       for p in pts]
    scaling_curve(series, a.out / "scaling.png", "training response tokens (log scale)",
                  "b8 DFlash on SmolLM2-135M: τ vs data (replay, 95% CI)")
    print(md)


if __name__ == "__main__":
    main()
