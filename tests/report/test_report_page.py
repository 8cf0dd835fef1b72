"""task=report: the kept directories are sorted into runs, sweeps and trainings; the page holds their numbers and
every figure it links exists; rendered by headless Chromium (slow; skipped without the binary) every figure decodes.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specexp.errors import UserError
from specexp.report import page

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def summary(drafter: str, tau: float, k: int = 3) -> dict:
    bench = lambda t: {"num_samples": 2, "num_turns": 2, "tau": t, "tau_ci95": [t - 0.1, t + 0.1],  # noqa: E731
                       "speedup": 1.5, "tpot_ms": 10.0, "tpot_ar_ms": 15.0, "ttft_ms": 30.0,
                       "accept_rate_per_position": [0.5, 0.25, 0.1][:k], "accept_rate_conditional": [0.5, 0.5, 0.4][:k],
                       "tau_histogram": [4, 2, 1, 1][:k + 1], "lossless_mismatches": 0}
    return {"target": "tiny", "drafter": drafter, "decoding": {"protocol": "greedy", "temperature": 0.0},
            "max_new_tokens": 16, "num_draft_tokens": k, "benchmarks": {"gsm8k": bench(tau), "mbpp": bench(tau + 0.2)},
            "macro": {"tau": tau + 0.1, "tau_ci95": [tau, tau + 0.2], "speedup": 1.5}}


def make_inputs(tmp: Path) -> list[Path]:
    """An eval run, a 2 × 2 sweep, a training run with its Lightning CSV log in its stage directory."""
    run = tmp / "eval_a"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary("drafter_a", 1.4321)))
    sweep = tmp / "sweep"
    for a in (0.0, 0.5):
        for b in (0.0, 1.0):
            job = sweep / f"a{a}_b{b}"
            job.mkdir(parents=True)
            (job / "summary.json").write_text(json.dumps(summary("dels", 1.0 + a + b / 10)))
            (job / "config.yaml").write_text(f"fusion:\n  alpha: {a}\n  beta: {b}\n  kernel: auto\npaths:\n"
                                             f"  out: {job}\ndrafter:\n  fusion:\n    alpha: {a}\n")
    stage = tmp / "stage"
    (stage / "logs" / "version_0").mkdir(parents=True)
    (stage / "logs" / "version_0" / "metrics.csv").write_text(
        "epoch,step,train/acc_k1,train/acc_k2,train/loss,train/tau_sim\n0,4,0.2,0.1,9.5,1.2\n1,9,0.3,0.2,7.25,1.4\n")
    train = tmp / "train"
    train.mkdir()
    (train / "train_summary.json").write_text(json.dumps(
        {"steps": 9, "train_seconds": 12.5, "peak_memory_mb": 321.0, "trainable_params": 4489216,
         "precision": "32-true", "sequences": 4, "kind": "head", "title": "DeLS-Spec RNN head",
         "final_metrics": {"train/loss": 7.25}, "run_dir": str(stage)}))
    return [run, sweep, train]


def test_collect_sorts_the_directories_and_finds_the_swept_keys(tmp_path):
    inputs = page.collect(make_inputs(tmp_path))
    assert list(inputs.runs) == ["drafter_a"]
    (sw,) = inputs.sweeps
    assert sw.keys == ["fusion.alpha", "fusion.beta"]      # paths.* differ too, drafter.fusion.alpha is a copy
    assert [v for v, _, _ in sw.jobs] == [(0.0, 0.0), (0.0, 1.0), (0.5, 0.0), (0.5, 1.0)]
    (t,) = inputs.trainings
    assert [r["step"] for r in t.rows] == [4.0, 9.0] and t.rows[1]["train/loss"] == 7.25
    with pytest.raises(UserError, match="holds no summary.json"):
        page.collect([tmp_path / "stage"])
    with pytest.raises(UserError, match="does not exist"):
        page.collect([tmp_path / "nope"])


def test_committed_sweeps_are_recognised():
    inputs = page.collect([RESULTS / "dels_mini" / "sweep", RESULTS / "dedit_mini" / "passes"])
    assert [s.keys for s in inputs.sweeps] == [["fusion.alpha", "fusion.beta"], ["drafter.edit.passes"]]
    assert len(inputs.sweeps[0].jobs) == 16


def _render(tmp_path, cfg_factory, runs) -> Path:
    out = tmp_path / "report"
    cfg = cfg_factory("task=report", "report.runs=[" + ",".join(map(str, runs)) + "]", "report.title=test report")
    page.run_report(cfg, out)
    return out / "index.html"


@pytest.mark.slow
def test_page_holds_the_numbers_and_links_existing_figures(tmp_path, cfg_factory):
    index = _render(tmp_path, cfg_factory, make_inputs(tmp_path))
    text = index.read_text()
    srcs = re.findall(r'<img src="([^"]+)"', text)
    assert len(srcs) == 5 and all((index.parent / s).stat().st_size > 1000 for s in srcs)
    for number in ("1.432", "1.532", "[1.332, 1.532]", "1.50×", "4,489,216", "7.250", "1.600"):
        assert number in text, number


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_headless_chromium_loads_every_figure(tmp_path, cfg_factory):
    """The committed mini results (the α/β sweep, two of its cells as runs, DEdit's E sweep) + a training run."""
    sweep = RESULTS / "dels_mini" / "sweep"
    runs = [sweep / "a0.0_b0.0", sweep / "a0.3_b0.3", sweep, RESULTS / "dedit_mini" / "passes",
            *make_inputs(tmp_path)[2:], ROOT / "checkpoints" / "mini" / "smollm2_135m-dels-rnn"]
    index = _render(tmp_path, cfg_factory, runs)
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", index.as_uri()], capture_output=True, text=True, timeout=120).stdout
    body = re.search(r"<body ([^>]*)>", dom).group(1)
    total, loaded = (int(re.search(rf'{k}="(\d+)"', body).group(1)) for k in ("data-figures", "data-figures-loaded"))
    assert total == 6 and loaded == total                  # 3 eval figures, 2 sweeps, the training curves
    cell = json.loads((sweep / "a0.3_b0.3" / "summary.json").read_text())
    assert f"{cell['macro']['tau']:.3f}" in dom
    assert f"{cell['benchmarks']['gsm8k']['tpot_ms']:.1f}" in dom
    card = json.loads((ROOT / "checkpoints" / "mini" / "smollm2_135m-dels-rnn" / "card.json").read_text())
    assert f"{card['trainable_params']:,d}" in dom


def test_no_runs_is_one_line(tmp_path, cfg_factory):
    with pytest.raises(UserError, match=r"report.runs is empty; give one or more run or sweep directories") as e:
        page.run_report(cfg_factory("task=report"), tmp_path)
    assert "\n" not in str(e.value) and not (tmp_path / "index.html").exists()


def one_prompt_replay() -> dict:
    """A replay summary of one prompt per benchmark, made by the evaluator's own summary: each CI is [τ, τ], and the
    macro CI's upper end comes out 4e-16 below macro τ (the bootstrap's mean and the summary's mean round apart)."""
    from specexp.eval.summary import summarize_records

    lengths = {"gsm8k": [5, 4, 7, 0, 6, 3, 1, 2, 0], "math500": [6, 5, 0, 3, 0, 0, 1, 3], "mbpp": [3, 4, 4]}
    recs = [{"id": "0", "benchmark": b, "turn": 0, "accept_lengths": al, "tau": None, "new_tokens": sum(al) + len(al),
             "drafted": [7] * len(al), "near_tie_rounds": 0, "rounds": len(al), "tf_argmax_mismatches": 0}
            for b, al in lengths.items()]
    header = {"target": "tiny", "drafter": "dflash", "mode": "replay", "max_new_tokens": 64, "num_draft_tokens": 7,
              "decoding": {"protocol": "greedy", "temperature": 0.0}}
    return summarize_records(recs, list(lengths), header)


def test_a_zero_width_ci_below_rounding_draws(tmp_path, cfg_factory):
    """One prompt per benchmark: `'yerr' must not contain negative values` before the error bars were clamped."""
    s = one_prompt_replay()
    assert s["macro"]["tau_ci95"][1] < s["macro"]["tau"]           # the case itself: a negative upper bar length
    run = tmp_path / "replay"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(s))
    index = _render(tmp_path, cfg_factory, [run])
    assert (index.parent / "figures" / "tau_by_benchmark.png").stat().st_size > 1000
    from specexp.report.plots import ci_error

    assert ci_error(2.0, [2.0 + 1e-16, 2.0 - 1e-16]) == (0.0, 0.0) and ci_error(2.0, [1.5, 2.25]) == (0.5, 0.25)
    assert ci_error(2.0, None) == (0.0, 0.0)


