"""`task=compare`: two runs on the same prompts, paired (formulas in eval/metrics.py).

Reads `samples.jsonl` of `compare.a` and `compare.b` (task=replay or task=eval, any mix), keeps the prompts both
have, and reports per benchmark τ_A, τ_B, Δτ = τ_A − τ_B with a paired-bootstrap 95% CI and the shares of prompts
where A / B has the higher τ; when both are online runs (task=eval), also each one's speedup over its own AR
baseline and Δspeedup with its paired CI (metrics.paired_speedup). Pairing is only meaningful on the same outputs:
turns whose output text hashes differ (another target, budget or prompt set; an online near-tie) are counted and
reported, not hidden.

A paired delta is a drafter's effect only when everything else is the same, so before any pairing two runs are
refused (one line naming what differs) when their target (name, hub id, revision, dtype, engine), decoding
(protocol, temperature, ...), token budget (`eval.max_new_tokens`) or prompts differ: a (benchmark, id) whose
prompt text differs, or no prompt in common. The drafter and its knobs may differ: that is the point.
`compare.allow_mismatch=true` pairs such runs anyway and prints what differs above the table (and keeps it in
compare.json as `mismatch`). What a run recorded decides: run.json's settings and prompt digests, summary.json's
decoding and budget; a fact only one run recorded is not compared. Online runs decoded at different
`eval.batch_size` are refused unless `compare.allow_batch_mismatch=true`: their speedups are throughputs at
different batches (replay's τ is the same at every batch, so a replay pairs with any).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from .. import log
from ..config import Config, checked
from ..errors import check
from ..files import write_json, write_text_atomic
from ..report.tables import run_kind
from ..rundir import RUN, SAMPLES, claimed_for, read_json, run_records, samples_path
from ..tracking import make_logger
from . import metrics

_log = log.get(__name__)


def load_records(run_dir) -> list[dict]:
    """A run's per-turn records: `samples.jsonl`, or `samples.jsonl.gz` in an archived copy of a run directory,
    read by the store's one reader (a torn last line dropped, any other bad line refused, fields checked)."""
    return run_records(run_dir)


def run_batch(run_dir) -> int | None:
    """The batch an online run decoded at (its summary's `batch_size`; 1 before the key existed), None for a replay
    run or a run without a summary."""
    s = Path(run_dir) / "summary.json"
    if not s.is_file():
        return None
    d = read_json(s)
    return d.get("batch_size", 1) if d.get("mode", "online") == "online" else None


def check_batches(a, b, allow: bool) -> None:
    ba, bb = run_batch(a), run_batch(b)
    check(allow or ba is None or bb is None or ba == bb,
          f"compare: {a} was decoded at eval.batch_size={ba} and {b} at {bb}; their speedups are throughputs at "
          f"different batches. Compare runs of one batch, or set compare.allow_batch_mismatch=true to pair them anyway")


TARGET_FACTS = ("name", "hub_id", "revision", "dtype", "engine")    # what makes the target's outputs what they are


def run_facts(run_dir) -> dict:
    """What must be equal for a paired comparison to measure only the drafter, as dotted keys; a fact the run did
    not record is absent (compared only when both runs have it)."""
    d, facts = Path(run_dir), {}
    if (d / "summary.json").is_file():
        s = read_json(d / "summary.json")
        facts |= {"target.name": s.get("target"), "max_new_tokens": s.get("max_new_tokens")}
        facts |= {f"decoding.{k}": v for k, v in (s.get("decoding") or {}).items()}
    if (d / RUN).is_file():
        settings = read_json(d / RUN).get("settings") or {}
        target = settings.get("target") or {}
        facts |= {f"target.{k}": target[k] for k in TARGET_FACTS if k in target}
        facts |= {f"decoding.{k}": v for k, v in (settings.get("decoding") or {}).items()}
        budget = (settings.get("eval") or {}).get("max_new_tokens", settings.get("max_new_tokens"))
        facts |= {"max_new_tokens": budget} if budget is not None else {}
    return {k: v for k, v in facts.items() if v is not None}


