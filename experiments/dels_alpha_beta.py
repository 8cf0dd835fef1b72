"""DeLS-Spec paper Figure 2: τ over the α/β grid of a sweep, as three panels (PNG) and a markdown table.
Reads DIR/*/summary.json + config.yaml of a Hydra multirun (or of its cells.tar.xz, experiments/archive.py); never
imported by the library.

    python -m specexp -m --config-dir sweeps --config-name dels_alpha_beta     # -> multirun/dels_alpha_beta
    python experiments/dels_alpha_beta.py multirun/dels_alpha_beta [--metric tau|speedup]

Writes into DIR: alpha_beta.png and alpha_beta.md. The panels are the paper's (arXiv 2607.07409, Figure 2):
macro τ over the grid, the prior's effect τ(α, β) − τ(α, 0), and per α the best β's gain
max_β τ(α, β) − τ(α, 0) (with that β); without a β = 0 column the last two fall back to τ / best τ of the
row and the best β's τ. The markdown holds the grid, the τ(α, β) − τ(α, 0) grid and the gain per α.
"""
import argparse
import json
import sys
from pathlib import Path

import archive
import yaml

from specexp.report import plots

CIS: dict[tuple[float, float], list[float]] = {}    # macro τ 95% CIs of the cells whose summary has one


def load(sweep: Path, metric: str) -> dict[tuple[float, float], float]:
    grid = {}
    for d in sorted(p for p in archive.cells(sweep).iterdir() if (p / "summary.json").exists()):
        fusion = yaml.safe_load((d / "config.yaml").read_text())["fusion"]
        s = json.loads((d / "summary.json").read_text())
        value = s["macro"].get(metric)                  # replay summaries have no speedup
        if value is not None and not isinstance(fusion["alpha"], list):
            grid[(float(fusion["alpha"]), float(fusion["beta"]))] = float(value)
            if metric == "tau" and s["macro"].get("tau_ci95"):
                CIS[(float(fusion["alpha"]), float(fusion["beta"]))] = s["macro"]["tau_ci95"]
    return grid


def table(grid, alphas, betas, metric: str, title: str) -> str:
    best = max(grid, key=grid.get)
    lines = [f"# {title}", "", f"macro {metric} by α (rows) and β (columns); **bold** = best; – = not run", "",
             "| α \\ β | " + " | ".join(f"{b:g}" for b in betas) + " |", "|---|" + "---:|" * len(betas)]
    for a in alphas:
        cells = []
        for b in betas:
            v = grid.get((a, b))
            cells.append("–" if v is None else (f"**{v:.3f}**" if (a, b) == best else f"{v:.3f}"))
        lines.append(f"| {a:g} | " + " | ".join(cells) + " |")
    ci = lambda c: f" (95% CI {c[0]:.3f}–{c[1]:.3f})" if c else ""                              # noqa: E731
    lines += ["", f"best: α={best[0]:g}, β={best[1]:g}, {metric} {grid[best]:.3f}{ci(CIS.get(best))}"]
    if (0.0, 0.0) in grid:
        lines.append(f"α=β=0 (DFlash's own drafts): {metric} {grid[(0.0, 0.0)]:.3f}{ci(CIS.get((0.0, 0.0)))}")
    if 0.0 in betas:                    # the paper's panels (Figure 2) as numbers: gain over β = 0 of the same α
        lines += ["", f"{metric}(α, β) − {metric}(α, 0) (Figure 2, middle panel):", "",
                  "| α \\ β | " + " | ".join(f"{b:g}" for b in betas) + " |", "|---|" + "---:|" * len(betas)]
        for a in alphas:
            base = grid.get((a, 0.0))
            lines.append(f"| {a:g} | " + " | ".join(
                "–" if base is None or grid.get((a, b)) is None else f"{grid[(a, b)] - base:+.3f}" for b in betas)
                + " |")
        lines += ["", "best β's gain per α, max_β τ(α, β) − τ(α, 0) (Figure 2, right panel):", "",
                  "| α | best β | gain |", "|---|---:|---:|"]
        for a in alphas:
            row = {b: grid[(a, b)] for b in betas if (a, b) in grid}
            if (a, 0.0) in grid:
                b = max(row, key=row.get)
                lines.append(f"| {a:g} | {b:g} | {row[b] - grid[(a, 0.0)]:+.3f} |")
    if CIS:
        lines.append("For a claim that one cell beats another, compare the two runs paired: "
                     "python -m specexp task=compare compare.a=DIR compare.b=DIR")
    return "\n".join(lines) + "\n"


def figure(grid, alphas, betas, metric: str, title: str, out: Path) -> None:
    plots.grid_heatmap(grid, alphas, betas, metric, title, out, baseline_col=0.0)   # task=report's figure


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--metric", default="tau", choices=["tau", "speedup"])
    args = ap.parse_args(argv)
    grid = load(args.sweep, args.metric)
    if not grid:
        sys.exit(f"{args.sweep}: no finished runs with a scalar α/β and a {args.metric} (summary.json + config.yaml)")
    alphas, betas = sorted({a for a, _ in grid}), sorted({b for _, b in grid})
    first = next(p for p in sorted(archive.cells(args.sweep).iterdir()) if (p / "summary.json").exists())
    s = json.loads((first / "summary.json").read_text())
    title = (f"DeLS-Spec α/β grid: {s['drafter']} on {s['target']}, {s['decoding']['protocol']}, "
             f"{len(s['benchmarks'])} benchmarks, {s['max_new_tokens']} new tokens")
    (args.sweep / "alpha_beta.md").write_text(table(grid, alphas, betas, args.metric, title))
    figure(grid, alphas, betas, args.metric, title, args.sweep / "alpha_beta.png")
    print((args.sweep / "alpha_beta.md").read_text())


if __name__ == "__main__":
    main()
