"""`task=train` and `task=regenerate`: the one training sequence every trainable part goes through.

    target -> sequences -> [features] -> the drafter's TrainPlan -> stage `<kind>-<hash>` (reuse, or a
    resumable Lightning fit) -> artifact directory + card -> [export] -> [eval] -> run directory

Every stage is cached under `${paths.cache}/stages/` by a hash of what produced it:

  regen-<hash>     the target's responses to the corpus prompts (resumable JSONL)
  features-<hash>  target taps of every training sequence (sharded safetensors; `data.features=cache`)
  <kind>-<hash>    the Lightning run (resumable checkpoints, metrics.csv) and the trained artifact

so rerunning a command after an interruption continues where it stopped, and a finished pipeline costs
nothing to rerun. On several processes (DDP / FSDP, training/distributed.py) every rank runs this sequence; a
stage is built once (under its lock) and global rank 0 alone writes the artifact, the card, the export and the
run directory. A trainable drafter provides only its `plan` (its registry entry's `train`): what determines
its weights, its dataset, its LightningModule, how to save the result and how evaluation loads it back. The run
directory gets `train_summary.json` (with `"checkpoint"`: where the trained artifact is) and a `checkpoint` link
to it.
"""
from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf

from .. import log, registry
from ..config import Config, DataConfig, FusionConfig, TrainConfig, checked
from ..errors import check
from ..files import replace_atomic, write_json, write_text_atomic
from ..machine import resolve_device
from ..paths import cache_root
from ..rundir import claimed_for
from ..targets.hf import DTYPES, target_settings
from . import data as D
from .distributed import Placement, device_check, make_strategy, placement, whole_module


# ------------------------------------------------------------------------------------------- stages
def target_fingerprint(target_cfg, target) -> dict:
    """What determines the target's outputs: its config minus local paths, plus the weights actually loaded."""
    return {**target_settings(target_cfg, target.device), "resolved_source": target.source}


def stage_dir(stages: Path, kind: str, payload: dict) -> Path:
    return stages / f"{kind}-{D.digest(payload)}"


