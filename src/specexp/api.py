"""specexp from Python: the same config names and overrides as the command line, one composition and one task
runner (tasks.py), and the same one-line errors, raised as `specexp.UserError` instead of printed.

    import specexp
    pipe = specexp.load(target="smollm2_135m", drafter="dflash")                # the committed mini drafter
    out = pipe.generate(["What is 12 * 7?"], max_new_tokens=64)
    out[0].text, out[0].token_ids, out[0].accept_lengths, out[0].tau
    summary = specexp.evaluate(["benchmark=gsm8k", "eval.num_samples=4"], out_dir="runs/gsm8k")
    specexp.compare("runs/a", "runs/b")                                        # paired τ difference with its CI
    specexp.export(["drafter=dflash", "export.format=vllm"], out_dir="runs/export")   # docs/export.md

Conventions: τ includes the bonus token (the mean of `accept_lengths`, tokens committed per verification);
greedy outputs equal the target's own greedy output token for token.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

from .errors import UserError, check

Messages = list[dict]
Prompt = Union[str, Messages, Sequence[int]]


def compose(overrides: Sequence[str] = ()) -> tuple[object, dict]:
    """(config, job) of `python -m specexp OVERRIDES`: the command line's checks (one `UserError` line for an
    unknown option or key), the same conf tree and plugins, and the group choices that validation reads."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import open_dict

    from . import cli
    from .paths import CONF_DIR

    overrides = _overrides(overrides)
    check(all(not o.startswith("-") for o in overrides),
          f"overrides take key=value and group=option only, not command-line flags: {overrides}")
    plugin_dirs = cli.plugin_config_dirs()
    search = ["hydra.searchpath=[" + ",".join(f"file://{d}" for d in plugin_dirs) + "]"] if plugin_dirs else []
    cli.precheck([*overrides, *search], keys=False)      # the key check runs only if the composition fails
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose("config", overrides=[*overrides, *search], return_hydra_config=True)
    except HydraException as e:
        raise cli.explain_failure([*overrides, *search], e) from None
    job = {"choices": dict(cfg.hydra.runtime.choices), "overrides": overrides, "config_name": "config"}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, job


