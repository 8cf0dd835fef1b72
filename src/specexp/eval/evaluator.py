"""The evaluator: runs every benchmark sample through the engine with the drafter and with no drafter (the
AR baseline), writes one `samples.jsonl` record per turn as each sample finishes, and summarises.

With `eval.timed_samples` (eval/shards.py) only a seeded subset of the prompts is timed, so speedup, TPOT and TTFT
come from the timed prompts (decoded online, drafter and AR interleaved at batch 1, `"timed": true`), while τ still
covers every prompt. A turn outside the subset (`"timed": false`, no clock fields) is, under greedy decoding,
replayed (eval/replay.py) on the target's greedy reference, which `replay.batch_size`'s batched generation builds
(cached and shared with task=replay): its τ is the engine's exactly (near-tie rounds flagged), its losslessness holds
by construction (`lossless` null, `"replayed": true`). Under sampling (protocols A and B) there is no single
reference: such a turn is decoded online, without AR's run unless the lossless check asks for it.

Files in the run directory (the results contract; see docs/architecture.md):
  samples.jsonl   appended as each sample finishes; a rerun into the same directory skips finished samples
                  (what a rerun into an existing directory may do: store.py)
  summary.json    per-benchmark τ, speedup, TPOT, per-position acceptance, τ histogram, lossless mismatches
  summary.md      the table printed to the terminal
  config.yaml     the resolved config;  run_info.json  git SHA, package versions, device
  run.json        what the results depend on (settings, samples and their prompts); .lock  held while running
  command.json    the command line and a `rerun` line (tracking.command_record; written when the store claims DIR)
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import log
from ..config import Config, EvalConfig
from ..decoding.batch_spec import speculate_batched
from ..decoding.engine import DecodeConfig, Generation, drafts_per_round, generate
from ..decoding.settings import check_fits, draft_vocab, turn_seed
from ..errors import check
from ..targets import cpu_linear
from ..tracking import run_info
from . import metrics, run, shards
from .references import SampleJob, batch_engine
from .replay import build_references, default_replay, replay_sample
from .store import ResultStore
from .summary import run_settings


def _record(sample, turn: int, prompt_len: int, spec: Generation, ar: Generation | None, text: str,
            lossless: bool | None, save_text: bool, round_metrics=None, greedy: bool = False,
            timed: bool | None = None) -> dict:
    """One turn's record. `timed`: None when the run times every prompt (no `timed` field, as before the key
    existed), else whether this prompt is in the timed subset; outside it the clock's fields are null."""
    rec = {
        "id": sample.id, "benchmark": sample.benchmark, "turn": turn, "prompt_tokens": prompt_len,
        "new_tokens": len(spec.tokens), "accept_lengths": spec.accept_lengths, "drafted": spec.drafted,
        "tau": metrics.turn_tau(spec.accept_lengths), "ttft": spec.ttft_s,
        "tpot": metrics.tpot(spec.decode_s, spec.decode_tokens), "stop_reason": spec.stop_reason,
        "ar_new_tokens": len(ar.tokens) if ar else None, "ar_ttft": ar.ttft_s if ar else None,
        "ar_tpot": metrics.tpot(ar.decode_s, ar.decode_tokens) if ar else None,
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(), "lossless": lossless,
    }
    if timed is not None:
        rec["timed"] = timed
    if timed is False:                   # measured, but not interleaved with AR's timing: not a speedup's input
        rec.update(ttft=None, tpot=None, ar_ttft=None, ar_tpot=None)
    if spec.rounds and round_metrics is not None:      # the drafter's own per-round diagnostics, keys its own
        rec.update(round_metrics.turn(spec.rounds, greedy))
    if save_text:
        rec["text"] = text
    return rec


