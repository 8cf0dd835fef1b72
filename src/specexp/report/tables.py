"""Tables from result summaries (markdown for the terminal and summary.md; CSV for spreadsheets)."""
from __future__ import annotations


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def ci(c, fmt: str = ".2f") -> str:
    """A 95% interval `[lo, hi]` as text; – when there is none."""
    return "–" if not c else f"[{format(c[0], fmt)}, {format(c[1], fmt)}]"


def _ties(b: dict) -> str:
    """Lossless mismatches at an argmax near-tie, after the failures: `0 (+2 near-tie)`."""
    n = b.get("lossless_near_ties")
    return f" (+{n} near-tie)" if n else ""


def run_kind(summary: dict, run_dir=None) -> list[str]:
    """What sets a run apart besides its drafter, for its label: "tree" (draft trees: run.json's drafter.mode, which
    summary.json does not record) and "batch B" (an online run decoded B rows side by side: its speedups are
    throughputs at that batch)."""
    import json
    from pathlib import Path

    kind = []
    try:
        settings = json.loads((Path(run_dir) / "run.json").read_text())["settings"] if run_dir is not None else {}
        if (settings.get("drafter") or {}).get("mode") == "tree":
            kind.append("tree")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):    # no or an old run.json: nothing to add
        pass
    b = summary.get("batch_size", 1)
    if summary.get("mode", "online") == "online" and isinstance(b, int) and b > 1:
        kind.append(f"batch {b}")
    return kind


def summary_markdown(summary: dict) -> str:
    """The per-benchmark table of one run: τ with its 95% CI, and speedup/TPOT (online) or near-ties (replay)."""
    d = summary["decoding"]
    replay = summary.get("mode") == "replay"
    m = summary["macro"]
    if replay:
        src = summary.get("references_source") or {"name": "specexp"}
        by = (f" decoded by {src.get('distribution', src['name'])} {src.get('version', '')} in {src.get('dtype')}"
              if src["name"] != "specexp" else "")
        head = (f"**{summary['drafter']}** on **{summary['target']}**, replayed on the target's greedy references{by} "
                f"(τ includes the bonus token; 95% CI: bootstrap over prompts; near-tie rounds: a target top-2 logit "
                f"gap below the threshold among the verified positions)\n\n")
        rows = ["| benchmark | samples | turns | τ | τ 95% CI | rounds | near-tie rounds | TF argmax ≠ ref |",
                "|---|---:|---:|---:|---|---:|---:|---:|"]
        for name, b in summary["benchmarks"].items():
            rows.append(f"| {name} | {b['num_samples']} | {b['num_turns']} | {_f(b['tau'], '.3f')} | "
                        f"{ci(b.get('tau_ci95'), '.3f')} | {b['rounds']} | {b['near_tie_rounds']} | "
                        f"{b['tf_argmax_mismatches']} |")
        rows.append(f"| **macro** | | | **{_f(m['tau'], '.3f')}** | {ci(m.get('tau_ci95'), '.3f')} | | | |")
        return head + "\n".join(rows) + "\n"
    # A run that timed a subset (eval.timed_samples, eval/shards.py) says how many prompts its speedup stands on.
    timed = summary.get("timed")
    subset = (f"; speedup, TPOT and TTFT over a seeded subset of the prompts (eval.timed_samples={timed['samples']}, "
              f"seed {timed['seed']}), τ over all") if timed else ""
    b = summary.get("batch_size", 1)
    subset += (f"; {b} sequences decoded side by side (eval.batch_size), so TPOT is a row's wall time per token "
               f"and the speedup a ratio of throughputs at that batch") if b > 1 else ""
    head = (f"**{summary['drafter']}** on **{summary['target']}**, {d['protocol']} decoding at T={d['temperature']}"
            f" (τ includes the bonus token; 95% CI: bootstrap over prompts; speedup = mean AR TPOT / mean TPOT, "
            f"same engine, same prompts{subset})\n\n")
    rows = ["| benchmark | samples | turns | τ | τ 95% CI | speedup | " + ("timed | " if timed else "")
            + "TPOT ms | AR TPOT ms | TTFT ms | lossless mismatches |",
            "|---|---:|---:|---:|---|---:|" + ("---:|" if timed else "") + "---:|---:|---:|---:|"]
    for name, b in summary["benchmarks"].items():
        rows.append(f"| {name} | {b['num_samples']} | {b['num_turns']} | {_f(b['tau'], '.2f')} | "
                    f"{ci(b.get('tau_ci95'))} | "
                    f"{_f(b['speedup'], '.2f')}{'' if b['speedup'] is None else '×'} | "
                    + (f"{b.get('timed_samples', '–')} | " if timed else "")
                    + f"{_f(b['tpot_ms'], '.1f')} | {_f(b['tpot_ar_ms'], '.1f')} | {_f(b['ttft_ms'], '.0f')} | "
                    f"{_f(b['lossless_mismatches'], 'd')}{_ties(b)} |")
    rows.append(f"| **macro** | | | **{_f(m['tau'], '.2f')}** | {ci(m.get('tau_ci95'))} | "
                f"**{_f(m['speedup'], '.2f')}** | " + ("| " if timed else "") + "| | | |")
    return head + "\n".join(rows) + "\n" + machine_line(summary)


def machine_line(summary: dict) -> str:
    """Where an online run was measured (summaries made before this was recorded have none): timings and, in bf16,
    the near-ties depend on it."""
    m = summary.get("machine")
    if not m:
        return ""
    one = m if isinstance(m, dict) else m[0]
    where = one.get("gpu") or one["cpu"]
    flags = ", ".join(one["cpu_flags"]) or "none of avx2/avx512"
    more = "" if isinstance(m, dict) else f" (and {len(m) - 1} other machine(s): shards)"
    return (f"\nTarget in {summary.get('target_dtype', '?')} on {where} (CPU flags: {flags}; "
            f"{one['torch_threads']} torch threads){more}.\n")


def multirun_markdown(jobs: list[dict], swept: list[str]) -> str:
    """A multirun's table (cli.sweep_table builds `jobs`): one row per job, its swept overrides (the keys whose
    values differ between jobs) -> macro τ with its 95% CI and macro speedup, as each job's summary.json has them;
    a failed job shows its error line, a job of a task without a summary (train, a fusion grid) dashes."""
    head = ["job", *swept, "macro τ", "τ 95% CI", "macro speedup", "status"]
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---|" * len(swept) + "---:|---|---:|---|"]
    for j in jobs:
        values = [str(j["swept"].get(k, "–")).replace("|", "\\|") for k in swept]
        status = "failed: " + j["error"].replace("|", "\\|") if j.get("error") else "ok"
        rows.append(f"| {j['job']} | " + " | ".join([*values, _f(j.get("tau"), ".3f"), ci(j.get("tau_ci95"), ".3f"),
                                                     _f(j.get("speedup"), ".2f"), status]) + " |")
    return "\n".join(rows) + "\n"
