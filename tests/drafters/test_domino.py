"""Domino-FT: label/inference alignment (a head trained on one sequence reproduces it through the drafter,
under both alignments), greedy == AR, the correction loop equals the formula written through the nn.Module,
protocol B keeps the target distribution, the CUDA-graph path's buffers, and one-line errors."""
import pytest
import torch

from helpers import EagerLoop, _Stateless, micro_target, protocol_b_toy_fit
from specexp import registry
from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters import domino
from specexp.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashDraftModel
from specexp.drafters.layers import init_weights
from specexp.training.domino_module import DominoLitModule
from specexp.training.pipeline import lightning_fit


@pytest.mark.parametrize("alignment", ["unshifted", "shifted"])
def test_trained_head_reproduces_its_sequence_under_both_alignments(cfg_factory, tmp_path, alignment):
    # A 2,048-token vocabulary: the loss over the vocabulary is what a step costs (Qwen3's made this test slow).
    t = micro_target(vocab=2048, hidden=64, layers=4, std=0.1)
    g = torch.Generator().manual_seed(1)
    resp = torch.randperm(2000, generator=g)[:40] + 40                         # distinct: unique successors
    ids = torch.cat([torch.tensor([1, 2, 3, 4]), resp])
    lm = torch.tensor([0] * 4 + [1] * 40).bool()
    bb = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 6, None)), 0).requires_grad_(False)
    c = domino.DominoConfig(t.hidden_size, t.vocab_size, gru_hidden=64, emb_dim=32, alignment=alignment)
    torch.manual_seed(0)
    head = domino.DominoHead(c)
    module = DominoLitModule(head, bb, t, num_anchors=16, gamma=7.0, lambda_start=0.0, lambda_decay_ratio=0.5,
                             lr=1e-2, warmup_ratio=0.04, weight_decay=0.0, attention="dense", seed=0)
    cfg = cfg_factory("train=smoke", "train.max_steps=120", "train.epochs=1000", "train.ckpt_every=1000")
    lightning_fit(cfg.train, None, module, [{"ids": ids, "loss_mask": lm}], tmp_path, t.device)
    drafter = domino.DominoDrafter(DFlashDrafter(bb, t), head, t.embed_tokens.weight, 1.0, "torch", False)
    K = drafter.max_drafts
    assert K == (5 if alignment == "unshifted" else 6)
    _, taps = t.forward(ids[None], 0, t.new_cache(), taps=bb.config.target_layer_ids)
    hits = total = 0
    for a in range(4, len(ids) - K - 1):
        drafter.reset()
        drafter.prefill(taps[:, :a])
        hidden, _ = drafter.backbone.block_logits(int(ids[a]), a, 0)
        rows = hidden[0, c.first_row: c.first_row + K]
        u = t.lm_head(rows).clone()
        u[0, ids[a + 1]] = 1e4                                                  # force draft 1 to the truth
        out = torch.empty(K, dtype=torch.long), torch.empty(K), torch.empty(K, c.emb_dim)
        with torch.inference_mode():
            drafter.draft({"long": u, "hidden": rows, "anchor": ids[a]}, *out)
        hits += int((out[0][1:] == ids[a + 2: a + 1 + K]).sum())
        total += K - 1
    assert hits / total > 0.9, (alignment, hits, total)


@pytest.mark.slow
def test_greedy_equals_autoregressive_with_the_shifted_alignment(cfg_factory, tiny_target):
    """The unshifted default runs in the registry matrix (test_matrix.py); the shifted rows are Domino's own."""
    alignment = "shifted"
    t = tiny_target
    cfg = cfg_factory("drafter=domino_ft", "drafter.head.gru_hidden=32", "drafter.head.emb_dim=16",
                      "drafter.head.init_std=0.5", "drafter.head.guidance=3.0", f"drafter.head.alignment={alignment}")
    drafter = registry.build_drafter(cfg.drafter, t)
    for prompt in ("Hello there, how are you?", "What is 17 * 23?"):
        ids = t.encode_chat([{"role": "user", "content": prompt}])
        ref = generate(t, None, ids, DecodeConfig(max_new_tokens=30))
        for n in (1, 17, 30):
            assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=n)).tokens == ref.tokens[:n]


