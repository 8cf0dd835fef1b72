"""`task=replay`: τ of a drafter without decoding.

Under greedy decoding a lossless drafter's output is the target's own greedy continuation (the reference,
eval/references.py), whatever it drafts. So the rounds the engine would run are determined by the reference
alone, and replay runs them without the target in the loop:

  taps, logits = target over prompt + reference[:-1], teacher-forced, in one forward (cached on disk by
                 reference and tap layers, so every drafter reading the same taps shares it)
  drafter.reset(); drafter.prefill(taps of the prompt)
  anchor j = 0 (reference[j] at position P + j), produced = 1
  while the reference goes on and produced < max_new_tokens:
      k = min(K, max_new_tokens - produced - 1)           the engine's budget cap
      drafts = drafter.propose(reference[j], P + j, k)
      n = leading drafts equal to reference[j+1 ..]       what greedy verification would accept
      committed = n + 1 (the bonus), or n when the drafts ran through the final stop token (engine truncation)
      drafter.commit(n, taps of positions P+j .. P+j+n)   exactly the engine's commit
      j += committed

This is the engine's loop (decoding/engine.py) with verification replaced by a comparison with the reference.
The one difference is numerical: the taps and the target's argmax come from one teacher-forced pass instead of
incremental blocks, which changes float rounding. Where the target's top-2 logit gap is tiny that can flip an
argmax; replay flags every round whose verified positions include a gap below `replay.near_tie`, so a reader can
see that they account for every difference from an online run.

Writes what `task=eval` writes (samples.jsonl with each turn's accept_lengths and output token ids, summary.json
with `"mode": "replay"` and 95% CIs, summary.md), without timing fields.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from .. import files, log
from ..config import Config, ReplayConfig
from ..decoding.engine import DecodeConfig, Generation, drafts_per_round
from ..decoding.settings import draft_vocab
from ..decoding.tree import follow
from ..errors import UserError, check, invariant
from ..targets.hf import target_settings
from ..tracking import run_info
from . import metrics, run, shards
from .references import (
    ReferenceStore,
    VllmReferences,
    batch_engine,
    compute_references,
    set_fingerprint,
    turns_with_prompts,
)
from .store import ResultStore
from .summary import capped, checkpoint_digests, vocab_settings
from .vllm_side import side_python, vllm_version

_log = log.get(__name__)


@torch.inference_mode()
def teacher_forced(target, prompt: list[int], ref: list[int], taps) -> dict[str, torch.Tensor | None]:
    """One target pass over `prompt + ref[:-1]`: the taps of every position (what the drafter would be handed)
    and, for each reference token `ref[i]`, the target's argmax and top-2 logit gap at the position predicting it."""
    ids = torch.tensor([prompt + ref[:-1]], device=target.device)                      # [1, T]
    logits, hidden = target.forward(ids, 0, target.new_cache(), taps=taps)              # [1, T, V], [1, T, nH]
    pred = logits[0, len(prompt) - 1:].float()                                           # [R, V]
    return {"taps": hidden, "argmax": pred.argmax(-1).cpu(), "gap": metrics.top2_gap(pred).cpu()}


def _tap_file(root: Path, ref_hash: str, taps, key: str, turn: int) -> Path:
    layers = "-".join(map(str, taps)) or "none"
    return root / ref_hash / f"taps-{layers}" / f"{key}-t{turn}.safetensors"


def _wider_tap_file(path: Path, taps) -> tuple[Path, torch.Tensor] | None:
    """The same turn's cached file of a tap set that includes every layer of `taps` (e.g. EAGLE-3's three of
    DFlash's five), with the columns of `taps` in it; None when there is none (or `taps` is empty)."""
    if not taps:
        return None
    for other in sorted(path.parent.parent.glob(f"taps-*/{path.name}")):
        have = [int(x) for x in other.parent.name.removeprefix("taps-").split("-") if x.isdigit()]
        if set(taps) <= set(have) and list(taps) != have:
            from safetensors import safe_open

            try:
                with safe_open(str(other), framework="pt") as f:
                    width = f.get_slice("taps").get_shape()[-1] // len(have)
            except Exception:         # a damaged file: not a source (its own turn recomputes and rewrites it)
                continue
            cols = torch.cat([torch.arange(have.index(t) * width, (have.index(t) + 1) * width) for t in taps])
            return other, cols
    return None