def run_sample(target, drafter, sample, dc: DecodeConfig, ev: EvalConfig, seed: int, round_metrics=None,
               timed: bool | None = None) -> list[dict]:
    """All turns of one sample; each next user turn follows the model's own previous answer. `round_metrics`:
    the drafter's registry `metrics` (turns its per-round `info` into record fields), or None. `timed`: None when
    the run times every prompt, else whether this one is in the timed subset (eval/shards.py); outside it AR runs
    only for the lossless check."""
    k = drafts_per_round(drafter, dc)
    messages, recs = [], []
    for turn, user in enumerate(sample.turns):
        messages.append({"role": "user", "content": user})
        ids = target.encode_chat(messages)
        check_fits(target, f"sample {sample.id} turn {turn}", len(ids), dc, k)
        g = torch.Generator(device=target.device)
        g.manual_seed(turn_seed(seed, sample.id, turn))
        spec = generate(target, drafter, ids, dc, g)
        ar = None
        if wants_ar(drafter, dc, ev, timed):
            g.manual_seed(turn_seed(seed, sample.id, turn))
            ar = generate(target, None, ids, dc, g)
        rec = turn_record(target, sample, turn, ids, spec, ar, dc, ev, round_metrics, timed)
        recs.append(rec)
        messages.append({"role": "assistant", "content": rec.get("text", target.decode(spec.tokens))})
    return recs


def wants_ar(drafter, dc: DecodeConfig, ev: EvalConfig, timed: bool | None) -> bool:
    """Whether a turn also runs AR: for its speedup (timed), or for the lossless check."""
    return drafter is not None and ev.run_ar and (timed is not False or compares(dc, ev))


def compares(dc: DecodeConfig, ev: EvalConfig) -> bool:
    return ev.check_lossless is True or (ev.check_lossless == "auto" and dc.protocol == "greedy")


def turn_record(target, sample, turn: int, ids: list[int], spec: Generation, ar: Generation | None,
                dc: DecodeConfig, ev: EvalConfig, round_metrics, timed: bool | None) -> dict:
    """One turn's record from its drafter and AR generations, the lossless check and a mismatch's diagnosis."""
    lossless = (spec.tokens == ar.tokens) if (ar is not None and compares(dc, ev)) else None
    rec = _record(sample, turn, len(ids), spec, ar, target.decode(spec.tokens), lossless, ev.save_text,
                  round_metrics, dc.protocol == "greedy", timed)
    if lossless is False:
        rec.update(mismatch(target, ids, spec.tokens, ar.tokens, ev.near_tie))
    return rec


class TurnsJob(SampleJob):
    """A sample's turns for batched decoding (decoding/batch_spec.py's job protocol), as `run_sample` decodes them:
    each next user turn follows the decoded previous answer, and each turn samples from its own stream seeded by
    `turn_seed`. With `prompts` (AR's run) it hands out those prompts instead: AR decodes the drafter run's turns, as
    at batch 1. Keeps every turn's prompt and generation."""

    def __init__(self, target, sample, dc: DecodeConfig, seed: int, k: int, prompts: list | None = None):
        super().__init__(target, sample, dc)
        self.seed, self.k, self.given = seed, k, prompts
        self.prompts: list[list[int]] = []
        self.gens: list[Generation] = []
        self.generator = torch.Generator(device=target.device)

    def next_prompt(self, previous: Generation | None) -> list[int] | None:
        if self.given is None:
            ids = super().next_prompt(previous)
        if previous is not None:
            self.gens.append(previous)
        if self.given is not None:
            ids = self.given[len(self.gens)] if len(self.gens) < len(self.given) else None
        if ids is not None:
            turn = len(self.gens)
            check_fits(self.target, f"sample {self.sample.id} turn {turn}", len(ids), self.dc, self.k)
            self.prompts.append(ids)
            self.generator.manual_seed(turn_seed(self.seed, self.sample.id, turn))
        return ids


