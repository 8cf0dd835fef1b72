"""Exact resume: a training run interrupted and resumed from its `last.ckpt` ends with the same weights, bit for
bit, as one that was never interrupted.

Lightning restores the weights, the optimizer, the LR schedule and the step counters, but not what decides the
data and the randomness:
- data order: `EpochSampler` computes epoch e's permutation from (seed, e) alone, and after a resume skips the
  batches of that epoch the checkpoint already trained on (a plain shuffling DataLoader restarts the epoch, in
  the order of epoch 0, since its generator restarts from the seed);
- random generators: `ResumeState` stores torch's (CPU and CUDA), Python's and NumPy's generator states and the
  sampler's position with every checkpoint, and puts the generators back right before the first batch trained
  after a resume, where the uninterrupted run had them.
The training modules' own per-step generators are seeded from (seed, global_step), which Lightning restores.

`last_checkpoint` refuses a truncated or corrupt `last.ckpt` with one line naming the file.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import lightning as L
import torch

from ..errors import UserError


class EpochSampler(torch.utils.data.Sampler[int]):
    """Shuffled indices 0..n-1, one permutation per epoch, a function of (seed, epoch) only.

    The permutations are those a `DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))` draws
    under Lightning (which takes `len(loader)` batches per epoch and never exhausts RandomSampler, whose extra
    draw at exhaustion is thus never made), so runs made before this sampler existed keep their data order.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch = 0                  # set by Lightning at every epoch start (`set_epoch`)
        self.position = 0               # batches of `epoch` trained so far (advanced by `ResumeState`)
        self.resume_at: tuple[int, int] | None = None     # (epoch, position) restored from a checkpoint

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(epoch + 1):      # per epoch: the loader's base seed, then the order
            torch.empty((), dtype=torch.int64).random_(generator=g)
            order = torch.randperm(self.n, generator=g)                     # [n]
        return order.tolist()

    def __iter__(self):
        skip = 0
        if self.resume_at is not None and self.resume_at[0] == self.epoch:
            skip = self.resume_at[1]
        self.resume_at = None
        self.position = skip
        yield from self.permutation(self.epoch)[skip:]


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:                 # stored as a tensor: checkpoints are loaded with weights_only=True
        kind, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state()
        state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached": float(cached)}
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        s = state["numpy"]
        np.random.set_state((s["kind"], s["keys"].numpy().astype(np.uint32), s["pos"], s["has_gauss"], s["cached"]))


def _tuples(x):
    """`random.setstate` wants the nested tuples `getstate` gave (a checkpoint round trip may give lists)."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


class ResumeState(L.Callback):
    """Saves the sampler's position and every random generator's state with each checkpoint; restores them."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler
        self._rng: dict | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._rng is not None:       # the first batch after a resume: generators as the uninterrupted run had them
            _set_rng_state(self._rng)
            self._rng = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.sampler.position += 1      # before ModelCheckpoint's hook (Lightning runs checkpoint callbacks last)

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "position": self.sampler.position, "rng": _rng_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.sampler.resume_at = (state_dict["epoch"], state_dict["position"])
        self._rng = state_dict["rng"]


def last_checkpoint(ckpt_dir: Path) -> str | None:
    """`ckpt_dir/last.ckpt` when there is one to resume from, else None; an unreadable one is one clear line."""
    last = Path(ckpt_dir) / "last.ckpt"
    if not last.exists():
        return None
    try:                                # mmap: reads the archive's index, not the tensors
        torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:              # torch raises RuntimeError, EOFError, pickle errors, ... for a torn file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{last} is truncated or corrupt ({first}); delete it to restart this training "
                        f"from scratch") from None
    return str(last)
