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
Several ranks (DDP / FSDP, training/distributed.py): the sampler is the distributed one, not Lightning's (whose
wrapper around a custom sampler never passes `set_epoch` on, so every epoch would repeat epoch 0's order, and
whose index arithmetic breaks on a sampler shortened by a resume): each rank takes every world-th index of the
epoch's permutation, padded as `DistributedSampler` pads, and its position counts its own batches (equal on all
ranks). A checkpoint holds every rank's generator states (gathered when it is written) and the world size; a
resume on another number of ranks is refused, since the data each rank has seen would no longer be the data it
is given.
The training modules' own per-step generators are seeded from (seed, global_step), which Lightning restores.

Training time: `ResumeState` also stores the seconds trained up to each checkpoint, so a resumed run's card reports
the time of all its segments (from Lightning's train start, after setup and the checkpoint's restore, up to the
checkpoints they resumed from; work redone after an interruption is counted once). A checkpoint written before
this was kept has no such figure: the time then counts from the step it resumed at (`timed_from_step`), and the
card says so.

`last_checkpoint` refuses a truncated or corrupt `last.ckpt` with one line naming the file.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from time import perf_counter as clock  # resume's own name: a test replaces it, not time's

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
        self.rank, self.world = 0, 1    # this process's share (`shard`, from the trainer at setup)
        self.epoch = 0                  # set by Lightning at every epoch start (`set_epoch`)
        self.position = 0               # batches of `epoch` trained so far (advanced by `ResumeState`)
        self.resume_at: tuple[int, int] | None = None     # (epoch, position) restored from a checkpoint

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def shard(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def __len__(self) -> int:
        return -(-self.n // self.world)                 # this rank's batches per epoch (ceil)

    def permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(epoch + 1):      # per epoch: the loader's base seed, then the order
            torch.empty((), dtype=torch.int64).random_(generator=g)
            order = torch.randperm(self.n, generator=g)                     # [n]
        return order.tolist()

    def indices(self, epoch: int) -> list[int]:
        """This rank's share of epoch's permutation: the permutation padded by its own head to a multiple of the
        world size (as `DistributedSampler(drop_last=False)`: at most world-1 repeats per epoch, so every rank runs
        as many steps), then every world-th index from the rank's. One rank: the permutation itself."""
        order, total = self.permutation(epoch), len(self) * self.world
        order = (order * -(-total // max(self.n, 1)))[:total]
        return order[self.rank::self.world]

    def __iter__(self):
        skip = 0
        if self.resume_at is not None and self.resume_at[0] == self.epoch:
            skip = self.resume_at[1]
        self.resume_at = None
        self.position = skip
        yield from self.indices(self.epoch)[skip:]


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
    """Saves the sampler's position and every random generator's state (of every rank) with each checkpoint;
    restores them. Also gives the sampler its rank's share at setup, before Lightning sizes the epoch."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler
        self._rng: dict | None = None
        self.seconds_before = 0.0       # trained before this segment (restored from the checkpoint)
        self.timed_from_step = 0        # the step the timing starts at: 0 unless the checkpoint had no time
        self._start: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        if self.timed_from_step is None:
            self.timed_from_step = trainer.global_step
        self._start = clock()

    def train_seconds(self) -> float:
        """Seconds trained since step `timed_from_step` (all segments, up to their checkpoints, and this one)."""
        return self.seconds_before + (clock() - self._start if self._start is not None else 0.0)

    def timing(self, step: int) -> dict:
        """The card's time at the end of a fit that stopped at `step`. A fit resumed at its last step from a checkpoint
        without a time never starts training (no `on_train_start`): timed from that step, 0 s."""
        start = step if self.timed_from_step is None else self.timed_from_step
        return {"train_seconds": self.train_seconds(), "timed_from_step": start}

    def setup(self, trainer, pl_module, stage) -> None:
        self.sampler.shard(trainer.global_rank, trainer.world_size)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._rng is not None:       # the first batch after a resume: generators as the uninterrupted run had them
            _set_rng_state(self._rng)
            self._rng = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.sampler.position += 1      # before ModelCheckpoint's hook (Lightning runs checkpoint callbacks last)

    def state_dict(self) -> dict:
        # Lightning builds a checkpoint's content on every rank (only its writing is rank 0's), so this collective
        # is met by all ranks. "rng" stays rank 0's state: the key checkpoints of one process always had.
        rng = [_rng_state()]
        if self.sampler.world > 1:
            rng = [None] * self.sampler.world
            torch.distributed.all_gather_object(rng, _rng_state())
        return {"epoch": self.sampler.epoch, "position": self.sampler.position, "rng": rng[0],
                "world_size": self.sampler.world, "train_seconds": self.train_seconds(),
                "timed_from_step": self.timed_from_step, **({"rng_ranks": rng} if len(rng) > 1 else {})}

    def load_state_dict(self, state_dict: dict) -> None:
        world = state_dict.get("world_size", 1)        # checkpoints from before several ranks: one process
        if world != self.sampler.world:
            raise UserError(f"the last checkpoint was trained on {world} process(es) and this run has "
                            f"{self.sampler.world} (train.devices x train.num_nodes): an exact resume needs the "
                            f"same number; rerun with {world}, or delete the stage's checkpoints/ to restart")
        self.sampler.resume_at = (state_dict["epoch"], state_dict["position"])
        if "train_seconds" in state_dict:
            self.seconds_before, self.timed_from_step = state_dict["train_seconds"], state_dict["timed_from_step"]
        else:                           # a checkpoint from before timing was kept: time from where it resumes
            self.seconds_before, self.timed_from_step = 0.0, None
        self._rng = state_dict["rng_ranks"][self.sampler.rank] if world > 1 else state_dict["rng"]


def last_checkpoint(ckpt_dir: Path) -> str | None:
    """`ckpt_dir/last.ckpt` when there is one to resume from, else None; an unreadable one is one clear line.
    Under FSDP with `train.fsdp.state_dict_type=sharded` it is a directory of per-rank shards whose metadata
    (`meta.pt`, written last by rank 0) is what is read here."""
    last = Path(ckpt_dir) / "last.ckpt"
    if not last.exists():
        return None
    try:                                # mmap: reads the archive's index, not the tensors
        torch.load(last / "meta.pt" if last.is_dir() else last, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:              # torch raises RuntimeError, EOFError, pickle errors, ... for a torn file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{last} is truncated or corrupt ({first}); delete it to restart this training "
                        f"from scratch") from None
    return str(last)
