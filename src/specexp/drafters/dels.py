"""DeLS-Spec (arXiv 2607.07409): a frozen DFlash drafter (the long-context expert) fused with a small local
head (the short-context expert) and a unigram prior. See docs/methods.md, DeLS-Spec (from the official runtime).

Per block of K drafts (K = DFlash's max_drafts):
    d1            = pick(long_1)                                  DFlash alone
    state         = head.begin(d1)                                RNN: h1 = GRU(E[d1], 0), the anchor is not fed
    for i = 1..K-1:
        short_i   = W_out @ head.feature(state)                   [V], rank-r factor, never materialised on GPU
        d_{i+1}   = pick(long_{i+1} + alpha_i * short_i - beta_i * log_prior)
        state     = head.advance(state, d_{i+1})
`pick` = argmax (greedy, protocol A) or a sample with its probability (protocol B); alpha_i, beta_i are
scalars or per-position lists of length K-1 (entry i-1 applies to draft i+1). Raw logits, no log_softmax
and no temperature on the terms (per-row constants cancel in the softmax), as the reference runtime.

Local heads read the frozen target embedding E and write through the frozen target lm_head W_lm:
- rnn ("target_factorized"): E -> embed_down_proj (H->r_in) -> GRU(r_in->G, no bias) -> rank_proj (G->r)
  -> SiLU -> rank_to_hidden (r->H, zero init) -> W_lm.   Inference: W_out = W_lm @ rank_to_hidden (V x r).
- markov (rank-r bigram): E[x_prev] -> embed_down_proj (H->r) -> rank_to_hidden (r->H, zero init) -> W_lm.
  Inference: in_table = E @ embed_down_proj^T (V x r), W_out = W_lm @ rank_to_hidden (V x r).
Checkpoint (a directory): config.json + model.safetensors (trained weights only, names above) +
log_prior.safetensors (assistant-token counts and the smoothed log prior).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checkpoints as ckpt
from ..errors import UserError, check, one_of
from . import dflash
from .sequential import SequentialDrafter, check_fusion_options, gru_step, matvec, random_init
from .sequential import head_init as resolve_head_init

WEIGHTS_FILE, PRIOR_FILE = ckpt.WEIGHTS_FILE, "log_prior.safetensors"
FUSION_WEIGHTS_FILE = "fusion_weights.json"     # learned per-position alpha/beta (fusion=learned)
KINDS = ("rnn", "markov")
ACTIVATIONS = {"silu": F.silu, "identity": lambda x: x}


@dataclass
class LocalHeadConfig:
    kind: str                       # rnn | markov
    hidden_size: int                # H of the target (embedding / lm_head width)
    vocab_size: int
    input_rank: int = 256           # rnn: E -> r_in before the GRU
    gru_hidden: int = 1024          # rnn only
    output_rank: int = 256          # r of the output factor (markov: the bigram rank)
    activation: str = "silu"        # rnn: after rank_proj (silu | identity)
    lm_head_mode: str = "target_factorized"
    architecture: str = field(default="dels_local_head", init=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "LocalHeadConfig":
        check(d.get("architecture") == "dels_local_head",
              f"{where}: not a DeLS local head (architecture {d.get('architecture')!r}, expected 'dels_local_head')")
        d = {k: v for k, v in d.items() if k != "architecture"}
        try:
            c = cls(**d)
        except TypeError as e:
            raise UserError(f"{where}: {e}") from None
        one_of(f"{where}: kind", c.kind, KINDS)
        one_of(f"{where}: activation", c.activation, ACTIVATIONS)
        check(c.lm_head_mode == "target_factorized",
              f"{where}: lm_head_mode {c.lm_head_mode!r} is not supported (only 'target_factorized')")
        return c


class RNNHead(nn.Module):
    def __init__(self, c: LocalHeadConfig):
        super().__init__()
        self.config = c
        self.embed_down_proj = nn.Linear(c.hidden_size, c.input_rank, bias=False)
        self.gru = nn.GRU(c.input_rank, c.gru_hidden, num_layers=1, bias=False, batch_first=True)
        self.rank_proj = nn.Linear(c.gru_hidden, c.output_rank, bias=False)
        self.rank_to_hidden = nn.Linear(c.output_rank, c.hidden_size, bias=False)
        nn.init.zeros_(self.rank_to_hidden.weight)       # the head starts as "no opinion"

    def features(self, emb: torch.Tensor) -> torch.Tensor:
        """Embeddings `[N, L, H]` of a token run, fed from a zero state → rank states `[N, L, r]`."""
        out, _ = self.gru(self.embed_down_proj(emb))                                   # [N, L, G]
        return ACTIVATIONS[self.config.activation](self.rank_proj(out))

    def hidden(self, emb: torch.Tensor) -> torch.Tensor:
        return self.rank_to_hidden(self.features(emb))                                 # [N, L, H] → W_lm


class MarkovHead(nn.Module):
    def __init__(self, c: LocalHeadConfig):
        super().__init__()
        self.config = c
        self.embed_down_proj = nn.Linear(c.hidden_size, c.output_rank, bias=False)
        self.rank_to_hidden = nn.Linear(c.output_rank, c.hidden_size, bias=False)
        bound = c.hidden_size ** -0.5
        nn.init.uniform_(self.embed_down_proj.weight, -bound, bound)
        nn.init.zeros_(self.rank_to_hidden.weight)

    def features(self, emb: torch.Tensor) -> torch.Tensor:
        return self.embed_down_proj(emb)                                               # [N, L, r]

    def hidden(self, emb: torch.Tensor) -> torch.Tensor:
        return self.rank_to_hidden(self.features(emb))                                 # [N, L, H]


HEADS = {"rnn": RNNHead, "markov": MarkovHead}


def make_head(c: LocalHeadConfig) -> nn.Module:
    return HEADS[c.kind](c)


def save_head(head: nn.Module, path: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
    ckpt.save_module(head, path, head.config.to_dict(), dtype)


def load_head(path: str | os.PathLike, where: str) -> nn.Module:
    """Strict (specexp/checkpoints.py): a missing, unexpected or misshapen tensor is one clear error."""
    check(Path(path).is_dir(),
          f"{where}: no such directory (train a head with task=train drafter=dels_rnn|dels_markov)")
    head = make_head(LocalHeadConfig.from_dict(ckpt.read_config(path, where), where))
    return ckpt.load_module(head, path, where)


# ------------------------------------------------------------------------------------------ unigram prior
def log_prior_from_counts(counts: torch.Tensor, smoothing: float = 1.0) -> torch.Tensor:
    """`log((c + s) / Σ(c + s))` over the full vocabulary, natural log, fp32 (s = 1: Laplace, the reference
    default). s = 0 gives unseen tokens the smallest seen log-probability, as the reference does."""
    c = counts.double()
    if smoothing > 0:
        lp = torch.log(c + smoothing) - math.log(float((c + smoothing).sum()))
    else:
        seen = c > 0
        check(bool(seen.any()), "prior: no counted tokens")
        lp = torch.log(c) - math.log(float(c.sum()))
        lp[~seen] = lp[seen].min()
    return lp.float()


def save_prior(counts: torch.Tensor, path: str | os.PathLike, smoothing: float, source: dict) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    out = path / PRIOR_FILE
    tensors = {"counts": counts.to(torch.int64).contiguous(), "log_prior": log_prior_from_counts(counts, smoothing)}
    meta = {"smoothing": str(smoothing), "source": json.dumps(source)}
    ckpt.replace_atomic(out, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return out


def load_prior(path: str | os.PathLike, vocab_size: int, smoothing: float, where: str) -> torch.Tensor:
    """The log prior `[V]`, recomputed from the stored counts when `smoothing` differs from the stored one."""
    from safetensors import safe_open

    f = Path(path) / PRIOR_FILE
    check(f.exists(), f"{where}: no {PRIOR_FILE} beside the head (make one with task=prior)")
    try:
        with safe_open(str(f), "pt") as st:
            stored = float((st.metadata() or {}).get("smoothing", "nan"))
            counts, lp = st.get_tensor("counts"), st.get_tensor("log_prior")
    except Exception as e:                      # torn or foreign file, or a tensor missing
        raise UserError(f"{where}: cannot read {PRIOR_FILE} ({type(e).__name__}: {e})") from None
    check(counts.numel() <= vocab_size, f"{where}: prior covers {counts.numel()} tokens, target vocab is {vocab_size}")
    if counts.numel() < vocab_size or stored != smoothing:
        lp = log_prior_from_counts(F.pad(counts, (0, vocab_size - counts.numel())), smoothing)
    return lp


# ------------------------------------------------------------------------------------- inference head
class MergedHead:
    """The head folded into the target's frozen weights for inference; all tables `[V, r]` in one dtype.
    State: rnn = GRU hidden `[G]`; markov = the previous token's rank vector `[r]`."""

    def __init__(self, head: nn.Module, embed: torch.Tensor, lm_head: torch.Tensor, dtype, device):
        c = head.config
        f32 = dict(dtype=torch.float32, device=device)
        with torch.no_grad():
            e, w_lm = embed.to(**f32), lm_head.to(**f32)                                # [V, H]
            self.kind, self.act = c.kind, ACTIVATIONS[c.activation]
            self.in_table = (e @ head.embed_down_proj.weight.to(**f32).T).to(dtype)      # [V, r_in]
            self.w_out = (w_lm @ head.rank_to_hidden.weight.to(**f32)).to(dtype)         # [V, r]
            if c.kind == "rnn":
                self.w_ih = head.gru.weight_ih_l0.to(device=device, dtype=dtype)         # [3G, r_in] gates r, z, n
                self.w_hh = head.gru.weight_hh_l0.to(device=device, dtype=dtype)         # [3G, G]
                self.w_rank = head.rank_proj.weight.to(device=device, dtype=dtype)       # [r, G]
        self.rank = self.w_out.shape[1]

    # One block: a token `[]`, a state `[G]` | `[r]`; a batch of blocks (propose_all): tokens `[a]`, states `[a, ...]`.
    def _row(self, token: torch.Tensor) -> torch.Tensor:
        # index_select, not table[token]: a 0-d tensor index is read on the host, which a CUDA graph forbids
        rows = self.in_table.index_select(0, token.view(-1))                             # [a, r_in]
        return rows[0] if token.dim() == 0 else rows

    def begin(self, token: torch.Tensor) -> torch.Tensor:
        x = self._row(token)
        return gru_step(self.w_ih, self.w_hh, x, None) if self.kind == "rnn" else x

    def advance(self, state: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        x = self._row(token)
        return gru_step(self.w_ih, self.w_hh, x, state) if self.kind == "rnn" else x

    def feature(self, state: torch.Tensor) -> torch.Tensor:
        return self.act(matvec(self.w_rank, state)) if self.kind == "rnn" else state    # [r] | [a, r]


def per_position(name: str, value, n: int) -> list[float]:
    """A scalar or a list of n = K-1 weights (entry i-1 for draft i+1), each finite."""
    listlike = not isinstance(value, str) and hasattr(value, "__len__")         # list, tuple, ListConfig
    vals = list(value) if listlike else [value] * n
    check(len(vals) == n, f"fusion.{name}={list(vals)}: expected a number or a list of {n} (one per draft 2..{n + 1})")
    for v in vals:
        check(isinstance(v, (int, float)) and math.isfinite(v),
              f"fusion.{name}={v!r} is not a finite number")
    return [float(v) for v in vals]


# ----------------------------------------------------------------------------------------- the drafter
class DeLSDrafter(SequentialDrafter):
    """DFlash long logits + local head + prior, fused position by position (see the module docstring; the
    loop, kernels and CUDA graph are drafters/sequential.py)."""

    def __init__(self, backbone: dflash.DFlashDrafter, head: MergedHead, log_prior: torch.Tensor,
                 alpha, beta, backend: str = "auto", cuda_graph: str | bool = "auto"):
        n = max(backbone.max_drafts - 1, 0)
        super().__init__(backbone, head.w_out, log_prior, per_position("alpha", alpha, n),
                         per_position("beta", beta, n), backbone.max_drafts, backend, cuda_graph)
        self.head, self.name = head, f"dels_{head.kind}"
        self.first_row = getattr(backbone, "first_row", 1)          # 0 on a shifted (DSpark-format) backbone

    def block_inputs(self, anchor: int, start: int, k: int) -> dict[str, torch.Tensor]:
        return {"long": self.backbone.block_logits(anchor, start, k)[1]}                   # [k, V]

    def begin(self, x, first):
        return self.head.begin(first)                                 # the anchor is not fed (reference runtime)

    def feature(self, x, state, i):
        return self.head.feature(state)

    def advance(self, state, token):
        return self.head.advance(state, token)


# ---------------------------------------------------------------------------------------------- builder
def random_head(c: LocalHeadConfig, seed: int, std: float) -> nn.Module:
    return random_init(make_head(c), seed, std)


def random_prior(vocab_size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.poisson(torch.rand(vocab_size, generator=g) * 3).long()


def head_config(cfg, target) -> LocalHeadConfig:
    h = cfg.head
    kind = {"dels_rnn": "rnn", "dels_markov": "markov"}[cfg.name]
    return LocalHeadConfig(kind, target.hidden_size, target.vocab_size, h.input_rank, h.gru_hidden, h.output_rank,
                           h.activation)


def build(cfg, target) -> DeLSDrafter:
    """From the `drafter` config group (dels_rnn / dels_markov): the DFlash backbone exactly as `drafter=dflash`
    builds it (`init`), the local head and its prior by `head.init` (auto = random with a random backbone,
    else the head checkpoint, which must then be set), fusion weights from `fusion`."""
    fu = cfg.fusion
    check_fusion_options(fu)
    head_init = resolve_head_init(cfg, target, "DeLS", f"task=train drafter={cfg.name}")
    head_ckpt = cfg.head.get("checkpoint")
    backbone = dflash.build(cfg, target)
    if head_init == "random":
        head = random_head(head_config(cfg, target), cfg.seed, cfg.head.init_std)
        log_prior = log_prior_from_counts(random_prior(target.vocab_size, cfg.seed), cfg.prior.smoothing)
    else:
        where = f"drafter.head.checkpoint={str(head_ckpt)!r}"
        path = dflash.resolve_checkpoint(str(head_ckpt))
        head = load_head(path, where)
        c = head.config
        check(c.kind == head_config(cfg, target).kind, f"{where}: a {c.kind} head, but drafter={cfg.name}")
        check(c.hidden_size == target.hidden_size and c.vocab_size == target.vocab_size,
              f"{where}: head for hidden {c.hidden_size} / vocab {c.vocab_size} does not fit target {target.name} "
              f"(hidden {target.hidden_size}, vocab {target.vocab_size})")
        log_prior = load_prior(path, target.vocab_size, cfg.prior.smoothing, where)
    merged = MergedHead(head, target.embed_tokens.weight, target.lm_head.weight, target.dtype, target.device)
    alpha, beta = fu.alpha, fu.beta
    if "learned" in (alpha, beta):
        check(head_init == "checkpoint", "fusion=learned reads fusion_weights.json beside a trained head; "
                                         "set drafter.head.checkpoint=DIR")
        f = path / FUSION_WEIGHTS_FILE
        check(f.exists(), f"fusion=learned: no {FUSION_WEIGHTS_FILE} in {path} (train it with task=train "
                          f"drafter={cfg.name} drafter.head.train.part=fusion_weights train.export_dir={path})")
        learned = json.loads(f.read_text())
        n = max(backbone.max_drafts - 1, 0)
        for key in ("alpha", "beta"):
            vals = learned.get(key)
            if isinstance(vals, list) and len(vals) > n:
                # DeLS-Spec plugs a head trained at block 16 (14 fused drafts) into shorter drafters (DSpark block 7:
                # 6 fused drafts) with its per-position lists cut to the first n entries.
                print(f"specexp: fusion=learned: {key} has {len(vals)} per-position weights, the backbone fuses "
                      f"{n} drafts: using the first {n}", flush=True)
                learned[key] = vals[:n]
        alpha = learned["alpha"] if alpha == "learned" else alpha
        beta = learned["beta"] if beta == "learned" else beta
    return DeLSDrafter(backbone, merged, log_prior, alpha, beta, fu.kernel, fu.cuda_graph)
