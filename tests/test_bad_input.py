"""Every bad input through the real CLI (`specexp.__main__.main`, in process), as one table (CASES): exit code 2,
exactly one line `specexp: error: ...` naming the bad value and what would be valid, no traceback, and no file
written or changed. Below the table: what the same readers accept, the faults that arise mid-run (a full disk),
sweeps whose jobs fail one by one, and the last-resort guard for internal errors (exit 1, the traceback logged)."""
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

    from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
    from specexp.drafters.layers import init_weights
    from specexp.paths import cache_root
    from specexp.targets.hf import qwen3_tokenizer

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


# ---------------------------------------------------------------------------------------------- inputs the table uses
TINY = ["target=tiny_qwen3", "drafter=none", "eval.num_samples=1", "eval.max_new_tokens=2", "benchmark=gsm8k",
        "logger=none", "eval.warmup=0", "eval.progress=false", "device=cpu"]
EAGLE_TREE = [*TINY, "drafter=eagle3", "drafter.init=random", "drafter.mode=tree"]
TRAIN = ["task=train", "target=tiny_qwen3", "drafter=dflash", "drafter.init=random", "data=smoke", "train=smoke",
         "logger=none", "device=cpu"]
PRIOR = ["task=prior", "target=tiny_qwen3", "data=smoke", "logger=none", "device=cpu"]
REPLAY = ["task=replay", *SMALL, "replay.cache_dir=TMP/cache", "replay.tap_cache=false"]
COMPARE = ["task=compare", "compare.a=TMP/a", "compare.b=TMP/b", "logger=none"]
HUB = [*TRAIN, "data.source=hub", "data.hub.id=TMP/hub.jsonl", "data.hub.format=sharegpt"]
EXPORT = ["task=export", "target=tiny_qwen3", "drafter=dflash", "drafter.checkpoint=BAD/dflash_good", "logger=none",
          "device=cpu"]
CORES = os.cpu_count() or 1
VOCAB = [*SMALL, "drafter=dflash", "eval.draft_vocab=100"]
PLAN = ["task=plan", "target=tiny_qwen3", "plan.drafters=[none,dflash]", "benchmark=gsm8k", "logger=none", "device=cpu"]
PLAN_CAL = json.dumps({"version": 1, "prefill_ms_per_token": 0.01, "teacher_forced_ms_per_token": 0.02,
                       "ar_step_ms": {"1": 10.0}, "verify_ms": {"2": 10.0},
                       "drafters": {"dflash": {"max_drafts": 7, "taps": [1], "propose_ms": 2.0,
                                               "replay_anchor_ms": 0.1}}})
REGEN_MANIFEST = json.dumps({"format": "specexp-regen/1", "provenance": {"target": {"name": "tiny_qwen3"}},
                             "rows": [["r0", 2, 2, True]]})
GOOD_REC = {"id": "q1", "benchmark": "gsm8k", "turn": 0, "accept_lengths": [1, 2], "text_sha256": "x"}
MSG = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}


def _rec(i, **change):
    return json.dumps({**GOOD_REC, "id": f"q{i}", **change})


def _without(key):
    return json.dumps({k: v for k, v in GOOD_REC.items() if k != key})


def _run_dir(path, lines, packed=False):
    """A run directory holding `lines` as its samples.jsonl (gzipped with `packed`) and a summary."""
    import gzip

    path.mkdir(parents=True, exist_ok=True)
    data = "".join(x + "\n" for x in lines).encode()
    if packed:
        (path / "samples.jsonl.gz").write_bytes(gzip.compress(data))
    else:
        (path / "samples.jsonl").write_bytes(data)
    (path / "summary.json").write_text(json.dumps({"drafter": "dflash", "mode": "replay"}))
    return path


# Setups: each makes the files a case names (under TMP, the test's tmp_path), given (tmp, bad, monkeypatch).
def runs(a_lines, packed=False):
    """Run directories TMP/a (these lines) and TMP/b (three good records), as compare reads them."""
    def setup(tmp, bad, mp):
        _run_dir(tmp / "a", a_lines, packed)
        _run_dir(tmp / "b", [_rec(1), _rec(2), _rec(3)])
    return setup


def unlike_runs(a_summary=None, a_run=None, a_ids=(1, 2, 3)):
    """TMP/a and TMP/b as two runs of one experiment (SmolLM2, greedy, 128 tokens, the same three prompts), then
    A's summary.json updated by `a_summary` (run.json's settings follow it) and A's run.json by `a_run` (its
    `settings` update the settings, its `samples` replace the prompt plan)."""
    def setup(tmp, bad, mp):
        for name, ids, summary, run in (("a", a_ids, a_summary, a_run), ("b", (1, 2, 3), None, None)):
            d = _run_dir(tmp / name, [_rec(i) for i in ids])
            base = {"drafter": "dflash", "mode": "online", "target": "smollm2_135m", "max_new_tokens": 128,
                    "decoding": {"protocol": "greedy", "temperature": 0.0}}
            summary = base | (summary or {})
            (d / "summary.json").write_text(json.dumps(summary))
            settings = {"target": {"name": summary["target"], "dtype": "float32"}, "decoding": summary["decoding"],
                        "eval": {"max_new_tokens": summary["max_new_tokens"]}}
            plan = {"gsm8k": {f"q{i}": f"p{i}" for i in ids}}
            run = run or {}
            (d / "run.json").write_text(json.dumps({"format": 2, "settings": settings | run.get("settings", {}),
                                                    "samples": run.get("samples", plan)}))
    return setup


def corrupt_summary(tmp, bad, mp):
    (_run_dir(tmp / "a", [_rec(1)]) / "summary.json").write_bytes(b'{"drafter": "df')


def file_at(rel, content):
    """TMP/rel holding `content` (bytes or text); None makes a directory there."""
    def setup(tmp, bad, mp):
        f = tmp / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            f.mkdir()
        else:
            (f.write_bytes if isinstance(content, bytes) else f.write_text)(content)
    return setup


def corpus(line: bytes):
    """TMP/corpus/gsm8k_train.jsonl: one good conversation, then `line`."""
    good = json.dumps({"id": "c0", "messages": list(MSG)}).encode()
    return file_at("corpus/gsm8k_train.jsonl", good + b"\n" + line + b"\n")


def hub_file(lines):
    return file_at("hub.jsonl", "".join(x + "\n" for x in lines))


def model_without_tokenizer(tmp, bad, mp):
    import shutil

    (tmp / "no_tokenizer").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(bad / "good" / name, tmp / "no_tokenizer" / name)


def checkpoint_at(rel):
    return file_at(f"{rel}/config.json", "{}")


def evil_dels_head(tmp, bad, mp):
    class Evil:                                   # unpickling it would run os.system
        def __reduce__(self):
            return (os.system, ("true",))

    (tmp / "release").mkdir()
    torch.save({"head": Evil()}, tmp / "release" / "local_head.pt")
    torch.save({"counts": torch.ones(4)}, tmp / "release" / "loss_mask_unigram.pt")


def dflash_of_width(rel, hidden):
    """TMP/rel: a DFlash checkpoint for a target of width `hidden` and 36 layers (not tiny_qwen3's 64 and 4)."""
    def setup(tmp, bad, mp):
        from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
        from specexp.drafters.layers import init_weights

        dc = DFlashConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=151936, block_size=8,
                          num_target_layers=36, target_layer_ids=[1, 17, 33], mask_token_id=151669)
        init_weights(DFlashDraftModel(dc), 0).save_pretrained(tmp / rel)
    return setup


def domino_head_of_width(rel, hidden):
    def setup(tmp, bad, mp):
        from specexp.drafters import domino

        c = domino.DominoConfig(hidden, 151936, gru_hidden=24, emb_dim=12)
        domino.save_head(domino.random_head(c, seed=5, std=0.5), tmp / rel, torch.bfloat16)
    return setup


def broken_plugin(tmp, bad, mp):
    (tmp / "specexp_boom_plugin.py").write_text("raise RuntimeError('the plugin is broken')\n")
    mp.syspath_prepend(str(tmp))
    mp.setenv("SPECEXP_PLUGINS", "specexp_boom_plugin")