def run_batch(target, drafter, samples, dc: DecodeConfig, ev: EvalConfig, seed: int, round_metrics=None,
              timed: list[bool | None] | None = None) -> list[list[dict]]:
    """`run_sample` for several samples at `eval.batch_size` rows: the drafter's run of all of them, then AR's run of
    the turns that want it (their speedup or the lossless check), each through the batched engine; per-row TPOT
    is the row's own wall time per token while it shared the rounds with the others, so a speedup is a ratio of
    throughputs at that batch. Returns each sample's records."""
    rows, k = batch_engine(target), drafts_per_round(drafter, dc)
    timed = timed or [None] * len(samples)
    jobs = [TurnsJob(rows, s, dc, seed, k) for s in samples]
    speculate_batched(rows, drafter, jobs, dc, ev.batch_size, lambda job: None)
    ar = {i: TurnsJob(rows, s, dc, seed, 0, prompts=jobs[i].prompts) for i, s in enumerate(samples)
          if wants_ar(drafter, dc, ev, timed[i])}
    speculate_batched(rows, None, list(ar.values()), dc, ev.batch_size, lambda job: None)
    out = []
    for i, (sample, job) in enumerate(zip(samples, jobs)):
        ar_gens = ar[i].gens if i in ar else [None] * len(job.gens)
        out.append([turn_record(target, sample, turn, ids, spec, a, dc, ev, round_metrics, timed[i])
                    for turn, (ids, spec, a) in enumerate(zip(job.prompts, job.gens, ar_gens))])
    return out


def mismatch(target, prompt: list[int], spec: list[int], ar: list[int], near_tie: float) -> dict:
    """Where a greedy output first leaves AR's (`mismatch_at`), the target's logit gap there (`mismatch_gap`,
    metrics.tie_gap: the top-2 gap when the two tokens are the two best, as replay measures near-ties) from one
    teacher-forced pass over the prompt and the common prefix, and whether that is a near-tie (a gap of at most
    metrics.tie_tolerance: `near_tie`, or 2 ulps of the target's dtype if more): in
    bf16 a 16-token verify block and a 1-token AR step round differently, so they may break such a tie
    differently without any drafter error. An output that is a prefix of the other is no tie."""
    i = next((j for j, (a, b) in enumerate(zip(spec, ar)) if a != b), min(len(spec), len(ar)))
    if i == min(len(spec), len(ar)):
        return {"mismatch_at": i, "mismatch_gap": None, "lossless_near_tie": False}
    ids = torch.tensor([prompt + ar[:i]], device=target.device)                        # [1, P + i]
    logits, _ = target.forward(ids, 0, target.new_cache(), last_only=True)              # [1, 1, V]
    gap = metrics.tie_gap(logits[0, -1], (spec[i], ar[i]))
    tol = metrics.tie_tolerance(logits[0, -1], target.dtype, near_tie)
    return {"mismatch_at": i, "mismatch_gap": gap, "mismatch_tolerance": tol,
            "lossless_near_tie": metrics.is_near_tie(gap, tol)}


def warmup(target, drafter, dc: DecodeConfig, n: int, batch_size: int = 1, rows: int | None = None) -> None:
    """A few short generations first, so lazy initialisation and (on GPU) kernel selection are not timed; at batch
    B > 1 `rows` rows (default B: the rows the run will decode side by side) of the same prompt through the batched
    engine."""
    ids = target.encode_chat([{"role": "user", "content": "Count from one to ten."}])
    short = replace(dc, max_new_tokens=min(dc.max_new_tokens, 24))       # the timed runs' protocol and cap
    g = torch.Generator(device=target.device).manual_seed(0)
    for _ in range(n):
        if batch_size > 1:
            engine = batch_engine(target)
            for d in (drafter, None) if drafter is not None else (None,):
                speculate_batched(engine, d, [Once(ids) for _ in range(rows or batch_size)], short, batch_size,
                                  lambda j: None, g)
            continue
        generate(target, drafter, ids, short, g)
        if drafter is not None:
            generate(target, None, ids, short, g)


