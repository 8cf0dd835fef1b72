"""Block verification against protocol B at T = 1, paired over prompts, several sampling seeds (issue #50).

    python experiments/block_verification.py --runs outputs/block_verification --samples 4 --tokens 64 \\
        --out experiments/results/block_verification

For every drafter (default: dflash, dels_rnn, eagle3 as a chain) and seed, `task=eval` runs once under
`decoding=sample_b` and once under `decoding=sample_block` on the same prompts (`eval.run_ar=false`: τ only, no
timing), each into RUNS/<drafter>/<protocol>-s<seed> (a rerun resumes them; a larger --samples adds prompts to
them). Protocol B and block verification verify the same kind of drafts (sampled from the drafter's q), so the
difference is the verification rule alone; with the same seed both start from the same per-turn stream (the same
drafts and uniforms until their verdicts first differ), which makes the paired difference less noisy.

Pairing: per drafter, the records of all seeds are pooled, so each prompt's τ is the mean over its seeds' turns
and the paired bootstrap resamples prompts with all their seeds (eval/metrics.py `paired_comparison`, the code
of `task=compare`). Δτ = τ(block) − τ(B), τ including the bonus token. Writes OUT/README.md (the table, the
command, the machine) and OUT/block_verification.json. Never imported by the library.
"""
import argparse
import json
import time
from pathlib import Path

import specexp
from specexp.eval.compare import load_records
from specexp.eval.metrics import paired_comparison, tau
from specexp.machine import cpu_info

DRAFTERS = {"dflash": [], "dels_rnn": [], "eagle3": ["drafter.mode=chain"]}
PROTOCOLS = {"B": "sample_b", "block": "sample_block"}


def run_all(runs: Path, drafters, seeds, samples: int, tokens: int, benchmark: str) -> dict:
    """{drafter: {protocol: [records of every seed]}}, running what is missing."""
    out = {}
    for d in drafters:
        for proto, preset in PROTOCOLS.items():
            recs = []
            for seed in seeds:
                where = runs / d / f"{proto}-s{seed}"
                t0 = time.time()          # a finished run resumes with nothing to do; more --samples add prompts
                specexp.evaluate([f"drafter={d}", *DRAFTERS.get(d, []), f"decoding={preset}", f"seed={seed}",
                                  f"benchmark={benchmark}", f"eval.num_samples={samples}",
                                  f"eval.max_new_tokens={tokens}", "eval.run_ar=false", "logger=none",
                                  "eval.progress=false"], out_dir=where)
                print(f"{d} {proto} seed {seed}: {time.time() - t0:.0f} s", flush=True)
                recs += load_records(where)
            out.setdefault(d, {})[proto] = recs
    return out


def by_bench(recs):
    names = list(dict.fromkeys(r["benchmark"] for r in recs))
    return {n: [r for r in recs if r["benchmark"] == n] for n in names}


def table(results: dict, seeds, samples: int, tokens: int) -> tuple[str, dict]:
    f = lambda x: "–" if x is None else f"{x:.3f}"                                       # noqa: E731
    ci = lambda c: "–" if not c else f"[{c[0]:+.3f}, {c[1]:+.3f}]"                      # noqa: E731
    rows = ["| drafter | benchmark | prompts | τ B | τ block | Δτ (block − B) | 95% CI | block wins | ties | B wins |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    data = {}
    for d, r in results.items():
        per, macro = paired_comparison(by_bench(r["block"]), by_bench(r["B"]))
        data[d] = {"benchmarks": per, "macro": macro, "tau_b": tau(r["B"]), "tau_block": tau(r["block"])}
        for name, c in per.items():
            rows.append(f"| {d} | {name} | {c['num_prompts']} | {f(c['tau_b'])} | {f(c['tau_a'])} | "
                        f"{c['delta']:+.3f} | {ci(c['delta_ci95'])} | {c['a_wins']:.0%} | {c['ties']:.0%} | "
                        f"{c['b_wins']:.0%} |")
        rows.append(f"| **{d}** | **macro** | | | | **{macro['delta']:+.3f}** | {ci(macro['delta_ci95'])} | | | |")
    return "\n".join(rows), data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("outputs/block_verification"))
    ap.add_argument("--out", type=Path, default=None, help="directory for README.md and block_verification.json")
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--samples", type=int, default=4, help="prompts per benchmark (eval.num_samples)")
    ap.add_argument("--tokens", type=int, default=128, help="eval.max_new_tokens")
    ap.add_argument("--benchmark", default="all")
    a = ap.parse_args()
    results = run_all(a.runs, a.drafters, a.seeds, a.samples, a.tokens, a.benchmark)
    md, data = table(results, a.seeds, a.samples, a.tokens)
    cpu = cpu_info()
    first = a.runs / a.drafters[0] / f"B-s{a.seeds[0]}" / "summary.json"
    dtype = json.loads(first.read_text()).get("target_dtype", "?")
    head = (f"Block verification vs protocol B at T = 1 on the mini target (SmolLM2-135M), {a.samples} prompts per "
            f"benchmark ({a.benchmark}), {a.tokens} new tokens, seeds {', '.join(map(str, a.seeds))} pooled per "
            f"prompt; τ includes the bonus token; paired bootstrap over prompts.\n\n"
            f"Command: `python experiments/block_verification.py --drafters {' '.join(a.drafters)} --seeds "
            f"{' '.join(map(str, a.seeds))} --samples {a.samples} --tokens {a.tokens} --benchmark {a.benchmark}`  \n"
            f"Machine: {cpu['model']} ({', '.join(k for k, v in cpu['flags'].items() if v)}); target in {dtype} "
            f"(target.dtype=auto).\n")
    print(head + "\n" + md)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "README.md").write_text(f"# Block verification vs protocol B\n\n{head}\n{md}\n")
        (a.out / "block_verification.json").write_text(json.dumps(
            {"drafters": a.drafters, "seeds": a.seeds, "samples": a.samples, "tokens": a.tokens,
             "benchmark": a.benchmark, "results": data}, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
