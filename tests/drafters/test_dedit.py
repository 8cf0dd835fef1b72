"""DEdit: greedy == AR for any passes / window / rule / editor; with E = 0 the drafts are the DFlash backbone's;
the causal editor really hides later positions; protocol B keeps the target distribution with edited drafts;
the edit metrics classify rounds exactly; bad options are one-line errors."""
import pytest
import torch

from helpers import _Stateless, protocol_b_toy_fit
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters import dedit
from specexp.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashDraftModel
from specexp.drafters.layers import init_weights
from specexp.errors import UserError


def _backbone(t, block=8, std=0.3):
    """A random DFlash backbone loud enough that edit passes change drafts."""
    model = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, block, None)), 0, std)
    return DFlashDrafter(model.eval().requires_grad_(False), t)


PROMPTS = ["Hello there, how are you?", "What is 17 * 23?"]


@pytest.mark.parametrize("opts", [
    dict(passes=1), dict(passes=3, window=7, verify=4), dict(passes=2, rule="threshold", threshold=1.5e-4),
    dict(passes=4, rule="low_confidence", confidence=2.5e-4, editor="causal"), dict(passes=2, early_stop=False),
])
@pytest.mark.slow
def test_greedy_equals_autoregressive(tiny_target, opts):
    t = tiny_target
    drafter = dedit.DEditDrafter(_backbone(t), **opts)
    edited = 0
    for prompt in PROMPTS:
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=24))
        for n in (5, 24) if prompt == PROMPTS[0] else (24,):
            out = generate(t, drafter, ids, DecodeConfig(max_new_tokens=n))
            assert out.tokens == ref.tokens[:n], (opts, prompt, n)
            edited += sum(not torch.equal(r["pre_edit"], r["tokens"]) for r in out.rounds)
            assert all(r["passes"] <= opts["passes"] for r in out.rounds)
    assert edited > 0, opts                                   # the passes did change drafts


def test_zero_passes_reproduce_the_dflash_backbone(tiny_target):
    t = tiny_target
    bb = _backbone(t)
    plain = dedit.DEditDrafter(bb, passes=0)
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    _, taps = t.forward(torch.tensor([ids]), 0, t.new_cache(), taps=bb.tap_layers)
    bb.reset()
    bb.prefill(taps)
    for anchor in (5, 100, 2000):
        for k in (1, 4, 7):
            assert torch.equal(plain.propose(anchor, len(ids), k, None).tokens,
                               bb.propose(anchor, len(ids), k, None).tokens)
    # and through the config: drafter=dedit with edit.passes=0 drafts what drafter=dflash drafts
    ref = generate(t, None, ids, DecodeConfig(max_new_tokens=16))
    out = generate(t, plain, ids, DecodeConfig(max_new_tokens=16))
    assert out.tokens == ref.tokens and all(torch.equal(r["pre_edit"], r["tokens"]) for r in out.rounds)


def test_causal_editor_hides_later_positions(tiny_target):
    """Perturb draft j: under the causal editor rows before j keep their logits exactly; bidirectional ones move."""
    t = tiny_target
    bb = _backbone(t)
    ids = t.encode_chat([{"role": "user", "content": PROMPTS[1]}])
    _, taps = t.forward(torch.tensor([ids]), 0, t.new_cache(), taps=bb.tap_layers)
    bb.prefill(taps)
    base = torch.randint(0, 5000, (7,), generator=torch.Generator().manual_seed(0))
    for j in (2, 5):
        moved = base.clone()
        moved[j] = (moved[j] + 17) % 5000
        for editor in ("causal", "bidirectional"):
            d = dedit.DEditDrafter(bb, passes=1, editor=editor)
            with torch.inference_mode():
                a, b = d.logits(9, len(ids), base), d.logits(9, len(ids), moved)              # [W, V]
            before = (a[:j] - b[:j]).abs().max()
            if editor == "causal":
                assert before == 0, (j, before)
            else:
                assert before > 1e-4, (j, before)
            assert (a[j:] - b[j:]).abs().max() > 1e-4                   # row j reads its own input
    # the unmasking pass is bidirectional under either editor
    with torch.inference_mode():
        assert torch.equal(dedit.DEditDrafter(bb, 1, editor="causal").logits(9, len(ids), None),
                           dedit.DEditDrafter(bb, 1).logits(9, len(ids), None))


def test_training_causal_mask_blocks_gradient_from_later_rows():
    """The training mask of the causal editor: the output of block row i has zero gradient w.r.t. the
    inputs of later rows of its block, and a non-zero one under the bidirectional mask."""
    from specexp.training.anchors import dense_mask

    cfg = DFlashConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                       intermediate_size=32, num_hidden_layers=1, vocab_size=50, target_layer_ids=[0],
                       num_target_layers=2, block_size=4, mask_token_id=0)
    model = init_weights(DFlashDraftModel(cfg), 0, 0.3)
    anchors, s = torch.tensor([2, 6]), 10
    with torch.no_grad():
        ctx = model.context_kv(torch.randn(1, s, 16), torch.arange(s)[None])
    pos = (anchors[:, None] + torch.arange(4)).flatten()[None]
    for causal in (True, False):
        x = torch.randn(1, 8, 16, requires_grad=True)
        out = model(x, pos, ctx, dense_mask(anchors, s, 4, causal=causal))[0]               # [8, H]
        out[1].sum().backward()                                                             # block 0, row 1
        later = x.grad[0, 2:4].abs().max()
        assert (later == 0) if causal else (later > 0), (causal, later)
        assert x.grad[0, 4:].abs().max() == 0                                               # the other block
        assert x.grad[0, :2].abs().max() > 0