class _Backbone(_Stateless):
    """Hand-made DFlash: the block's hidden rows are `table[anchor]` `[B, H]`, logits through `lm`."""

    def __init__(self, table, lm):
        self.table, self.lm, self.block_size = table, lm, table.shape[1]

    def block_logits(self, anchor, start, k):
        return self.table[anchor][None], None                                    # [1, B, H]

    def lm_head(self, rows):
        return rows @ self.lm.T                                                  # [k, V]


def _toy(V, B=5, H=6, G=7, r=4, alignment="unshifted", seed=0):
    g = torch.Generator().manual_seed(seed)
    c = domino.DominoConfig(H, V, gru_hidden=G, emb_dim=r, alignment=alignment)
    head = domino.random_head(c, seed, 0.8)
    embed, lm = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    return head, embed, _Backbone(torch.randn(V, B, H, generator=g) * 2, lm)


@pytest.mark.parametrize("alignment", ["unshifted", "shifted"])
def test_correction_loop_equals_the_formula(alignment):
    """The drafter's merged loop against the head's own nn.GRU / embed_proj over the drafted prefix."""
    V = 13
    head, embed, bb = _toy(V, alignment=alignment)
    drafter = domino.DominoDrafter(bb, head, embed, 1.7, "torch", False)
    K, r0 = drafter.max_drafts, head.config.first_row
    assert K == 5 - r0
    with torch.no_grad():
        for anchor in range(V):
            rows = bb.table[anchor][r0: r0 + K]                               # [K, H]
            u = bb.lm_head(rows)                                              # [K, V]
            toks = [int(u[0].argmax())]                                       # draft 1: DFlash alone
            for i in range(1, K):
                prefix = embed[torch.tensor([anchor] + toks)][None]           # [1, i+1, H]: a, d1..di
                s = head.states(prefix)[0, -1]
                toks.append(int((u[i] + 1.7 * head.correction(rows[i], s)).argmax()))
            assert drafter.propose(anchor, 0, K, None).tokens.tolist() == toks
            assert drafter.propose(anchor, 0, 2, None).tokens.tolist() == toks[:2]
    # guidance 0 gives DFlash's own drafts; a huge guidance still leaves draft 1 alone
    plain = domino.DominoDrafter(bb, head, embed, 0.0, "torch", False)
    loud = domino.DominoDrafter(bb, head, embed, 1e4, "torch", False)
    for anchor in range(V):
        base = bb.lm_head(bb.table[anchor][r0: r0 + K]).argmax(-1)
        assert torch.equal(plain.propose(anchor, 0, K, None).tokens, base)
        assert loud.propose(anchor, 0, K, None).tokens[0] == base[0]


def _dist_test(backend, n_runs):
    """χ² of the first 4 generated tokens against the toy target's exact distribution under protocol B,
    3 drafts per block (block 4, unshifted), 2 of them corrected."""
    V, steps, T = 3, 4, 0.8
    g = torch.Generator().manual_seed(0)
    target_table = torch.randn(V, V, generator=g) * 1.5
    head, embed, _ = _toy(V, B=4, H=V, seed=2)
    # a DFlash close to the target's first step (hidden = logits, lm = I), so corrected drafts get accepted
    rows = target_table[:, None, :] + torch.randn(V, 4, V, generator=g) * 0.7        # [V, B, V]
    bb = _Backbone(rows, torch.eye(V))
    drafter = domino.DominoDrafter(bb, head, embed, 0.5, backend, False)
    return protocol_b_toy_fit(target_table, drafter, T, steps, n_runs, drafts=3)


@pytest.mark.slow
def test_protocol_b_keeps_the_target_distribution():
    pvalue, deep = _dist_test("torch", 6000)
    assert deep > 6000 // 20 and pvalue > 1e-3, (pvalue, deep)


