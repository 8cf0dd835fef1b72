"""`task=dashboard`: the project's W&B workspace and one report per paper table, as code (`wandb-workspaces`).

    python -m specexp task=dashboard                                   # the spec only: DIR/dashboard.json
    python -m specexp task=dashboard dashboard.sweep_group=dels_alpha_beta dashboard.push=true   # needs WANDB_API_KEY

The spec is built offline and saved as JSON (random panel ids replaced by stable ones, so it diffs and is tested
against a snapshot); `dashboard.push=true` saves the workspace and the reports to W&B, which needs a key
(`WANDB_API_KEY`) and refuses in one line without one. The key is read by wandb itself and never written.

What the panels read, i.e. what the runs log (tracking.py; training through Lightning's W&B logger):

  runs         job_type = the task (eval, replay, merge, compare, train; `grid` for each cell of
               replay.fusion_grid), group = the sweep for multirun jobs, name = drafter-target (+ a multirun job's
               overrides, + a grid cell's name), config = the resolved config (so `drafter.name`, `fusion.alpha`,
               ... are config keys) + run_info + command
  eval         eval, replay, grid and merge runs: summary `eval/<benchmark>/<tau|tau_ci_lo|tau_ci_hi|speedup|
               tpot_ms|ttft_ms|lossless_mismatches>` (no timing for replay), `eval/macro/<tau|speedup>`,
               `eval/macro/accept_k<k>` for k = 1..the run's K (P(draft k accepted), mean over benchmarks),
               `eval/num_draft_tokens` (K); tables `eval/summary`, `eval/acceptance`, `eval/tau_histogram`; the
               run's summary.json and samples.jsonl as an artifact (type `results`)
  compare      summary `compare/<benchmark|macro>/<delta|delta_ci_lo|delta_ci_hi|tau_a|tau_b|a_wins|ties|b_wins>`,
               table `compare/summary`
  train        history `train/loss`, `train/acc`, `train/acc_k<k>`, `train/tau_sim`, `lr-*`, `train/throughput`;
               summary `train/train_seconds`, `train/peak_memory_mb`, `train/trainable_params`, `train/steps`
"""
from __future__ import annotations

import os

from .. import log
from ..config import Config, checked
from ..errors import check
from ..files import write_json
from ..rundir import claimed_for, read_json

# Online runs (timing, speedup) and every run with a τ summary: replay, a fusion grid's cells, merged shards
TAU_FILTER = "JobType in ['eval', 'replay', 'grid', 'merge']"
GRID_FILTER = "JobType in ['eval', 'replay', 'grid']"
TRAIN_FILTER = "JobType = 'train'"
TRAIN_HISTORY = ["train/loss", "train/acc", "train/tau_sim", "train/throughput"]
COST = ["train/train_seconds", "train/peak_memory_mb", "train/trainable_params"]


def _panels(wr, benchmarks: list[str], positions: int, sweep_group: str | None) -> dict[str, list]:
    """The panels of each paper table / figure, shared by the workspace sections and the reports."""
    per_bench = [wr.BarPlot(title=f"τ on {b}", metrics=[f"eval/{b}/tau"], groupby="config.drafter.name")
                 for b in benchmarks]
    return {
        "tau": [wr.BarPlot(title="macro τ by drafter", metrics=["eval/macro/tau"], groupby="config.drafter.name"),
                wr.BarPlot(title="macro speedup by drafter", metrics=["eval/macro/speedup"],
                           groupby="config.drafter.name"),
                wr.WeavePanelSummaryTable(table_name="eval/summary"), *per_bench],
        "alpha_beta": [wr.ScatterPlot(title="macro τ over α × β" + (f" ({sweep_group})" if sweep_group else ""),
                                      x=wr.Config("fusion.alpha"), y=wr.Config("fusion.beta"),
                                      z=wr.SummaryMetric("eval/macro/tau")),
                       wr.ParallelCoordinatesPlot(columns=[
                           wr.ParallelCoordinatesPlotColumn(metric=wr.Config("fusion.alpha")),
                           wr.ParallelCoordinatesPlotColumn(metric=wr.Config("fusion.beta")),
                           wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("eval/macro/tau"))])],
        "acceptance": [wr.BarPlot(title="P(draft k accepted), mean over benchmarks",
                                  metrics=[f"eval/macro/accept_k{k}" for k in range(1, positions + 1)],
                                  groupby="config.drafter.name"),
                       wr.WeavePanelSummaryTable(table_name="eval/acceptance"),
                       wr.WeavePanelSummaryTable(table_name="eval/tau_histogram")],
        "training": [wr.LinePlot(title=m, x="Step", y=[m]) for m in TRAIN_HISTORY]
        + [wr.LinePlot(title="learning rate", x="Step", y=["lr-AdamW"])],
        "cost": [wr.BarPlot(title=m, metrics=[m], groupby="config.drafter.name") for m in COST],
    }


