"""Draft trees through the one engine: greedy output equals the target's own token for token for trees of several
shapes (stop tokens inside the tree, budget edges); protocol A on trees keeps the target's sequence distribution
(χ² on a 5-token Qwen3, with a broken walk as the negative control); the compacted KV cache and the committed taps
equal a full recompute of the committed sequence; bad trees and trees under protocol B are refused in one line."""
import pytest
import torch

from helpers import micro_target, sampled_fit
from specexp.decoding import engine as E
from specexp.decoding.engine import DecodeConfig, generate
from specexp.decoding.tree import TreeVerdict, layout, verify_tree
from specexp.drafters.base import Proposal
from specexp.errors import UserError

PROMPTS = ["What is 2+3?", "Write a haiku about rivers."]
SHAPES = ("chain", "star", "binary", "random")


def shape(kind: str, n: int, k: int, g: torch.Generator) -> list[int]:
    """Parents of an n-node tree no deeper than k."""
    par, depth = [], []
    for i in range(n):
        if kind == "chain":
            p = i - 1
        elif kind == "star":
            p = -1
        elif kind == "binary":
            p = (i - 1) // 2 if i else -1
        else:
            allowed = [-1] + [j for j in range(i) if depth[j] < k]
            p = allowed[int(torch.randint(len(allowed), (), generator=g))]
        d = 1 if p < 0 else depth[p] + 1
        if d > k:                                   # chain / binary shapes cut at the allowed depth
            p, d = -1, 1
        par.append(p)
        depth.append(d)
    return par


class TreeOracle:
    """Proposes random trees (tokens random) with the target's greedy continuation `ref` planted along one random
    root-to-node path, up to a random depth; records what `commit` receives."""

    name = "tree_oracle"
    proposes_trees = True

    def __init__(self, ref, prompt_len, kind, nodes, depth, vocab, taps=(), seed=0, truth=True):
        self.ref, self.p, self.kind, self.nodes, self.max_drafts = ref, prompt_len, kind, nodes, depth
        self.vocab, self.tap_layers, self.truth = vocab, tuple(taps), truth
        self.g = torch.Generator().manual_seed(seed)
        self.commits, self.last = [], None

    def reset(self):
        self.commits = []

    def prefill(self, taps):
        pass

    def propose(self, anchor, start, k, sampling):
        par = shape(self.kind, self.nodes, k, self.g)
        toks = torch.randint(self.vocab, (len(par),), generator=self.g).tolist()
        if self.truth and self.ref is not None:
            i = start - self.p                           # ref[i] is the anchor
            node = int(torch.randint(len(par), (), generator=self.g))
            path = []
            while node >= 0:
                path.append(node)
                node = par[node]
            keep = int(torch.randint(len(path) + 1, (), generator=self.g))
            for d, node in enumerate(reversed(path[len(path) - keep:] if keep else [])):
                toks[node] = self.ref[i + 1 + d] if i + 1 + d < len(self.ref) else 0
        self.last = (torch.tensor(toks), torch.tensor(par))
        return Proposal(self.last[0], parents=self.last[1])

    def commit(self, n, taps, path=None):
        if path is None:                                 # no tree: the engine had no room for drafts (k = 0)
            assert n == 0
            return
        toks, par = self.last
        assert path.numel() == n
        for j, node in enumerate(path.tolist()):         # a root-to-leaf path of the proposed tree
            assert par[node] == (-1 if j == 0 else path[j - 1])
        self.commits.append((n, taps, toks[path].tolist()))


def ar(target, ids, n, stops=()):
    return generate(target, None, ids, DecodeConfig(max_new_tokens=n, stop_token_ids=tuple(stops)))