class Once:
    """A one-turn job of a given prompt (warmup)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def next_prompt(self, previous):
        ids, self.ids = self.ids, None
        return ids


def run_eval(cfg, out_dir: Path, typed: Config | None = None) -> dict:
    """`task=eval`: evaluate `cfg.drafter` against AR on `cfg.benchmark`; returns the summary.

    Everything that can be wrong with the input is checked before the run directory is claimed (store.py), so a
    failed start leaves it as it was and the corrected command can use it."""
    out_dir, sel = Path(out_dir), run.select(cfg, typed)
    typed, device, samples = sel.typed, sel.device, sel.samples          # samples: all unless eval.shard=I/N
    ev, dec = typed.eval, typed.decoding
    subset = shards.timed_subset(sel.selected, ev.timed_samples, cfg.seed)   # over the whole selection
    timed_keys = shards.timed_members(subset)
    check(not (ev.check_lossless is True and dec.protocol != "greedy"),
          f"eval.check_lossless=true compares outputs token for token and needs greedy decoding (got protocol "
          f"{dec.protocol}); at T>0 losslessness is a distribution-level property (tests/decoding)")
    m = run.build(cfg, sel, draft_vocab(ev, cfg.drafter.name, device))
    target, drafter, round_metrics, dc = m.target, m.drafter, m.round_metrics, m.dc
    k = drafts_per_round(drafter, dc)
    for s in samples:                   # first turns only: later ones depend on the model's answers
        first = target.encode_chat([{"role": "user", "content": s.turns[0]}])
        check_fits(target, f"sample {s.id} turn 0", len(first), dc, k)

    settings = shards.with_timed(run_settings(cfg, device, typed), ev.timed_samples, subset)
    with ResultStore(out_dir, settings, samples, shards.entry(sel.selected, sel.shard)) as store:
        run.start(cfg, out_dir, {**run_info(device), "target_source": target.source,
                                 "target_prepacked": cpu_linear.is_packed(target.model),
                                 "target_packing": cpu_linear.describe(target.model)})
        logger = run.logger(typed, cfg, out_dir, name=f"{cfg.drafter.name}-{target.name}")

        done = store.done()
        todo = [s for s in samples if (s.benchmark, s.id) not in done]
        untimed = [s for s in todo if timed_keys is not None and (s.benchmark, s.id) not in timed_keys]
        refs, rp = None, default_replay(typed)
        if untimed and dec.protocol == "greedy":        # τ of the untimed prompts by replay, references batched
            refs = build_references(cfg, target, untimed, dc, rp)
        if todo and ev.warmup:
            warmup(target, drafter, dc, ev.warmup, ev.batch_size, min(ev.batch_size, len(todo)))
        bar = tqdm(total=len(todo), desc=f"eval {cfg.drafter.name} on {target.name}", unit="sample",
                   disable=not ev.progress, dynamic_ncols=True)

        def done(sample, recs: list[dict]) -> None:
            store.append(recs)
            taus = [r["tau"] for r in recs if r["tau"] is not None]
            bar.update()
            bar.set_postfix(bench=sample.benchmark, tau=f"{metrics.fmean(taus):.2f}" if taus else "–")
            logger.log({f"sample/{sample.benchmark}/tau": metrics.fmean(taus) if taus else None,
                        "sample/new_tokens": sum(r["new_tokens"] for r in recs)}, step=len(store.records))

        group: list = []             # eval.batch_size > 1: samples decoded online, a group of 2 B rows at a time
        for i, sample in enumerate(todo):
            timed = None if timed_keys is None else (sample.benchmark, sample.id) in timed_keys
            if timed is False and refs is not None:
                done(sample, [{**r, "timed": False, "replayed": True} for r in
                              replay_sample(target, drafter, sample, refs, dc, rp, ev.save_text, round_metrics)])
            elif ev.batch_size == 1:
                done(sample, run_sample(target, drafter, sample, dc, ev, cfg.seed, round_metrics, timed))
            else:
                group.append((sample, timed))
            if group and (len(group) == 2 * ev.batch_size or i == len(todo) - 1):
                got = run_batch(target, drafter, [s for s, _ in group], dc, ev, cfg.seed, round_metrics,
                                [t for _, t in group])
                for (s, _), recs in zip(group, got):
                    done(s, recs)
                group = []
        bar.close()

        summary, md = run.finish(cfg, out_dir, store.records, sel, m, logger, "eval", batch_size=ev.batch_size,
                                 timed=None if subset is None else {"samples": ev.timed_samples, "seed": cfg.seed})
    log.table(md)
    return summary
