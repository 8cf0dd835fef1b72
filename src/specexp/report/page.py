"""`task=report`: one static HTML page over kept result directories, for everyone without a W&B account.

    python -m specexp task=report report.runs='[outputs/eval/dflash,multirun/dels_alpha_beta,runs/train/rnn]'

Each entry of `report.runs` is `DIR` or `NAME=DIR` (quoted on the command line: `report.runs="['dflash=DIR',DIR]"`;
NAME labels it on the page) and is one of (recognised by the files it holds; nothing else is read):

  eval or replay run   DIR/summary.json
  sweep                DIR/*/summary.json + DIR/*/config.yaml (a Hydra multirun); the swept keys are the config
                       leaves whose values differ between jobs
  training run         DIR/train_summary.json; its curves come from Lightning's CSV logs in the stage directory
                       it names (`run_dir`/logs/version_*/metrics.csv, resumed versions joined in order)
  trained artifact     DIR/card.json, or a card's JSON file (training cost only: its logs are not kept)

The run directory gets `index.html` and `figures/*.png` (plots.py), relative links only, so the page opens from
disk in any browser, offline, and regenerates from the same directories at any time. Tables: τ per benchmark
and drafter (DFlash Table 1 / DeLS-Spec Table 3 layout), each run's benchmark table (τ with its 95% CI, speedup,
TPOT, TTFT, lossless mismatches), each sweep's grid, the training cost (DeLS-Spec Table 5). Online and replay runs
get separate tables and charts (their τ do not mix: replay has no timing and agrees with decoding only up to
near-ties); a macro τ over another benchmark set than its neighbours' is flagged (†) with how many it averages.
A script at the end of the page records, once it has loaded, how many of its figures decoded
(`data-figures-loaded` on <body>).
"""
from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import log
from ..config import Config, checked
from ..errors import check
from ..files import write_text_atomic
from ..rundir import claimed_for, read_json, read_summary
from . import plots
from .tables import run_kind


@dataclass
class Sweep:
    name: str
    dir: Path
    keys: list[str]                                      # the swept config keys, dotted
    jobs: list[tuple[tuple, str, dict]] = field(default_factory=list)   # (swept values, job dir name, summary)


@dataclass
class Training:
    name: str
    card: dict
    rows: list[dict] = field(default_factory=list)        # Lightning metrics.csv rows, floats or None


@dataclass
class Inputs:
    runs: dict[str, dict] = field(default_factory=dict)   # label -> summary.json
    sweeps: list[Sweep] = field(default_factory=list)
    trainings: list[Training] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ reading
def _json(path: Path) -> dict:
    return read_json(path)                  # the store's reader: a corrupt summary is one line naming it


def _flat(node, prefix="") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _job_dirs(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_dir() and (p / "summary.json").is_file())


def load_sweep(d: Path, name: str) -> Sweep:
    """The jobs of a multirun directory and the config keys that differ between them (`paths.*` excluded: where a
    job wrote is not what it measured; of keys always equal, the shortest). Without config.yaml files the job's
    directory name is the swept value."""
    jobs = _job_dirs(d)
    cfgs = [_flat(yaml.safe_load((j / "config.yaml").read_text())) if (j / "config.yaml").is_file() else {}
            for j in jobs]
    column = lambda k: json.dumps([x.get(k) for x in cfgs], sort_keys=True, default=str)          # noqa: E731
    varying = sorted({k for c in cfgs for k in c if not k.startswith("paths.")
                      and len({json.dumps(x.get(k), sort_keys=True, default=str) for x in cfgs}) > 1})
    # A value copied into another group (drafter.fusion.alpha = ${fusion.alpha}) is one swept key: the shortest name
    by_column: dict[str, str] = {}
    for k in sorted(varying, key=lambda k: (k.count("."), k)):
        by_column.setdefault(column(k), k)
    keys = sorted(by_column.values())
    sweep = Sweep(name, d, keys or ["job"])
    for j, c in zip(jobs, cfgs):
        values = tuple(c.get(k) for k in keys) if keys else (j.name,)
        sweep.jobs.append((values, j.name, read_summary(j / "summary.json")))
    sweep.jobs.sort(key=lambda x: tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in x[0]))
    return sweep


