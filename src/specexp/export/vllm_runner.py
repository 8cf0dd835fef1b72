"""Run vLLM on token-id prompts, with and without speculation, and write what it generated and accepted.

The serving lane's engine side (issue 60): specexp exports a drafter, this script lets vLLM itself load and run it,
and specexp compares vLLM's outputs and acceptance with its own. It runs in the side environment that
`bash scripts/install.sh serve` makes (`.venv-serve`, vLLM's CPU build) and imports only vLLM and the standard
library, so it never sees specexp's code or package versions:

    .venv-serve/bin/python src/specexp/export/vllm_runner.py SPEC.json OUT.json
    .venv-serve/bin/python src/specexp/export/vllm_runner.py --serve SPEC.json     (a warm engine: `serve`)

(task=serve_check runs it so, by file path: it is never imported as part of specexp.)

SPEC.json (keys marked * are required):
    model*            the target's HF directory (never loaded with trust_remote_code)
    prompts*          a list of prompts, each a list of token ids (no chat template is applied here)
    runs*             a list of {"name": str, "speculative_config": null | {"method": "dflash" | "eagle3", "model":
                      DIR, "num_speculative_tokens": K, ...}}; a run may also set enforce_eager, dtype, llm_kwargs
    dtype             "bfloat16" (default) | "float32"
    max_model_len     default 1024
    max_new_tokens    default 64
    ignore_eos        default false: a generation stops at the target's end-of-sequence token
    stop_token_ids    default null; more token ids that end a generation (specexp's target.stop_token_ids)
    batched           default false; true: every prompt in one generate call (vLLM batches them), without per-prompt
                      speculative counters (fast greedy references); `wall_s` is then the batch's
    enforce_eager     default true (false: vLLM's torch.compile path; slow to start on a CPU)
    warmup            default true: one untimed generation of the first prompt (16 tokens) before the timed ones;
                      the first call of an engine pays one-off costs (about 20 s here) that would land on prompt 0
    logprobs          default null; N: each output token's N most likely tokens, [[id, logprob], ...], best first
                      (vLLM adds the chosen token where it is not among them)
                      (where a speculative output leaves the plain one, the gap shows whether it was a near-tie)
    llm_kwargs        more keyword arguments for every vllm.LLM(...), e.g. {"max_num_seqs": 4}

OUT.json: {"vllm_version", "env" (the VLLM_* settings and LD_PRELOAD used), "runs": [one per SPEC run:
    {"name", "speculative_config", "enforce_eager", "dtype",
     "startup_s" (building the LLM), "warmup_s", "generate_s" (the timed prompts together),
     "peak_rss_mib" (this process's peak so far), "rss_mib_after_free",
     "error" (null, or why the run failed), "log" (vLLM's warnings and its lines about weights while it loaded),
     "prompts": [{"output_ids", "finish_reason", "logprobs" (with SPEC logprobs), "num_drafts", "num_draft_tokens",
                  "num_accepted", "accepted_per_pos", "wall_s"}],
     "totals": {"num_drafts", "num_draft_tokens", "num_accepted", "accepted_per_pos", "acceptance_length",
                "output_tokens"}}]}
The acceptance length is vLLM's own definition, 1 + accepted / drafts (tokens per target step while drafting).
Exit status 0 when every run succeeded, 2 when one failed (OUT.json is written either way), 1 on a bad SPEC.

Decoding is greedy (temperature 0). Each prompt is generated on its own, so vLLM's cumulative speculative counters
(`LLM.get_metrics()`), read before and after, give that prompt's drafts and acceptances; `wall_s` is the prompt's
whole generate call, prefill included. In bf16 a speculative output can leave the plain one where the target's
two best logits are exactly tied (a verify step computes them in another shape than a one-token step); in fp32 the
mini target's outputs were identical.
"""
import gc
import json
import logging
import os
import re
import resource
import sys
import time

