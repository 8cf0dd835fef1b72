"""DeLS-Spec local heads: plain next-token prediction on the head's training data (no target hidden states,
no DFlash in the loop), and the unigram prior of the same data. See docs/methods.md, DeLS-Spec.

- rnn: anchored blocks (anchors drawn as for DFlash, among response positions a <= S - B), inputs = the
  tokens at offsets 0..B-2, targets = offsets 1..B-1, zero GRU state per block (teacher forced), loss weight
  exp(-k / gamma) for offset k = 0..B-2, masked by the targets' loss mask, normalised by the weight sum.
- markov: dense over every position (previous token -> next token), weighted by the next token's loss mask.
The target's embedding and lm_head are shared and frozen (not in the module's state, not optimised).
"""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from .. import registry
from ..drafters import dels
from ..errors import check
from ..targets import resolve_device
from ..tracking import write_json
from .anchors import adamw_cosine, sample_anchors


class LocalHeadLitModule(L.LightningModule):
    def __init__(self, head, target, *, block_size: int, num_anchors: int, gamma: float, lr: float,
                 warmup_ratio: float, weight_decay: float, seed: int):
        super().__init__()
        self.head = head
        self._target = (target,)          # a tuple: the frozen target is not a submodule
        self.block_size, self.num_anchors, self.gamma = block_size, num_anchors, gamma
        self.lr, self.warmup_ratio, self.weight_decay, self.seed = lr, warmup_ratio, weight_decay, seed

    @property
    def target(self):
        return self._target[0]

    def _rows(self, ids, loss_mask, step: int):
        """(inputs [N, L], targets [N, L], weights [N, L]) for one sequence `[S]`."""
        if self.head.config.kind == "markov":
            return ids[None, :-1], ids[None, 1:], loss_mask[None, 1:].float()
        b, s = self.block_size, ids.numel()
        if s < b:
            return None
        g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{step}".encode()))
        anchors = sample_anchors(loss_mask[: s - b + 2].cpu(), self.num_anchors, g).to(ids.device)   # a <= S-B
        if anchors.numel() == 0:
            return None
        pos = anchors[:, None] + torch.arange(b, device=ids.device)                    # [n, B]
        k = torch.arange(b - 1, device=ids.device)                                       # [B-1]
        w = torch.exp(-k.float() / self.gamma) * loss_mask[pos[:, 1:]]                  # [n, B-1]
        return ids[pos[:, :-1]], ids[pos[:, 1:]], w

    def head_loss(self, ids, loss_mask, step: int):
        rows = self._rows(ids, loss_mask, step)
        if rows is None or not (rows[2] > 0).any():
            return None, {}
        inp, tgt, w = rows
        hidden = self.head.hidden(self.target.embed_tokens(inp))                        # [N, L, H]
        sel = w > 0
        logits = self.target.lm_head(hidden[sel])                                      # [M, V]
        ce = F.cross_entropy(logits.float(), tgt[sel], reduction="none")               # [M]
        loss = (ce * w[sel]).sum() / w[sel].sum()
        with torch.no_grad():
            correct = logits.argmax(-1) == tgt[sel]
            m = {"acc": correct.float().mean(), "tokens": float(sel.sum())}
            if self.head.config.kind == "rnn":
                k = torch.arange(inp.shape[1], device=ids.device).expand_as(inp)[sel]
                m.update({f"acc_k{j}": correct[k == j].float().mean() for j in range(inp.shape[1]) if (k == j).any()})
        return loss, m

    def training_step(self, batch, batch_idx):
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        loss, m = self.head_loss(ids, lm, self.global_step)
        if loss is None:
            return None
        self.log("train/loss", loss, prog_bar=True, batch_size=1)
        self.log("train/acc", m.pop("acc"), prog_bar=True, batch_size=1)
        self.log_dict({f"train/{k}": v for k, v in m.items()}, batch_size=1)
        return loss

    def configure_optimizers(self):
        return adamw_cosine(self.head.parameters(), self.trainer, self.lr, self.weight_decay, self.warmup_ratio)


