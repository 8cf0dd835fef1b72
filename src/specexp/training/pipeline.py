"""`task=regenerate` and `task=train`: the DFlash training pipeline, each stage cached by a hash of what
produced it under `${paths.cache}/stages/`:

  regen-<hash>     the target's responses to the corpus prompts (resumable JSONL)
  features-<hash>  target taps of every training sequence (sharded safetensors; `data.features=cache`)
  train-<hash>     Lightning run (resumable checkpoints, metrics.csv) and the exported DFlash drafter

A stage whose output exists is reused, so rerunning the same command after an interruption continues where
it stopped, and a finished pipeline costs nothing to rerun.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .. import registry
from ..drafters.dflash import DFlashConfig, DFlashDraftModel, build_target_layer_ids, check_fits, init_weights
from ..errors import check
from ..targets import cache_root, resolve_device
from ..tracking import write_json
from . import data as D
from .anchors import default_gamma


def _target_fingerprint(cfg, target) -> dict:
    """What determines the target's outputs: its config minus paths and the drafters configured for it."""
    t = {k: v for k, v in OmegaConf.to_container(cfg.target, resolve=True).items()
         if k != "cache_dir" and not k.endswith("_checkpoint")}
    return {**t, "resolved_source": target.source}


def _stage(cfg, kind: str, payload: dict) -> Path:
    return cache_root(cfg.paths.cache) / "stages" / f"{kind}-{D.digest(payload)}"


def prepare_sequences(cfg, target) -> tuple[list[D.Sequence], str]:
    """Training sequences (regenerated and/or corpus answers) and a hash of their tokens."""
    dc = cfg.data
    convs = D.load_corpus(list(dc.corpus), dc.max_samples, dc.shuffle_seed, dc.get("corpus_dir"))
    seqs = []
    if dc.regenerate:
        r = dc.regen
        stage = _stage(cfg, "regen", {"target": _target_fingerprint(cfg, target), "corpus": list(dc.corpus),
                                      "max_samples": dc.max_samples, "seed": dc.shuffle_seed,
                                      "regen": OmegaConf.to_container(r, resolve=True)})
        stage.mkdir(parents=True, exist_ok=True)
        out = stage / "regen.jsonl"
        if not (stage / "DONE").exists():
            t0 = time.perf_counter()
            D.regenerate(target, convs, out, r.batch_size, r.max_new_tokens, r.temperature, r.top_p, r.top_k,
                         dc.shuffle_seed)
            lines = [json.loads(x) for x in out.read_text().splitlines()]
            write_json(stage / "DONE", {"sequences": len(lines), "seconds": time.perf_counter() - t0,
                                        "response_tokens": sum(len(x["response_ids"]) for x in lines),
                                        "stopped": sum(x["stopped"] for x in lines)})
        print(f"specexp: regenerated data {stage} {json.loads((stage / 'DONE').read_text())}", flush=True)
        seqs += D.sequences_from_regen(out, dc.max_length, dc.min_response_tokens)
    if dc.corpus_answers:
        seqs += D.sequences_from_corpus(target, convs, dc.max_length, dc.min_response_tokens)
    check(bool(seqs), "no training sequences: enable data.regenerate or data.corpus_answers, or raise data.max_samples")
    h = D.digest([s.ids.tolist() for s in seqs] + [[int(s.loss_mask.sum())] for s in seqs])
    return seqs, h


def drafter_config(cfg, target) -> tuple[DFlashConfig, Path | None]:
    d = cfg.drafter
    if d.init == "checkpoint" or (d.init == "auto" and d.get("checkpoint")):
        from ..drafters.dflash import resolve_checkpoint

        path = resolve_checkpoint(str(d.checkpoint))
        model = DFlashDraftModel.from_pretrained(path)
        check_fits(model.config, target, f"drafter.checkpoint={str(d.checkpoint)!r}")
        return model.config, path
    ids = list(d.target_layer_ids) if d.get("target_layer_ids") else build_target_layer_ids(target.num_layers,
                                                                                             d.num_layers)
    return DFlashConfig.for_target(target, d.num_layers, d.block_size, ids), None


