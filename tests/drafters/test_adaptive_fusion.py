"""Adaptive DeLS-Spec fusion (`fusion=entropy`, `fusion=gate`; kernels/adaptive.py): the weights follow their
formulas, the drafting loop fuses each row with its own weights (torch reference and Triton kernel alike, also in the
CUDA-graph body and the batched replay paths), the drafts are not fixed-weight drafts in disguise, greedy output
(chains and trees) equals the target's, protocol B keeps the target distribution (χ²), and bad settings are one
line."""
import pytest
import torch

from helpers import DELS, _Stateless, follow_script, micro_target, protocol_b_toy_fit
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters import dels
from specexp.errors import UserError
from specexp.kernels.adaptive import EntropySchedule, GateSchedule, build_schedule, entropy_maxp
from specexp.kernels.fusion import TritonFusion, fuse_torch, gumbel

ENTROPY = ["fusion=entropy", "fusion.schedule.a0=0.0", "fusion.schedule.a1=6.0", "fusion.schedule.b0=0.0",
           "fusion.schedule.b1=2.0", "fusion.schedule.h0=2.0", "fusion.schedule.width=0.3"]
GATE = ["fusion=gate", "fusion.schedule.w_alpha=[-1.0,2.0,0.5,-3.0]", "fusion.schedule.c_alpha=1.0",
        "fusion.schedule.alpha_max=6.0", "fusion.schedule.w_beta=[0.5,0.0,-0.5,1.0]", "fusion.schedule.c_beta=0.0",
        "fusion.schedule.beta_max=2.0"]


class _Backbone(_Stateless):
    """Hand-made long logits: row i of every block is `table[anchor] * scale_i` (rows of varying entropy)."""

    def __init__(self, table, k):
        self.table, self.max_drafts = table, k
        self.scale = torch.linspace(0.2, 3.0, k)

    def block_logits(self, anchor, start, k):
        return None, self.table[anchor][None] * self.scale[:k, None]                             # [k, V]