def count_assistant_tokens(seqs, vocab_size: int) -> torch.Tensor:
    """Unigram counts `[V]` of the loss-masked (assistant) tokens of the sequences."""
    ids = torch.cat([s.ids[s.loss_mask] for s in seqs]) if seqs else torch.empty(0, dtype=torch.long)
    return torch.bincount(ids, minlength=vocab_size)


def head_block_size(cfg, target) -> int:
    """The head's training block: `drafter.head.train.block_size`, else the DFlash backbone's."""
    if cfg.drafter.head.train.block_size:
        return int(cfg.drafter.head.train.block_size)
    from .tasks import drafter_config

    return drafter_config(cfg, target)[0].block_size


def card_markdown(card: dict) -> str:
    fm = card.get("final_metrics", {})
    lines = [f"# DeLS-Spec {card['head']['kind']} local head for {card['target']} ({card['target_source']})", "",
             f"Produced by: `{card['command']}` (specexp; stage `{Path(card['run_dir']).name}`).", "",
             f"- data: {card['sequences']} sequences, {card['response_tokens']} response tokens, hash `{card['data_hash']}`",
             f"- head: {json.dumps({k: v for k, v in card['head'].items() if k != 'architecture'})}, "
             f"{card['trainable_params']:,} trainable parameters",
             f"- training: {card['steps']} steps in {card['train_seconds']:.0f} s, peak memory "
             f"{card['peak_memory_mb']:.0f} MiB, precision {card['precision']}, block {card['block_size']}, "
             f"gamma {card['gamma']}",
             f"- final train loss {fm.get('train/loss', float('nan')):.3f}, accuracy {fm.get('train/acc', float('nan')):.3f}",
             f"- prior: {PRIOR_NOTE}"]
    if "eval" in card:
        e = card["eval"]
        lines += ["", f"Measured with fusion alpha={e['alpha']}, beta={e['beta']} (greedy, {e['max_new_tokens']} new "
                      f"tokens; τ includes the bonus token):", "", "| benchmark | τ | speedup |", "|---|---:|---:|"]
        for name, b in e["benchmarks"].items():
            sp = "–" if b["speedup"] is None else f"{b['speedup']:.2f}×"
            lines.append(f"| {name} | {b['tau']:.2f} | {sp} |")
    return "\n".join(lines) + "\n"


PRIOR_NOTE = (f"`{dels.PRIOR_FILE}` = counts of the assistant tokens of the same training sequences and their "
              "Laplace-smoothed natural log prior over the full vocabulary")