def init_from_target(model: DFlashDraftModel, target) -> int:
    """Copy the target's top decoder layers into the draft layers (same parameter names, same shapes)."""
    tl = target.model.model.layers
    copied = 0
    for i, layer in enumerate(model.layers):
        src = dict(tl[len(tl) - len(model.layers) + i].named_parameters())
        for name, p in layer.named_parameters():
            if name in src and src[name].shape == p.shape:
                p.data.copy_(src[name].data.to(p.dtype))
                copied += 1
    model.norm.weight.data.copy_(target.model.model.norm.weight.data.to(model.norm.weight.dtype))
    return copied


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU (what Table 5 reports)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # Linux: KiB


def lightning_fit(cfg, module, dataset, run_dir: Path, monitor_device: torch.device):
    """Run Lightning on `module` over `dataset` (one sequence per batch) in `run_dir`, resuming from its last
    checkpoint. Returns (trainer, seconds, precision). Shared by every trainable part."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from .resume import EpochSampler, ResumeState, last_checkpoint  # exact resume: data order and generators

    tc, dev, sampler = cfg.train, monitor_device, EpochSampler(len(dataset), cfg.train.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, sampler=sampler, collate_fn=lambda xs: xs[0],
                                         generator=torch.Generator())
    loggers = [CSVLogger(str(run_dir), name="logs")]   # a resumed run logs to the next version_N, keeping the old
    if cfg.logger.name == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(project=cfg.logger.project, save_dir=str(run_dir), offline=True))
    precision = tc.precision if tc.precision != "auto" else ("bf16-mixed" if dev.type == "cuda" else "32-true")
    ckpt_dir = run_dir / "checkpoints"
    trainer = L.Trainer(
        accelerator="gpu" if dev.type == "cuda" else "cpu", devices=tc.devices, strategy=tc.strategy,
        precision=precision, max_epochs=tc.epochs, max_steps=tc.max_steps, gradient_clip_val=tc.grad_clip,
        accumulate_grad_batches=tc.accumulate, logger=loggers, log_every_n_steps=tc.log_every,
        callbacks=[ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=0,
                                   every_n_train_steps=tc.ckpt_every), ResumeState(sampler)],
        enable_progress_bar=True, enable_model_summary=False, default_root_dir=str(run_dir),
    )
    last = last_checkpoint(ckpt_dir)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    trainer.fit(module, loader, ckpt_path=last, weights_only=True)
    return trainer, time.perf_counter() - t0, precision


def fit(cfg, target, dataset, config: DFlashConfig, init_path: Path | None, run_dir: Path) -> dict:
    """Train in `run_dir` (resuming from its last checkpoint) and export the drafter to `run_dir/drafter`."""
    from .dflash_module import DFlashLitModule

    tc = cfg.train
    if init_path is not None:
        model = DFlashDraftModel.from_pretrained(init_path, dtype=torch.float32)
    else:
        model = init_weights(DFlashDraftModel(config), tc.seed)
        if tc.init_from_target:
            init_from_target(model, target)
    gamma = tc.gamma if tc.gamma is not None else default_gamma(config.block_size)
    common = dict(num_anchors=tc.num_anchors, gamma=gamma, lr=tc.lr, warmup_ratio=tc.warmup_ratio,
                  weight_decay=tc.weight_decay, attention=tc.attention, seed=tc.seed)
    if cfg.drafter.name == "dedit":
        from .dedit_module import DEditLitModule

        r = edit_recipe(cfg)
        module = DEditLitModule(model.float(), target, mix=r["mix"], mix_threshold=r["mix_threshold"],
                                plain_rate=r["plain_rate"], edit_weight=r["edit_weight"],
                                causal=r["editor"] == "causal", **common)
    else:
        module = DFlashLitModule(model.float(), target, **common)
    trainer, seconds, precision = lightning_fit(cfg, module, dataset, run_dir, target.device)
    out = run_dir / "drafter"
    model.save_pretrained(out, dtype=getattr(torch, tc.export_dtype))   # bf16, as the released drafters
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    card = {"steps": trainer.global_step, "train_seconds": seconds, "peak_memory_mb": peak_memory_mb(target.device),
            "final_metrics": metrics, "precision": precision, "gamma": gamma}
    write_json(run_dir / "train.json", card)
    return card


def edit_recipe(cfg) -> dict:
    """DEdit's training options (drafter.train_edit, validated; the editor mask is the one it will draft with)."""
    from ..errors import one_of
    from .dedit_module import MIXES

    t = cfg.drafter.train_edit
    one_of("drafter.train_edit.mix", t.mix, MIXES)
    one_of("drafter.edit.editor", cfg.drafter.edit.editor, ("bidirectional", "causal"))
    for name in ("mix_threshold", "plain_rate"):
        check(0.0 <= t[name] <= 1.0, f"drafter.train_edit.{name}={t[name]!r}: expected a probability in [0, 1]")
    return {"mix": t.mix, "mix_threshold": float(t.mix_threshold), "plain_rate": float(t.plain_rate),
            "edit_weight": float(t.edit_weight), "editor": cfg.drafter.edit.editor}


