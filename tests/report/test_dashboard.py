"""task=dashboard: the workspace + report spec is built offline, is reproducible, matches the committed snapshot
(after an intended change: SPECEXP_UPDATE_GOLDEN=1), and pushing without a key is one line that names the key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb_workspaces")

from specexp.errors import UserError  # noqa: E402
from specexp.report.dashboard import run_dashboard  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("dashboard_snapshot.json")


def test_spec_matches_the_snapshot(tmp_path, cfg_factory, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = cfg_factory("task=dashboard", "dashboard.sweep_group=dels_alpha_beta", "benchmark=all")
    run_dashboard(cfg, tmp_path)
    spec = json.loads((tmp_path / "dashboard.json").read_text())
    if os.environ.get("SPECEXP_UPDATE_GOLDEN"):
        SNAPSHOT.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    assert spec == json.loads(SNAPSHOT.read_text()), "dashboard spec changed (SPECEXP_UPDATE_GOLDEN=1 to accept)"
    titles = [r["displayName"] for r in spec["reports"]]
    assert len(titles) == 5 and any("Table 5" in t for t in titles) and any("Figure 2" in t for t in titles)
    sections = [s["name"] for s in spec["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]]
    assert sections[:5] == ["τ and speedup", "α/β sweep", "acceptance", "training", "training cost"]
    text = json.dumps(spec)
    assert "eval/mt_bench/tau" in text and "eval/macro/accept_k15" in text and "dels_alpha_beta" in text


def test_push_without_a_key_is_refused_after_the_spec_is_saved(tmp_path, cfg_factory, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(UserError, match="needs a W&B key: set WANDB_API_KEY") as e:
        run_dashboard(cfg_factory("task=dashboard", "dashboard.push=true"), tmp_path)
    assert "\n" not in str(e.value) and (tmp_path / "dashboard.json").is_file()


@pytest.mark.slow
def test_cli_push_without_a_key_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    p = subprocess.run([sys.executable, "-m", "specexp", "task=dashboard", "dashboard.push=true",
                        f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    lines = [x for x in p.stderr.splitlines() if x.strip() and "warn" not in x.lower()]
    assert lines == [f"specexp: error: dashboard.push=true needs a W&B key: set WANDB_API_KEY (the spec is saved "
                     f"offline in {tmp_path / 'dashboard.json'})"]


def test_replay_runs_are_in_the_panels_and_positions_follow_the_block_size(tmp_path, cfg_factory, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    from specexp.report.dashboard import REPORTS, configured_positions

    filters = {key: f for key, _, _, f in REPORTS}
    assert all("'replay'" in filters[k] for k in ("tau", "alpha_beta", "acceptance"))
    assert "'grid'" in filters["alpha_beta"]
    spec = json.loads(SNAPSHOT.read_text())                        # the snapshot is what the spec builds
    runsets = [f for r in spec["reports"] for b in r["spec"]["blocks"] if b["type"] == "panel-grid"
               for f in b["metadata"]["runSets"][0]["filters"]["filters"] if f["key"]["name"] == "jobType"]
    assert [f["value"] for f in runsets][:3] == [["eval", "replay", "grid", "merge"], ["eval", "replay", "grid"],
                                                  ["eval", "replay", "grid", "merge"]]
    assert configured_positions() == 15                             # the largest block_size of conf/ is 16
    run_dashboard(cfg_factory("task=dashboard", "dashboard.max_position=7"), tmp_path)
    text = (tmp_path / "dashboard.json").read_text()
    assert "eval/macro/accept_k7" in text and "eval/macro/accept_k8" not in text