def _overrides(overrides) -> list[str]:
    """`overrides` as a list of strings: None is none, one string is one override; anything else is one line."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    check(isinstance(overrides, (list, tuple)), f"overrides is a list of 'key=value' strings, not a "
                                                f"{type(overrides).__name__}: {str(overrides)[:80]!r}")
    bad = [o for o in overrides if not isinstance(o, str)]
    if bad:
        raise UserError(f"overrides are 'key=value' strings; got {type(bad[0]).__name__} {str(bad[0])[:80]!r}")
    return list(overrides)


def _prompt_list(prompts) -> list:
    """`generate`'s prompts as a list of prompts: one str, one chat message (a dict), one chat (a list of
    messages) or one list of token ids is a single prompt; a list of those is several. Anything else: one line."""
    one = ("a prompt is a str, a chat message {'role', 'content'}, a list of such messages or a list of token ids "
           "(ints)")
    if isinstance(prompts, (str, dict)):
        return [[prompts] if isinstance(prompts, dict) else prompts]
    check(isinstance(prompts, (list, tuple)), f"{one}, or a list of prompts; got a {type(prompts).__name__}"
          + (" (pass tensor.tolist())" if type(prompts).__name__ == "Tensor" else ""))
    items = list(prompts)
    check(items, "no prompts: pass one prompt or a non-empty list of them")
    if all(isinstance(x, dict) for x in items) or all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return [items]                                     # one chat, or one prompt of token ids
    for i, x in enumerate(items):
        check(isinstance(x, (str, dict, list, tuple)), f"prompts[{i}]: {one}; got a {type(x).__name__} "
                                                       f"{str(x)[:40]!r}")
    return [[x] if isinstance(x, dict) else x for x in items]


@dataclass
class Output:
    """One generated answer: `text` (special tokens skipped), `token_ids` (the new tokens, the stop token
    included), `accept_lengths` (tokens committed by each verification), `tau` (their mean; None when no
    verification ran: a prompt whose first token already ended the answer, or `max_new_tokens=1`, where the
    prefill alone produced it)."""

    text: str
    token_ids: list[int]
    accept_lengths: list[int] = field(default_factory=list)
    stop_reason: str = "length"

    @property
    def tau(self) -> float | None:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else None


class Pipeline:
    """A target and a drafter built from a composed config (`load`), ready to generate."""

    def __init__(self, cfg, job: dict):
        import torch

        from . import registry
        from .config import resolve_auto, validate
        from .decoding.settings import draft_vocab
        from .machine import resolve_device

        self.device = resolve_device(cfg.device)
        self.settings = resolve_auto(validate(cfg, job), self.device)     # the typed config every call reads
        batch = self.settings.eval.batch_size
        check(batch == 1, f"eval.batch_size={batch}: a Pipeline's generate decodes its prompts one at a time (batch "
                          f"1), so the setting would be ignored; drop it, or decode side by side with "
                          f"specexp.evaluate([..., 'eval.batch_size={batch}'], out_dir=DIR)")
        self.cfg = cfg
        cfg.drafter = registry.fill_default_checkpoints(cfg.drafter, cfg.target.name)
        if self.settings.cpu_threads is not None:
            torch.set_num_threads(self.settings.cpu_threads)
        vocab = draft_vocab(self.settings.eval, cfg.drafter.name, self.device)
        m = registry.build_models(self.settings, cfg.drafter, self.device, vocab)     # as a run builds them
        self.target, self.drafter = m.target, m.drafter
        self._lock = threading.Lock()

    def encode(self, prompt: Prompt) -> list[int]:
        """A user message (str), a chat (list of {"role", "content"}) or token ids, as the target's prompt ids."""
        if isinstance(prompt, str):
            return self.target.encode_chat([{"role": "user", "content": prompt}])
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            check(all({"role", "content"} <= set(m) for m in items),
                  "a chat prompt is a list of {'role': ..., 'content': ...} messages")
            return self.target.encode_chat(items)
        check(items and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.target.vocab_size
                            for t in items),
              f"a prompt is a str, a list of chat messages or a non-empty list of token ids in "
              f"[0, {self.target.vocab_size}); got {str(prompt)[:80]!r}")
        return items

    def generate(self, prompts: Prompt | Sequence[Prompt], max_new_tokens: int | None = None,
                 decoding: str | None = None, temperature: float | None = None, seed: int | None = None
                 ) -> list[Output]:
        """Generate for each prompt (one prompt alone is also accepted) with the drafter, batch size 1 (`load`
        refuses eval.batch_size > 1).
        `decoding`: greedy | A | B | block (default: the config's `decoding.protocol`); `temperature` for A, B, block;
        `max_new_tokens`: default `eval.max_new_tokens`; `seed`: default the config's (sampling only)."""
        with self._lock:        # one engine, one drafter state: calls from several threads take turns
            return self._generate(prompts, max_new_tokens, decoding, temperature, seed)

    def _generate(self, prompts, max_new_tokens, decoding, temperature, seed) -> list[Output]:
        import torch

        from .decoding.engine import drafts_per_round, generate
        from .decoding.settings import check_fits, decode_config, turn_seed

        batch = _prompt_list(prompts)
        check(seed is None or (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0),
              f"seed={seed!r} is not valid; expected an int >= 0 or None (the config's seed)")
        check(max_new_tokens is None or (isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool)
                                         and max_new_tokens >= 1),
              f"max_new_tokens={max_new_tokens!r} is not valid; expected an int >= 1 or None (eval.max_new_tokens)")
        protocol = decoding or self.cfg.decoding.protocol
        temp = temperature if temperature is not None else (0.0 if protocol == "greedy" else
                                                            self.cfg.decoding.temperature or 1.0)
        dec = self.settings.decoding.replaced(protocol=protocol, temperature=temp)
        if getattr(self.drafter, "proposes_trees", False):            # a valid protocol, but not one for trees
            from .decoding.tree import check_protocol

            check_protocol(protocol, "decoding" if decoding else "decoding.protocol")
        ev = self.settings.eval
        ev = ev.replaced(max_new_tokens=max_new_tokens) if max_new_tokens is not None else ev
        dc = decode_config(dec, ev, self.target)
        k = drafts_per_round(self.drafter, dc)
        ids = [self.encode(p) for p in batch]
        for i, x in enumerate(ids):                          # every prompt checked before any is generated
            check_fits(self.target, f"prompts[{i}]", len(x), dc, k)
        out = []
        for i, x in enumerate(ids):
            g = torch.Generator(device=self.target.device)
            g.manual_seed(turn_seed(self.cfg.seed if seed is None else seed, f"prompts[{i}]", 0))
            gen = generate(self.target, self.drafter, x, dc, g)
            out.append(Output(self.target.decode(gen.tokens), list(gen.tokens), list(gen.accept_lengths),
                              gen.stop_reason))
        return out


