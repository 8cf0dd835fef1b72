"""Test-only drafters and a toy target (the engine talks to them through the same protocols)."""
import argparse
import subprocess
from pathlib import Path

import torch

from specexp.drafters import dels
from specexp.drafters.base import Proposal, choose


class _Stateless:
    """A drafter that reads no target taps and keeps no context."""

    tap_layers = ()

    def reset(self):
        pass

    def prefill(self, taps):
        pass

    def commit(self, n, taps):
        pass


class OracleDrafter(_Stateless):
    """Proposes the target's own greedy continuation `ref` (tokens after the prompt), corrupting each
    draft with probability `corrupt`, so that every acceptance length occurs."""

    name = "oracle"

    def __init__(self, ref: list[int], prompt_len: int, max_drafts: int, corrupt: float, vocab: int, seed=0):
        self.ref, self.p, self.max_drafts, self.corrupt, self.vocab = ref, prompt_len, max_drafts, corrupt, vocab
        self.g = torch.Generator().manual_seed(seed)
        self.proposed = []

    def propose(self, anchor, start, k, sampling):
        i = start - self.p                      # ref[i] is the anchor
        assert self.ref[i] == anchor
        toks = list(self.ref[i + 1: i + 1 + k])
        toks += [0] * (k - len(toks))
        for j in range(k):
            if torch.rand((), generator=self.g) < self.corrupt:
                toks[j] = (toks[j] + 1) % self.vocab
        self.proposed.append(k)
        return Proposal(torch.tensor(toks, dtype=torch.long))


class EagerLoop:
    """Stands in for kernels.graphs.GraphedLoop on CPU: the captured body, run eagerly at every replay, so the
    CUDA-graph path's buffer handling is tested without a GPU."""

    def __init__(self, body):
        self.body = body

    def __call__(self):
        with torch.inference_mode():
            self.body()


class ToyTarget:
    """A bigram 'language model' over a small vocabulary: logits of the next token = table[last token].
    Its exact sequence distribution is known in closed form, for distribution tests."""

    name = "toy"
    device = torch.device("cpu")
    stop_token_ids = []

    def __init__(self, table: torch.Tensor):
        self.table = table                      # [V, V]

    def new_cache(self, capacity=None):
        return []

    @staticmethod
    def rollback(cache, k):
        if k > 0:
            del cache[-k:]

    def forward(self, ids, start, cache, taps=(), last_only=False):
        assert start == len(cache)
        cache += ids[0].tolist()
        logits = self.table[ids[0]][None]       # [1, T, V]
        return (logits[:, -1:] if last_only else logits), None


class ToyDrafter(_Stateless):
    """Drafts sequentially from its own bigram table (different from the target's)."""

    name = "toy"

    def __init__(self, table: torch.Tensor, max_drafts: int):
        self.table, self.max_drafts = table, max_drafts

    def propose(self, anchor, start, k, sampling):
        toks, qs, t = [], [], anchor
        for _ in range(k):
            p = choose(self.table[t][None], sampling)
            t = int(p.tokens[0])
            toks.append(t)
            if p.q is not None:
                qs.append(p.q[0])
        return Proposal(torch.tensor(toks, dtype=torch.long), torch.stack(qs) if qs else None)


def chi2_pvalue_against_toy(target_table: torch.Tensor, temperature: float, counts: dict, n_runs: int) -> float:
    """χ² p-value of observed first-`steps` token sequences (keys of `counts`, generated from token 0) against a
    ToyTarget's exact sequence distribution at `temperature`."""
    import itertools

    from scipy.stats import chisquare

    steps, v = len(next(iter(counts))), target_table.shape[0]
    p = torch.softmax(target_table.double() / temperature, -1)
    probs = {}
    for seq in itertools.product(range(v), repeat=steps):
        prev, pr = 0, 1.0
        for tok in seq:
            pr, prev = pr * float(p[prev, tok]), tok
        probs[seq] = pr
    keys = sorted(probs)
    return chisquare([counts.get(s, 0) for s in keys], [probs[s] * n_runs for s in keys]).pvalue


