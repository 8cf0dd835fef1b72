"""Every bad input through the real CLI (`specexp.__main__.main`, in process): exit code 2, exactly one line
`specexp: error: ...` naming the bad value and what would be valid, no traceback, and nothing written to the run
directory when the fault is known before any work."""
import json
import os
import sys

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

SMALL = ["target=tiny_qwen3", "drafter.init=random", "eval.num_samples=1", "eval.max_new_tokens=4",
         "benchmark=gsm8k", "logger=none", "eval.warmup=0", "eval.progress=false", "device=cpu"]
HF = ["target=hf", "drafter=none", "eval.num_samples=1", "eval.max_new_tokens=4", "benchmark=gsm8k", "logger=none",
      "eval.warmup=0", "eval.progress=false", "device=cpu"]
CKPT = [*SMALL, "drafter.init=checkpoint"]


def run_cli(args, run_dir, monkeypatch, capsys):
    """`python -m specexp ARGS hydra.run.dir=RUN_DIR` in this process; returns (exit code, stderr lines)."""
    from specexp.__main__ import main

    GlobalHydra.instance().clear()
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args = [*args, f"hydra.run.dir={run_dir}"]
    monkeypatch.setattr(sys, "argv", ["specexp", *args])
    capsys.readouterr()
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    finally:
        GlobalHydra.instance().clear()
    err = capsys.readouterr().err
    return code, [x for x in err.splitlines() if x.strip() and "warn" not in x.lower()], err


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """Broken checkpoints and model directories, each next to a good one made the same way."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel, init_weights
    from specexp.targets import cache_root, qwen3_tokenizer

    root = tmp_path_factory.mktemp("bad")
    tok = qwen3_tokenizer(cache_root(os.environ["SPECEXP_CACHE"]))
    config = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=True)
    state = {k: v.contiguous() for k, v in Qwen3ForCausalLM(config).state_dict().items() if k != "lm_head.weight"}

    def hf_dir(name, weights=None, config_text=None):
        d = root / name
        d.mkdir()
        tok.save_pretrained(d)
        if config_text is None:
            config.save_pretrained(d)
        else:
            (d / "config.json").write_text(config_text)
        if weights is not None:
            weights(d)
        return str(d)

    full = lambda d: save_file(state, d / "model.safetensors", metadata={"format": "pt"})   # noqa: E731
    hf_dir("good", full)
    (root / "empty").mkdir()
    hf_dir("garbage", lambda d: (d / "model.safetensors").write_bytes(b"not a safetensors file" * 8))
    hf_dir("truncated", lambda d: (d / "model.safetensors").write_bytes(
        (root / "good" / "model.safetensors").read_bytes()[:4000]))
    hf_dir("pickle", lambda d: torch.save(state, d / "pytorch_model.bin"))
    hf_dir("partial", lambda d: save_file({k: v for k, v in state.items() if ".layers.1." not in k},
                                          d / "model.safetensors", metadata={"format": "pt"}))
    hf_dir("no_weights")
    # A bare config is a Qwen3-8B-sized model: it must be refused from the file headers, never allocated.
    hf_dir("bare_config", full, config_text='{"model_type": "qwen3"}')
    hf_dir("bare_no_weights", config_text='{"model_type": "qwen3"}')

    dc = DFlashConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=151936, block_size=8, num_target_layers=4,
                      target_layer_ids=[2], mask_token_id=151669)
    good = root / "dflash_good"
    init_weights(DFlashDraftModel(dc), 0).save_pretrained(good)
    raw = json.loads((good / "config.json").read_text())
    for name, conf, index in [("dflash_list", [1, 2], None), ("dflash_str_hidden", {**raw, "hidden_size": "64"}, None),
                              ("dflash_zero_heads", {**raw, "num_attention_heads": 0}, None),
                              ("dflash_bad_index", raw, "{not json"),
                              ("dflash_no_weight_map", raw, '{"metadata": {}}')]:
        d = root / name
        d.mkdir()
        (d / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
        (d / "config.json").write_text(json.dumps(conf))
        if index is not None:
            (d / "model.safetensors.index.json").write_text(index)
    # A sweep file (another primary config) that adds a key no option has.
    (root / "sweeps").mkdir()
    (root / "sweeps" / "bad_sweep.yaml").write_text("defaults:\n  - config\n  - _self_\n\neval:\n  num_sample: 3\n")
    (root / "a_file").write_text("")
    return root


CASES = [
    # (id, arguments (BAD = the fixture's directory), expected fragment of the one line)
    ("block_size_0", [*SMALL, "drafter.block_size=0"], "drafter.block_size=0 is not valid; expected an int >= 2"),
    ("block_size_1", [*SMALL, "drafter.block_size=1"], "drafter.block_size=1 is not valid; expected an int >= 2"),
    ("num_layers_0", [*SMALL, "drafter.num_layers=0"], "drafter.num_layers=0 is not valid; expected an int >= 1"),
    ("revision_num", [*SMALL, "drafter.revision=1.5"],
     "drafter.revision=1.5 is not valid; expected a hub branch, tag or commit, or null"),
    ("layer_ids_99", [*SMALL, "drafter.target_layer_ids=[99]"],
     "drafter.target_layer_ids=[99] out of range for target tiny_qwen3 (layers 0..3)"),
    ("cpu_threads_neg", [*SMALL, "cpu_threads=-2"], "cpu_threads=-2 is not valid; expected an int >= 1, or null"),
    ("cpu_threads_abc", [*SMALL, "cpu_threads=abc"], "cpu_threads='abc' is not valid; expected an int >= 1"),
    ("cpu_threads_0", [*SMALL, "cpu_threads=0"], "cpu_threads=0 is not valid; expected an int >= 1"),
    ("max_drafts_0", [*SMALL, "eval.max_drafts=0"],
     "eval.max_drafts=0 is not valid; expected an int >= 1, or null (the drafter's own number of drafts)"),
    ("warmup_neg", [*SMALL, "eval.warmup=-3"], "eval.warmup=-3 is not valid; expected an int >= 0"),
    ("shuffle_seed_abc", [*SMALL, "eval.shuffle_seed=abc"], "eval.shuffle_seed='abc' is not valid; expected an int"),
    ("split_bad", [*SMALL, "eval.split=test"], "eval.split='test' is not valid; expected eval or tune"),
    ("tune_samples_neg", [*SMALL, "eval.tune_samples=-2"], "eval.tune_samples=-2 is not valid; expected an int >= 0"),
    ("bool_as_str", [*SMALL, "eval.save_text=abc"], "eval.save_text='abc' has type str; expected bool"),
    ("list_for_scalar", [*SMALL, "eval.max_new_tokens=[4]"], "eval.max_new_tokens=[4] is not valid"),
    ("scalar_for_list", [*SMALL, "benchmark.names=gsm8k"], "benchmark.names='gsm8k' is not valid; expected a non"),
    ("lr_nan", [*SMALL, "task=train", "train.lr=nan"], "train.lr=nan is not valid; expected a finite number > 0"),
    ("top_level_typo", [*SMALL, "evall.num_samples=3"],
     "unknown key 'evall.num_samples'; valid keys at the top level (config groups and keys): benchmark, cpu_threads"),
    ("nested_typo", [*SMALL, "eval.nums=3"], "unknown key 'eval.nums'; valid keys under 'eval': check_lossless"),
    ("added_key", [*SMALL, "+eval.nums=3"], "unknown key 'eval.nums'; valid keys under 'eval': check_lossless"),
    ("experiment_adds_key", ["experiment=mini_dels_rnn", *SMALL, "drafter=dflash", "task=eval"],
     "unknown key 'drafter.head' (set by experiment=mini_dels_rnn); valid keys under 'drafter': block_size"),
    ("sweep_file_adds_key", ["--config-dir", "BAD/sweeps", "--config-name", "bad_sweep", *SMALL],
     "unknown key 'eval.num_sample' (set by --config-name bad_sweep); valid keys under 'eval'"),
    ("device_malformed", [*SMALL, "device=cuda:abc"],
     "device='cuda:abc' is not valid; expected auto, cpu, cuda or cuda:N"),
    ("run_dir_under_a_file", [*SMALL, "hydra.run.dir=BAD/a_file/run"], "a_file is not a directory"),
    ("hf_no_config", [*HF, "target.path=BAD/empty"], "empty': no config.json (not an HF model directory)"),
    ("hf_garbage", [*HF, "target.path=BAD/garbage"], "garbage': cannot read model.safetensors (SafetensorError"),
    ("hf_truncated", [*HF, "target.path=BAD/truncated"], "truncated': cannot read model.safetensors"),
    ("hf_pickle", [*HF, "target.path=BAD/pickle"], "pytorch_model.bin is a pickle file; only safetensors weights"),
    ("hf_partial", [*HF, "target.path=BAD/partial"], "missing tensor model.layers.1."),
    ("hf_no_weights", [*HF, "target.path=BAD/no_weights"], "no model.safetensors (nor model.safetensors.index.json)"),
    ("hf_bare_config", [*HF, "target.path=BAD/bare_config"],
     "missing tensor lm_head.weight (and 330 more): the weights do not match config.json (qwen3, 32 layers)"),
    ("hf_bare_no_weights", [*HF, "target.path=BAD/bare_no_weights"], "no model.safetensors"),
    ("dflash_list", [*CKPT, "drafter.checkpoint=BAD/dflash_list"], "config.json must hold a JSON object, found list"),
    ("dflash_str_hidden", [*CKPT, "drafter.checkpoint=BAD/dflash_str_hidden"],
     "config.json: hidden_size='64' must be an int >= 1"),
    ("dflash_zero_heads", [*CKPT, "drafter.checkpoint=BAD/dflash_zero_heads"],
     "config.json: num_attention_heads=0 must be an int >= 1"),
    ("dflash_bad_index", [*CKPT, "drafter.checkpoint=BAD/dflash_bad_index"],
     "model.safetensors.index.json is not valid JSON"),
    ("dflash_no_weight_map", [*CKPT, "drafter.checkpoint=BAD/dflash_no_weight_map"],
     "model.safetensors.index.json needs a non-empty 'weight_map'"),
    ("shard_out_of_range", [*SMALL, "eval.shard=2/2"],
     "eval.shard='2/2' is not valid; expected null (unsharded) or 'I/N' with ints 0 <= I < N, e.g. eval.shard=0/2"),
    ("shard_not_a_split", [*SMALL, "eval.shard=half"], "eval.shard='half' is not valid; expected null (unsharded)"),
    ("shard_of_training", [*SMALL, "task=train", "eval.shard=0/2"],
     "eval.shard='0/2' applies to task=eval and task=replay only (this is task=train); drop eval.shard"),
    ("merge_without_runs", [*SMALL, "task=merge"], "merge.runs is empty; name the shard directories of one run"),
    ("merge_runs_not_a_list", [*SMALL, "task=merge", "merge.runs=DIR"],
     "merge.runs='DIR' is not valid; expected a list of shard directories"),
    ("merge_of_no_run", [*SMALL, "task=merge", "merge.runs=[BAD/empty]"],
     "merge.runs: BAD/empty holds no run.json: neither a run directory nor a directory of runs"),
    ("launcher_unknown", [*SMALL, "hydra/launcher=slrum"], "hydra/launcher=slrum is not an option; choose one of: "),
    ("prompt_alone_too_long", [*SMALL, "target.max_context=40"],
     "tokens, + 15 drafts) exceeds the target context of 40; no eval.max_new_tokens fits"),
]


SLOW = {"prompt_alone_too_long"}                 # builds the tiny target and tokenizes the prompt first


@pytest.mark.parametrize("args, expected", [pytest.param(*c[1:], id=c[0], marks=[pytest.mark.slow] * (c[0] in SLOW))
                                            for c in CASES])
def test_bad_input_is_one_clear_line(args, expected, bad, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    args = [a.replace("BAD", str(bad)) for a in args]
    code, lines, err = run_cli(args, run_dir, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("specexp: error: "), lines
    assert expected.replace("BAD", str(bad)) in lines[0], lines[0]
    assert not (run_dir / "samples.jsonl").exists()                     # refused before any sample ran


@pytest.mark.slow
def test_the_good_directories_of_the_table_load(bad, tmp_path, monkeypatch, capsys):
    """The broken inputs above differ from these working ones only in what the table names."""
    code, _, err = run_cli([*HF, f"target.path={bad / 'good'}"], tmp_path / "hf", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    code, _, err = run_cli([*CKPT, f"drafter.checkpoint={bad / 'dflash_good'}"], tmp_path / "df", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    assert json.loads((tmp_path / "df" / "summary.json").read_text())["benchmarks"]["gsm8k"]["num_samples"] == 1


@pytest.mark.slow
def test_every_shipped_config_validates():
    """No experiment, drafter or target option trips the validation (it would refuse the repository's own files)."""
    from conftest import ROOT, make_cfg
    from hydra import compose, initialize_config_dir

    from specexp.config import options, validate

    for group in ("experiment", "drafter", "target", "eval", "train", "data", "fusion", "decoding", "logger", "task"):
        for name in options(group):
            validate(make_cfg([f"{group}={name}"]), job={})
    for sweep in sorted((ROOT / "sweeps").glob("*.yaml")):                # the sweep files, as --config-name
        with initialize_config_dir(config_dir=str(ROOT / "sweeps"), version_base="1.3"):
            cfg = compose(sweep.stem, overrides=[f"hydra.searchpath=[file://{ROOT / 'conf'}]"])
        validate(cfg, job={"config_name": sweep.stem})


@pytest.mark.parametrize("what", ["metrics_dir", pytest.param("full_disk", marks=pytest.mark.slow)])
def test_run_directory_faults_are_one_line(what, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if what == "metrics_dir":                 # refused before any work
        (run_dir / "metrics.csv").mkdir()
        expected = "metrics.csv is a directory but the run writes a file there"
    else:                                     # a write that fails as on a full disk, after the first sample
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this system")
        (run_dir / "metrics.csv").symlink_to("/dev/full")
        expected = "cannot write: No space left on device"
    code, lines, err = run_cli([*SMALL, "logger=csv"], run_dir, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and expected in lines[0], lines


@pytest.mark.slow
def test_wandb_without_network_falls_back_to_offline_at_once(tmp_path, monkeypatch, capsys):
    """A configured key and no reachable server: one warning line, an offline run, the key written nowhere."""
    import time

    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")      # the discard port: nothing listens
    monkeypatch.setenv("WANDB_SILENT", "true")
    t0 = time.perf_counter()
    args = [a for a in SMALL if not a.startswith("drafter.")]
    code, _, err = run_cli([*args, "drafter=none", "logger=wandb"], tmp_path / "run", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    warnings = [x for x in err.splitlines() if x.startswith("specexp: warning:")]
    assert len(warnings) == 1 and "unreachable; logging offline" in warnings[0], err[-2000:]
    assert time.perf_counter() - t0 < 60                                   # not the minutes of wandb's retries
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    for f in (tmp_path / "run").rglob("*"):
        assert not f.is_file() or key.encode() not in f.read_bytes(), f


@pytest.mark.slow
def test_typed_views_cover_every_key_of_their_groups():
    """EvalConfig/DecodingConfig/TrainConfig/DataConfig have a field for every key of every option of their group
    (a key added to a YAML file without its field fails here), and `from_cfg` reads the composed values."""
    from dataclasses import fields

    from conftest import make_cfg

    from specexp.config import DataConfig, DecodingConfig, EvalConfig, TrainConfig, option_tree, options

    views = {"eval": EvalConfig, "decoding": DecodingConfig, "train": TrainConfig, "data": DataConfig}
    for group, cls in views.items():
        names = {f.name for f in fields(cls)}
        for name in options(group):
            assert set(option_tree(group, name)) <= names, (group, name, set(option_tree(group, name)) - names)
            view = cls.from_cfg(make_cfg([f"{group}={name}"])[group])
            assert all(getattr(view, k) == v for k, v in option_tree(group, name).items() if "${" not in str(v))
    t = TrainConfig.from_cfg(make_cfg(["train=smoke", "train.lr=0.5"]).train)
    assert t.lr == 0.5 and t.max_steps == 40
    with pytest.raises(AttributeError):
        t.lr = 1.0                                                      # frozen
