"""DFlash draft trees (`drafter.mode=tree`, drafters/block_tree.py): the tree holds exactly the most probable paths
of the block's independent positions (checked against brute-force enumeration), is well formed, is lossless through
the engine under greedy decoding and protocol A (χ²), and the config refuses what it cannot run."""
import itertools

import pytest
import torch

from helpers import STRONG, micro_target, sampled_fit
from specexp import registry
from specexp.config import validate
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.block_tree import best_first
from specexp.errors import UserError


@pytest.mark.parametrize("k, top_k, nodes", [(3, 2, 5), (4, 3, 20), (2, 4, 8), (3, 3, 39), (5, 1, 3)])
def test_the_tree_is_the_most_probable_paths(k, top_k, nodes):
    g = torch.Generator().manual_seed(k * 100 + top_k)
    logits = torch.randn(k, 12, generator=g) * 2                                     # [K, V]
    prop = best_first(logits, top_k, nodes)
    tokens, parents = prop.tokens.tolist(), prop.parents.tolist()
    assert all(p < i for i, p in enumerate(parents))                                 # a parent before its children
    paths = []
    for i in range(len(tokens)):                                                     # each node's path from the anchor
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        paths.append(tuple(reversed(path)))
    assert len(set(paths)) == len(paths) and max(map(len, paths)) <= k
    logp = torch.log_softmax(logits.double(), -1)
    top = logp.topk(top_k, -1).indices.tolist()
    score = lambda p: sum(float(logp[i, t]) for i, t in enumerate(p))                # noqa: E731
    every = [p for d in range(1, k + 1) for p in itertools.product(*top[:d])]       # all paths over the top_k
    want = sorted(every, key=score, reverse=True)[:nodes]
    assert len(paths) == min(nodes, len(every))
    assert sorted(map(score, paths)) == pytest.approx(sorted(map(score, want)))      # the same best scores
    assert paths[0] == (top[0][0],)                                                  # found best-first


HEADS = {"dflash": [], "dels_rnn": ["drafter=dels_rnn", *STRONG["dels_rnn"]],
         "dels_markov": ["drafter=dels_markov", *STRONG["dels_markov"]],
         "domino_ft": ["drafter=domino_ft", *STRONG["domino_ft"]]}


def tree_drafter(cfg_factory, target, *extra):
    name = [] if any(e.startswith("drafter=") for e in extra) else ["drafter=dflash"]
    cfg = cfg_factory(*name, *extra, "drafter.init=random", "drafter.mode=tree")
    d = registry.build_drafter(cfg.drafter, target)
    assert d.name == cfg.drafter.name and d.proposes_trees
    return d


def test_a_dflash_tree_is_lossless_under_greedy_decoding(cfg_factory, tiny_target):
    t = tiny_target
    for extra in (["drafter.tree.top_k=3", "drafter.tree.total_tokens=13"], ["drafter.tree.total_tokens=60"]):
        d = tree_drafter(cfg_factory, t, *extra)
        assert d.proposes_trees and d.tree_nodes == (12 if "13" in extra[-1] else 59)
        for prompt, n in (("Count from one to ten.", 40), ("Hello", 1), ("Hi", 17)):     # budget edges too
            ids = t.encode_chat([{"role": "user", "content": prompt}])
            out, ref = generate(t, d, ids, DecodeConfig(max_new_tokens=n)), generate(t, None, ids,
                                                                                    DecodeConfig(max_new_tokens=n))
            assert out.tokens == ref.tokens, (extra, prompt, n)
            assert sum(out.accept_lengths) == len(out.tokens) - 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dflash", "dels_rnn"])
def test_a_tree_keeps_the_target_distribution_under_protocol_a(cfg_factory, name):
    t = micro_target()
    d = tree_drafter(cfg_factory, t, "drafter.tree.top_k=3", "drafter.tree.total_tokens=10", *HEADS[name])
    n_runs = 1500
    pvalue, accepted = sampled_fit(t, d, DecodeConfig(protocol="A", temperature=1.0, max_new_tokens=4), 7, n_runs)
    assert accepted > n_runs // 20, accepted
    assert pvalue > 1e-3