def protocol_b_toy_fit(target_table: torch.Tensor, drafter, temperature: float, steps: int, n_runs: int,
                       drafts: int | None = None) -> tuple[float, int]:
    """`n_runs` protocol-B generations of `steps` + 1 tokens from token 0 on `ToyTarget(target_table)` with `drafter`
    (one seeded generator): the χ² p-value of their first `steps` tokens against the target's exact distribution,
    and how many first rounds accepted 3 drafts or more. `drafts`: every first round must have drafted that many."""
    from specexp.decoding.engine import DecodeConfig, generate

    target = ToyTarget(target_table)
    dc = DecodeConfig(protocol="B", temperature=temperature, max_new_tokens=steps + 1)
    gen = torch.Generator().manual_seed(1234)
    counts, deep = {}, 0
    for _ in range(n_runs):
        out = generate(target, drafter, [0], dc, gen)
        assert drafts is None or out.drafted[0] == drafts
        counts[tuple(out.tokens[:steps])] = counts.get(tuple(out.tokens[:steps]), 0) + 1
        deep += out.accept_lengths[0] >= 3
    return chi2_pvalue_against_toy(target_table, temperature, counts, n_runs), deep


def micro_target(vocab: int = 5, hidden: int = 16, layers: int = 2, std: float = 0.6, seed: int = 0):
    """A real (HF Qwen3) target over a vocabulary of `vocab` tokens: every registry drafter builds on it as on
    any target (random init), and its exact sequence distribution can be enumerated for distribution tests.
    The last id doubles as the DFlash mask token (an input-only id); no tokenizer, no stop tokens."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specexp.targets.hf import Target

    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2,
                         max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                         rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=std, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    return Target("micro", model, None, vocab - 1, [], source=f"random-init seed {seed}")


def exact_sequence_probs(target, prompt: list[int], steps: int, temperature: float) -> dict:
    """P(first `steps` generated tokens) under `target` sampled at `temperature`, by enumeration."""
    import itertools

    v, probs = target.vocab_size, {}
    with torch.inference_mode():
        for seq in itertools.product(range(v), repeat=steps):
            ids = torch.tensor([prompt + list(seq[:-1])])
            logits, _ = target.forward(ids, 0, target.new_cache())                        # [1, P+steps-1, V]
            p = torch.softmax(logits[0, len(prompt) - 1:].double() / temperature, -1)     # [steps, V]
            probs[seq] = float(torch.prod(p[torch.arange(steps), torch.tensor(seq)]))
    return probs


def chi2_pvalue(probs: dict, counts: dict, n_runs: int, min_expected: float = 5.0) -> float:
    """χ² goodness of fit of observed counts against exact probabilities; bins expecting fewer than
    `min_expected` draws are pooled into one, so the χ² approximation holds."""
    from scipy.stats import chisquare

    big = [s for s in probs if probs[s] * n_runs >= min_expected]
    small = [s for s in probs if probs[s] * n_runs < min_expected]
    obs = [counts.get(s, 0) for s in big] + ([sum(counts.get(s, 0) for s in small)] if small else [])
    exp = [probs[s] * n_runs for s in big] + ([sum(probs[s] for s in small) * n_runs] if small else [])
    return chisquare(obs, exp).pvalue


def sampled_fit(target, drafter, dc, seed: int, n_runs: int = 1500, prompt=(0, 1)) -> tuple[float, int]:
    """(χ² p-value, drafts accepted) of `n_runs` generations under `dc` (a sampling protocol, max_new_tokens = steps
    + 1) from `prompt`: their first `steps` tokens against the target's exact sequence distribution."""
    from specexp.decoding.engine import generate

    steps = dc.max_new_tokens - 1
    gen = torch.Generator().manual_seed(seed)
    counts, accepted = {}, 0
    for _ in range(n_runs):
        out = generate(target, drafter, list(prompt), dc, gen)
        key = tuple(out.tokens[:steps])
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(a - 1 for a in out.accept_lengths)
    return chi2_pvalue(exact_sequence_probs(target, list(prompt), steps, dc.temperature), counts, n_runs), accepted


