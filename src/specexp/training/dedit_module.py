"""DEdit training (drafters/dedit.py; docs/methods.md, DEdit: a reconstruction): the DFlash objective on the
masked block (pass 0) plus an editing objective on ProposalMix inputs.

Per anchored block (the DFlash layout of training/anchors.py, weights w_k = exp(-(k-1)/gamma)):
    pass 0:  [x_a, MASK x (B-1)] -> logits l0;  L0 = sum w CE(l0, x) / sum w
    mix:     with no gradient, proposals y_k = argmax l0_k and confidences c_k = max softmax(l0_k); the edit
             input is [x_a, m_1..m_{B-1}] with m_k = y_k where the mix rule keeps the proposal, x_{a+k} elsewhere:
               confidence_threshold  keep where c_k >= mix_threshold    (confident proposals, as at inference)
               confidence_sample     keep with probability c_k
               plain                 keep with probability plain_rate, whatever the confidence (the ablation)
    pass 1:  [x_a, m] (no masks; bidirectional, or causal inside the block) -> l1;
             L1 = sum w CE(l1, x) / sum w over every row: keep correct inputs, repair wrong ones
    L = L0 + edit_weight * L1
Logged: pass-0 accuracy/τ_sim, the share of rows fed a proposal, repair rate (wrong proposal in, truth out),
keep rate (correct proposal in, still correct out).
"""
from __future__ import annotations

import torch

from ..drafters.dedit import DEditSettings
from .anchors import build_blocks, dense_mask, flex_mask, leading_correct, sample_anchors
from .dflash_module import DFlashLitModule, backbone_plan
from .losses import chunked_ce
from .optim import step_generator


class DEditLitModule(DFlashLitModule):
    def __init__(self, model, target, *, mix: str, mix_threshold: float, plain_rate: float, edit_weight: float,
                 causal: bool, **dflash_kwargs):
        super().__init__(model, target, **dflash_kwargs)
        self.mix, self.mix_threshold, self.plain_rate = mix, mix_threshold, plain_rate
        self.edit_weight, self.causal = edit_weight, causal

    def keep_proposal(self, conf: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """Bool, where the edit input takes the model's proposal instead of the ground truth."""
        if self.mix == "confidence_threshold":
            return conf >= self.mix_threshold
        u = torch.rand(conf.shape, generator=g).to(conf.device)
        return u < (conf if self.mix == "confidence_sample" else torch.full_like(conf, self.plain_rate))

    def blocks_loss(self, ids, loss_mask, taps, step: int):
        c, dev = self.model.config, ids.device
        g = step_generator(self.seed, step)
        anchors = sample_anchors(loss_mask.cpu(), self.num_anchors, g).to(dev)                 # [n]
        if anchors.numel() == 0:
            return None, {}
        blk = build_blocks(ids, loss_mask, anchors, c.block_size, c.mask_token_id, self.gamma)
        s, b = ids.numel(), c.block_size
        use_flex = self.attention == "flex" or (self.attention == "auto" and dev.type == "cuda")
        make = flex_mask if use_flex else dense_mask
        # the context stream: each layer takes its K/V inside its own call, in both passes (FSDP units)
        context = self.model.context_stream(taps[None].to(self.model.fc.weight.dtype),
                                            torch.arange(s, device=dev)[None])
        sel, w = blk.weights > 0, blk.weights[blk.weights > 0]                                 # [Q], [M]
        labels = blk.labels[sel]                                                               # [M]
        # pass 0: the DFlash objective
        h0 = self.model(self.target.embed_tokens(blk.noise_ids)[None], blk.positions[None], mask=make(anchors, s, b),
                        context=context)[0]                                                    # [Q, H]
        ce0, prop, conf = chunked_ce(self.target.lm_head, [h0[sel]], labels)                  # [M] each
        loss0 = (ce0 * w).sum() / (w.sum() + 1e-6)
        # ProposalMix: the edit input from the first pass's own proposals (argmax, max probability), no gradient
        with torch.no_grad():
            keep = self.keep_proposal(conf, g)                                                 # [M]
            edit_in = blk.labels.clone()                                                       # [Q] x_a, x_{a+1}, ..
            edit_in[sel] = torch.where(keep, prop, labels)
        h1 = self.model(self.target.embed_tokens(edit_in)[None], blk.positions[None],
                        mask=make(anchors, s, b, causal=self.causal), context=context)[0]      # [Q, H]
        ce1, pred1, _ = chunked_ce(self.target.lm_head, [h1[sel]], labels)                   # [M] each
        loss1 = (ce1 * w).sum() / (w.sum() + 1e-6)
        loss = loss0 + self.edit_weight * loss1
        with torch.no_grad():
            ok0, ok1 = prop == labels, pred1 == labels                                       # [M]
            wrong_in, right_in = keep & ~ok0, keep & ok0
            correct = torch.zeros_like(sel)
            correct[sel] = ok0
            m = {"tau_sim": leading_correct(correct, sel, b).float().mean(), "loss0": loss0.detach(),
                 "loss_edit": loss1.detach(), "acc0": ok0.float().mean(), "acc_edit": ok1.float().mean(),
                 "mixed": keep.float().mean(), "blocks": float(anchors.numel())}
            if wrong_in.any():
                m["repair"] = ok1[wrong_in].float().mean()
            if right_in.any():
                m["keep"] = ok1[right_in].float().mean()
        return loss, m


def edit_recipe(drafter) -> dict:
    """DEdit's training options (`drafter.train_edit`, checked by DEditSettings; the editor mask is the one it will
    draft with)."""
    t = DEditSettings.of(drafter).train_edit
    return {"mix": t.mix, "mix_threshold": float(t.mix_threshold), "plain_rate": float(t.plain_rate),
            "edit_weight": float(t.edit_weight), "editor": drafter.edit.editor}


def plan(ctx):
    """`task=train drafter=dedit`: the DFlash loss on pass 0 plus the editing loss on ProposalMix inputs."""
    r = edit_recipe(ctx.drafter)

    def make(model, target, **common):
        return DEditLitModule(model, target, mix=r["mix"], mix_threshold=r["mix_threshold"],
                              plain_rate=r["plain_rate"], edit_weight=r["edit_weight"],
                              causal=r["editor"] == "causal", **common)

    return backbone_plan(ctx, "dedit", "DEdit drafter", make, extra={"edit": r})