# Set before vLLM is imported (it reads them at import and engine start). The default multiprocess engine died at
# start on a CPU with no cause logged; in-process it runs, and its metrics land in this process's registry.
# vLLM's CPU build reserves VLLM_CPU_KVCACHE_SPACE GiB for the KV cache: 4 is plenty for the mini target.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
# This script owns logging: vLLM's own setup (dictConfig) replaces the "vllm" logger's handlers when the first engine
# starts, which would drop the handler that keeps the load log. Unconfigured, vLLM's records reach the root logger.
os.environ["VLLM_CONFIGURE_LOGGING"] = "0"


def preload_iomp() -> None:
    """Restart this script with Intel's OpenMP preloaded, as vLLM's CPU build asks ("speculative decoding on CPU
    without Intel OpenMP in LD_PRELOAD will cause significant performance loss"). pip installs the library with vLLM
    (intel-openmp) into the environment's lib/; SERVE_VLLM_IOMP=0 runs without it."""
    lib = os.path.join(sys.prefix, "lib", "libiomp5.so")
    preload = os.environ.get("LD_PRELOAD", "")
    if os.environ.get("SERVE_VLLM_IOMP", "1") == "0" or "libiomp5" in preload or not os.path.exists(lib):
        return
    env = dict(os.environ, LD_PRELOAD=":".join(p for p in (lib, preload) if p))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    preload_iomp()

import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted")
METRIC = {"num_drafts": "vllm:spec_decode_num_drafts", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
          "num_accepted": "vllm:spec_decode_num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# Log lines kept besides warnings: how the draft model's weights were loaded, shared or left out.
WEIGHT_LINE = re.compile(r"weight|unexpected|missing|lm_head|embed|shar|tie", re.IGNORECASE)


class LoadLog(logging.Handler):
    """Keeps vLLM's warnings and its log lines about weights (every vllm.* logger reports through "vllm"). A message
    repeated with other arguments (one per weight: "Attempted to load weight %s with dtype %s ...") is kept once,
    with its count."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.seen: dict[tuple, list] = {}

    def emit(self, record):
        msg = record.getMessage()
        if record.levelno >= logging.WARNING or WEIGHT_LINE.search(msg):
            key = (record.levelname, record.name, str(record.msg))
            self.seen.setdefault(key, [f"{record.levelname} {record.name}: {msg}", 0])[1] += 1

    @property
    def lines(self) -> list[str]:
        return [line if n == 1 else f"{line} [and {n - 1} more like it]" for line, n in self.seen.values()]


def counters(llm) -> dict:
    """vLLM's cumulative speculative counters, summed over label sets (one engine here)."""
    out = {k: 0 for k in COUNTERS}
    out["accepted_per_pos"] = []
    for m in llm.get_metrics():
        for key, name in METRIC.items():
            if m.name == name:
                out[key] += m.value
        if m.name == PER_POS:
            per = out["accepted_per_pos"]
            per.extend([0] * (len(m.values) - len(per)))
            for i, v in enumerate(m.values):
                per[i] += v
    return out


def difference(after: dict, before: dict) -> dict:
    out = {k: after[k] - before[k] for k in COUNTERS}
    pos_before = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], pos_before)]
    return out


def totals(prompts: list[dict]) -> dict:
    out = {k: sum(p[k] for p in prompts) for k in COUNTERS}
    width = max((len(p["accepted_per_pos"]) for p in prompts), default=0)
    out["accepted_per_pos"] = [sum(p["accepted_per_pos"][i] for p in prompts if i < len(p["accepted_per_pos"]))
                               for i in range(width)]
    out["acceptance_length"] = 1 + out["num_accepted"] / out["num_drafts"] if out["num_drafts"] else None
    out["output_tokens"] = sum(len(p["output_ids"]) for p in prompts)
    return out


def shut_down(llm) -> None:
    """Stop an engine so that its memory can go before the next one starts: in-process, the engine core froze the
    objects it made (gc.freeze: weights, KV cache), and its shutdown unfreezes them and tears down its distributed
    group. The caller then drops its last reference and collects."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - only a cleanup; the next LLM reports its own failure if it cannot start
        pass


def collect() -> None:
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        cleanup_dist_env_and_memory()     # also for an engine that failed half-way through its start
    except Exception:  # noqa: BLE001 - as above
        pass
    gc.collect()


def rss_mib() -> float | None:
    """This process's resident memory now (Linux), to show that freeing an engine gives its memory back."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def by_rank(item) -> int:
    return item[1].rank


