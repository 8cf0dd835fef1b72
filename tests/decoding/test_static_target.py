"""`target.engine=static` against the HF-eager reference (targets/hf.py), in fp32 on the CPU: the same logits and taps
bit for bit (prefill, chain blocks, rollback, tree blocks and their compaction, a grown cache), and the same
generation token for token, with the same accept lengths and committed taps, for oracle chains and trees and for
every registered drafter; models it cannot run are refused in one line."""
import pytest
import torch
from test_tree import TreeOracle

from helpers import OracleDrafter
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.decoding.tree import layout
from specexp.errors import UserError
from specexp.targets.static import StaticTarget

PROMPTS = ["What is 2+3?", "Write a haiku about rivers."]


def test_logits_and_taps_are_bit_identical_through_a_decode(tiny_target, static):
    t, s, taps = tiny_target, static, tuple(range(tiny_target.num_layers))      # every layer, the normed last too
    g = torch.Generator().manual_seed(0)
    hf, st = t.new_cache(), s.new_cache(8)                     # too small on purpose: the buffers grow, twice
    start = 0
    for step, n in enumerate([13, 6, 1, 4, 9, 1]):
        ids = torch.randint(t.vocab_size, (1, n), generator=g)
        a, b = t.forward(ids, start, hf, taps=taps), s.forward(ids, start, st, taps=taps)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), step
        back = [0, 3, 0, 2, 5, 0][step]                        # a verification that rejected `back` drafts
        t.rollback(hf, back)
        s.rollback(st, back)
        start += n - back
        assert hf.get_seq_length() == st.length == start
    assert st.capacity >= start and st.capacity > 8


@pytest.mark.parametrize("prepack", ["false", "auto"])
def test_bf16_steps_are_hfs_to_rounding(cfg_factory, prepack):
    """bf16: a 1-row step reads a key-value head's G query heads as G rows of one attention (5x faster on a CPU than
    the GQA kernel, the same arithmetic in another order) and the packed q/k/v and gate/up products are joined: the
    logits and taps are HF eager's to bf16 rounding through a prefill, 1-row steps at growing lengths and blocks
    between them (a last-bit difference in a 1-row step reaches the cache, so later blocks are not bit for bit
    either), and the prefill, which no 1-row step precedes, is HF's bit for bit."""
    cfg = cfg_factory("target.dtype=bfloat16", f"target.prepack={prepack}")
    hf = registry.build_target(cfg.target, torch.device("cpu"))
    st = StaticTarget.of(hf)
    g = torch.Generator().manual_seed(4)
    a_cache, b_cache, start = hf.new_cache(), st.new_cache(8), 0
    with torch.inference_mode():
        for n in [11, 1, 1, 5, 1, 1, 1, 3, 1]:
            ids = torch.randint(hf.vocab_size, (1, n), generator=g)
            (a, ha), (b, hb) = (t.forward(ids, start, c, taps=(0, 1)) for t, c in ((hf, a_cache), (st, b_cache)))
            if start == 0:
                assert torch.equal(a, b) and torch.equal(ha, hb)
            torch.testing.assert_close(b, a, rtol=1.6e-2, atol=1e-2)
            torch.testing.assert_close(hb, ha, rtol=1.6e-2, atol=1e-2)
            start += n


