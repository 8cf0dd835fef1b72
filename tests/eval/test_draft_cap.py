"""`eval.max_drafts=auto`: a cap of CPU_BF16_MAX_DRAFTS / CPU_FP32_MAX_DRAFTS for a bf16 / fp32 target on a CPU,
the drafter's own K elsewhere;
what a run records and decodes under it."""
import json

import pytest
import torch

from specexp.decoding.settings import CPU_BF16_MAX_DRAFTS, CPU_FP32_MAX_DRAFTS, max_drafts


@pytest.mark.parametrize("value,device,dtype,want", [
    ("auto", "cpu", torch.bfloat16, CPU_BF16_MAX_DRAFTS),
    ("auto", "cpu", torch.float32, CPU_FP32_MAX_DRAFTS),
    ("auto", "cpu", torch.float16, None),
    ("auto", "cuda", torch.bfloat16, None),          # on a GPU a 16-row verify costs about one step
    ("auto", torch.device("cpu"), torch.bfloat16, CPU_BF16_MAX_DRAFTS),
    (None, "cpu", torch.bfloat16, None),               # null: the drafter's own K, whatever the machine
    (5, "cpu", torch.bfloat16, 5),
    (5, "cuda", torch.float32, 5),
])
def test_auto_caps_a_bf16_or_fp32_target_on_a_cpu(value, device, dtype, want):
    assert max_drafts(value, device, dtype) == want


def test_the_main_job_asks_for_auto_and_the_paper_setting_for_the_drafters_own_k(cfg_factory):
    assert cfg_factory().eval.max_drafts == "auto"
    assert cfg_factory("eval=paper").eval.max_drafts is None


@pytest.mark.parametrize("dtype,cap", [("bfloat16", CPU_BF16_MAX_DRAFTS), ("float32", CPU_FP32_MAX_DRAFTS)])
def test_run_settings_record_what_auto_resolved_to(cfg_factory, dtype, cap):
    from specexp.eval.summary import run_settings

    got = run_settings(cfg_factory(f"target.dtype={dtype}"), torch.device("cpu"))["eval"]
    assert got.get("max_drafts") == cap                # absent when it is the drafter's own K, as null is


@pytest.mark.slow
def test_a_bf16_run_on_the_cpu_verifies_at_most_the_cap_and_stays_the_targets(cfg_factory, tmp_path):
    """The tiny target in bf16, a random DFlash of K = 7: auto verifies at most 3 drafts a round; with K drafts the
    same prompts decode the same tokens (greedy; a difference only at a recorded near-tie)."""
    from specexp.eval.evaluator import run_eval

    common = ["benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=24", "drafter.block_size=8",
              "target.dtype=bfloat16", f"paths.cache={tmp_path / 'cache'}"]
    capped = run_eval(cfg_factory(*common), tmp_path / "auto")
    own = run_eval(cfg_factory(*common, "eval.max_drafts=null"), tmp_path / "own")
    assert capped["num_draft_tokens"] == CPU_BF16_MAX_DRAFTS and own["num_draft_tokens"] == 7
    recs = {d: [json.loads(x) for x in (tmp_path / d / "samples.jsonl").read_text().splitlines()]
            for d in ("auto", "own")}
    assert max(k for r in recs["auto"] for k in r["drafted"]) == CPU_BF16_MAX_DRAFTS
    assert max(k for r in recs["own"] for k in r["drafted"]) == 7
    run = json.loads((tmp_path / "auto" / "run.json").read_text())
    assert run["settings"]["eval"]["max_drafts"] == CPU_BF16_MAX_DRAFTS
    for r in recs["auto"] + recs["own"]:              # each equals AR's output, or leaves it at a recorded near-tie
        assert r["lossless"] is True or r["lossless_near_tie"] is True, r
    for b in ("auto", "own"):
        assert json.loads((tmp_path / b / "summary.json").read_text())["benchmarks"]["gsm8k"][
            "lossless_mismatches"] == 0


@pytest.mark.parametrize("native,dtype,cap", [("1", "bfloat16", CPU_BF16_MAX_DRAFTS),
                                              ("0", "float32", CPU_FP32_MAX_DRAFTS)])
def test_resolve_auto_gives_the_run_concrete_dtype_and_cap_once(cfg_factory, monkeypatch, native, dtype, cap):
    """config.resolve_auto: `target.dtype=auto` and `eval.max_drafts=auto` become the names and numbers the loader,
    the engine's settings and run.json read; a second pass changes nothing; on CUDA auto is bf16 and the drafter's K."""
    from specexp.config import checked, resolve_auto

    monkeypatch.setenv("SPECEXP_CPU_BF16", native)
    typed = checked(cfg_factory("target.dtype=auto", "eval.max_drafts=auto"))
    assert (typed.target.dtype, typed.eval.max_drafts) == ("auto", "auto")
    cpu = resolve_auto(typed, torch.device("cpu"))
    assert (cpu.target.dtype, cpu.eval.max_drafts) == (dtype, cap)
    assert resolve_auto(cpu, torch.device("cpu")) == cpu                               # idempotent
    cuda = resolve_auto(typed, "cuda")
    assert (cuda.target.dtype, cuda.eval.max_drafts) == ("bfloat16", None)
    pinned = resolve_auto(checked(cfg_factory("target.dtype=float32", "eval.max_drafts=5")), torch.device("cpu"))
    assert (pinned.target.dtype, pinned.eval.max_drafts) == ("float32", 5)            # explicit values are kept
