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

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checkpoints as ckpt
from .. import files, log, pins
from ..errors import UserError, check, one_of
from ..kernels.adaptive import build_schedule
from ..paths import REPO_ROOT
from ..schema import (
    MAX_BATCH,
    MAX_BLOCK,
    MAX_STEPS,
    MAX_WIDTH,
    FusionConfig,
    Settings,
    choice,
    frozen,
    is_int,
    null_or,
    setting,
    upto,
)
from . import dflash
from .head_loop import SequentialDrafter, gru_step, matvec, random_init
from .head_loop import head_init as resolve_head_init

WEIGHTS_FILE, PRIOR_FILE = ckpt.WEIGHTS_FILE, "log_prior.safetensors"
FUSION_WEIGHTS_FILE = "fusion_weights.json"     # learned per-position alpha/beta (fusion=learned)
KINDS = ("rnn", "markov")
ACTIVATIONS = {"silu": F.silu, "identity": lambda x: x}
LM_HEAD_MODES = ("target_factorized", "low_rank")


# ------------------------------------------------------------------------------------------- settings
@frozen
class DeLSHeadTrainSettings(Settings):
    """`drafter.head.train`: the head's own training recipe (task=train drafter=dels_*)."""
    part: str = "head"
    block_size: int | None = setting(None, null_or(is_int(2, MAX_BLOCK)), f"an int >= 2, or null; {upto(MAX_BLOCK)}")
    num_anchors: int = setting(512, is_int(1, MAX_BATCH), f"an int >= 1; {upto(MAX_BATCH)}")
    gamma: float = 7.0
    epochs: int = setting(1, is_int(1, MAX_STEPS), f"an int >= 1; {upto(MAX_STEPS)}")


@frozen
class DeLSHeadSettings(Settings):
    init: str = choice("auto", "random", "checkpoint")
    checkpoint: str | None = None
    revision: str | None = None
    input_rank: int = 256
    gru_hidden: int = setting(1024, is_int(1, MAX_WIDTH), f"an int >= 1; {upto(MAX_WIDTH)}")
    output_rank: int = 256
    activation: str = "silu"
    init_std: float = 0.02
    train: DeLSHeadTrainSettings = setting(factory=DeLSHeadTrainSettings)


@frozen
class PriorSettings(Settings):
    smoothing: float = 1.0


@frozen
class DeLSSettings(dflash.DFlashSettings):
    """The keys of `drafter=dels_rnn | dels_markov`: DFlash's, the local head's, the prior's and the fusion weights
    (`fusion`, the fusion group's values, checked there)."""
    name: str = "dels_rnn"
    head: DeLSHeadSettings = setting(factory=DeLSHeadSettings)
    prior: PriorSettings = setting(factory=PriorSettings)
    fusion: FusionConfig = setting(factory=FusionConfig)


@dataclass
class LocalHeadConfig:
    kind: str                       # rnn | markov
    hidden_size: int                # H of the target (embedding / lm_head width)
    vocab_size: int
    input_rank: int | None = 256    # rnn: E -> r_in before the GRU; None = the GRU reads E itself (the release)
    gru_hidden: int = 1024          # rnn only
    output_rank: int = 256          # r of the output factor (markov: the bigram rank)
    activation: str = "silu"        # rnn: after rank_proj (silu | identity)
    lm_head_mode: str = "target_factorized"    # | low_rank: an own [V, r] output table (the release's default)
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
        one_of(f"{where}: lm_head_mode", c.lm_head_mode, LM_HEAD_MODES)
        check(c.kind == "rnn" or c.lm_head_mode == "target_factorized",
              f"{where}: a markov head takes lm_head_mode 'target_factorized' only")
        return c


