"""Domino-FT (arXiv 2605.29707, as DeLS-Spec's baseline): a frozen DFlash drafter whose logits are corrected by
a GRU over the drafted prefix and a low-rank residual head. See docs/methods.md, Domino-FT (from the first
author's SpecForge port and the DeLS runtime's Domino path).

Per block (z_k = DFlash hidden after the final norm at block row k, u_k = W_lm z_k its logits):
    s        = GRU(E[a]) then GRU(E[d1]), ...        bias-free GRU (hidden 1024) over the frozen target embeddings
    d_first  = pick(u_first)                          the first draft is DFlash's alone
    d_next   = pick(u_k + g * W2 silu(W1 [z_k ; s]))  W1: (H + 1024) -> 256, W2: 256 -> V, no biases; g = guidance
    s        = GRU(E[d_next], s)
Alignments (`head.alignment`):
- unshifted (z-lab DFlash, our checkpoints): block row k predicts x_{a+k}; rows 1..B-1 are the K = B-1
  drafts; rows k >= 2 are corrected with the state after [a, x_{a+1}, ..., x_{a+k-1}].
- shifted (DSpark / SpecForge `shift_label: true`): row k predicts x_{a+k+1}; rows 0..B-1 are K = B drafts;
  rows k >= 1 are corrected with the state after [a, x_{a+1}, ..., x_{a+k}].
Either way the first corrected draft sees [a, d1]. The correction is a rank-256 factor W2 (V x 256) applied to
a rank-256 state, so the fusion kernel of DeLS-Spec serves it (alpha = g, beta = 0).
Checkpoint (a directory): config.json + model.safetensors (`prefix_gru.*`, `embed_proj.0.weight`,
`embed_proj.2.weight`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import checkpoints as ckpt
from ..errors import UserError, check, one_of
from ..schema import (
    MAX_BATCH,
    MAX_STEPS,
    MAX_WIDTH,
    FusionConfig,
    Settings,
    choice,
    frozen,
    is_int,
    is_num,
    setting,
    upto,
)
from . import dflash
from .head_loop import SequentialDrafter, gru_step, matvec, random_init
from .head_loop import head_init as resolve_head_init

WEIGHTS_FILE = ckpt.WEIGHTS_FILE
ALIGNMENTS = ("unshifted", "shifted")


# ------------------------------------------------------------------------------------------- settings
@frozen
class DominoTrainSettings(Settings):
    """`drafter.head.train`: Domino-FT's own training recipe (task=train drafter=domino_ft)."""
    num_anchors: int = setting(256, is_int(1, MAX_BATCH), f"an int >= 1; {upto(MAX_BATCH)}")
    gamma: float = 7.0
    epochs: int = setting(6, is_int(1, MAX_STEPS), f"an int >= 1; {upto(MAX_STEPS)}")
    lambda_start: float = 0.0
    lambda_decay_ratio: float = 0.5


@frozen
class DominoHeadSettings(Settings):
    init: str = choice("auto", "random", "checkpoint")
    checkpoint: str | None = None
    gru_hidden: int = setting(1024, is_int(1, MAX_WIDTH), f"an int >= 1; {upto(MAX_WIDTH)}")
    emb_dim: int = 256
    guidance: float = setting(1.0, is_num(), "a finite number (the weight of the correction)")
    alignment: str = choice(*ALIGNMENTS)
    init_std: float = 0.02
    train: DominoTrainSettings = setting(factory=DominoTrainSettings)


@frozen
class DominoSettings(dflash.DFlashSettings):
    """The keys of `drafter=domino_ft`: DFlash's, the prefix-GRU head's and `fusion` (its kernel choices)."""
    name: str = "domino_ft"
    head: DominoHeadSettings = setting(factory=DominoHeadSettings)
    fusion: FusionConfig = setting(factory=FusionConfig)


