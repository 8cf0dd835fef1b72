"""The only clock in specexp. On CUDA every reading synchronises the device first, so a reading marks
the end of all queued work (gpt-fast's `device_sync` before every timer)."""
from __future__ import annotations

import time

import torch


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
