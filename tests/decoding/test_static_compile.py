"""`target.compile=true`: the static engine's steps after the prefill as fixed-shape functions (targets/static.py),
against the eager static engine and the HF-eager reference, in fp32 on the CPU. The padded window changes nothing
a masked position could add (what lies there is ignored bit for bit), the fixed-shape step gives the eager step's
logits and taps to rounding (another attention kernel) and the same greedy generations token for token, chains with
rollbacks and trees with their compaction; compiled by inductor the same, and no shape compiles twice as the
context grows. The CUDA-graph path runs here with the capture replaced by a plain call (helpers.EagerLoop)."""
import pytest
import torch
from test_tree import TreeOracle

from helpers import EagerLoop, OracleDrafter
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.decoding.tree import layout
from specexp.targets.static import StaticTarget, step_rows, window

PROMPTS = ["What is 2+3?", "Write a haiku about rivers."]


@pytest.fixture(scope="module")
def fixed(tiny_target):
    """The fixed-shape step without inductor: the same code as compiled, at the cost of a plain forward."""
    return StaticTarget.of(tiny_target, compile=True, inductor=False)


def test_shapes_are_a_few_row_counts_and_power_of_two_windows():
    assert [step_rows(t) for t in (1, 2, 3, 4, 5, 8, 9, 16, 17, 61)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 64]
    assert [window(n) for n in (1, 100, 256, 257, 1000, 1024, 1025)] == [256, 256, 256, 512, 1024, 1024, 2048]


def _same(a, b, tol=1e-5):
    """Logits and taps equal to rounding, the greedy choices exactly."""
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=tol)
    assert torch.equal(a[0].argmax(-1), b[0].argmax(-1))
    if a[1] is not None or b[1] is not None:
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=tol)