def run_one(spec: dict, run: dict) -> dict:
    eager = bool(run.get("enforce_eager", spec.get("enforce_eager", True)))
    dtype = run.get("dtype", spec.get("dtype", "bfloat16"))
    out = {"name": run["name"], "speculative_config": run.get("speculative_config"), "enforce_eager": eager,
           "dtype": dtype, "startup_s": None, "warmup_s": None, "generate_s": None, "error": None, "log": [],
           "prompts": [], "totals": None}
    kwargs = dict(model=spec["model"], dtype=dtype, max_model_len=int(spec.get("max_model_len", 1024)),
                  enforce_eager=eager, speculative_config=run.get("speculative_config"), seed=0,
                  trust_remote_code=False, disable_log_stats=False)  # the counters need stat logging on
    kwargs.update(spec.get("llm_kwargs") or {})
    kwargs.update(run.get("llm_kwargs") or {})
    logprobs = spec.get("logprobs")
    params = SamplingParams(temperature=0.0, max_tokens=int(spec.get("max_new_tokens", 64)),
                            ignore_eos=bool(spec.get("ignore_eos", False)), logprobs=logprobs,
                            stop_token_ids=list(spec.get("stop_token_ids") or []) or None)
    log = LoadLog()
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(log)
    llm = None
    try:
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        out["startup_s"] = round(time.perf_counter() - t0, 3)
        vllm_logger.removeHandler(log)    # the load is over: keep the log to what loading said
        if spec.get("warmup", True) and spec["prompts"]:
            t = time.perf_counter()
            llm.generate([{"prompt_token_ids": list(spec["prompts"][0])}],
                         SamplingParams(temperature=0.0, max_tokens=min(16, params.max_tokens)), use_tqdm=False)
            out["warmup_s"] = round(time.perf_counter() - t, 3)
        t_all = time.perf_counter()
        if spec.get("batched"):
            results = llm.generate([{"prompt_token_ids": list(ids)} for ids in spec["prompts"]], params,
                                   use_tqdm=False)
            wall = round(time.perf_counter() - t_all, 4)
            out["prompts"] = [{"output_ids": list(r.outputs[0].token_ids),
                               "finish_reason": r.outputs[0].finish_reason, "wall_s": wall} for r in results]
        for ids in ([] if spec.get("batched") else spec["prompts"]):
            before = counters(llm)
            t = time.perf_counter()
            result = llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0].outputs[0]
            wall = time.perf_counter() - t
            row = {"output_ids": list(result.token_ids), "finish_reason": result.finish_reason}
            if logprobs:
                row["logprobs"] = [[[tok, round(lp.logprob, 5)] for tok, lp in sorted(d.items(), key=by_rank)]
                                   for d in result.logprobs]
            row.update(difference(counters(llm), before))
            row["wall_s"] = round(wall, 4)
            out["prompts"].append(row)
        out["generate_s"] = round(time.perf_counter() - t_all, 3)
        out["totals"] = None if spec.get("batched") else totals(out["prompts"])
    except Exception as e:  # noqa: BLE001 - a run that fails is reported, and the next run still tried
        lines = [line.strip() for line in str(e).splitlines() if line.strip()][:3]  # pydantic's cause is line 2
        out["error"] = f"{type(e).__name__}: {' | '.join(lines)}"[:500]
    finally:
        vllm_logger.removeHandler(log)
        out["log"] = log.lines
        if llm is not None:
            shut_down(llm)
        llm = None          # the last reference: the engine is freed by the collection below
        collect()
        out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # the process's so far
        rss = rss_mib()
        out["rss_mib_after_free"] = round(rss) if rss is not None else None
    return out