class RNNHead(nn.Module):
    def __init__(self, c: LocalHeadConfig):
        super().__init__()
        self.config = c
        # input_rank None / lm_head_mode low_rank: the released heads' layout (load_release), inference only
        self.embed_down_proj = nn.Linear(c.hidden_size, c.input_rank, bias=False) if c.input_rank else None
        self.gru = nn.GRU(c.input_rank or c.hidden_size, c.gru_hidden, num_layers=1, bias=False, batch_first=True)
        self.rank_proj = nn.Linear(c.gru_hidden, c.output_rank, bias=False)
        if c.lm_head_mode == "low_rank":
            self.low_rank_lm_head = nn.Linear(c.output_rank, c.vocab_size, bias=False)
        else:
            self.rank_to_hidden = nn.Linear(c.output_rank, c.hidden_size, bias=False)
            nn.init.zeros_(self.rank_to_hidden.weight)   # the head starts as "no opinion"

    def features(self, emb: torch.Tensor) -> torch.Tensor:
        """Embeddings `[N, L, H]` of a token run, fed from a zero state → rank states `[N, L, r]`."""
        x = emb if self.embed_down_proj is None else self.embed_down_proj(emb)         # [N, L, r_in | H]
        out, _ = self.gru(x)                                                           # [N, L, G]
        return ACTIVATIONS[self.config.activation](self.rank_proj(out))

    def hidden(self, emb: torch.Tensor) -> torch.Tensor:
        check(self.config.lm_head_mode == "target_factorized",
              "a low_rank local head (a released one) has no H-wide output to train through the target lm_head; "
              "train a head here (task=train drafter=dels_rnn)")
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
    files.replace_atomic(out, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return out


def load_prior(path: str | os.PathLike, vocab_size: int, smoothing: float, where: str) -> torch.Tensor:
    """The log prior `[V]`, recomputed from the stored counts when `smoothing` differs from the stored one."""
    f = Path(path) / PRIOR_FILE
    check(ckpt.stored(f) is not None, f"{where}: no {PRIOR_FILE} beside the head (make one with task=prior)")
    tensors, meta = ckpt.read_tensors(f, where)
    check("counts" in tensors and "log_prior" in tensors,
          f"{where}: {PRIOR_FILE} needs the tensors 'counts' and 'log_prior', found {sorted(tensors)}")
    counts, lp = tensors["counts"], tensors["log_prior"]
    try:
        stored = float(meta.get("smoothing", "nan"))
    except ValueError:
        stored = float("nan")
    check(counts.numel() <= vocab_size, f"{where}: prior covers {counts.numel()} tokens, target vocab is {vocab_size}")
    if counts.numel() < vocab_size or stored != smoothing:
        lp = log_prior_from_counts(F.pad(counts, (0, vocab_size - counts.numel())), smoothing)
    return lp


# ------------------------------------------------------------------------------ the authors' released heads
RELEASE_HEAD, RELEASE_PRIOR = "local_head.pt", "loss_mask_unigram.pt"
RELEASE_CONFIG = {"vocab_size", "embed_dim", "gru_hidden_dim", "low_rank_dim"}       # required model_config keys


def is_release(path: str | os.PathLike) -> bool:
    """A directory of the DeLS-Spec release (`local_head.pt` + `loss_mask_unigram.pt`, one per target)."""
    return (Path(path) / RELEASE_HEAD).exists() and not (Path(path) / ckpt.CONFIG_FILE).exists()


def _torch_file(f: Path, where: str):
    """A release file read by `checkpoints.read_torch` (weights_only=True): the training checkpoint keeps its
    argparse.Namespace under "args", allowed as data (attributes only)."""
    return ckpt.read_torch(f, where, allowed=[argparse.Namespace])


def load_release(path: str | os.PathLike, hidden_size: int, vocab_size: int, smoothing: float,
                 where: str) -> tuple[nn.Module, torch.Tensor]:
    """The released RNN head and its prior as this project's head (docs/checkpoints.md, "Released DeLS-Spec
    heads"): `local_head.pt` = {model_config, model_state_dict} with `prefix_gru.weight_ih_l0` [3G, H] (the GRU
    reads the target embedding itself), `prefix_gru.weight_hh_l0` [3G, G], `rank_proj.weight` [r, G] and the
    output `low_rank_lm_head.weight` [V, r] (lm_head_mode low_rank) or `rank_to_hidden.weight` [H, r]
    (target_lm_head); frozen copies `embed_tokens.*` / `target_lm_head.*` are skipped. `loss_mask_unigram.pt` =
    {counts: [V'], ...} or the bare counts (V' <= V, zero-padded). Read with weights_only=True (argparse.Namespace,
    which the training checkpoint keeps, allowed as data). Every mismatch is one line."""
    path = Path(path)
    raw = _torch_file(path / RELEASE_HEAD, where)
    check(isinstance(raw, dict) and isinstance(raw.get("model_config"), dict)
          and isinstance(raw.get("model_state_dict"), dict),
          f"{where}: {RELEASE_HEAD} must hold a dict with model_config and model_state_dict")
    mc, sd = raw["model_config"], raw["model_state_dict"]
    missing = sorted(RELEASE_CONFIG - set(mc))
    check(not missing, f"{where}: {RELEASE_HEAD} model_config lacks {missing}")
    param = mc.get("rnn_parameterization", mc.get("local_head_parameterization"))
    check(param != "direct_vocab" and mc.get("architecture") != "direct_vocab_rnn",
          f"{where}: a direct-vocab RNN head (own embedding) is not a DeLS-Spec local head this project runs")
    # pure_draft_prefix_len and shift_label shaped the training labels only: the runtime drafts every head the
    # same way (draft 1 is DFlash's alone); they are kept on the head (head.release) for the backbone check
    prefix = mc.get("pure_draft_prefix_len", 1)
    check(prefix in (0, 1), f"{where}: pure_draft_prefix_len={prefix!r}; expected 0 or 1")
    mode = {"low_rank": "low_rank", "target_lm_head": "target_factorized"}.get(mc.get("lm_head_mode", "low_rank"))
    check(mode is not None, f"{where}: lm_head_mode={mc.get('lm_head_mode')!r}; expected low_rank or target_lm_head")
    check(int(mc["embed_dim"]) == hidden_size and int(mc["vocab_size"]) == vocab_size,
          f"{where}: head for embed_dim {mc['embed_dim']} / vocab {mc['vocab_size']} does not fit the target "
          f"(hidden {hidden_size}, vocab {vocab_size})")
    projected = "embed_down_proj.weight" in sd
    c = LocalHeadConfig("rnn", hidden_size, vocab_size,
                        input_rank=int(sd["embed_down_proj.weight"].shape[0]) if projected else None,
                        gru_hidden=int(mc["gru_hidden_dim"]), output_rank=int(mc["low_rank_dim"]),
                        activation=mc.get("rank_activation", "identity"), lm_head_mode=mode)
    one_of(f"{where}: rank_activation", c.activation, ACTIVATIONS)
    rename = {"prefix_gru.weight_ih_l0": "gru.weight_ih_l0", "prefix_gru.weight_hh_l0": "gru.weight_hh_l0"}
    state = {rename.get(k, k): v for k, v in sd.items() if not k.startswith(("embed_tokens.", "target_lm_head."))}
    if mode == "target_factorized":
        state.pop("low_rank_lm_head.weight", None)     # the reference overwrites it with W_lm @ rank_to_hidden
    head = make_head(c)
    want = head.state_dict()
    check(set(state) == set(want), f"{where}: {RELEASE_HEAD} tensors {sorted(set(state) - set(want))} unexpected, "
                                   f"{sorted(set(want) - set(state))} missing")
    for k, v in state.items():
        check(torch.is_tensor(v) and tuple(v.shape) == tuple(want[k].shape),
              f"{where}: {RELEASE_HEAD} {k} has shape {tuple(getattr(v, 'shape', ()))}, "
              f"expected {tuple(want[k].shape)}")
    head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    head.release = {"shift_label": bool(mc.get("shift_label", False)), "pure_draft_prefix_len": int(prefix)}
    prior = _torch_file(path / RELEASE_PRIOR, where)
    counts = prior.get("counts") if isinstance(prior, dict) else prior
    check(torch.is_tensor(counts), f"{where}: {RELEASE_PRIOR} must hold a tensor or a dict with 'counts'")
    counts = counts.reshape(-1).double()
    check(counts.numel() <= vocab_size and bool((counts >= 0).all()) and bool(torch.isfinite(counts).all()),
          f"{where}: {RELEASE_PRIOR} holds {counts.numel()} counts (at most {vocab_size}, finite, >= 0 expected)")
    return head, log_prior_from_counts(F.pad(counts, (0, vocab_size - counts.numel())), smoothing)


def resolve_head(spec: str, revision: str | None, where: str) -> Path:
    """A head directory: local (this project's format or the release's), or on the hub as `owner/name` (this
    project's format: config.json + safetensors) or `owner/name/subfolder` (the release: its two .pt files of
    that subfolder, nothing else). `revision` pins the hub commit."""
    p = Path(os.path.expanduser(spec))
    if spec.count("/") != 2 or p.exists() or spec.startswith((".", "/", "~")) or (REPO_ROOT / spec).exists():
        return ckpt.resolve(spec, revision)
    from huggingface_hub import snapshot_download

    repo, sub = spec.rsplit("/", 1)
    revision = pins.revision(repo, revision)
    try:
        root = snapshot_download(repo, revision=revision,
                                 allow_patterns=[f"{sub}/{RELEASE_HEAD}", f"{sub}/{RELEASE_PRIOR}"])
    except Exception as e:
        at = f" at revision {revision!r}" if revision is not None else ""
        raise UserError(f"{where}: not a local directory and not downloadable from the hub{at} "
                        f"({type(e).__name__}); download it and pass the directory") from None
    return Path(root) / sub

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
            proj = head.embed_down_proj
            if proj is None:                     # the GRU reads E itself: the target's table, not a copy of it
                self.in_table = embed.to(device=device, dtype=dtype)                     # [V, H]
            else:
                self.in_table = (e @ proj.weight.to(**f32).T).to(dtype)                 # [V, r_in]
            if c.lm_head_mode == "low_rank":
                self.w_out = head.low_rank_lm_head.weight.to(device=device, dtype=dtype)   # [V, r]
            else:
                self.w_out = (w_lm @ head.rank_to_hidden.weight.to(**f32)).to(dtype)     # [V, r]
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
    loop, kernels and CUDA graph are drafters/head_loop.py)."""

    def __init__(self, backbone: dflash.DFlashDrafter, head: MergedHead, log_prior: torch.Tensor,
                 alpha, beta, backend: str = "auto", cuda_graph: str | bool = "auto", schedule=None):
        n = max(backbone.max_drafts - 1, 0)
        super().__init__(backbone, head.w_out, log_prior, per_position("alpha", alpha, n),
                         per_position("beta", beta, n), backbone.max_drafts, backend, cuda_graph, schedule)
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
    """The architecture of a new head for `target` from the drafter's settings (DeLSSettings or its group)."""
    cfg = DeLSSettings.of(cfg)
    h = cfg.head
    kind = {"dels_rnn": "rnn", "dels_markov": "markov"}[cfg.name]
    return LocalHeadConfig(kind, target.hidden_size, target.vocab_size, h.input_rank, h.gru_hidden, h.output_rank,
                           h.activation)


