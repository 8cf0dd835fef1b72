"""Hub pins (src/specexp/pins.py, scripts/pin_hub_revisions.py): a pinned repo downloads its pinned commit unless
the config names a revision; the pin script lists every hub repo a default names and writes their commits. The hub
itself is replaced by stand-ins (tests never reach it)."""
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from specexp import benchmarks, pins
from specexp import checkpoints as ckpt
from specexp.drafters import dels

ROOT = Path(__file__).resolve().parents[1]
SHA_A, SHA_B = "a" * 40, "b" * 40


def _script():
    spec = importlib.util.spec_from_file_location("pin_hub_revisions", ROOT / "scripts/pin_hub_revisions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def pinned(tmp_path, monkeypatch):
    f = tmp_path / "hub_pins.json"
    f.write_text(json.dumps({"model": {"z-lab/Qwen3-8B-DFlash-b16": SHA_A, "dt3t/DeLS-Spec-Weights": SHA_B},
                             "dataset": {"tatsu-lab/alpaca": SHA_A, "livecodebench/code_generation_lite": SHA_B}}))
    monkeypatch.setattr(pins, "PINS_FILE", f)
    return f


def test_a_pin_is_downloaded_unless_the_config_names_a_revision(pinned, monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def fake_download(repo, revision=None, allow_patterns=None):
        calls.append((repo, revision))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    ckpt.resolve("z-lab/Qwen3-8B-DFlash-b16")
    ckpt.resolve("z-lab/Qwen3-8B-DFlash-b16", "v2")
    ckpt.resolve("z-lab/Qwen3-4B-DFlash-b16")                 # not pinned: the default branch
    dels.resolve_head("dt3t/DeLS-Spec-Weights/qwen3-8b", None, "w")
    assert calls == [("z-lab/Qwen3-8B-DFlash-b16", SHA_A), ("z-lab/Qwen3-8B-DFlash-b16", "v2"),
                     ("z-lab/Qwen3-4B-DFlash-b16", None), ("dt3t/DeLS-Spec-Weights", SHA_B)]


def test_benchmark_datasets_load_at_their_pins(pinned, monkeypatch):
    import datasets

    seen = []

    def fake(dataset, config=None, split=None, data_files=None, revision=None):
        seen.append((dataset, revision, data_files))
        return [{"instruction": "x", "input": "", "question_id": "q", "question_content": "c", "starter_code": ""}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    benchmarks.load(["alpaca", "livecodebench"], None, source="hf", edition="reference")
    assert seen[0][:2] == ("tatsu-lab/alpaca", SHA_A)
    files = seen[1][2]["train"]
    assert len(files) == 6 and all(f"/code_generation_lite/resolve/{SHA_B}/" in f for f in files)


def test_the_pin_script_lists_every_default_hub_repo_and_writes_their_commits(monkeypatch, tmp_path):
    mod = _script()
    wanted = mod.repos()
    assert {"Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "HuggingFaceTB/SmolLM2-135M-Instruct", "z-lab/Qwen3-8B-DFlash-b16",
            "dt3t/DeLS-Spec-Weights", "deepseek-ai/dflash_qwen3_8b_block7"} <= set(wanted["model"])
    assert {"tatsu-lab/alpaca", "livecodebench/code_generation_lite", "google-research-datasets/mbpp",
            "yaro1214/open_data", "TY233/qwen3-4b-instruct-100k-backup"} <= set(wanted["dataset"])
    assert not any(r.startswith("checkpoints") or r == "json" for ids in wanted.values() for r in ids)

    class FakeApi:
        def model_info(self, repo):
            return type("I", (), {"sha": f"{abs(hash(repo)) % 10**8:040d}"})()

        def dataset_info(self, repo):
            if repo == "tatsu-lab/alpaca":
                raise ConnectionError("down")
            return self.model_info(repo)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    out = tmp_path / "pins.json"
    monkeypatch.setattr(sys, "argv", ["pin", "--out", str(out)])
    mod.main()
    written = json.loads(out.read_text())
    assert set(written["model"]) == set(wanted["model"])
    assert set(written["dataset"]) == set(wanted["dataset"]) - {"tatsu-lab/alpaca"}   # unreadable: left unpinned


def test_the_committed_pins_are_commits_of_default_repos():
    committed = json.loads(pins.PINS_FILE.read_text())
    wanted = _script().repos()
    assert set(committed) == set(pins.KINDS)
    for kind, table in committed.items():
        assert set(table) <= set(wanted[kind]), set(table) - set(wanted[kind])
        assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in table.values())
