"""experiments/bench_batch.py: its statistics on synthetic numbers (paired speedups and their t-interval, the
crossover batch: crossing between two sizes, never, at the first size), and one smoke run of its main on the tiny
target. Nothing here asserts a speed."""
import json
import math
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import bench_batch as bb  # noqa: E402


def test_t975_matches_scipy():
    from scipy import stats

    for df in (1, 2, 5, 30, 31, 60, 200):
        assert bb.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-3), df
    with pytest.raises(ValueError):
        bb.t975(0)


def test_prompts_for_two_waves_and_a_floor():
    assert [bb.prompts_for(b) for b in (1, 2, 4, 8, 32)] == [8, 8, 8, 16, 64]
    assert bb.prompts_for(3, per_batch=1, minimum=2) == 3


def test_speedup_stats_paired_with_a_t_interval():
    s = bb.speedup_stats([20.0, 22.0, 21.0], [10.0, 10.0, 10.0])
    assert s["ratios"] == [2.0, 2.2, 2.1] and s["median"] == 2.1 and s["repeats"] == 3
    logs = [math.log(r) for r in s["ratios"]]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.303 * sd / math.sqrt(3)
    assert s["geomean"] == pytest.approx(math.exp(mean))
    assert s["ci95"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)])
    assert s["ci95"][0] < s["geomean"] < s["ci95"][1]
    # paired: a drift that moves both methods alike leaves the ratios (and a zero-width interval) unchanged
    same = bb.speedup_stats([10.0, 20.0, 40.0], [5.0, 10.0, 20.0])
    assert same["ratios"] == [2.0, 2.0, 2.0] and same["ci95"] == pytest.approx([2.0, 2.0])
    assert bb.speedup_stats([3.0], [2.0])["ci95"] is None                      # one repeat: no interval
    with pytest.raises(ValueError):
        bb.speedup_stats([1.0, 2.0], [1.0])


def test_crossover_between_two_batches():
    c = bb.crossover([1, 2, 4, 8, 16], [1.5, 1.2, 0.9, 0.7, 0.5])
    assert c["batch"] == 4 and c["between"] == [2, 4]
    # linear in log2 B: 1.2 at log2 = 1, 0.9 at log2 = 2 -> 1.0 at log2 = 1 + 0.2 / 0.3
    assert c["interpolated"] == pytest.approx(2 ** (1 + 0.2 / 0.3))
    assert c["text"].startswith("B = 4 (interpolated 3.2")
    # any order in, a later rise past 1 does not undo the first crossing; exactly 1 counts as crossed
    assert bb.crossover([8, 1, 2, 4], [1.3, 1.4, 1.0, 0.8])["batch"] == 2
    assert bb.crossover([8, 1, 2, 4], [1.3, 1.4, 1.0, 0.8])["interpolated"] == pytest.approx(2.0)
    assert bb.crossover([1, 2, 4, 8], [1.5, 0.9, 1.1, 1.2])["batch"] == 2


def test_crossover_never():
    c = bb.crossover([1, 2, 4, 8], [2.0, 1.8, 1.5, 1.1])
    assert c["batch"] is None and c["interpolated"] is None
    assert c["text"].startswith("none <= 8")
    assert bb.crossover([1, 2], [None, None])["text"] == "not measured"


def test_crossover_at_the_first_batch():
    c = bb.crossover([1, 2, 4], [0.8, 0.7, 0.6])
    assert c["batch"] == 1 and c["interpolated"] is None and c["between"] is None
    assert c["text"].startswith("<= 1")