@pytest.mark.parametrize("name", ["dels_rnn", "dels_markov", "domino_ft"])
def test_a_head_tree_is_the_most_probable_paths_of_its_branches(cfg_factory, name):
    """The level-batched search (block_tree.grow) against brute force: every path over each branch's own top_k,
    scored one vector at a time along its branch (begin / advance / feature / fused_row); the tree holds the best."""
    t = micro_target(vocab=64, hidden=32, layers=2)
    k, top_k, nodes = 4, 3, 17
    d = tree_drafter(cfg_factory, t, f"drafter.tree.top_k={top_k}", f"drafter.tree.total_tokens={nodes + 1}",
                     "drafter.block_size=5", *HEADS[name])
    prompt = torch.randint(0, 63, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    seen, block_inputs, propose = [], d.block_inputs, d.propose                     # the engine's first round
    d.block_inputs = lambda *a: seen.append(block_inputs(*a)) or seen[-1]
    d.propose = lambda *a: seen.append(propose(*a)) or seen[-1]
    generate(t, d, prompt, DecodeConfig(max_new_tokens=8))
    x, prop = seen[0], seen[1]
    assert x["long"].shape[0] == k

    def kids(i, z):                                                                  # [(log-prob, token)] top_k
        lp = torch.log_softmax(d.fused_row(x["long"][i], z, i).double(), -1)
        v, ids = lp.topk(top_k)
        return list(zip(v.tolist(), ids.tolist()))

    every = {}                                                                       # path → score

    def walk(path, score, state):
        every[path] = score
        if len(path) == k:
            return
        i = len(path)
        tok = torch.tensor(path[-1])
        state = d.begin(x, tok) if i == 1 else d.advance(state, tok)
        for lp, c in kids(i, d.feature(x, state, i)):
            walk(path + (c,), score + lp, state)

    with torch.inference_mode():                                                     # as the engine runs the head
        for lp, c in kids(0, d.zero_z):
            walk((c,), lp, None)
    tokens, parents = prop.tokens.tolist(), prop.parents.tolist()
    assert all(p < i for i, p in enumerate(parents)) and len(tokens) == nodes
    paths = []
    for i in range(len(tokens)):
        j, path = i, []
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        paths.append(tuple(reversed(path)))
    assert all(p in every for p in paths) and len(set(paths)) == nodes               # paths of the branches' top_k
    want = sorted(every.values(), reverse=True)[:nodes]
    assert sorted((every[p] for p in paths), reverse=True) == pytest.approx(want, abs=1e-4)
    assert max(map(len, paths)) > 1


@pytest.mark.parametrize("extra, message", [
    (["drafter=dedit", "drafter.mode=tree"], "drafter.mode=tree with drafter=dedit: its draft is not a tree of "
                                             "tokens (DEdit edits a whole block)"),
    (["drafter=dflash", "drafter.mode=tree", "eval.batch_size=2"],
     "eval.batch_size=2 with drafter.mode=tree (dflash): draft trees run at eval.batch_size=1 only"),
    (["drafter=dflash", "drafter.tree.top_k=0"], "drafter.tree.top_k=0 is not valid; expected an int >= 1"),
    (["task=replay", "drafter=dels_rnn", "drafter.mode=tree", "replay.fusion_grid.alpha=[0,0.3]"],
     "replay.fusion_grid with drafter.mode=tree (dels_rnn): the α/β grid replays chains"),
    (["drafter=dflash", "drafter.tree.total_tokens=1"],
     "drafter.tree.total_tokens=1 is not valid; expected an int >= 2"),
])
def test_tree_settings_are_checked(cfg_factory, extra, message):
    with pytest.raises(UserError, match=None) as e:
        validate(cfg_factory(*extra), job={})
    assert message in str(e.value)


@pytest.mark.parametrize("name", list(HEADS))
def test_a_tree_drafts_the_chain_path_and_replays_as_the_engine_runs(cfg_factory, name):
    """On a target that follows the drafter's own chain (so acceptance goes deep): a tree of every top-2 path holds
    the chain's path (for a head, each node's children come from its own branch's state, so its greedy path is the
    chain), the engine accepts exactly what the chain does, and replay, batched or round by round, gives the
    engine's accept lengths."""
    from helpers import ScriptedTarget, follow_script
    from specexp.eval.replay import replay_turn, teacher_forced


    t = micro_target(vocab=2048, hidden=32, layers=2)
    base = [*HEADS[name], "drafter.init=random", "drafter.block_size=8"]
    chain = registry.build_drafter(cfg_factory(*base).drafter, t)
    every_path = ["drafter.mode=tree", "drafter.tree.top_k=2", "drafter.tree.total_tokens=255"]    # 2 + ... + 2^7
    tree = registry.build_drafter(cfg_factory(*base, *every_path).drafter, t)
    assert tree.proposes_trees and not chain.proposes_trees
    prompt = torch.randint(0, 2047, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    script = follow_script(t, chain, prompt, 40, seed=2)
    target, cont = ScriptedTarget(t, script), script[len(prompt):]
    dc = DecodeConfig(max_new_tokens=40)
    online = generate(target, tree, prompt, dc)
    assert online.tokens == cont
    assert online.accept_lengths == generate(target, chain, prompt, dc).accept_lengths   # the chain's path is in it
    assert max(online.accept_lengths) >= 5 and max(online.drafted) == 254, online.accept_lengths
    tf = teacher_forced(target, prompt, cont, tree.tap_layers)
    for batched in (True, False):
        gen, ties = replay_turn(tree, prompt, cont, tf, dc, near_tie=0.5, batched=batched)
        assert ties == [] and gen.accept_lengths == online.accept_lengths and gen.drafted == online.drafted
