"""Training on several processes (Lightning DDP / FSDP): where each rank runs, which strategy Lightning gets, and
who writes what. docs/recipes.md, "Multi-GPU training", says the same for users.

Selection (`placement`, from `device`, `train.devices`, `train.num_nodes`, `train.strategy`, `train.fsdp`):
  accelerator  gpu when `device` resolves to CUDA (`auto`: when CUDA is available), else cpu
  devices      per node: `train.devices` = N (GPUs 0..N-1; on CPU, N processes), [ids] (those GPUs), or auto: the
               GPU that `device=cuda:N` names, else every visible GPU (one process on CPU)
  ranks        devices x `train.num_nodes`. On one node Lightning starts the other ranks itself, when `trainer.fit`
               starts: it reruns the same command with LOCAL_RANK set, and those processes redo everything before
               the fit (reading the stages rank 0 already built). torchrun, SLURM's srun (and LSF, MPI) start every
               rank at once; the stages before the fit are then built by the first rank to take their lock
               (pipeline.stage_lock), the others wait and reuse them.
  strategy     auto (Lightning: DDP on more than one device), ddp, or fsdp (CUDA only: Lightning's FSDP has none
               on CPU). Under fsdp every block of the trained part (`TrainPlan.fsdp_wrap`: DFlash's DecoderLayer) is
               its own FSDP unit, the rest (fc, norms, a head) the root unit; `train.fsdp.sharding_strategy` and
               `train.fsdp.state_dict_type` (resumable checkpoints: one full file written by rank 0, or a directory
               of per-rank shards) are passed to `FSDPStrategy` as they are.
Each rank builds its frozen target directly on its own device (`Placement.device`: Lightning's parallel device of
its local rank), never on cuda:0 first. The target, and a frozen backbone, head or prior, is never a submodule of
the LightningModule: neither DDP nor FSDP wraps or shards it, no checkpoint holds it, and every rank keeps a whole
copy (a frozen 8B target in bf16 is 16 GB per GPU; sharding it would put it in FSDP's units and in every
checkpoint, for no gradient).

Who writes: Lightning writes checkpoints (`sharded`: every rank its own shard) and logs from global rank 0. After
the fit, `whole_module` gives rank 0 the trained weights whole (gathered from the shards under FSDP); rank 0 alone
saves the artifact; every rank waits at a barrier until it exists; then the other ranks return without writing
anything, and rank 0 exports, writes the card, evaluates (`train.eval_after`) and fills the run directory.
Data: every rank trains on its own share of each epoch's permutation (resume.EpochSampler); an optimizer step
covers ranks x `train.accumulate` sequences.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError, check
from ..machine import resolve_device


def rank_and_world() -> tuple[int, int]:
    """(global rank, world size) of this process in the running process group; (0, 1) outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class Placement:
    """Where training runs: the Trainer's accelerator, devices, nodes and strategy name, and this process's
    device (where its target is built and its batches go)."""

    accelerator: str                     # gpu | cpu
    devices: int | list[int] | str       # what the Trainer gets (per node)
    num_nodes: int
    strategy: str                        # auto | ddp | fsdp
    device: torch.device
    local_rank: int                      # this process's rank on its node, as its launcher set it (0 before a fit)
    per_node: int                        # processes per node

    @property
    def launch_rank(self) -> int:
        """This process's global rank as its launcher numbers it (Lightning's formula: node x per node + local);
        0 for the first process of a run that Lightning itself has not yet turned into several."""
        return _environment().node_rank() * self.per_node + self.local_rank


def _environment():
    """The cluster environment Lightning's Trainer will pick: the same classes, in the same order."""
    from lightning.fabric.plugins.environments import (
        LightningEnvironment,
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    for env in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment):
        if env.detect():
            return env()
    return LightningEnvironment()


