"""Every figure of the project, one function each (PNG via matplotlib's Agg backend, no display needed).

Used by `task=report` (report/page.py) and by the experiments/ scripts, so a figure is drawn in one place.
Each function takes plain data (summaries as written to summary.json, rows of a CSV log) and a path, writes the
PNG there and returns the path. Conventions: τ includes the bonus token (tokens committed per verification);
per-position acceptance is the unconditional P(draft k accepted) (architecture.md, Conventions); a missing
value (None, a benchmark a run did not evaluate) is left out, never drawn as 0.
"""
from __future__ import annotations

import math
from pathlib import Path

DPI = 110


def _plt():
    import matplotlib

    matplotlib.use("Agg")                       # files only: no display on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return path


def ci_error(y: float, ci) -> tuple[float, float]:
    """Error-bar lengths (below, above) of `y` from its 95% interval `ci` ([lo, hi] or None), never negative:
    with one prompt per benchmark the bootstrap interval is [τ, τ] and τ − lo can come out as −2e−16 after
    rounding, which matplotlib refuses (`'yerr' must not contain negative values`)."""
    lo, hi = ci if ci else (y, y)
    return max(0.0, y - lo), max(0.0, hi - y)


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


# ----------------------------------------------------------------------------------- eval runs (Tables 1, 3)
def tau_by_benchmark(runs: dict[str, dict], path, title: str = "τ by benchmark") -> Path:
    """Grouped bars: τ per benchmark (and macro) for each run (label -> summary), 95% bootstrap CI as error bars."""
    plt = _plt()
    benches = list(dict.fromkeys(b for s in runs.values() for b in s["benchmarks"])) + ["macro"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(benches) * max(1, len(runs)) ** 0.5 + 2), 4.2))
    width = 0.8 / max(1, len(runs))
    for i, (label, s) in enumerate(runs.items()):
        xs, ys, lo, hi = [], [], [], []
        for j, b in enumerate(benches):
            rec = s["macro"] if b == "macro" else s["benchmarks"].get(b)
            if not rec or rec.get("tau") is None:
                continue
            below, above = ci_error(rec["tau"], rec.get("tau_ci95"))
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(rec["tau"])
            lo.append(below)
            hi.append(above)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
    ax.set_xticks(range(len(benches)), benches, rotation=30, ha="right")
    ax.set_ylabel("τ (tokens per verification)")
    ax.set_title(f"{title} (error bars: 95% bootstrap CI over prompts)")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_ylim(bottom=0.9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def _pooled(s: dict, key: str) -> list[float | None]:
    """Per-position values of one run averaged over its benchmarks (unweighted, like macro τ)."""
    rows = [b.get(key) or [] for b in s["benchmarks"].values()]
    n = max((len(r) for r in rows), default=0)
    return [_mean(r[k] for r in rows if k < len(r)) for k in range(n)]


def acceptance_curves(runs: dict[str, dict], path) -> Path:
    """Per-position acceptance of each run, mean over benchmarks: unconditional P(draft k accepted) (left) and
    conditional P(k accepted | k−1 accepted) (right)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "accept_rate_per_position", "P(draft k accepted)"),
                           (axes[1], "accept_rate_conditional", "P(draft k accepted | k−1 accepted)")):
        for label, s in runs.items():
            ys = _pooled(s, key)
            pts = [(k + 1, y) for k, y in enumerate(ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", ms=3, label=label)
        ax.set(xlabel="draft position k", ylabel="rate", title=title + ", mean over benchmarks", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def tau_histograms(runs: dict[str, dict], path) -> Path:
    """Share of verification rounds committing 1 .. K+1 tokens, summed over benchmarks, one bar group per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    hists = {}
    for label, s in runs.items():
        rows = [b.get("tau_histogram") or [] for b in s["benchmarks"].values()]
        n = max((len(r) for r in rows), default=0)
        tot = [sum(r[k] for r in rows if k < len(r)) for k in range(n)]
        if sum(tot):
            hists[label] = [t / sum(tot) for t in tot]
    width = 0.8 / max(1, len(hists))
    for i, (label, h) in enumerate(hists.items()):
        ax.bar([k + 1 - 0.4 + width * (i + 0.5) for k in range(len(h))], h, width, label=label)
    ax.set(xlabel="tokens committed per verification (τ of one round)", ylabel="share of rounds",
           title="τ histogram (all benchmarks)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------- sweeps
def grid_heatmap(grid: dict[tuple[float, float], float], alphas: list[float], betas: list[float], metric: str,
                 title: str, path, row_label: str = "α (local head)", col_label: str = "β (prior)",
                 baseline_col: float | None = None) -> Path:
    """The grid of `metric` (rows `alphas`, columns `betas`) and two panels read from it. With `baseline_col`
    (DeLS-Spec Figure 2: β = 0) they are the paper's: the gain over the row's baseline column,
    m(α, β) − m(α, β₀), and per row the best column's gain max_β m(α, β) − m(α, β₀) with that best column.
    Without it (any two swept numbers): the grid normalised by the best value of its row, and the best column
    value per row with its metric."""
    plt = _plt()
    import numpy as np

    m = np.full((len(alphas), len(betas)), np.nan)
    for i, a in enumerate(alphas):
        for j, b in enumerate(betas):
            m[i, j] = grid.get((a, b), np.nan)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.4))
    paper = baseline_col is not None and baseline_col in betas
    with np.errstate(invalid="ignore", divide="ignore"):
        if paper:
            second = (m - m[:, [betas.index(baseline_col)]], f"{metric}(α, β) − {metric}(α, {baseline_col:g})")
        else:
            second = (m / np.nanmax(m, axis=1, keepdims=True), f"{metric} / best of the row")
    for k, (data, name) in enumerate([(m, f"macro {metric}"), second]):
        im = ax[k].imshow(data, origin="lower", cmap="viridis", aspect="auto")
        ax[k].set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax[k].set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax[k].set_xlabel(col_label)
        ax[k].set_ylabel(row_label)
        ax[k].set_title(name)
        for i in range(len(alphas)):
            for j in range(len(betas)):
                if not np.isnan(data[i, j]):
                    ax[k].text(j, i, f"{data[i, j]:.3f}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, ax=ax[k])
    rows = [(a, row) for a, row in zip(alphas, m) if not np.all(np.isnan(row))]
    r, c = row_label.split()[0], col_label.split()[0]          # "α", "β" (or the swept keys themselves)
    ax[2].plot([a for a, _ in rows], [betas[int(np.nanargmax(v))] for _, v in rows], "o-", label=f"best {c}")
    ax[2].set_xlabel(r)
    ax[2].set_ylabel(f"best {c}")
    tw = ax[2].twinx()
    if paper:
        j0 = betas.index(baseline_col)
        tw.plot([a for a, _ in rows], [float(np.nanmax(v) - v[j0]) for _, v in rows], "s--", color="tab:orange",
                label=f"gain of the best {c} over {c} = {baseline_col:g}")
        tw.set_ylabel(f"max_{c} {metric}({r}, {c}) − {metric}({r}, {baseline_col:g})")
        ax[2].set_title(f"best {c}'s gain per {r}")
    else:
        tw.plot([a for a, _ in rows], [float(np.nanmax(v)) for _, v in rows], "s--", color="tab:orange",
                label=f"{metric} at best {c}")
        tw.set_ylabel(f"macro {metric} at best {c}")
        ax[2].set_title(f"best {c} per {r}")
    fig.legend(loc="lower right")
    fig.suptitle(title)
    return _save(fig, path)


def tau_against(panels: list[tuple[dict, str, str]], path) -> Path:
    """τ against one swept value: each panel is ({value: summary}, x label, title); a thin line per benchmark and
    the macro τ in black (DEdit: τ against edit passes E and against the drafting window W)."""
    plt = _plt()
    panels = [p for p in panels if p[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (data, xlabel, title) in zip(axes[0], panels):
        xs = list(data)
        benches = list(dict.fromkeys(b for s in data.values() for b in s["benchmarks"]))
        for b in benches:
            pts = [(x, data[x]["benchmarks"][b]["tau"]) for x in xs
                   if data[x]["benchmarks"].get(b, {}).get("tau") is not None]
            if pts:
                ax.plot(*zip(*pts), lw=0.8, alpha=0.5, label=b)
        ax.plot(xs, [data[x]["macro"]["tau"] for x in xs], "k-o", lw=2, label="macro")
        numeric = all(isinstance(x, (int, float)) for x in xs)
        ax.set(xlabel=xlabel, ylabel="τ (tokens per verification)", title=title)
        if numeric:
            ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    return _save(fig, path)


def scaling_curve(series: dict[str, list[tuple[float, float, list[float] | None]]], path, xlabel: str,
                  title: str) -> Path:
    """τ against training data: `series` = {label: [(x, τ, [lo, hi] 95% CI or None), ...]} (a benchmark family or
    the macro, drawn in black), error bars from the CIs, x on a log scale."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, pts in series.items():
        pts = sorted(p for p in pts if p[1] is not None)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        bars = [ci_error(y, c) for (_, y, c) in pts]
        err = [[b[0] for b in bars], [b[1] for b in bars]]
        style = dict(color="k", lw=2, marker="o") if label == "macro" else dict(lw=1.2, marker=".")
        ax.errorbar(xs, ys, yerr=err, capsize=3, label=label, **style)
    ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel="τ (tokens per verification)", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


# --------------------------------------------------------------------------------------------- training
TRAIN_PANELS = (("train/loss", "loss"), ("train/tau_sim", "simulated τ"), ("train/acc", "accuracy"),
                ("lr", "learning rate"))


def training_curves(runs: dict[str, list[dict]], path) -> Path:
    """Loss, simulated τ, accuracy (mean over positions when only per-position accuracies are logged) and the
    learning rate against the optimiser step, one line per training run (label -> rows of Lightning's
    metrics.csv, values as floats or None). A panel no run logged is left out."""
    plt = _plt()

    def series(rows, key):
        pts = []
        for r in rows:
            v = r.get(key)
            if v is None and key == "train/acc":
                v = _mean(r[k] for k in r if k.startswith("train/acc_k"))
            if v is None and key == "lr":
                v = next((r[k] for k in r if k.startswith("lr") and r[k] is not None), None)
            if v is not None and r.get("step") is not None:
                pts.append((r["step"], v))
        return pts

    panels = [(k, t) for k, t in TRAIN_PANELS if any(series(rows, k) for rows in runs.values())]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.6), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for label, rows in runs.items():
            pts = series(rows, key)
            if pts:
                ax.plot(*zip(*pts), "-", lw=1.2, marker="o" if len(pts) < 20 else None, ms=3, label=label)
        ax.set(xlabel="step", title=title)
        if key == "train/loss":
            ax.set_yscale("log")                # early steps are often orders of magnitude above the rest
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)