def load(target: str | None = None, drafter: str | None = None, overrides: Sequence[str] = ()) -> Pipeline:
    """A `Pipeline` for `target=TARGET drafter=DRAFTER OVERRIDES...` (names as on the command line; None keeps
    the config's default). `drafter="none"`: the target alone (autoregressive). `overrides`: a list of
    'key=value' strings (one string is one override, None is none)."""
    for name, value in (("target", target), ("drafter", drafter)):
        check(value is None or isinstance(value, str), f"{name}={value!r} is not valid; expected a config name "
                                                        f"(str) or None")
    groups = [f"target={target}"] * (target is not None) + [f"drafter={drafter}"] * (drafter is not None)
    return Pipeline(*compose([*groups, *_overrides(overrides)]))


def run(task: str, overrides: Sequence[str] = (), out_dir: str | Path | None = None) -> dict:
    """`python -m specexp task=TASK OVERRIDES hydra.run.dir=OUT_DIR`, returning the task's summary (the object
    its summary.json or TASK.json serialises). `out_dir` is required: a run writes its files there."""
    from .tasks import run_task

    check(out_dir is not None, f"task={task} writes a run directory: pass out_dir=DIR")
    cfg, job = compose([f"task={task}", *overrides])
    return run_task(cfg, str(out_dir), job)


def evaluate(overrides: Sequence[str] = (), out_dir: str | Path | None = None) -> dict:
    """`task=eval`: the drafter against AR on the benchmark; the summary (summary.json)."""
    return run("eval", overrides, out_dir)


def replay(overrides: Sequence[str] = (), out_dir: str | Path | None = None) -> dict:
    """`task=replay`: τ without decoding, on cached greedy references; the summary (summary.json)."""
    return run("replay", overrides, out_dir)


def export(overrides: Sequence[str] = (), out_dir: str | Path | None = None) -> dict:
    """`task=export`: the drafter's checkpoint as a directory vLLM / SGLang load (`export.format`, `export.out`,
    default `OUT_DIR/model`), with its model card; the summary (export_summary.json): files, τ, serving commands."""
    return run("export", overrides, out_dir)


def compare(run_a: str | Path, run_b: str | Path, out_dir: str | Path | None = None,
            allow_mismatch: bool = False) -> dict:
    """Paired comparison of two run directories on the prompts both hold (compare.json's content); with
    `out_dir`, also written there as `task=compare` writes it. Runs of another target, decoding, token budget or
    prompts are refused (UserError) unless `allow_mismatch` (then compare.json's `mismatch` lists what differs)."""
    if out_dir is not None:
        allow = f"compare.allow_mismatch={str(bool(allow_mismatch)).lower()}"
        return run("compare", [f"compare.a={run_a}", f"compare.b={run_b}", allow], out_dir)
    from .eval.compare import compare_runs

    return compare_runs(str(run_a), str(run_b), allow_mismatch=allow_mismatch)
