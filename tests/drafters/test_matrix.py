"""The generic contract, checked for every drafter in the registry (a new drafter joins by registering):
greedy output equals the target's own greedy output token for token; protocol B and block verification keep the
target's sequence distribution (χ² against exact enumeration on a 5-token Qwen3); where a drafter has a CUDA-graph
path, replaying its captured body (run eagerly on CPU) drafts exactly what the eager loop drafts.

Drafter-specific behaviour (fusion formulas, edit rules, alignments, kernels) is tested in each drafter's file."""
import pytest

from helpers import STRONG, EagerLoop, micro_target, sampled_fit
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate

NAMES = [n for n, e in registry.DRAFTERS.items() if e.build is not None]
PROMPTS = ["Hello there, how are you?", "What is 17 * 23?"]
N = 24


def build(cfg_factory, target, name, *extra):
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random", *STRONG.get(name, []), *extra)
    return registry.build_drafter(cfg.drafter, target)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_equals_autoregressive(cfg_factory, tiny_target, name):
    t = tiny_target
    drafter = build(cfg_factory, t, name)
    for j, prompt in enumerate(PROMPTS):
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=N))
        for n in (1, 18, N) if j == 0 else (N,):    # budget edges: no drafts, a partial block, several blocks
            out = generate(t, drafter, ids, DecodeConfig(max_new_tokens=n))
            assert out.tokens == ref.tokens[:n], (name, prompt, n)
            assert sum(out.accept_lengths) == len(out.tokens) - 1


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["B", "block"])
@pytest.mark.parametrize("name", NAMES)
def test_sampled_drafts_keep_the_target_distribution(cfg_factory, name, protocol):
    """Protocol B and block verification (both verify drafts sampled from the drafter's q, every row of which block
    verification reads)."""
    t = micro_target()
    drafter = build(cfg_factory, t, name)
    n_runs = 1500
    dc = DecodeConfig(protocol=protocol, temperature=1.0, max_new_tokens=4)
    pvalue, accepted = sampled_fit(t, drafter, dc, 1234, n_runs)
    assert accepted > n_runs // 20, accepted        # drafts are accepted: the test exercises acceptance
    assert pvalue > 1e-3, (name, protocol, pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_graph_replay_equals_eager(cfg_factory, tiny_target, monkeypatch, name):
    """The CUDA-graph path (static buffers, one capture per temperature) with the capture replaced by a plain
    call of the same body; a drafter without a graph path is skipped."""
    from specexp.kernels import graphs

    monkeypatch.setattr(graphs, "GraphedLoop", EagerLoop)
    t = tiny_target
    eager, graphed = build(cfg_factory, t, name), build(cfg_factory, t, name)
    if not hasattr(graphed, "graphs"):
        pytest.skip(f"{name} has no CUDA-graph path")
    graphed.graphs = {}
    for prompt in PROMPTS:
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        a = generate(t, eager, ids, DecodeConfig(max_new_tokens=N))
        b = generate(t, graphed, ids, DecodeConfig(max_new_tokens=N))
        assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths
    assert list(graphed.graphs) == [0.0]           # captured once, replayed for every block
