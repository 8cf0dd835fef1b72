"""First contact with a GPU: one command, offline, whatever torch / Triton / transformers the machine has, one JSON
report. Each part runs in its own process (a CUDA fault, a hang or an out-of-memory in one part cannot take the
others down; each has a time limit) and is recorded as passed / failed / skipped with its figures, its checks and,
when it fails, the error text. The report is rewritten after every part, and a part killed at its limit keeps the
figures it saved before (`Ctx.save_partial`).

    bash scripts/gpu_check.sh --out gpu_check.json     # all parts on cuda:0, at most 9.5 minutes (BUDGET_S)
    bash scripts/gpu_check.sh --out r.json --sections oracle_decode,kernel_parity --layers 18   # a subset
    bash scripts/gpu_check.sh --dry-run                # what a CPU can run: kernels under TRITON_INTERPRET=1

Each part is one module of scripts/gpu_parts/ with a function run(ctx): its docstring says what it measures, why,
and how its time limit was set (--help lists the parts from them); what the parts share is gpu_parts/common.py.
This file runs them: the command line, the parts' order and time limits (PARTS), one child process a part, the
report.

Time limits (PARTS; seconds on one H200, summing to BUDGET_S = 570 with the process start of each part, ~10 s for
torch + CUDA + transformers). Deadlines are cumulative: part i must end by the sum of the limits up to i, so what
a part leaves unused goes to the later ones and the whole run stays within 570 s. Set from the first H200 run
(2026-12-04, experiments/results/gpu/2026-12-04/; wall seconds per part) and the CPU dry run (2 busy cores, the
image's package set simulated, 542 s in all): each part's module gives its limit then -> now and why.

batched_ar and plan_calibration (2026-12) took their 94 s from the parts whose measured or expected time
leaves slack, mostly qwen3_8b_shape and oracle_decode, whose host-side drafter builds are gone. batch_spec (2026-12)
took its 40 s the same way: 15 from oracle_decode (~90 s expected), 7 from qwen3_8b_shape (~55 expected), 6 from
plan_calibration (~45 expected), 5 from static_graph, and 1 or 2 from each part measured on the H200 with 2 s or
more to spare (kernel_parity, drafters_lossless, protocol_b_graph, head_loop_graph, fusion_tiles_compile,
train_smoke). The margins are now a few seconds at most, 1 to 2 s on the measured parts, so the first GPU run of
this version should confirm them (a part that overruns shortens only the parts after it: the deadlines are
cumulative; `--timeout-scale` widens them all).

Host syncs are counted with torch.cuda.set_sync_debug_mode("warn"): every synchronising CUDA call (.item(),
.tolist(), a blocking copy, nonzero, ...) raises "called a synchronizing CUDA operation" warnings, and the
warnings of the measured region are counted. The report's `sync_counter` records a self-test: on torch 2.11 one
.item() raises 2 warnings, a device-only op 0, so a count is an upper bound on the synchronising calls and 0 means
none.

`--dry-run` runs every part on the CPU at small sizes, with Triton kernels in its interpreter: what it checks is
that the parts run and agree, not speed; CUDA-only measurements are null and said so.
"""
import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from gpu_parts.common import ROOT, Ctx, Skip, setup_paths, sync_selftest, write_report

FORMAT = 1
PARTS = {   # name (its code: gpu_parts/<name>.py): (GPU time limit in s, Triton interpreted in a dry run)
    "qwen3_8b_shape": (58, False),
    "static_graph": (75, False),
    "batched_ar": (40, False),
    "batch_spec": (40, False),
    "plan_calibration": (48, False),
    "oracle_decode": (95, False),
    "kernel_parity": (28, True),
    "drafters_lossless": (51, False),
    "protocol_b_graph": (67, True),
    "head_loop_graph": (17, True),
    "fusion_tiles_compile": (12, False),
    "train_smoke": (39, False),
}
ALIASES = {"fusion_kernel": "kernel_parity"}     # the former name of kernel_parity's timing half
BUDGET_S = 570                                   # the whole check on a GPU: the limits above sum to at most this
DRY_LIMIT_S = 900                                # per part in a dry run (CPU times, not budgeted)
assert sum(limit for limit, _ in PARTS.values()) <= BUDGET_S


def part(name: str):
    """Part `name`'s module, gpu_parts/<name>.py, imported when the part runs (one that fails to import fails alone)."""
    return importlib.import_module(f"gpu_parts.{name}")


def limit_of(name: str, args) -> float:
    """Part `name`'s time limit in seconds (a dry run's are not budgeted)."""
    return (DRY_LIMIT_S if args.dry_run else PARTS[name][0]) * args.timeout_scale


def parts_help() -> str:
    """--help's list of the parts: the first paragraph of each part's module docstring."""
    lines = ["", "Parts (`--list`), most valuable first (a run cut short loses the least):"]
    for name in PARTS:
        first, *rest = part(name).__doc__.split("\n\n")[0].splitlines()
        lines += [f"  {name:<22}{first}", *(" " * 24 + line for line in rest)]
    return "\n".join(lines) + "\n"


def run_one(name: str, args) -> dict:
    """One part in this process: {status, figures, checks, notes, error, seconds}."""
    t0 = time.perf_counter()
    res = {"status": "failed", "figures": None, "checks": {}, "notes": [], "error": None}
    try:
        setup_paths()
        ctx = Ctx(args, limit_of(name, args))
        ctx.work.mkdir(parents=True, exist_ok=True)
        out = part(name).run(ctx)
        res.update(out)
        failed = [k for k, v in res["checks"].items() if not v]
        res["status"] = "failed" if failed else "passed"
        if failed:
            res["error"] = "checks failed: " + ", ".join(failed)
    except Skip as e:
        res.update(status="skipped", error=str(e))
    except BaseException as e:               # a failing part must never stop the others
        res["error"] = "".join(traceback.format_exception(e))[-6000:]
    res["seconds"] = time.perf_counter() - t0
    return res


