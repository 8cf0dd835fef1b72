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


def test_domino_table3_gain_ratio_and_cost(tmp_path):
    for name, tau in (("dflash", 1.2), ("dels_markov", 1.3), ("dels_rnn", 1.25), ("domino_ft", 1.4)):
        fake_run(tmp_path / name, name, 0.3, 0.3, tau)
    card = tmp_path / "domino_card.json"
    card.write_text(json.dumps({"steps": 10, "train_seconds": 120.0, "peak_memory_mb": 1024.0,
                                "trainable_params": 1234, "head": {"architecture": "domino_head"}}))
    runs = [str(tmp_path / n) for n in ("dflash", "dels_markov", "dels_rnn", "domino_ft")]
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "domino_table3.py"), *runs, "--cards", str(card),
                          "--out", str(tmp_path / "t3.md")], capture_output=True, text=True, check=True).stdout
    assert "| gain ratio Markov / Domino-FT | 0.50 | 0.50 |" in out and "| gain ratio RNN / Domino-FT | 0.25 |" in out
    assert "| domino_card (domino) | 1,234 | 10 | 2.0 min | 1.00 GiB |" in out and (tmp_path / "t3.md").exists()


def _dedit_run(d, tau, passes=2, window=None, edits=None):
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"drafter": {"edit": {"passes": passes, "window": window}}}))
    b = {"tau": tau, "speedup": None}
    if edits:
        b["edits"] = edits
    (d / "summary.json").write_text(json.dumps({"benchmarks": {"gsm8k": b, "mbpp": b},
                                                "macro": {"tau": tau, "speedup": None}}))


def test_dedit_figures(tmp_path):
    for e in range(3):
        _dedit_run(tmp_path / "passes" / f"E{e}", 1.2 + 0.1 * e, passes=e)
    for w in (4, 6):
        _dedit_run(tmp_path / "window" / f"W{w}", 1.1 + 0.01 * w, window=w)
    pm = {"rounds": 10, "edited": 4, "harmful": 1, "helpful": 2, "neutral": 1, "tau_by_passes": {"1": 1.5, "2": 2.0},
          "rounds_by_passes": {"1": 6, "2": 4}}
    _dedit_run(tmp_path / "pm", 1.4, edits=pm)
    _dedit_run(tmp_path / "plain", 1.3, edits={**pm, "harmful": 2, "helpful": 1})
    _dedit_run(tmp_path / "causal", 1.25)
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "dedit_figures.py"), "--passes",
                          str(tmp_path / "passes"), "--window", str(tmp_path / "window"),
                          "--mix", f"proposalmix={tmp_path / 'pm'}", f"plain={tmp_path / 'plain'}",
                          "--editor", f"bidirectional={tmp_path / 'pm'}", f"causal={tmp_path / 'causal'}",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, check=True).stdout
    assert "| E = 2 | 1.40 | 1.40 | 1.400 |" in out and "| W = 6 | 1.16 | 1.16 | 1.160 |" in out
    assert "| proposalmix | 20 | 8 | 2 | 4 | 25.0% | 50.0% | 1.400 |" in out
    assert "| plain | 20 | 8 | 4 | 2 | 50.0% | 25.0% | 1.300 |" in out
    assert "causal − bidirectional, macro τ: -0.150" in out and "| 2 | 8 | 2.000 |" in out
    assert (tmp_path / "out" / "dedit.png").stat().st_size > 10_000