def test_layout_depths_and_visibility():
    lay = layout(torch.tensor([-1, -1, 0, 0, 2]), 3)                # anchor; a, b under it; c, d under a; e under c
    assert lay.depth.tolist() == [0, 1, 1, 2, 2, 3]
    v = lay.visible.int().tolist()
    assert v[5] == [1, 1, 0, 1, 0, 1]                               # e sees anchor, a, c, itself
    assert v[2] == [1, 0, 1, 0, 0, 0] and v[4] == [1, 1, 0, 0, 1, 0]
    with pytest.raises(ValueError, match=r"parents\[1\] = 1 is not valid"):
        layout(torch.tensor([-1, 1]), 3)
    with pytest.raises(ValueError, match="depth 3 was proposed where at most 2"):
        layout(torch.tensor([-1, 0, 1]), 2)


def test_walk_on_hand_made_logits():
    logits = torch.full((5, 6), -5.0)
    drafts, parents = torch.tensor([3, 4, 1, 2]), torch.tensor([-1, -1, 1, 1])   # rows: anchor, 3, 4, 1, 2
    logits[0, 4] = logits[2, 2] = logits[4, 5] = 5.0               # anchor -> 4 -> 2 -> bonus 5
    v = verify_tree("greedy", logits, drafts, parents, 0.0, None)
    assert v.path.tolist() == [1, 3] and v.tokens == [4, 2, 5] and v.anchor.tolist() == [5]
    logits[0] = -5.0
    logits[0, 0] = 5.0                                             # no child carries 0: nothing accepted
    v = verify_tree("greedy", logits, drafts, parents.tolist(), 0.0, None)      # the layout's host parents
    assert v.path.tolist() == [] and v.tokens == [0] and v.anchor.tolist() == [0]


@pytest.mark.parametrize("kind", SHAPES)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_tree_greedy_equals_autoregressive(tiny_target, kind, prompt):
    t, n = tiny_target, 40
    ids = t.encode_chat([{"role": "user", "content": prompt}])
    ref = ar(t, ids, n)
    drafter = TreeOracle(ref.tokens, len(ids), kind, nodes=9, depth=5, vocab=t.vocab_size, seed=len(kind))
    spec = generate(t, drafter, ids, DecodeConfig(max_new_tokens=n))
    assert spec.tokens == ref.tokens
    assert sum(spec.accept_lengths) == n - 1
    assert spec.drafted and all(d == 9 for d in spec.drafted[:-3])
    if kind != "star":
        assert max(spec.accept_lengths) >= 3                        # deep paths are accepted, not only roots


def test_tree_without_the_truth_is_still_lossless(tiny_target):
    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    ref = ar(t, ids, 24)
    drafter = TreeOracle(None, len(ids), "random", nodes=12, depth=4, vocab=t.vocab_size, truth=False)
    assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=24)).tokens == ref.tokens


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 11])
def test_budget_edges(tiny_target, n):
    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[1]}])
    ref = ar(t, ids, n)
    drafter = TreeOracle(ref.tokens + [0] * 8, len(ids), "random", nodes=6, depth=5, vocab=t.vocab_size, seed=n)
    spec = generate(t, drafter, ids, DecodeConfig(max_new_tokens=n))
    assert spec.tokens == ref.tokens and len(spec.tokens) == n


@pytest.mark.parametrize("stop_at", [1, 4, 9])
def test_stop_token_inside_the_tree(tiny_target, stop_at):
    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[1]}])
    free = ar(t, ids, 40)
    stop = free.tokens[stop_at]
    ref = ar(t, ids, 40, stops=[stop])
    assert ref.stop_reason == "stop"
    for kind in ("chain", "random"):
        drafter = TreeOracle(free.tokens + [0] * 8, len(ids), kind, nodes=8, depth=6, vocab=t.vocab_size)
        spec = generate(t, drafter, ids, DecodeConfig(max_new_tokens=40, stop_token_ids=(stop,)))
        assert spec.tokens == ref.tokens and spec.stop_reason == "stop"


