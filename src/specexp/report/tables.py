"""Tables from result summaries (markdown for the terminal and summary.md; CSV for spreadsheets)."""
from __future__ import annotations


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def summary_markdown(summary: dict) -> str:
    """The per-benchmark τ / speedup table of one evaluation run."""
    d = summary["decoding"]
    head = (f"**{summary['drafter']}** on **{summary['target']}**, {d['protocol']} decoding at T={d['temperature']}"
            f" (τ includes the bonus token; speedup = mean AR TPOT / mean TPOT, same engine, same prompts)\n\n")
    rows = ["| benchmark | samples | turns | τ | speedup | TPOT ms | AR TPOT ms | TTFT ms | lossless mismatches |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, b in summary["benchmarks"].items():
        rows.append(f"| {name} | {b['num_samples']} | {b['num_turns']} | {_f(b['tau'], '.2f')} | "
                    f"{_f(b['speedup'], '.2f')}{'' if b['speedup'] is None else '×'} | {_f(b['tpot_ms'], '.1f')} | "
                    f"{_f(b['tpot_ar_ms'], '.1f')} | {_f(b['ttft_ms'], '.0f')} | {_f(b['lossless_mismatches'], 'd')} |")
    m = summary["macro"]
    rows.append(f"| **macro** | | | **{_f(m['tau'], '.2f')}** | **{_f(m['speedup'], '.2f')}** | | | | |")
    return head + "\n".join(rows) + "\n"
