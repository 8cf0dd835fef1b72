"""What this machine can compute fast, read off it rather than guessed: the CPU's model and the instruction-set
flags that decide the target's precision (`target.dtype=auto`, targets/hf.py) and that every summary records.

Native bf16 on a CPU means AVX512-BF16 (`avx512_bf16`: bf16 dot products) or AMX (`amx_bf16`: bf16 tile matrix
multiplies). Without them PyTorch emulates bf16 matrix multiplies through fp32 and gains nothing, so `auto` keeps
fp32 there. Linux reports the flags in /proc/cpuinfo; elsewhere oneDNN's own bf16 check answers.

Also which device of this machine a run uses (`resolve_device`: the `device` key against the GPUs it has).
"""
from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from pathlib import Path

import torch

from .errors import check

DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")            # what `device=` accepts
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")      # the ones that decide a CPU's speed here


def parse_cpuinfo(text: str) -> tuple[str, set[str] | None]:
    """The model name and the flags of the first CPU in `/proc/cpuinfo` text (None: no flags line)."""
    model, flags = "", None
    for line in text.splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and flags is None:
            flags = set(line.split(":", 1)[1].split())
    return model, flags


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    """`{"model", "flags": {flag: bool for FLAGS}, "cores"}` of this CPU."""
    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        model, flags = "", None
    if flags is None:                     # no /proc/cpuinfo (macOS, Windows): ask oneDNN about bf16 only
        bf16 = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
        flags = {"avx512_bf16"} if bf16 else set()
    return {"model": model or platform.processor() or platform.machine() or "?",
            "flags": {f: f in flags for f in FLAGS}, "cores": os.cpu_count()}


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX). `SPECEXP_CPU_BF16=0` or `=1` in the
    environment overrides what the flags say (the test suite sets 0, so that no test's precision depends on the
    machine it runs on)."""
    forced = os.environ.get("SPECEXP_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    f = cpu_info()["flags"]
    return f["avx512_bf16"] or f["amx_bf16"]


def device_type(device) -> str:
    """'cpu', 'cuda', ... of a torch.device or a device string ('cuda:1')."""
    return getattr(device, "type", None) or str(device).split(":")[0]


def describe(device: torch.device) -> dict:
    """The machine a result was measured on, for summaries: the device, the CPU model, the flags it has, threads."""
    cpu = cpu_info()
    out = {"device": device.type, "cpu": cpu["model"], "cpu_flags": [f for f, on in cpu["flags"].items() if on],
           "cores": cpu["cores"], "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def resolve_device(device: str) -> torch.device:
    """The `device` key as the device this machine runs on: `auto` = CUDA when present, else the CPU; a GPU that is
    not there (no CUDA, or an index past the machine's GPUs) is one line."""
    check(isinstance(device, str) and DEVICE.fullmatch(device) is not None,
          f"device={device!r} is malformed; use auto, cpu, cuda or cuda:N (N a GPU index)")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check(not device.startswith("cuda") or torch.cuda.is_available(),
          f"device={device!r} but CUDA is not available here; use device=cpu")
    if device.startswith("cuda:"):
        n = torch.cuda.device_count()
        check(int(device[5:]) < n, f"device={device!r} but this machine has {n} GPU(s): cuda:0..cuda:{n - 1}")
    return torch.device(device)
