"""The results directory: what a rerun into an existing directory may do, the lock, repair of torn or partial
samples, atomic writes, validation before the directory is claimed, duplicate ids."""
import errno
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TINY, make_cfg

from specexp import benchmarks, files
from specexp.benchmarks import Sample
from specexp.errors import UserError
from specexp.eval import evaluator
from specexp.eval.store import ResultStore
from specexp.eval.summary import run_settings
from specexp.rundir import read_records

SETTINGS = {"target": {"name": "tiny_qwen3"}, "drafter": {"name": "dflash", "init": "random"}, "seed": 0}
GSM = [Sample(f"g{i}", "gsm8k", [f"question {i}"]) for i in range(4)]
MT = [Sample(f"m{i}", "mt_bench", [f"first {i}", f"second {i}"]) for i in range(2)]


def rec(sample, turn=0, **extra):
    return {"id": sample.id, "benchmark": sample.benchmark, "turn": turn, "accept_lengths": [1], "tau": 1.0, **extra}


def run_all(sample):
    return [rec(sample, t) for t in range(len(sample.turns))]


def snapshot(d):
    """Every file of a run directory but Hydra's own (empty) job log, which the CLI opens before any check."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and p.name != "specexp.log"}


def finished_dir(d, samples=GSM[:2], settings=SETTINGS):
    with ResultStore(d, settings, samples) as store:
        for s in samples:
            store.append(run_all(s))
    files.write_json(d / "summary.json", {"benchmarks": {}})
    return snapshot(d)


def write_bench(d, rows):
    d.mkdir(parents=True, exist_ok=True)
    (d / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


# ----------------------------------------------------------------------------------------------- reruns
def test_the_same_run_resumes_with_its_finished_samples(tmp_path):
    with ResultStore(tmp_path, SETTINGS, GSM[:3]) as store:
        store.append(run_all(GSM[0]))
    with ResultStore(tmp_path, SETTINGS, GSM[:3]) as store:
        assert store.done() == {("gsm8k", "g0")} and len(store.records) == 1


def test_more_samples_of_the_same_run_extend_it(tmp_path):
    finished_dir(tmp_path, GSM[:2])
    with ResultStore(tmp_path, SETTINGS, GSM[:3]) as store:        # eval.num_samples 2 -> 3
        assert store.done() == {("gsm8k", "g0"), ("gsm8k", "g1")}
    assert set(json.loads((tmp_path / "run.json").read_text())["samples"]["gsm8k"]) == {"g0", "g1", "g2"}
    with ResultStore(tmp_path, SETTINGS, GSM[:2] + MT) as store:    # another benchmark next to the recorded one
        assert len(store.done()) == 2
        store.append(run_all(MT[0]))
    with pytest.raises(UserError, match="benchmarks recorded: gsm8k, mt_bench; this run: gsm8k"):
        ResultStore(tmp_path, SETTINGS, GSM[:3])                      # leaves recorded samples out


@pytest.mark.parametrize("base, other, named", [
    ([], ["eval.max_new_tokens=7"], "eval.max_new_tokens: recorded 64, now 7"),
    ([], ["decoding=sample_b"], "decoding.protocol: recorded 'greedy', now 'B'"),
    ([], ["seed=1"], "seed: recorded 0, now 1"), ([], ["drafter.block_size=8"], "drafter.block_size"),
    ([], ["drafter.init=auto"], "drafter.init: recorded 'random', now 'auto'"),
    ([], ["eval.run_ar=false"], "eval.run_ar"),
    ([], ["eval.check_lossless=false"], "eval.check_lossless"), ([], ["eval.save_text=false"], "eval.save_text"),
    ([], ["eval.near_tie=0.5"], "eval.near_tie: recorded 0.01, now 0.5"),
    ([], ["target.num_layers=2"], "target.num_layers"), ([], ["cpu_threads=1"], "cpu_threads: recorded None, now 1"),
    (["drafter=dels_rnn"], ["drafter=dels_rnn", "fusion.alpha=0.5"], "drafter.fusion.alpha: recorded 0.3, now 0.5"),
])
def test_a_different_setting_is_refused_and_nothing_changes(tmp_path, base, other, named):
    cpu = torch.device("cpu")
    settings = run_settings(make_cfg([*TINY, *base]), cpu)
    before = finished_dir(tmp_path, settings=settings)
    with pytest.raises(UserError, match="holds results of a different run") as e:
        ResultStore(tmp_path, run_settings(make_cfg([*TINY, *other]), cpu), GSM[:2])
    assert named in str(e.value)
    assert snapshot(tmp_path) == before
    with ResultStore(tmp_path, settings, GSM[:2]) as store:                          # and still resumable
        assert len(store.done()) == 2


def test_a_checkpoint_retrained_in_place_is_a_different_run(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights v1")
    cfg = make_cfg([*TINY, "drafter.init=checkpoint", f"drafter.checkpoint={ckpt}"])
    finished_dir(tmp_path / "run", settings=run_settings(cfg, torch.device("cpu")))
    (ckpt / "README.md").write_text("a new card")                        # documentation only: the same run
    ResultStore(tmp_path / "run", run_settings(cfg, torch.device("cpu")), GSM[:2]).close()
    (ckpt / "model.safetensors").write_bytes(b"weights v2")
    with pytest.raises(UserError, match=r"checkpoint_content\.drafter\.checkpoint: recorded '[0-9a-f]{16}', now"):
        ResultStore(tmp_path / "run", run_settings(cfg, torch.device("cpu")), GSM[:2])


def test_a_run_on_another_device_is_a_different_run(tmp_path):
    cfg = make_cfg([*TINY, "eval.max_drafts=null"])          # auto would differ too (a cap on a CPU, none on CUDA)
    finished_dir(tmp_path, settings=run_settings(cfg, torch.device("cpu")))
    with pytest.raises(UserError, match=r"\(device: recorded 'cpu', now 'cuda'\)"):
        ResultStore(tmp_path, run_settings(cfg, torch.device("cuda")), GSM[:2])


def test_selection_keys_only_select_samples(cfg_factory):
    """num_samples, benchmark names, source, data_dir and shuffle_seed reach run.json through the samples."""
    cpu = torch.device("cpu")
    a = run_settings(cfg_factory("eval.num_samples=2", "benchmark=gsm8k"), cpu)
    b = run_settings(cfg_factory("eval.num_samples=3", "benchmark=mt_bench", "eval.shuffle_seed=4"), cpu)
    assert a == b


def _load(name, n, seed=0, data_dir=None):
    return benchmarks.load([name], n, seed, "local", data_dir)


@pytest.mark.parametrize("first, second, message", [
    (lambda p: _load("gsm8k", 2), lambda p: _load("math500", 2), "benchmarks recorded: gsm8k; this run: math500"),
    (lambda p: _load("gsm8k", 2), lambda p: _load("gsm8k", 1), "1 of the 2 recorded gsm8k samples are not"),
    (lambda p: _load("gsm8k", 2), lambda p: _load("gsm8k", 2, seed=1), "recorded gsm8k samples are not in"),
    (lambda p: _load("gsm8k", None, data_dir=write_bench(p / "a", [{"id": "q", "turns": ["What is 2+2?"]}])),
     lambda p: _load("gsm8k", None, data_dir=write_bench(p / "b", [{"id": "q", "turns": ["What is 3+3?"]}])),
     "the prompt of 1 recorded gsm8k sample.* differs, e.g. 'q'"),
])
def test_another_selection_or_prompt_is_refused(tmp_path, first, second, message):
    d = tmp_path / "run"
    before = finished_dir(d, first(tmp_path))
    with pytest.raises(UserError, match=message):
        ResultStore(d, SETTINGS, second(tmp_path))
    assert snapshot(d) == before


def test_same_prompts_from_another_data_dir_resume(tmp_path):
    rows = [{"id": "q", "turns": ["What is 2+2?"]}]
    finished_dir(tmp_path / "run", _load("gsm8k", None, data_dir=write_bench(tmp_path / "a", rows)))
    with ResultStore(tmp_path / "run", SETTINGS, _load("gsm8k", None, data_dir=write_bench(tmp_path / "b", rows))) as s:
        assert s.done() == {("gsm8k", "q")}


def test_a_directory_without_results_is_free(tmp_path):
    """A run that claimed the directory and died before its first sample leaves nothing to protect."""
    ResultStore(tmp_path, {**SETTINGS, "seed": 5}, GSM[:2]).close()
    with ResultStore(tmp_path, SETTINGS, GSM[:2]) as store:
        assert store.done() == set()
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["seed"] == 0


def test_results_of_an_older_layout_are_refused(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(SETTINGS))            # format 1: a flat fingerprint
    (tmp_path / "samples.jsonl").write_text(json.dumps(rec(GSM[0])) + "\n")
    with pytest.raises(UserError, match="older format"):
        ResultStore(tmp_path, SETTINGS, GSM[:2])


# ----------------------------------------------------------------------------------------------- the lock
def test_a_second_store_is_refused_while_the_first_holds_the_directory(tmp_path):
    first = ResultStore(tmp_path, SETTINGS, GSM[:2])
    first.append(run_all(GSM[0]))
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=rf"{tmp_path} is in use by another run \(pid {os.getpid()}\)"):
        ResultStore(tmp_path, SETTINGS, GSM[:2])
    assert snapshot(tmp_path) == before
    first.close()
    with ResultStore(tmp_path, SETTINGS, GSM[:2]) as store:
        assert store.done() == {("gsm8k", "g0")}


# Another process that holds DIR/.lock as a running store does (flock + its pid); plain Python, so it starts fast.
HOLD = """
import fcntl, os, sys, time
f = open(os.path.join(sys.argv[1], ".lock"), "a+")
fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
f.truncate(0)
f.write(str(os.getpid()))
f.flush()
print("held", flush=True)
time.sleep(120)
"""


def test_another_process_holds_the_directory_until_it_dies(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"in use by another run \(pid {p.pid}\)"):
            ResultStore(tmp_path, SETTINGS, GSM[:1])
    finally:
        p.kill()
        p.wait()
    assert (tmp_path / ".lock").exists()                 # a killed holder leaves the file; it does not block
    ResultStore(tmp_path, SETTINGS, GSM[:1]).close()


# ----------------------------------------------------------------------------------------------- repair
def test_an_unterminated_last_record_is_dropped_and_its_sample_redone(tmp_path):
    with ResultStore(tmp_path, SETTINGS, GSM[:3]) as store:
        store.append(run_all(GSM[0]))
        store.append(run_all(GSM[1]))
    path = tmp_path / "samples.jsonl"
    path.write_bytes(path.read_bytes()[:-1])           # a complete JSON object, but no final newline
    with ResultStore(tmp_path, SETTINGS, GSM[:3]) as store:
        assert store.done() == {("gsm8k", "g0")}
        store.append(run_all(GSM[1]))
        store.append(run_all(GSM[2]))
    records, torn = read_records(path)
    assert not torn and [r["id"] for r in records] == ["g0", "g1", "g2"]
    with ResultStore(tmp_path, SETTINGS, GSM[:3]) as store:                    # and the next run accepts it
        assert len(store.done()) == 3


def test_a_torn_last_line_is_dropped_but_a_corrupt_middle_line_is_refused(tmp_path):
    with ResultStore(tmp_path, SETTINGS, GSM[:2]) as store:
        store.append(run_all(GSM[0]))
    path = tmp_path / "samples.jsonl"
    good = path.read_text()
    path.write_text(good + '{"id": "g1", "bench')
    with ResultStore(tmp_path, SETTINGS, GSM[:2]):
        pass
    assert path.read_text() == good
    path.write_text('{"id": "g1", "bench\n' + good)
    with pytest.raises(UserError, match="samples.jsonl line 1 is corrupt"):
        ResultStore(tmp_path, SETTINGS, GSM[:2])


def test_a_multi_turn_sample_is_done_only_with_all_its_turns(tmp_path):
    with ResultStore(tmp_path, SETTINGS, MT) as store:
        store.append(run_all(MT[0]))
        store.append(run_all(MT[1])[:1])                  # as if the second turn's line was torn off
    with ResultStore(tmp_path, SETTINGS, MT) as store:
        assert store.done() == {("mt_bench", "m0")}
    records, _ = read_records(tmp_path / "samples.jsonl")
    assert [(r["id"], r["turn"]) for r in records] == [("m0", 0), ("m0", 1)]   # the partial sample is discarded


def test_repeated_records_count_once(tmp_path):
    """Directories written before the lock existed may hold two copies of a sample (two runs at once)."""
    with ResultStore(tmp_path, SETTINGS, MT) as store:
        store.append(run_all(MT[0]))
        store.append(run_all(MT[0]))
    with ResultStore(tmp_path, SETTINGS, MT) as store:
        assert len(store.records) == 2 and store.done() == {("mt_bench", "m0")}


# ----------------------------------------------------------------------------------------------- atomic writes
class _FullDisk:
    """A file object whose write lands half its text, then fails as a full disk does."""

    def __init__(self, f):
        self.f = f

    def write(self, text):
        self.f.write(text[: len(text) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@pytest.mark.parametrize("write", [
    lambda p: files.write_text_atomic(p, "new text " * 2000),
    lambda p: files.write_json(p, {"new": list(range(2000))}),
])
def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, write):
    path = tmp_path / "config.yaml"
    path.write_text("old: 1\n")
    monkeypatch.setattr(files, "open", lambda *a, **k: _FullDisk(open(*a, **k)), raising=False)
    with pytest.raises(OSError, match="No space left"):
        write(path)
    assert path.read_text() == "old: 1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_atomic_writes_replace_and_keep_files_readable(tmp_path):
    path = tmp_path / "summary.md"
    files.write_text_atomic(path, "a")
    files.write_text_atomic(path, "b")
    assert path.read_text() == "b" and oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]


# ----------------------------------------------------------------------------------------------- validation first
@pytest.mark.slow
def test_a_run_that_fails_validation_leaves_the_directory_claimable(cfg_factory, tmp_path):
    bad = cfg_factory("benchmark=gsm8k", "eval.num_samples=1", "drafter.init=checkpoint",
                      "drafter.checkpoint=/nonexistent/ckpt")
    with pytest.raises(UserError, match="no such directory"):
        evaluator.run_eval(bad, tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    good = run_settings(cfg_factory("benchmark=gsm8k", "eval.num_samples=1"), torch.device("cpu"))
    ResultStore(tmp_path, good, GSM[:1]).close()


def test_duplicate_sample_ids_are_refused(tmp_path):
    d = write_bench(tmp_path, [{"id": "q1", "turns": ["What is 2+2?"]}, {"id": "q2", "turns": ["a"]},
                               {"id": "q1", "turns": ["What is 3+3?"]}])
    with pytest.raises(UserError, match=r"gsm8k.jsonl line 3: duplicate id 'q1' \(also on line 1\)"):
        _load("gsm8k", None, data_dir=d)


# ----------------------------------------------------------------------------------------------- end to end
def cli(*args, preexec_fn=None):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "specexp", "target=tiny_qwen3", "drafter.init=random",
                           "eval.max_new_tokens=8", "eval.warmup=0", "eval.progress=false", "logger=none",
                           "device=cpu", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=preexec_fn)


def error_lines(r):
    return [x for x in r.stderr.splitlines() if x.strip() and "warn" not in x.lower()]


@pytest.mark.slow
def test_cli_refuses_another_benchmark_a_busy_directory_and_a_full_disk(cfg_factory, tmp_path):
    import resource

    d = tmp_path / "run"
    cfg = cfg_factory("benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=8")
    evaluator.run_eval(cfg, d)
    before = snapshot(d)

    r = cli("benchmark=math500", "eval.num_samples=2", f"hydra.run.dir={d}")
    assert r.returncode == 2 and len(error_lines(r)) == 1, r.stderr
    assert "holds results of a different run (benchmarks recorded: gsm8k; this run: math500" in r.stderr
    assert snapshot(d) == before

    settings = run_settings(cfg, torch.device("cpu"))
    with ResultStore(d, settings, benchmarks.load(["gsm8k"], 2)):                # this process holds DIR
        r = cli("benchmark=gsm8k", "eval.num_samples=2", f"hydra.run.dir={d}")
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "is in use by another run" in r.stderr, r.stderr

    # A full disk: every file this process writes is cut at 1 KiB (RLIMIT_FSIZE; Python then gets EFBIG).
    before = snapshot(d)
    r = cli("benchmark=gsm8k", "eval.num_samples=2", f"hydra.run.dir={d}",
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)))
    assert r.returncode != 0
    after = snapshot(d)
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_cli_partial_multi_turn_sample_and_a_corrected_command(cfg_factory, tmp_path):
    d, run = tmp_path / "run", ("benchmark=mt_bench", "eval.num_samples=1", "eval.run_ar=false")
    r = cli(*run, "drafter.init=checkpoint", "drafter.checkpoint=/nonexistent", f"hydra.run.dir={d}")
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = cli(*run, f"hydra.run.dir={d}")                                        # the corrected command
    assert r.returncode == 0, r.stderr[-2000:]
    path = d / "samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 2
    path.write_text(lines[0] + lines[1][:30])                                  # turn 1 torn off
    summary = evaluator.run_eval(cfg_factory(*run, "eval.max_new_tokens=8"), d)
    assert summary["benchmarks"]["mt_bench"]["num_turns"] == 2
    redone = path.read_text().splitlines(keepends=True)
    assert [json.loads(x)["turn"] for x in redone] == [0, 1]                 # the whole sample redone
    assert [json.loads(x)["text_sha256"] for x in redone] == [json.loads(x)["text_sha256"] for x in lines]


@pytest.mark.parametrize("record, fragment", [
    ({"accept_lengths": [-5, 0]}, "accept_lengths holds -5; expected ints from 1 to 4,096"),
    ({"accept_lengths": [10 ** 400, 1]},
     "accept_lengths holds 100000000000000000000000… (401 digits); expected ints from 1"),
    ({"tpot": float("nan")}, "tpot=nan; expected a finite number of seconds >= 0, or null"),
    ({"ar_tpot": -1.0}, "ar_tpot=-1.0; expected a finite number of seconds >= 0"),
], ids=["negative", "huge", "nan_tpot", "negative_ar_tpot"])
def test_a_record_a_reader_cannot_use_is_one_line_naming_file_and_line(tmp_path, record, fragment):
    """issue #49 rows 10, 12, 13: compare, merge and report read samples.jsonl through this reader."""
    from specexp.rundir import run_records

    good = {"id": "a", "benchmark": "gsm8k", "turn": 0, "accept_lengths": [2, 1], "tpot": 0.01}
    lines = [json.dumps(good), json.dumps({**good, "id": "b", **record})]
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        run_records(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'samples.jsonl'} line 2: {fragment}") and "\n" not in str(e.value)


def test_a_reader_refuses_a_repeated_turn(tmp_path):
    from specexp.rundir import run_records

    good = {"id": "a", "benchmark": "gsm8k", "turn": 0, "accept_lengths": [2, 1]}
    (tmp_path / "samples.jsonl").write_text("\n".join([json.dumps(good)] * 2) + "\n")
    with pytest.raises(UserError, match=r"samples.jsonl: record 2 repeats gsm8k/a turn 0; a run holds one record a "
                                         r"turn"):
        run_records(tmp_path)
    (tmp_path / "samples.jsonl").write_text(json.dumps(good) + "\n")
    assert len(run_records(tmp_path)) == 1