def test_a_tree_block_and_its_compaction_are_bit_identical(tiny_target, static):
    t, s, taps = tiny_target, static, (1, 3)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(t.vocab_size, (1, 11), generator=g)
    hf, st = t.new_cache(), s.new_cache(64)
    t.forward(prompt, 0, hf)
    s.forward(prompt, 0, st)
    parents = torch.tensor([-1, -1, 0, 0, 1, 2, 5])
    tree = layout(parents, 4)
    block = torch.randint(t.vocab_size, (1, parents.numel() + 1), generator=g)     # anchor + the tree's nodes
    a, b = t.forward(block, 11, hf, taps=taps, tree=tree), s.forward(block, 11, st, taps=taps, tree=tree)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    rows = torch.tensor([0, 1, 3, 6])                          # anchor, node 0, node 2, node 5: a root-to-leaf path
    t.keep(hf, 11, rows)
    s.keep(st, 11, rows)
    nxt = torch.randint(t.vocab_size, (1, 3), generator=g)
    a, b = t.forward(nxt, 15, hf, taps=taps), s.forward(nxt, 15, st, taps=taps)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _same_generation(hf_target, static_target, make_drafter, ids, n, **dc):
    """Generate with each engine (a fresh drafter each) and require the same tokens, accept lengths and drafts."""
    a = generate(hf_target, make_drafter(hf_target), ids, DecodeConfig(max_new_tokens=n, **dc))
    b = generate(static_target, make_drafter(static_target), ids, DecodeConfig(max_new_tokens=n, **dc))
    assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths and a.drafted == b.drafted
    return a


@pytest.mark.parametrize("prompt", PROMPTS)
def test_oracle_chains_and_trees_generate_the_same(tiny_target, static, prompt):
    t, n = tiny_target, 40
    ids = t.encode_chat([{"role": "user", "content": prompt}])
    ref = _same_generation(t, static, lambda _: None, ids, n)
    chain = _same_generation(t, static, lambda _: OracleDrafter(ref.tokens, len(ids), 7, 0.2, t.vocab_size), ids, n)
    assert chain.tokens == ref.tokens and max(chain.accept_lengths) >= 3
    trees = []
    for target in (t, static):                                 # committed taps compared too
        drafter = TreeOracle(ref.tokens, len(ids), "random", nodes=9, depth=5, vocab=t.vocab_size, taps=(1, 2))
        trees.append((generate(target, drafter, ids, DecodeConfig(max_new_tokens=n)), drafter.commits))
    (a, ca), (b, cb) = trees
    assert a.tokens == b.tokens == ref.tokens and a.accept_lengths == b.accept_lengths
    assert max(a.accept_lengths) >= 3 and len(ca) == len(cb)
    assert all(x[0] == y[0] and x[2] == y[2] and torch.equal(x[1], y[1]) for x, y in zip(ca, cb))


DRAFTERS = [("dflash", ()), ("dels_rnn", ()), ("dels_markov", ()), ("domino_ft", ()), ("dedit", ()),
            ("eagle3", ()), ("eagle3", ("drafter.mode=tree",))]


@pytest.mark.slow
@pytest.mark.parametrize("name, extra", DRAFTERS, ids=[d[0] + "_tree" * bool(d[1]) for d in DRAFTERS])
def test_every_drafter_generates_the_same_on_both_engines(name, extra, tiny_target, static, cfg_factory):
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random", *extra)      # heads follow: random too
    drafter = registry.build_drafter(cfg.drafter, tiny_target)   # reads the target's embedding and head, shared by
    ids = tiny_target.encode_chat([{"role": "user", "content": PROMPTS[0]}])    # both engines; reset per generation
    _same_generation(tiny_target, static, lambda _: drafter, ids, 16)


def test_the_config_key_selects_the_engine_and_sliding_windows_are_refused(cfg_factory):
    cfg = cfg_factory("drafter=none", "target.engine=static")
    target = registry.build_target(cfg.target, torch.device("cpu"))
    assert isinstance(target, StaticTarget)
    ids = target.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    hf = registry.build_target(cfg_factory("drafter=none").target, torch.device("cpu"))
    assert not isinstance(hf, StaticTarget)
    _same_generation(hf, target, lambda _: None, ids, 12)
    hf.config.layer_types = ["full_attention", "sliding_attention"] * (hf.num_layers // 2)
    with pytest.raises(UserError, match=r"target.engine=static \(tiny_qwen3, qwen3\): layers of kind "
                                        r"\['sliding_attention'\] .* use target.engine=hf"):
        StaticTarget.of(hf)
