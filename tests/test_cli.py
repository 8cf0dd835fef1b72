"""The CLI and the evaluator: the results contract, resume, and one-line errors for bad input."""
import json
import os
import shlex
import subprocess
import sys

import pytest
import transformers
from conftest import ROOT
from omegaconf import OmegaConf

from specexp.cli import groups
from specexp.errors import UserError
from specexp.eval import evaluator

# The keys the default eval config defines: the error lists them all, sorted.
EVAL_KEYS = OmegaConf.load(ROOT / "conf" / "eval" / "mini.yaml").keys()
CONTRACT = {"num_samples", "tau", "tau_ci95", "speedup", "tpot_ms", "tpot_ar_ms", "accept_rate_per_position",
            "tau_histogram", "lossless_mismatches"}


def cli(*args, timeout=300):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "specexp", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_issue_command_writes_the_contract(tmp_path):
    d = tmp_path / "run"
    r = cli("task=eval", "target=tiny_qwen3", "drafter=dflash", "drafter.init=random", "benchmark=gsm8k",
            "eval.num_samples=3", "eval.max_new_tokens=48", "eval.check_lossless=true", "logger=none",
            "eval.max_drafts=null",                 # the drafter's own K = 15 (auto caps a CPU run at 3)
            f"hydra.run.dir={d}")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((d / "summary.json").read_text())
    assert s["target"] == "tiny_qwen3" and s["drafter"] == "dflash"
    assert s["decoding"] == {"temperature": 0.0, "protocol": "greedy"}
    g = s["benchmarks"]["gsm8k"]
    assert CONTRACT <= set(g) and g["num_samples"] == 3 and g["lossless_mismatches"] == 0
    assert len(g["accept_rate_per_position"]) == 15 and len(g["tau_histogram"]) == 16
    assert 1.0 <= g["tau"] <= 16 and g["speedup"] > 0
    assert set(s["macro"]) == {"tau", "tau_ci95", "speedup", "speedup_ci95"}
    assert s["mode"] == "online" and g["tau_ci95"][0] <= g["tau"] <= g["tau_ci95"][1]
    assert s["target_dtype"] == "float32" and s["machine"]["device"] == "cpu" and s["machine"]["cpu"]
    assert f"Target in float32 on {s['machine']['cpu']}" in (d / "summary.md").read_text()
    recs = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["lossless"] for r in recs)
    keys = {"id", "benchmark", "new_tokens", "accept_lengths", "tpot", "ar_tpot", "text_sha256", "lossless"}
    assert keys <= set(recs[0])
    assert "| gsm8k | 3 |" in (d / "summary.md").read_text() and "| gsm8k | 3 |" in r.stdout
    info = json.loads((d / "run_info.json").read_text())
    assert info["versions"]["transformers"] == transformers.__version__ and info["device"]["type"] == "cpu"
    assert "sha" in info["git"]
    assert "drafter:" in (d / "config.yaml").read_text()
    # The command line is recorded, and its `rerun` line resumes this very run (every sample done: nothing changes).
    cmd = json.loads((d / "command.json").read_text())
    assert cmd["argv"][1:] == ["task=eval", "target=tiny_qwen3", "drafter=dflash", "drafter.init=random",
                               "benchmark=gsm8k", "eval.num_samples=3", "eval.max_new_tokens=48",
                               "eval.check_lossless=true", "logger=none", "eval.max_drafts=null",
                               f"hydra.run.dir={d}"]
    assert cmd["cwd"] == str(ROOT) and cmd["command"].startswith("python -m specexp task=eval target=tiny_qwen3")
    samples = (d / "samples.jsonl").read_bytes()
    again = cli(*shlex.split(cmd["rerun"])[3:])
    assert again.returncode == 0 and (d / "samples.jsonl").read_bytes() == samples, again.stderr[-2000:]