# Options that make a random head matter next to a random DFlash (so the test sees the fused path), at small
# ranks (the vocabulary-wide rank-r products dominate a CPU run); a drafter not listed runs with its YAML defaults.
DELS = ["drafter.head.input_rank=16", "drafter.head.gru_hidden=32", "drafter.head.output_rank=16",
        "drafter.head.init_std=0.5", "fusion.alpha=4.0", "fusion.beta=1.0"]
STRONG = {
    "dels_rnn": DELS,
    "dels_markov": DELS,
    "domino_ft": ["drafter.head.gru_hidden=32", "drafter.head.emb_dim=16", "drafter.head.init_std=0.5",
                  "drafter.head.guidance=3.0"],
    "dedit": ["drafter.edit.passes=2", "drafter.edit.early_stop=false"],
}


class ScriptedTarget:
    """`target` (its taps, cache and positions) with made-up greedy choices: the logits at position p are a one-hot
    of `script[p + 1]` (prompt + continuation ids), so its greedy continuation of the prompt is the script, with a
    top-2 gap of 1 (no near-ties). With a script that follows a drafter (`follow_script`) acceptance goes as deep
    as a well-trained drafter's on its own target, through the real engine and the real replay."""

    def __init__(self, target, script: list[int]):
        self.t, self.script = target, list(script)
        self.device, self.vocab_size = target.device, target.vocab_size

    def new_cache(self, capacity=None):
        return self.t.new_cache(capacity)

    def rollback(self, cache, k):
        self.t.rollback(cache, k)

    def keep(self, cache, start, rows):
        self.t.keep(cache, start, rows)

    def choices(self, ids, start: int, last_only: bool, tree=None) -> list[int]:
        end = start + ids.shape[1]
        positions = range(end - 1 if last_only else start, end)
        if tree is not None:            # a tree row sits at its depth: on the script's path its choice is the script's
            positions = [start + int(d) for d in tree.depth]
        return [self.script[p + 1] if p + 1 < len(self.script) else 0 for p in positions]

    def forward(self, ids, start, cache, taps=(), last_only=False, tree=None):
        where = {"tree": tree} if tree is not None else {}
        _, hidden = self.t.forward(ids, start, cache, taps=taps, last_only=True, **where)    # the real taps and cache
        chosen = self.choices(ids, start, last_only, tree) if tree is not None else self.choices(ids, start, last_only)
        logits = torch.zeros(1, len(chosen), self.vocab_size, device=self.device)    # [1, T, V]
        logits[0, torch.arange(len(chosen)), torch.tensor(chosen)] = 1.0
        return logits, hidden


class FollowingTarget(ScriptedTarget):
    """Makes a script that follows a drafter: in the engine, each verified block `[anchor, d1..dk]` is taken as the
    target's own choice for a uniform random number m in 0..k of drafts, then a different token (the bonus). Its
    choices depend on the drafts, not on the sequence alone: use what it generates as a ScriptedTarget's script."""

    def __init__(self, target, seed: int):
        super().__init__(target, [])
        self.g = torch.Generator().manual_seed(seed)

    def _other(self, not_this: int) -> int:
        t = int(torch.randint(self.vocab_size - 1, (), generator=self.g))
        return t + (t >= not_this)

    def choices(self, ids, start: int, last_only: bool) -> list[int]:
        if last_only:                                 # the prefill: the first token
            return [self._other(-1)]
        block = ids[0].tolist()                       # [anchor, d1..dk]
        m = int(torch.randint(len(block), (), generator=self.g))
        return block[1: m + 1] + [self._other(block[m + 1] if m + 1 < len(block) else -1)] * (len(block) - m)