@dataclass
class DominoConfig:
    hidden_size: int
    vocab_size: int
    gru_hidden: int = 1024
    emb_dim: int = 256
    alignment: str = "unshifted"
    architecture: str = field(default="domino_head", init=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "DominoConfig":
        check(d.get("architecture") == "domino_head",
              f"{where}: not a Domino head (architecture {d.get('architecture')!r}, expected 'domino_head')")
        try:
            c = cls(**{k: v for k, v in d.items() if k != "architecture"})
        except TypeError as e:
            raise UserError(f"{where}: {e}") from None
        one_of(f"{where}: alignment", c.alignment, ALIGNMENTS)
        return c

    @property
    def first_row(self) -> int:
        """Block row of the first draft (unshifted: 1, shifted: 0)."""
        return 1 if self.alignment == "unshifted" else 0


class DominoHead(nn.Module):
    def __init__(self, c: DominoConfig):
        super().__init__()
        self.config = c
        self.prefix_gru = nn.GRU(c.hidden_size, c.gru_hidden, num_layers=1, bias=False, batch_first=True)
        self.embed_proj = nn.Sequential(nn.Linear(c.hidden_size + c.gru_hidden, c.emb_dim, bias=False), nn.SiLU(),
                                        nn.Linear(c.emb_dim, c.vocab_size, bias=False))

    def states(self, emb: torch.Tensor) -> torch.Tensor:
        """GRU states after each prefix token: embeddings `[N, L, H]` from a zero state → `[N, L, G]`."""
        return self.prefix_gru(emb)[0]

    def correction(self, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Residual logits from DFlash hidden `[..., H]` and prefix state `[..., G]` → `[..., V]`."""
        return self.embed_proj(torch.cat([z, s], dim=-1))


def save_head(head: DominoHead, path, dtype=None) -> None:
    ckpt.save_module(head, path, head.config.to_dict(), dtype)


def load_head(path, where: str) -> DominoHead:
    """Strict (specexp/checkpoints.py): a missing, unexpected or misshapen tensor is one clear error."""
    check(Path(path).is_dir(), f"{where}: no such directory (train a head with task=train drafter=domino_ft; the "
                               f"mini head on SmolLM2 is not committed, it is built by `python -m specexp "
                               f"experiment=mini_domino_ft`)")
    head = DominoHead(DominoConfig.from_dict(ckpt.read_config(path, where), where))
    return ckpt.load_module(head, path, where)


# ------------------------------------------------------------------ released Domino drafters (one directory)
# `Huang2020/Qwen3-{4B,8B}-Domino-b16` (docs/checkpoints.md): a whole drafter, the DFlash backbone trained together
# with the head. config.json = the z-lab DFlash config with `dflash_config.projector_type: "domino"`, `emb_dim`,
# `gru_hidden_dim`, `pure_draft_prefix_len`, `shift_label`; one weight file holding the z-lab DFlash tensors and
# the head's `prefix_gru.*`, `embed_proj.0.weight`, `embed_proj.2.weight` (early files: under `logit_head.`).
RELEASE_FIELDS = ("projector_type", "emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label")
LEGACY_PREFIX = "logit_head."


def is_release(raw: dict) -> bool:
    dc = raw.get("dflash_config")
    return isinstance(dc, dict) and dc.get("projector_type") == "domino"


def _tensor_names(path: Path, where: str) -> set[str]:
    names: set[str] = set()
    for f in ckpt.weight_files(path, where):
        names.update(ckpt.read_tensors(path / f, where)[0])
    return names


def load_release(path, where: str, raw: dict | None = None) -> tuple[dflash.DFlashDraftModel, DominoHead]:
    """The backbone and the head of a released Domino drafter directory, each strictly matched (`raw`: its
    config.json when the caller has read it)."""
    path = Path(path)
    raw = ckpt.read_config(path, where) if raw is None else raw
    dc = dict(raw["dflash_config"])
    for k in ("emb_dim", "gru_hidden_dim"):
        v = dc.get(k)
        check(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              f"{where}: dflash_config.{k}={v!r} must be an int >= 1")
    shift = dc.get("shift_label", False)
    check(isinstance(shift, bool), f"{where}: dflash_config.shift_label={shift!r} must be true or false")
    prefix = dc.get("pure_draft_prefix_len", 0)
    check(prefix == 1, f"{where}: dflash_config.pure_draft_prefix_len={prefix!r}: only 1 is supported (the first "
                       "draft is DFlash's alone, every later one corrected)")
    bb_raw = {k: v for k, v in raw.items() if k != "emb_dim"}
    bb_raw["dflash_config"] = {k: v for k, v in dc.items() if k not in RELEASE_FIELDS}
    config = dflash.DFlashConfig.from_dict(bb_raw, f"{where}: config.json")
    head_cfg = DominoConfig(config.hidden_size, config.vocab_size, dc["gru_hidden_dim"],
                            dc["emb_dim"], "shifted" if shift else "unshifted")
    with torch.device("meta"):
        bb, head = dflash.DFlashDraftModel(config), DominoHead(head_cfg)
    legacy = any(n.startswith(LEGACY_PREFIX) for n in _tensor_names(path, where))
    hp = LEGACY_PREFIX if legacy else ""
    expected = {**bb.state_dict(), **{hp + k: v for k, v in head.state_dict().items()}}
    check(not set(bb.state_dict()) & {hp + k for k in head.state_dict()}, f"{where}: clashing tensor names")
    state = ckpt.load_state(path, expected, where)
    bb.load_state_dict({k: state[k] for k in bb.state_dict()}, strict=True, assign=True)
    head.load_state_dict({k: state[hp + k] for k in head.state_dict()}, strict=True, assign=True)
    return bb.eval(), head.eval()


class DominoDrafter(SequentialDrafter):
    """DFlash + Domino correction, drafted left to right (see the module docstring). The correction is the
    shared fusion with alpha = guidance, beta = 0 and state z = silu(W1 [hidden_k ; s])."""

    def __init__(self, backbone: dflash.DFlashDrafter, head: DominoHead, embed: torch.Tensor, guidance: float,
                 backend: str = "auto", cuda_graph: str | bool = "auto"):
        c, dev, dtype = head.config, embed.device, embed.dtype
        k = backbone.block_size - c.first_row
        with torch.no_grad():
            w_out = head.embed_proj[2].weight.to(dev, dtype)                               # [V, r]
            w1 = head.embed_proj[0].weight.to(dev, dtype)                                  # [r, H + G]
            self.w_ih = head.prefix_gru.weight_ih_l0.to(dev, dtype)                       # [3G, H] gates r, z, n
            self.w_hh = head.prefix_gru.weight_hh_l0.to(dev, dtype)                       # [3G, G]
        self.w1_z, self.w1_s = w1[:, : c.hidden_size], w1[:, c.hidden_size:]               # [r, H], [r, G]
        super().__init__(backbone, w_out, torch.zeros(c.vocab_size), [float(guidance)] * max(k - 1, 0),
                         [0.0] * max(k - 1, 0), k, backend, cuda_graph)
        self.config, self.guidance, self.name = c, float(guidance), "domino_ft"
        self.first_row = c.first_row
        self.embed = embed                                                                 # [V, H] frozen

    def _gru(self, token: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """One GRU step on E[token] (`[]` → `[G]`; a batch of blocks, propose_all: `[a]` → `[a, G]`)."""
        x = self.embed.index_select(0, token.view(-1))                                    # [a, H]
        return gru_step(self.w_ih, self.w_hh, x[0] if token.dim() == 0 else x, h)

    def block_inputs(self, anchor: int, start: int, k: int) -> dict[str, torch.Tensor]:
        hidden, _ = self.backbone.block_logits(anchor, start, 0)                           # [1, B, H]
        r0 = self.config.first_row
        rows = hidden[0, r0: r0 + k]                                                       # [k, H]
        return {"long": self.backbone.lm_head(rows), "hidden": rows,                       # [k, V], [k, H]
                "anchor": torch.full((), anchor, device=rows.device)}                      # a fill, not a copy

    def begin(self, x, first):
        return self._gru(first, self._gru(x["anchor"], None))                              # after [a, d1]

    def feature(self, x, state, i):
        return F.silu(matvec(self.w1_z, x["hidden"][i]) + matvec(self.w1_s, state))        # [r] | [a, r]

    def advance(self, state, token):
        return self._gru(token, state)


def random_head(c: DominoConfig, seed: int, std: float) -> DominoHead:
    return random_init(DominoHead(c), seed, std)


def build(cfg: DominoSettings, target) -> DominoDrafter:
    """`drafter=domino_ft`: the DFlash backbone as drafter=dflash builds it + the Domino head (`head.init` as
    for the DeLS heads: random with a random backbone, else the head checkpoint, which must then be set)."""
    h = cfg.head
    check(cfg.fusion.adaptive is None,
          f"fusion.adaptive={cfg.fusion.adaptive} is DeLS-Spec's (dels_rnn, dels_markov): Domino-FT's correction has "
          "one fixed guidance weight (drafter.head.guidance) and no unigram prior to weigh")
    ckpt_dir = h.checkpoint
    path = raw = None
    if cfg.init != "random" and cfg.checkpoint and not ckpt_dir:          # a released Domino drafter?
        where = f"drafter.checkpoint={str(cfg.checkpoint)!r}"
        path = ckpt.resolve(str(cfg.checkpoint), cfg.revision)
        raw = ckpt.read_config(path, where)
        if is_release(raw):
            model, head = load_release(path, where, raw)
            dflash.check_fits(model.config, target, where)
            c = head.config
            check(c.alignment == h.alignment, f"{where}: a released Domino drafter trained with alignment "
                                              f"{c.alignment} (shift_label), set drafter.head.alignment={c.alignment}")
            model = model.to(device=target.device, dtype=target.dtype).requires_grad_(False)
            return dflash.as_mode(DominoDrafter(dflash.DFlashDrafter(model, target), head, target.embed_tokens.weight,
                                                h.guidance, cfg.fusion.kernel, cfg.fusion.cuda_graph), cfg)
    head_init = resolve_head_init(cfg, target, "Domino", "task=train drafter=domino_ft")
    backbone = dflash.build(cfg, target, path, raw)          # the checkpoint looked at above, not read again
    if head_init == "random":
        c = DominoConfig(target.hidden_size, target.vocab_size, h.gru_hidden, h.emb_dim, h.alignment)
        head = random_head(c, cfg.seed, h.init_std)
    else:
        where = f"drafter.head.checkpoint={str(ckpt_dir)!r}"
        head = load_head(ckpt.resolve(str(ckpt_dir)), where)
        c = head.config
        check(c.hidden_size == target.hidden_size and c.vocab_size == target.vocab_size,
              f"{where}: head for hidden {c.hidden_size} / vocab {c.vocab_size} does not fit target {target.name}")
        check(c.alignment == h.alignment, f"{where}: trained with alignment {c.alignment}, drafter.head.alignment="
                                          f"{h.alignment}")
    check(backbone.first_row == 1 or c.alignment == "shifted",
          f"drafter.checkpoint={str(cfg.checkpoint)!r}: a shifted (DSpark-format) DFlash backbone needs a "
          f"head with alignment shifted, not {c.alignment}")
    return dflash.as_mode(DominoDrafter(backbone, head, target.embed_tokens.weight, h.guidance, cfg.fusion.kernel,
                                        cfg.fusion.cuda_graph), cfg)