def test_summarize_pairs_by_repeat_and_batch():
    runs = []
    for rep, drift in enumerate((1.0, 0.5, 2.0)):                     # the machine's speed drifts per repeat
        for b, ar, d in ((1, 10.0, 20.0), (4, 30.0, 36.0), (16, 60.0, 45.0)):
            runs.append({"method": "AR", "batch": b, "repeat": rep, "tokens_per_s": ar * drift, "wall_s": 1.0,
                         "tau": 1.0, "rounds": 10, "decode_tokens_per_s": ar})
            runs.append({"method": "d", "batch": b, "repeat": rep, "tokens_per_s": d * drift, "wall_s": 1.0,
                         "tau": 2.5, "rounds": 4, "mismatches": 1 if b == 16 and rep == 0 else 0})
    s = bb.summarize(runs, ["AR", "d"], [1, 4, 16])
    assert s["methods"]["AR"]["4"]["median_tokens_per_s"] == 30.0
    assert s["methods"]["d"]["1"]["speedup"]["ratios"] == pytest.approx([2.0, 2.0, 2.0])
    assert s["methods"]["d"]["4"]["speedup"]["median"] == pytest.approx(1.2)
    assert s["methods"]["d"]["16"]["mismatches"] == 1 and s["mismatches"] == 1
    assert s["methods"]["d"]["16"]["median_decode_tokens_per_s"] is None     # not recorded for d
    c = s["crossover"]["d"]
    assert c["batch"] == 16 and c["between"] == [4, 16]
    assert c["interpolated"] == pytest.approx(2 ** (2 + 2 * 0.2 / 0.45))


def test_machine_tag():
    assert bb.machine_tag("AMD EPYC 7B13 64-Core Processor", "torch.float32", "2026-12-07") == "2026-12-07-epyc-fp32"
    assert bb.machine_tag("Intel(R) Xeon(R) Processor", "bfloat16", "2026-12-07") == "2026-12-07-xeon-bf16"
    assert bb.machine_tag("", "float32", "d") == "d-cpu-fp32"


def test_overrides_must_follow_the_separator():
    with pytest.raises(SystemExit, match="after `--`"):
        bb.parse(["--drafters", "dflash", "drafter.init=random"])
    args = bb.parse(["--batches", "4,1", "2", "--drafters", "dflash,eagle3", "--", "drafter.init=random"])
    assert args.batches == [1, 2, 4] and args.drafters == ["dflash", "eagle3"]
    assert args.overrides == ["drafter.init=random"] and args.max_drafts == "null"


def test_smoke_run_on_the_tiny_target(tmp_path):
    import torch

    threads = torch.get_num_threads()
    rc = bb.main(["--target", "tiny_qwen3", "--drafters", "dflash", "--batches", "1", "2", "--repeats", "1",
                  "--max-new-tokens", "6", "--prompts-per-batch", "1", "--min-prompts", "3", "--threads", "1",
                  "--out", str(tmp_path), "--", "drafter.init=random"])
    assert rc == 0 and torch.get_num_threads() == threads                     # torch left as it was
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "table.md", "tokens_per_s.png"}
    assert (tmp_path / "tokens_per_s.png").stat().st_size > 1000
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["dtype"] == "torch.float32" and r["config"]["methods"] == ["AR", "dflash"]
    assert len(r["runs"]) == 4 and {(x["method"], x["batch"]) for x in r["runs"]} == {
        (m, b) for m in ("AR", "dflash") for b in (1, 2)}
    for run in r["runs"]:
        assert run["tokens"] > 0 and run["tokens_per_s"] > 0 and run["rounds"] > 0 and run["prompts"] == 3
        assert run["tau"] == 1.0 if run["method"] == "AR" else run["tau"] >= 1.0
    assert all(x["mismatches"] == 0 for x in r["runs"] if x["method"] == "dflash")
    assert r["summary"]["mismatches"] == 0
    assert set(r["summary"]["crossover"]) == {"dflash"}
    assert {"cpu", "cpu_flags", "cores", "torch_threads", "flags"} <= set(r["machine"])
    assert set(r["machine"]["flags"]) == {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert r["machine"]["torch_threads"] == 1 and len(r["load_before"]) == 3 and len(r["load_after"]) == 3
    md = (tmp_path / "table.md").read_text()
    assert "\n| 1 | 3 |" in md and "\n| 2 | 3 |" in md
    assert "dflash × AR" in md and "Crossover" in md and "0 in all" in md


def test_batch_caps_picks_the_best_cap_per_batch_and_writes_the_table():
    import batch_caps

    per_cap = {1: {"1": 1.05, "4": 1.10, "16": 0.95}, 3: {"1": 1.30, "4": 1.02, "16": 0.80},
               7: {"1": 1.10, "4": 0.90, "16": 0.60}}
    chosen = batch_caps.choose(per_cap)
    assert {b: c["cap"] for b, c in chosen.items()} == {"1": 3, "4": 1, "16": 1}
    assert [c["pays"] for c in chosen.values()] == [True, True, False]
    assert batch_caps.table_value(chosen) == "{1: 3, 4: 1}"