def serve(spec: dict, reply) -> int:
    """`--serve`: build the LLM of SPEC's one run, write `{"ready": true, "startup_s", "warmup_s"}` as one JSON line to
    `reply`, then for each JSON line read from stdin (`{"prompts": [[ids], ...], "max_tokens": null | N}`) generate
    every prompt on its own (greedy, SPEC's sampling settings, N new tokens at most if given) and write one JSON line
    `{"prompts": [{"output_ids", "wall_s", counters}]}`; at the end of stdin shut the engine down. A benchmark keeps
    the engine warm between its turns this way, so vLLM and specexp can take turns on the same prompts
    (experiments/bench_serving.py)."""
    run = spec["runs"][0]
    eager = bool(run.get("enforce_eager", spec.get("enforce_eager", True)))
    kwargs = dict(model=spec["model"], dtype=run.get("dtype", spec.get("dtype", "bfloat16")),
                  max_model_len=int(spec.get("max_model_len", 1024)), enforce_eager=eager,
                  speculative_config=run.get("speculative_config"), seed=0, trust_remote_code=False,
                  disable_log_stats=False)
    kwargs.update(spec.get("llm_kwargs") or {})
    kwargs.update(run.get("llm_kwargs") or {})
    params = SamplingParams(temperature=0.0, max_tokens=int(spec.get("max_new_tokens", 64)),
                            ignore_eos=bool(spec.get("ignore_eos", False)),
                            stop_token_ids=list(spec.get("stop_token_ids") or []) or None)
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    ready = {"ready": True, "startup_s": round(time.perf_counter() - t0, 3), "vllm_version": vllm.__version__}
    t = time.perf_counter()
    for ids in spec["prompts"][:1]:                 # one-off costs off the timed turns
        llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)
    ready["warmup_s"] = round(time.perf_counter() - t, 3)
    print(json.dumps(ready), file=reply, flush=True)
    for line in sys.stdin:
        rows, request = [], json.loads(line)
        p = params
        if request.get("max_tokens"):
            p = SamplingParams(temperature=0.0, max_tokens=int(request["max_tokens"]), ignore_eos=params.ignore_eos,
                               stop_token_ids=params.stop_token_ids)
        for ids in request["prompts"]:
            before = counters(llm)
            t = time.perf_counter()
            result = llm.generate([{"prompt_token_ids": list(ids)}], p, use_tqdm=False)[0].outputs[0]
            wall = time.perf_counter() - t
            rows.append({"output_ids": list(result.token_ids), "wall_s": round(wall, 5),
                         **difference(counters(llm), before)})
        print(json.dumps({"prompts": rows}), file=reply, flush=True)
    shut_down(llm)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--serve":
        with open(argv[2]) as f:
            spec = json.load(f)
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        reply = os.fdopen(os.dup(1), "w")       # the replies' own channel: whatever vLLM prints goes to stderr
        os.dup2(2, 1)
        return serve(spec, reply)
    if len(argv) != 3:
        print("usage: vllm_runner.py SPEC.json OUT.json (the SPEC format: this file's docstring)", file=sys.stderr)
        return 1
    with open(argv[1]) as f:
        spec = json.load(f)
    missing = [k for k in ("model", "prompts", "runs") if k not in spec]
    if missing:
        print(f"vllm_runner.py: {argv[1]} lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("vllm").setLevel(logging.INFO)
    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_") or k == "LD_PRELOAD"}
    result = {"vllm_version": vllm.__version__, "env": env, "runs": []}
    for run in spec["runs"]:
        print(f"vllm_runner.py: run {run['name']}", file=sys.stderr, flush=True)
        result["runs"].append(run_one(spec, run))
        with open(argv[2], "w") as f:       # rewritten after each run: a later crash keeps the earlier runs
            json.dump(result, f, indent=1)
    failed = [r["name"] for r in result["runs"] if r["error"]]
    for r in result["runs"]:
        t = r["totals"] or {}
        print(f"vllm_runner.py: {r['name']}: startup {r['startup_s']} s, generate {r['generate_s']} s, "
              f"acceptance length {t.get('acceptance_length')}, per position {t.get('accepted_per_pos')}"
              + (f", FAILED {r['error']}" if r["error"] else ""), file=sys.stderr)
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
