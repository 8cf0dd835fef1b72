"""DeLS-Spec Table 7: the learned per-position α_k / β_k of each head directory (fusion_weights.json, written by
`drafter.head.train.part=fusion_weights`), next to the paper's values and the difference. Never imported by the
library; loads no model.

    python -m specexp experiment=paper_fusion_learned_qwen3_8b                   # -> heads/qwen3_8b-dels-rnn
    python experiments/dels_table7.py heads/qwen3_8b-dels-rnn heads/qwen3_8b-dels-markov [--out table7.md]

Draft position k counts the drafted tokens from 1; k = 1 is DFlash's alone, so α/β start at k = 2.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paper_values import cite, diff, find_row, load, num  # noqa: E402

KIND = {"rnn": "dels_rnn", "markov": "dels_markov"}


def head_table(head: Path, table: dict) -> str:
    w = json.loads((head / "fusion_weights.json").read_text())
    card = json.loads((head / "card.json").read_text()) if (head / "card.json").exists() else {}
    target = card.get("target")
    drafter = KIND.get(card.get("head", {}).get("kind"), card.get("head", {}).get("kind"))
    row = find_row(table, target=target, drafter=drafter) or {}
    alpha, beta = w["alpha"], w["beta"]
    alpha = alpha if isinstance(alpha, list) else [alpha]
    beta = beta if isinstance(beta, list) else [beta] * len(alpha)
    pa, pb = row.get("alpha") or [], row.get("beta") or []
    where = f"{table['table']}, {row['row']}" if row else f"{table['table']}: not transcribed"
    lines = [f"### {head.name}: {drafter} on {target}, initialised at α={w.get('init', {}).get('alpha')}, "
             f"β={w.get('init', {}).get('beta')} (paper: {where})", "",
             "| draft position k | α learned | α paper | Δα | β learned | β paper | Δβ |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    at = (lambda xs, i: xs[i] if i < len(xs) else None)                                    # noqa: E731
    for i, (a, b) in enumerate(zip(alpha, beta)):
        lines.append(f"| {i + 2} | {num(a, '.3f')} | {num(at(pa, i), '.3f')} | {diff(a, at(pa, i), '+.3f')} | "
                     f"{num(b, '.3f')} | {num(at(pb, i), '.3f')} | {diff(b, at(pb, i), '+.3f')} |")
    lines.append(f"| mean | {num(sum(alpha) / len(alpha), '.3f')} | | | {num(sum(beta) / len(beta), '.3f')} | | |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+", type=Path, help="head directories holding fusion_weights.json (+ card.json)")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args(argv)
    missing = [str(h) for h in args.heads if not (h / "fusion_weights.json").exists()]
    if missing:
        sys.exit(f"no fusion_weights.json in {', '.join(missing)} (train it with drafter.head.train.part="
                 "fusion_weights, e.g. experiment=paper_fusion_learned_qwen3_8b)")
    table = load()["dels_t7"]
    text = (f"DeLS-Spec Table 7, learned per-position α/β, next to {cite(table)}\n\n"
            + "\n".join(head_table(h, table) for h in args.heads))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