def run_train_head(cfg, out_dir) -> dict:
    """`task=train drafter=dels_rnn|dels_markov`: sequences -> Lightning -> head + prior (+ export, + eval)."""
    part = cfg.drafter.head.train.part
    if part == "fusion_weights":
        return run_train_fusion_weights(cfg, out_dir)
    check(part == "head", f"drafter.head.train.part={part!r} is not valid; choose head or fusion_weights")
    from .tasks import _stage, _target_fingerprint, lightning_fit, peak_memory_mb, prepare_sequences

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = registry.build_target(cfg.target, resolve_device(cfg.device))
    hc = dels.head_config(cfg.drafter, target)
    ht, tc = cfg.drafter.head.train, cfg.train
    block = head_block_size(cfg, target)
    check(block >= 2, f"drafter.head.train.block_size={block} must be at least 2")
    seqs, data_hash = prepare_sequences(cfg, target)
    recipe = {**OmegaConf.to_container(ht, resolve=True), "block_size": block,
              **{k: tc[k] for k in ("lr", "warmup_ratio", "weight_decay", "grad_clip", "max_steps", "accumulate",
                                    "precision", "seed")}}
    run_dir = _stage(cfg, "head", {"data": data_hash, "head": hc.to_dict(), "recipe": recipe,
                                   "target": _target_fingerprint(cfg, target)})
    run_dir.mkdir(parents=True, exist_ok=True)
    head_dir = run_dir / "head"
    if (run_dir / "train.json").exists() and (head_dir / dels.WEIGHTS_FILE).exists():
        card = json.loads((run_dir / "train.json").read_text())
        print(f"specexp: reusing trained head {head_dir}", flush=True)
    else:
        with torch.random.fork_rng():
            torch.manual_seed(tc.seed)
            head = dels.make_head(hc)
        module = LocalHeadLitModule(head.float(), target, block_size=block, num_anchors=ht.num_anchors,
                                    gamma=ht.gamma, lr=tc.lr, warmup_ratio=tc.warmup_ratio,
                                    weight_decay=tc.weight_decay, seed=tc.seed)
        train_cfg = OmegaConf.merge(cfg, {"train": {"epochs": ht.epochs}})
        trainer, seconds, precision = lightning_fit(train_cfg, module, _TokenSequences(seqs), run_dir, target.device)
        dels.save_head(head, head_dir, dtype=getattr(torch, tc.export_dtype))
        card = {"steps": trainer.global_step, "train_seconds": seconds, "peak_memory_mb": peak_memory_mb(target.device),
                "final_metrics": {k: float(v) for k, v in trainer.logged_metrics.items()}, "precision": precision,
                "block_size": block, "gamma": ht.gamma, "trainable_params": sum(p.numel() for p in head.parameters())}
        write_json(run_dir / "train.json", card)
    counts = count_assistant_tokens(seqs, target.vocab_size)
    dels.save_prior(counts, head_dir, 1.0, {"data_hash": data_hash, "sequences": len(seqs)})
    card = {**card, "command": "python -m specexp " + " ".join(sys.argv[1:]), "data_hash": data_hash,
            "sequences": len(seqs), "response_tokens": int(counts.sum()), "target": target.name,
            "target_source": target.source, "head": hc.to_dict(), "recipe": recipe, "run_dir": str(run_dir)}
    final = head_dir
    if tc.export_dir:
        final = Path(tc.export_dir)
        dels.save_head(dels.load_head(head_dir, str(head_dir)), final, dtype=getattr(torch, tc.export_dtype))
        dels.save_prior(counts, final, 1.0, {"data_hash": data_hash, "sequences": len(seqs)})
    if tc.eval_after:
        from ..eval.evaluator import run_eval

        ecfg = OmegaConf.merge(cfg, {"drafter": {"head": {"init": "checkpoint", "checkpoint": str(final)}}})
        summary = run_eval(ecfg, out_dir / "eval")
        card["eval"] = {"benchmarks": {k: {"tau": v["tau"], "speedup": v["speedup"]}
                                       for k, v in summary["benchmarks"].items()}, "macro": summary["macro"],
                        "max_new_tokens": summary["max_new_tokens"],
                        "alpha": OmegaConf.to_container(cfg.fusion, resolve=True)["alpha"],
                        "beta": OmegaConf.to_container(cfg.fusion, resolve=True)["beta"]}
    write_json(final / "card.json", card)
    (final / "README.md").write_text(card_markdown(card))
    write_json(out_dir / "train_summary.json", card)
    print(json.dumps({k: card[k] for k in ("steps", "train_seconds", "peak_memory_mb", "final_metrics")}, indent=1))
    return card


class _TokenSequences(torch.utils.data.Dataset):
    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return {"ids": self.seqs[i].ids, "loss_mask": self.seqs[i].loss_mask}


