"""DEdit figures and tables from real runs: τ against the number of edit passes E and against the drafting
window W (K fixed); ProposalMix against plain mix in harmful-edit rate; bidirectional against causal editor
per benchmark; DEdit next to the other drafters; acceptance by pass count. Never imported by the library.

    python -m specexp experiment=mini_dedit                                   # + the ablations, see its header
    python -m specexp -m --config-dir sweeps --config-name dedit drafter.checkpoint=M          # E = 0..4
    python -m specexp -m --config-dir sweeps --config-name dedit drafter.checkpoint=M \\
        hydra.sweep.dir=multirun/dedit_window drafter.edit.passes=2 drafter.edit.verify=4 drafter.edit.window=4,5,6,7
    python -m specexp drafter=dedit drafter.init=checkpoint drafter.checkpoint=M hydra.run.dir=runs/dedit_eval/dedit
    (the same for the plain-mix and causal checkpoints, with drafter.edit.editor=causal for the latter)
    python experiments/dedit_figures.py --passes multirun/dedit_passes --window multirun/dedit_window \\
        --mix proposalmix=runs/dedit_eval/dedit plain=runs/dedit_eval/dedit_plain \\
        --editor bidirectional=runs/dedit_eval/dedit causal=runs/dedit_eval/dedit_causal \\
        --compare dflash=RUN dels_rnn=RUN domino_ft=RUN dedit=runs/dedit_eval/dedit --out DIR

Writes DIR/dedit.png (τ vs E, τ vs W) and DIR/dedit.md (every table). τ includes the bonus token.
"""
import argparse
import json
from pathlib import Path

import yaml

from specexp.report import plots


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def sweep(d: Path, key: str) -> dict[int, dict]:
    """{value of drafter.edit.<key>: summary} over a multirun directory."""
    out = {}
    for run in sorted(p for p in d.iterdir() if (p / "summary.json").exists()):
        edit = yaml.safe_load((run / "config.yaml").read_text())["drafter"]["edit"]
        out[int(edit[key])] = summary(run)
    return dict(sorted(out.items()))


def named(pairs: list[str]) -> dict[str, dict]:
    return {p.split("=", 1)[0]: summary(Path(p.split("=", 1)[1])) for p in pairs}


def fmt(v, spec=".2f") -> str:
    return "–" if v is None else format(v, spec)


def tau_table(title: str, rows: dict[str, dict], extra: dict[str, str] | None = None) -> list[str]:
    benches = list(next(iter(rows.values()))["benchmarks"])
    head = "| | " + " | ".join(benches) + " | macro τ |" + (" macro speedup |" if extra is None else "")
    lines = [f"## {title}", "", head,
             "|---|" + "---:|" * (len(benches) + 1 + (extra is None))]
    for name, s in rows.items():
        cells = [fmt(s["benchmarks"].get(b, {}).get("tau")) for b in benches] + [fmt(s["macro"]["tau"], ".3f")]
        if extra is None:
            sp = s["macro"]["speedup"]
            cells.append("–" if sp is None else f"{sp:.2f}×")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def edits_of(s: dict) -> dict:
    """Edit counts summed over benchmarks (rates per edited round)."""
    tot = {"rounds": 0, "edited": 0, "harmful": 0, "helpful": 0, "neutral": 0}
    for b in s["benchmarks"].values():
        e = b.get("edits") or {}
        for k in tot:
            tot[k] += e.get(k, 0) or 0
    tot["harmful_rate"] = tot["harmful"] / tot["edited"] if tot["edited"] else None
    tot["helpful_rate"] = tot["helpful"] / tot["edited"] if tot["edited"] else None
    return tot


def mix_table(rows: dict[str, dict]) -> list[str]:
    lines = ["## ProposalMix against plain mix (edit outcomes, greedy; rates per edited round)", "",
             "| training mix | rounds | edited | harmful | helpful | harmful rate | helpful rate | macro τ |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows.items():
        e = edits_of(s)
        lines.append(f"| {name} | {e['rounds']} | {e['edited']} | {e['harmful']} | {e['helpful']} | "
                     f"{fmt(e['harmful_rate'], '.1%')} | {fmt(e['helpful_rate'], '.1%')} | "
                     f"{fmt(s['macro']['tau'], '.3f')} |")
    return lines + [""]


def passes_table(s: dict) -> list[str]:
    agg: dict[str, list] = {}
    for b in s["benchmarks"].values():
        e = b.get("edits") or {}
        for p, t in (e.get("tau_by_passes") or {}).items():
            n = e["rounds_by_passes"][p]
            a = agg.setdefault(p, [0.0, 0])
            a[0], a[1] = a[0] + t * n, a[1] + n
    lines = ["## Acceptance by pass count (rounds grouped by the edit passes they ran before stopping)", "",
             "| passes run | rounds | mean tokens per round |", "|---:|---:|---:|"]
    lines += [f"| {p} | {n} | {tot / n:.3f} |" for p, (tot, n) in sorted(agg.items(), key=lambda x: int(x[0]))]
    return lines + [""]


def plot(passes: dict[int, dict], window: dict[int, dict], path: Path) -> None:
    plots.tau_against([(passes, "edit passes E", "τ against E (W = K)"),         # the figure task=report draws
                       (window, "drafting window W", "τ against W (K = 4, E = 2)")], path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=Path, help="multirun over drafter.edit.passes")
    ap.add_argument("--window", type=Path, help="multirun over drafter.edit.window")
    ap.add_argument("--mix", nargs="*", default=[], help="NAME=RUN, e.g. proposalmix=DIR plain=DIR")
    ap.add_argument("--editor", nargs="*", default=[], help="NAME=RUN, e.g. bidirectional=DIR causal=DIR")
    ap.add_argument("--compare", nargs="*", default=[], help="NAME=RUN: DEdit next to the other drafters")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    passes = sweep(args.passes, "passes") if args.passes else {}
    window = sweep(args.window, "window") if args.window else {}
    lines = ["# DEdit on the mini target", ""]
    if args.compare:
        lines += tau_table("DEdit next to the other drafters (greedy; speedup = CPU wall time)", named(args.compare))
    if passes:
        lines += tau_table("τ against the number of edit passes E", {f"E = {e}": s for e, s in passes.items()}, {})
    if window:
        lines += tau_table("τ against the drafting window W (K = 4 verified, E = 2)",
                           {f"W = {w}": s for w, s in window.items()}, {})
    if args.mix:
        lines += mix_table(named(args.mix))
    if args.editor:
        rows = named(args.editor)
        lines += tau_table("Bidirectional against causal editor", rows, {})
        if len(rows) == 2:
            (na, a), (nb, b) = rows.items()
            lines += [f"{nb} − {na}, macro τ: {b['macro']['tau'] - a['macro']['tau']:+.3f}", ""]
    main_run = next(iter(named(args.mix[:1]).values())) if args.mix else None
    if main_run is not None:
        lines += passes_table(main_run)
    (args.out / "dedit.md").write_text("\n".join(lines))
    if passes or window:
        plot(passes, window, args.out / "dedit.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