def placement(device: str, train) -> Placement:
    """The placement of a training run (module docstring); a combination that cannot run is one `UserError` line,
    raised before anything is built. The value ranges themselves are `config.TrainConfig`'s rules."""
    dev = resolve_device(device)
    strategy, devices, nodes = train.strategy, train.devices, int(train.num_nodes)
    if not isinstance(devices, (int, str)):
        devices = [int(i) for i in devices]                      # an OmegaConf ListConfig
    local = _environment().local_rank()
    if dev.type == "cpu":
        check(strategy != "fsdp", f"train.strategy=fsdp needs CUDA GPUs (Lightning's FSDP does not run on CPU; "
                                  f"device={device}); on CPU use train.strategy=ddp with train.devices=N processes")
        check(not isinstance(devices, list), f"train.devices={devices} lists GPU ids but training runs on CPU "
                                             f"(device={device}); use train.devices=N (N processes) or auto")
        per_node = 1 if devices == "auto" else devices
        return Placement("cpu", devices, nodes, strategy, torch.device("cpu"), local, per_node)
    n = torch.cuda.device_count()
    if dev.index is not None:                                    # device=cuda:N: that GPU, unless devices say more
        check(devices in ("auto", [dev.index]),
              f"device={device} names one GPU but train.devices={devices}; choose a run's GPUs with train.devices "
              f"(N or [ids]) and device=cuda (or auto)")
        devices = [dev.index]
    if isinstance(devices, int):
        check(devices <= n, f"train.devices={devices} but this machine has {n} GPU(s)")
    elif isinstance(devices, list):
        bad = [i for i in devices if i >= n]
        check(not bad and len(set(devices)) == len(devices),
              f"train.devices={devices}: ids must be distinct GPUs of this machine's {n} (0..{n - 1})")
    from lightning.pytorch.accelerators import CUDAAccelerator

    ids = CUDAAccelerator.parse_devices(CUDAAccelerator.auto_device_count() if devices == "auto" else devices)
    parallel = CUDAAccelerator.get_parallel_devices(ids)        # Lightning's own rank -> device mapping
    check(local < len(parallel), f"this process has LOCAL_RANK={local} but train.devices={devices} gives "
                                 f"{len(parallel)} process(es) per node")
    return Placement("gpu", devices, nodes, strategy, parallel[local], local, len(parallel))


def make_strategy(p: Placement, fsdp, wrap: tuple[type, ...] = ()):
    """What the Trainer's `strategy=` gets: the name, or under fsdp an `FSDPStrategy` whose auto-wrap policy makes
    every module of a `wrap` class its own unit (none: the trained part is one unit), with `train.fsdp`'s
    sharding strategy and checkpoint state-dict type. HYBRID_SHARD shards within a node and replicates across
    nodes: its (nodes, processes per node) device mesh is given (Lightning requires one, or a wrap policy)."""
    if p.strategy != "fsdp":
        return p.strategy
    from lightning.pytorch.strategies import FSDPStrategy

    mesh = {"device_mesh": (p.num_nodes, p.per_node)} if fsdp.sharding_strategy == "HYBRID_SHARD" else {}
    return FSDPStrategy(auto_wrap_policy=set(wrap) or None, sharding_strategy=fsdp.sharding_strategy,
                        state_dict_type=fsdp.state_dict_type, **mesh)


def full_state_dict(fsdp_module, device: torch.device) -> dict | None:
    """The whole state dict of an FSDP-wrapped module, gathered from every rank's shards onto global rank 0 (None on
    the others). A collective: every rank must call it. Offloaded to CPU from a GPU (the other ranks never hold the
    whole model); kept in place on CPU, where offloading crashes FSDP (torch 2.13, gloo)."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    config = FullStateDictConfig(offload_to_cpu=device.type != "cpu", rank0_only=True)
    with FSDP.state_dict_type(fsdp_module, StateDictType.FULL_STATE_DICT, config):
        state = fsdp_module.state_dict()
    return state if rank_and_world()[0] == 0 else None


def whole_module(trainer, module, rebuild):
    """The trained LightningModule with its whole weights on global rank 0, None on the other ranks. Under FSDP
    the module's parameters are this rank's shards: the full state dict is gathered (every rank calls this) and
    loaded into a fresh copy `rebuild()`; under DDP and on one device the module already holds them whole."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(trainer.strategy, FSDPStrategy):
        state = full_state_dict(trainer.strategy.model, trainer.strategy.root_device)
        if not trainer.is_global_zero:
            return None
        fresh = rebuild()
        fresh.load_state_dict(state)                              # strict: every trained tensor, nothing else
        return fresh
    return module if trainer.is_global_zero else None


def no_loss(module):
    """What a training step returns for a sequence that gives no loss (no anchor fits). On one process None:
    Lightning skips the step. Under DDP / FSDP Lightning refuses a skipped step (every rank must join the same
    gradient reduction): a zero that reaches every trainable parameter, so this rank adds zero gradients to the
    average and the step runs on all ranks alike."""
    if rank_and_world()[1] == 1:
        return None
    return sum(p.sum() for p in module.parameters() if p.requires_grad) * 0.0


def device_check(device: torch.device):
    """A callback refusing, at setup, a rank whose trained part Lightning placed elsewhere than its frozen parts
    (built on `device`): one line instead of a mixed-device error in the first step."""
    import lightning as L

    class DeviceCheck(L.Callback):
        def setup(self, trainer, pl_module, stage):
            root = trainer.strategy.root_device
            if root.type != device.type or (root.type == "cuda" and root != device):
                raise UserError(f"rank {trainer.global_rank}: Lightning trains on {root} but the target was built on "
                                f"{device}; check CUDA_VISIBLE_DEVICES, device and train.devices")

    return DeviceCheck()
