"""DEdit (arXiv 2609.38510): a DFlash-architecture drafter that drafts by parallel unmasking, then edits its
own draft with token-to-token passes in which later drafts act as right context for earlier ones. Only the
abstract is public (docs/methods.md, DEdit): everything below it is a reconstruction, and every choice is a
config key of `conf/drafter/dedit.yaml` (defaults explained there).

One block, anchor a at position p, drafting window W >= K (the verified length):
    pass 0 (unmask):   input [a, MASK x W]   -> logits l0 [W, V];  d = pick(l0);  c0 = max softmax(l0)
    pass e = 1..E:     input [a, d_1..d_W]   -> logits le [W, V]  (real tokens, no masks; attention inside the
                       block bidirectional, or lower-triangular with `edit.editor=causal`)
                       edit_i = rule(le_i, d_i, c0_i);  d_i <- pick(le_i) where edit_i
                       greedy: stop when a pass changes nothing (the next pass would see the same input)
    propose d_1..d_K   (positions K+1..W are right context only); verification is unchanged, so lossless.
Rules (`edit.rule`), all deterministic given the pass's logits and the current draft:
    argmax          edit where argmax le_i != d_i
    threshold       ... and max softmax(le_i) >= edit.threshold       (LLaDA2.1-style T2T editing)
    low_confidence  ... and c0_i < edit.confidence                     (only revisit unsure first-pass tokens)
Protocol B: pass 0 samples each row (as DFlash); each edit pass samples its candidates; there is no early stop.
Given everything drawn before the last pass, the final d_i are independent across i, with
q_i = softmax(l_last,i / T) where edit_i, else a point mass on the kept token — exactly the draft distribution
the verifier needs (the target distribution is preserved whatever earlier passes did).
Per round the proposal carries `info` = {passes run, the pass-0 draft}; `EditMetrics` below turns them into the
edit metrics (the registry hands it to the evaluator, which aggregates without knowing the keys).
A DEdit checkpoint is a DFlash-format checkpoint (the same weights, trained with the editing objective).
"""
from __future__ import annotations

from statistics import fmean

import torch

from ..errors import check, one_of
from ..schema import MAX_BLOCK, Settings, choice, frozen, is_int, is_num, null_or, setting, upto
from . import dflash
from .base import OnBackbone, Proposal, Sampling

RULES = ("argmax", "threshold", "low_confidence")
EDITORS = ("bidirectional", "causal")
MIXES = ("confidence_threshold", "confidence_sample", "plain")     # ProposalMix inputs of the editing loss


# ------------------------------------------------------------------------------------------- settings
@frozen
class EditSettings(Settings):
    """`drafter.edit`: the edit passes at inference."""
    passes: int = setting(2, is_int(0, MAX_BLOCK), f"an int >= 0; {upto(MAX_BLOCK)}")
    window: int | None = setting(None, null_or(is_int(1, MAX_BLOCK)), f"an int >= 1, or null; {upto(MAX_BLOCK)}")
    verify: int | None = setting(None, null_or(is_int(1, MAX_BLOCK)), f"an int >= 1, or null; {upto(MAX_BLOCK)}")
    rule: str = choice(*RULES)
    threshold: float = 0.5
    confidence: float = 0.9
    editor: str = choice(*EDITORS)
    early_stop: bool = True


@frozen
class TrainEditSettings(Settings):
    """`drafter.train_edit`: the editing loss of task=train drafter=dedit."""
    mix: str = choice("confidence_sample", "confidence_threshold", "plain")
    mix_threshold: float = setting(0.5, is_num(0, 1), "a probability in [0, 1]")
    plain_rate: float = setting(0.5, is_num(0, 1), "a probability in [0, 1]")
    edit_weight: float = 1.0


@frozen
class DEditSettings(dflash.DFlashSettings):
    """The keys of `drafter=dedit`: DFlash's and the edit passes'."""
    name: str = "dedit"
    edit: EditSettings = setting(factory=EditSettings)
    train_edit: TrainEditSettings = setting(factory=TrainEditSettings)


