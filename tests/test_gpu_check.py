"""scripts/gpu_check.py --dry-run end to end (what a CPU can run of the first-GPU-contact check): every part runs in
its own process and passes, and the one JSON report has the structure a person with a GPU will send back. Also the
batched oracle of part batch_spec on the tiny target, in process."""
import copy
import json
import subprocess
import sys

import pytest
from conftest import ROOT

PARTS = ["qwen3_8b_shape", "static_graph", "batched_ar", "batch_spec", "plan_calibration", "oracle_decode",
         "kernel_parity", "drafters_lossless", "protocol_b_graph", "head_loop_graph", "fusion_tiles_compile",
         "train_smoke"]   # by value


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


@pytest.mark.slow
def test_dry_run_of_batched_ar_and_plan_calibration(tmp_path):
    """The two parts alone (~1 min on two cores): batched AR steps beside their floor, rows equal to their batch-1
    decode in fp32, generate_batched end to end; the calibration file written beside the report, read back by
    task=plan's reader, and Table 3 projected from it at both answer lengths."""
    from specexp.eval.plan import read_calibration

    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out),
                           "--sections", "batched_ar,plan_calibration", "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    r = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout[-2000:] + "".join(str(p["error"]) for p in r["parts"].values())
    assert list(r["parts"]) == ["batched_ar", "plan_calibration"] and r["summary"]["passed"] == 2
    for name, p in r["parts"].items():
        assert p["checks"] and all(v is True for v in p["checks"].values()), (name, p["checks"])

    b = r["parts"]["batched_ar"]["figures"]
    assert set(b["steps"]) == {"1", "2", "4"} and b["steps"]["1"]["tokens_per_s_vs_b1"] == 1
    for n, row in b["steps"].items():
        assert row["ms_per_step"] > 0 and row["floor_ms"] > 0
        assert row["tokens_per_s"] == pytest.approx(int(n) / row["ms_per_step"] * 1e3)
    assert b["rows_vs_batch1"]["rows_differing"] == 0 and len(set(b["rows_vs_batch1"]["prompt_tokens"])) == 4
    for n, g in b["generate_batched"].items():                 # 2 B prompts, every answer the whole budget
        assert g["prompts"] == 2 * int(n) and g["new_tokens"] == 6 * g["prompts"] and g["tokens_per_s"] > 0
    assert b["goals"]["b32_tokens_per_s_ge_20x_b1"] is None                   # B = 32 is GPU-only

    p = r["parts"]["plan_calibration"]["figures"]
    path = tmp_path / "calibration.json"                         # beside the report, named in it
    assert r["calibration_file"] == p["calibration_file"] == str(path)
    cal = read_calibration(path)
    assert cal == p["calibration"] and set(cal["ar_step_ms"]) == {"1", "2", "4"}
    assert set(cal["drafters"]) == {"dflash", "dels_markov", "dels_rnn", "domino_ft"}
    assert p["workload"]["timed_samples"] == 8 * 20 and p["workload"]["turns"] >= p["workload"]["samples"]
    bound, typical = p["projection"]["bound"], p["projection"]["typical"]
    assert bound["answer_tokens"] == 2048 and typical["answer_tokens"] == 600
    assert 0 < typical["total_seconds"] < bound["total_seconds"]
    for proj in (bound, typical):
        assert "| **total** |" in proj["markdown"] and "batch 32" in proj["markdown"]
        assert {row["drafter"] for row in proj["rows"] if row["stage"] == "timed"} == {
            "none", "dflash", "dels_markov", "dels_rnn", "domino_ft"}
    assert set(p["goals"]) == {"table3_le_1_gpu_hour", "table3_le_1_gpu_hour_at_typical_answers"}
    assert "DeLS Table 3 projected" in proc.stdout                            # the headline, both assumptions