@pytest.mark.slow
def test_online_and_replay_runs_never_share_a_chart_and_mixed_benchmark_sets_are_flagged(tmp_path, cfg_factory):
    runs = make_inputs(tmp_path)[:1]                               # online: gsm8k and mbpp
    for name, s in (("replay", one_prompt_replay()), ("other", summary("drafter_b", 1.2))):
        if name == "other":
            del s["benchmarks"]["mbpp"]                            # online too, gsm8k only
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
        runs.append(tmp_path / name)
    text = _render(tmp_path, cfg_factory, runs).read_text()
    assert "τ and speedup by benchmark and drafter (online runs)" in text
    assert "τ and speedup by benchmark and drafter (replay runs)" in text
    online, replay = text.split("(replay runs)</h2>", 1)
    assert "drafter_a" in online and "drafter_b" in online and "dflash (replay)" not in online
    assert "dflash (replay)" in replay and "drafter_a" not in replay.split("<h2>Sweep")[0]
    assert re.findall(r'src="(figures/tau_by_benchmark[^"]*)"', text) == ["figures/tau_by_benchmark.png",
                                                                          "figures/tau_by_benchmark_replay.png"]
    # the two online runs average different benchmarks: flagged; the replay group alone is not
    assert "† (2 of 2)" in online and "† (1 of 2)" in online and "macro τ over different benchmark sets" in online
    assert "†" not in replay
