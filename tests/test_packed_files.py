"""Committed files stored compressed read exactly as their plain forms: checkpoints (`model.safetensors.xz`,
scripts/pack_checkpoint.py), corpora (`*.jsonl.gz`), and a checkpoint kept out of the repository names the command
that rebuilds it."""
import gzip
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from specexp import checkpoints as ckpt
from specexp.errors import UserError
from specexp.training import data as D

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("pack_checkpoint", ROOT / "scripts" / "pack_checkpoint.py")
pack_checkpoint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pack_checkpoint)


def _state():
    g = torch.Generator().manual_seed(0)
    return {"fc.weight": torch.randn(8, 16, generator=g).bfloat16(), "norm.weight": torch.ones(8)}


def test_a_packed_checkpoint_loads_the_same_tensors(tmp_path):
    state = _state()
    ckpt.save(tmp_path / "plain", state, {"x": 1})
    ckpt.save(tmp_path / "packed", state, {"x": 1})
    plain_bytes = (tmp_path / "packed" / ckpt.WEIGHTS_FILE).read_bytes()
    pack_checkpoint.pack(tmp_path / "packed")
    assert not (tmp_path / "packed" / ckpt.WEIGHTS_FILE).exists()
    a = ckpt.load_state(tmp_path / "plain", state, "plain")
    b = ckpt.load_state(tmp_path / "packed", state, "packed")
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in state)
    pack_checkpoint.unpack(tmp_path / "packed")                       # xz -dk: the exact original bytes
    assert (tmp_path / "packed" / ckpt.WEIGHTS_FILE).read_bytes() == plain_bytes


def test_a_torn_packed_checkpoint_is_one_line(tmp_path):
    ckpt.save(tmp_path, _state(), {"x": 1})
    pack_checkpoint.pack(tmp_path)
    f = tmp_path / (ckpt.WEIGHTS_FILE + ".xz")
    f.write_bytes(f.read_bytes()[:-30])
    with pytest.raises(UserError, match=r"^where: \S+/model.safetensors.xz cannot be read \(Compressed data ended"):
        ckpt.load_state(tmp_path, _state(), "where")


def test_missing_weights_name_the_rebuild_command(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="no model.safetensors"):
        ckpt.weight_files(tmp_path, "d")
    (tmp_path / "card.json").write_text(json.dumps({"rebuild": "python -m specexp experiment=x"}))
    with pytest.raises(UserError, match="not in this checkout .*build them with `python -m specexp experiment=x`"):
        ckpt.weight_files(tmp_path, "d")


def test_the_committed_xl_card_names_its_rebuild_experiment():
    card = json.loads((ROOT / "checkpoints/mini/smollm2_135m-dflash-b8-xl/card.json").read_text())
    exp = card["rebuild"].split("experiment=")[1].split()[0]
    assert (ROOT / "conf" / "experiment" / f"{exp}.yaml").is_file()


def test_a_gzipped_corpus_reads_as_the_plain_file(tmp_path):
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}\u2028x"},
                                         {"role": "assistant", "content": f"a{i}"}]} for i in range(5)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "plain").mkdir()
    (tmp_path / "packed").mkdir()
    (tmp_path / "plain" / "mbpp_nontest.jsonl").write_text(text)
    (tmp_path / "packed" / "mbpp_nontest.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    a = D.load_corpus(["mbpp_nontest"], None, 0, tmp_path / "plain")
    b = D.load_corpus(["mbpp_nontest"], None, 0, tmp_path / "packed")
    assert a == b and len(a) == 5
    with pytest.raises(UserError, match="data.corpus: 'sharegpt': no .*sharegpt_v3_sample.jsonl"):
        D.load_corpus(["sharegpt"], None, 0, tmp_path / "plain")