@contextmanager
def stage_lock(stage: Path):
    """An exclusive lock on `stage/.lock` while a stage is checked and built: ranks that a launcher starts together
    (torchrun, srun) run the stages before the fit at once; the first builds, the others wait here and then find
    the stage done. Released when the file closes, or when its holder dies."""
    stage.mkdir(parents=True, exist_ok=True)
    with open(stage / ".lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def prepare_sequences(data, target_cfg, target, stages: Path) -> tuple[list[D.Sequence], str]:
    """Training sequences of the `data` group (regenerated and/or corpus answers) and a hash of their tokens
    (with `data.source=hub`, of the data set's id, revision and options too)."""
    data = DataConfig.of(data)
    hub = D.hub_spec(data.hub.to_dict()) if data.source == "hub" else None
    if hub is None:
        convs = D.load_corpus(list(data.corpus), data.max_samples, data.shuffle_seed, data.corpus_dir)
    else:
        convs = D.load_hub(hub, data.max_samples, data.shuffle_seed)
    seqs = []
    if data.regenerate:
        r = data.regen
        payload = {"target": target_fingerprint(target_cfg, target), "corpus": list(data.corpus),
                   "max_samples": data.max_samples, "seed": data.shuffle_seed,
                   "regen": r.to_dict(), **({"hub": hub} if hub else {})}
        if data.corpus_dir:          # other files under the same corpus names: their prompts key the stage
            payload["prompts"] = D.digest([[c.id, c.user] for c in convs])
        stage = stage_dir(stages, "regen", payload)
        out = stage / "regen.jsonl"
        with stage_lock(stage):             # ranks started together build it once (stage_lock)
            if not (stage / "DONE").exists():
                t0 = time.perf_counter()
                if data.regen_import:
                    n = D.import_regen(data.regen_import, target, convs, out, r.to_dict())
                    log.LOG.info(f"{n} responses imported from {data.regen_import}")
                D.regenerate(target, convs, out, r.batch_size, r.max_new_tokens, r.temperature, r.top_p, r.top_k,
                             data.shuffle_seed, data.max_length)
                lines = [json.loads(x) for x in out.read_text().splitlines()]
                write_json(stage / "DONE", {"sequences": len(lines), "seconds": time.perf_counter() - t0,
                                            "response_tokens": sum(len(x["response_ids"]) for x in lines),
                                            "stopped": sum(x["stopped"] for x in lines)})
            log.LOG.info(f"regenerated data {stage} {json.loads((stage / 'DONE').read_text())}")
            if data.regen_export:
                prov = {"target_source": target.source, "target": payload["target"],
                        "regen": payload["regen"], "corpus": payload["corpus"], "max_samples": data.max_samples}
                log.LOG.info(f"packed {D.export_regen(out, Path(data.regen_export), prov)} into {data.regen_export}")
        seqs += D.sequences_from_regen(out, data.max_length, data.min_response_tokens)
    if data.corpus_answers:
        seqs += D.sequences_from_corpus(target, convs, data.max_length, data.min_response_tokens)
    check(bool(seqs), "no training sequences: enable data.regenerate or data.corpus_answers, or raise data.max_samples")
    h = D.digest([s.ids.tolist() for s in seqs] + [[int(s.loss_mask.sum())] for s in seqs]
                 + ([{"hub": hub}] if hub else []))
    return seqs, h


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU (what Table 5 reports)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # Linux: KiB


def peak_memory_reserved_mb(device: torch.device) -> float | None:
    """Peak memory the CUDA caching allocator reserved (allocated + cached blocks); None off CUDA, where RSS is
    the one figure. DeLS-Spec Table 5 reports training memory; the card keeps both CUDA figures."""
    return torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else None


# ---------------------------------------------------------------------------------------- the context
@dataclass
class TrainContext:
    """What a drafter's `plan` gets: the built target, the training sequences and the config groups that
    concern training (never the root config)."""

    target: object
    target_cfg: object
    seqs: list[D.Sequence]
    data_hash: str
    drafter: object               # the `drafter` group's view (its settings class; checkpoint defaults filled in)
    train: TrainConfig            # the `train` group (its typed view)
    data: DataConfig              # the `data` group (its typed view)
    fusion: FusionConfig          # the `fusion` group (DeLS learned weights start from it)
    stages: Path
    subset: dict | None = None    # train.data_tokens: `seqs` is that nested subset ({data_tokens, seed}), else None

    @property
    def response_tokens(self) -> int:
        return sum(int(s.loss_mask.sum()) for s in self.seqs)

    def dataset(self, layer_ids: list[int]):
        """Sequences with target taps `layer_ids`: from the feature cache (built once) or computed in each step."""
        data, target = self.data, self.target
        if data.features == "cache":
            dtype = DTYPES[data.feature_dtype]
            meta = {"target": target_fingerprint(self.target_cfg, target), "layer_ids": list(layer_ids),
                    "dtype": data.feature_dtype, "data_hash": self.data_hash,
                    **({"subset": self.subset} if self.subset else {})}     # a subset's cache holds only its own
            root = stage_dir(self.stages, "features", meta)
            if not (root / "index.json").exists():
                wider = D.wider_cache(self.stages, meta, target.hidden_size)
                if wider is not None:              # taps of more layers, same target and data: read its columns
                    log.LOG.info(f"taps {list(layer_ids)} read from the feature cache {wider.root}")
                    return wider
            with stage_lock(root):                 # ranks started together build it once
                cache = D.FeatureCache(root, meta)
                if not cache.complete:
                    cache.build(target, self.seqs, list(layer_ids), dtype, data.shard_tokens)
            return cache.dataset()
        check(data.features == "online", f"data.features={data.features!r} is not valid; choose cache or online")
        return D.OnlineSequences(self.seqs)

    def token_dataset(self):
        """Sequences without target taps (the local heads train on tokens alone)."""
        return D.OnlineSequences(self.seqs)


@dataclass
class TrainPlan:
    """A drafter's part of the pipeline. `payload` must hold everything that determines the trained weights: it
    names the stage, so a changed recipe trains anew and an unchanged one is reused."""

    kind: str                                       # stage prefix, e.g. dflash, dels_rnn, domino_ft, fusion
    title: str                                      # card heading, e.g. "DFlash drafter (1 layer, block 8)"
    payload: dict
    dataset: object
    module: Callable[[], object]                    # builds the seeded LightningModule (only if training runs)
    save: Callable[[object, Path], None]            # writes the trained artifact into a directory
    epochs: int | None = None                       # None = train.epochs
    eval_overrides: Callable[[str], dict] | None = None   # drafter keys that make eval load the artifact at a path
    facts: dict = field(default_factory=dict)       # static facts for the card (architecture, recipe)
    card: bool = True                               # write card.json / README.md beside the artifact
    fsdp_wrap: tuple[type, ...] = ()                # module classes that are FSDP units of their own (a block)


# ------------------------------------------------------------------------------------------- Lightning
def wandb_logger(logger, run_dir: Path, config: dict):
    """Lightning's W&B logger with what the dashboards group by (tracking.wandb_run_args: group = the sweep,
    job type = the task, config + run_info); offline unless a key or logger.mode says otherwise."""
    from lightning.pytorch.loggers import WandbLogger

    from ..tracking import wandb_mode, wandb_run_args

    mode = wandb_mode(logger.mode, os.environ)       # WANDB_MODE=offline is never overridden
    # mode= goes to wandb.init as is (Lightning's offline=True would rewrite WANDB_MODE in the environment)
    return WandbLogger(project=logger.project, entity=logger.entity, save_dir=str(run_dir), mode=mode,
                       tags=list(logger.tags or []), **wandb_run_args(config, run_dir))


def _throughput(device):
    """A callback logging `train/throughput` (optimiser steps per second since its last log) and
    `train/peak_memory_mb` every `log_every` steps (made here: lightning is imported on first use)."""
    import lightning as L

    class Throughput(L.Callback):
        def __init__(self):
            self.t, self.step = None, 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now, step = time.perf_counter(), trainer.global_step
            if self.t is not None and step > self.step and step % trainer.log_every_n_steps == 0:
                pl_module.log_dict({"train/throughput": (step - self.step) / (now - self.t),
                                    "train/peak_memory_mb": peak_memory_mb(device)}, batch_size=1)
            if self.t is None or step % trainer.log_every_n_steps == 0:
                self.t, self.step = now, step

    return Throughput()


def lightning_fit(train, logger, module, dataset, run_dir: Path, device: torch.device, epochs: int | None = None,
                  wandb_config: dict | None = None, wandb_dir: Path | None = None, where: Placement | None = None,
                  wrap: tuple[type, ...] = ()):
    """Run Lightning on `module` over `dataset` (one sequence per batch) in `run_dir`, resuming from its last
    checkpoint, on `where` (training/distributed.py; default: `device` and the `train` keys), FSDP units per `wrap`
    class. Returns (trainer, timing, precision), timing = {"train_seconds", "timed_from_step"}: the seconds trained
    over every segment of a resumed run (resume.ResumeState). The only place a Trainer is made."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from .resume import EpochSampler, ResumeState, last_checkpoint  # exact resume: data order and generators

    tc = TrainConfig.of(train)
    sampler = EpochSampler(len(dataset), tc.seed)
    state = ResumeState(sampler)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, sampler=sampler, collate_fn=lambda xs: xs[0],
                                         generator=torch.Generator())
    loggers = [CSVLogger(str(run_dir), name="logs")]   # a resumed run logs to the next version_N, keeping the old
    callbacks = []
    if logger is not None and logger.name == "wandb":
        loggers.append(wandb_logger(logger, Path(wandb_dir or run_dir), wandb_config or {}))
        from lightning.pytorch.callbacks import LearningRateMonitor

        callbacks = [LearningRateMonitor(logging_interval="step"), _throughput(device)]
    p = where or placement(str(device), tc)
    precision = tc.precision if tc.precision != "auto" else ("bf16-mixed" if device.type == "cuda" else "32-true")
    ckpt_dir = run_dir / "checkpoints"
    trainer = L.Trainer(
        accelerator=p.accelerator, devices=p.devices, num_nodes=p.num_nodes,
        strategy=make_strategy(p, tc.fsdp, wrap), use_distributed_sampler=False,   # the sampler shards itself
        precision=precision, max_epochs=tc.epochs if epochs is None else epochs, max_steps=tc.max_steps,
        gradient_clip_val=tc.grad_clip, accumulate_grad_batches=tc.accumulate, logger=loggers,
        log_every_n_steps=tc.log_every,
        callbacks=[ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=0,
                                   every_n_train_steps=tc.ckpt_every), state, device_check(p.device),
                   *callbacks],
        enable_progress_bar=True, enable_model_summary=False, default_root_dir=str(run_dir),
    )
    last = last_checkpoint(ckpt_dir)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with warnings.catch_warnings():     # Lightning's "dataloader is not resumable": resume.py makes a resume exact
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        trainer.fit(module, loader, ckpt_path=last, weights_only=True)
    return trainer, state.timing(trainer.global_step), precision


# ------------------------------------------------------------------------------------------------ cards
def timed_from(card: dict, short: bool = False) -> str:
    """The caveat of a card whose time does not cover every step (resumed from a checkpoint without a time)."""
    n = card.get("timed_from_step", 0)
    if not n:
        return ""
    return f" (steps {n}–{card['steps']} only)" if short else (f" (steps {n}..{card['steps']} only: the checkpoint it "
                                                               f"resumed from kept no time)")


def card_markdown(card: dict) -> str:
    """The human-readable card next to a trained artifact (card.json holds everything)."""
    fm = card.get("final_metrics", {})
    per_pos = sorted((int(k.rsplit("_k", 1)[1]), v) for k, v in fm.items() if k.startswith("train/acc_k"))
    lines = [f"# {card['title']} for {card['target']} ({card['target_source']})", "",
             f"Produced by: `{card['command']}` (specexp; stage `{Path(card['run_dir']).name}`).", "",
             f"- data: {card['sequences']} sequences, {card['response_tokens']} response tokens, "
             f"hash `{card['data_hash']}`",
             *(f"- {k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}"
               for k, v in card.get("facts", {}).items()),
             f"- training: {card['steps']} steps in {card['train_seconds']:.0f} s{timed_from(card)}, peak memory "
             f"{card['peak_memory_mb']:.0f} MiB, precision {card['precision']}, "
             f"{card['trainable_params']:,} trainable parameters",
             "- final train metrics: " + ", ".join(f"{k.removeprefix('train/')} {v:.3f}" for k, v in sorted(fm.items())
                                                   if not k.startswith("train/acc_k"))]
    if per_pos:
        lines.append("- final per-position accuracy k=" + ", ".join(f"{k}: {v:.2f}" for k, v in per_pos))
    if "eval" in card:
        e = card["eval"]
        lines += ["", f"Measured ({e['decoding']}, {e['max_new_tokens']} new tokens; τ includes the bonus token):", "",
                  "| benchmark | τ | speedup |", "|---|---:|---:|"]
        for name, b in e["benchmarks"].items():
            sp = "–" if b["speedup"] is None else f"{b['speedup']:.2f}×"
            lines.append(f"| {name} | {b['tau']:.2f} | {sp} |")
    return "\n".join(lines) + "\n"


def _link(run_dir: Path, final: Path) -> None:
    """`run_dir/checkpoint` -> the trained artifact (a symlink; a copy where links are not possible)."""
    link = run_dir / "checkpoint"
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    try:
        link.symlink_to(final.resolve(), target_is_directory=True)
    except OSError:
        shutil.copytree(final, link)


# ---------------------------------------------------------------------------------------------- the tasks
def context(cfg, device: torch.device | None = None, lean: bool = False, typed: Config | None = None) -> TrainContext:
    """The edge of training: build the target (on `device`, default the `device` key; `lean`: without its decoder
    layers, for training that reads tokens alone) and the sequences from the root config, once. `typed`: the
    checked config (config.checked)."""
    typed = checked(cfg, typed)
    target = registry.build_target(cfg.target, device or resolve_device(cfg.device), lean=lean)
    stages = cache_root(typed.paths.cache) / "stages"
    seqs, data_hash = prepare_sequences(typed.data, cfg.target, target, stages)
    return TrainContext(target, cfg.target, seqs, data_hash, registry.drafter_view(cfg.drafter),
                        typed.train, typed.data, typed.fusion, stages)


def run_train(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=train drafter=NAME`: the drafter's plan through the shared sequence (module docstring). The run
    directory is claimed as every task's is (eval/store.py: busy or holding another run's results -> refused) by
    the launch's rank 0; the other ranks write nothing there."""
    # before anything is built: a run that cannot be placed is one line
    typed = checked(cfg, typed)
    where = placement(cfg.device, typed.train)
    if where.launch_rank != 0:
        return _train(cfg, typed, Path(out_dir), where)
    with claimed_for(out_dir, "train") as d:
        return _train(cfg, typed, d, where)


def _train(cfg, typed: Config, out_dir: Path, where: Placement) -> dict:
    """The sequence of the module docstring: sequences -> plan -> train or reuse the stage -> export -> card."""
    plan_fn = registry.trainer(cfg.drafter.name)
    lean = registry.train_tokens_only(cfg.drafter)   # the DeLS heads: the vocabulary matrices, no decoder layer
    ctx = context(cfg, where.device, lean, typed)    # this rank's target on this rank's device
    ctx, subset, whole = data_subset(ctx)
    plan: TrainPlan = plan_fn(ctx)
    run_dir = stage_dir(ctx.stages, plan.kind, {**plan.payload, "data": ctx.data_hash, **subset})
    run_dir.mkdir(parents=True, exist_ok=True)
    trained = train_or_reuse(cfg, typed, ctx, plan, run_dir, out_dir, where)
    if trained.rank != 0:                             # ranks started together (torchrun, srun): rank 0 writes
        return {"rank": trained.rank, "steps": trained.result["steps"]}
    final = export(run_dir / "artifact", ctx.train.export_dir)
    card = make_card(ctx, plan, trained.result, run_dir, final, whole, lean)
    if ctx.train.eval_after and plan.eval_overrides is not None:
        card["eval"] = evaluate(cfg, plan, final, out_dir)
    write_card(card, plan, final, out_dir)
    if trained.trainer is not None:
        _wandb_finish(trained.trainer, card, final)
    result = trained.result
    log.LOG.info(f"trained {plan.kind}: {final} ({result['steps']} steps, {result['train_seconds']:.0f} s"
                 f"{timed_from(result)}, "
                 f"peak {result['peak_memory_mb']:.0f} MiB)")
    return card


def data_subset(ctx: TrainContext) -> tuple[TrainContext, dict, dict]:
    """`train.data_tokens`: one point of a data-scaling curve, a nested random subset of the sequences taken before
    the plan (so features are computed for the subset alone). Returns the context to train on, what the subset adds
    to the stage's name, and the whole data's size for the card (both empty without a budget)."""
    tc = ctx.train
    if tc.data_tokens is None:
        return ctx, {}, {}
    idx = D.token_subset(ctx.seqs, int(tc.data_tokens), tc.seed)
    subset = {"data_tokens": int(tc.data_tokens)}
    whole = {"data_sequences": len(ctx.seqs), "data_response_tokens": ctx.response_tokens}
    return replace(ctx, seqs=[ctx.seqs[i] for i in idx], subset={**subset, "seed": int(tc.seed)}), subset, whole


@dataclass
class Trained:
    result: dict                  # train.json: steps, seconds, peak memory, precision, final metrics, parameters
    trainer: object | None        # the Lightning trainer when this call trained (None: the stage was reused)
    rank: int = 0                 # not 0: a rank other than the one that writes (it stops here)


def train_or_reuse(cfg, typed: Config, ctx: TrainContext, plan: TrainPlan, run_dir: Path, out_dir: Path,
                   where: Placement) -> Trained:
    """The stage's trained artifact (`run_dir/artifact`, with `train.json`): reused when the stage finished before
    (a reused stage logs nothing), else trained, resuming from the stage's last Lightning checkpoint. Global rank 0
    alone saves the whole trained module (gathered under FSDP); the artifact appears whole or not at all."""
    tc, device, artifact = ctx.train, ctx.target.device, run_dir / "artifact"
    if (run_dir / "train.json").exists() and artifact.is_dir():
        result = json.loads((run_dir / "train.json").read_text())
        if where.launch_rank != 0:
            return Trained(result, None, where.launch_rank)
        log.LOG.info(f"reusing {artifact}")
        return Trained(result, None)
    module = plan.module()
    trainer, timing, precision = lightning_fit(tc, typed.logger, module, plan.dataset, run_dir, device, plan.epochs,
                                                OmegaConf.to_container(cfg, resolve=True), out_dir, where,
                                                plan.fsdp_wrap)
    try:
        trained = whole_module(trainer, module, plan.module)     # global rank 0 only (gathered under FSDP)
        if trained is not None:
            tmp = run_dir / "artifact.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            plan.save(trained, tmp)
            shutil.rmtree(artifact, ignore_errors=True)
            os.replace(tmp, artifact)             # the artifact appears whole or not at all
            result = {"steps": trainer.global_step, **timing,
                      "peak_memory_mb": peak_memory_mb(device),
                      "peak_memory_reserved_mb": peak_memory_reserved_mb(device), "precision": precision,
                      "final_metrics": {k: float(v) for k, v in trainer.logged_metrics.items()},
                      "trainable_params": sum(p.numel() for p in trained.parameters() if p.requires_grad)}
            write_json(run_dir / "train.json", result)
    finally:                                      # also when rank 0 failed: no rank waits for it forever
        trainer.strategy.barrier("specexp.artifact")
    if not trainer.is_global_zero:                # the other ranks leave, having written nothing
        log.LOG.info(f"rank {trainer.global_rank} trained {trainer.global_step} steps; rank 0 writes {artifact}")
        return Trained({"steps": trainer.global_step}, trainer, trainer.global_rank)
    return Trained(result, trainer)


def export(artifact: Path, export_dir) -> Path:
    """Where the trained artifact is handed out: `train.export_dir`, into which the artifact's files are copied
    (each replaced atomically; what else is there stays), or else the stage's artifact directory itself."""
    if not export_dir:
        return artifact
    final = Path(export_dir)
    final.mkdir(parents=True, exist_ok=True)
    for f in sorted(artifact.iterdir()):          # the artifact's files only: what else is there stays
        if f.is_file():
            replace_atomic(final / f.name, lambda tmp, f=f: shutil.copy2(f, tmp))
    return final


def make_card(ctx: TrainContext, plan: TrainPlan, result: dict, run_dir: Path, final: Path, whole: dict,
              lean: bool) -> dict:
    """card.json: the training result, what was trained on what data, the command and where the artifact is."""
    seqs, tc = ctx.seqs, ctx.train
    train, recipe = tc.to_dict(), plan.facts.get("recipe", {})
    train.update({k: recipe[k] for k in train.keys() & recipe.keys()})  # a head's own drafter.head.train values
    return {**result, "kind": plan.kind, "title": plan.title, "facts": plan.facts,
            "command": "python -m specexp " + " ".join(sys.argv[1:]), "data_hash": ctx.data_hash,
            "sequences": len(seqs), "response_tokens": sum(int(s.loss_mask.sum()) for s in seqs),
            **whole,
            "target": ctx.target.name,
            "target_parts": "embedding and lm_head only" if lean else "whole",
            "target_source": ctx.target.source, "train": train,
            "run_dir": str(run_dir), "checkpoint": str(final.resolve())}


def evaluate(cfg, plan: TrainPlan, final: Path, out_dir: Path) -> dict:
    """`train.eval_after`: the trained artifact evaluated as `task=eval` would (into `out_dir/eval`); the card's
    summary of it."""
    from ..eval.evaluator import run_eval  # the one upward call: training hands its result to evaluation

    summary = run_eval(OmegaConf.merge(cfg, {"drafter": plan.eval_overrides(str(final))}), out_dir / "eval")
    return {"benchmarks": {k: {"tau": v["tau"], "speedup": v["speedup"]} for k, v in summary["benchmarks"].items()},
            "macro": summary["macro"], "max_new_tokens": summary["max_new_tokens"],
            "decoding": summary["decoding"]["protocol"]}


def write_card(card: dict, plan: TrainPlan, final: Path, out_dir: Path) -> None:
    """The card beside the artifact (card.json + README.md, unless the plan has none), the run directory's
    train_summary.json and its `checkpoint` link."""
    if plan.card:
        write_json(final / "card.json", card)
        write_text_atomic(final / "README.md", card_markdown(card))
    write_json(out_dir / "train_summary.json", card)
    _link(out_dir, final)


def _wandb_finish(trainer, card: dict, final: Path) -> None:
    """The training cost as W&B summary keys (the Table 5 dashboard) and the exported checkpoint with its card as
    an artifact, when Lightning logged to W&B."""
    from lightning.pytorch.loggers import WandbLogger

    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger):
            import wandb

            run = lg.experiment
            run.summary.update({f"train/{k}": card[k] for k in ("steps", "train_seconds", "timed_from_step",
                                                                 "peak_memory_mb", "trainable_params") if k in card})
            art = wandb.Artifact(f"{card['kind']}-{Path(card['run_dir']).name}", type="model",
                                 metadata={k: v for k, v in card.items() if k not in ("train", "final_metrics")})
            art.add_dir(str(final))
            run.log_artifact(art)
            run.finish()


def run_regenerate(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=regenerate`: the training sequences alone (the target's own answers, cached)."""
    with claimed_for(out_dir, "regenerate") as d:    # never into another run's directory, nor while one runs there
        ctx = context(cfg, typed=typed)
        summary = {"sequences": len(ctx.seqs), "tokens": sum(len(s.ids) for s in ctx.seqs),
                   "response_tokens": ctx.response_tokens, "data_hash": ctx.data_hash}
        write_json(d / "data.json", summary)
    log.LOG.info(f"{summary}")
    return summary