def _number(v: str):
    if v in ("", None):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def load_training_logs(card: dict, run_dir: Path) -> list[dict]:
    """Rows of every `logs/version_*/metrics.csv` of the training stage named by the card (a resumed fit logs to the
    next version), or of the run directory itself when the stage is gone."""
    files = []
    for root in (Path(card["run_dir"]) if card.get("run_dir") else None, run_dir):
        if root is not None and (root / "logs").is_dir():
            files = sorted((root / "logs").glob("version_*/metrics.csv"),
                           key=lambda p: int(p.parent.name.removeprefix("version_") or 0))
            if files:
                break
    rows = []
    for f in files:
        with f.open(newline="") as fh:
            rows += [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    return rows


def _name(p: Path, taken) -> str:
    name = p.name if p.name not in ("", ".") else str(p)
    return name if name not in taken else f"{p.parent.name}/{name}"


def _split(entry: str) -> tuple[str | None, Path]:
    """`NAME=DIR` -> (NAME, DIR); a plain `DIR` -> (None, DIR) (the name then comes from the files)."""
    name, sep, path = entry.partition("=")
    if sep and name and "/" not in name and not Path(entry).exists():
        return name, Path(path).expanduser()
    return None, Path(entry).expanduser()


def collect(paths: list) -> Inputs:
    """Sort the given directories into eval/replay runs, sweeps and training runs (module docstring)."""
    out = Inputs()
    for raw in paths:
        label, p = _split(str(raw))
        check(p.exists(), f"report.runs: {p} does not exist")
        if p.is_file() and p.suffix == ".json":
            card = _json(p)
            check("train_seconds" in card, f"report.runs: {raw} is not a training card (no train_seconds)")
            out.trainings.append(Training(label or _name(p.with_suffix(""), [t.name for t in out.trainings]), card))
        elif (p / "summary.json").is_file():
            s = read_summary(p / "summary.json")
            kind = [*run_kind(s, p), *(["replay"] if s.get("mode") == "replay" else [])]   # tree, batch B, replay
            label = label or str(s.get("drafter") or p.name) + (f" ({', '.join(kind)})" if kind else "")
            out.runs[label if label not in out.runs else f"{label} ({p.name})"] = s
        elif (p / "train_summary.json").is_file():
            card = _json(p / "train_summary.json")
            out.trainings.append(Training(label or _name(p, [t.name for t in out.trainings]), card,
                                          load_training_logs(card, p)))
        elif (p / "card.json").is_file():
            out.trainings.append(Training(label or _name(p, [t.name for t in out.trainings]), _json(p / "card.json")))
        elif p.is_dir() and _job_dirs(p):
            out.sweeps.append(load_sweep(p, label or _name(p, [s.name for s in out.sweeps])))
        else:
            check(False, f"report.runs: {raw} holds no summary.json, train_summary.json or card.json, nor job "
                         f"directories with summary.json (an eval/replay run, a training run or a multirun)")
    return out


# ------------------------------------------------------------------------------------------------ HTML
def _f(x, spec: str, suffix: str = "") -> str:
    return "–" if x is None else format(x, spec) + suffix


def _ci(c, spec: str = ".3f") -> str:
    return "–" if not c else f"[{format(c[0], spec)}, {format(c[1], spec)}]"


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    e = html.escape
    th = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _figure(src: str, caption: str) -> str:
    return (f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


MODES = (("online", "decoded by the engine"), ("replay", "replayed on the target's greedy references, no timing"))


def by_mode(runs: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """{mode: {label: summary}} in MODES order: online and replay runs never share a chart or a table (replay τ is
    exact only up to near-ties and has no speedup)."""
    return {m: r for m, _ in MODES if (r := {k: s for k, s in runs.items() if s.get("mode", "online") == m})}


def _covered(s: dict) -> tuple:
    return tuple(sorted(b for b, v in s["benchmarks"].items() if v.get("tau") is not None))


def mixed_benchmark_sets(runs: dict[str, dict]) -> bool:
    """Whether the runs' macro τ are means over different benchmark sets (then they do not compare)."""
    return len({_covered(s) for s in runs.values()}) > 1


def drafter_table(runs: dict[str, dict]) -> str:
    """Rows = runs, columns = benchmarks (τ), macro τ with its CI, macro speedup: the Table 1 / Table 3 layout.
    When the runs cover different benchmark sets, each macro τ is flagged with † and the number it averages."""
    benches = list(dict.fromkeys(b for s in runs.values() for b in s["benchmarks"]))
    mixed = mixed_benchmark_sets(runs)
    rows = []
    for label, s in runs.items():
        m = s["macro"]
        flag = f"† ({len(_covered(s))} of {len(benches)})" if mixed else ""
        rows.append([html.escape(label), *(_f(s["benchmarks"].get(b, {}).get("tau"), ".3f") for b in benches),
                     f"<b>{_f(m.get('tau'), '.3f')}</b>{flag}", _ci(m.get("tau_ci95")),
                     _f(m.get("speedup"), ".2f", "×")])
    table = _table(["run", *benches, "macro τ", "macro τ 95% CI", "macro speedup"], rows, "num")
    if mixed:
        table += ('<p class="note mixed">† macro τ over different benchmark sets (the mean over the benchmarks '
                  'each run evaluated): these macro values do not compare; compare the per-benchmark columns.</p>')
    return table


def run_table(s: dict) -> str:
    rows = []
    for name, b in s["benchmarks"].items():
        rows.append([html.escape(name), str(b.get("num_turns", "–")), _f(b.get("tau"), ".3f"),
                     _ci(b.get("tau_ci95")), _f(b.get("speedup"), ".2f", "×"), _f(b.get("tpot_ms"), ".1f"),
                     _f(b.get("tpot_ar_ms"), ".1f"), _f(b.get("ttft_ms"), ".0f"),
                     _f(b.get("lossless_mismatches"), "d")])
    m = s["macro"]
    rows.append(["<b>macro</b>", "", f"<b>{_f(m.get('tau'), '.3f')}</b>", _ci(m.get("tau_ci95")),
                 _f(m.get("speedup"), ".2f", "×"), "", "", "", ""])
    return _table(["benchmark", "turns", "τ", "τ 95% CI", "speedup", "TPOT ms", "AR TPOT ms", "TTFT ms",
                   "lossless mismatches"], rows, "num")


def _setting(s: dict) -> str:
    d = s.get("decoding", {})
    return (f"{s.get('drafter')} on {s.get('target')}, {s.get('mode', 'online')}, {d.get('protocol')} at "
            f"T={d.get('temperature')}, {s.get('max_new_tokens')} new tokens, K={s.get('num_draft_tokens')}")


def sweep_table(sw: Sweep) -> str:
    rows = [[*(html.escape(str(v)) for v in values), html.escape(job), _f(s["macro"].get("tau"), ".3f"),
             _ci(s["macro"].get("tau_ci95")), _f(s["macro"].get("speedup"), ".2f", "×")]
            for values, job, s in sw.jobs]
    return _table([*sw.keys, "job", "macro τ", "macro τ 95% CI", "macro speedup"], rows, "num")


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


AXIS_LABELS = {"fusion.alpha": "α (local head)", "fusion.beta": "β (prior)"}      # DeLS-Spec's names


def sweep_figure(sw: Sweep, path: Path) -> Path | None:
    """Two numeric swept keys: the Figure 2 heatmap; one: τ against it; otherwise none (the table says it all)."""
    title = f"{sw.name}: macro τ over {', '.join(sw.keys)}"
    if len(sw.keys) == 2 and _numeric(v for values, _, _ in sw.jobs for v in values):
        grid = {(float(v[0]), float(v[1])): s["macro"]["tau"] for v, _, s in sw.jobs if s["macro"].get("tau")}
        rows, cols = sorted({a for a, _ in grid}), sorted({b for _, b in grid})
        return plots.grid_heatmap(grid, rows, cols, "τ", title, path, row_label=AXIS_LABELS.get(sw.keys[0], sw.keys[0]),
                                  col_label=AXIS_LABELS.get(sw.keys[1], sw.keys[1]))
    if len(sw.keys) == 1:
        data = {v[0]: s for v, _, s in sw.jobs}
        return plots.tau_against([(data, sw.keys[0], title)], path)
    return None


def cost_table(trainings: list[Training]) -> str:
    """DeLS-Spec Table 5: what each trained part cost (from its card)."""
    rows = []
    for t in trainings:
        c = t.card
        fm = c.get("final_metrics", {})
        what = c.get("title") or c.get("kind") or (c.get("head") or {}).get("architecture") or "–"
        rows.append([html.escape(t.name), html.escape(str(what)), _f(c.get("steps"), "d"),
                     _f(c.get("train_seconds"), ".0f") + (f" (steps {c['timed_from_step']}+)"
                                                          if c.get("timed_from_step") else ""),
                     _f(c.get("peak_memory_mb"), ".0f"),
                     _f(c.get("trainable_params"), ",d"), html.escape(str(c.get("precision", "–"))),
                     _f(c.get("sequences"), "d"), _f(fm.get("train/loss"), ".3f")])
    return _table(["training", "trained part", "steps", "time s", "peak memory MiB", "trainable params",
                   "precision", "sequences", "final loss"], rows, "num")


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3}table.num td{text-align:right}table.num td:first-child,td.t{text-align:left}
figure{margin:8px 0 20px}img{max-width:100%;border:1px solid #eee}figcaption{color:#555;font-size:13px}
.note{color:#555}"""

CHECK = """<script>
addEventListener("load", () => {
  const imgs = Array.from(document.images);
  document.body.dataset.figures = imgs.length;
  document.body.dataset.figuresLoaded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
});
</script>"""


def render(inputs: Inputs, out_dir: Path, title: str, sources: list[str]) -> Path:
    """Write the figures and `index.html` into out_dir; returns the page's path."""
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    body = [f"<h1>{html.escape(title)}</h1>",
            '<p class="note">From: ' + ", ".join(f"<code>{html.escape(s)}</code>" for s in sources) + ". τ = tokens "
            "committed per target verification (accepted drafts + the bonus token); 95% CI: bootstrap over prompts; "
            "speedup = mean AR TPOT / mean TPOT, same engine, same prompts (none for replay runs).</p>"]
    groups = by_mode(inputs.runs)
    for mode, runs in groups.items():           # online and replay runs: separate tables and charts
        what = dict(MODES)[mode]
        # the first group keeps the plain names (pages and links made before the split stay valid)
        sfx, head = ("" if mode == next(iter(groups)) else f"_{mode}"), f" ({mode} runs)" if len(groups) > 1 else ""
        tau_fig = plots.tau_by_benchmark(runs, fig_dir / f"tau_by_benchmark{sfx}.png", f"τ by benchmark, {mode}")
        body += [f"<h2>τ and speedup by benchmark and drafter{head}</h2>",
                 f'<p class="note">{html.escape(mode)}: {html.escape(what)}.</p>', drafter_table(runs),
                 _figure(f"figures/{tau_fig.name}", f"τ per benchmark and drafter ({mode}), 95% bootstrap CI"),
                 f"<h2>Acceptance by draft position{head}</h2>",
                 _figure(f"figures/{plots.acceptance_curves(runs, fig_dir / f'acceptance{sfx}.png').name}",
                         f"per-position acceptance ({mode}), mean over benchmarks; each run up to its own K"),
                 f"<h2>τ histograms{head}</h2>",
                 _figure(f"figures/{plots.tau_histograms(runs, fig_dir / f'tau_histogram{sfx}.png').name}",
                         f"share of rounds committing 1 .. K+1 tokens ({mode})"),
                 f"<h2>Runs{head}</h2>"]
        for label, s in runs.items():
            body += [f"<h3>{html.escape(label)}</h3>", f'<p class="note">{html.escape(_setting(s))}</p>', run_table(s)]
    for i, sw in enumerate(inputs.sweeps):
        body += [f"<h2>Sweep {html.escape(sw.name)} over {html.escape(', '.join(sw.keys))}</h2>",
                 f'<p class="note">{len(sw.jobs)} jobs; {html.escape(_setting(sw.jobs[0][2]))}</p>']
        fig = sweep_figure(sw, fig_dir / f"sweep_{i}.png")
        if fig is not None:
            body.append(_figure(f"figures/{fig.name}", f"macro τ over {', '.join(sw.keys)}"))
        body.append(sweep_table(sw))
    if inputs.trainings:
        body += ["<h2>Training</h2>"]
        logged = {t.name: t.rows for t in inputs.trainings if t.rows}
        if logged:
            body.append(_figure(f"figures/{plots.training_curves(logged, fig_dir / 'training.png').name}",
                                "training curves from the Lightning CSV logs"))
        body += ["<h3>Training cost</h3>", cost_table(inputs.trainings)]
    page = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n<body>\n" + "\n".join(body)
            + f"\n{CHECK}\n</body></html>\n")
    path = out_dir / "index.html"
    write_text_atomic(path, page)
    return path


def run_report(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=report`: collect `report.runs`, write index.html + figures/ into the run directory."""
    rp = checked(cfg, typed).report
    runs = list(rp.runs) if rp is not None else []
    check(len(runs) > 0, "report.runs is empty; give one or more run or sweep directories: "
                         "report.runs='[DIR,...]'")
    inputs = collect(runs)
    with claimed_for(out_dir, "report") as d:       # never into another run's directory (eval/store.py)
        path = render(inputs, d, rp.title or "specexp report", [str(r) for r in runs])
    log.LOG.info(f"report: {path} ({len(inputs.runs)} runs, {len(inputs.sweeps)} sweeps, "
                 f"{len(inputs.trainings)} trainings)")
    return {"index": str(path)}
