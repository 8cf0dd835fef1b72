"""DeLS-Spec next to DFlash: τ (and speedup) per benchmark for each evaluated drafter, plus the training cost
of each trained part (paper Table 5) from the cards written by task=train. Never imported by the library.

    python -m specexp hydra.run.dir=runs/mini/dflash                       # committed b8 DFlash
    python -m specexp drafter=dels_markov hydra.run.dir=runs/mini/dels_markov
    python -m specexp drafter=dels_rnn hydra.run.dir=runs/mini/dels_rnn
    python experiments/dels_table.py runs/mini/dflash runs/mini/dels_markov runs/mini/dels_rnn \\
        --cards checkpoints/mini/smollm2_135m-dels-markov checkpoints/mini/smollm2_135m-dels-rnn

DeLS-Spec Tables 1, 2 and 4 are this script with the paper table named (its cells from
experiments/paper_values.yaml, printed beside the measured ones with the difference and, when the summaries have
them, 95% CIs; see README "Reproducing the papers"):
    python experiments/dels_table.py R/dflash_t0 R/dels_markov_t0 R/dels_rnn_t0 R/dflash_t1 R/dels_markov_t1 \\
        R/dels_rnn_t1 --paper dels_t1                                       # Table 1: T = 0 and T = 1 (protocol A)
    (Table 1's EAGLE-3 baseline rows: `python -m specexp experiment=paper_eagle3_qwen3_8b drafter.checkpoint=CKPT
    hydra.run.dir=R/eagle3_t0`, then R/eagle3_t0 among the runs; labelled with its tree size, as the paper does)
    python experiments/dels_table.py R/dflash_b7 R/dels_rnn_b7 R/dels_markov_b7 --paper dels_t2   # Table 2 (block 7)
    python experiments/dels_table.py R/dels_rnn_t0 R/dels_rnn_learned_t0 --paper dels_t4          # Table 4
and Table 5 is --cards (peak allocated and peak reserved CUDA memory, next to the paper's hours and GB).

Writes tables.md beside the first run (τ includes the bonus token; speedup is CPU wall time for the mini target).
"""
import argparse
import json
import sys
from pathlib import Path

import yaml

from specexp.training.pipeline import timed_from

sys.path.insert(0, str(Path(__file__).parent))
from paper_values import cite, comparison, diff, find_row, load, num  # noqa: E402


def label(run: Path, s: dict) -> str:
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").exists() else {}
    if s["drafter"].startswith("dels"):
        fu = cfg.get("fusion", {})
        return f"{s['drafter']} (α={fu.get('alpha')}, β={fu.get('beta')})"
    if s["drafter"] == "eagle3":                       # Table 1 gives a tree drafter's tree size in parentheses
        d = cfg.get("drafter", {})
        if d.get("mode") == "tree":
            return f"eagle3 ({d.get('tree', {}).get('total_tokens')})"
        return f"eagle3 (chain, K={d.get('num_drafts')})"
    return s["drafter"]


def ci(entry: dict) -> str:
    """The 95% CI of τ when the summary has one (every summary written since CIs were added)."""
    c = entry.get("tau_ci95")
    return f" [{c[0]:.2f}, {c[1]:.2f}]" if c else ""


def tau_table(runs: list[Path]) -> str:
    sums = [json.loads((r / "summary.json").read_text()) for r in runs]
    names = list(sums[0]["benchmarks"])
    s0 = sums[0]
    lines = [f"τ per benchmark on {s0['target']} ({s0['decoding']['protocol']}, {s0['max_new_tokens']} new tokens, "
             f"{s0['benchmarks'][names[0]]['num_samples']} samples per benchmark)", "",
             "| drafter | " + " | ".join(names) + " | macro τ | macro speedup |", "|---|" + "---:|" * (len(names) + 2)]
    for r, s in zip(runs, sums):
        cells = [f"{s['benchmarks'][n]['tau']:.2f}{ci(s['benchmarks'][n])}" if n in s["benchmarks"] else "–"
                 for n in names]
        sp = s["macro"].get("speedup")                  # replay summaries have none
        lines.append(f"| {label(r, s)} | " + " | ".join(cells) + f" | {s['macro']['tau']:.3f}{ci(s['macro'])} | "
                     f"{'–' if sp is None else f'{sp:.2f}×'} |")
    base = sums[0]["macro"]["tau"]
    lines += ["", "macro τ relative to the first row: " + ", ".join(
        f"{s['drafter']} {s['macro']['tau'] / base - 1:+.1%}" for s in sums[1:])]
    return "\n".join(lines) + "\n"


