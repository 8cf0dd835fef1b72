"""Chunked cross-entropy: the loss, its gradients and the per-row argmax / max probability equal those of the
full `[rows, V]` logits, for the bare function and inside the DFlash and DEdit training losses."""
import pytest
import torch
import torch.nn.functional as F

from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
from specexp.drafters.layers import init_weights
from specexp.training import losses
from specexp.training.losses import chunked_ce


def test_chunked_ce_equals_the_full_logits_with_gradients():
    g = torch.Generator().manual_seed(0)
    m, h, v = 13, 8, 50
    x = torch.randn(m, h, generator=g, requires_grad=True)                       # [M, H]
    head = torch.nn.Linear(h, v, bias=False)
    scale = torch.randn(m, generator=g).abs().requires_grad_(True)                # a per-row input with a gradient
    y, w = torch.randint(0, v, (m,), generator=g), torch.rand(m, generator=g)

    def logits_fn(xs, ss):
        return head(xs) * ss[:, None]                                             # [m, V]

    full = logits_fn(x, scale).float()                                            # [M, V]
    ref = (F.cross_entropy(full, y, reduction="none") * w).sum() / w.sum()
    ref_grads = torch.autograd.grad(ref, [x, scale, head.weight])
    conf, arg = torch.softmax(full, -1).max(-1)
    for chunk in (1, 4, 13, 100):
        ce, pred, p = chunked_ce(logits_fn, [x, scale], y, chunk_rows=chunk)
        loss = (ce * w).sum() / w.sum()
        torch.testing.assert_close(loss, ref)
        for a, b in zip(torch.autograd.grad(loss, [x, scale, head.weight]), ref_grads):
            torch.testing.assert_close(a, b)
        assert torch.equal(pred, arg) and not p.requires_grad
        torch.testing.assert_close(p, conf.detach())
    with torch.no_grad():
        ce, _, _ = chunked_ce(logits_fn, [x, scale], y, chunk_rows=5)
    torch.testing.assert_close((ce * w).sum() / w.sum(), ref.detach())


def _loss_and_grads(module, fn):
    module.zero_grad()
    loss, metrics = fn()
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}, metrics


@pytest.mark.slow
def test_dflash_and_dedit_losses_do_not_depend_on_the_chunk(tiny_target, monkeypatch):
    from specexp.training.dedit_module import DEditLitModule
    from specexp.training.dflash_module import DFlashLitModule

    t = tiny_target
    ids = torch.tensor(t.encode_chat([{"role": "user", "content": "Count from one to twenty, please."}]))
    lm = torch.zeros_like(ids, dtype=torch.bool)
    lm[5:] = True
    taps = t.forward(ids[None], 0, t.new_cache(), taps=(0, 2))[1][0].clone()            # [S, 2H]
    model = init_weights(DFlashDraftModel(DFlashConfig.for_target(t, 1, 8, [0, 2])), 0)
    kw = dict(num_anchors=4, gamma=4.0, lr=1e-3, warmup_ratio=0.0, weight_decay=0.0, attention="dense", seed=0)
    modules = [DFlashLitModule(model, t, **kw),
               DEditLitModule(model, t, mix="confidence_threshold", mix_threshold=0.5, plain_rate=0.3,
                              edit_weight=1.0, causal=False, **kw)]
    for mod in modules:
        results = []
        for chunk in (10 ** 9, 5):
            monkeypatch.setattr(losses, "CHUNK_ROWS", chunk)
            results.append(_loss_and_grads(mod, lambda: mod.blocks_loss(ids, lm, taps, step=0)))
        (l1, g1, m1), (l2, g2, m2) = results
        torch.testing.assert_close(l2, l1)
        assert g1.keys() == g2.keys() and g1
        for k in g1:
            torch.testing.assert_close(g2[k], g1[k], rtol=1e-5, atol=1e-6)
        assert m1.keys() == m2.keys()
        for k in m1:
            torch.testing.assert_close(torch.as_tensor(m2[k]), torch.as_tensor(m1[k]), msg=k)