def cached_teacher_forced(target, prompt, ref, taps, path: Path | None) -> dict:
    """`teacher_forced`, read from / written to `path` (safetensors) when given; a cached file that is damaged or
    holds another turn's shapes is said in one warning line and computed again (the cache is never trusted)."""
    from safetensors.torch import load_file, save_file

    def read(file: Path, cols=None) -> dict | None:
        """The cached pass in `file` (the columns `cols` of its taps), or None, with one warning line, when the file
        is damaged or does not hold this turn's pass (a cut write, another length): the cache is never trusted."""
        try:
            d = load_file(file, device=str(target.device))
            tf = {"taps": d.get("taps") if cols is None else d["taps"][..., cols], "argmax": d["argmax"].cpu(),
                  "gap": d["gap"].cpu()}
            fault = next((f"{k} holds {list(tf[k].shape)}, expected [{len(ref)}]" for k in ("argmax", "gap")
                          if list(tf[k].shape) != [len(ref)]), None)
            n = len(prompt) + len(ref) - 1
            t = tf["taps"]
            if fault is None and taps and (t is None or t.dim() != 3 or tuple(t.shape[:2]) != (1, n)):
                fault = f"taps hold {list(t.shape) if t is not None else 'nothing'}, expected [1, {n}, ...]"
        except Exception as e:       # safetensors' SafetensorError, OSError, a missing tensor: all mean "damaged"
            fault = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if fault is None:
            _log.debug(f"taps {list(taps)} of {len(ref)} reference tokens read from {file}")
            return tf
        log.LOG.warning(f"replay: the cached taps {file} are damaged ({fault}); computing them again")
        return None

    if path is not None and path.exists() and (tf := read(path)) is not None:
        return tf
    wider = _wider_tap_file(path, taps) if path is not None else None
    if wider is not None and (tf := read(*wider)) is not None:    # taps of more layers, same turn: their columns
        return tf
    tf = teacher_forced(target, prompt, ref, taps)
    _log.debug(f"taps {list(taps)} of {len(ref)} reference tokens computed (one teacher-forced pass)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous().cpu() for k, v in tf.items() if v is not None}
        files.replace_atomic(path, lambda tmp: save_file(tensors, tmp))
    return tf


def budget(j: int, k_max: int, dc: DecodeConfig) -> int:
    """Drafts at the anchor ref[j] (j + 1 tokens produced): k drafts + 1 bonus must fit in the budget."""
    return max(0, min(k_max, dc.max_new_tokens - (j + 1) - 1))


@torch.inference_mode()
def replay_turn(drafter, prompt: list[int], ref: list[int], tf: dict, dc: DecodeConfig, near_tie: float,
                batched: bool = False, known: list[list[int]] | None = None) -> tuple[Generation, list[int]]:
    """The engine's rounds of one turn on the reference (see the module docstring). Returns the generation
    (tokens = the reference, accept_lengths, drafted, rounds) and the indices of near-tie rounds.

    `batched`: when the drafter has the optional `propose_all` (drafters/base.py), draft at every anchor of the
    reference in one batched call first (its drafts at an anchor depend only on what precedes it; with the round
    info of each anchor where its proposals carry info, DEdit), then walk the rounds; otherwise (or without it)
    drive prefill / propose / commit round by round, as the engine does. `known`: the drafts at every anchor,
    already known (`[L-1][K]`, eval/fusion_grid.py), walked without calling the drafter."""
    prompt_len = len(prompt)
    stops = set(dc.stop_token_ids)
    gen = Generation(prompt_len=prompt_len, tokens=list(ref))
    gen.stop_reason = "stop" if ref and ref[-1] in stops else "length"
    taps, gap = tf["taps"], tf["gap"]
    k_max = drafts_per_round(drafter, dc)
    every, infos = known, None
    chains = not getattr(drafter, "proposes_trees", False)      # propose_all drafts chains; a tree goes round by round
    if known is None and drafter is not None and batched and chains and hasattr(drafter, "propose_all") \
            and len(ref) > 1:
        ks = torch.tensor([budget(j, k_max, dc) for j in range(len(ref) - 1)])                  # [L-1]
        every = drafter.propose_all(taps, torch.tensor(prompt + ref), prompt_len + torch.arange(len(ref) - 1), ks)
        every, infos = every if isinstance(every, tuple) else (every, None)          # infos: per-anchor round info
        every = every.tolist()                                                                   # [L-1][K]
    elif known is None and drafter is not None:
        drafter.reset()
        prompt_taps = taps[:, :prompt_len] if taps is not None else None
        if getattr(drafter, "needs_prompt_ids", False):
            drafter.prefill(prompt_taps, ids=list(prompt))
        else:
            drafter.prefill(prompt_taps)
    ties, j, produced = [], 0, 1
    done = not ref or ref[0] in stops
    while not done and produced < dc.max_new_tokens:
        k = budget(j, k_max, dc)
        drafts = drafter.propose(ref[j], prompt_len + j, k, None) if k > 0 and every is None else None
        d = every[j][:k] if every is not None else drafts.tokens.tolist() if drafts is not None else []
        truth = ref[j + 1: j + 1 + k]
        path = None
        if drafts is not None and drafts.parents is not None:        # a tree: as deep as it matches the reference
            path = follow(drafts.tokens, drafts.parents, truth)
            n = len(path)
        else:
            n = 0
            while n < len(truth) and d[n] == truth[n]:
                n += 1
        committed = n if j + 1 + n == len(ref) else n + 1           # drafts ran through the final stop token
        done = j + committed == len(ref) - 1 and ref[-1] in stops
        if float(gap[j + 1: j + 1 + min(n + 1, len(ref) - 1 - j)].min()) < near_tie:
            ties.append(len(gen.accept_lengths))
        info = drafts.info if drafts is not None else infos[j] if infos is not None else None
        if info is not None:
            bonus = ref[j + n + 1] if j + n + 1 < len(ref) else -1  # -1: past the reference (unknown, never equal)
            tokens = drafts.tokens if drafts is not None else torch.tensor(d)
            gen.rounds.append({**info, "tokens": tokens, "accepted": n, "bonus": bonus})
        if drafter is not None and every is None and not done and produced + committed < dc.max_new_tokens:
            step_taps = taps[:, prompt_len + j: prompt_len + j + n + 1] if taps is not None else None
            if path is None:
                drafter.commit(n, step_taps)
            else:
                drafter.commit(n, step_taps, path=torch.tensor(path, dtype=torch.long))
        gen.accept_lengths.append(committed)
        gen.drafted.append(k if path is None else drafts.tokens.numel())
        produced += committed
        j += committed
    invariant(produced == len(ref), f"replay committed {produced} tokens of a {len(ref)}-token reference")
    return gen, ties


def replay_record(sample, turn: int, gen: Generation, ties: list[int], tf: dict, text: str, save_text: bool,
                  round_metrics=None) -> dict:
    """One turn's samples.jsonl record: the online record's fields without timing, plus the output token ids and
    the near-tie diagnostics (`near_tie_rounds`: indices of flagged rounds; `tf_argmax_mismatches`: reference
    tokens the teacher-forced pass ranks second, each a tie the two computation orders break differently)."""
    ref = gen.tokens
    rec = {
        "id": sample.id, "benchmark": sample.benchmark, "turn": turn, "prompt_tokens": gen.prompt_len,
        "new_tokens": len(ref), "accept_lengths": gen.accept_lengths, "drafted": gen.drafted,
        "tau": metrics.turn_tau(gen.accept_lengths), "stop_reason": gen.stop_reason,
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(), "lossless": None, "tokens": ref,
        "near_tie_rounds": ties,
        "tf_argmax_mismatches": int((tf["argmax"] != torch.tensor(ref, dtype=torch.long)).sum()),
    }
    if gen.rounds and round_metrics is not None:
        rec.update(round_metrics.turn(gen.rounds, True))
    if save_text:
        rec["text"] = text
    return rec


def replay_settings(typed: Config) -> ReplayConfig:
    """The `replay` group, checked with what replay needs of the rest (greedy decoding, a new export file)."""
    rp, protocol = typed.replay, typed.decoding.protocol
    check(protocol == "greedy",
          f"task=replay needs greedy decoding (got decoding.protocol={protocol}): under sampling the "
          f"output depends on the drafter, so there is no single reference; use task=eval for decoding=sample_a|b")
    if rp.export:                       # before the references are computed: a refusal costs nothing
        files.check_new_file(rp.export, "replay.export", rp.overwrite, "replay.overwrite")
    if rp.reference_engine == "vllm":   # the side Python names the set (its vLLM version), cached or not
        vllm_version(side_python(rp.vllm_python, "replay.vllm_python"), "replay.vllm_python")
    return rp


def default_replay(typed: Config) -> ReplayConfig:
    """The `replay` settings of a task that replays without the replay group (task=eval's untimed prompts): the
    caches under `paths.cache` as conf/task/replay.yaml has them, eval.near_tie, every other key its default."""
    root = f"{typed.paths.cache}"
    return ReplayConfig(cache_dir=f"{root}/references", tap_cache_dir=f"{root}/replay_taps",
                        near_tie=typed.eval.near_tie)


def build_references(cfg, target, samples, dc: DecodeConfig, rp: ReplayConfig,
                     target_settings=None) -> ReferenceStore:
    """The reference store of this target, budget and reference engine, with every selected sample's reference
    (computed as needed, resumably; `replay.references=FILE` imported first; `replay.export=FILE` written after).
    `rp`: the replay settings (the config's `replay` group, or `default_replay` for a task without one);
    `target_settings`: the typed `target` group, which `replay.reference_engine=vllm` needs (what vLLM loads)."""
    vllm = None
    if rp.reference_engine == "vllm":
        invariant(target_settings is not None, "build_references: vLLM references need the target's settings")
        vllm = VllmReferences(side_python(rp.vllm_python, "replay.vllm_python"), target, target_settings,
                              rp.vllm_timeout_s)
    store = ReferenceStore(rp.cache_dir, set_fingerprint(target, dc, vllm.identity if vllm is not None else None))
    if rp.references:
        store.import_file(rp.references)
    # Prompt-index-major across benchmarks (a stable sort), so an interrupted run covers every benchmark equally.
    count: dict[str, int] = {}
    index = []                                          # each sample's index within its benchmark
    for s in samples:
        index.append(count.get(s.benchmark, 0))
        count[s.benchmark] = index[-1] + 1
    todo = [s for _, s in sorted(zip(index, samples), key=lambda p: p[0]) if store.get(s) is None]
    bar = tqdm(total=len(todo), desc=f"references on {target.name}", unit="sample",
               disable=not cfg.eval.progress or not todo, dynamic_ncols=True)
    if todo:                                            # the long silent phase of a first replay
        log.LOG.info(f"references: decoding {len(todo)} of {len(samples)} samples greedily on {target.name} "
                     f"with {store.source['name']} (cached in {store.dir})")
    t0 = time.perf_counter()
    rows = reference_batch(rp.batch_size, target) if vllm is None else len(todo)

    def done(ref: dict) -> None:                        # appended as each sample ends: a rerun resumes from there
        store.add([ref])
        bar.update()
        _log.debug(f"reference {ref['benchmark']}/{ref['id']} done ({time.perf_counter() - t0:.0f} s so far)")
    with bar:
        if todo and vllm is not None:
            vllm.compute(target, todo, dc, store.dir / "vllm", done)
        elif todo:
            compute_references(target, todo, dc, rows, done)
    if todo:
        how = f"at batch {rows}" if vllm is None else "by vLLM, one batch per turn depth"
        log.LOG.info(f"references: {len(todo)} decoded in {time.perf_counter() - t0:.0f} s {how}")
    if rp.export:
        n = store.export(files.check_new_file(rp.export, "replay.export", rp.overwrite,
                                              "replay.overwrite"), samples)
        log.LOG.info(f"wrote {n} references to {rp.export}")
    return store


# `replay.batch_size=auto` on a CPU: the batch that built the mini target's references fastest there: the 380-prompt
# eval split at 128 tokens in float32 (2 threads, Xeon with AVX-512 and AMX, one run each) took 1,830 s at batch 1,
# 413 s at 16 and 335 s at 32 (5.5x), every reference equal to batch 1's (docs/batched.md). Elsewhere 1 until a
# device's own measurement says more.
CPU_REFERENCE_BATCH = 32


def reference_batch(value, target) -> int:
    """`replay.batch_size` as the rows decoded side by side; `auto` as above, and 1 where the static engine cannot
    run the target (it would refuse an explicit batch in one line)."""
    if value != "auto":
        return int(value)
    if target.device.type != "cpu":
        return 1
    try:
        batch_engine(target)
    except UserError:
        return 1
    return CPU_REFERENCE_BATCH


def run_settings(cfg, typed: Config, device, refs: ReferenceStore) -> dict:
    """Every setting that changes a replay's results (run.json, eval/store.py)."""
    rp, ev = typed.replay, typed.eval
    vocab = vocab_settings(ev, cfg.drafter.name, device, timed=False)
    vocab |= {"draft_vocab_content": checkpoint_digests(vocab, "eval")} if vocab else {}
    # the references' engine only when it is not specexp's, so the directories of earlier runs still resume
    source = {"references_source": refs.source} if refs.source["name"] != "specexp" else {}
    return {
        "mode": "replay", "references": refs.hash,
        "target": target_settings(cfg.target, device),
        "drafter": OmegaConf.to_container(cfg.drafter, resolve=True),
        "max_new_tokens": ev.max_new_tokens, "near_tie": rp.near_tie, "batched": rp.batched, "save_text": ev.save_text,
        **capped(ev), **vocab, **source,
    }


def tap_file(rp: ReplayConfig, refs: ReferenceStore, taps, key: str, turn: int) -> Path | None:
    """Where a turn's teacher-forced taps are kept (None without `replay.tap_cache`)."""
    root = Path(os.path.expanduser(str(rp.tap_cache_dir))) if rp.tap_cache else None
    return _tap_file(root, refs.hash, taps, key, turn) if root is not None else None


def replay_sample(target, drafter, sample, refs: ReferenceStore, dc: DecodeConfig, rp: ReplayConfig,
                  save_text: bool, round_metrics=None) -> list[dict]:
    """Every turn's replay record of one sample, on its reference (which must be in `refs`)."""
    taps = drafter.tap_layers if drafter is not None else ()
    ref, recs = refs.get(sample), []
    for turn, prompt, tokens in turns_with_prompts(target, sample, ref):
        tf = cached_teacher_forced(target, prompt, tokens, taps, tap_file(rp, refs, taps, ref["key"], turn))
        gen, ties = replay_turn(drafter, prompt, tokens, tf, dc, rp.near_tie, rp.batched)
        recs.append(replay_record(sample, turn, gen, ties, tf, target.decode(tokens), save_text, round_metrics))
    return recs


def grid_requested(rp: ReplayConfig) -> bool:
    """Whether `replay.fusion_grid` asks for an alpha/beta grid (task=replay then runs eval/fusion_grid.py)."""
    g = rp.fusion_grid
    return g.alpha is not None or g.beta is not None


def run_replay(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=replay`: replay `cfg.drafter` on the target's references of `cfg.benchmark`; returns the summary.
    Everything is validated and the references exist before the run directory is claimed (eval/store.py).
    A config with `replay.fusion_grid` set is `eval/fusion_grid.run_grid`'s (the task dispatches it there)."""
    out_dir, sel = Path(out_dir), run.select(cfg, typed)
    typed, device, samples = sel.typed, sel.device, sel.samples          # samples: all unless eval.shard=I/N
    rp = replay_settings(typed)
    check(not grid_requested(rp), "replay.fusion_grid is set: run it through task=replay (eval/fusion_grid.py "
                                   "run_grid), not run_replay")
    ev = typed.eval
    m = run.build(cfg, sel, draft_vocab(ev, cfg.drafter.name, device, timed=False))
    target, drafter, round_metrics, dc = m.target, m.drafter, m.round_metrics, m.dc
    refs = build_references(cfg, target, samples, dc, rp, typed.target)
    if rp.references_only:
        return {}
    settings = run_settings(cfg, typed, device, refs)
    with ResultStore(out_dir, settings, samples, shards.entry(sel.selected, sel.shard)) as store:
        run.start(cfg, out_dir, {**run_info(device), "target_source": target.source, "references": str(refs.dir),
                                 "references_source": refs.source})
        logger = run.logger(typed, cfg, out_dir, name=f"{cfg.drafter.name}-{target.name}")
        done = store.done()
        todo = [s for s in samples if (s.benchmark, s.id) not in done]
        log.LOG.info(f"replay: {len(todo)} of {len(samples)} samples to replay with {cfg.drafter.name} "
                     f"({len(samples) - len(todo)} already in {out_dir})")
        bar = tqdm(todo, desc=f"replay {cfg.drafter.name} on {target.name}", unit="sample",
                   disable=not ev.progress, dynamic_ncols=True)
        for sample in bar:
            recs = replay_sample(target, drafter, sample, refs, dc, rp, ev.save_text, round_metrics)
            store.append(recs)
            taus = [r["tau"] for r in recs if r["tau"] is not None]
            bar.set_postfix(bench=sample.benchmark, tau=f"{metrics.fmean(taus):.2f}" if taus else "–")
            _log.debug(f"replayed {sample.benchmark}/{sample.id}: τ {metrics.fmean(taus) if taus else None}")

        # the logger gets the eval/... keys the dashboards read; job type replay
        summary, md = run.finish(cfg, out_dir, store.records, sel, m, logger, "replay", mode="replay",
                                 references_source=refs.source)
    log.table(md)
    return summary
