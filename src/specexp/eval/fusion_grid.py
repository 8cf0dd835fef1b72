"""`task=replay replay.fusion_grid.alpha=[...] replay.fusion_grid.beta=[...]`: DeLS-Spec's alpha/beta grid
(the paper's Figure 2) in one pass over the references.

Greedy replay of a sequential drafter (DeLS-Spec's local heads) at weights (alpha, beta) needs, at every anchor
of a reference, how many leading drafts equal it. While they do, the head's loop state is the state after the
reference's own tokens, whatever the weights (drafters/head_loop.py, `matches_all`), so one teacher-forced
pass of backbone and head per turn serves every cell: only the fusion `long + alpha W z - beta log_prior` and its
argmax run per cell. Each cell's rounds are then walked exactly as task=replay walks them (`replay_turn`).

Writes one run directory per cell, `<run dir>/a<alpha>_b<beta>/`, each holding what `task=replay
fusion.alpha=<alpha> fusion.beta=<beta>` writes there (the same run.json settings, config.yaml with those weights,
samples.jsonl, summary.json / .md): a cell resumes like any replay run, compares with any other (task=compare),
and experiments/dels_alpha_beta.py reads the directory as it reads a Hydra multirun. Plus `grid.md`, macro τ
(τ includes the bonus token) over the grid. tests/eval/test_fusion_grid.py checks cells against task=replay.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from .. import log
from ..config import Config, FusionGridConfig
from ..decoding.engine import drafts_per_round
from ..drafters.dels import DeLSDrafter
from ..errors import check
from ..files import write_text_atomic
from ..kernels.adaptive import Schedule
from ..tracking import run_info
from . import run, shards
from .references import turns_with_prompts
from .replay import (
    budget,
    build_references,
    cached_teacher_forced,
    replay_record,
    replay_settings,
    replay_turn,
    run_settings,
    tap_file,
)
from .store import ResultStore


def cell_name(alpha, beta: float | None = None) -> str:
    """`a<alpha>_b<beta>` of a fixed cell; an adaptive cell (a Schedule) is named by its form (entropy, gate)."""
    if isinstance(alpha, Schedule):
        return alpha.kind
    return f"a{alpha:g}_b{beta:g}"


def grid_cells(grid: FusionGridConfig) -> list[tuple[float, float]]:
    """The (alpha, beta) pairs of `replay.fusion_grid` (lists of finite numbers, config.py), alpha-major; both lists
    must be given, without repeats."""
    check(grid.alpha is not None and grid.beta is not None,
          f"replay.fusion_grid needs both lists (alpha={grid.alpha}, beta={grid.beta}), e.g. "
          f"replay.fusion_grid.alpha='[0,0.3]' replay.fusion_grid.beta='[0,0.3]'")
    alphas, betas = list(grid.alpha), list(grid.beta)
    for name, vals in (("alpha", alphas), ("beta", betas)):
        check(len(set(vals)) == len(vals), f"replay.fusion_grid.{name}={vals} repeats a value")
    alphas, betas = [float(a) for a in alphas], [float(b) for b in betas]
    return [(a, b) for a in alphas for b in betas]


@torch.inference_mode()
def grid_turn(drafter, prompt: list[int], ref: list[int], tf: dict, dc, near_tie: float,
              cells: list[tuple[float, float]]) -> list[tuple]:
    """One turn replayed at every cell: [(generation, near-tie rounds)] in the order of `cells`."""
    k_max, anchors = drafts_per_round(drafter, dc), len(ref) - 1
    ks = [budget(j, k_max, dc) for j in range(anchors)]
    if anchors > 0:
        m = drafter.matches_all(tf["taps"], torch.tensor(prompt + ref), len(prompt) + torch.arange(anchors),
                                torch.tensor(ks), cells).tolist()                               # [C][L-1]
    else:
        m = [[] for _ in cells]
    out = []
    for row in m:      # the drafts that give these matches: the reference's next n tokens, then none (-1)
        known = [ref[j + 1: j + 1 + n] + [-1] * (k_max - n) for j, n in enumerate(row)]
        out.append(replay_turn(drafter, prompt, ref, tf, dc, near_tie, known=known))
    return out


def run_grid(cfg, out_dir: Path, typed: Config | None = None) -> dict:
    """Every cell of `replay.fusion_grid` (module docstring); returns {cell name: summary}."""
    out_dir, sel = Path(out_dir), run.select(cfg, typed)
    typed, device, samples = sel.typed, sel.device, sel.samples
    rp, ev = replay_settings(typed), typed.eval
    cells = grid_cells(rp.fusion_grid)
    m = run.build(cfg, sel)                                      # DeLS: eval.draft_vocab is refused for it
    target, drafter, round_metrics, dc = m.target, m.drafter, m.round_metrics, m.dc
    check(isinstance(drafter, DeLSDrafter),
          f"replay.fusion_grid needs a drafter with fusion weights (dels_rnn, dels_markov); "
          f"got drafter={cfg.drafter.name}")
    refs = build_references(cfg, target, samples, dc, rp, typed.target)
    if rp.references_only:
        return {}
    # Each cell is the run `task=replay fusion.alpha=a fusion.beta=b` would be: its config, its settings.
    cfgs = [OmegaConf.merge(cfg, {"fusion": {"alpha": a, "beta": b, "adaptive": None, "schedule": {}},
                                  "replay": {"fusion_grid": {"alpha": None, "beta": None}}})
            for a, b in cells]
    if drafter.schedule is not None:       # fusion.adaptive: one more cell, the run `task=replay fusion=<form>` is
        cells.append(drafter.schedule)
        cfgs.append(OmegaConf.merge(cfg, {"replay": {"fusion_grid": {"alpha": None, "beta": None}}}))
    taps = drafter.tap_layers
    with contextlib.ExitStack() as stack:
        entry = shards.entry(sel.selected, sel.shard)
        stores = [stack.enter_context(ResultStore(out_dir / _name(c), run_settings(cc, typed, device, refs),
                                                  samples, entry)) for c, cc in zip(cells, cfgs)]
        info = {**run_info(device), "target_source": target.source, "references": str(refs.dir)}
        for cc, store in zip(cfgs, stores):
            run.start(cc, store.dir, info)
        done_by = [s.done() for s in stores]                  # only this loop appends: computed once
        todo = [s for s in samples if any((s.benchmark, s.id) not in d for d in done_by)]
        bar = tqdm(todo, desc=f"alpha/beta grid ({len(cells)} cells) of {cfg.drafter.name} on {target.name}",
                   unit="sample", disable=not ev.progress, dynamic_ncols=True)
        for sample in bar:
            ref, per_cell = refs.get(sample), [[] for _ in cells]
            for turn, prompt, tokens in turns_with_prompts(target, sample, ref):
                tf = cached_teacher_forced(target, prompt, tokens, taps, tap_file(rp, refs, taps, ref["key"], turn))
                text = target.decode(tokens)                  # the reference's text: the same in every cell
                for recs, (gen, ties) in zip(per_cell, grid_turn(drafter, prompt, tokens, tf, dc, rp.near_tie, cells)):
                    recs.append(replay_record(sample, turn, gen, ties, tf, text, ev.save_text, round_metrics))
            for store, done, recs in zip(stores, done_by, per_cell):
                if (sample.benchmark, sample.id) not in done:
                    store.append(recs)
        out = {}
        for c, cc, store in zip(cells, cfgs, stores):   # one W&B run per cell (job type grid): Figure 2's points
            name = f"{cfg.drafter.name}-{target.name} {_name(c)}"
            logger = run.logger(typed, cc, store.dir, name, job_type="grid")
            out[_name(c)] = run.finish(cc, store.dir, store.records, sel, m, logger, "grid", mode="replay")[0]
    md = grid_markdown(cells, out, cfg.drafter.name)
    write_text_atomic(out_dir / "grid.md", md)
    log.table(md)
    return out


def _name(cell) -> str:
    return cell_name(cell) if isinstance(cell, Schedule) else cell_name(*cell)


def grid_markdown(cells, summaries: dict, drafter: str) -> str:
    adaptive = [c for c in cells if isinstance(c, Schedule)]
    cells = [c for c in cells if not isinstance(c, Schedule)]
    alphas = sorted({a for a, _ in cells})
    betas = sorted({b for _, b in cells})
    lines = [f"# {drafter}: macro τ by fusion weights (replay; τ includes the bonus token)", "",
             "| α \\ β | " + " | ".join(f"{b:g}" for b in betas) + " |", "|---|" + "---:|" * len(betas)]
    for a in alphas:
        row = [summaries.get(cell_name(a, b)) for b in betas]
        lines.append(f"| {a:g} | " + " | ".join("–" if s is None else f"{s['macro']['tau']:.3f}" for s in row) + " |")
    for c in adaptive:
        lines += ["", f"adaptive cell {c.kind} ({c.describe()}): macro τ {summaries[c.kind]['macro']['tau']:.3f}"]
    best = max(summaries, key=lambda n: summaries[n]["macro"]["tau"])
    ci = summaries[best]["macro"].get("tau_ci95")
    lines += ["", f"best: {best}, macro τ {summaries[best]['macro']['tau']:.3f}"
              + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")]
    return "\n".join(lines) + "\n"