@pytest.mark.slow
def test_rerun_line_runs_in_a_shell_for_a_directory_with_spaces_and_accents(tmp_path):
    """A run directory named with a space and non-ASCII letters: unquoted, one line saying how to quote it; quoted
    for Hydra, it runs, and the `rerun` line of its command.json, given to a shell as it is, resumes it (nothing
    left to run: samples.jsonl unchanged)."""
    d = tmp_path / "résumé 1"
    run = ["target=tiny_qwen3", "drafter=none", "benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=4",
           "logger=none", "eval.progress=false"]
    r = cli(*run, f"hydra.run.dir={d}")
    assert r.returncode == 2 and f"a value with spaces, non-ASCII letters or quotes must be quoted for Hydra " \
                                 f"inside the shell's quotes: \"hydra.run.dir='{d}'\"" in r.stderr, r.stderr[-2000:]
    r = cli(*run, f"hydra.run.dir='{d}'")
    assert r.returncode == 0, r.stderr[-2000:]
    samples = (d / "samples.jsonl").read_bytes()
    line = json.loads((d / "command.json").read_text(encoding="utf-8"))["rerun"]
    assert line.startswith("python -m specexp ")
    again = subprocess.run(["bash", "-c", shlex.quote(sys.executable) + line.removeprefix("python")], cwd=ROOT,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and (d / "samples.jsonl").read_bytes() == samples, again.stderr[-2000:]


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_rerun_says_it_resumes(tmp_path):
    """Ctrl-C (SIGINT) mid-eval: one line saying how many samples are kept, exit 130, no traceback; the same
    command then says on the console and in specexp.log that it resumes, and runs only the rest."""
    import signal
    import time

    d = tmp_path / "run"
    run = [sys.executable, "-m", "specexp", "target=tiny_qwen3", "drafter=none", "benchmark=gsm8k",
           "eval.num_samples=24", "eval.max_new_tokens=48", "logger=none", "eval.progress=false", "eval.warmup=0",
           f"hydra.run.dir={d}"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    # SIGINT restored to its default in the child: a suite started in the background by a non-interactive shell
    # ignores it, the child would inherit that and run to its end (exit 0) instead of being interrupted.
    proc = subprocess.Popen(run, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and not ((d / "samples.jsonl").exists() and (d / "samples.jsonl").stat().st_size):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    kept = len({json.loads(x)["id"] for x in (d / "samples.jsonl").read_text().splitlines() if x.endswith("}")})
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 130 and "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert lines[0] == (f"specexp: error: interrupted (Ctrl-C) after {kept} of 24 samples; rerun the same command "
                        f"to resume (finished samples are kept in {d})")
    assert 1 <= kept < 24
    again = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    said = f"resuming {d}: {kept} of 24 samples kept, {24 - kept} to run"
    assert again.returncode == 0 and said in again.stdout, again.stderr[-2000:]
    assert said in (d / "specexp.log").read_text()
    assert len((d / "samples.jsonl").read_text().splitlines()) == 24


@pytest.mark.slow
@pytest.mark.parametrize("args, expected", [
    (["drafter=foo"], "drafter=foo is not an option; choose one of: " + ", ".join(groups()["drafter"])),
    (["target=qwen3_9b"], "choose one of: hf, qwen3_4b, qwen3_8b, smollm2_135m, tiny_qwen3"),
    (["eval.nums=3"], "unknown key 'eval.nums'; valid keys under 'eval': " + ", ".join(sorted(EVAL_KEYS))),
    (["drafter=dflash", "drafter.checkpoint=/nonexistent/ckpt", "target=tiny_qwen3", "drafter.init=checkpoint",
      "benchmark=gsm8k", "eval.num_samples=1"], "drafter.checkpoint='/nonexistent/ckpt': no such directory"),
])
def test_bad_command_lines_give_one_line(tmp_path, args, expected):
    r = cli(*args, f"hydra.run.dir={tmp_path / 'x'}", "logger=none")
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip() and "Warning" not in x and "warn" not in x]
    assert len(lines) == 1 and lines[0].startswith("specexp: error: ") and expected in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_resume_after_an_interrupted_run(cfg_factory, tmp_path, monkeypatch):
    cfg = cfg_factory("benchmark=mt_bench", "eval.num_samples=3", "eval.max_new_tokens=12")
    real, calls = evaluator.run_sample, []

    def crash_on_second(*a, **k):
        calls.append(a[2].id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(evaluator, "run_sample", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        evaluator.run_eval(cfg, tmp_path)
    first = (tmp_path / "samples.jsonl").read_text()
    assert len(first.splitlines()) == 2               # one MT-Bench sample = two turns, written together
    assert not (tmp_path / "summary.json").exists()

    calls.clear()
    monkeypatch.setattr(evaluator, "run_sample", lambda *a, **k: calls.append(a[2].id) or real(*a, **k))
    summary = evaluator.run_eval(cfg, tmp_path)
    text = (tmp_path / "samples.jsonl").read_text()
    assert text.startswith(first) and len(text.splitlines()) == 6 and len(calls) == 2   # finished one not rerun
    assert summary["benchmarks"]["mt_bench"]["num_samples"] == 3
    assert summary["benchmarks"]["mt_bench"]["num_turns"] == 6

    # A torn last line (crash mid-write) is dropped and that sample redone.
    (tmp_path / "samples.jsonl").write_text(text + '{"id": "mt_bench/9', encoding="utf-8")
    calls.clear()
    evaluator.run_eval(cfg, tmp_path)
    assert calls == [] and (tmp_path / "samples.jsonl").read_text() == text


def test_a_different_run_is_refused_and_nothing_is_lost(cfg_factory, tmp_path):
    cfg = cfg_factory("benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=6")
    evaluator.run_eval(cfg, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    other = cfg_factory("benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=6", "drafter=none")
    with pytest.raises(UserError, match="holds results of a different run .*drafter"):
        evaluator.run_eval(other, tmp_path)
    assert before == {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}


@pytest.mark.parametrize("overrides, message", [
    (["decoding.temperature=nan", "decoding.protocol=A"], "decoding.temperature=nan is not valid; expected a finite"),
    (["decoding=sample_a", "decoding.temperature=0"], "greedy needs T=0 and protocols A/B/block need T>0"),
    (["decoding=greedy", "decoding.protocol=C"], "decoding.protocol='C' is not valid"),
    (["decoding=sample_b", "eval.check_lossless=true"], "needs greedy decoding"),
    (["eval.max_new_tokens=0"], "eval.max_new_tokens=0 is not valid; expected an int >= 1"),
    (["eval.num_samples=-1"], "eval.num_samples=-1 is not valid; expected an int >= 1, null"),
    (["target.max_context=64"], "exceeds the target context of 64"),
    (["drafter.init=magic"], "drafter.init='magic' is not valid"),
])
def test_bad_values_are_one_clear_error(cfg_factory, tmp_path, overrides, message):
    cfg = cfg_factory("benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=8", *overrides)
    with pytest.raises(UserError, match=message):
        evaluator.run_eval(cfg, tmp_path)


@pytest.mark.parametrize("content, message", [
    ("", "is empty"), ('{"id": "a", "turns": ["q"]}\n{broken\n', "line 2: not valid JSON"),
    ('{"id": "a", "turns": []}\n', "line 1: expected"),
])
def test_bad_benchmark_files(cfg_factory, tmp_path, content, message):
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k.jsonl").write_text(content)
    cfg = cfg_factory("benchmark=gsm8k", f"benchmark.data_dir={data}")
    with pytest.raises(UserError, match=message):
        evaluator.run_eval(cfg, tmp_path / "out")


@pytest.mark.slow
def test_sampling_run_is_reproducible_and_ar_only_run(cfg_factory, tmp_path):
    cfg = cfg_factory("benchmark=alpaca", "eval.num_samples=2", "eval.max_new_tokens=10", "decoding=sample_b")
    a = evaluator.run_eval(cfg, tmp_path / "a")
    b = evaluator.run_eval(cfg, tmp_path / "b")
    ra = [json.loads(x)["text_sha256"] for x in (tmp_path / "a" / "samples.jsonl").read_text().splitlines()]
    rb = [json.loads(x)["text_sha256"] for x in (tmp_path / "b" / "samples.jsonl").read_text().splitlines()]
    assert ra == rb and a["benchmarks"]["alpaca"]["tau"] == b["benchmarks"]["alpaca"]["tau"]
    assert a["decoding"] == {"temperature": 1.0, "protocol": "B"}
    assert a["benchmarks"]["alpaca"]["lossless_mismatches"] is None
    ar = evaluator.run_eval(cfg_factory("benchmark=alpaca", "eval.num_samples=1", "eval.max_new_tokens=6",
                                        "drafter=none"), tmp_path / "ar")
    assert ar["drafter"] == "none" and ar["benchmarks"]["alpaca"]["tau"] == 1.0
    assert ar["benchmarks"]["alpaca"]["speedup"] is None


def test_precheck_leaves_the_keys_of_a_sweep_file_to_hydra():
    """`--config-name` picks another primary config (sweeps/dedit.yaml selects drafter=dedit): its keys are not
    the default config's, so the precheck must not refuse them."""
    from specexp.cli import precheck

    precheck(["-m", "--config-dir", "sweeps", "--config-name", "dedit", "drafter.edit.passes=2",
              "drafter.edit.window=4,5"])                                    # returns: nothing raised
    with pytest.raises(UserError, match="unknown key 'drafter.edit.passes'"):
        precheck(["drafter.edit.passes=2"])                                 # the default drafter has no edit keys


def test_shell_completion_is_hydras():
    """`-sc install=bash` prints Hydra's completion script, and the query it runs at every <TAB> lists the options
    and keys (`install=`/`query=` are Hydra's words, not overrides for the precheck to refuse)."""
    r = cli("-sc", "install=bash", timeout=120)
    assert r.returncode == 0 and "hydra_bash_completion" in r.stdout and "complete " in r.stdout, r.stderr
    env = {**os.environ, "COMP_LINE": "specexp task=re", "COMP_POINT": "15", "PYTHONWARNINGS": "ignore"}
    q = subprocess.run([sys.executable, "-m", "specexp", "-sc", "query=bash"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert q.returncode == 0 and q.stdout.split() == ["task=regenerate", "task=replay", "task=report"], q.stderr


def test_precheck_leaves_hydras_own_flags_to_hydra():
    from specexp.cli import precheck

    for argv in (["-sc", "install=bash"], ["--shell-completion", "query=zsh"], ["--hydra-help"], ["--help"],
                 ["--info", "defaults"], ["-i"], ["--version"]):
        precheck(argv)                                                          # returns: nothing raised
    with pytest.raises(UserError, match="unknown key 'install'"):
        precheck(["install=bash"])                                              # without -sc it is an override
    with pytest.raises(UserError, match="drafter=foo is not an option"):
        precheck(["--cfg", "job", "drafter=foo"])                               # --cfg composes: still checked


@pytest.mark.parametrize("value", ["/tmp/runs/a-1_b.2", "/tmp/résumé 1", "it's", "a\\b", "a\\'b", "null", "", "a,b=c"])
def test_hydra_quote_reads_back_as_the_same_value(value):
    """The rerun line's hydra.run.dir: Hydra's parser gives back exactly the directory, whatever its characters."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from specexp.overrides import hydra_quote

    assert OverridesParser.create().parse_overrides([f"hydra.run.dir={hydra_quote(value)}"])[0].value() == value


def test_an_unknown_key_is_left_to_hydras_one_composition_then_explained_in_one_line():
    """A single run composes its config once: precheck(keys=False) reads only the command line; when Hydra's
    composition fails, explain_failure gives the key check's line (the valid keys), else Hydra's first line."""
    from specexp.cli import explain_failure, precheck

    precheck(["eval.max_new_tokens=8", "eval.mx_new_tokens=8"], keys=False)            # no composition: not refused
    with pytest.raises(UserError, match="drafter=foo is not an option"):
        precheck(["drafter=foo"], keys=False)                                           # an option needs none
    line = explain_failure(["eval.mx_new_tokens=8"], RuntimeError("Could not override 'eval.mx_new_tokens'.\nmore"))
    assert "unknown key 'eval.mx_new_tokens'" in str(line) and "max_new_tokens" in str(line)
    assert str(explain_failure(["eval.max_new_tokens=8"], RuntimeError("first\nsecond"))) == "first"