def card_markdown(card: dict) -> str:
    """The human-readable model card next to an exported drafter (card.json holds everything)."""
    fm = card.get("final_metrics", {})
    acc = [fm.get(f"train/acc_k{k}") for k in range(1, card["drafter"]["block_size"])]
    title = {"dflash": "DFlash", "dedit": "DEdit"}.get(card.get("kind", "dflash"), card.get("kind"))
    lines = [f"# {title} drafter for {card['target']} ({card['target_source']})", "",
             f"Produced by: `{card['command']}` (specexp; stage `{Path(card['run_dir']).name}`).", "",
             f"- data: {card['sequences']} sequences, {card['response_tokens']} response tokens, hash `{card['data_hash']}`",
             f"- drafter: {card['drafter']['num_hidden_layers']} layer(s), block {card['drafter']['block_size']}, "
             f"taps {card['drafter']['dflash_config']['target_layer_ids']}, "
             f"mask id {card['drafter']['dflash_config']['mask_token_id']}",
             f"- training: {card['steps']} steps in {card['train_seconds']:.0f} s, peak memory "
             f"{card['peak_memory_mb']:.0f} MiB, precision {card['precision']}, gamma {card['gamma']}",
             "- final per-position accuracy k=1..: " + ", ".join("–" if a is None else f"{a:.2f}" for a in acc),
             f"- final simulated acceptance length (train batch): {fm.get('train/tau_sim', float('nan')):.2f}"]
    if "eval" in card:
        e = card["eval"]
        lines += ["", f"Measured (greedy, {e['max_new_tokens']} new tokens; τ includes the bonus token):", "",
                  "| benchmark | τ | speedup |", "|---|---:|---:|"]
        for name, b in e["benchmarks"].items():
            sp = "–" if b["speedup"] is None else f"{b['speedup']:.2f}×"
            lines.append(f"| {name} | {b['tau']:.2f} | {sp} |")
    return "\n".join(lines) + "\n"


def run_regenerate(cfg, out_dir) -> dict:
    target = registry.build_target(cfg.target, resolve_device(cfg.device))
    seqs, h = prepare_sequences(cfg, target)
    summary = {"sequences": len(seqs), "tokens": sum(len(s.ids) for s in seqs),
               "response_tokens": sum(int(s.loss_mask.sum()) for s in seqs), "data_hash": h}
    write_json(Path(out_dir) / "data.json", summary)
    print(f"specexp: {summary}", flush=True)
    return summary