class _Toy(dedit.DEditDrafter):
    """DEdit with hand-made pass logits over a tiny vocabulary: pass 0 rows = table[anchor]; an edit pass's row i
    adds mix[i, j, d_j] for every draft j (right context included), so edits depend on the whole draft."""

    def __init__(self, table, mix, **kw):
        bb = _Stateless()
        bb.block_size, bb.tap_layers = mix.shape[0] + 1, ()
        super().__init__(bb, **kw)
        self.table, self.mix = table, mix                                                   # [V, W, V], [W, W, V, V]

    def logits(self, anchor, start, tokens):
        rows = self.table[anchor].clone()                                                   # [W, V]
        if tokens is not None:
            w = rows.shape[0]
            rows += torch.stack([sum(self.mix[i, j, tokens[j]] for j in range(w)) for i in range(w)])
        return rows


def _dist_test(n_runs, **kw):
    V, steps, T = 3, 4, 0.8
    g = torch.Generator().manual_seed(0)
    target_table = torch.randn(V, V, generator=g) * 1.5
    table = target_table[:, None, :] + torch.randn(V, 3, V, generator=g) * 0.5                # [V, W, V]
    mix = torch.randn(3, 3, V, V, generator=g) * 0.6
    drafter = _Toy(table, mix, passes=2, early_stop=False, **kw)
    return protocol_b_toy_fit(target_table, drafter, T, steps, n_runs, drafts=3)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["argmax", "threshold"])
def test_protocol_b_keeps_the_target_distribution(rule):
    pvalue, deep = _dist_test(5000, rule=rule, threshold=0.6)
    assert deep > 5000 // 20 and pvalue > 1e-3, (rule, pvalue, deep)


def test_edit_rules():
    bb = _Stateless()
    bb.block_size, bb.tap_layers = 5, ()
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.45, 0.35], [0.1, 0.1, 0.8], [0.5, 0.4, 0.1]])   # argmax 0 1 2 0
    draft, conf0 = torch.tensor([1, 1, 0, 2]), torch.tensor([0.95, 0.2, 0.5, 0.99])
    rule = lambda **kw: dedit.DEditDrafter(bb, 1, **kw).edits(probs, draft, conf0).tolist()  # noqa: E731
    assert rule() == [True, False, True, True]                                   # argmax differs
    assert rule(rule="threshold", threshold=0.55) == [True, False, True, False]  # ... with p >= 0.55
    assert rule(rule="low_confidence", confidence=0.9) == [False, False, True, False]   # ... where conf0 < 0.9


def test_edit_outcomes_are_exact():
    # target greedy tokens after the round: accepted drafts + bonus
    assert dedit.edit_outcome([1, 2, 3], [1, 2, 3], 1, 9) == "unedited"
    assert dedit.edit_outcome([1, 2, 3], [1, 5, 3], 1, 2) == "harmful"       # pre-edit matched t1, t2 = 1, 2
    assert dedit.edit_outcome([1, 7, 3], [1, 2, 3], 3, 4) == "helpful"       # pre-edit stops at 1, final at 3
    assert dedit.edit_outcome([1, 7, 3], [1, 6, 3], 1, 2) == "neutral"       # both accept 1
    assert dedit.edit_outcome([1, 2, 3], [1, 2, 4], 3, 8) == "helpful"       # all accepted: pre-edit stops at 2
    assert dedit.edit_outcome([1, 2, 3], [1, 5, 4], 1, 2) == "harmful"       # pre-edit reaches past t_{n+1}
    recs = [{"passes": [1, 2, 2], "edit_outcomes": ["unedited", "harmful", "helpful"], "accept_lengths": [1, 2, 4]},
            {"passes": [2], "edit_outcomes": ["helpful"], "accept_lengths": [3]}]
    s = dedit.edit_summary(recs)
    assert s["rounds"] == 4 and s["edited"] == 3 and s["harmful"] == 1 and s["helpful"] == 2
    assert s["harmful_rate"] == pytest.approx(1 / 3) and s["tau_by_passes"] == {"1": 1, "2": 3}
    assert dedit.edit_summary([{"accept_lengths": [1]}]) is None


def test_bad_options_are_one_line_errors(cfg_factory, tiny_target):
    cases = {"drafter.edit.verify=9": "verify=9", "drafter.edit.rule=sometimes": "drafter.edit.rule",
             "drafter.edit.editor=left": "drafter.edit.editor", "drafter.edit.passes=-1": "passes=-1",
             "drafter.edit.threshold=2": "threshold=2", "drafter.edit.window=0": "window=0"}
    for override, msg in cases.items():
        with pytest.raises(UserError, match=msg) as e:
            registry.build_drafter(cfg_factory("drafter=dedit", "drafter.block_size=8", override).drafter, tiny_target)
        assert "\n" not in str(e.value)
    d = registry.build_drafter(cfg_factory("drafter=dedit", "drafter.block_size=8", "drafter.edit.window=7",
                                           "drafter.edit.verify=3").drafter, tiny_target)
    assert (d.max_drafts, d.window, d.passes, d.name) == (3, 7, 2, "dedit")
