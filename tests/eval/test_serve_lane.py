"""The serving lane: vLLM's CPU build (the side environment `bash scripts/install.sh serve` makes) loads and runs
every export of the mini drafters vLLM serves, its output is its own greedy output, and its acceptance agrees with
specexp's τ on the same prompts (task=serve_check, src/specexp/eval/serve_check.py). A key exported with another
meaning than vLLM's (docs/export.md) turns this red, as the drifted export below shows. Skipped, with the reason, only
where vLLM is not installed."""
import json
import shutil
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT

import specexp
from helpers import serve_python
from specexp.eval import serve_check, vllm_side


@pytest.mark.slow
def test_vllm_serves_the_mini_exports_as_specexp_runs_them(tmp_path):
    side = serve_python()
    # fp32: in bf16 vLLM's verify and decode steps break exact ties of the top two logits differently
    over = ["target=smollm2_135m", "target.dtype=float32", "target.prepack=false", "benchmark=gsm8k",
            "eval.num_samples=4", "eval.max_new_tokens=32", "logger=none", f"serve_check.python={side}",
            "serve_check.strict=false"]
    result = specexp.run("serve_check", over, tmp_path / "run")
    md = (tmp_path / "run" / "serve_check.md").read_text()
    assert json.loads((tmp_path / "run" / "serve_check.json").read_text()) == json.loads(json.dumps(result))
    rows = {r["drafter"]: r for r in result["drafters"]}
    assert set(rows) == {"dflash", "eagle3"}, md
    for name, r in rows.items():
        assert r["loaded"], (name, r.get("error"), md)
        assert r["identical_to_vllm_ar"] == r["prompts"] == 4, md      # speculation is lossless in vLLM too
        assert r["vllm_tau"] > 1.2, md                                  # drafts are accepted at all
        assert r["agrees"], md                                          # Δτ's CI includes 0
    # The lane can fail: the same EAGLE-3 export with the key specexp once wrote (norm_output: true, which vLLM reads
    # as "feed the normed state to the next draft step") loads, decodes the target's text, and disagrees in τ with
    # specexp's decode above.
    run_dir = tmp_path / "run"
    drifted = tmp_path / "drifted"
    shutil.copytree(run_dir / "exports" / "eagle3", drifted)
    config = json.loads((drifted / "config.json").read_text())
    (drifted / "config.json").write_text(json.dumps({**config, "norm_output": True}))
    spec = json.loads((run_dir / "vllm_spec.json").read_text())
    k = result["k"]
    spec["runs"] = [{"name": "eagle3", "speculative_config": {"method": "eagle3", "model": str(drifted),
                                                              "num_speculative_tokens": k}}]
    (tmp_path / "drift").mkdir()
    got = vllm_side.run_vllm(str(side), spec, tmp_path / "drift", 1800)["runs"][0]
    ours = rows["eagle3"]["specexp_records"]
    prompts = [(SimpleNamespace(id=r["id"], benchmark=r["benchmark"]), []) for r in ours]
    vllm_ar = [p["output_ids"] for p in json.loads((run_dir / "vllm_out.json").read_text())["runs"][0]["prompts"]]
    row = serve_check.compare_drafter("eagle3", got, ours, prompts, vllm_ar, vllm_ar, k)
    assert row["identical_to_vllm_ar"] == 4 and not row["agrees"] and row["delta_ci95"][1] < 0, row
    # A warm engine (vllm_runner.py --serve, what experiments/bench_serving.py times): ready once, then each request
    # line answered with the same greedy output as the one-shot run, and a 1-token request (the prefill's timing).
    sys.path.insert(0, str(ROOT / "experiments"))
    from bench_serving import VllmWorker

    spec["runs"] = [{"name": "ar", "speculative_config": None}]
    worker = VllmWorker(str(side), spec, tmp_path / "warm", "ar")
    try:
        assert worker.ready["ready"] and worker.ready["startup_s"] > 0
        got = worker.generate(spec["prompts"][:2])
        assert [r["output_ids"] for r in got] == vllm_ar[:2] and all(r["wall_s"] > 0 for r in got)
        assert [len(r["output_ids"]) for r in worker.generate(spec["prompts"][:2], 1)] == [1, 1]
    finally:
        worker.close()
