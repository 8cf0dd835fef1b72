"""`task=serve_check`: every drafter vLLM serves, exported and run by vLLM itself beside specexp, on the same prompts.

An export is right only when the engine that serves it gives the target's own output and the acceptance specexp
measured: a key read with another meaning loads silently and only lowers acceptance (export/contract.py). So:

  1. specexp: the target, the prompts as token ids (the first turn of each selected sample, specexp's chat
     template), greedy AR and each drafter at `serve_check.num_drafts` drafts a round over the whole vocabulary;
  2. each drafter exported for vLLM (export/engines.py, `export.format=vllm`) into `<run dir>/exports/<drafter>`, or
     an export made before (`serve_check.exports: {drafter: DIR}`), which specexp then reads as its checkpoint too;
  3. vLLM (`serve_check.python`, the side environment `bash scripts/install.sh serve` makes) runs AR and every
     export on the same ids, greedy, in the target's dtype: export/vllm_runner.py, a separate process that imports
     only vLLM;
  4. per drafter: loaded (and vLLM's log lines about its weights), vLLM's speculative output identical to vLLM's AR
     output, vLLM's τ and per-position acceptance beside specexp's, and Δτ (vLLM − specexp) with a paired bootstrap
     95% CI over the prompts (eval/metrics.py). Agreement: identical output and a CI that includes 0.

vLLM reports per prompt its rounds (`num_drafts`) and, per position k, the rounds whose k-th draft was accepted.
Acceptance stops at the first rejected draft, so position k's count is the number of rounds that accepted at least
k drafts, and the counts give every round's accepted length exactly (not their order): the records below carry
those lengths, so τ (tokens per verification, bonus included) and the per-position rates are computed for vLLM by
the same formulas as for specexp. One difference of bookkeeping: vLLM counts every draft its last round accepted,
also those past `max_tokens` that it then drops, while specexp's τ counts committed tokens (eval/metrics.py). The
rounds' committed tokens must sum to the generated tokens after the prefill's one, so the excess (up to K) is taken
off one round (the longest: which round was last is not in the counters); τ is then exact, and a per-position rate
may differ from vLLM's own by that round.

In bf16 two engines, and one engine's verify (K + 1 rows) and decode (1 row) steps, break exact ties of the top
two logits differently, so outputs may part at a tie; run the check in fp32 (`target.dtype=float32`), where vLLM's
CPU build decodes with speculation too.

Writes `serve_check.json` and `serve_check.md` (and vLLM's spec, output and log) into the run directory; with
`serve_check.strict` a drafter that disagrees fails the run (exit 3) after the files are written.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import log, registry
from ..config import Config
from ..decoding.engine import generate
from ..decoding.settings import DecodeConfig, check_fits
from ..errors import CheckFailed, check
from ..files import write_json, write_text_atomic
from ..rundir import claimed_for
from . import metrics
from .plan import drafter_group
from .run import select
from .vllm_side import model_dir, run_vllm, side_python

METHOD = {"dflash": "dflash", "eagle3": "eagle3"}        # specexp drafter -> vLLM speculative method
TOL = 1e-9            # a CI "includes 0" up to float rounding (identical τ gives [0, 0] computed as ±1e-16)


def rounds_from_counts(num_drafts: int, accepted_per_pos: list[int]) -> list[int]:
    """Each round's committed tokens (accepted drafts + the bonus), from vLLM's per-prompt counters: `num_drafts`
    rounds, `accepted_per_pos[k]` of them accepted draft k+1 (so at least k+1 drafts). Sorted, longest first."""
    counts = [num_drafts, *accepted_per_pos, 0]
    check(all(a >= b >= 0 for a, b in zip(counts, counts[1:])),
          f"vLLM's acceptance counters are not prefix-closed ({num_drafts} rounds, per position {accepted_per_pos})")
    out = []
    for k in range(len(counts) - 1, 0, -1):                 # rounds that accepted exactly k-1 drafts
        out += [k] * (counts[k - 1] - counts[k])
    return sorted(out, reverse=True)


def record(sample, ids: list[int], tokens: list[int], accept_lengths: list[int], drafted: list[int]) -> dict:
    """A turn record as eval/metrics.py reads them (the fields serve_check fills)."""
    return {"id": sample.id, "benchmark": sample.benchmark, "turn": 0, "prompt_tokens": len(ids),
            "new_tokens": len(tokens), "accept_lengths": accept_lengths, "drafted": drafted}


def decode_ours(target, drafter, prompts, dc: DecodeConfig, name: str) -> tuple[list[dict], list[list[int]]]:
    """specexp's greedy decode of every prompt with `drafter` (None: AR): the records and the generated ids."""
    recs, outs = [], []
    t0 = time.perf_counter()
    for sample, ids in prompts:
        g = generate(target, drafter, ids, dc)
        recs.append(record(sample, ids, g.tokens, list(g.accept_lengths), list(g.drafted)))
        outs.append(list(g.tokens))
    log.LOG.info(f"serve_check: specexp {name}: {len(prompts)} prompts in {time.perf_counter() - t0:.1f} s")
    return recs, outs