def block_mask(ctx_len: int, q: int, causal: bool, device) -> torch.Tensor | None:
    """Bool `[1, 1, Q, C+Q]` for one block: every context key, and the block's own keys (all of them, or
    those at or before the query with `causal`). None = full attention."""
    if not causal:
        return None
    own = torch.ones(q, q, dtype=torch.bool, device=device).tril()                         # [Q, Q]
    return torch.cat([torch.ones(q, ctx_len, dtype=torch.bool, device=device), own], 1)[None, None]


class DEditDrafter(OnBackbone):
    def __init__(self, backbone: dflash.DFlashDrafter, passes: int, window: int | None = None,
                 verify: int | None = None, rule: str = "argmax", threshold: float = 0.5, confidence: float = 0.9,
                 editor: str = "bidirectional", early_stop: bool = True):
        one_of("drafter.edit.rule", rule, RULES)
        one_of("drafter.edit.editor", editor, EDITORS)
        w = backbone.block_size - 1 if window is None else int(window)
        k = w if verify is None else int(verify)
        check(isinstance(passes, int) and passes >= 0, f"drafter.edit.passes={passes!r}: expected an integer >= 0")
        check(w >= 1, f"drafter.edit.window={window!r}: expected an integer >= 1")
        check(1 <= k <= w, f"drafter.edit.verify={verify!r}: expected 1..window ({w}); the window holds the "
                           f"verified drafts plus right context")
        for name, v in (("threshold", threshold), ("confidence", confidence)):
            check(isinstance(v, (int, float)) and 0.0 <= v <= 1.0, f"drafter.edit.{name}={v!r}: expected a "
                                                                     f"probability in [0, 1]")
        self.backbone, self.name = backbone, "dedit"
        self.passes, self.window, self.max_drafts = passes, w, k
        self.rule, self.threshold, self.confidence = rule, float(threshold), float(confidence)
        self.causal, self.early_stop = editor == "causal", bool(early_stop)
        self.tap_layers = backbone.tap_layers

    def logits(self, anchor: int, start: int, tokens: torch.Tensor | None) -> torch.Tensor:
        """One pass over the window: `tokens [W]` (None = pass 0, all masks) → logits `[W, V]` of rows 1..W."""
        b, w = self.backbone, self.window
        dev = b.model.fc.weight.device
        ids = torch.full((1, w + 1), b.mask_token_id, device=dev)
        ids[0, 0] = anchor
        if tokens is not None:
            ids[0, 1:] = tokens                                                             # [1, W+1]
        pos = torch.arange(start, start + w + 1, device=dev)[None]                          # [1, W+1]
        mask = block_mask(b.ctx_len, w + 1, self.causal and tokens is not None, dev)
        hidden = b.model(b.embed(ids), pos, b.ctx, mask)                                    # [1, W+1, H]
        return b.lm_head(hidden[0, 1:])                                                     # [W, V]

    def edits(self, probs: torch.Tensor, draft: torch.Tensor, conf0: torch.Tensor) -> torch.Tensor:
        """Bool `[W]`: where the rule lets this pass replace the current draft (probs `[W, V]` at T = 1)."""
        top_p, top = probs.max(-1)                                                          # [W]
        edit = top != draft
        if self.rule == "threshold":
            edit &= top_p >= self.threshold
        elif self.rule == "low_confidence":
            edit &= conf0 < self.confidence
        return edit

    @torch.inference_mode()
    def propose(self, anchor: int, start: int, k: int, sampling: Sampling | None) -> Proposal:
        l = self.logits(anchor, start, None)                                                # [W, V]
        p = torch.softmax(l.float(), -1)                                                    # [W, V]
        conf0 = p.amax(-1)                                                                  # [W]
        draft, q = self._pick(l, sampling)
        pre, passes = draft[:k].clone(), 0
        for e in range(1, self.passes + 1):
            l = self.logits(anchor, start, draft)
            edit = self.edits(torch.softmax(l.float(), -1), draft, conf0)                    # [W]
            cand, q_new = self._pick(l, sampling)
            new = torch.where(edit, cand, draft)                                            # [W]
            passes = e
            if sampling is not None:            # the kept tokens are point masses given the pass's input
                keep = torch.nn.functional.one_hot(draft, l.shape[-1]).to(q_new.dtype)
                q = torch.where(edit[:, None], q_new, keep)                                 # [W, V]
            elif self.early_stop and torch.equal(new, draft):
                break
            draft = new
        info = {"passes": passes, "pre_edit": pre}
        return Proposal(draft[:k], None if q is None else q[:k], info=info)

    @torch.inference_mode()
    def propose_all(self, taps: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, ks: torch.Tensor,
                    chunk: int = 32) -> tuple[torch.Tensor, list[dict | None]]:
        """Greedy drafts and round info at many anchors of a known sequence (drafters/base.py): `propose` for a batch
        of blocks, each pass one batched backbone pass (DFlash's) over the blocks still editing. A block leaves the
        batch at the pass that changes nothing (greedy early stop, as `propose`: its draft and pass count are then
        final), so each block runs exactly the passes `propose` runs; no row can be skipped, since every pass reads
        the whole window. Returns drafts `[N, K]` (every row computed) and per anchor `propose`'s info
        {passes, pre_edit [k]} (None where ks = 0)."""
        b = self.backbone
        dev = b.model.fc.weight.device
        ids, starts, ks = ids.to(dev), starts.to(dev), ks.to(dev)
        ctx = b.context(taps)
        out = torch.full((len(starts), self.max_drafts), -1, dtype=torch.long, device=dev)  # [N, K]
        infos: list[dict | None] = [None] * len(starts)
        todo = torch.nonzero(ks > 0)[:, 0]                                                  # the engine proposes there
        for c0 in range(0, len(todo), chunk):
            at = todo[c0: c0 + chunk]                                                       # [n]
            s, anchors = starts[at], ids[starts[at]]
            l = self.batch_logits(ctx, b.mask_blocks(ids, s, self.window + 1), s, False)   # [n, W, V]
            # pass-0 confidence: only the low_confidence rule reads it (a softmax over the vocabulary per row)
            conf0 = torch.softmax(l.float(), -1).amax(-1) if self.rule == "low_confidence" else None   # [n, W]
            draft = self._pick(l, None)[0]                                                  # [n, W]
            pre, passes = draft.clone(), torch.zeros(len(at), dtype=torch.long, device=dev)
            live = torch.arange(len(at), device=dev)                                        # blocks still editing
            for e in range(1, self.passes + 1):
                if live.numel() == 0:
                    break
                cur = draft[live]                                                           # [a, W]
                block = torch.cat([anchors[live, None], cur], 1)                            # [a, W+1]
                l = self.batch_logits(ctx, block, s[live], self.causal)                     # [a, W, V]
                edit = self.edits(torch.softmax(l.float(), -1), cur, None if conf0 is None else conf0[live])
                new = torch.where(edit, self._pick(l, None)[0], cur)                        # [a, W]
                passes[live] = e
                draft[live] = new
                if self.early_stop:
                    live = live[(new != cur).any(-1)]
            out[at] = draft[:, : self.max_drafts]
            for i, (j, k, e) in enumerate(zip(at.tolist(), ks[at].tolist(), passes.tolist())):
                infos[j] = {"passes": e, "pre_edit": pre[i, :k]}                            # propose's info
        return out, infos

    def batch_logits(self, ctx, block: torch.Tensor, starts: torch.Tensor, causal: bool) -> torch.Tensor:
        """`logits` for a batch of windows `[n, W+1]` (propose_all) → `[n, W, V]` of rows 1..W."""
        h = self.backbone.blocks(ctx, block, starts, causal)[:, 1:]                         # [n, W, H]
        # One [n*W, H] product: the strided 3-D slice would run as n small ones, each as slow as propose's.
        return self.backbone.lm_head(h.reshape(-1, h.shape[-1])).view(*h.shape[:2], -1)     # [n, W, V]

    @staticmethod
    def _pick(logits: torch.Tensor, sampling: Sampling | None):
        if sampling is None:
            return logits.argmax(-1), None
        q = torch.softmax(logits.float() / sampling.temperature, -1)                       # [W, V]
        return torch.multinomial(q, 1, generator=sampling.generator)[:, 0], q


