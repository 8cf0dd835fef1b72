"""Protocols A, B and block verification preserve the target distribution (χ² against the exact distribution of a
toy bigram target, with a draft model that differs from it), and a broken rule is caught by the same test. Block
verification is also checked exactly: the distribution of a round's output (the target continuing after it) is
enumerated over every draft block, and its expected accepted length compared with protocol B's."""
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
@pytest.mark.parametrize("protocol", ["A", "B", "block"])
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


# ------------------------------------------------------------------------------------- block verification, exactly
def _round(rule, p, q, d):
    """[(n, P(n), bonus distribution)] of one verification of drafts `d` under `rule` ("B" or "block"), from the
    target's rows `p [K+1, V]` and the drafter's `q [K, V]` (float64)."""
    k = len(d)
    if rule == "B":
        acc = [min(1.0, float(p[i, d[i]] / q[i, d[i]])) for i in range(k)]
        out, run = [], 1.0
        for n in range(k + 1):
            stop = run * (1 - acc[n]) if n < k else run
            res = (p[n] - q[n]).clamp_min(0) if n < k else p[k]
            out.append((n, stop, res / res.sum() if res.sum() > 1e-15 else p[n]))
            run *= acc[n] if n < k else 1.0
        return out
    h, w = V.block_weights(p, q, torch.tensor(d))
    out = []
    for n in range(k + 1):                                    # n = the largest i with u_i <= h_i
        prob = (1.0 if n == 0 else float(h[n - 1])) * float(torch.prod(1 - h[n:]))
        res = (w[n] * p[n] - q[n]).clamp_min(0) if n < k else p[k]
        out.append((n, prob, res / res.sum() if res.sum() > 1e-15 else p[n]))
    return out


def _exact_round(rule, target, draft, k, vocab):
    """The exact distribution of the first k+1 tokens after token 0 (one round of `rule` over every draft block,
    weighted by its q-probability, then the target's own continuation), and the expected drafts accepted."""
    P, Q = torch.softmax(target, -1), torch.softmax(draft, -1)

    def seq_prob(prev, seq):
        pr = 1.0
        for t in seq:
            pr, prev = pr * float(P[prev, t]), t
        return pr

    dist, accepted = {}, 0.0
    for d in itertools.product(range(vocab), repeat=k):
        ctx = [0, *d]
        qd = 1.0
        for a, b in zip(ctx, ctx[1:]):
            qd *= float(Q[a, b])
        p, q = P[ctx], Q[ctx[:k]]                                                  # [K+1, V], [K, V]
        for n, prob, bonus in _round(rule, p, q, list(d)):
            accepted += qd * prob * n
            for y in range(vocab):
                head = [*d[:n], y]
                mass = qd * prob * float(bonus[y])
                for tail in itertools.product(range(vocab), repeat=k + 1 - len(head)):
                    key = (*head, *tail)
                    dist[key] = dist.get(key, 0.0) + mass * seq_prob(y, tail)
    exact = {s: seq_prob(0, s) for s in itertools.product(range(vocab), repeat=k + 1)}
    return max(abs(dist.get(s, 0.0) - e) for s, e in exact.items()), accepted


def test_block_verification_is_exact_and_accepts_at_least_protocol_b():
    """On toy bigram targets and drafters (3 seeds, V = 3, K = 3): a round of block verification followed by the
    target's own sampling gives the target's distribution of the first K+1 tokens exactly (as protocol B does), and
    block's expected accepted drafts, over the drafts q samples, are at least B's, strictly more where q is poor."""
    gains = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        target = torch.randn(3, 3, generator=g, dtype=torch.float64) * 2.0
        draft = target + torch.randn(3, 3, generator=g, dtype=torch.float64) * 3.0
        err_b, acc_b = _exact_round("B", target, draft, 3, 3)
        err_block, acc_block = _exact_round("block", target, draft, 3, 3)
        assert err_b < 1e-12 and err_block < 1e-12, (seed, err_b, err_block)
        assert acc_block >= acc_b - 1e-12, (seed, acc_block, acc_b)
        gains.append(acc_block - acc_b)
    assert max(gains) > 0.05, gains                 # the test must be able to tell the rules apart


def test_block_verification_with_a_wrong_end_probability_is_caught():
    """Negative control for the exact test: ending where the weight says (h_i = w_i), not at r/(r + 1 - w), is not
    the target's distribution."""
    import unittest.mock

    def wrong(p, q, drafts):
        h, w = real(p, q, drafts)
        return w[1:].clone(), w

    real = V.block_weights
    with unittest.mock.patch.object(V, "block_weights", wrong):
        g = torch.Generator().manual_seed(1)
        target = torch.randn(3, 3, generator=g, dtype=torch.float64) * 2.0
        err, _ = _exact_round("block", target, target + torch.randn(3, 3, generator=g, dtype=torch.float64) * 3.0,
                              3, 3)
    assert err > 1e-3