def run_prior(cfg, out_dir) -> dict:
    """`task=prior`: the unigram prior of the data config's sequences, written to `task.out` (default: the
    run directory); point it at a head's directory to put the prior beside the head."""
    from .tasks import prepare_sequences

    target = registry.build_target(cfg.target, resolve_device(cfg.device))
    seqs, data_hash = prepare_sequences(cfg, target)
    counts = count_assistant_tokens(seqs, target.vocab_size)
    dest = Path(cfg.task.out) if cfg.task.get("out") else Path(out_dir)
    path = dels.save_prior(counts, dest, cfg.task.smoothing, {"data_hash": data_hash, "sequences": len(seqs)})
    summary = {"prior": str(path), "tokens": int(counts.sum()), "distinct": int((counts > 0).sum()),
               "vocab_size": target.vocab_size, "smoothing": cfg.task.smoothing, "data_hash": data_hash}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / "prior.json", summary)
    print(f"specexp: {summary}", flush=True)
    return summary


# ------------------------------------------------------------------------- learned per-position α / β
FUSION_WEIGHTS_FILE = dels.FUSION_WEIGHTS_FILE


class FusionWeightsLitModule(L.LightningModule):
    """Per-position alpha_k, beta_k (k = draft 2..B-1) trained on top of a frozen DFlash backbone, frozen
    local head and prior (the paper's learned-weights variant; the runtime's `position_gates`). Blocks and
    labels as DFlash training (training/anchors.py); the head is teacher forced from a zero state on the
    ground-truth drafts x_{a+1}, ..., as at inference it starts on draft 1. Loss: the fused logits' CE with
    weights exp(-(k-1)/gamma), normalised by the weight sum. Target taps are computed online."""

    def __init__(self, backbone, head, log_prior, target, *, num_anchors: int, gamma: float, alpha, beta,
                 lr: float, warmup_ratio: float, seed: int):
        super().__init__()
        n = backbone.config.block_size - 2
        self.alpha = torch.nn.Parameter(torch.tensor(dels.per_position("alpha", alpha, n)))        # [B-2]
        self.beta = torch.nn.Parameter(torch.tensor(dels.per_position("beta", beta, n)))           # [B-2]
        self._frozen = (backbone.requires_grad_(False), head.requires_grad_(False), log_prior, target)
        self.num_anchors, self.gamma, self.lr, self.warmup_ratio, self.seed = num_anchors, gamma, lr, warmup_ratio, seed

    def fused_loss(self, ids, loss_mask, taps, step: int):
        from .anchors import build_blocks, dense_mask

        backbone, head, lp, t = self._frozen
        c, s, dev = backbone.config, ids.numel(), ids.device
        b = c.block_size
        g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{step}".encode()))
        anchors = sample_anchors(loss_mask.cpu(), self.num_anchors, g).to(dev)                    # [n]
        if anchors.numel() == 0:
            return None
        blk = build_blocks(ids, loss_mask, anchors, b, c.mask_token_id, self.gamma)
        w = blk.weights.view(-1, b)[:, 2:]                                                          # [n, B-2]
        if not (w > 0).any():
            return None
        with torch.no_grad():
            ctx = backbone.context_kv(taps[None].to(backbone.fc.weight.dtype), torch.arange(s, device=dev)[None])
            h = backbone(t.embed_tokens(blk.noise_ids)[None], blk.positions[None], ctx, dense_mask(anchors, s, b))
            long = t.lm_head(h[0].view(-1, b, h.shape[-1])[:, 2:]).float()                        # [n, B-2, V]
            prev = ids[(anchors[:, None] + 1 + torch.arange(b - 2, device=dev)).clamp(max=s - 1)]   # [n, B-2]
            short = t.lm_head(head.hidden(t.embed_tokens(prev))).float()                            # [n, B-2, V]
        fused = long + self.alpha[:, None] * short - self.beta[:, None] * lp.to(dev).float()       # [n, B-2, V]
        sel = w > 0
        ce = F.cross_entropy(fused[sel], blk.labels.view(-1, b)[:, 2:][sel], reduction="none")
        return (ce * w[sel]).sum() / w[sel].sum()

    def training_step(self, batch, batch_idx):
        t = self._frozen[3]
        ids, lm = batch["ids"].to(self.device), batch["loss_mask"].to(self.device)
        with torch.no_grad():
            _, taps = t.forward(ids[None], 0, t.new_cache(), taps=self._frozen[0].config.target_layer_ids)
        loss = self.fused_loss(ids, lm, taps[0].clone(), self.global_step)
        if loss is None:
            return None
        self.log("train/loss", loss, prog_bar=True, batch_size=1)
        self.log_dict({f"train/alpha_k{k + 2}": a for k, a in enumerate(self.alpha.detach())}, batch_size=1)
        self.log_dict({f"train/beta_k{k + 2}": v for k, v in enumerate(self.beta.detach())}, batch_size=1)
        return loss

    def configure_optimizers(self):
        return adamw_cosine([self.alpha, self.beta], self.trainer, self.lr, 0.0, self.warmup_ratio)


