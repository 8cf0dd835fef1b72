"""The Python API (`import specexp`): the same composition, task runner and one-line errors as the command line.
Its greedy output equals the CLI's on the same prompts (texts, accept lengths), its summaries are the files the CLI
writes, and a bad name or value raises `specexp.UserError` with the CLI's line instead of printing it."""
import json
import subprocess
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

import specexp

SMALL = ["target=tiny_qwen3", "drafter.init=random", "device=cpu", "logger=none", "eval.warmup=0",
         "eval.progress=false", "benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=12"]


@pytest.fixture(autouse=True)
def clean_hydra():
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


def cli(args, capsys, monkeypatch):
    from specexp.__main__ import main

    monkeypatch.setattr(sys, "argv", ["specexp", *args])
    try:
        main()
    except SystemExit as e:
        return e.code, capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_import_is_light_and_lists_the_api():
    """`import specexp` loads no torch, Hydra or model code: the API is imported on first use."""
    code = ("import sys, specexp; heavy = [m for m in ('torch', 'hydra', 'transformers') if m in sys.modules]; "
            "assert not heavy, heavy; assert callable(specexp.load) and 'specexp.api' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(specexp.__all__) == {"load", "Pipeline", "Output", "evaluate", "replay", "compare", "export", "run",
                                    "compose", "UserError"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        specexp.nope


@pytest.mark.slow
def test_generate_equals_the_cli_and_evaluate_returns_its_summary(tmp_path, capsys, monkeypatch):
    run = tmp_path / "cli"
    code, err = cli([*SMALL, "eval.save_text=true", f"hydra.run.dir={run}"], capsys, monkeypatch)
    assert code == 0, err[-2000:]
    recs = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    from specexp import benchmarks

    prompts = [s.turns[0] for s in benchmarks.load(["gsm8k"], 2)]
    pipe = specexp.load(target="tiny_qwen3", drafter="dflash", overrides=["drafter.init=random", "device=cpu"])
    outs = pipe.generate(prompts, max_new_tokens=12)
    assert [o.text for o in outs] == [r["text"] for r in recs]
    assert [o.accept_lengths for o in outs] == [r["accept_lengths"] for r in recs]
    assert all(len(o.token_ids) == r["new_tokens"] and o.tau == r["tau"] for o, r in zip(outs, recs))
    # One prompt alone, a chat and token ids are prompts too, and give the same answer.
    ids = pipe.encode(prompts[0])
    chat = [{"role": "user", "content": prompts[0]}]
    assert pipe.generate(prompts[0], max_new_tokens=12)[0].token_ids == outs[0].token_ids
    assert pipe.generate([chat, ids], max_new_tokens=12)[1].token_ids == outs[0].token_ids
    ar = specexp.load(target="tiny_qwen3", drafter="none", overrides=["device=cpu"]).generate(prompts[:1], 12)
    assert ar[0].token_ids == outs[0].token_ids and ar[0].accept_lengths == [1] * 11     # lossless, and AR is AR

    summary = specexp.evaluate([*SMALL], out_dir=tmp_path / "api")
    assert summary == json.loads((tmp_path / "api" / "summary.json").read_text())
    paired = specexp.compare(run, tmp_path / "api")
    assert paired["turns_compared"] == 2 and paired["a"] != paired["b"]


def test_errors_are_raised_as_the_cli_prints_them(tmp_path, capsys, monkeypatch):
    for args, fragment in [(["drafter=dflsh"], "drafter=dflsh is not an option; choose one of: "),
                           (["eval.nums=3"], "unknown key 'eval.nums'; valid keys under 'eval'"),
                           (["drafter.block_size=1"], "drafter.block_size=1 is not valid; expected an int >= 2")]:
        code, err = cli([*SMALL, *args, f"hydra.run.dir={tmp_path / 'r'}"], capsys, monkeypatch)
        line = err.strip().splitlines()[-1]
        assert code == 2 and fragment in line, err
        with pytest.raises(specexp.UserError) as e:
            specexp.load(overrides=[*SMALL, *args])
        assert f"specexp: error: {e.value}" == line
    with pytest.raises(specexp.UserError, match="not command-line flags"):
        specexp.load(overrides=["--experimental-rerun", "x"])
    with pytest.raises(specexp.UserError, match="pass out_dir=DIR"):
        specexp.evaluate(SMALL)
    pipe = specexp.load(drafter="none", overrides=[o for o in SMALL if not o.startswith("drafter.")])
    with pytest.raises(specexp.UserError, match=r"a prompt is a str, a list of chat messages or a non-empty list of "
                                                r"token ids in \[0, 151936\)"):
        pipe.generate([[-1, 5]])


@pytest.mark.slow
def test_the_documented_example_runs(tmp_path):
    """docs/api_example.py, as a reader runs it (it asserts greedy AR == greedy DFlash itself)."""
    from conftest import ROOT

    out = subprocess.run([sys.executable, str(ROOT / "docs" / "api_example.py")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "UserError: drafter=dflsh is not an option" in out.stdout and "paired over 2 turns" in out.stdout


def test_the_console_script_is_the_entry_point(tmp_path):
    """`specexp ARGS` (pyproject's [project.scripts]) is `python -m specexp ARGS`: here, the same one-line error."""
    import shutil
    from pathlib import Path

    exe = Path(sys.executable).parent / "specexp"
    if not exe.exists():
        exe = shutil.which("specexp")
        if exe is None:
            pytest.skip("the package is not installed with its console script (pip install -e .)")
    out = subprocess.run([str(exe), "drafter=dflsh"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().startswith("specexp: error: drafter=dflsh is not an option")
    assert len(out.stderr.strip().splitlines()) == 1
