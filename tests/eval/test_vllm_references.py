"""References from vLLM (`replay.reference_engine=vllm`, eval/references.py `VllmReferences`): a set of their own
in the cache (the fingerprint names the engine), recorded in the manifest, run.json and summary.json; multi-turn
samples decoded one vLLM batch per turn depth with each next user turn after the decoded previous answer; bad input
refused in one line before any work. Without vLLM, a stand-in side process (specexp's own greedy decode behind
`run_vllm`'s interface) checks the plumbing; with `.venv-serve` installed, the last test runs vLLM itself on the
mini target and asserts its fp32 references equal specexp's token for token."""
import json
import re
from pathlib import Path

import pytest
from test_bad_input import SMALL, files_under, run_cli

import specexp
from helpers import serve_python
from specexp.benchmarks import Sample
from specexp.decoding.engine import DecodeConfig, generate
from specexp.eval import references
from specexp.eval.references import (
    ReferenceStore,
    VllmReferences,
    compute_reference,
    reference_source,
    set_fingerprint,
)

SAMPLES = [Sample("a", "mt_bench", ["Name a river.", "Now name a second one, and say why."]),
           Sample("b", "gsm8k", ["What is 2+3?"]),
           Sample("c", "mt_bench", ["Write a haiku.", "Shorter.", "Once more, in French."])]


def fake_python(tmp_path: Path, answer: str = '["vllm-fake", "9.9.9"]') -> str:
    """An executable standing in for the side Python: answers the version probe (any `-c` program) with `answer`."""
    p = tmp_path / "python"
    p.write_text(f"#!/bin/sh\necho '{answer}'\n")
    p.chmod(0o755)
    return str(p)


class FakeVllm:
    """`run_vllm`'s interface over specexp's own greedy decode (batch 1), recording every batch it was handed."""

    def __init__(self, target):
        self.target, self.specs = target, []

    def __call__(self, python, spec, d, timeout_s, who, timeout_key):
        self.specs.append(spec)
        dc = DecodeConfig(max_new_tokens=spec["max_new_tokens"], stop_token_ids=tuple(spec["stop_token_ids"]))
        outs = [generate(self.target, None, ids, dc).tokens for ids in spec["prompts"]]
        return {"vllm_version": "9.9.9", "runs": [{"name": "ar", "error": None,
                                                   "prompts": [{"output_ids": o} for o in outs]}]}


def test_the_fingerprint_names_vllm_so_the_two_engines_sets_never_mix(tiny_target, tmp_path):
    dc = DecodeConfig(max_new_tokens=8, stop_token_ids=tuple(tiny_target.stop_token_ids))
    ours = set_fingerprint(tiny_target, dc)
    engine = VllmReferences(fake_python(tmp_path), tiny_target, None, 60).identity
    assert engine == {"name": "vllm", "distribution": "vllm-fake", "version": "9.9.9", "dtype": "float32"}
    theirs = set_fingerprint(tiny_target, dc, engine)
    assert "engine" not in ours                                   # specexp's sets keep the hash they always had
    assert theirs == {**ours, "engine": engine}
    a, b = ReferenceStore(tmp_path / "c", ours), ReferenceStore(tmp_path / "c", theirs)
    assert a.dir != b.dir and a.source == {"name": "specexp"} and b.source == engine
    for store in (a, b):
        manifest = json.loads((store.dir / "manifest.json").read_text())
        assert manifest == {"fingerprint": store.fingerprint, "hash": store.hash, "source": reference_source(
            store.fingerprint)}
    other = set_fingerprint(tiny_target, dc, {**engine, "dtype": "bfloat16"})     # another dtype: another set
    assert ReferenceStore(tmp_path / "c", other).dir not in (a.dir, b.dir)


def test_vllm_references_follow_the_decoded_answers_one_batch_per_turn_depth(tiny_target, tmp_path, monkeypatch):
    t = tiny_target
    fake = FakeVllm(t)
    monkeypatch.setattr(references, "run_vllm", fake)
    monkeypatch.setattr(references, "model_dir", lambda *a: "the target's HF dir")
    dc = DecodeConfig(max_new_tokens=12, stop_token_ids=tuple(t.stop_token_ids))
    got = {}
    VllmReferences(fake_python(tmp_path), t, None, 60).compute(t, SAMPLES, dc, tmp_path / "w",
                                                              lambda r: got.setdefault(r["id"], r))
    assert got == {s.id: compute_reference(t, s, dc) for s in SAMPLES}      # specexp's records, turn for turn
    assert [len(s["prompts"]) for s in fake.specs] == [3, 2, 1]              # every depth's turns in one batch
    for spec in fake.specs:
        assert spec["batched"] and spec["dtype"] == "float32" and spec["max_new_tokens"] == 12
        assert spec["model"] == "the target's HF dir"
        assert spec["ignore_eos"] and spec["stop_token_ids"] == list(t.stop_token_ids)   # specexp's stop rule
        assert spec["runs"] == [{"name": "ar", "speculative_config": None}]
        assert spec["max_model_len"] >= max(map(len, spec["prompts"])) + 12


