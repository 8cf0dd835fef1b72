"""The engine's settings, and how a config becomes them: `DecodeConfig` (what `engine.generate` reads),
`decode_config` (from the checked `decoding` and `eval` groups), the draft cap `eval.max_drafts` (`max_drafts`:
`auto` per device and dtype, a table per batch size), the draft vocabulary `eval.draft_vocab` (`draft_vocab`), what
must fit in the target's context (`check_fits`) and the per-turn sampling seed (`turn_seed`). Every caller that
generates (task=eval, the API, the experiment scripts) reads these, so a setting means the same whichever ran.

A device and a dtype are read by their names ('cpu', 'bfloat16'), so the config's edge (config.resolve_auto) resolves
`auto` into the names the run records before any model is built.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from ..errors import check
from ..machine import device_type
from ..paths import repo_path


@dataclass
class DecodeConfig:
    protocol: str = "greedy"           # greedy | A | B | block (see decoding/verify.py)
    temperature: float = 0.0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    max_drafts: int | None = None      # a cap on the drafts a round verifies (None: the drafter's own K)


# `eval.max_drafts=auto` on a CPU running the target in bf16: the cap measured fastest on the tuning split there
# (DFlash, mini target, 2-core AVX512-BF16 EPYC; 2, 3, 4 and 7 drafts paired on 70 prompts: 3 gave macro +0.11x
# [+0.08, +0.14] over the drafter's own 7 for -0.015 tau; experiments/results/draft_cap/dflash-tune-bf16-all.md).
CPU_BF16_MAX_DRAFTS = 3
# ... and in fp32, with the linear layers packed by the measured plan (targets/cpu_linear.py): 2, 3, 4 and 7 drafts
# paired on 56 tuning prompts of 7 benchmarks (2-core Xeon, idle): 3 gave macro +0.118x [+0.108, +0.130] over 7 for
# -0.020 tau, ahead of 2 (+0.085) and 4 (+0.012) (experiments/results/draft_cap/dflash-tune-fp32-packed.md).
CPU_FP32_MAX_DRAFTS = 3


def max_drafts(value, device, dtype, batch: int = 1) -> int | None:
    """`eval.max_drafts` as the engine's cap (None: the drafter's own K). `auto`: on a CPU, at most
    `CPU_BF16_MAX_DRAFTS` (bf16) or `CPU_FP32_MAX_DRAFTS` (fp32), since there a verify of k+1 rows grows with k (a
    matrix product against a 1-row step's matrix-vector product) while the later drafts are rarely accepted;
    elsewhere the drafter's own K (on a GPU a verify of 16 rows costs about one step). A mapping {B: cap}
    is a table by batch size (`eval.batch_size`): the entry of the largest B at or below the run's batch, none below
    it meaning the drafter's own K; at batch B a verify is B (k+1) rows, so the cap that pays shrinks as B grows
    (experiments/bench_batch.py measures it). The output is the target's whatever the cap; τ and a round's cost
    change. It caps every drafter, a tree's depth included, though `auto` was chosen on DFlash chains. A tree's
    verify rows are `drafter.tree.total_tokens` whatever its depth. On DFlash trees the depth cap of 3 cost
    Δτ -0.016 to -0.026 and at most -0.021x against depth 7 (tuning split; experiments/results/draft_cap, "Trees").
    `dtype`: a torch dtype or its name ('bfloat16')."""
    if isinstance(value, dict):
        at = [b for b in value if b <= batch]
        return value[max(at)] if at else None
    if value != "auto":
        return value
    if device_type(device) != "cpu":
        return None
    return {"bfloat16": CPU_BF16_MAX_DRAFTS, "float32": CPU_FP32_MAX_DRAFTS}.get(str(dtype).removeprefix("torch."))


# `eval.draft_vocab=auto` on a CPU: DFlash drafting from the 8,192 most frequent answer tokens. Chosen on the tuning
# split (fp32, packed, 3 drafts, 2-core Xeon; 56 prompts of 7 benchmarks, paired): 2,048 / 4,096 / 8,192 tokens gave
# macro +0.100 / +0.093 / +0.092x over the whole vocabulary, within each other's CIs; 8,192 is the one whose τ did not
# move (Δτ +0.000 [+0.000, +0.000]: every draft the same), +0.092x [+0.076, +0.110]
# (experiments/results/draft_cap/dflash-tune-fp32-vocab.md).
CPU_DRAFT_VOCAB = 8192


def draft_vocab(ev, drafter_name: str, device, timed: bool = True) -> tuple[int, str] | None:
    """`eval.draft_vocab` as (N, the regeneration set) or None (the whole vocabulary). `auto`: `CPU_DRAFT_VOCAB` on a
    CPU for drafter=dflash where `eval.draft_vocab_from` names an existing directory (eval=mini: the target's own
    answers in data/regen/, which only the mini target has), else None: on a GPU the projection of a few rows costs
    about nothing; and None where nothing is `timed` (replay, the α/β grid: τ alone, which a speed setting should
    not move). The drafts change, never the output; τ may (where the target's token lies outside the N)."""
    n, src = ev.draft_vocab, ev.draft_vocab_from
    if n == "auto":
        if not timed:
            return None
        fits = (device_type(device) == "cpu" and drafter_name == "dflash" and isinstance(src, str)
                and repo_path(src).is_dir())
        return (CPU_DRAFT_VOCAB, src) if fits else None
    return None if n is None else (n, src)


def decode_config(decoding, ev, target) -> DecodeConfig:
    """The engine's settings from the checked `decoding` and `eval` groups (config.py's DecodingConfig and
    EvalConfig: their values are valid) and the built `target` (its stop tokens, device and dtype)."""
    return DecodeConfig(decoding.protocol, float(decoding.temperature), ev.max_new_tokens,
                        tuple(target.stop_token_ids),
                        max_drafts(ev.max_drafts, target.device, target.dtype, ev.batch_size))


def check_fits(target, prompt: str, prompt_len: int, dc: DecodeConfig, k: int) -> None:
    """The prompt, the new tokens and one block of `k` drafts must fit in the target's context; `prompt` names the
    prompt in the one-line error ('sample gsm8k/3 turn 0', 'prompts[2]')."""
    check(prompt_len + k + 2 <= target.max_context, f"{prompt}: the prompt alone ({prompt_len} tokens, + {k} drafts) "
          f"exceeds the target context of {target.max_context}; no eval.max_new_tokens fits")
    check(prompt_len + dc.max_new_tokens + k + 1 <= target.max_context,
          f"{prompt}: prompt of {prompt_len} tokens + eval.max_new_tokens={dc.max_new_tokens} exceeds the target "
          f"context of {target.max_context}; lower eval.max_new_tokens")


def turn_seed(seed: int, sample_id: str, turn: int) -> int:
    """Per-turn sampling seed, independent of sample order (a resumed run draws the same numbers)."""
    return zlib.crc32(f"{seed}/{sample_id}/{turn}".encode())