def test_what_lies_in_masked_positions_changes_not_a_bit(tiny_target, fixed):
    """Past the cache length and in a block's invisible columns the window holds stale rows: their weight is exactly
    0, so filling them with large finite values (and writing past the end) leaves every logit and tap unchanged."""
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(tiny_target.vocab_size, (1, 21), generator=g)
    block = torch.randint(tiny_target.vocab_size, (1, 8), generator=g)
    tree = layout(torch.tensor([-1, -1, 0, 0, 1, 2, 5]), 4)
    outs = []
    for junk in (0.0, 1e4):
        cache = fixed.new_cache(64)
        fixed.forward(prompt, 0, cache)
        for kv in (cache.k, cache.v):
            kv[:, :, :, 21:] = junk
        outs.append([fixed.forward(block, 21, cache, taps=(0, 3), tree=tree)])
        fixed.rollback(cache, 8)
        outs[-1].append(fixed.forward(block[:, :3], 21, cache, taps=(0, 3)))      # padded to 4 rows
        del cache
    (a_tree, a_chain), (b_tree, b_chain) = outs
    for a, b in ((a_tree, b_tree), (a_chain, b_chain)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_the_fixed_shape_step_matches_the_eager_step_through_a_decode(tiny_target, static, fixed):
    """Chains of every length (padded to 1, 2, 4, 8, 16 rows) with rollbacks, a tree and its compaction: the fixed-shape
    step's logits and taps equal the eager static engine's to rounding, its argmaxes exactly."""
    g = torch.Generator().manual_seed(0)
    taps = tuple(range(tiny_target.num_layers))
    a_c, b_c = static.new_cache(64), fixed.new_cache(64)
    assert b_c.capacity == 256 and b_c.pooled and a_c.capacity == 64
    start = 0
    for n, back in ((13, 0), (6, 3), (1, 0), (4, 2), (9, 5), (3, 1), (16, 0), (1, 0)):
        ids = torch.randint(tiny_target.vocab_size, (1, n), generator=g)
        _same(static.forward(ids, start, a_c, taps=taps), fixed.forward(ids, start, b_c, taps=taps))
        static.rollback(a_c, back)
        fixed.rollback(b_c, back)
        start += n - back
        assert a_c.length == b_c.length == start
    tree = layout(torch.tensor([-1, -1, 0, 0, 1, 2, 5]), 4)
    block = torch.randint(tiny_target.vocab_size, (1, 8), generator=g)
    _same(static.forward(block, start, a_c, taps=taps, tree=tree),
          fixed.forward(block, start, b_c, taps=taps, tree=tree))
    rows = torch.tensor([0, 1, 3, 6])
    static.keep(a_c, start, rows)
    fixed.keep(b_c, start, rows)
    nxt = torch.randint(tiny_target.vocab_size, (1, 3), generator=g)
    _same(static.forward(nxt, start + 4, a_c, taps=taps), fixed.forward(nxt, start + 4, b_c, taps=taps))
    _same(static.forward(nxt[:, :1], start + 7, a_c, last_only=True),
          fixed.forward(nxt[:, :1], start + 7, b_c, last_only=True))


def _generations(targets, make_drafter, ids, n, **dc):
    """Generate with each target (a fresh drafter each); the same tokens, accept lengths and drafts everywhere."""
    gens = [generate(t, make_drafter(t), ids, DecodeConfig(max_new_tokens=n, **dc)) for t in targets]
    for g in gens[1:]:
        assert (g.tokens, g.accept_lengths, g.drafted) == (gens[0].tokens, gens[0].accept_lengths, gens[0].drafted)
    return gens[0]


def _dflash(cfg_factory, target, block=4):
    cfg = cfg_factory("drafter=dflash", "drafter.init=random", f"drafter.block_size={block}")
    return registry.build_drafter(cfg.drafter, target)


@pytest.mark.parametrize("prompt", [PROMPTS[0], pytest.param(PROMPTS[1], marks=pytest.mark.slow)])
def test_fixed_shape_generations_equal_the_reference(tiny_target, static, fixed, cfg_factory, prompt):
    """AR, DFlash (random init: rollbacks every round), an oracle chain (every accept length) and oracle trees
    (compaction): HF eager, the eager static engine and the fixed-shape step, token for token."""
    t, n = tiny_target, 24
    ids = t.encode_chat([{"role": "user", "content": prompt}])
    both = (t, static, fixed)
    ref = _generations(both, lambda _: None, ids, n)
    dflash = _dflash(cfg_factory, t)
    assert _generations(both, lambda _: dflash, ids, n).tokens == ref.tokens
    chain = _generations(both, lambda _: OracleDrafter(ref.tokens, len(ids), 5, 0.25, t.vocab_size), ids, n)
    assert chain.tokens == ref.tokens and max(chain.accept_lengths) >= 3 and min(chain.accept_lengths) < 6
    trees = [generate(x, TreeOracle(ref.tokens, len(ids), "random", nodes=9, depth=5, vocab=t.vocab_size,
                                    taps=(1, 2)), ids, DecodeConfig(max_new_tokens=n)) for x in both]
    assert all(g.tokens == ref.tokens and g.accept_lengths == trees[0].accept_lengths for g in trees)
    assert max(trees[0].accept_lengths) >= 3


def test_the_graph_path_reuses_its_buffers(tiny_target, static, cfg_factory, monkeypatch):
    """The CUDA-graph path with the capture replaced by a plain call of the same body: one graph per row count on
    the pooled buffers, the next generation's cache on the same buffers (zeroed), the same tokens as eager."""
    from specexp.kernels import graphs

    monkeypatch.setattr(graphs, "GraphedLoop", EagerLoop)
    graphed = StaticTarget.of(tiny_target, compile=True, inductor=False)
    graphed.graphs = True
    dflash = _dflash(cfg_factory, tiny_target)
    for prompt in PROMPTS:
        ids = tiny_target.encode_chat([{"role": "user", "content": prompt}])
        _generations((static, graphed), lambda _: None, ids, 12)
        _generations((static, graphed), lambda _: dflash, ids, 12)
    assert list(graphed._pool) == [256]
    rows = sorted({key[0] for key in graphed._graphs})
    assert rows[0] == 1 and rows[-1] == 4 and set(rows) <= {1, 2, 4}
    assert len({key[2] for key in graphed._graphs}) == 1                       # one set of buffers throughout
    live = graphed.new_cache(40)                                               # the pooled buffers, now held
    other = graphed.new_cache(40)
    assert live.pooled and not other.pooled and other.k.data_ptr() != live.k.data_ptr()


def test_a_greedy_round_still_syncs_once(tiny_target, cfg_factory, monkeypatch):
    """The fixed-shape step and its graph path read nothing back: AR and DFlash rounds keep their one sync."""
    from test_syncs import Syncs

    from specexp.kernels import graphs

    monkeypatch.setattr(graphs, "GraphedLoop", EagerLoop)
    graphed = StaticTarget.of(tiny_target, compile=True, inductor=False)
    graphed.graphs = True
    ids = tiny_target.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    syncs = Syncs(monkeypatch)
    for drafter in (None, _dflash(cfg_factory, tiny_target)):
        counts, gen = syncs.per_round(graphed, drafter, ids, max_new_tokens=10)
        assert len(counts) == len(gen.accept_lengths) >= 3 and counts == [1] * len(counts), (counts, syncs.where)


def test_the_config_key_builds_a_compiled_static_target(cfg_factory):
    cfg = cfg_factory("drafter=none", "target.engine=static", "target.compile=true")
    target = registry.build_target(cfg.target, torch.device("cpu"))
    assert isinstance(target, StaticTarget) and target.compiled and target.inductor and not target.graphs
    plain = registry.build_target(cfg_factory("drafter=none", "target.engine=static").target, torch.device("cpu"))
    assert not plain.compiled


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["layer", "step"])
def test_compiled_generations_equal_eager_and_hf_and_compile_once_per_shape(tiny_target, static, cfg_factory, unit):
    """Inductor, fp32, a compiled layer or a compiled step: AR and DFlash (block 4: rows 4, and 2 or 1 at the end
    of the budget) over two prompts of different lengths, token for token with HF and the eager static engine; the
    second prompt compiles nothing (same window, same row counts: the context's growth and the prompt's length
    are data, not shapes)."""
    from torch._dynamo.utils import counters

    compiled = StaticTarget.of(tiny_target, compile=True, unit=unit)
    dflash = _dflash(cfg_factory, tiny_target)
    ids = [tiny_target.encode_chat([{"role": "user", "content": p}]) for p in (PROMPTS[0], PROMPTS[1] * 3)]
    assert len(ids[0]) != len(ids[1])
    _generations((tiny_target, static, compiled), lambda _: None, ids[0], 10)
    _generations((tiny_target, static, compiled), lambda _: dflash, ids[0], 10)
    frames = counters["stats"]["unique_graphs"]
    _generations((tiny_target, static, compiled), lambda _: None, ids[1], 10)
    _generations((tiny_target, static, compiled), lambda _: dflash, ids[1], 10)
    assert counters["stats"]["unique_graphs"] == frames