def test_rows_oracle_forces_every_row_through_the_batched_engine(tiny_target, static, cfg_factory, monkeypatch,
                                                                 one_thread):
    """gpu_check's OracleDrafter forks per row (its copy holds a fork of the inner drafter), the engine's one batched
    block pass reaches the inner forks, and RowsOracle forces each row's own AR continuation at a fractional mean
    acceptance (2.5: 2, 3, 2, 3, ...): every row's tokens equal AR's, every round accepts exactly what was forced."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_parts.batch_spec import RowsOracle
    from gpu_parts.common import PromptJob, random_prompts

    from specexp import registry
    from specexp.decoding.batch_spec import speculate_batched
    from specexp.decoding.engine import DecodeConfig
    from specexp.drafters.dflash import DFlashDrafter

    drafter = registry.build_drafter(cfg_factory("drafter=dflash", "drafter.init=random",
                                                 "drafter.block_size=8").drafter, tiny_target)
    prompts = random_prompts(5, 3, 12, 7)
    dc = DecodeConfig(max_new_tokens=20)
    ar = [PromptJob(i, p) for i, p in enumerate(prompts)]
    speculate_batched(static, None, ar, dc, 3, lambda j: None)
    oracle = RowsOracle(drafter, {tuple(j.prompt): j.tokens for j in ar}, 2.5, static.vocab_size, static.device)
    assert [oracle.forced(r) for r in range(4)] == [2, 3, 2, 3]
    twin = copy.copy(oracle)
    assert twin.inner is not drafter and twin.inner.model is drafter.model and twin.refs is oracle.refs

    prepared, passes = [], []
    real = DFlashDrafter.prepare_rows
    monkeypatch.setattr(DFlashDrafter, "prepare_rows", staticmethod(
        lambda rows, anchors, starts, *rest: (prepared.append(len(rows)), real(rows, anchors, starts, *rest))))
    hook = drafter.model.register_forward_hook(lambda *a: passes.append(1))
    try:
        jobs = [PromptJob(i, p) for i, p in enumerate(prompts)]
        rounds = speculate_batched(static, oracle, jobs, dc, 3, lambda j: None)
    finally:
        hook.remove()
    assert prepared and max(prepared) == 3 and len(passes) == len(prepared)    # one block pass a round, all rows
    assert drafter.ctx is None                                                # only the forks held contexts
    for job, want in zip(jobs, ar):
        assert job.tokens == want.tokens
        g = job.gen
        assert g.accept_lengths == [min(oracle.forced(r), k) + 1 if k else 1 for r, k in enumerate(g.drafted)]
        assert max(g.accept_lengths) == 4
    assert rounds < sum(len(j.gen.accept_lengths) for j in jobs)


@pytest.mark.slow
def test_dry_run_of_batch_spec(tmp_path):
    """The part alone (~10-20 s on two cores): AR and the oracle at τ = 6.5 and 3 on B = 1, 2, 4 rows, every row equal
    to AR's and exactly forced, τ as forced within the 12-token budget, the crossover of each τ in the headline."""
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out),
                           "--sections", "batch_spec", "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    r = json.loads(out.read_text())
    p = r["parts"]["batch_spec"]
    assert proc.returncode == 0 and p["status"] == "passed", proc.stdout[-2000:] + str(p["error"])
    assert p["checks"] and all(v is True for v in p["checks"].values()), p["checks"]
    f = p["figures"]
    assert set(f["batches"]) == {"1", "2", "4"} and not f["not_run"]
    assert f["top2_gap"]["min"] > 0.5 and f["top2_gap"]["argmax_is_next_id"] == 1.0
    for b, row in f["batches"].items():
        assert row["ar"]["tau"] == 1.0 and row["ar"]["tokens"] == 12 * int(b) and row["ar"]["tokens_per_s"] > 0
        # 12 tokens: a prefill token, then 6 + 5 (τ 6.5: 5 then 6 forced, the budget cuts the second to 4 drafts)
        # or 3 + 3 + 3 + 2 (τ 3)
        for tau, want in ((6.5, 5.5), (3.0, 2.75)):
            run = row[f"tau={tau}"]
            assert run["tau"] == want and run["rows_differing_from_ar"] == 0 and run["rows_off_forced_acceptance"] == 0
            assert run["speedup"] > 0 and run["decode_speedup"] > 0
    for tau in ("tau=6.5", "tau=3.0"):
        c = f["crossover"][tau]
        assert set(c) == {"decode", "end_to_end", "speedup_by_batch"} and set(c["speedup_by_batch"]) == {"1", "2", "4"}
    assert proc.stdout.count("gpu_check:   batch_spec τ = ") == 2