def training_dataset(cfg, target, layer_ids: list[int], seqs, data_hash: str):
    """Sequences with target taps: from the feature cache (built once) or computed online in each step."""
    if cfg.data.features == "cache":
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[cfg.data.feature_dtype]
        meta = {"target": _target_fingerprint(cfg, target), "layer_ids": layer_ids,
                "dtype": cfg.data.feature_dtype, "data_hash": data_hash}
        cache = D.FeatureCache(_stage(cfg, "features", meta), meta)
        if not cache.complete:
            cache.build(target, seqs, layer_ids, dtype, cfg.data.shard_tokens)
        return cache.dataset()
    check(cfg.data.features == "online", f"data.features={cfg.data.features!r} is not valid; choose cache or online")
    return D.OnlineSequences(seqs)


def run_train(cfg, out_dir) -> dict:
    """`task=train drafter=dflash`: data -> features -> Lightning -> DFlash checkpoint (+ export, + eval).
    `drafter=dels_rnn|dels_markov` trains the local head instead (training/local_heads.py)."""
    if cfg.drafter.name in ("dels_rnn", "dels_markov"):
        from .local_heads import run_train_head

        return run_train_head(cfg, out_dir)
    if cfg.drafter.name == "domino_ft":
        from .domino_module import run_train_domino

        return run_train_domino(cfg, out_dir)
    check(cfg.drafter.name in ("dflash", "dedit"), f"task=train: drafter={cfg.drafter.name} has nothing to train; "
                                                   f"choose dflash, dels_rnn, dels_markov, domino_ft or dedit")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    target = registry.build_target(cfg.target, device)
    config, init_path = drafter_config(cfg, target)
    seqs, data_hash = prepare_sequences(cfg, target)
    dataset = training_dataset(cfg, target, list(config.target_layer_ids), seqs, data_hash)
    train_cfg = {k: v for k, v in OmegaConf.to_container(cfg.train, resolve=True).items()
                 if k not in ("export_dir", "export_dtype", "eval_after", "log_every", "ckpt_every")}
    payload = {"data": data_hash, "drafter": config.to_dict(), "init": str(init_path), "train": train_cfg,
               "features": cfg.data.features}
    if cfg.drafter.name == "dedit":                    # the editing objective (training/dedit_module.py)
        payload["edit"] = edit_recipe(cfg)
    run_dir = _stage(cfg, "train", payload)
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "train.json").exists() and (run_dir / "drafter" / "config.json").exists():
        card = json.loads((run_dir / "train.json").read_text())
        print(f"specexp: reusing trained drafter {run_dir / 'drafter'}", flush=True)
    else:
        card = fit(cfg, target, dataset, config, init_path, run_dir)
    if cfg.drafter.name == "dedit":
        card["edit"] = payload["edit"]
    card = {**card, "kind": cfg.drafter.name, "command": "python -m specexp " + " ".join(sys.argv[1:]),
            "data_hash": data_hash,
            "sequences": len(seqs), "response_tokens": sum(int(s.loss_mask.sum()) for s in seqs),
            "target": target.name, "target_source": target.source, "drafter": config.to_dict(),
            "train": train_cfg, "run_dir": str(run_dir)}
    drafter_dir = run_dir / "drafter"
    if cfg.train.export_dir:
        drafter_dir = Path(cfg.train.export_dir)
        DFlashDraftModel.from_pretrained(run_dir / "drafter").save_pretrained(
            drafter_dir, dtype=getattr(torch, cfg.train.export_dtype))
    if cfg.train.eval_after:
        from ..eval.evaluator import run_eval

        ecfg = OmegaConf.merge(cfg, {"drafter": {"init": "checkpoint", "checkpoint": str(drafter_dir)}})
        summary = run_eval(ecfg, out_dir / "eval")
        card["eval"] = {"benchmarks": {k: {"tau": v["tau"], "speedup": v["speedup"]}
                                       for k, v in summary["benchmarks"].items()}, "macro": summary["macro"],
                        "max_new_tokens": summary["max_new_tokens"]}
    write_json(drafter_dir / "card.json", card)
    (drafter_dir / "README.md").write_text(card_markdown(card))
    write_json(out_dir / "train_summary.json", card)
    print(json.dumps({k: card[k] for k in ("steps", "train_seconds", "peak_memory_mb", "final_metrics")}, indent=1))
    return card