def run_prompts(run_dir) -> dict[tuple[str, str], str]:
    """{(benchmark, id): prompt digest} from run.json (empty for a run without one)."""
    f = Path(run_dir) / RUN
    plan = (read_json(f).get("samples") or {}) if f.is_file() else {}
    return {(b, i): h for b, ids in plan.items() if isinstance(ids, dict) for i, h in ids.items()}


def mismatches(a, b, ra: list[dict], rb: list[dict]) -> list[str]:
    """What makes runs `a` and `b` (with records `ra`, `rb`) unlike, one phrase each; [] when only the drafter
    differs."""
    fa, fb = run_facts(a), run_facts(b)
    out = [f"{k}: A {fa[k]!r}, B {fb[k]!r}" for k in sorted(fa.keys() & fb.keys()) if fa[k] != fb[k]]
    pa, pb = run_prompts(a), run_prompts(b)
    changed = sorted(k for k in pa.keys() & pb.keys() if pa[k] != pb[k])
    if changed:
        out.append(f"prompts: {len(changed)} (benchmark, id) pairs have different prompt text, e.g. "
                   f"{'/'.join(changed[0])}")
    ka, kb = ({(r["benchmark"], r["id"]) for r in rs} for rs in (ra, rb))
    if ra and rb and not ka & kb:
        out.append(f"prompts: none in common (A {len(ka)}, B {len(kb)} samples)")
    return out


def _label(run_dir) -> str:
    s = Path(run_dir) / "summary.json"
    if s.is_file():
        d = read_json(s)
        return f"{d.get('drafter', '?')} ({', '.join([d.get('mode', 'online'), *run_kind(d, run_dir)])}) {run_dir}"
    return str(run_dir)


def files_read(run_dir) -> str:
    """The files of a run that compare reads, as the footer names them: its records, and run.json and summary.json
    where the run has them (their facts are then compared; absent, they are not)."""
    d = Path(run_dir)
    path = samples_path(d)
    read = [path.name if path is not None else SAMPLES] + [n for n in (RUN, "summary.json") if (d / n).is_file()]
    missing = [n for n in (RUN, "summary.json") if n not in read]
    return ", ".join(read) + (f" (no {' nor '.join(missing)})" if missing else "")


def compare(a: list[dict], b: list[dict]) -> dict:
    names = list(dict.fromkeys(r["benchmark"] for r in a))
    ga = {n: [r for r in a if r["benchmark"] == n] for n in names}
    gb = {n: [r for r in b if r["benchmark"] == n] for n in names}
    per, macro = metrics.paired_comparison(ga, gb)
    ha = {(r["benchmark"], r["id"], r["turn"]): r.get("text_sha256") for r in a}
    hb = {(r["benchmark"], r["id"], r["turn"]): r.get("text_sha256") for r in b}
    common = ha.keys() & hb.keys()
    speed = metrics.paired_speedup(ga, gb)
    return {"benchmarks": per, "macro": macro, "turns_compared": len(common),
            "turns_with_different_outputs": sum(ha[k] != hb[k] for k in common),
            **({"speedup": {"benchmarks": speed[0], "macro": speed[1]}} if speed else {})}


