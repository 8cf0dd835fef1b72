"""The papers' numbers (experiments/paper_values.yaml) and the one formatting of "measured / paper / difference"
that every table script prints. Never imported by the library; the scripts import it from experiments/.

    python experiments/paper_values.py            # every transcribed table: its citation and how many rows it holds
"""
from pathlib import Path

import yaml

FILE = Path(__file__).with_name("paper_values.yaml")
BENCH = ["gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt_bench", "alpaca"]


def load(path: Path = FILE) -> dict:
    return yaml.safe_load(path.read_text())


def cite(table: dict) -> str:
    """'DeLS-Spec, arXiv 2607.07409, Table 1' (+ 'unchecked' when transcribed from a quotation)."""
    return f"{table['paper']}, {table['table']}" + ("" if table.get("checked") else " (unchecked transcription)")


def run_key(summary: dict, config: dict | None = None) -> dict:
    """What a paper row is matched on: target, temperature, drafter (+ '_learned' with learned α/β)."""
    fusion = (config or {}).get("fusion") or {}
    drafter = summary["drafter"] + ("_learned" if "learned" in (fusion.get("alpha"), fusion.get("beta")) else "")
    return {"target": summary["target"], "temperature": float(summary["decoding"]["temperature"]), "drafter": drafter}


def find_row(table: dict, **key) -> dict | None:
    """The paper row whose stated fields all equal `key` (a field the row does not state does not match)."""
    for row in table.get("rows") or []:
        if all(k in row and (float(row[k]) == float(v) if isinstance(v, float) else row[k] == v)
               for k, v in key.items()):
            return row
    return None


def num(v, fmt: str = ".2f", ci=None) -> str:
    if v is None:
        return "–"
    return f"{v:{fmt}}" + (f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "")


def diff(measured, paper, fmt: str = "+.2f") -> str:
    return "–" if measured is None or paper is None else f"{measured - paper:{fmt}}"


def measured(summary: dict, metric: str, col: str):
    """(value, 95% CI or None) of `metric` (tau | speedup) for a benchmark column or 'macro'."""
    e = summary["macro"] if col == "macro" else summary["benchmarks"].get(col)
    if e is None:
        return None, None
    return e.get(metric), (e.get(f"{metric}_ci95") if metric == "tau" else None)


def compare_rows(label: str, summary: dict, paper_row: dict | None, table: dict, cols: list[str],
                 metrics=("tau", "speedup")) -> list[str]:
    """Markdown rows: per metric, the measured values (with 95% CIs when the summary has them), the paper's, and
    measured − paper; a paper cell the table does not state prints '–'."""
    lines = []
    for m in metrics:
        name = "τ" if m == "tau" else "speedup"
        vals = [measured(summary, m, c) for c in cols]
        own = [b for b in (paper_row or {}).get(m, {}) if b != "macro"]
        if "macro" in cols and own and set(own) != set(summary["benchmarks"]):
            # the paper averages over its own columns: the measured macro beside it is over the same ones (no CI)
            got = [summary["benchmarks"].get(b, {}).get(m) for b in own]
            vals[cols.index("macro")] = (None if None in got else sum(got) / len(got), None)
        paper = [(paper_row or {}).get(m, {}).get(c) for c in cols]
        lines.append(f"| {label} | {name} measured | " + " | ".join(num(v, ci=ci) for v, ci in vals) + " |")
        missing = "no row for this run" if table.get("rows") else "not transcribed"
        where = f"{table['table']}, {paper_row['row']}" if paper_row else f"{table['table']}: {missing}"
        lines.append(f"| | {name} paper ({where}) | " + " | ".join(num(p) for p in paper) + " |")
        lines.append(f"| | {name} Δ (measured − paper) | " + " | ".join(diff(v, p) for (v, _), p in zip(vals, paper))
                     + " |")
    return lines


def comparison(table_id: str, runs: list[tuple[str, dict, dict]], title: str | None = None) -> str:
    """The whole measured-beside-paper table for `runs` = [(label, summary, config)]: one column per benchmark
    that any run or the paper row has, in the paper's order, then macro."""
    table = load()[table_id]
    present = {b for _, s, _ in runs for b in s["benchmarks"]}
    cols = [b for b in BENCH if b in present] + sorted(present - set(BENCH)) + ["macro"]
    lines = [f"{title or table['table']}: measured next to {cite(table)}; {table['setting']}. Where a paper row "
             "exists, the measured macro is the mean over the paper's benchmarks (the paper's average).", "",
             "| run | | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for label, s, cfg in runs:
        lines += compare_rows(label, s, find_row(table, **run_key(s, cfg)), table, cols)
    return "\n".join(lines) + "\n"


def main():
    for k, t in load().items():
        print(f"{k}: {cite(t)} — {len(t.get('rows') or [])} rows")


if __name__ == "__main__":
    main()
