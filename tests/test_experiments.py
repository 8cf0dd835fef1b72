"""experiments/ scripts turn result directories into tables and figures (here on hand-written summaries)."""
import json
import subprocess
import sys

import yaml

from conftest import ROOT


def fake_run(d, drafter, alpha, beta, tau):
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"fusion": {"alpha": alpha, "beta": beta}}))
    bench = {"gsm8k": {"tau": tau, "speedup": None, "num_samples": 1}}
    (d / "summary.json").write_text(json.dumps({"target": "t", "drafter": drafter, "max_new_tokens": 8,
                                                "decoding": {"protocol": "greedy", "temperature": 0.0},
                                                "benchmarks": bench, "macro": {"tau": tau, "speedup": None}}))


def test_alpha_beta_figure_and_table(tmp_path):
    for a in (0.0, 0.5):
        for b in (0.0, 0.3, 1.0):
            fake_run(tmp_path / f"a{a}_b{b}", "dels_rnn", a, b, 1.0 + a - abs(b - 0.3))
    (tmp_path / "unfinished").mkdir()
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "dels_alpha_beta.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "best: α=0.5, β=0.3, tau 1.500" in out and "α=β=0 (DFlash's own drafts): tau 0.700" in out
    assert (tmp_path / "alpha_beta.png").stat().st_size > 10_000 and (tmp_path / "alpha_beta.md").exists()


def test_dels_table(tmp_path):
    fake_run(tmp_path / "dflash", "dflash", 0.3, 0.3, 1.25)
    fake_run(tmp_path / "rnn", "dels_rnn", 0.3, 0.3, 1.5)
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "dels_table.py"), str(tmp_path / "dflash"),
                          str(tmp_path / "rnn")], capture_output=True, text=True, check=True).stdout
    assert "| dels_rnn (α=0.3, β=0.3) | 1.50 |" in out and "dels_rnn +20.0%" in out