def compare_markdown(result: dict) -> str:
    f = lambda x, fmt: "–" if x is None else format(x, fmt)                                    # noqa: E731
    ci = lambda c: "–" if c is None else f"[{c[0]:+.3f}, {c[1]:+.3f}]"                        # noqa: E731
    rows = [f"A = {result['a']}  \nB = {result['b']}\n"]
    if result.get("mismatch"):                  # compare.allow_mismatch=true: say what else differs, first
        rows += ["**Not like for like** (compare.allow_mismatch=true): A and B also differ in "
                 + "; ".join(result["mismatch"]) + ". The deltas below are not the drafter's effect alone.\n"]
    rows += [
            "| benchmark | prompts | τ A | τ B | Δτ (A − B) | 95% CI | A wins | ties | B wins |",
            "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, c in result["benchmarks"].items():
        rows.append(f"| {name} | {c['num_prompts']} | {f(c['tau_a'], '.3f')} | {f(c['tau_b'], '.3f')} | "
                    f"{f(c['delta'], '+.3f')} | {ci(c['delta_ci95'])} | {f(c['a_wins'], '.0%')} | "
                    f"{f(c['ties'], '.0%')} | {f(c['b_wins'], '.0%')} |")
    m = result["macro"]
    rows.append(f"| **macro** | | | | **{f(m['delta'], '+.3f')}** | {ci(m['delta_ci95'])} | | | |")
    rows.append(f"\nPaired bootstrap over prompts ({metrics.BOOTSTRAP_REPLICATES} replicates, seed "
                f"{metrics.BOOTSTRAP_SEED}); {result['turns_with_different_outputs']} of {result['turns_compared']} "
                f"common turns have different outputs in A and B.")
    if "speedup" in result:                     # both runs online: their speedups over their own AR, paired
        rows += ["", "| benchmark | prompts | speedup A | speedup B | Δ (A − B) | 95% CI |",
                 "|---|---:|---:|---:|---:|---|"]
        for name, c in result["speedup"]["benchmarks"].items():
            rows.append(f"| {name} | {c['num_prompts']} | {c['speedup_a']:.3f}× | {c['speedup_b']:.3f}× | "
                        f"{c['delta']:+.3f} | {ci(c['delta_ci95'])} |")
        m = result["speedup"]["macro"]
        rows.append(f"| **macro** | | | | **{m['delta']:+.3f}** | {ci(m['delta_ci95'])} |")
        rows.append("\nspeedup = mean AR TPOT / mean TPOT of each run, from its per-turn records (the formula of "
                    "summary.json, eval/metrics.py), paired over the same prompts; two runs also differ by the "
                    "machine's drift between them.")
    if "read" in result:
        rows.append(f"\nRead: A {result['read']['a']}; B {result['read']['b']}.")
    return "\n".join(rows) + "\n"


def compare_runs(a, b, allow_mismatch: bool = False, allow_batch_mismatch: bool = False) -> dict:
    """The paired comparison of run directories `a` and `b` (compare.json's content); refused (UserError) when the
    runs are unlike (`mismatches`) or of different batches, unless allowed."""
    check_batches(a, b, allow_batch_mismatch)
    ra, rb = load_records(a), load_records(b)
    unlike = mismatches(a, b, ra, rb)
    shown = "; ".join(unlike[:3]) + (f"; and {len(unlike) - 3} more" if len(unlike) > 3 else "")
    check(allow_mismatch or not unlike,
          f"compare: A={a} and B={b} are not runs of one experiment ({shown}): a paired delta would not be the "
          f"drafter's effect. Compare runs that differ only in the drafter, or set compare.allow_mismatch=true to "
          f"pair them anyway")
    if unlike:
        _log.warning(f"compare: pairing unlike runs (compare.allow_mismatch=true): {shown}")
    return {"a": _label(a), "b": _label(b), **({"mismatch": unlike} if unlike else {}), **compare(ra, rb),
            "read": {"a": files_read(a), "b": files_read(b)}}


def run_compare(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=compare`: compare.json and compare.md of `compare.a` against `compare.b` (`compare_runs`)."""
    typed = checked(cfg, typed)
    c = typed.compare
    check(c is not None and bool(c.a) and bool(c.b),
          "task=compare needs compare.a=DIR and compare.b=DIR (run directories)")
    result = compare_runs(c.a, c.b, c.allow_mismatch, c.allow_batch_mismatch)
    md = compare_markdown(result)
    with claimed_for(out_dir, "compare") as d:       # never into another run's directory, nor while one runs there
        write_json(d / "compare.json", result)
        write_text_atomic(d / "compare.md", md)
        logger = make_logger(typed.logger, d, OmegaConf.to_container(cfg, resolve=True), name="compare")
        logger.comparison(result)           # job type compare: compare/<benchmark>/delta, its CI, wins
        logger.artifact("compare", [d / "compare.json", d / "compare.md"])
        logger.finish()
    log.table(md)
    return {"macro": {"tau": result["macro"]["delta"]}}