def test_replay_on_vllm_references_records_their_source(tmp_path, monkeypatch):
    """End to end through the task, with the stand-in side process: run.json, run info and summary.json name the
    references' engine, and the set is cached apart from specexp's."""
    def decode(self, target, prompts, dc, work):        # the stand-in batch: specexp's own greedy decode
        return [generate(target, None, ids, dc).tokens for ids in prompts]
    monkeypatch.setattr(VllmReferences, "generate", decode)
    python = fake_python(tmp_path)
    common = ["target=tiny_qwen3", "drafter.init=random", "benchmark=gsm8k", "eval.num_samples=2",
              "eval.max_new_tokens=6", "logger=none", f"replay.cache_dir={tmp_path / 'refs'}",
              f"replay.tap_cache_dir={tmp_path / 'taps'}"]
    ours = specexp.run("replay", common, tmp_path / "ours")
    theirs = specexp.run("replay", [*common, "replay.reference_engine=vllm", f"replay.vllm_python={python}"],
                         tmp_path / "theirs")
    engine = {"name": "vllm", "distribution": "vllm-fake", "version": "9.9.9", "dtype": "float32"}
    assert theirs["references_source"] == engine and ours["references_source"] == {"name": "specexp"}
    md = (tmp_path / "theirs" / "summary.md").read_text()
    assert "greedy references decoded by vllm-fake 9.9.9 in float32 (" in md
    assert "greedy references (" in (tmp_path / "ours" / "summary.md").read_text()
    run = json.loads((tmp_path / "theirs" / "run.json").read_text())
    assert run["settings"]["references_source"] == engine
    assert "references_source" not in json.loads((tmp_path / "ours" / "run.json").read_text())["settings"]
    assert len(list((tmp_path / "refs").iterdir())) == 2                    # two sets, side by side
    assert theirs["macro"]["tau"] == pytest.approx(ours["macro"]["tau"])     # the stand-in decodes as specexp does


@pytest.mark.parametrize("extra, message", [
    (["replay.reference_engine=vllm", "replay.vllm_python=/nowhere/python"],
     r"^replay.vllm_python='/nowhere/python' is not an executable; run `bash scripts/install.sh serve`"),
    (["replay.reference_engine=sglang"],
     r"^replay.reference_engine='sglang' is not valid; expected one of specexp, vllm"),
    (["replay.reference_engine=vllm", "replay.vllm_python=NOVLLM"],
     r"^replay.vllm_python='.*/python' has no vllm installed \(`bash scripts/install.sh serve` makes one\)$"),
])
def test_bad_reference_engine_input_is_one_line_before_any_work(extra, message, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    no_vllm = fake_python(tmp_path, "")               # executable, answers the probe with nothing: no vllm
    monkeypatch.chdir(work)
    extra = [e.replace("NOVLLM", no_vllm) for e in extra]
    code, lines, _ = run_cli(["task=replay", *SMALL, f"replay.cache_dir={work / 'refs'}", *extra], work / "run",
                             monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and re.search(message, lines[0].removeprefix("specexp: error: ")), lines
    assert files_under(work) == {}                    # no reference set, no run directory


@pytest.mark.slow
def test_vllm_references_equal_specexps_on_the_mini_target_in_fp32(tmp_path):
    side = serve_python()
    over = ["target=smollm2_135m", "target.dtype=float32", "target.prepack=false", "benchmark.names=[gsm8k,mt_bench]",
            "eval.num_samples=2", "eval.max_new_tokens=24", "logger=none", "replay.references_only=true",
            f"replay.cache_dir={tmp_path / 'refs'}", f"replay.tap_cache_dir={tmp_path / 'taps'}"]
    specexp.run("replay", over, tmp_path / "ours")
    specexp.run("replay", [*over, "replay.reference_engine=vllm", f"replay.vllm_python={side}"],
                tmp_path / "theirs")
    sets = {}
    for d in (tmp_path / "refs").iterdir():
        manifest = json.loads((d / "manifest.json").read_text())
        rows = [json.loads(line) for line in (d / "references.jsonl").read_text().splitlines()]
        sets[manifest["source"]["name"]] = ({r["key"]: r["turns"] for r in rows}, manifest["source"])
    assert set(sets) == {"specexp", "vllm"} and sets["vllm"][1]["dtype"] == "float32"
    ours, theirs = sets["specexp"][0], sets["vllm"][0]
    assert len(ours) == 4 and sum(len(t) for t in ours.values()) == 6            # 2 GSM8K + 2 two-turn MT-Bench
    assert theirs == ours                                                          # token for token, every turn
