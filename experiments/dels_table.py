"""DeLS-Spec next to DFlash: τ (and speedup) per benchmark for each evaluated drafter, plus the training cost
of each trained part (paper Table 5) from the cards written by task=train. Never imported by the library.

    python -m specexp hydra.run.dir=runs/mini/dflash                       # committed b8 DFlash
    python -m specexp drafter=dels_markov hydra.run.dir=runs/mini/dels_markov
    python -m specexp drafter=dels_rnn hydra.run.dir=runs/mini/dels_rnn
    python experiments/dels_table.py runs/mini/dflash runs/mini/dels_markov runs/mini/dels_rnn \\
        --cards checkpoints/mini/smollm2_135m-dels-markov checkpoints/mini/smollm2_135m-dels-rnn

Writes tables.md beside the first run (τ includes the bonus token; speedup is CPU wall time for the mini target).
"""
import argparse
import json
from pathlib import Path

import yaml


def label(run: Path, s: dict) -> str:
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").exists() else {}
    if s["drafter"].startswith("dels"):
        fu = cfg.get("fusion", {})
        return f"{s['drafter']} (α={fu.get('alpha')}, β={fu.get('beta')})"
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


def cost_table(cards: list[Path]) -> str:
    lines = ["Training cost of the trained parts (card.json; peak memory = CUDA allocator peak on GPU, process max "
             "RSS on CPU)", "", "| part | trainable params | steps | time | peak memory |", "|---|---:|---:|---:|---:|"]
    for c in cards:                                   # a checkpoint directory or a card.json itself
        card = json.loads((c / "card.json" if c.is_dir() else c).read_text())
        head = card.get("head", {})
        kind = head.get("kind") or ("domino" if head.get("architecture") == "domino_head" else "dflash")
        params = card.get("trainable_params")
        n_params = "–" if params is None else f"{params:,}"
        lines.append(f"| {c.name if c.is_dir() else c.stem} ({kind}) | {n_params} | {card['steps']} | "
                     f"{card['train_seconds'] / 60:.1f} min | {card['peak_memory_mb'] / 1024:.2f} GiB |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="eval run directories (summary.json); the first is the baseline")
    ap.add_argument("--cards", nargs="*", type=Path, default=[], help="trained checkpoint directories (card.json)")
    args = ap.parse_args()
    text = tau_table(args.runs) + ("\n" + cost_table(args.cards) if args.cards else "")
    (args.runs[0] / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