def export_for_vllm(cfg, name: str, out: Path) -> str:
    """`task=export drafter=<name> export.format=vllm export.out=<out>` in this process (its checks and contract
    included), with the drafter's default checkpoint for the target."""
    from omegaconf import OmegaConf, open_dict

    from ..export import engines

    ecfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    with open_dict(ecfg):
        ecfg.pop("serve_check", None)
        ecfg.task.name = "export"
        ecfg.drafter = drafter_group(name, cfg)
        ecfg.export = {"format": "vllm", "out": str(out), "overwrite": True, "dtype": None, "force": False,
                       "push": False, "repo_id": None, "private": True}
    plan = engines.plan(ecfg, out.parent, None)
    engines.write(plan)
    return str(out)


def vllm_records(run: dict, prompts, k: int) -> list[dict]:
    """vLLM's per-prompt counters as turn records: the rounds rebuilt from the counts, the drafts its last round
    accepted past `max_tokens` taken off (module docstring)."""
    recs = []
    for (sample, ids), p in zip(prompts, run["prompts"]):
        pos = list(p["accepted_per_pos"])[:k] + [0] * max(0, k - len(p["accepted_per_pos"]))
        lengths = rounds_from_counts(p["num_drafts"], pos)
        excess = sum(lengths) - max(len(p["output_ids"]) - 1, 0)
        check(0 <= excess <= k or not lengths, f"vLLM's counters for sample {sample.id} count {sum(lengths)} tokens "
                                               f"for {len(p['output_ids'])} generated")
        if lengths and excess > 0:
            lengths[0] -= excess                      # the longest round: it accepted at least `excess` drafts
        recs.append(record(sample, ids, p["output_ids"], sorted(lengths, reverse=True), [k] * len(lengths)))
    return recs


def _by_bench(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["benchmark"], []).append(r)
    return out


def compare_drafter(name: str, run: dict, ours: list[dict], prompts, vllm_ar: list[list[int]],
                    our_ar: list[list[int]], k: int) -> dict:
    """One drafter's row: loaded, identical output, τ and per-position acceptance of both, Δτ with its CI."""
    if run.get("error"):
        return {"drafter": name, "loaded": False, "error": run["error"], "log": run.get("log", []), "agrees": False}
    theirs = vllm_records(run, prompts, k)
    same = [p["output_ids"] == a for p, a in zip(run["prompts"], vllm_ar)]
    ours_same = [r == a for r, a in zip((p["output_ids"] for p in run["prompts"]), our_ar)]
    per, macro = metrics.paired_comparison(_by_bench(theirs), _by_bench(ours))
    ci = macro["delta_ci95"]
    tau_v, tau_s = metrics.tau(theirs), metrics.tau(ours)
    agrees = all(same) and ci is not None and ci[0] <= TOL and ci[1] >= -TOL
    return {"drafter": name, "loaded": True, "log": run.get("log", []), "identical_to_vllm_ar": sum(same),
            "identical_to_specexp_ar": sum(ours_same), "prompts": len(same),
            "vllm_tau": tau_v, "specexp_tau": tau_s, "delta": macro["delta"], "delta_ci95": ci,
            "vllm_totals": run.get("totals"),
            "vllm_accept_rate_per_position": metrics.accept_rate_per_position(theirs, k),
            "specexp_accept_rate_per_position": metrics.accept_rate_per_position(ours, k),
            "per_benchmark": per, "startup_s": run.get("startup_s"), "generate_s": run.get("generate_s"),
            "specexp_records": ours,
            "per_prompt": [{"id": a["id"], "vllm_tau": metrics.turn_tau(a["accept_lengths"]),
                            "specexp_tau": metrics.turn_tau(b["accept_lengths"]),
                            "vllm_rounds": len(a["accept_lengths"]), "specexp_rounds": len(b["accept_lengths"])}
                           for a, b in zip(theirs, ours)],
            "agrees": agrees}


def markdown(result: dict) -> str:
    """serve_check.md: the table of the check, then per-position acceptance."""
    f = lambda x: "–" if x is None else f"{x:.3f}"                                 # noqa: E731
    lines = [f"# Served by vLLM {result['vllm_version']}: {result['target']}, {result['dtype']}, K = {result['k']}, "
             f"{result['prompts']} prompts, {result['max_new_tokens']} new tokens", "",
             f"vLLM AR output identical to specexp's AR output: {result['ar_identical']}/{result['prompts']} prompts"
             + (" (in bf16 engines break exact ties of the top two logits differently: check in fp32, "
                "target.dtype=float32)." if result["dtype"] != "float32" else "."), "",
             "| drafter | loads | output = vLLM AR | vLLM τ | specexp τ | Δτ (vLLM − specexp) [95% CI] | agrees |",
             "|---|---|---|---:|---:|---|---|"]
    for r in result["drafters"]:
        if not r["loaded"]:
            lines.append(f"| {r['drafter']} | no: {r['error']} | – | – | – | – | **no** |")
            continue
        ci = r["delta_ci95"]
        lines.append(f"| {r['drafter']} | yes | {r['identical_to_vllm_ar']}/{r['prompts']} | {f(r['vllm_tau'])} | "
                     f"{f(r['specexp_tau'])} | {f(r['delta'])} [{f(ci[0]) if ci else '–'}, {f(ci[1]) if ci else '–'}]"
                     f" | {'yes' if r['agrees'] else '**no**'} |")
    lines += ["", "Acceptance per position (share of rounds whose k-th draft was accepted), vLLM / specexp:", "",
              "| drafter | " + " | ".join(str(i + 1) for i in range(result["k"])) + " |",
              "|---|" + "---:|" * result["k"]]
    for r in result["drafters"]:
        if r["loaded"]:
            cells = [f"{f(a)} / {f(b)}" for a, b in zip(r["vllm_accept_rate_per_position"],
                                                     r["specexp_accept_rate_per_position"])]
            lines.append(f"| {r['drafter']} | " + " | ".join(cells) + " |")
    lines += ["", "Agreement: output identical to vLLM's own AR output on every prompt and a paired-bootstrap CI of "
              "Δτ that includes 0. vLLM's τ is 1 + accepted / rounds per prompt, from its speculative counters.", ""]
    return "\n".join(lines)


