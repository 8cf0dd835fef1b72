"""Protocols A and B preserve the target distribution (χ² against the exact distribution of a toy bigram
target, with a draft model that differs from it), and a broken rule is caught by the same test."""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from helpers import ToyDrafter, ToyTarget
from specexp.decoding import verify as V
from specexp.decoding.engine import DecodeConfig, generate

VOCAB, STEPS, N = 4, 3, 6000
T = 0.8


def tables():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(VOCAB, VOCAB, generator=g) * 1.5
    draft = target + torch.randn(VOCAB, VOCAB, generator=g) * 1.5      # correlated but different
    return target, draft


def exact(target_table, prompt=0):
    p = torch.softmax(target_table.double() / T, dim=-1)
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=STEPS):
        prev, pr = prompt, 1.0
        for t in seq:
            pr, prev = pr * float(p[prev, t]), t
        probs[seq] = pr
    return probs


def sample_sequences(protocol, monkeypatch=None, k=3):
    target_table, draft_table = tables()
    target, drafter = ToyTarget(target_table), ToyDrafter(draft_table, k)
    dc = DecodeConfig(protocol=protocol, temperature=T, max_new_tokens=STEPS)
    g = torch.Generator().manual_seed(1234)
    counts, accepted = {}, 0
    for _ in range(N):
        out = generate(target, drafter, [0], dc, g)
        seq = tuple(out.tokens)
        counts[seq] = counts.get(seq, 0) + 1
        accepted += sum(a - 1 for a in out.accept_lengths)
    probs = exact(target_table)
    keys = sorted(probs)
    obs = [counts.get(s, 0) for s in keys]
    total = sum(probs.values())
    exp = [probs[s] / total * N for s in keys]
    return chisquare(obs, exp).pvalue, accepted


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["A", "B"])
def test_protocol_preserves_target_distribution(protocol):
    pvalue, accepted = sample_sequences(protocol)
    assert accepted > N // 4, "drafts must actually be accepted for the test to mean anything"
    assert pvalue > 1e-3


@pytest.mark.slow
def test_a_broken_rule_is_detected(monkeypatch):
    """Negative control: accepting protocol-B drafts without the p/q test skews the distribution."""

    def accept_all(logits, drafts, q, temperature, generator):
        p = torch.softmax(logits.float() / temperature, dim=-1)
        bonus = torch.multinomial(p[drafts.numel()], 1, generator=generator)
        return V.Verdict(drafts.tolist() + [int(bonus)], bonus)

    monkeypatch.setattr(V, "protocol_b", accept_all)
    pvalue, _ = sample_sequences("B")
    assert pvalue < 1e-6


def test_rules_on_hand_made_logits():
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])   # argmax 1, 2, 0
    def greedy(drafts):
        v = V.greedy(logits[: len(drafts) + 1], torch.tensor(drafts, dtype=torch.long))
        assert v.anchor.tolist() == [v.bonus]                      # the bonus stays on the device too
        return v.n, v.tokens

    assert greedy([1, 2]) == (2, [1, 2, 0])
    assert greedy([1, 0]) == (1, [1, 2])
    assert greedy([2, 2]) == (0, [1])
    assert greedy([]) == (0, [1])
    # Protocol B with q == p accepts every draft (ratio 1); with q putting all mass where p has none, none.
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(logits, -1)
    assert V.protocol_b(logits, torch.tensor([1, 2]), p[:2], 1.0, g).n == 2
    q_bad = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    logits_zero = torch.tensor([[0.0, 0.0, -1e9], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    v = V.protocol_b(logits_zero, torch.tensor([2, 0]), q_bad, 1.0, g)
    assert v.n == 0 and v.bonus in (0, 1) and v.anchor.tolist() == [v.bonus]  # the residual excludes the rejected token
