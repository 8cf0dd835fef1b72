"""specexp's messages go through the `specexp` logger (specexp/log.py): on the console they read `specexp: ...`
(warnings on stderr, tables bare), once each, from the CLI and from Python alike; in a run directory specexp.log
files them with times, and `hydra.verbose=specexp` adds the DEBUG lines of the long phases (references, taps)."""
import re

from test_cli import cli

from specexp import log


def test_lines_read_as_before_from_python(capsys):
    log.LOG.info("hello")
    log.get("specexp.eval.replay").info("from a module")
    log.get("eval.replay").debug("not on the console")
    log.LOG.warning("careful")
    log.table("| a |\n|---|\n")
    out, err = capsys.readouterr()
    assert out == "specexp: hello\nspecexp: from a module\n| a |\n|---|\n"
    assert err == "specexp: warning: careful\n"


def test_a_replay_files_its_phases_in_specexp_log(tmp_path):
    d, cache = tmp_path / "run", tmp_path / "cache"
    r = cli("task=replay", "target=tiny_qwen3", "drafter=dflash", "drafter.init=random", "benchmark=gsm8k",
            "eval.num_samples=2", "eval.max_new_tokens=8", "eval.progress=false", "device=cpu", "logger=none",
            f"replay.cache_dir={cache}/refs", f"replay.tap_cache_dir={cache}/taps", "hydra.verbose=specexp",
            f"hydra.run.dir={d}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("specexp: references: decoding 2 of 2 samples greedily on tiny_qwen3") == 1
    assert "| gsm8k |" in r.stdout and "DEBUG" not in r.stdout and "taps" not in r.stdout
    text = (d / "specexp.log").read_text()
    assert re.search(r"\]\[specexp\]\[INFO\] references: decoding 2 of 2 samples", text)
    assert len(re.findall(r"\[DEBUG\] taps \[.*\] of \d+ reference tokens computed", text)) >= 2
    assert re.search(r"\[INFO\] references: 2 decoded in \d+ s", text) and "| gsm8k |" in text