def test_committed_taps_and_compacted_cache_equal_a_full_recompute(tiny_target):
    t, n, taps = tiny_target, 30, (0, 2)
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    ref = ar(t, ids, n)
    drafter = TreeOracle(ref.tokens, len(ids), "random", nodes=10, depth=5, vocab=t.vocab_size, taps=taps)
    spec = generate(t, drafter, ids, DecodeConfig(max_new_tokens=n))
    assert spec.tokens == ref.tokens
    _, full = t.forward(torch.tensor([ids + spec.tokens]), 0, t.new_cache(), taps=taps)      # [1, P+n, 2H]
    pos = len(ids)                                                 # the first anchor's position
    for k, tap, toks in drafter.commits:
        assert tap.shape[1] == k + 1
        torch.testing.assert_close(tap[0], full[0, pos: pos + k + 1], atol=2e-5, rtol=1e-4)
        pos += k + 1

    # one tree round on a cache, compacted, against the cache of the committed sequence computed in one pass
    cache = t.new_cache()
    logits, _ = t.forward(torch.tensor([ids]), 0, cache)
    anchor = int(logits[0, -1].argmax())
    toks, par = torch.tensor([ref.tokens[1], 7, ref.tokens[2], 9, 11]), torch.tensor([-1, -1, 0, 0, 2])
    lay = layout(par, 5)
    logits, _ = t.forward(torch.cat([torch.tensor([anchor]), toks])[None], len(ids), cache, tree=lay)
    path = verify_tree("greedy", logits[0], toks, par, 0.0, None).path
    assert path.tolist()[:2] == [0, 2]                             # the planted truth is accepted
    t.keep(cache, len(ids), torch.cat([torch.zeros(1, dtype=torch.long), path + 1]))
    fresh = t.new_cache()
    t.forward(torch.tensor([ids + [anchor] + toks[path].tolist()]), 0, fresh)
    assert cache.get_seq_length() == fresh.get_seq_length() == len(ids) + 1 + path.numel()
    for a, b in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=2e-5, rtol=1e-4)


def test_trees_under_protocol_b_are_refused_before_any_work(tiny_target):
    t = tiny_target
    drafter = TreeOracle(None, 0, "star", nodes=3, depth=1, vocab=t.vocab_size, truth=False)
    with pytest.raises(UserError, match="decoding.protocol='B' cannot verify draft trees"):
        generate(t, drafter, [1, 2, 3], DecodeConfig(protocol="B", temperature=1.0, max_new_tokens=4),
                 torch.Generator().manual_seed(0))


def test_flash_attention_is_refused_for_trees(tiny_target, monkeypatch):
    monkeypatch.setattr(tiny_target.config, "_attn_implementation", "flash_attention_2")
    with pytest.raises(ValueError, match="draft trees need a target attention"):
        tiny_target.tree_mask(layout(torch.tensor([-1]), 1), 3)


def sample_protocol_a(monkeypatch=None, n_runs=1500):
    t = micro_target()
    steps, temp = 3, 1.0
    drafter = TreeOracle(None, 2, "random", nodes=6, depth=3, vocab=t.vocab_size, truth=False, seed=3)
    dc = DecodeConfig(protocol="A", temperature=temp, max_new_tokens=steps + 1)
    return (*sampled_fit(t, drafter, dc, 1234, n_runs), n_runs)


@pytest.mark.slow
def test_protocol_a_on_trees_keeps_the_target_distribution():
    pvalue, accepted, n_runs = sample_protocol_a()
    assert accepted > n_runs // 2, accepted          # most rounds accept a draft: the walk is exercised
    assert pvalue > 1e-3, pvalue


@pytest.mark.slow
def test_a_broken_tree_walk_is_detected(monkeypatch):
    """Negative control: committing the anchor's first child whatever the target samples skews the distribution."""

    def first_child(protocol, logits, drafts, parents, temperature, generator):
        p = torch.softmax(logits[1].float() / temperature, -1)
        bonus = torch.multinomial(p, 1, generator=generator)
        return TreeVerdict([int(drafts[0]), int(bonus)], bonus, torch.tensor([0]))

    monkeypatch.setattr(E, "verify_tree", first_child)
    pvalue, _, _ = sample_protocol_a()
    assert pvalue < 1e-6, pvalue