def environment(args) -> dict:
    import torch

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "dry_run": args.dry_run}
    for mod in ("triton", "transformers", "lightning", "hydra", "safetensors", "tokenizers"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:
            env[mod] = f"not importable ({type(e).__name__})"
    try:
        import flash_attn
        env["flash_attn"] = flash_attn.__version__
    except Exception as e:
        env["flash_attn"] = f"not importable ({type(e).__name__}: {str(e)[:200]})"
    if torch.cuda.is_available() and not args.dry_run:
        p = torch.cuda.get_device_properties(args.device)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=p.total_memory / 2**30,
                   sync_counter=sync_selftest(torch.device(args.device)))
    try:
        env["git"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                    timeout=10).stdout.strip() or None
    except Exception:
        env["git"] = None
    return env


def run_child(name: str, args, argv, work: Path, limit: float) -> dict:
    """One part in its own process, killed at `limit` seconds; its result file, or what it saved before dying."""
    interpreted = PARTS[name][1]
    env = dict(os.environ)
    if args.dry_run and interpreted:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    res_file, log = work / f"{name}.json", work / f"{name}.log"
    res_file.unlink(missing_ok=True)
    # --out as this process resolved it: the child runs in ROOT, and a part writes files beside the report
    cmd = [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:]),
           "--out", str(Path(args.out).resolve()), "--run-part", name, "--part-json", str(res_file),
           "--work-dir", str(work / name)]
    print(f"gpu_check: {name} ...", flush=True)
    p0 = time.perf_counter()
    timed_out = False
    try:
        with log.open("w") as f:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        timed_out, rc = True, None
    res = json.loads(res_file.read_text()) if res_file.exists() else {
        "status": "failed", "figures": None, "checks": {}, "notes": [], "error": None}
    if timed_out:
        res.update(status="failed", error=f"timed out after {limit:.0f} s"
                   + (" (figures: up to the part's last checkpoint)" if res.get("figures") else ""))
    elif res.get("partial") or not res_file.exists():
        res.update(status="failed", error=f"the part's process exited with {rc} before its end")
    res["wall_s"] = time.perf_counter() - p0
    res["limit_s"] = limit
    if res["status"] == "failed":
        res["log_tail"] = log.read_text(errors="replace")[-4000:] if log.exists() else None
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__ + parts_help())
    ap.add_argument("--out", default="gpu_check.json", help="the JSON report (default gpu_check.json)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, small sizes, Triton interpreted")
    ap.add_argument("--parts", "--sections", dest="parts", default=",".join(PARTS),
                    help="comma-separated subset to run, in the given order (default: all, most valuable first)")
    ap.add_argument("--list", action="store_true", help="list the parts and exit")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth for the floor, TB/s (H200: 4.8)")
    ap.add_argument("--layers", type=int, default=36, help="decoder layers of the Qwen3-8B-shaped target")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens before the timed steps")
    ap.add_argument("--oracle-tokens", type=int, default=48, help="new tokens per oracle_decode generation")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiplies every part's time limit")
    ap.add_argument("--work-dir", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--run-part", help=argparse.SUPPRESS)
    ap.add_argument("--part-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(PARTS))
        return 0
    parts = [ALIASES.get(p.strip(), p.strip()) for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        print(f"gpu_check: unknown part {bad[0]!r}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    for k, v in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("WANDB_MODE", "disabled"),
                 ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    if args.run_part:                                                   # the child: one part, its result to a file
        Path(args.part_json).write_text(json.dumps(run_one(args.run_part, args), default=str))
        return 0

    out = Path(args.out).resolve()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = Path(args.work_dir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        report = {"specexp_gpu_check": FORMAT, "mode": "dry-run" if args.dry_run else "gpu",
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": [sys.executable, *sys.argv],
                  "environment": environment(args), "parts": {}, "summary": {}}
        deadline = 0.0
        for name in parts:
            # cumulative deadlines: part i must end by the sum of the limits up to i, so time a part leaves unused
            # goes to the later ones and the whole run never exceeds the sum (BUDGET_S)
            deadline += limit_of(name, args)
            limit = max(deadline - (time.perf_counter() - t0), 1.0)
            res = run_child(name, args, argv, work, limit)
            report["parts"][name] = res
            print(f"gpu_check: {name} {res['status']} ({res['wall_s']:.0f} s of {limit:.0f})"
                  + (f": {str(res['error']).strip().splitlines()[-1]}" if res["error"] else ""), flush=True)
            figures = res.get("figures") or {}
            for line in figures.get("headline", []):                   # a part's one-line results (the plan's)
                print(f"gpu_check:   {line}", flush=True)
            if figures.get("calibration_file"):                         # plan_calibration wrote it beside the report
                report["calibration_file"] = figures["calibration_file"]
            report["summary"] = {s: sum(r["status"] == s for r in report["parts"].values())
                                 for s in ("passed", "failed", "skipped")}
            report["wall_s"] = time.perf_counter() - t0
            write_report(out, report)                                   # after every part: a kill keeps the rest
    print(f"gpu_check: {report['summary']} in {report['wall_s']:.0f} s -> {out}", flush=True)
    return 0 if report["summary"]["failed"] == 0 and report["summary"]["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