@pytest.mark.slow
def test_protocol_b_through_the_triton_kernel_keeps_the_target_distribution():
    pvalue, deep = _dist_test("triton", 600)
    assert deep > 600 // 20 and pvalue > 1e-3, (pvalue, deep)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_graph_replay_path_on_cpu(monkeypatch, backend):
    """The CUDA-graph path with the capture replaced by a plain call of the same body: static buffers for the
    hidden rows and the anchor, k < K, one graph per temperature; it drafts exactly what the eager loop drafts."""
    from specexp.drafters.base import Sampling
    from specexp.kernels import graphs

    monkeypatch.setattr(graphs, "GraphedLoop", EagerLoop)
    head, embed, bb = _toy(300, B=7, seed=4)
    eager = domino.DominoDrafter(bb, head, embed, 2.0, backend, False)
    graphed = domino.DominoDrafter(bb, head, embed, 2.0, backend, False)
    graphed.graphs = {}
    for anchor, k in ((3, 6), (7, 2), (3, 6), (11, 1), (12, 6)):
        a, b = eager.propose(anchor, 0, k, None).tokens, graphed.propose(anchor, 0, k, None).tokens
        assert a.shape == (k,) and torch.equal(a, b), (anchor, k)
    assert list(graphed.graphs) == [0.0]
    if backend == "triton":
        ga, gb = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        for anchor, k in ((3, 6), (5, 4), (8, 6)):
            a, b = eager.propose(anchor, 0, k, Sampling(0.9, ga)), graphed.propose(anchor, 0, k, Sampling(0.9, gb))
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.q.token_probs, b.q.token_probs)
            torch.testing.assert_close(a.q.row(k - 1), b.q.row(k - 1))
        assert sorted(graphed.graphs) == [0.0, 0.9]


def test_head_checkpoint_round_trips_and_bad_input_is_one_line(cfg_factory, tiny_target, tmp_path):
    from specexp.errors import UserError

    head, _, _ = _toy(50, alignment="shifted")
    domino.save_head(head, tmp_path / "h")
    back = domino.load_head(tmp_path / "h", "x")
    assert back.config == head.config and not list((tmp_path / "h").glob("*.tmp"))
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.state_dict().values()))
    t = tiny_target
    bad = {
        "drafter.head.guidance=nan": "guidance",
        "drafter.head.alignment=sideways": "alignment",
        "drafter.head.init=sometimes": "head.init",
        "fusion.kernel=cuda": "fusion.kernel",
        f"drafter.head.checkpoint={tmp_path / 'nope'}": "no such directory",
        f"drafter.head.checkpoint={tmp_path / 'h'}": "does not fit",            # hidden 6 / vocab 50
    }
    for override, needle in bad.items():
        extra = ["drafter.head.init=checkpoint"] if "checkpoint=" in override else []
        with pytest.raises(UserError, match=needle) as e:
            registry.build_drafter(cfg_factory("drafter=domino_ft", override, *extra).drafter, t)
        assert "\n" not in str(e.value), override
    # a trained DFlash with no Domino head is refused instead of pairing it with a random head
    bb = tmp_path / "bb"
    init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 6, None)), 0).save_pretrained(bb)
    with pytest.raises(UserError, match="no Domino head for target tiny_qwen3"):
        registry.build_drafter(cfg_factory("drafter=domino_ft", "drafter.init=auto",
                                           f"drafter.checkpoint={bb}").drafter, t)
    with pytest.raises(UserError, match="needs a CUDA device"):
        registry.build_drafter(cfg_factory("drafter=domino_ft", "fusion.cuda_graph=true").drafter, t)


def test_a_checkpoint_config_is_read_once_per_load(cfg_factory, tiny_target, tmp_path, monkeypatch):
    """Building a drafter from a checkpoint reads its config.json once, however many layers look at it (Domino
    first asks whether it is a released Domino drafter, then hands the same reading to the DFlash loader)."""
    from specexp import checkpoints as ckpt

    t, reads = tiny_target, []
    bb = tmp_path / "bb"
    init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 6, None)), 0).save_pretrained(bb)
    real = ckpt.read_object
    monkeypatch.setattr(ckpt, "read_object", lambda f, where: reads.append(f.name) or real(f, where))
    for drafter in ("dflash", "domino_ft", "dels_rnn", "dedit"):
        reads.clear()
        registry.build_drafter(cfg_factory(f"drafter={drafter}", "drafter.init=checkpoint", f"drafter.checkpoint={bb}",
                                           *(["drafter.head.init=random"] if drafter in ("domino_ft", "dels_rnn")
                                             else [])).drafter, t)
        assert reads == ["config.json"], (drafter, reads)