PART = {"rnn": "dels_rnn", "markov": "dels_markov", "domino": "domino_ft", "dflash": "dflash"}


def unit(cell: str, u: str) -> str:
    return cell if cell == "–" else cell + u


def gib(mb) -> str:
    return "–" if mb is None else f"{mb / 1024:.2f} GiB"


def cost_table(cards: list[Path]) -> str:
    """DeLS-Spec Table 5: time and peak memory of each trained part; on CUDA both the allocator's peak allocated and
    its peak reserved memory (on CPU the process max RSS, in the allocated column), next to the paper's cell."""
    table = load()["dels_t5"]
    lines = ["Training cost of the trained parts (card.json; peak allocated = CUDA allocator peak on GPU, process max "
             "RSS on CPU; peak reserved = CUDA caching allocator, GPU only), next to " + cite(table), "",
             "| part | trainable params | steps | time | peak allocated | peak reserved | paper time | paper memory "
             "| Δ time | Δ memory |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cards:                                   # a checkpoint directory or a card.json itself
        card = json.loads((c / "card.json" if c.is_dir() else c).read_text())
        head = card.get("head", {})
        kind = head.get("kind") or ("domino" if head.get("architecture") == "domino_head"
                                    or card.get("kind") == "domino_ft" else card.get("kind") or "dflash")
        params = card.get("trainable_params")
        n_params = "–" if params is None else f"{params:,}"
        row = find_row(table, target=card.get("target"), part=PART.get(kind, kind)) or {}
        hours, mem = card["train_seconds"] / 3600, card["peak_memory_mb"] * 2**20 / 1e9     # MiB -> GB (the paper)
        p_time = "OOM" if row.get("oom") else unit(num(row.get("hours"), ".1f"), " h")
        p_mem = "OOM" if row.get("oom") else unit(num(row.get("memory_gb"), ".1f"), " GB")
        lines.append(f"| {c.name if c.is_dir() else c.stem} ({kind}) | {n_params} | {card['steps']} | "
                     f"{card['train_seconds'] / 60:.1f} min{timed_from(card, short=True)} | "
                     f"{gib(card['peak_memory_mb'])} | "
                     f"{gib(card.get('peak_memory_reserved_mb'))} | {p_time} | {p_mem} | "
                     f"{unit(diff(hours, row.get('hours'), '+.1f'), ' h')} | "
                     f"{unit(diff(mem, row.get('memory_gb'), '+.1f'), ' GB')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="eval run directories (summary.json); the first is the baseline")
    ap.add_argument("--cards", nargs="*", type=Path, default=[], help="trained checkpoint directories (card.json)")
    ap.add_argument("--paper", choices=["dels_t1", "dels_t2", "dels_t4"], default="dels_t1",
                    help="the paper table whose cells are printed beside the runs (experiments/paper_values.yaml)")
    ap.add_argument("--out", type=Path, help="where to write the markdown (default: RUN1/tables.md)")
    args = ap.parse_args()
    runs = []
    for r in args.runs:
        s = json.loads((r / "summary.json").read_text())
        cfg = yaml.safe_load((r / "config.yaml").read_text()) if (r / "config.yaml").exists() else {}
        runs.append((f"{label(r, s)} T={s['decoding']['temperature']:g}", s, cfg))
    text = (tau_table(args.runs) + "\n" + comparison(args.paper, runs)
            + ("\n" + cost_table(args.cards) if args.cards else ""))
    (args.out or args.runs[0] / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