def build(cfg: DEditSettings, target) -> DEditDrafter:
    """`drafter=dedit`: the DFlash backbone as `drafter=dflash` builds it (init random / checkpoint), with the
    drafting and editing options of `drafter.edit`. The backbone must be unshifted: an edit pass reads the block's
    rows 1..W as drafts 1..W."""
    e = cfg.edit
    backbone = dflash.build(cfg, target)
    check(backbone.first_row == 1, f"drafter.checkpoint={str(cfg.checkpoint)!r}: a shifted (DSpark-format) "
                                   "DFlash drafter; drafter=dedit needs an unshifted z-lab-format one")
    return DEditDrafter(backbone, e.passes, e.window, e.verify, e.rule, e.threshold, e.confidence, e.editor,
                        e.early_stop)


# ---------------------------------------------------------------------------------------------- metrics
def edit_outcome(pre: list[int], final: list[int], accepted: int, bonus: int) -> str:
    """unedited | harmful | helpful | neutral, for one greedy round.

    A round is edited when its proposal differs from its pass-0 draft within the verified positions. Under greedy
    decoding the target's tokens t_1..t_{n+1} after n accepted drafts are known exactly: the accepted drafts and the
    bonus. The pass-0 draft's accepted length is therefore exact up to n, and "more than n" is all `harmful` needs:
    harmful = the pass-0 draft would have been accepted further, helpful = less far, neutral = as far."""
    if pre == final:
        return "unedited"
    truth = final[:accepted] + [bonus]                 # the target's own tokens at positions 1..accepted+1
    n0 = 0
    while n0 < min(len(pre), len(truth)) and pre[n0] == truth[n0]:
        n0 += 1
    return "harmful" if n0 > accepted else "helpful" if n0 < accepted else "neutral"


