"""`target.dtype=auto` follows what the CPU can do, read from its flags: bf16 where it multiplies bf16 natively
(AVX512-BF16 or AMX), fp32 elsewhere, bf16 on CUDA; `SPECEXP_CPU_BF16` overrides the reading; a run's settings
record what `auto` resolved to, and its summary the dtype and the machine."""
import json

import pytest
import torch

from specexp import machine
from specexp.targets.hf import resolve_dtype, target_settings

XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2\n"


def _as_if(monkeypatch, text: str, forced: str | None):
    monkeypatch.setattr(machine.Path, "read_text", lambda self: text)
    machine.cpu_info.cache_clear()
    if forced is None:
        monkeypatch.delenv("SPECEXP_CPU_BF16", raising=False)
    else:
        monkeypatch.setenv("SPECEXP_CPU_BF16", forced)


@pytest.fixture(autouse=True)
def fresh_reading():
    yield
    machine.cpu_info.cache_clear()                 # the next test reads the real machine again


@pytest.mark.parametrize("text, forced, bf16", [(XEON, None, True), (EPYC, None, False), (XEON, "0", False),
                                                (EPYC, "1", True), ("", None, None)])
def test_auto_is_bf16_only_where_the_cpu_has_it(monkeypatch, text, forced, bf16):
    _as_if(monkeypatch, text, forced)
    if bf16 is None:                               # no flags line: oneDNN's own check decides
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    want = torch.bfloat16 if bf16 else torch.float32
    assert machine.native_bf16() is bf16 and resolve_dtype("auto", torch.device("cpu")) == want
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32         # an explicit dtype is kept
    info = machine.cpu_info()
    assert info["model"] == {XEON: "Intel(R) Xeon(R) Platinum 8480+", EPYC: "AMD EPYC 7B13"}.get(text, info["model"])


def test_the_settings_of_a_run_hold_what_auto_resolved_to(monkeypatch, cfg_factory):
    cfg = cfg_factory("target.dtype=auto")
    _as_if(monkeypatch, XEON, None)
    assert target_settings(cfg.target, torch.device("cpu"))["dtype"] == "bfloat16"
    _as_if(monkeypatch, EPYC, None)
    assert target_settings(cfg.target, torch.device("cpu"))["dtype"] == "float32"
    explicit = target_settings(cfg_factory("target.dtype=float32").target, torch.device("cpu"))
    assert explicit == target_settings(cfg.target, torch.device("cpu"))     # the same run, the same digest


def test_describe_names_the_flags_that_are_on(monkeypatch):
    _as_if(monkeypatch, XEON, None)
    d = machine.describe(torch.device("cpu"))
    assert d["cpu"] == "Intel(R) Xeon(R) Platinum 8480+" and d["device"] == "cpu"
    assert d["cpu_flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    assert d["torch_threads"] == torch.get_num_threads() and json.dumps(d)


def test_the_suite_runs_fp32_whatever_the_machine():
    """conftest pins the detection off: goldens and token-for-token tests mean the same on every CPU."""
    assert not machine.native_bf16() and resolve_dtype("auto", torch.device("cpu")) == torch.float32
