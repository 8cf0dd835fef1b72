"""The engine is lossless under greedy decoding: speculative output == the target's own greedy output."""
import pytest
import torch

from helpers import OracleDrafter
from specexp.decoding.engine import DecodeConfig, generate

PROMPTS = ["What is 2+3?", "Write a haiku about rivers.", "def fib(n):", "Explain KV caches in one line."]


def ar(target, prompt, n, stops=()):
    ids = target.encode_chat([{"role": "user", "content": prompt}])
    return ids, generate(target, None, ids, DecodeConfig(max_new_tokens=n, stop_token_ids=tuple(stops)))


def test_ar_baseline_equals_hf_generate(tiny_target):
    ids, g = ar(tiny_target, PROMPTS[0], 24)
    out = tiny_target.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)
    assert g.tokens == out[0, len(ids):].tolist()
    assert g.accept_lengths == [1] * 23 and g.drafted == [0] * 23


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("n", [1, 2, 17, 40])
def test_random_dflash_greedy_equals_ar(tiny_target, tiny_dflash, prompt, n):
    ids, ref = ar(tiny_target, prompt, n)
    spec = generate(tiny_target, tiny_dflash, ids, DecodeConfig(max_new_tokens=n))
    assert spec.tokens == ref.tokens
    assert len(spec.tokens) == n and spec.stop_reason == "length"
    assert sum(spec.accept_lengths) == n - 1          # every token after the first came from a verification


@pytest.mark.parametrize("corrupt", [0.0, 0.15, 0.5])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_partially_correct_drafts_stay_lossless(tiny_target, prompt, corrupt):
    """Drafts that are right up to a random point exercise every acceptance length and the KV rollback."""
    n = 60
    ids, ref = ar(tiny_target, prompt, n)
    oracle = OracleDrafter(ref.tokens + [0] * 16, len(ids), 7, corrupt, tiny_target.vocab_size, seed=1)
    spec = generate(tiny_target, oracle, ids, DecodeConfig(max_new_tokens=n))
    assert spec.tokens == ref.tokens
    if corrupt == 0.0:
        assert spec.accept_lengths[:-1] == [8] * (len(spec.accept_lengths) - 1)   # full blocks + bonus
    else:
        assert 1 in spec.accept_lengths and max(spec.accept_lengths) > 1
    assert all(d <= 7 for d in spec.drafted)


@pytest.mark.parametrize("cap", [1, 3, 7, 12])
def test_a_draft_cap_verifies_at_most_that_many_drafts_and_stays_lossless(tiny_target, cap):
    """eval.max_drafts: a perfect drafter's rounds commit exactly cap + 1 tokens; a cap above K changes nothing."""
    n = 40
    ids, ref = ar(tiny_target, PROMPTS[0], n)
    oracle = OracleDrafter(ref.tokens + [0] * 16, len(ids), 7, 0.0, tiny_target.vocab_size, seed=1)
    spec = generate(tiny_target, oracle, ids, DecodeConfig(max_new_tokens=n, max_drafts=cap))
    k = min(cap, 7)
    assert spec.tokens == ref.tokens
    assert max(spec.drafted) == k and spec.accept_lengths[:-1] == [k + 1] * (len(spec.accept_lengths) - 1)


@pytest.mark.parametrize("stop_at", [0, 1, 5, 12])
def test_stop_token_inside_an_accepted_block(tiny_target, stop_at):
    ids, free = ar(tiny_target, PROMPTS[1], 40)
    stop = free.tokens[stop_at]
    first = free.tokens.index(stop)                   # the stop token may occur earlier
    _, ref = ar(tiny_target, PROMPTS[1], 40, stops=[stop])
    assert ref.tokens == free.tokens[: first + 1] and ref.stop_reason == "stop"
    oracle = OracleDrafter(free.tokens + [0] * 16, len(ids), 7, 0.0, tiny_target.vocab_size)
    spec = generate(tiny_target, oracle, ids, DecodeConfig(max_new_tokens=40, stop_token_ids=(stop,)))
    assert spec.tokens == ref.tokens and spec.stop_reason == "stop"


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 16, 17])
def test_budget_is_exact_with_full_acceptance(tiny_target, n):
    ids, ref = ar(tiny_target, PROMPTS[2], n)
    oracle = OracleDrafter(ref.tokens + [0] * 16, len(ids), 7, 0.0, tiny_target.vocab_size)
    spec = generate(tiny_target, oracle, ids, DecodeConfig(max_new_tokens=n))
    assert spec.tokens == ref.tokens and len(spec.tokens) == n
    assert all(d + 1 <= n - 1 for d in spec.drafted)  # never drafts past the budget


def test_kv_rollback_matches_full_recompute(tiny_target):
    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    cache = t.new_cache()
    t.forward(torch.tensor([ids]), 0, cache)
    block = torch.tensor([[11, 22, 33, 44, 55]])
    t.forward(block, len(ids), cache)                 # verify 5 tokens, keep 2 of them
    t.rollback(cache, 3)
    assert cache.get_seq_length() == len(ids) + 2
    nxt, _ = t.forward(torch.tensor([[66]]), len(ids) + 2, cache)
    full, _ = t.forward(torch.tensor([ids + [11, 22, 66]]), 0, t.new_cache())
    torch.testing.assert_close(nxt[0, -1], full[0, -1], rtol=1e-5, atol=1e-5)
    t.rollback(cache, 0)                              # k = 0 is a no-op (crop(0) would empty a 4.57 cache)
    assert cache.get_seq_length() == len(ids) + 3