def edit_summary(records: list[dict]) -> dict | None:
    """Per benchmark: rounds and τ by passes run (mean tokens committed by the rounds that ran that many passes),
    and, under greedy, edited rounds with harmful / helpful / neutral counts and rates (per edited round)."""
    rounds = [(p, o, a) for r in records if r.get("passes") is not None
              for p, o, a in zip(r["passes"], r.get("edit_outcomes") or [None] * len(r["passes"]), r["accept_lengths"])]
    if not rounds:
        return None
    by_pass: dict[int, list[int]] = {}
    for p, _, a in rounds:
        by_pass.setdefault(p, []).append(a)
    out = {"rounds": len(rounds), "tau_by_passes": {str(p): fmean(v) for p, v in sorted(by_pass.items())},
           "rounds_by_passes": {str(p): len(v) for p, v in sorted(by_pass.items())}}
    outcomes = [o for _, o, _ in rounds if o is not None]
    if outcomes:
        edited = [o for o in outcomes if o != "unedited"]
        out |= {"edited": len(edited), **{o: edited.count(o) for o in ("harmful", "helpful", "neutral")},
                "harmful_rate": edited.count("harmful") / len(edited) if edited else None,
                "helpful_rate": edited.count("helpful") / len(edited) if edited else None}
    return out


class EditMetrics:
    """DEdit's round metrics (registry.RoundMetrics): per turn `passes` and, under greedy, `edit_outcomes`;
    per benchmark `edits`."""

    def turn(self, rounds: list[dict], greedy: bool) -> dict:
        out = {"passes": [r["passes"] for r in rounds]}
        if greedy:                          # the target's tokens are known exactly only under greedy decoding
            out["edit_outcomes"] = [edit_outcome(r["pre_edit"].tolist(), r["tokens"].tolist(), r["accepted"],
                                                 r["bonus"]) for r in rounds]
        return out

    def benchmark(self, records: list[dict]) -> dict | None:
        e = edit_summary(records)
        return None if e is None else {"edits": e}


METRICS = EditMetrics()
