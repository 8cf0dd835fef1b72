"""Data-scaling points train on nested random subsets (`train.data_tokens`), and regeneration skips prompts no
training sequence could hold (`data.max_length`)."""
import json

import torch

from specexp.training import data as D


def seqs(lengths):
    out = []
    for i, n in enumerate(lengths):
        mask = torch.zeros(n + 3, dtype=torch.bool)
        mask[3:] = True                                       # 3 prompt tokens, n response tokens
        out.append(D.Sequence(f"s{i}", torch.arange(n + 3), mask))
    return out


def tokens(ss, idx):
    return sum(int(ss[i].loss_mask.sum()) for i in idx)


def test_subsets_are_nested_minimal_and_seeded():
    g = torch.Generator().manual_seed(0)
    ss = seqs(torch.randint(5, 60, (200,), generator=g).tolist())
    total = tokens(ss, range(len(ss)))
    picks = [D.token_subset(ss, b, seed=0) for b in (300, 1000, 3000, total + 10)]
    for small, big in zip(picks, picks[1:]):
        assert set(small) < set(big)                          # a larger budget contains the smaller one's subset
    for b, idx in zip((300, 1000, 3000), picks):
        assert idx == sorted(idx) and tokens(ss, idx) >= b
        order = torch.randperm(len(ss), generator=torch.Generator().manual_seed(0)).tolist()
        last = max(idx, key=order.index)                      # the last one drawn was needed to reach the budget
        assert tokens(ss, [i for i in idx if i != last]) < b
    assert picks[-1] == list(range(len(ss)))                  # a budget past the data: every sequence
    assert D.token_subset(ss, 1000, seed=1) != picks[1]


def test_regeneration_skips_prompts_longer_than_max_length(tiny_target, tmp_path, capsys):
    short = D.Conversation("short", "Say hi.", "")
    long = D.Conversation("long", "word " * 300, "")
    n_long = len(tiny_target.encode_chat([{"role": "user", "content": long.user}]))
    out = tmp_path / "regen.jsonl"
    D.regenerate(tiny_target, [long, short], out, 2, 4, 0.0, 1.0, 0, 0, max_length=n_long)
    assert "1 prompts of >= " in capsys.readouterr().out
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["short"]
    D.regenerate(tiny_target, [long, short], out, 2, 4, 0.0, 1.0, 0, 0, max_length=n_long + 1)
    assert sorted(json.loads(x)["id"] for x in out.read_text().splitlines()) == ["long", "short"]


def test_stage_names_change_only_when_a_budget_is_set():
    from conftest import make_cfg

    from specexp.training.dflash_module import train_recipe

    assert "data_tokens" not in train_recipe(make_cfg(["target=tiny_qwen3"]).train)      # earlier stages keep names
    assert train_recipe(make_cfg(["target=tiny_qwen3", "train.data_tokens=1000"]).train)["data_tokens"] == 1000


def test_fewer_layers_are_read_from_a_wider_cache(tiny_target, tmp_path):
    t = tiny_target
    seqs = [D.Sequence(f"s{i}", torch.arange(10 + i, 30 + 2 * i), torch.ones(20 + i, dtype=torch.bool))
            for i in range(3)]
    meta = {"target": "tiny", "layer_ids": [0, 1, 3], "dtype": "float32", "data_hash": "abc"}
    D.FeatureCache(tmp_path / "features-aaa", meta).build(t, seqs, [0, 1, 3], torch.float32, shard_tokens=30)
    ds = D.wider_cache(tmp_path, {**meta, "layer_ids": [3, 0]}, t.hidden_size)
    assert ds is not None and len(ds) == 3
    for i, s in enumerate(seqs):
        _, taps = t.forward(s.ids[None], 0, t.new_cache(), taps=(3, 0))
        torch.testing.assert_close(ds[i]["taps"], taps[0])          # the requested layers, in the requested order
    assert D.wider_cache(tmp_path, {**meta, "layer_ids": [2]}, t.hidden_size) is None        # a layer not cached
    assert D.wider_cache(tmp_path, {**meta, "layer_ids": [0], "data_hash": "other"}, t.hidden_size) is None


def test_a_scaling_point_caches_the_features_of_its_subset_alone(cfg_factory, tmp_path):
    """task=train with train.data_tokens: the feature cache holds the subset's sequences (a curve's small points do
    not pay for the whole data's target pass), the card counts both the subset and the whole data."""
    from specexp.training.pipeline import run_train

    cfg = cfg_factory("task=train", "drafter=dflash", "drafter.init=random", "train=smoke", "data=smoke",
                      f"paths.cache={tmp_path / 'cache'}", "data.features=cache", "train.data_tokens=100",
                      "train.max_steps=2")
    card = run_train(cfg, tmp_path / "run")
    assert card["sequences"] < card["data_sequences"] and card["response_tokens"] >= 100
    index = [json.loads(p.read_text()) for p in (tmp_path / "cache").rglob("features-*/index.json")]
    metas = [json.loads(p.read_text()) for p in (tmp_path / "cache").rglob("features-*/meta.json")]
    assert len(index) == 1 and len(index[0]) == card["sequences"]
    assert metas[0]["subset"] == {"data_tokens": 100, "seed": 0}
