"""Anchors, the training mask and label alignment, checked against brute-force constructions."""
import math

import pytest
import torch

from specexp.training.anchors import (
    build_blocks,
    default_gamma,
    dense_mask,
    flex_mask,
    leading_correct,
    sample_anchors,
)
from specexp.training.optim import cosine_with_warmup

S, B, MASK = 23, 4, 999


def seq():
    ids = torch.arange(100, 100 + S)
    lm = torch.zeros(S, dtype=torch.bool)
    lm[6:] = True
    lm[15] = False                                  # a hole in the response mask
    return ids, lm


def test_anchors_are_valid_distinct_sorted():
    ids, lm = seq()
    valid = {p for p in range(S - 1) if lm[p] and lm[p + 1]}
    for n in (1, 5, 100):
        a = sample_anchors(lm, n, torch.Generator().manual_seed(n)).tolist()
        assert a == sorted(set(a)) and set(a) <= valid and len(a) == min(n, len(valid))


def test_labels_positions_weights_brute_force():
    ids, lm = seq()
    anchors = torch.tensor([6, 13, 20])
    gamma = 2.5
    blk = build_blocks(ids, lm, anchors, B, MASK, gamma)
    for bi, a in enumerate(anchors.tolist()):
        for k in range(B):
            q = bi * B + k
            assert blk.positions[q] == a + k
            assert blk.noise_ids[q] == (ids[a] if k == 0 else MASK)
            valid = k >= 1 and a + k < S and bool(lm[a + k])
            w = math.exp(-(k - 1) / gamma) if valid else 0.0
            assert blk.weights[q].item() == pytest.approx(w)
            if valid:
                assert blk.labels[q] == ids[a + k]          # block position k <-> token anchor + k


def test_mask_brute_force_and_flex_equivalence():
    anchors = torch.tensor([3, 9, 10])
    m = dense_mask(anchors, S, B)[0, 0]
    Q = 3 * B
    for q in range(Q):
        b = q // B
        for kv in range(S + Q):
            want = kv < anchors[b] if kv < S else (kv - S) // B == b   # strictly before; own block only
            assert bool(m[q, kv]) == bool(want), (q, kv)
    g = torch.Generator().manual_seed(0)
    qq, kk, vv = (torch.randn(1, 2, n, 8, generator=g) for n in (Q, S + Q, S + Q))
    from torch.nn.attention.flex_attention import flex_attention

    dense = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=m[None, None])
    flex = flex_attention(qq, kk, vv, block_mask=flex_mask(anchors, S, B))
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def test_simulated_acceptance_and_schedule():
    correct = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    valid = torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    assert leading_correct(correct, valid, B).tolist() == [3, 2, 1]
    assert default_gamma(16) == 7 and default_gamma(10) == 5 and default_gamma(8) == 4
    lrs = [cosine_with_warmup(s, 100, 0.04) for s in range(100)]
    assert lrs[0] == 0.25 and lrs[3] == 1.0 and lrs[4] == 1.0 and lrs[-1] < 1e-3
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