def build(cfg: DeLSSettings, target) -> DeLSDrafter:
    """From the `drafter` config group (dels_rnn / dels_markov): the DFlash backbone exactly as `drafter=dflash`
    builds it (`init`), the local head and its prior by `head.init` (auto = random with a random backbone,
    else the head checkpoint, which must then be set), fusion weights from `fusion`."""
    fu = cfg.fusion
    head_init = resolve_head_init(cfg, target, "DeLS", f"task=train drafter={cfg.name}")
    head_ckpt = cfg.head.checkpoint
    backbone = dflash.build(cfg, target)
    if head_init == "random":
        head = random_head(head_config(cfg, target), cfg.seed, cfg.head.init_std)
        log_prior = log_prior_from_counts(random_prior(target.vocab_size, cfg.seed), cfg.prior.smoothing)
    else:
        where = f"drafter.head.checkpoint={str(head_ckpt)!r}"
        path = resolve_head(str(head_ckpt), cfg.head.revision, where)
        release = is_release(path)
        if release:
            head, log_prior = load_release(path, target.hidden_size, target.vocab_size, cfg.prior.smoothing, where)
            check(head.release["shift_label"] or getattr(backbone, "first_row", 1) == 1,
                  f"{where}: an unshifted head (shift_label=False) on a shifted DFlash backbone; the reference "
                  "pairs shifted backbones with shift_label=True heads only")
        else:
            head = load_head(path, where)
        c = head.config
        check(c.kind == head_config(cfg, target).kind, f"{where}: a {c.kind} head, but drafter={cfg.name}")
        check(c.hidden_size == target.hidden_size and c.vocab_size == target.vocab_size,
              f"{where}: head for hidden {c.hidden_size} / vocab {c.vocab_size} does not fit target {target.name} "
              f"(hidden {target.hidden_size}, vocab {target.vocab_size})")
        if not release:
            log_prior = load_prior(path, target.vocab_size, cfg.prior.smoothing, where)
    merged = MergedHead(head, target.embed_tokens.weight, target.lm_head.weight, target.dtype, target.device)
    alpha, beta = fu.alpha, fu.beta
    schedule = build_schedule(fu.adaptive, fu.schedule)
    if schedule is not None:
        check("learned" not in (alpha, beta), f"fusion.adaptive={fu.adaptive} computes alpha and beta itself; "
                                              "fusion.alpha / fusion.beta 'learned' would be ignored: drop one")
        log.LOG.info(f"fusion: adaptive weights, {schedule.describe()} (fusion.alpha / fusion.beta not read)")
        alpha = beta = 0.0
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
                log.LOG.info(f"fusion=learned: {key} has {len(vals)} per-position weights, the backbone fuses "
                             f"{n} drafts: using the first {n}")
                learned[key] = vals[:n]
        alpha = learned["alpha"] if alpha == "learned" else alpha
        beta = learned["beta"] if beta == "learned" else beta
    return dflash.as_mode(DeLSDrafter(backbone, merged, log_prior, alpha, beta, fu.kernel, fu.cuda_graph, schedule),
                          cfg)