def _head(vocab, hidden=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = dels.LocalHeadConfig("rnn", hidden, vocab, input_rank=5, gru_hidden=7, output_rank=4)
    head = dels.random_head(c, seed, 0.8)
    embed, lm = torch.randn(vocab, hidden, generator=g), torch.randn(vocab, hidden, generator=g)
    return dels.MergedHead(head, embed, lm, torch.float32, "cpu"), head, embed, lm


def _entropy():
    return EntropySchedule(0.0, 6.0, 0.0, 2.0, 2.0, 0.3)


def _gate():
    return GateSchedule([-1.0, 2.0, 0.5, -3.0], 1.0, 6.0, [0.5, 0.0, -0.5, 1.0], 0.0, 2.0)


def test_schedules_follow_their_formulas():
    g = torch.Generator().manual_seed(0)
    long, short = torch.randn(3, 50, generator=g) * 3, torch.randn(3, 50, generator=g)
    p = torch.softmax(long, -1)
    h = -(p * p.log()).sum(-1)
    torch.testing.assert_close(entropy_maxp(long)[0], h)
    a, b = _entropy()(long)
    s = torch.sigmoid((h - 2.0) / 0.3)
    torch.testing.assert_close(a, 6.0 * s), torch.testing.assert_close(b, 2.0 * s)
    ps = torch.softmax(short, -1)
    f = torch.stack([h, p.max(-1).values, -(ps * ps.log()).sum(-1), ps.max(-1).values], -1)
    a, b = _gate()(long, short)
    torch.testing.assert_close(a, 6.0 * torch.sigmoid(1.0 + f @ torch.tensor([-1.0, 2.0, 0.5, -3.0])))
    torch.testing.assert_close(b, 2.0 * torch.sigmoid(f @ torch.tensor([0.5, 0.0, -0.5, 1.0])))
    one = _entropy()(long[1])                                                     # one row: 0-d weights
    assert one[0].shape == () and torch.isclose(one[0], _entropy()(long)[0][1])
    assert torch.isfinite(entropy_maxp(torch.tensor([0.0, -float("inf"), 1.0]))[0])       # a masked vocabulary


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("make", [_entropy, _gate])
def test_the_loop_fuses_each_row_with_its_own_weights(backend, make):
    """The drafts equal the formula written out by hand (through torch.nn.GRU), with the weights of each row, and
    they are not the drafts of any fixed (alpha, beta) the schedule spans: no silent fallback to fixed weights."""
    V, K = 40, 6
    g = torch.Generator().manual_seed(1)
    merged, head, embed, lm = _head(V)
    table, lp = torch.randn(V, V, generator=g) * 2, torch.log_softmax(torch.randn(V, generator=g) * 2, 0)
    sched = make()
    drafter = dels.DeLSDrafter(_Backbone(table, K), merged, lp, 0.0, 0.0, backend, False, sched)
    weights = []
    with torch.no_grad():
        for anchor in range(V):
            long = table[anchor][None] * torch.linspace(0.2, 3.0, K)[:, None]
            toks = [int(long[0].argmax())]
            for i in range(1, K):
                short = lm @ head.hidden(embed[torch.tensor(toks)][None])[0, -1]
                a, b = sched(long[i], short)
                weights.append((float(a), float(b)))
                toks.append(int(((long[i] - b * lp) + a * short).argmax()))
            assert drafter.propose(anchor, 0, K, None).tokens.tolist() == toks, anchor
    assert max(w[0] for w in weights) - min(w[0] for w in weights) > 1.0                # the weights do vary
    fixed_like = {(round(a, 1), round(b, 1)) for a, b in weights[::7]} | {(0.0, 0.0), (6.0, 2.0)}
    for a, b in fixed_like:
        fixed = dels.DeLSDrafter(_Backbone(table, K), merged, lp, a, b, "torch", False)
        assert any(not torch.equal(fixed.propose(x, 0, K, None).tokens, drafter.propose(x, 0, K, None).tokens)
                   for x in range(V)), (a, b)


@pytest.mark.parametrize("make", [_entropy, _gate])
def test_the_kernel_reads_adaptive_weights_from_device_memory(make):
    V, r = 3001, 9
    g = torch.Generator().manual_seed(2)
    long, z = torch.randn(V, generator=g) * 3, torch.randn(r, generator=g)
    w, lp = torch.randn(V, r, generator=g) / 3, torch.log_softmax(torch.randn(V, generator=g), 0)
    a, b = make()(long, w @ z)
    k = TritonFusion(V, "cpu")
    assert int(k(long, z, w, a, b, lp)[0]) == int(fuse_torch(long, z, w, a, b, lp)[0])
    assert int(k(long, z, w, a, b, lp)[0]) == int(k(long, z, w, float(a), float(b), lp)[0])
    noise = gumbel(V, g, "cpu")
    tok, prob = k(long, z, w, a, b, lp, 0.8, noise)
    ref, ref_prob = fuse_torch(long, z, w, a, b, lp, 0.8, noise)
    assert int(tok) == int(ref)
    torch.testing.assert_close(prob, ref_prob, rtol=1e-4, atol=1e-7)


def _dist_test(backend, n_runs, sched):
    """χ² of the first 4 generated tokens against the toy target's exact distribution under protocol B, the fused
    drafts from adaptive weights (as tests/drafters/test_dels.py does for fixed ones)."""
    V, steps, T = 3, 4, 0.8
    g = torch.Generator().manual_seed(0)
    target_table = torch.randn(V, V, generator=g) * 1.5
    draft_table = target_table + torch.randn(V, V, generator=g) * 1.5
    merged = _head(V, seed=1)[0]
    lp = torch.log_softmax(torch.randn(V, generator=g), 0)
    drafter = dels.DeLSDrafter(_Backbone(draft_table, 3), merged, lp, 0.0, 0.0, backend, False, sched)
    return protocol_b_toy_fit(target_table, drafter, T, steps, n_runs)


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: EntropySchedule(0.0, 3.0, 0.0, 1.0, 0.8, 0.2), _gate])
def test_protocol_b_with_adaptive_weights_keeps_the_target_distribution(make):
    pvalue, deep = _dist_test("torch", 4000, make())
    assert deep > 4000 // 10 and pvalue > 1e-3, (pvalue, deep)


@pytest.mark.slow
def test_protocol_b_through_the_triton_kernel_with_adaptive_weights():
    pvalue, deep = _dist_test("triton", 400, _gate())
    assert deep > 400 // 10 and pvalue > 1e-3, (pvalue, deep)