def follow_script(target, drafter, prompt: list[int], n: int, seed: int = 0) -> list[int]:
    """prompt + n tokens that agree with `drafter`'s greedy drafts for a random number of positions every round."""
    from specexp.decoding.engine import DecodeConfig, generate

    return prompt + generate(FollowingTarget(target, seed), drafter, prompt, DecodeConfig(max_new_tokens=n)).tokens


def release_head_dir(tmp_path, vocab, hidden, mode="low_rank", projected=False, seed=0, **config):
    """A directory in the DeLS-Spec release layout, built by hand (docs/checkpoints.md): local_head.pt =
    {model_config, model_state_dict} + loss_mask_unigram.pt = {counts}; G = 7, r = 4; frozen copies included."""
    g = torch.Generator().manual_seed(seed)
    G, r, d_in = 7, 4, (5 if projected else hidden)
    sd = {"prefix_gru.weight_ih_l0": torch.randn(3 * G, d_in, generator=g),
          "prefix_gru.weight_hh_l0": torch.randn(3 * G, G, generator=g),
          "rank_proj.weight": torch.randn(r, G, generator=g),
          "low_rank_lm_head.weight": torch.randn(vocab, r, generator=g),
          "embed_tokens.weight": torch.randn(vocab, hidden, generator=g)}            # a frozen copy: skipped
    if projected:
        sd["embed_down_proj.weight"] = torch.randn(d_in, hidden, generator=g)
    if mode == "target_lm_head":
        sd["rank_to_hidden.weight"] = torch.randn(hidden, r, generator=g)
    mc = {"local_head_type": "rnn", "vocab_size": vocab, "embed_dim": hidden, "gru_hidden_dim": G, "low_rank_dim": r,
          "lm_head_mode": mode, "rank_activation": "silu", "pure_draft_prefix_len": 0, "shift_label": True,
          "block_size": 16, "num_anchors": 512, **config}                  # the legacy trainer's launcher values
    d = tmp_path / f"release-{mode}-{int(projected)}"
    d.mkdir()
    # the whole training checkpoint, as the trainer saves it: its argparse.Namespace and optimizer state too
    torch.save({"epoch": 0, "global_step": 3, "args": argparse.Namespace(lr=6e-4, shift_label=True),
                "model_config": mc, "model_state_dict": sd,
                "optimizer_state_dict": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 6e-4}]},
                "scheduler_state_dict": {"last_epoch": 3}}, d / dels.RELEASE_HEAD)
    counts = torch.randint(0, 50, (vocab - 2,), generator=g)                           # shorter than V: zero-padded
    torch.save({"counts": counts, "p": counts.double() / counts.sum(), "total_target_tokens": counts.sum(),
                "metadata": {"tokenizer": "x", "loss_mask": True}}, d / dels.RELEASE_PRIOR)
    return d, sd, counts


# The serving lane's side environment (bash scripts/install.sh serve): vLLM's CPU build.
SERVE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-serve" / "bin" / "python"


def serve_python() -> Path:
    """The side environment's Python for a test that runs vLLM itself; the test is skipped, saying why in one line,
    where vLLM is not installed or SPECEXP_NO_SERVE_LANE is set."""
    import os

    import pytest

    why = "SPECEXP_NO_SERVE_LANE is set" if os.environ.get("SPECEXP_NO_SERVE_LANE") else vllm_missing()
    if why is not None:
        pytest.skip(why)
    return SERVE_PYTHON


def vllm_missing() -> str | None:
    """Why the tests that run vLLM itself cannot run here (one line), or None."""
    if not SERVE_PYTHON.is_file():
        return f"vLLM's CPU build is not installed ({SERVE_PYTHON} is missing; bash scripts/install.sh serve makes it)"
    r = subprocess.run([str(SERVE_PYTHON), "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    last = (r.stderr.strip().splitlines() or [""])[-1]
    return None if r.returncode == 0 else f"{SERVE_PYTHON} cannot import vllm: {last}"
