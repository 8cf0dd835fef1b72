"""`data.source=hub`: a data set read through `datasets.load_dataset` (the DeLS-Spec corpora, conf/data/
paper_qwen3_*.yaml), here a tiny local one in the same record format (SpecForge's ShareGPT `conversations`). The
sequences are exactly the project's own rendering of the first exchange: the prompt as inference renders it, the
answer, the stop token, loss on the answer."""
import json

import pytest
from conftest import make_cfg

from specexp.errors import UserError
from specexp.training import data as D
from specexp.training.pipeline import prepare_sequences

RECORDS = [
    {"id": "a", "conversations": [{"role": "user", "content": "What is 2 + 3?"},
                                  {"role": "assistant", "content": "2 + 3 = 5. The answer is 5."},
                                  {"role": "user", "content": "And 4 + 4?"},
                                  {"role": "assistant", "content": "8."}]},
    {"id": "b", "conversations": [{"from": "human", "value": "Name a colour."},
                                  {"from": "gpt", "value": "Blue is a colour of the sky."}]},
    {"id": "c", "conversations": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Say hello."},
                                  {"role": "assistant", "content": "<think>\n\n</think>\n\nHello there, friend."}]},
    {"id": "d", "conversations": [{"role": "user", "content": "No answer here."}]},
]
ANSWERS = {"a": ("What is 2 + 3?", "2 + 3 = 5. The answer is 5."),
           "b": ("Name a colour.", "Blue is a colour of the sky."),
           "c": ("Say hello.", "Hello there, friend.")}


@pytest.fixture
def hub_dir(tmp_path):
    d = tmp_path / "hubset"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return d


def hub_cfg(*o):
    return make_cfg(["target=tiny_qwen3", "logger=none", "device=cpu", "drafter=dels_rnn", "data=smoke",
                     "data.source=hub", "data.max_samples=null", "data.min_response_tokens=1", *o])


def expected(target, max_length):
    out = {}
    for id_, (user, answer) in ANSWERS.items():
        prompt = target.encode_chat([{"role": "user", "content": user}])
        resp = target.tokenizer(answer, add_special_tokens=False).input_ids + [target.stop_token_ids[0]]
        ids = (prompt + resp)[:max_length]
        out[id_] = (ids, [False] * len(prompt) + [True] * (len(ids) - len(prompt)))
    return out


def test_hub_records_give_the_projects_own_sequences(hub_dir, tmp_path, tiny_target, capsys):
    from specexp.config import validate

    cfg = hub_cfg(f"data.hub.id={hub_dir}", "data.hub.data_files=train.jsonl")
    validate(cfg)
    seqs, h = prepare_sequences(cfg.data, cfg.target, tiny_target, tmp_path / "stages")
    assert "1 records" in capsys.readouterr().out            # "d" has no answer
    want = expected(tiny_target, cfg.data.max_length)
    got = {s.id: (s.ids.tolist(), s.loss_mask.tolist()) for s in seqs}
    assert got == want
    # the same records as a JSONL file (the json builder): same sequences; the hash names the set (id, revision)
    f = hub_dir / "train.jsonl"
    seqs2, h2 = prepare_sequences(hub_cfg(f"data.hub.id={f}").data, cfg.target, tiny_target, tmp_path / "stages")
    assert {s.id: (s.ids.tolist(), s.loss_mask.tolist()) for s in seqs2} == want and h2 != h
    _, h3 = prepare_sequences(hub_cfg(f"data.hub.id={f}", "data.hub.revision=abc123").data, cfg.target,
                              tiny_target, tmp_path / "stages")
    assert h3 not in (h, h2)
    # max_samples and the shuffle seed as for the corpus files
    few, _ = prepare_sequences(hub_cfg(f"data.hub.id={f}", "data.max_samples=2").data, cfg.target, tiny_target,
                               tmp_path / "stages")
    assert len(few) == 2 and {s.id for s in few} <= set(want)


def test_bad_hub_settings_are_one_line(hub_dir):
    from specexp.config import validate

    with pytest.raises(UserError, match=r"^data.hub.format='alpaca' is not valid; expected sharegpt") as e:
        validate(hub_cfg(f"data.hub.id={hub_dir}", "data.hub.format=alpaca"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="data.source=hub needs data.hub.id"):
        validate(hub_cfg())
    with pytest.raises(UserError, match="data.source='files' is not valid; expected corpus"):
        validate(hub_cfg("data.source=files"))
    with pytest.raises(UserError, match="data.hub.format='alpaca' is not valid; choose from: sharegpt, messages"):
        D.load_hub({"id": str(hub_dir), "format": "alpaca", "split": "train"}, None, 0)
    with pytest.raises(UserError, match="format messages reads 'messages'"):
        D.load_hub({"id": str(hub_dir / "train.jsonl"), "format": "messages", "split": "train"}, None, 0)


@pytest.mark.parametrize("size", ["4b", "8b"])
def test_paper_corpora_configs(size):
    """The paper experiments train on the paper's corpora, used as they are (no regeneration)."""
    from specexp.config import validate

    for exp in ("dels_rnn", "dels_markov", "domino_ft", "fusion_learned"):
        cfg = make_cfg([f"experiment=paper_{exp}_qwen3_{size}"])
        validate(cfg)
        d = cfg.data
        assert d.source == "hub" and not d.regenerate and d.corpus_answers and d.hub.format == "sharegpt"
    assert make_cfg([f"experiment=paper_dels_rnn_qwen3_{size}"]).data.hub.id == {
        "4b": "TY233/qwen3-4b-instruct-100k-backup", "8b": "yaro1214/open_data"}[size]