def offline(tmp, bad, mp):
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_OFFLINE", "1")


# ---------------------------------------------------------------------------------------------- the table
def case(name, args, expected, setup=None, slow=False):
    """One bad input: `args` (BAD = the `bad` fixture's directory, TMP = the test's tmp_path; the run directory is
    TMP/run unless the args name one), the fragment(s) its one line must hold, and what `setup` makes first."""
    return pytest.param(args, (expected,) if isinstance(expected, str) else expected, setup, id=name,
                        marks=[pytest.mark.slow] if slow else [])


CASES = [
    # ---- config values, keys and types
    case("block_size_0", [*SMALL, "drafter.block_size=0"], "drafter.block_size=0 is not valid; expected an int >= 2"),
    case("block_size_1", [*SMALL, "drafter.block_size=1"], "drafter.block_size=1 is not valid; expected an int >= 2"),
    case("num_layers_0", [*SMALL, "drafter.num_layers=0"], "drafter.num_layers=0 is not valid; expected an int >= 1"),
    case("revision_num", [*SMALL, "drafter.revision=1.5"],
         "drafter.revision=1.5 is not valid; expected a hub branch, tag or commit, or null"),
    case("layer_ids_99", [*SMALL, "drafter.target_layer_ids=[99]"],
         "drafter.target_layer_ids=[99] out of range for target tiny_qwen3 (layers 0..3)"),
    case("cpu_threads_neg", [*SMALL, "cpu_threads=-2"], "cpu_threads=-2 is not valid; expected an int >= 1, or null"),
    case("cpu_threads_abc", [*SMALL, "cpu_threads=abc"], "cpu_threads='abc' is not valid; expected an int >= 1"),
    case("cpu_threads_0", [*SMALL, "cpu_threads=0"], "cpu_threads=0 is not valid; expected an int >= 1"),
    case("max_drafts_0", [*SMALL, "eval.max_drafts=0"],
         "eval.max_drafts=0 is not valid; expected an int >= 1, null (the drafter's own number of drafts), auto, or a "
         "mapping {batch size: int >= 1 or null}"),
    case("max_drafts_table_0", [*SMALL, "eval.max_drafts={0: 3}"],
         "eval.max_drafts={0: 3} is not valid; expected an int >= 1, null (the drafter's own number of drafts), auto, "
         "or a mapping {batch size: int >= 1 or null}"),
    case("max_drafts_table_key_twice", [*SMALL, "eval.max_drafts={1: 3, 1: 4}"],
         "eval.max_drafts={1: 3, 1: 4}: the key 1 is written twice (Hydra would keep the last one silently); write "
         "each key once"),
    case("nested_key_twice", [*SMALL, "eval.num_samples={gsm8k: 1, gsm8k: 2}"],
         "eval.num_samples={gsm8k: 1, gsm8k: 2}: the key gsm8k is written twice"),
    case("batch_size_0", [*SMALL, "eval.batch_size=0"], "eval.batch_size=0 is not valid; expected an int >= 1"),
    case("tree_at_batch", [*SMALL, "drafter=eagle3", "drafter.mode=tree", "eval.batch_size=4"],
         "eval.batch_size=4 with drafter.mode=tree (eagle3): draft trees run at batch 1 only"),
    case("tree_under_protocol_b", [*SMALL, "drafter=eagle3", "drafter.mode=tree", "decoding=sample_b"],
         "decoding.protocol='B' cannot verify draft trees (p/q acceptance of siblings drawn from one distribution is "
         "not lossless); use greedy or A (decoding=greedy or decoding=sample_a), or a chain drafter"),
    case("tree_under_block", [*SMALL, "drafter=dflash", "drafter.mode=tree", "decoding=sample_block"],
         "decoding.protocol='block' cannot verify draft trees"),
    case("warmup_neg", [*SMALL, "eval.warmup=-3"], "eval.warmup=-3 is not valid; expected an int >= 0"),
    case("shuffle_seed_abc", [*SMALL, "eval.shuffle_seed=abc"],
         "eval.shuffle_seed='abc' is not valid; expected an int"),
    case("split_bad", [*SMALL, "eval.split=test"], "eval.split='test' is not valid; expected eval or tune"),
    case("compile_on_hf_engine", [*SMALL, "target.compile=true"],
         "target.compile=true needs target.engine=static or auto (the compiled steps run on its preallocated KV "
         "cache), not target.engine=hf; add target.engine=static"),
    case("compile_not_bool", [*SMALL, "target.engine=static", "target.compile=yes"],
         "target.compile='yes' is not valid; expected true or false"),
    case("tune_samples_neg", [*SMALL, "eval.tune_samples=-2"],
         "eval.tune_samples=-2 is not valid; expected an int >= 0"),
    case("bool_as_str", [*SMALL, "eval.save_text=abc"], "eval.save_text='abc' has type str; expected bool"),
    case("list_for_scalar", [*SMALL, "eval.max_new_tokens=[4]"], "eval.max_new_tokens=[4] is not valid"),
    case("scalar_for_list", [*SMALL, "benchmark.names=gsm8k"],
         "benchmark.names='gsm8k' is not valid; expected a non"),
    case("lr_nan", [*SMALL, "task=train", "train.lr=nan"], "train.lr=nan is not valid; expected a finite number > 0"),
    case("top_level_typo", [*SMALL, "evall.num_samples=3"],
         "unknown key 'evall.num_samples'; valid keys at the top level (config groups and keys): benchmark, "
         "cpu_threads"),
    case("nested_typo", [*SMALL, "eval.nums=3"],
         "unknown key 'eval.nums'; valid keys under 'eval': batch_size, check_lossless"),
    case("added_key", [*SMALL, "+eval.nums=3"],
         "unknown key 'eval.nums'; valid keys under 'eval': batch_size, check_lossless"),
    case("experiment_adds_key", ["experiment=mini_dels_rnn", *SMALL, "drafter=dflash", "task=eval"],
         "unknown key 'drafter.head' (set by experiment=mini_dels_rnn); valid keys under 'drafter': block_size"),
    case("sweep_file_adds_key", ["--config-dir", "BAD/sweeps", "--config-name", "bad_sweep", *SMALL],
         "unknown key 'eval.num_sample' (set by --config-name bad_sweep); valid keys under 'eval'"),
    case("device_malformed", [*SMALL, "device=cuda:abc"],
         "device='cuda:abc' is not valid; expected auto, cpu, cuda or cuda:N"),
    case("num_samples_unknown_key", [*TINY, "eval.num_samples={gsm9k: 2}"],
         "eval.num_samples: 'gsm9k' is not among benchmark.names (the selected benchmarks); the keys must be one of: "
         "gsm8k"),
    case("timed_samples_0", [*TINY, "eval.timed_samples=0"],
         "eval.timed_samples=0 is not valid; expected null (all), an int >= 1 or a mapping {benchmark: int >= 1}"),
    case("timed_samples_word", [*TINY, "eval.timed_samples=some"],
         "eval.timed_samples='some' is not valid; expected null (all), an int >= 1"),
    case("timed_samples_zero_in_mapping", [*TINY, "eval.timed_samples={gsm8k: 0}"],
         "eval.timed_samples={'gsm8k': 0} is not valid; expected null (all), an int >= 1"),
    case("timed_samples_unknown_key", [*TINY, "eval.timed_samples={gsm9k: 2}"],
         "eval.timed_samples: 'gsm9k' is not among benchmark.names (the selected benchmarks); the keys must be one "
         "of: gsm8k"),
    case("tune_samples_unknown_key", [*TINY, "eval.tune_samples={gsm9k: 2}"],
         "unknown key 'eval.tune_samples.gsm9k'; valid keys under 'eval.tune_samples': aime25, alpaca, gsm8k"),
    case("duplicate_benchmarks", [*TINY, "benchmark.names=[gsm8k,gsm8k]"],
         "benchmark.names=['gsm8k', 'gsm8k'] is not valid; expected a non-empty list of benchmark names, each named "
         "once"),
    case("shard_out_of_range", [*SMALL, "eval.shard=2/2"],
         "eval.shard='2/2' is not valid; expected null (unsharded) or 'I/N' with ints 0 <= I < N, e.g. "
         "eval.shard=0/2"),
    case("shard_not_a_split", [*SMALL, "eval.shard=half"],
         "eval.shard='half' is not valid; expected null (unsharded)"),
    case("shard_of_training", [*SMALL, "task=train", "eval.shard=0/2"],
         "eval.shard='0/2' applies to task=eval and task=replay only (this is task=train); drop eval.shard"),
    case("merge_without_runs", [*SMALL, "task=merge"], "merge.runs is empty; name the shard directories of one run"),
    case("merge_runs_not_a_list", [*SMALL, "task=merge", "merge.runs=DIR"],
         "merge.runs='DIR' is not valid; expected a list of shard directories"),
    case("merge_of_no_run", [*SMALL, "task=merge", "merge.runs=[BAD/empty]"],
         "merge.runs: BAD/empty holds no run.json: neither a run directory nor a directory of runs"),
    case("launcher_unknown", [*SMALL, "hydra/launcher=slrum"],
         "hydra/launcher=slrum is not an option; choose one of: "),
    case("bf16_true_on_cpu", [*TRAIN, "train.precision=bf16-true"],
         "train.precision=bf16-true does not run on the CPU (device=cpu): the float32 target features meet "
         "half-precision weights; use train.precision=bf16-mixed or 32"),

    # ---- sizes: refused before anything is allocated (config.py states each bound)
    case("cpu_threads_above_cores", [*TINY, f"cpu_threads={CORES + 1}"],
         f"cpu_threads={CORES + 1} is not valid; expected an int >= 1, or null (torch's default); at most this "
         f"machine's {CORES} cores"),
    case("eagle3_labels_unknown", [*TRAIN, "drafter=eagle3", "drafter.labels=medium"],
         "drafter.labels='medium' is not valid; expected hard (the data tokens) or soft (the target's distribution)"),
    case("tree_top_k_huge", [*EAGLE_TREE, "drafter.tree.top_k=100000"],
         "drafter.tree.top_k=100000 is not valid; expected an int >= 1, and at most the draft vocabulary; at most 64"),
    case("tree_top_k_above_vocab", [*EAGLE_TREE, "drafter.tree.top_k=20", "drafter.draft_vocab_size=10"],
         "drafter.tree.top_k=20 exceeds drafter.draft_vocab_size=10; choose top_k <= 10"),
    case("tree_total_tokens_huge", [*EAGLE_TREE, "drafter.tree.total_tokens=10000000"],
         "drafter.tree.total_tokens=10000000 is not valid; expected an int >= 2 (the anchor + at least one draft); "
         "at most 1,024"),
    case("tree_depth_huge", [*EAGLE_TREE, "drafter.tree.depth=1000"],
         "drafter.tree.depth=1000 is not valid; expected an int >= 0 (expansion steps after the first level); at "
         "most 64"),
    case("max_new_tokens_huge", [*TINY, "eval.max_new_tokens=10000000000"],
         "eval.max_new_tokens=10000000000 is not valid; expected an int >= 1; at most 1,048,576"),
    case("num_samples_huge", [*TINY, "eval.num_samples=100000000000"],
         "eval.num_samples=100000000000 is not valid; expected an int >= 1"),
    case("block_size_huge", [*TINY, "drafter=dflash", "drafter.init=random", "drafter.block_size=100000"],
         "drafter.block_size=100000 is not valid; expected an int >= 2 (the anchor + at least one draft); at most "
         "1,024"),
    case("num_layers_huge", [*TINY, "drafter=dflash", "drafter.init=random", "drafter.num_layers=100000"],
         "drafter.num_layers=100000 is not valid; expected an int >= 1; at most 256"),
    case("target_width_huge", [*TINY, "target.hidden_size=10000000"],
         "target.hidden_size=10000000 is not valid; expected an int >= 1; at most 65,536"),
    case("anchors_huge", [*TRAIN, "train.num_anchors=100000000"],
         "train.num_anchors=100000000 is not valid; expected an int >= 1; at most 4,096"),
    case("prompt_alone_too_long", [*SMALL, "target.max_context=40"],
         "tokens, + 3 drafts) exceeds the target context of 40; no eval.max_new_tokens fits", slow=True),

    # ---- the entry point and the run directory (the store's claim rules hold for every task)
    case("run_dir_empty", [*TINY, "hydra.run.dir=''"], "hydra.run.dir='' is empty; name a directory for the run's "
                                                        "files"),
    case("sweep_dir_empty", ["-m", *TINY, "hydra.sweep.dir=''"], "hydra.sweep.dir='' is empty"),
    case("run_dir_under_a_file", [*SMALL, "hydra.run.dir=TMP/a_file/run"], "a_file is not a directory",
         file_at("a_file", "")),
    case("metrics_file_is_a_directory", [*SMALL, "logger=csv"],
         "metrics.csv is a directory but the run writes a file there", file_at("run/metrics.csv", None)),
    case("compare_into_another_run", [*COMPARE, "hydra.run.dir=TMP/a"],
         "hydra.run.dir=TMP/a holds another run's results (samples.jsonl); task=compare writes its files into a "
         "directory of its own", runs([_rec(1)])),
    case("train_into_another_run", [*TRAIN, "hydra.run.dir=TMP/a"],
         "hydra.run.dir=TMP/a holds another run's results (samples.jsonl); task=train writes", runs([_rec(1)])),
    case("regenerate_into_another_run", ["task=regenerate", "target=tiny_qwen3", "data=smoke", "logger=none",
                                         "device=cpu", "hydra.run.dir=TMP/a"],
         "hydra.run.dir=TMP/a holds another run's results (samples.jsonl); task=regenerate writes", runs([_rec(1)])),
    case("run_dir_is_checkpoint", [*TINY, "drafter=eagle3", "drafter.init=checkpoint", "drafter.checkpoint=TMP/ckpt",
                                   "hydra.run.dir=TMP/ckpt"],
         ("drafter.checkpoint=TMP/ckpt", "choose a hydra.run.dir outside it"), checkpoint_at("ckpt")),
    case("run_dir_inside_checkpoint", [*TINY, "drafter=eagle3", "drafter.init=checkpoint",
                                       "drafter.checkpoint=TMP/ckpt", "hydra.run.dir=TMP/ckpt/results"],
         ("drafter.checkpoint=TMP/ckpt", "choose a hydra.run.dir outside it"), checkpoint_at("ckpt")),
    case("checkpoint_inside_run", [*TINY, "drafter=eagle3", "drafter.init=checkpoint",
                                   "drafter.checkpoint=TMP/run/ckpt"],
         ("drafter.checkpoint=TMP/run/ckpt", "is inside the run directory"), checkpoint_at("run/ckpt")),
    case("plugin_raises_on_import", TINY, "SPECEXP_PLUGINS: importing 'specexp_boom_plugin' raised RuntimeError: "
                                          "the plugin is broken", broken_plugin),

    # ---- model and checkpoint directories
    case("hf_no_config", [*HF, "target.path=BAD/empty"], "empty': no config.json (not an HF model directory)"),
    case("hf_garbage", [*HF, "target.path=BAD/garbage"], "garbage': cannot read model.safetensors (SafetensorError"),
    case("hf_truncated", [*HF, "target.path=BAD/truncated"], "truncated': cannot read model.safetensors"),
    case("hf_pickle", [*HF, "target.path=BAD/pickle"], "pytorch_model.bin is a pickle file; only safetensors weights"),
    case("hf_partial", [*HF, "target.path=BAD/partial"], "missing tensor model.layers.1."),
    case("hf_no_weights", [*HF, "target.path=BAD/no_weights"],
         "no model.safetensors (nor model.safetensors.index.json)"),
    case("hf_bare_config", [*HF, "target.path=BAD/bare_config"],
         "missing tensor lm_head.weight (and 330 more): the weights do not match config.json (qwen3, 32 layers)"),
    case("hf_bare_no_weights", [*HF, "target.path=BAD/bare_no_weights"], "no model.safetensors"),
    case("hf_no_tokenizer", [*HF, "target.path=TMP/no_tokenizer"],
         "target.path='TMP/no_tokenizer': no tokenizer files (none of tokenizer.json", model_without_tokenizer),
    case("hf_no_tokenizer_with_mask", [*HF, "target.path=TMP/no_tokenizer", "target.mask_token_id=5"],
         "target.path='TMP/no_tokenizer': no tokenizer files (none of tokenizer.json", model_without_tokenizer),
    case("dflash_list", [*CKPT, "drafter.checkpoint=BAD/dflash_list"],
         "config.json must hold a JSON object, found list"),
    case("dflash_str_hidden", [*CKPT, "drafter.checkpoint=BAD/dflash_str_hidden"],
         "config.json: hidden_size='64' must be an int >= 1"),
    case("dflash_zero_heads", [*CKPT, "drafter.checkpoint=BAD/dflash_zero_heads"],
         "config.json: num_attention_heads=0 must be an int >= 1"),
    case("dflash_bad_index", [*CKPT, "drafter.checkpoint=BAD/dflash_bad_index"],
         "model.safetensors.index.json is not valid JSON"),
    case("dflash_no_weight_map", [*CKPT, "drafter.checkpoint=BAD/dflash_no_weight_map"],
         "model.safetensors.index.json needs a non-empty 'weight_map'"),
    case("dels_head_refused_pickle", [*[a for a in SMALL if not a.startswith("drafter.")], "drafter=dels_rnn",
                                      "drafter.init=random", "drafter.head.init=checkpoint",
                                      "drafter.head.checkpoint=TMP/release"],
         ("local_head.pt is not a weights-only PyTorch file (it needs the global posix.system, which is refused)",
          "never code"), evil_dels_head),                 # the whole sentence, not one cut mid-way

    # ---- results files, through the store's one reader (compare, merge, report, dashboard, experiments)
    case("compare_corrupt_middle", COMPARE, "TMP/a/samples.jsonl line 2 is corrupt (not JSON)",
         runs([_rec(1), "{corrupt", _rec(3)])),
    case("compare_list_line", COMPARE, "TMP/a/samples.jsonl line 2: a JSON list, not a sample record",
         runs([_rec(1), "[1]", _rec(3)])),
    case("compare_missing_field", COMPARE, "TMP/a/samples.jsonl line 2: a record without 'accept_lengths'",
         runs([_rec(1), _without("accept_lengths")])),
    case("compare_turn_str", COMPARE, "TMP/a/samples.jsonl line 2: turn='0' is a str; expected an int",
         runs([_rec(1), _rec(2, turn="0")])),
    case("compare_corrupt_gz", COMPARE, "TMP/a/samples.jsonl.gz line 2 is corrupt (not JSON)",
         runs([_rec(1), "{corrupt", _rec(3)], packed=True)),
    case("run_dir_name_too_long", [*SMALL, "hydra.run.dir=TMP/" + "d" * 300],
         ("File name too long; choose a shorter path (a name has at most 255 bytes)",)),
    case("delete_key", [*TINY, "~target.dtype"],
         "~target.dtype: a key cannot be deleted, every run reads it; set it instead (target.dtype=VALUE; `python -m "
         "specexp --cfg job` shows every key and its default)"),
    case("delete_group", [*TINY, "~eval"],
         "~eval: the eval group cannot be removed; choose one of its options instead: mini, paper"),
    case("env_interpolation_is_a_string", [*TINY, "eval.max_new_tokens=${oc.env:SPECEXP_TEST_TOKENS}"],
         "eval.max_new_tokens='8' is not valid; expected an int >= 1; at most 1,048,576 (eval.max_new_tokens is "
         "${oc.env:SPECEXP_TEST_TOKENS}, which resolves to a string: write "
         "eval.max_new_tokens='${oc.decode:${oc.env:SPECEXP_TEST_TOKENS}}' to read it as a number, bool or list)",
         lambda tmp, bad, mp: mp.setenv("SPECEXP_TEST_TOKENS", "8")),
    case("unquoted_non_ascii_path", [*TINY, "hydra.run.dir=TMP/résumé"],
         "cannot read the override 'hydra.run.dir=TMP/résumé': a value with spaces, non-ASCII letters or quotes must "
         "be quoted for Hydra inside the shell's quotes: \"hydra.run.dir='TMP/résumé'\""),
    case("long_list_override", [*TINY, "eval.max_new_tokens=[" + ",".join(map(str, range(3000))) + "]"],
         ("eval.max_new_tokens=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "… (3,000 items) is not valid; expected an int")),
    case("unknown_flag", ["--bogus", *TINY],
         "unknown flag --bogus: specexp takes key=value and group=option overrides, and Hydra's flags"),
    case("compare_unlike_target", COMPARE, ("A=TMP/a and B=TMP/b are not runs of one experiment (max_new_tokens: A 16, "
                                            "B 128; target.name: A 'tiny_qwen3', B 'smollm2_135m')",
                                            "or set compare.allow_mismatch=true"),
         unlike_runs({"target": "tiny_qwen3", "max_new_tokens": 16})),
    case("compare_unlike_dtype", COMPARE, "(target.dtype: A 'bfloat16', B 'float32')",
         unlike_runs(a_run={"settings": {"target": {"name": "smollm2_135m", "dtype": "bfloat16"}}})),
    case("compare_unlike_decoding", COMPARE,
         "(decoding.protocol: A 'B', B 'greedy'; decoding.temperature: A 1.0, B 0.0)",
         unlike_runs({"decoding": {"protocol": "B", "temperature": 1.0}})),
    case("compare_unlike_prompts", COMPARE,
         "(prompts: 1 (benchmark, id) pairs have different prompt text, e.g. gsm8k/q2)",
         unlike_runs(a_run={"samples": {"gsm8k": {"q1": "p1", "q2": "changed", "q3": "p3"}}})),
    case("compare_no_common_prompt", COMPARE, "(prompts: none in common (A 2, B 3 samples))",
         unlike_runs(a_ids=(7, 8))),
    case("compare_summary_not_json", ["task=compare", "compare.a=TMP/a", "compare.b=TMP/a", "logger=none"],
         "TMP/a/summary.json is corrupt (not JSON", corrupt_summary),
    case("report_summary_empty", ["task=report", "report.runs=[TMP/a]", "logger=none"],
         "TMP/a/summary.json is not a run summary (no 'benchmarks' table); expected the summary.json that task=eval",
         file_at("a/summary.json", "{}")),
    case("report_summary_nan_tau", ["task=report", "report.runs=[TMP/a]", "logger=none"],
         "TMP/a/summary.json is not a run summary (gsm8k.tau is nan; expected null or a finite number)",
         file_at("a/summary.json", '{"benchmarks": {"gsm8k": {"tau": NaN}}, "macro": {"tau": 1.5}}')),
    case("report_sweep_job_tau_str", ["task=report", "report.runs=[TMP/sweep]", "logger=none"],
         "TMP/sweep/j0/summary.json is not a run summary (macro.tau is '1.5'; expected null or a finite number)",
         file_at("sweep/j0/summary.json", '{"benchmarks": {}, "macro": {"tau": "1.5"}}')),
    case("dashboard_max_position_negative", ["task=dashboard", "dashboard.max_position=-1", "logger=none"],
         "dashboard.max_position=-1 is not valid; expected an int >= 1, or null (the largest block_size - 1 "
         "configured)"),
    case("dashboard_max_position_zero", ["task=dashboard", "dashboard.max_position=0", "logger=none"],
         "dashboard.max_position=0 is not valid; expected an int >= 1, or null"),
    case("report_summary_not_json", ["task=report", "report.runs=[TMP/a]", "logger=none"],
         "TMP/a/summary.json is corrupt (not JSON", corrupt_summary),
    case("resume_record_without_fields", SMALL,
         "TMP/run/samples.jsonl line 1: a record without 'turn', 'accept_lengths'",
         file_at("run/samples.jsonl", json.dumps({"id": "x", "benchmark": "gsm8k"}) + "\n")),

    # ---- benchmark and training data
    case("benchmark_not_utf8", [*SMALL, "benchmark.data_dir=TMP/bench"],
         "TMP/bench/gsm8k.jsonl line 2 is not UTF-8 text (byte 0xE9)",
         file_at("bench/gsm8k.jsonl", b'{"id": "a", "turns": ["ok"]}\n{"id": "b", "turns": ["caf\xe9"]}\n')),
    case("benchmark_is_a_directory", [*SMALL, "benchmark.data_dir=TMP/bench"],
         "TMP/bench/gsm8k.jsonl is a directory; expected a file", file_at("bench/gsm8k.jsonl", None)),
    case("corpus_no_id", [*TRAIN, "data.corpus_dir=TMP/corpus"], "TMP/corpus/gsm8k_train.jsonl line 2: no 'id'",
         corpus(json.dumps({"messages": list(MSG)}).encode())),
    case("corpus_not_an_object", [*TRAIN, "data.corpus_dir=TMP/corpus"],
         "TMP/corpus/gsm8k_train.jsonl line 2: a JSON list, not a record", corpus(b"[1, 2]")),
    case("corpus_not_utf8", [*TRAIN, "data.corpus_dir=TMP/corpus"],
         "TMP/corpus/gsm8k_train.jsonl line 2 is not UTF-8 text (byte 0xE9)",
         corpus(json.dumps({"id": "c1", "messages": list(MSG)}).encode().replace(b"hello", b"h\xe9llo"))),
    case("corpus_dir_missing", [*TRAIN, "data.corpus_dir=TMP/no_such_dir"],
         "data.corpus_dir='TMP/no_such_dir' is not valid; expected null (data/corpus) or an existing directory"),
    case("hub_malformed", HUB, "TMP/hub.jsonl line 2: not valid JSON",
         hub_file([json.dumps({"conversations": [{"from": "human", "value": "hi"}]}), "{oops"])),
    case("hub_conversations_not_a_list", HUB,
         "TMP/hub.jsonl line 1: 'conversations' is a str; expected a list of turns",
         hub_file([json.dumps({"conversations": "hi there"})])),
    case("hub_unknown_id_offline", [*TRAIN, "data.source=hub", "data.hub.id=nobody-here/no-such-dataset-35",
                                    "data.hub.format=sharegpt"],
         "data.hub.id='nobody-here/no-such-dataset-35': not a local file or directory, and offline", offline),

    # ---- outputs that would replace what is there
    case("prior_out_is_a_file", [*PRIOR, "task.out=TMP/a_file"], "task.out='TMP/a_file' is a file; expected a "
                                                                 "directory", file_at("a_file", "keep me")),
    case("prior_out_holds_a_prior", [*PRIOR, "task.out=TMP/head"],
         "already holds log_prior.safetensors; choose another directory, or set task.overwrite=true",
         file_at("head/log_prior.safetensors", b"an earlier prior")),
    case("replay_export_exists", [*REPLAY, "replay.export=TMP/refs.json.gz"],
         "replay.export='TMP/refs.json.gz' exists; choose another name, or set replay.overwrite=true",
         file_at("refs.json.gz", b"an earlier export")),
    case("replay_export_is_a_directory", [*REPLAY, "replay.export=TMP/refs.json.gz"],
         "replay.export='TMP/refs.json.gz' is a directory; expected the name of a file to write",
         file_at("refs.json.gz", None)),

    # ---- task=export (src/specexp/export/engines.py): refused before the run directory holds a file
    case("export_format_unknown", [*EXPORT, "export.format=onnx"],
         "export.format='onnx' is not valid; expected vllm, sglang, zlab or hf"),
    case("export_dels_no_route", [*EXPORT, "drafter=dels_rnn"],
         "task=export: drafter=dels_rnn has no serving route in vLLM or SGLang: DeLS-Spec fuses"),
    case("export_domino_to_vllm", [*EXPORT, "drafter=domino_ft"],
         "export.format=vllm with drafter=domino_ft: only SGLang serves Domino (dflash_config.projector_type=domino)"),
    case("export_dedit_no_route", [*EXPORT, "drafter=dedit"],
         ("task=export: drafter=dedit has no serving route in vLLM or SGLang", "needs an engine-side edit step")),
    case("export_ar_baseline", ["task=export", "target=tiny_qwen3", "drafter=none", "logger=none", "device=cpu"],
         "task=export: drafter=none is not exportable; export writes drafter=dflash or drafter=eagle3"),
    case("export_random_init", [*EXPORT, "drafter.init=random"],
         "task=export writes a trained drafter: set drafter.checkpoint=DIR (drafter.init=random"),
    case("export_eagle3_as_zlab", [*EXPORT, "drafter=eagle3", "drafter.checkpoint=BAD/dflash_good",
                                   "export.format=zlab"],
         "export.format=zlab is the DFlash layout; for drafter=eagle3 choose vllm, sglang or hf"),
    case("export_out_not_empty", [*EXPORT, "export.out=TMP/exp"],
         "export.out='TMP/exp' is not empty; choose another directory, or set export.overwrite=true",
         file_at("exp/config.json", "{}")),
    case("export_out_is_a_file", [*EXPORT, "export.out=TMP/a_file"],
         "export.out='TMP/a_file' is a file; expected a directory", file_at("a_file", "keep me")),
    case("export_out_in_checkpoint", [*EXPORT, "export.out=BAD/dflash_good/exported"],
         "and drafter.checkpoint='BAD/dflash_good' nest; choose an export.out outside the checkpoint"),
    case("export_push_without_repo", [*EXPORT, "export.push=true"],
         "export.push=true needs export.repo_id=OWNER/NAME"),
    case("export_push_offline", [*EXPORT, "export.push=true", "export.repo_id=me/draft"],
         "export.push=true but the hub is offline (HF_HUB_OFFLINE=1)", offline),
    case("export_repo_id_malformed", [*EXPORT, "export.repo_id=no-owner"],
         "export.repo_id='no-owner' is not valid; expected null or a hub repository id OWNER/NAME"),
    case("export_card_of_another_target", [*EXPORT, "drafter.checkpoint=TMP/ckpt"],
         "drafter.checkpoint='TMP/ckpt' was trained for target qwen3_8b (its card.json), not target=tiny_qwen3",
         lambda tmp, bad, mp: (__import__("shutil").copytree(bad / "dflash_good", tmp / "ckpt"),
                               (tmp / "ckpt" / "card.json").write_text('{"target": "qwen3_8b"}'))),

    # issue #59, probed: an export that pairs a drafter with a target it does not fit is refused (the card and the
    # serving commands would name that target), when the target's shape is known without loading it
    case("export_checkpoint_is_a_file", [*EXPORT, "drafter.checkpoint=TMP/a_file"],
         "drafter.checkpoint='TMP/a_file' is a file; expected a checkpoint directory (holding config.json and the "
         "weights)", file_at("a_file", "")),
    case("export_checkpoint_of_another_width", [*EXPORT, "drafter.checkpoint=TMP/wide"],
         "drafter.checkpoint='TMP/wide': hidden_size 32 does not fit target tiny_qwen3 (hidden 64)",
         dflash_of_width("wide", 32)),
    case("export_checkpoint_of_a_deeper_target", [*EXPORT, "target.num_layers=2"],
         "drafter.checkpoint='BAD/dflash_good': num_target_layers 4 does not fit target tiny_qwen3 (2 layers)"),
    case("export_domino_head_of_another_width_forced", [*EXPORT, "drafter=domino_ft", "export.format=sglang",
                                                        "drafter.head.checkpoint=TMP/head", "export.force=true"],
         ("the head's vocabulary / width (151936 / 32) differ from the backbone's (151936 / 64)",
          "export.force does not apply"), domino_head_of_width("head", 32)),

    # ---- eval.draft_vocab=N (issue #59 row 1): the regeneration set is read before any work
    case("draft_vocab_dir_missing", [*VOCAB, "eval.draft_vocab_from=TMP/no_such_set"],
         "eval.draft_vocab_from='TMP/no_such_set' does not exist; name a regeneration set directory (data/regen/"),
    case("draft_vocab_dir_empty", [*VOCAB, "eval.draft_vocab_from=TMP/regen"],
         "eval.draft_vocab_from='TMP/regen' holds no manifest.json: not a regeneration set (expected manifest.json "
         "and tokens.npy", file_at("regen", None)),
    case("draft_vocab_is_a_file", [*VOCAB, "eval.draft_vocab_from=TMP/a_file"],
         "eval.draft_vocab_from='TMP/a_file' is a file; expected a regeneration set directory",
         file_at("a_file", "")),
    case("draft_vocab_manifest_empty", [*VOCAB, "eval.draft_vocab_from=TMP/regen"],
         "eval.draft_vocab_from='TMP/regen': manifest.json is not valid JSON (Expecting value, line 1; the file is "
         "empty)", file_at("regen/manifest.json", "")),
    case("draft_vocab_tokens_empty", [*VOCAB, "eval.draft_vocab_from=TMP/regen"],
         "eval.draft_vocab_from='TMP/regen': tokens.npy is empty",
         lambda tmp, bad, mp: (file_at("regen/manifest.json", REGEN_MANIFEST)(tmp, bad, mp),
                               (tmp / "regen" / "tokens.npy").write_bytes(b""))),
    case("draft_vocab_dotdot", [*VOCAB, "eval.draft_vocab_from=../no_such_set_59"],
         "eval.draft_vocab_from='../no_such_set_59' does not exist (neither "),
    case("draft_vocab_of_another_target", [*VOCAB, "eval.draft_vocab_from=data/regen/smollm2_135m-greedy256"],
         "eval.draft_vocab_from='data/regen/smollm2_135m-greedy256' holds smollm2_135m's answers, not tiny_qwen3's"),
    case("draft_vocab_not_dflash", [*VOCAB, "drafter=eagle3", "eval.draft_vocab_from=TMP/regen"],
         "eval.draft_vocab=100: only drafter=dflash drafts from a restricted vocabulary (this is eagle3)"),

    # ---- task=plan's calibration file (issue #59 rows 4-6): read with the config, before any work
    case("plan_calibration_missing", [*PLAN, "plan.calibration=TMP/no_cal.json"],
         "plan.calibration='TMP/no_cal.json': no such file"),
    case("plan_calibration_nan", [*PLAN, "plan.calibration=TMP/cal.json"],
         "plan.calibration='TMP/cal.json' is not a calibration file: ar_step_ms['1'] is nan; expected ms, a finite "
         "number > 0", file_at("cal.json", PLAN_CAL.replace('"1": 10.0', '"1": NaN'))),
    case("plan_calibration_drafter_empty", [*PLAN, "plan.calibration=TMP/cal.json"],
         "plan.calibration='TMP/cal.json' is not a calibration file: drafters.dflash.max_drafts is null; expected an "
         "int >= 1", file_at("cal.json", PLAN_CAL.replace('"max_drafts": 7, ', ''))),

    # ---- security
    case("experimental_rerun", ["--experimental-rerun", "TMP/config.pickle", *TINY],
         "--experimental-rerun is refused: it unpickles FILE (a crafted file runs code)"),
]


def files_under(root):
    """Every file under `root` with its bytes, but the two a refused run may leave: Hydra's job log (made before
    any specexp code runs) and a lock file (never removed: eval/store.py)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("specexp.log", ".lock")}


@pytest.mark.parametrize("args, expected, setup", CASES)
def test_bad_input_is_one_clear_line(args, expected, setup, bad, tmp_path, monkeypatch, capsys):
    """Exit 2, exactly one line `specexp: error: ...` of a readable length holding the expected fragments (the bad
    value and what would be valid), no traceback, and not a file written or changed anywhere under the test's
    directory."""
    if setup is not None:
        setup(tmp_path, bad, monkeypatch)
    monkeypatch.chdir(tmp_path)                       # a stray `outputs/` would land here, and be seen
    fill = lambda x: x.replace("BAD", str(bad)).replace("TMP", str(tmp_path))     # noqa: E731
    before = files_under(tmp_path)
    code, lines, err = run_cli([fill(a) for a in args], tmp_path / "run", monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("specexp: error: "), lines
    assert len(lines[0]) < 1500, f"a {len(lines[0]):,}-character line: cut what it quotes"
    for fragment in expected:
        assert fill(fragment) in lines[0], lines[0]
    assert files_under(tmp_path) == before


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


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line(tmp_path, monkeypatch, capsys):
    """A write that fails as on a full disk, after the first sample: one line, no traceback."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").symlink_to("/dev/full")
    code, lines, err = run_cli([*SMALL, "logger=csv"], run_dir, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and f"cannot write {run_dir / 'metrics.csv'}: No space left on device; free some space " \
                               f"and rerun the same command" in lines[0], lines


def test_export_overwrite_that_fails_midway_keeps_the_earlier_export(bad, tmp_path, monkeypatch, capsys):
    """Issue #59, probed: `export.overwrite=true` over a good export, and the last file's write fails (a full disk):
    one line, exit 2, and the earlier export byte for byte as it was (the new weights had replaced the old ones
    beside the old config and card), no temporary directory left."""
    import errno

    import specexp.files

    out = tmp_path / "exp"
    args = [*EXPORT, f"drafter.checkpoint={bad / 'dflash_good'}", f"export.out={out}"]
    code, _, err = run_cli(args, tmp_path / "r1", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    before = files_under(out)

    def full(path, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(specexp.files, "write_json", full)
    code, lines, err = run_cli([*args, "export.overwrite=true", "export.dtype=bfloat16", "export.format=hf"],
                               tmp_path / "r2", monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and "No space left on device" in lines[0], err[-3000:]
    assert files_under(out) == before and not [p for p in out.iterdir() if p.name.startswith(".")]


def _replay_cache(tmp_path, monkeypatch, capsys, n=3):
    """A replay of n samples with its reference and tap caches under TMP/cache and TMP/taps; returns (the replay's
    arguments, references.jsonl, the tap files, macro τ)."""
    args = ["task=replay", *[a for a in SMALL if not a.startswith("eval.num_samples")], f"eval.num_samples={n}",
            f"replay.cache_dir={tmp_path / 'cache'}", f"replay.tap_cache_dir={tmp_path / 'taps'}"]
    code, _, err = run_cli(args, tmp_path / "r0", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    tau = json.loads((tmp_path / "r0" / "summary.json").read_text())["macro"]["tau"]
    refs = next((tmp_path / "cache").glob("*/references.jsonl"))
    return args, refs, sorted((tmp_path / "taps").rglob("*.safetensors")), tau


def test_replay_reference_cache_cut_or_corrupt_is_said_and_redone(tmp_path, monkeypatch, capsys):
    """Issue #59, probed: references.jsonl cut mid-line (a warning line, the sample decoded again; it was dropped
    silently), cut just before its newline (terminated, so the next append does not glue two records into one
    corrupt line), and holding a JSON line that is not a reference record (one line, exit 2; it was an internal
    error)."""
    args, refs, _, tau = _replay_cache(tmp_path, monkeypatch, capsys)
    good = refs.read_bytes()
    last = good.rstrip(b"\n").rfind(b"\n") + 1
    refs.write_bytes(good[:last + 40])                                    # cut mid-line
    code, _, err = run_cli(args, tmp_path / "r1", monkeypatch, capsys)
    assert code == 0 and f"{refs} ends in a torn line (line 3" in err, err[-3000:]
    assert refs.read_bytes() == good
    assert json.loads((tmp_path / "r1" / "summary.json").read_text())["macro"]["tau"] == tau
    refs.write_bytes(good[:-1])                                           # cut before the last newline
    code, _, err = run_cli([*args[:-3], "eval.num_samples=4", *args[-2:]], tmp_path / "r2", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    assert refs.read_bytes().startswith(good) and len(refs.read_bytes().splitlines()) == 4
    lines = good.splitlines(keepends=True)
    refs.write_bytes(lines[0] + b"{}\n" + b"".join(lines[2:]))
    code, out, err = run_cli(args, tmp_path / "r3", monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err and len(out) == 1, err[-3000:]
    assert out[0] == f"specexp: error: {refs} line 2 is corrupt (not a reference record); move the file away (its " \
                     f"references are then decoded again)", out


def test_replay_damaged_tap_cache_is_recomputed(tmp_path, monkeypatch, capsys):
    """Issue #59, probed: a cut tap file, an empty one and one of another length (internal errors before) are each
    said in one warning line, computed again and rewritten; τ is the first replay's."""
    from safetensors.torch import load_file, save_file

    args, _, taps, tau = _replay_cache(tmp_path, monkeypatch, capsys)
    good = taps[0].read_bytes()
    taps[0].write_bytes(good[:300])
    taps[1].write_bytes(b"")
    short = {k: (v[:, :-3] if k == "taps" else v[:-3]).contiguous() for k, v in load_file(taps[2]).items()}
    save_file(short, taps[2])
    code, _, err = run_cli(args, tmp_path / "r1", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    warned = [x for x in err.splitlines() if x.startswith("specexp: warning: replay: the cached taps")]
    assert len(warned) == 3 and all("are damaged (" in x and "computing them again" in x for x in warned), warned
    assert any("expected [" in x for x in warned) and taps[0].read_bytes() == good
    assert json.loads((tmp_path / "r1" / "summary.json").read_text())["macro"]["tau"] == tau


def test_report_and_compare_label_tree_and_batch_runs(tmp_path, monkeypatch, capsys):
    """Issue #59, probed: a tree run and a chain run of one drafter, and runs at batch 1 and 2, were labelled alike
    ("eagle3", "eagle3 (online)"): the report's and compare's labels now say tree and the batch."""
    from specexp.report.page import collect

    for name, mode, batch in (("tree", "tree", 1), ("chain", "chain", 1), ("b2", "chain", 2)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"drafter": "eagle3", "mode": "online", "batch_size": batch,
                                                    "benchmarks": {"gsm8k": {"tau": 1.5}}, "macro": {"tau": 1.5}}))
        (d / "run.json").write_text(json.dumps({"format": 2, "settings": {"drafter": {"name": "eagle3",
                                                                                      "mode": mode}}}))
    assert list(collect([str(tmp_path / n) for n in ("tree", "chain", "b2")]).runs) == \
        ["eagle3 (tree)", "eagle3", "eagle3 (batch 2)"]
    unlike_runs(a_run={"settings": {"drafter": {"name": "dflash", "mode": "tree"}}})(tmp_path / "c", None, None)
    code, _, err = run_cli(["task=compare", f"compare.a={tmp_path / 'c' / 'a'}", f"compare.b={tmp_path / 'c' / 'b'}",
                            "logger=none"], tmp_path / "cmp", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert f"A = dflash (online, tree) {tmp_path / 'c' / 'a'}" in md
    assert f"B = dflash (online) {tmp_path / 'c' / 'b'}" in md


# ---------------------------------------------------------------------------------------------- what is accepted
def test_compare_reads_a_torn_last_line_and_a_packed_run(tmp_path, monkeypatch, capsys):
    """What the reader accepts: a run in progress (its torn last line dropped) against an archived (gzipped) one."""
    a = _run_dir(tmp_path / "a", [_rec(1), _rec(2)])
    with (a / "samples.jsonl").open("a") as f:
        f.write('{"id": "q3", "bench')
    b = _run_dir(tmp_path / "b", [_rec(1), _rec(2), _rec(3)], packed=True)
    code, _, err = run_cli(["task=compare", f"compare.a={a}", f"compare.b={b}", "logger=none"], tmp_path / "cmp",
                           monkeypatch, capsys)
    assert code == 0, err[-3000:]
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["turns_compared"] == 2


def test_compare_says_which_files_it_read(tmp_path, monkeypatch, capsys):
    """Issue #59 row 13: a run whose summary.json was deleted compares (its records hold every number), and the
    footer says what was read instead of 'as in its summary.json'."""
    timed = [_rec(i, tpot=0.01, ar_tpot=0.02, timed=True) for i in (1, 2, 3)]
    a, b = _run_dir(tmp_path / "a", timed), _run_dir(tmp_path / "b", timed)
    (a / "summary.json").unlink()
    code, _, err = run_cli(["task=compare", f"compare.a={a}", f"compare.b={b}", "logger=none"], tmp_path / "cmp",
                           monkeypatch, capsys)
    assert code == 0, err[-3000:]
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| speedup A |" in md and "as in its summary.json" not in md
    assert "from its per-turn records (the formula of summary.json" in md
    assert "Read: A samples.jsonl (no run.json nor summary.json); B samples.jsonl, summary.json (no run.json)." in md
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["read"]["a"] == \
        "samples.jsonl (no run.json nor summary.json)"


def test_compare_pairs_unlike_runs_only_when_asked_and_says_what_differs(tmp_path, monkeypatch, capsys):
    """compare.allow_mismatch=true pairs the runs the table refuses, and says above the table (console, compare.md,
    compare.json) what besides the drafter differs; runs that differ only in the drafter pair without a word."""
    unlike_runs({"target": "tiny_qwen3", "max_new_tokens": 16})(tmp_path, None, monkeypatch)
    code, out, err = run_cli(["task=compare", f"compare.a={tmp_path / 'a'}", f"compare.b={tmp_path / 'b'}",
                              "compare.allow_mismatch=true", "logger=none"], tmp_path / "cmp", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    said = "max_new_tokens: A 16, B 128; target.name: A 'tiny_qwen3', B 'smollm2_135m'"
    assert said in err and "pairing unlike runs" in err
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert md.index("Not like for like") < md.index("| benchmark |") and said in md
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert result["mismatch"] == ["max_new_tokens: A 16, B 128", "target.name: A 'tiny_qwen3', B 'smollm2_135m'"]
    assert result["turns_compared"] == 3
    unlike_runs({"drafter": "eagle3"}, {"settings": {"drafter": {"name": "eagle3"}}})(tmp_path / "d", None, None)
    code, out, err = run_cli(["task=compare", f"compare.a={tmp_path / 'd' / 'a'}", f"compare.b={tmp_path / 'd' / 'b'}",
                              "logger=none"], tmp_path / "cmp2", monkeypatch, capsys)
    assert code == 0 and "unlike" not in err, err[-3000:]
    assert "mismatch" not in json.loads((tmp_path / "cmp2" / "compare.json").read_text())


@pytest.mark.slow
def test_replay_export_overwrites_when_asked_and_leaves_no_temp(tmp_path, monkeypatch, capsys):
    out_file = tmp_path / "refs.json.gz"
    out_file.write_bytes(b"an earlier export")
    code, _, err = run_cli([*REPLAY, f"replay.export={out_file}", "replay.overwrite=true",
                            f"replay.cache_dir={tmp_path / 'cache'}", "replay.tap_cache=false",
                            "replay.references_only=true"], tmp_path / "run", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    assert out_file.read_bytes()[:2] == b"\x1f\x8b" and not list(tmp_path.rglob("*.tmp"))


def test_a_numbered_draft_vocabulary_runs_with_dflash(tmp_path, monkeypatch, capsys):
    """`eval.draft_vocab=N` with drafter=dflash (the default drafter) runs and records N and its set (issue #59 row 1:
    it was refused as 'this is None' for every N, the drafter's name unseen where the eval group was rechecked)."""
    import numpy as np

    regen = tmp_path / "regen"
    regen.mkdir()
    (regen / "manifest.json").write_text(REGEN_MANIFEST.replace('"r0", 2, 2', '"r0", 2, 6'))
    np.save(regen / "tokens.npy", np.asarray([1, 2, 10, 11, 12, 10, 11, 10], dtype=np.int32))
    args = [*[a for a in SMALL if not a.startswith("drafter.")], "drafter.init=random", "eval.draft_vocab=3",
            f"eval.draft_vocab_from={regen}"]
    code, _, err = run_cli(args, tmp_path / "run", monkeypatch, capsys)
    assert code == 0, err[-3000:]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["settings"]["drafter"]["name"] == "dflash"
    assert (run["settings"]["eval"]["draft_vocab"], run["settings"]["eval"]["draft_vocab_from"]) == (3, str(regen))


def test_corpus_dir_is_a_plain_key_read_by_training(tmp_path, monkeypatch, capsys):
    """`data.corpus_dir=DIR` (no `+`) composes, validates, and reaches the corpus reader."""
    import specexp.training.data as data
    from specexp.errors import UserError

    seen = []

    def load_corpus(names, max_samples, seed, data_dir=None):
        seen.append(data_dir)
        raise UserError("stop here: the corpus reader was reached")

    monkeypatch.setattr(data, "load_corpus", load_corpus)
    code, lines, err = run_cli([*TRAIN, f"data.corpus_dir={tmp_path}"], tmp_path / "run", monkeypatch, capsys)
    assert code == 2 and lines == ["specexp: error: stop here: the corpus reader was reached"], err[-3000:]
    assert seen == [str(tmp_path)]


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


@pytest.mark.parametrize("configured, env, expected", [
    ("online", {"WANDB_MODE": "offline"}, "offline"), ("online", {"WANDB_MODE": "disabled"}, "disabled"),
    ("online", {"WANDB_MODE": "dryrun"}, "offline"), ("offline", {"WANDB_MODE": "online"}, "offline"),
    (None, {"WANDB_MODE": "offline", "WANDB_API_KEY": "k"}, "offline"), (None, {"WANDB_API_KEY": "k"}, "online"),
    (None, {}, "offline"), ("online", {}, "online")])
def test_wandb_environment_offline_wins(configured, env, expected):
    from specexp.tracking import wandb_mode

    assert wandb_mode(configured, env) == expected


def test_wandb_logger_takes_the_environment_mode(tmp_path, monkeypatch):
    """No network: a stand-in wandb module records the mode the run is started in (and that nothing probed it)."""
    import types

    from omegaconf import OmegaConf

    from specexp import tracking

    calls = []
    fake = types.SimpleNamespace(Settings=lambda **kw: kw, init=lambda **kw: calls.append(kw) or object())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(tracking, "_reachable", lambda url, timeout=3.0: pytest.fail("probed the network"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    cfg = OmegaConf.create({"name": "wandb", "project": "p", "entity": None, "mode": "online", "tags": []})
    tracking.WandbLogger(cfg, tmp_path, {"task": {"name": "eval"}}, "run")
    assert [c["mode"] for c in calls] == ["offline"]
    with pytest.raises(Exception, match="WANDB_MODE"):
        monkeypatch.setenv("WANDB_MODE", "sometimes")
        tracking.WandbLogger(cfg, tmp_path, {"task": {"name": "eval"}}, "run")


# ---------------------------------------------------------------------------------------------- sweeps, internal faults
def sweep(launcher, tmp_path, monkeypatch, capsys, values="seed=0,abc,1"):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, values, f"hydra.sweep.dir={sweep_dir}", *launcher]
    code, lines, err = run_cli(args, tmp_path / "unused", monkeypatch, capsys)
    return sweep_dir, code, lines, err


@pytest.mark.parametrize("launcher", [[], pytest.param(["hydra/launcher=local", "hydra.launcher.n_jobs=2"],
                                                       marks=pytest.mark.slow, id="joblib")])
def test_sweep_goes_on_past_a_failing_job(launcher, tmp_path, monkeypatch, capsys):
    if launcher:
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir, code, lines, err = sweep(launcher, tmp_path, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("specexp: error: 1 job(s) of the sweep failed"), lines
    assert "job 1: seed='abc' is not valid; expected an int" in lines[0], lines[0]
    assert (sweep_dir / "1" / "error.txt").read_text() == "seed='abc' is not valid; expected an int\n"
    for good in ("0", "2"):                                  # the jobs before and after the bad one both ran
        assert (sweep_dir / good / "summary.json").is_file() and not (sweep_dir / good / "error.txt").exists()
    # The sweep ends with one table of its jobs, printed and written beside them, the failed one included.
    table = json.loads((sweep_dir / "multirun.json").read_text())
    assert table["swept"] == ["seed"] and [j["swept"]["seed"] for j in table["jobs"]] == ["0", "abc", "1"]
    assert [j["job"] for j in table["jobs"]] == ["0", "1", "2"] and table["jobs"][1]["error"].startswith("seed='abc'")
    for j, seed in zip(table["jobs"], ("0", "abc", "1")):
        rerun = j["rerun"].split()                                        # each job's own single-run command
        assert rerun[:3] == ["python", "-m", "specexp"] and "-m" not in rerun[3:] and "--multirun" not in rerun
        assert rerun[-2:] == [f"seed={seed}", f"hydra.run.dir={sweep_dir / j['job']}"]
        if seed != "abc":
            macro = json.loads((sweep_dir / j["job"] / "summary.json").read_text())["macro"]
            assert (j["tau"], j["tau_ci95"], j["speedup"]) == (macro["tau"], macro["tau_ci95"], macro["speedup"])
    md = (sweep_dir / "multirun.md").read_text()
    assert "| job | seed | macro τ | τ 95% CI | macro speedup | status |" in md and "| 1 | abc | – |" in md
    # The sweep fixed and rerun into the same directory: the stale error.txt goes, nothing is listed.
    sweep_dir, code, lines, err = sweep(launcher, tmp_path, monkeypatch, capsys, "seed=0,5,1")
    assert code == 0 and not list(sweep_dir.rglob("error.txt")), err[-3000:]
    table = json.loads((sweep_dir / "multirun.json").read_text())
    assert [(j["swept"]["seed"], j["error"]) for j in table["jobs"]] == [("0", None), ("5", None), ("1", None)]


def test_sweep_runs_the_jobs_that_compose_and_lists_the_others(tmp_path, monkeypatch, capsys):
    """`-m drafter=dflash,none drafter.init=random`: the `none` drafter has no `init` key, so its jobs cannot be
    composed. They are set aside (an error.txt and command.json each under uncomposed/), the dflash jobs run, and the
    sweep ends with its table and one line listing the set-aside jobs (exit 2)."""
    sweep_dir = tmp_path / "sweep"
    tiny = [a for a in TINY if not a.startswith(("drafter=", "eval.max_new_tokens="))]
    args = ["-m", "drafter=dflash,none", "eval.max_new_tokens=2,3", *tiny, "drafter.init=random",
            f"hydra.sweep.dir={sweep_dir}"]
    code, lines, err = run_cli(args, tmp_path / "unused", monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    why = ("cannot compose this job's config (Could not override 'drafter.init': Key 'init' is not in struct, an "
           "option this job chose has no such key); the sweep went on without it")
    assert lines == [f"specexp: error: 2 job(s) of the sweep failed (each one's line is in its error.txt under "
                     f"{sweep_dir}): job uncomposed/2: {why}; job uncomposed/3: {why}"], lines
    for job in ("0", "1"):                                               # the two dflash jobs ran
        assert json.loads((sweep_dir / job / "summary.json").read_text())["drafter"] == "dflash"
    assert (sweep_dir / "uncomposed" / "2" / "error.txt").read_text() == why + "\n"
    rerun = json.loads((sweep_dir / "uncomposed" / "3" / "command.json").read_text())["overrides"]
    assert "drafter=none" in rerun and "eval.max_new_tokens=3" in rerun
    table = json.loads((sweep_dir / "multirun.json").read_text())
    assert [(j["job"], j["error"] is None) for j in table["jobs"]] == [("0", True), ("1", True),
                                                                       ("uncomposed/2", False), ("uncomposed/3", False)]


def test_internal_error_is_one_line_with_the_log(tmp_path, monkeypatch, capsys):
    """An unexpected exception (not the user's input): exit 1, one line, the full traceback in the run's log."""
    import specexp.eval.evaluator as evaluator

    def boom(cfg, out_dir, typed):
        raise RuntimeError("an unexpected fault\nwith a second line")

    monkeypatch.setattr(evaluator, "run_eval", boom)
    run_dir = tmp_path / "run"
    code, lines, err = run_cli(TINY, run_dir, monkeypatch, capsys)
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert lines == [f"specexp: error: internal error: RuntimeError: an unexpected fault (full traceback in "
                     f"{run_dir / 'specexp.log'})"], lines
    log = (run_dir / "specexp.log").read_text()
    assert "Traceback (most recent call last)" in log and "in boom" in log and "with a second line" in log, log