def run_serve_check(cfg, out_dir, typed: Config | None = None) -> dict:
    sel = select(cfg, typed)
    t, sc = sel.typed, sel.typed.serve_check
    check(sc is not None, "the serve_check group is missing: run task=serve_check, which composes it")
    python = side_python(sc.python)
    with claimed_for(out_dir, "serve_check") as d:
        target = registry.build_target(t.target, sel.device)
        prompts = []
        for s in sel.samples:
            ids = target.encode_chat([{"role": "user", "content": s.turns[0]}])
            prompts.append((s, ids))
        dc = DecodeConfig("greedy", 0.0, t.eval.max_new_tokens, tuple(target.stop_token_ids), sc.num_drafts)
        for s, ids in prompts:
            check_fits(target, f"sample {s.id}", len(ids), dc, sc.num_drafts)
            need = len(ids) + dc.max_new_tokens + sc.num_drafts + 1
            check(need <= sc.max_model_len, f"sample {s.id}: its prompt ({len(ids)} tokens) + eval.max_new_tokens="
                                            f"{dc.max_new_tokens} + {sc.num_drafts} drafts needs {need} positions; "
                                            f"serve_check.max_model_len={sc.max_model_len}: raise it")
        ours_ar, our_ar_ids = decode_ours(target, None, prompts, dc, "AR")
        ours, runs = {}, [{"name": "ar", "speculative_config": None}]
        given = dict(sc.exports or {})
        for name in sc.drafters:
            group = drafter_group(name, cfg)
            if name in given:                     # an export made before: specexp reads the same directory
                group.checkpoint = str(given[name])
            drafter = registry.build_drafter(group, target)
            ours[name], _ = decode_ours(target, drafter, prompts, dc, name)
            export = str(given[name]) if name in given else export_for_vllm(cfg, name, d / "exports" / name)
            runs.append({"name": name, "speculative_config": {"method": METHOD[name], "model": export,
                                                              "num_speculative_tokens": sc.num_drafts}})
        dtype = str(target.dtype).removeprefix("torch.")
        spec = {"model": model_dir(target, t.target, d / "target"), "prompts": [ids for _, ids in prompts],
                "runs": runs, "dtype": dtype, "max_model_len": sc.max_model_len,
                "max_new_tokens": t.eval.max_new_tokens, "stop_token_ids": list(target.stop_token_ids),
                "enforce_eager": sc.enforce_eager}
        got = run_vllm(python, spec, d, sc.timeout_s)
        by_name = {r["name"]: r for r in got["runs"]}
        ar = by_name.get("ar") or {}
        check(not ar.get("error") and ar.get("prompts"), f"serve_check: vLLM could not run the target alone: "
                                                         f"{ar.get('error')}; its log: {d / 'vllm.log'}")
        vllm_ar = [p["output_ids"] for p in ar["prompts"]]
        result = {"target": t.target.name, "model": spec["model"], "dtype": dtype, "k": sc.num_drafts,
                  "prompts": len(prompts), "max_new_tokens": t.eval.max_new_tokens,
                  "vllm_version": got.get("vllm_version"), "python": sys.version.split()[0],
                  "ar_identical": sum(a == b for a, b in zip(vllm_ar, our_ar_ids)),
                  "specexp_ar_tokens": sum(r["new_tokens"] for r in ours_ar),
                  "drafters": [compare_drafter(n, by_name.get(n, {"error": "not run"}), ours[n], prompts, vllm_ar,
                                               our_ar_ids, sc.num_drafts) for n in sc.drafters]}
        write_json(d / "serve_check.json", result)
        md = markdown(result)
        write_text_atomic(d / "serve_check.md", md)
    print(md)
    bad = [r["drafter"] for r in result["drafters"] if not r["agrees"]]
    if bad and sc.strict:
        raise CheckFailed(f"serve_check: vLLM serves {', '.join(bad)} otherwise than specexp runs it (output or τ "
                          f"differ; {Path(out_dir) / 'serve_check.md'})")
    return result