def run_train_fusion_weights(cfg, out_dir) -> dict:
    """`task=train drafter=dels_* drafter.head.train.part=fusion_weights`: learn per-position alpha/beta
    for the configured (trained) backbone and head; writes fusion_weights.json beside the head when
    `train.export_dir` is the head's directory, else into the run directory. Use with `fusion=learned`."""
    from ..drafters.dflash import DFlashDraftModel, resolve_checkpoint
    from .tasks import _stage, lightning_fit, peak_memory_mb, prepare_sequences

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    d, tc = cfg.drafter, cfg.train
    check(bool(d.get("checkpoint")) and bool(d.head.get("checkpoint")),
          "drafter.head.train.part=fusion_weights needs trained parts: drafter.checkpoint=DIR and "
          "drafter.head.checkpoint=DIR")
    target = registry.build_target(cfg.target, resolve_device(cfg.device))
    bpath, hpath = resolve_checkpoint(str(d.checkpoint)), resolve_checkpoint(str(d.head.checkpoint))
    backbone = DFlashDraftModel.from_pretrained(bpath, dtype=target.dtype, device=target.device)
    head = dels.load_head(hpath, f"drafter.head.checkpoint={str(d.head.checkpoint)!r}").to(target.device, target.dtype)
    lp = dels.load_prior(hpath, target.vocab_size, d.prior.smoothing, str(hpath))
    seqs, data_hash = prepare_sequences(cfg, target)
    fu = OmegaConf.to_container(cfg.fusion, resolve=True)
    gamma = d.head.train.gamma
    run_dir = _stage(cfg, "fusion", {"data": data_hash, "backbone": str(bpath), "head": str(hpath),
                                     "init": [fu["alpha"], fu["beta"]], "anchors": d.head.train.num_anchors,
                                     "epochs": d.head.train.epochs, "lr": tc.lr, "seed": tc.seed})
    run_dir.mkdir(parents=True, exist_ok=True)
    module = FusionWeightsLitModule(backbone, head, lp, target, num_anchors=d.head.train.num_anchors, gamma=gamma,
                                    alpha=fu["alpha"], beta=fu["beta"], lr=tc.lr, warmup_ratio=tc.warmup_ratio,
                                    seed=tc.seed)
    trainer, seconds, _ = lightning_fit(OmegaConf.merge(cfg, {"train": {"epochs": d.head.train.epochs}}), module,
                                        _TokenSequences(seqs), run_dir, target.device)
    weights = {"alpha": [round(float(x), 6) for x in module.alpha.detach()],
               "beta": [round(float(x), 6) for x in module.beta.detach()],
               "init": {"alpha": fu["alpha"], "beta": fu["beta"]}, "steps": trainer.global_step,
               "train_seconds": seconds, "peak_memory_mb": peak_memory_mb(target.device), "data_hash": data_hash,
               "final_loss": float(trainer.logged_metrics.get("train/loss", float("nan"))),
               "command": "python -m specexp " + " ".join(sys.argv[1:])}
    dest = Path(tc.export_dir) if tc.export_dir else run_dir
    write_json(dest / FUSION_WEIGHTS_FILE, weights)
    write_json(out_dir / FUSION_WEIGHTS_FILE, weights)
    print(json.dumps(weights, indent=1))
    return weights
