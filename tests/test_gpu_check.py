"""scripts/gpu_check.py --dry-run end to end (what a CPU can run of the first-GPU-contact check): every part runs in
its own process and passes, and the one JSON report has the structure a person with a GPU will send back."""
import json
import subprocess
import sys

import pytest
from conftest import ROOT

PARTS = ["qwen3_8b_shape", "static_graph", "oracle_decode", "kernel_parity", "drafters_lossless", "protocol_b_graph",
         "head_loop_graph", "fusion_tiles_compile", "train_smoke"]     # most valuable first


@pytest.mark.slow
def test_dry_run_writes_one_report_where_every_part_passed(tmp_path):
    from specexp import registry
    from specexp.kernels.fusion import AUTOTUNE, TILES

    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out),
                           "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=1500)
    r = json.loads(out.read_text())
    failed = {n: f"{p['error']}"[-600:] for n, p in r["parts"].items() if p["status"] != "passed"}
    assert not failed, "failed parts: " + "; ".join(f"{n}: {e}" for n, e in failed.items())
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert r["specexp_gpu_check"] == 1 and r["mode"] == "dry-run" and list(r["parts"]) == PARTS
    assert r["summary"] == {"passed": len(PARTS), "failed": 0, "skipped": 0}
    assert {"torch", "triton", "transformers", "flash_attn", "python"} <= set(r["environment"])
    for name, p in r["parts"].items():
        assert {"status", "figures", "checks", "notes", "error", "seconds", "wall_s"} <= set(p), name
        assert p["checks"] and all(v is True for v in p["checks"].values()), (name, p["checks"])
    k = r["parts"]["kernel_parity"]["figures"]
    assert k["interpreted"] and set(k["tiles"]) == {"auto", *TILES} and k["fastest_tile_greedy"] in TILES
    assert all(t["all_written"] and t["greedy_wrong"] == 0 for t in k["tiles"].values())
    c = r["parts"]["fusion_tiles_compile"]["figures"]                         # compiled as launched (aligned)
    assert c["arch"] == "sm_90" and all(c["per_thread"][f"{t}/{m}"]["stack"] == 0 for t in AUTOTUNE
                                        for m in ("greedy", "sampled", "sampled@1", "sampled@2"))
    assert c["per_thread"]["1024x64w4/greedy"]["stack"] > 0                  # the first shipped tile spills
    o = r["parts"]["oracle_decode"]["figures"]["fp32"]["drafters"]           # forced acceptance, exactly AR's output
    assert set(o) == {"dflash", "dels_rnn", "dels_markov", "domino_ft", "eagle3"}
    for rows in o.values():
        for key, row in rows.items():
            if key != "K":
                assert row["equal_to_ar"] and row["accept_exact"] and row["tau_full_rounds"] in (None, row["n"] + 1)
    drafters = [n for n, e in registry.DRAFTERS.items() if e.build is not None]
    assert set(r["parts"]["drafters_lossless"]["figures"]) == set(drafters)
    q = r["parts"]["qwen3_8b_shape"]["figures"]
    assert q["scaled"] and q["hbm"]["floor_ms"] > 0 and q["syncs"]["sdpa"]["verify"] is None     # no CUDA here
    assert set(q["sequential_drafters"]) == {"dels_rnn", "dels_markov", "domino_ft"}
    s = r["parts"]["static_graph"]["figures"]                  # eager static, graph path, compiled + graph path
    assert set(s["engines"]) == {"eager", "graph", "compiled_graph"} and s["hbm"]["floor_ms"] > 0
    for name in ("graph", "compiled_graph"):
        e = s["engines"][name]
        assert e["capacity"] == 256 and e["ar_argmax_agreement_vs_eager"] == e["verify_argmax_agreement_vs_eager"] == 1
    assert r["parts"]["train_smoke"]["figures"]["steps"] > 0
