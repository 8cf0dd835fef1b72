"""DeLS-Spec Table 3 (residual-term comparison) and Table 5 (training cost): τ of DFlash, DeLS-Markov,
DeLS-RNN and Domino-FT per benchmark, with the gain ratio (τ_DeLS − τ_DFlash) / (τ_Domino − τ_DFlash), and the
training time / peak memory of each trained part from its card.json. Never imported by the library.

    python -m specexp experiment=mini_domino_ft          # trains the head -> runs/heads/smollm2_135m-domino-ft
    python -m specexp hydra.run.dir=runs/mini/dflash     # the committed b8 DFlash drafter
    python -m specexp drafter=dels_markov hydra.run.dir=runs/mini/dels_markov
    python -m specexp drafter=dels_rnn hydra.run.dir=runs/mini/dels_rnn
    python -m specexp drafter=domino_ft drafter.head.checkpoint=runs/heads/smollm2_135m-domino-ft \\
        hydra.run.dir=runs/mini/domino_ft
    python experiments/domino_table3.py runs/mini/dflash runs/mini/dels_markov runs/mini/dels_rnn runs/mini/domino_ft \\
        --cards checkpoints/mini/smollm2_135m-dflash-b8 checkpoints/mini/smollm2_135m-dels-markov \\
                checkpoints/mini/smollm2_135m-dels-rnn runs/heads/smollm2_135m-domino-ft
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from dels_table import cost_table  # noqa: E402
from paper_values import comparison  # noqa: E402


def gain(dels: float, dflash: float, dom: float) -> str:
    d = dom - dflash
    return "–" if abs(d) < 1e-9 else f"{(dels - dflash) / d:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=4, type=Path, help="dflash, dels_markov, dels_rnn, domino_ft run directories")
    ap.add_argument("--cards", nargs="*", type=Path, default=[], help="checkpoint directories or card.json files")
    ap.add_argument("--out", type=Path, help="where to write the markdown (default: RUN_DFLASH/table3.md)")
    args = ap.parse_args()
    s = [json.loads((r / "summary.json").read_text()) for r in args.runs]
    names = [n for n in s[0]["benchmarks"] if all(n in x["benchmarks"] for x in s)]
    tau = [[x["benchmarks"][n]["tau"] for n in names] + [x["macro"]["tau"]] for x in s]
    cols = names + ["macro"]
    lines = [f"Residual terms on {s[0]['target']} ({s[0]['decoding']['protocol']}, {s[0]['max_new_tokens']} new "
             "tokens); τ includes the bonus token", "", "| | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for x, row in zip(s, tau):
        lines.append(f"| {x['drafter']} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    for i, label in ((1, "gain ratio Markov / Domino-FT"), (2, "gain ratio RNN / Domino-FT")):
        gains = " | ".join(gain(tau[i][j], tau[0][j], tau[3][j]) for j in range(len(cols)))
        lines.append(f"| {label} | {gains} |")
    paper = comparison("dels_t3", [(x["drafter"], x, {}) for x in s], "DeLS-Spec Table 3")
    text = "\n".join(lines) + "\n\n" + paper + ("\n" + cost_table(args.cards) if args.cards else "")
    (args.out or args.runs[0] / "table3.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