# (key, report title, introduction, runset filter)
REPORTS = [
    ("tau", "τ and speedup by benchmark and drafter (DFlash Table 1, DeLS-Spec Table 3)",
     "τ includes the bonus token; speedup = mean AR TPOT / mean TPOT on the same prompts (online runs only: "
     "replay runs have τ, no timing); one bar per drafter.", TAU_FILTER),
    ("alpha_beta", "DeLS-Spec Figure 2: macro τ over the α/β grid of a sweep",
     "One point per sweep job or fusion-grid cell (group = the sweep): α (local head) against β (prior), "
     "coloured by macro τ; online and replay runs alike.", GRID_FILTER),
    ("acceptance", "Acceptance by draft position and τ histograms",
     "Unconditional P(draft k accepted), mean over benchmarks, for k = 1 .. each run's K (a run logs its own "
     "positions); the per-benchmark curves and histograms are the runs' logged tables.", TAU_FILTER),
    ("training", "Training curves", "Loss, accuracy, simulated τ, throughput and learning rate per step "
     "(Lightning's W&B logger).", TRAIN_FILTER),
    ("cost", "Training cost (DeLS-Spec Table 5)", "Wall time, peak memory and trainable parameters of each "
     "training run (its train_summary.json).", TRAIN_FILTER),
]
SECTIONS = {"tau": "τ and speedup", "alpha_beta": "α/β sweep", "acceptance": "acceptance",
            "training": "training", "cost": "training cost"}


def build(project: str, entity: str, benchmarks: list[str], positions: int, sweep_group: str | None,
          bind: bool = False):
    """(workspace, [reports]) as wandb-workspaces objects. `bind=False` leaves the reports' run sets unbound to a
    project (binding looks the project up on the server); the pushed reports are bound."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    group = f" and Group = '{sweep_group}'" if sweep_group else ""
    filters = {k: f + (group if k == "alpha_beta" else "") for k, _, _, f in REPORTS}
    sections = [ws.Section(name=SECTIONS[k], panels=p, is_open=True)
                for k, p in _panels(wr, benchmarks, positions, sweep_group).items()]
    workspace = ws.Workspace(entity=entity, project=project, name="specexp", sections=sections,
                             runset_settings=ws.RunsetSettings(groupby=[expr.Config("drafter.name")]))
    reports = []
    for key, title, intro, _ in REPORTS:
        runset = wr.Runset(entity=entity if bind else "", project=project if bind else "", name=SECTIONS[key],
                           filters=filters[key])
        reports.append(wr.Report(entity=entity, project=project, title=title, description=intro, blocks=[
            wr.H1(title), wr.P(intro),
            wr.PanelGrid(runsets=[runset], panels=_panels(wr, benchmarks, positions, sweep_group)[key])]))
    return workspace, reports


def _block_sizes(node) -> list[int]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "block_size" and isinstance(v, int)] + \
            [b for v in node.values() for b in _block_sizes(v)]
    return []


def configured_positions() -> int:
    """The most draft positions any configured drafter has: the largest `block_size` of the drafter and experiment
    option files (plugins' included) minus one (a block of B holds the anchor and B − 1 drafts). The acceptance
    panels span 1..this; each run logs `eval/macro/accept_k<k>` for its own K only (eval/num_draft_tokens), so a
    block-8 run fills positions 1..7 and a block-16 run 1..15."""
    from ..config import option_tree, options

    sizes = [b for g in ("drafter", "experiment") for name in options(g) for b in _block_sizes(option_tree(g, name))]
    return max(sizes, default=16) - 1


def _stable_ids(node, seen: dict):
    """Replace wandb-workspaces' random ids (`id`, `__id__`) by `id0, id1, ...` in order of appearance (the same
    random id maps to the same stable one), so the spec is reproducible."""
    if isinstance(node, dict):
        return {k: (seen.setdefault(v, f"id{len(seen)}") if k in ("id", "__id__") and isinstance(v, str) and v
                    else _stable_ids(v, seen)) for k, v in node.items()}
    if isinstance(node, list):
        return [_stable_ids(v, seen) for v in node]
    return node


def spec(workspace, reports) -> dict:
    dump = lambda m: m.model_dump(by_alias=True, exclude_none=True, mode="json")          # noqa: E731
    seen: dict = {}
    return {"workspace": _stable_ids(dump(workspace._to_model()), seen),
            "reports": [_stable_ids(dump(r._to_model()), seen) for r in reports]}


def run_dashboard(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=dashboard`: write DIR/dashboard.json; with dashboard.push=true also save it to W&B."""
    typed = checked(cfg, typed)
    d = typed.dashboard
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        check(False, "task=dashboard needs wandb-workspaces: pip install -e '.[dashboards]'")
    benchmarks = list(typed.benchmark.names)
    positions = int(d.max_position) if d.max_position is not None else configured_positions()
    workspace, reports = build(d.project, d.entity or "", benchmarks, positions, d.sweep_group)
    with claimed_for(out_dir, "dashboard") as out:  # never into another run's directory (eval/store.py)
        path = out / "dashboard.json"
        write_json(path, spec(workspace, reports))
    log.LOG.info(f"dashboard spec: {path} (workspace + {len(reports)} reports)")
    if not d.push:
        return {"spec": str(path)}
    check(bool(os.environ.get("WANDB_API_KEY")), f"dashboard.push=true needs a W&B key: set WANDB_API_KEY (the "
                                                 f"spec is saved offline in {path})")
    import wandb

    entity = d.entity or wandb.Api().default_entity
    workspace, reports = build(d.project, entity, benchmarks, positions, d.sweep_group, bind=True)
    urls = [workspace.save().url, *(r.save().url for r in reports)]
    log.LOG.info("dashboard pushed:\n  " + "\n  ".join(urls))
    return {"spec": str(path), "urls": urls}


def load_spec(path) -> dict:
    return read_json(path)                  # a corrupt spec is one line naming it