@pytest.mark.parametrize("extra", [ENTROPY, GATE])
def test_greedy_output_equals_the_targets_chain_tree_and_batched(cfg_factory, tiny_target, extra):
    t = tiny_target
    d = registry.build_drafter(cfg_factory("drafter=dels_rnn", *DELS, "drafter.head.init_std=0.5", *extra).drafter, t)
    fixed = registry.build_drafter(cfg_factory("drafter=dels_rnn", *DELS, "drafter.head.init_std=0.5").drafter, t)
    assert d.schedule is not None and d.schedule.kind == extra[0].split("=")[1] and fixed.schedule is None
    tree = registry.build_drafter(cfg_factory("drafter=dels_rnn", *DELS, "drafter.head.init_std=0.5", *extra,
                                              "drafter.mode=tree", "drafter.tree.top_k=3",
                                              "drafter.tree.total_tokens=12").drafter, t)
    assert tree.proposes_trees and tree.schedule is not None
    differs = False
    for prompt, n in (("Count from one to ten.", 40), ("Hello", 1), ("What is 17 * 23?", 25)):
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=n))
        for drafter in (d, tree):
            assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=n)).tokens == ref.tokens, (prompt, n)
        _, taps = t.forward(torch.tensor([ids]), 0, t.new_cache(), taps=d.tap_layers)
        d.reset(), d.prefill(taps), fixed.reset(), fixed.prefill(taps)
        differs |= not torch.equal(d.propose(ref.tokens[0], len(ids), 15, None).tokens,
                                   fixed.propose(ref.tokens[0], len(ids), 15, None).tokens)
    assert differs, "adaptive drafts equal the default fixed drafts everywhere: the test would not see the schedule"


@pytest.mark.parametrize("extra", [ENTROPY, GATE])
def test_batched_replay_paths_use_the_schedule(cfg_factory, extra, one_thread):
    """propose_all (replay) and matches_all with the schedule as a cell equal propose's drafts at every anchor."""
    micro = micro_target(vocab=2048, hidden=32, layers=2)
    d = registry.build_drafter(cfg_factory("drafter=dels_rnn", *DELS, "drafter.block_size=8", *extra).drafter, micro)
    prompt = torch.randint(0, 2047, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = follow_script(micro, d, prompt, 30, seed=1)
    p, k_max = len(prompt), d.max_drafts
    _, taps = micro.forward(torch.tensor([seq[:-1]]), 0, micro.new_cache(), taps=d.tap_layers)
    ks = torch.full((len(seq) - p - 1,), k_max)
    starts, ids = p + torch.arange(len(ks)), torch.tensor(seq)
    every = d.propose_all(taps, ids, starts, ks, chunk=7)
    d.reset()
    _, ptaps = micro.forward(torch.tensor([seq[:p]]), 0, micro.new_cache(), taps=d.tap_layers)
    d.prefill(ptaps)
    got = d.matches_all(taps, ids, starts, ks, [(0.0, 0.0), d.schedule], chunk=5)
    for j in range(len(ks)):
        row = every[j].tolist()
        n = 0
        while n < k_max and row[n] == (seq[p + j + 1 + n] if p + j + 1 + n < len(seq) else -2):
            n += 1
        assert int(got[1, j]) == n, j
    assert got[1].max() >= 3 and not torch.equal(got[0], got[1])


@pytest.mark.parametrize("over,match", [
    (["fusion=entropy", "fusion.schedule.width=0"], "width=0.0 must be > 0"),
    (["fusion=entropy", "+fusion.schedule.c=1"], "fusion.schedule needs exactly"),
    (["fusion=gate", "fusion.schedule.w_alpha=[1,2]"], "expected a list of 4 numbers"),
    (["fusion=entropy", "fusion.alpha=learned"], "computes alpha and beta itself"),
])
def test_bad_adaptive_settings_are_one_line_errors(cfg_factory, tiny_target, over, match):
    with pytest.raises(UserError, match=match) as e:
        registry.build_drafter(cfg_factory("drafter=dels_rnn", *DELS, *over).drafter, tiny_target)
    assert "\n" not in str(e.value)


def test_domino_refuses_adaptive_weights(cfg_factory, tiny_target):
    with pytest.raises(UserError, match="fusion.adaptive=entropy is DeLS-Spec's") as e:
        registry.build_drafter(cfg_factory("drafter=domino_ft", "fusion=entropy").drafter, tiny_target)
    assert "\n" not in str(e.value)


def test_build_schedule_refuses_unknown_forms():
    assert build_schedule(None, {}) is None
    with pytest.raises(UserError, match="fusion.adaptive='x'"):
        build_schedule("x", {})
