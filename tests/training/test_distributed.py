"""Training on several processes (training/distributed.py, resume.py): each rank's data share, where ranks run,
the FSDP strategy the config composes, what FSDP shards and gathers, and `task=train` end to end on two CPU
processes (Lightning DDP over gloo): both ranks train on disjoint data, rank 0 alone writes, the export equals the
trained weights, and an interrupted DDP run resumes bit for bit.

Lightning's FSDP refuses a CPU accelerator, so FSDP runs here through torch's FSDP directly (2 processes, gloo),
with the policy the config composes and the DFlash loss the LightningModule computes.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specexp.errors import UserError
from specexp.training.resume import EpochSampler, ResumeState

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ data per rank
@pytest.mark.parametrize("n,world", [(8, 2), (7, 2), (7, 3), (2, 3)])
def test_each_rank_trains_its_own_share_of_every_epoch(n, world):
    shares = {}
    for rank in range(world):
        s = EpochSampler(n, seed=5)
        s.shard(rank, world)
        for e in range(3):
            s.set_epoch(e)
            shares[e, rank] = list(s)
            assert len(shares[e, rank]) == len(s) == -(-n // world)           # every rank runs as many steps
    for e in range(3):
        got = [i for r in range(world) for i in shares[e, r]]
        assert sorted(set(got)) == list(range(n))                              # every sequence, every epoch
        assert len(got) - n == -n % world                                      # repeats only to pad
        order = EpochSampler(n, 5).permutation(e)
        per_rank = -(-n // world)
        assert [shares[e, r][j] for j in range(per_rank) for r in range(world)][:n] == order     # interleaved
    if n > world:
        assert shares[0, 0] != shares[1, 0]                                    # a new order every epoch
    # One rank: the permutation itself (what runs before this sampler sharded had).
    one = EpochSampler(n, 5)
    one.set_epoch(2)
    assert list(one) == one.permutation(2)


def test_a_resumed_rank_skips_only_its_own_trained_batches():
    s = EpochSampler(9, seed=1)
    s.shard(1, 2)
    s.set_epoch(1)
    full = list(s)
    s.resume_at = (1, 2)                 # rank 1 had trained 2 batches of epoch 1
    s.set_epoch(1)
    assert list(s) == full[2:] and s.position == 2
    assert list(s) == full               # the next pass of the epoch is whole again


def test_resume_state_keeps_every_ranks_generators_and_refuses_another_world_size():
    s = EpochSampler(4, 0)
    state = ResumeState(s).state_dict()                       # one process: rank 0's generators, world 1
    assert state["world_size"] == 1 and "rng_ranks" not in state
    two = EpochSampler(4, 0)
    two.shard(1, 2)
    with pytest.raises(UserError, match=r"trained on 1 process\(es\) and this run has 2 .*same number"):
        ResumeState(two).load_state_dict(state)
    old = {k: v for k, v in state.items() if k != "world_size"}        # a checkpoint from before several ranks
    r = ResumeState(EpochSampler(4, 0))
    r.load_state_dict(old)
    assert r._rng is state["rng"] and r.sampler.resume_at == (state["epoch"], state["position"])
    r2 = ResumeState(two)
    r2.load_state_dict({**state, "world_size": 2, "rng_ranks": ["rank0", "rank1"]})
    assert r2._rng == "rank1"                                   # each rank gets its own generators back


# ------------------------------------------------------------------------------------------- where ranks run
def test_placement_on_cpu_and_its_one_line_refusals(cfg_factory):
    from specexp.training.distributed import make_strategy, placement

    cfg = cfg_factory("task=train", "train=smoke", "train.devices=2", "train.strategy=ddp")
    p = placement("cpu", cfg.train)
    assert (p.accelerator, p.devices, p.num_nodes, p.device, p.per_node) == ("cpu", 2, 1, torch.device("cpu"), 2)
    assert make_strategy(p, cfg.train.fsdp) == "ddp"
    assert placement("auto", cfg_factory("task=train").train).device.type == ("cuda" if torch.cuda.is_available()
                                                                               else "cpu")
    with pytest.raises(UserError, match=r"^train.strategy=fsdp needs CUDA GPUs .*train.strategy=ddp"):
        placement("cpu", cfg_factory("task=train", "train.strategy=fsdp").train)
    with pytest.raises(UserError, match=r"^train.devices=\[0, 1\] lists GPU ids but training runs on CPU"):
        placement("cpu", cfg_factory("task=train", "train.devices=[0,1]").train)


@pytest.mark.parametrize("override,message", [
    ("train.strategy=ddp_spawn", "train.strategy='ddp_spawn' is not valid; expected auto, ddp or fsdp"),
    ("train.num_nodes=0", "train.num_nodes=0 is not valid; expected an int >= 1"),
    ("train.fsdp.sharding_strategy=ZERO3", "train.fsdp.sharding_strategy='ZERO3' is not valid; expected FULL_SHARD, "
                                           "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD"),
    ("train.fsdp.state_dict_type=local", "train.fsdp.state_dict_type='local' is not valid; expected full or sharded"),
])
def test_bad_distributed_keys_are_one_line(cfg_factory, override, message):
    from specexp.config import validate

    with pytest.raises(UserError) as e:
        validate(cfg_factory("task=train", override), job={})
    assert str(e.value) == message


def dflash_plan(cfg, target, tmp_path):
    from specexp.training import dflash_module
    from specexp.training.data import Sequence
    from specexp.training.pipeline import TrainContext

    ids = torch.arange(1000, 1040)
    mask = torch.arange(40) >= 6
    ctx = TrainContext(target, cfg.target, [Sequence("s", ids, mask)], "h", cfg.drafter, cfg.train, cfg.data,
                       cfg.fusion, tmp_path)
    return dflash_module.plan(ctx), ids, mask


def test_fsdp_strategy_wraps_each_draft_layer_and_leaves_the_target_out(cfg_factory, tiny_target, tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy
    from omegaconf import OmegaConf
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from specexp.drafters.dflash import DecoderLayer
    from specexp.training.distributed import Placement, make_strategy

    cfg = cfg_factory("task=train", "train=smoke", "drafter.num_layers=2", "train.strategy=fsdp",
                      "train.fsdp.sharding_strategy=SHARD_GRAD_OP", "train.fsdp.state_dict_type=sharded")
    plan, _, _ = dflash_plan(cfg, tiny_target, tmp_path)
    assert plan.fsdp_wrap == (DecoderLayer,)
    gpu = Placement("gpu", 2, 1, "fsdp", torch.device("cuda", 0), 0, 2)     # composing needs no GPU
    strategy = make_strategy(gpu, cfg.train.fsdp, plan.fsdp_wrap)
    assert isinstance(strategy, FSDPStrategy)
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {DecoderLayer}
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and strategy._state_dict_type == "sharded"
    assert strategy.kwargs["use_orig_params"]                       # the optimizer sees the module's own parameters
    # HYBRID_SHARD (shard within a node, replicate across nodes) gets its mesh, also for a part without blocks
    hybrid = make_strategy(Placement("gpu", 8, 2, "fsdp", torch.device("cuda", 0), 0, 8),
                           OmegaConf.create({"sharding_strategy": "HYBRID_SHARD", "state_dict_type": "full"}), ())
    assert hybrid.sharding_strategy == ShardingStrategy.HYBRID_SHARD and hybrid.kwargs["device_mesh"] == (2, 8)
    assert "auto_wrap_policy" not in hybrid.kwargs
    module = plan.module()
    units = policy._run_policy(module, ignored_modules=set(), root_kwargs={})
    assert {m for m in units if m is not module} == set(module.model.layers)       # one unit per draft layer
    # The frozen target is no submodule: FSDP (and DDP) never see it, checkpoints never hold it.
    target_params = {id(p) for p in tiny_target.model.parameters()}
    assert not target_params & {id(p) for p in module.parameters()}
    assert not any(k.startswith("_target") or "embed_tokens" in k for k in module.state_dict())


def test_context_stream_gives_the_per_layer_kv_results(tiny_target):
    """The training form of the DFlash forward (each layer takes its context K/V inside its call, as an FSDP unit
    needs) computes what inference's per-layer K/V gives, bit for bit."""
    from specexp.drafters.dflash import DFlashConfig, DFlashDraftModel
    from specexp.drafters.layers import init_weights

    m = init_weights(DFlashDraftModel(DFlashConfig.for_target(tiny_target, 2, 4, None)), 3)
    g = torch.Generator().manual_seed(0)
    taps = torch.randn(1, 12, m.fc.in_features, generator=g)
    x, pos, ctx_pos = torch.randn(1, 8, 64, generator=g), torch.arange(12, 20)[None], torch.arange(12)[None]
    mask = torch.rand(1, 1, 8, 20, generator=g) > 0.3
    mask[..., 12:] = True                                     # every query sees its own block (no empty row)
    want = m(x, pos, m.context_kv(taps, ctx_pos), mask)
    assert torch.equal(m(x, pos, mask=mask, context=m.context_stream(taps, ctx_pos)), want)


# --------------------------------------------------------------------------------- every rank joins every step
def _trainable_grads(module, loss):
    loss.backward()
    return {n: p.grad for n, p in module.named_parameters() if p.requires_grad}


def test_every_trainable_parameter_gets_a_gradient_and_an_empty_step_is_a_zero(cfg_factory, tiny_target, tmp_path,
                                                                                monkeypatch):
    """DDP runs with find_unused_parameters=False: a trainable parameter outside the loss would stop every rank at
    the second step. Under several ranks a step without loss returns a zero reaching every parameter."""
    from specexp.drafters import dels
    from specexp.training import distributed
    from specexp.training.dedit_module import DEditLitModule
    from specexp.training.dels_module import LocalHeadLitModule

    cfg = cfg_factory("task=train", "train=smoke", "drafter.block_size=4", "train.num_anchors=4")
    plan, ids, mask = dflash_plan(cfg, tiny_target, tmp_path)
    dflash = plan.module()
    _, taps = tiny_target.forward(ids[None], 0, tiny_target.new_cache(), taps=dflash.model.config.target_layer_ids)
    taps = taps[0].clone()
    dedit = DEditLitModule(plan.module().model, tiny_target, mix="plain", mix_threshold=0.5, plain_rate=0.5,
                           edit_weight=1.0, causal=False, num_anchors=4, gamma=4.0, lr=1e-3, warmup_ratio=0.0,
                           weight_decay=0.0, attention="dense", seed=0)
    losses = {"dflash": (dflash, dflash.blocks_loss(ids, mask, taps, 0)[0]),
              "dedit": (dedit, dedit.blocks_loss(ids, mask, taps, 0)[0])}
    for kind in ("rnn", "markov"):
        c = dels.LocalHeadConfig(kind, tiny_target.hidden_size, tiny_target.vocab_size, input_rank=8, gru_hidden=16,
                                 output_rank=8)
        head = LocalHeadLitModule(dels.make_head(c), tiny_target, block_size=4, num_anchors=4, gamma=7.0, lr=1e-3,
                                  warmup_ratio=0.0, weight_decay=0.0, seed=0)
        losses[kind] = (head, head.head_loss(ids, mask, 0)[0])
    for name, (module, loss) in losses.items():
        grads = _trainable_grads(module, loss)
        assert grads and all(g is not None for g in grads.values()), (name, [n for n, g in grads.items() if g is None])
    assert distributed.no_loss(dflash) is None                        # one process: Lightning skips the step
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 2))
    dflash.zero_grad()
    grads = _trainable_grads(dflash, distributed.no_loss(dflash))
    assert all(g is not None and not g.any() for g in grads.values())


def test_stage_lock_lets_one_builder_in_at_a_time(tmp_path):
    from specexp.training.pipeline import stage_lock

    events = []
    inside = threading.Event()

    def second():
        inside.wait()
        with stage_lock(tmp_path / "stage"):
            events.append("second in")

    t = threading.Thread(target=second)
    t.start()
    with stage_lock(tmp_path / "stage"):
        inside.set()
        time.sleep(0.5)
        events.append("first out")
    t.join(10)
    assert events == ["first out", "second in"]


# ------------------------------------------------------------------------------------------- FSDP, 2 processes
def _fsdp_worker(rank: int, port: int, out: str) -> None:
    """One rank: the DFlash loss under FSDP with the composed policy, one SGD step, the full state gathered."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    try:
        from conftest import TINY, make_cfg
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from specexp import registry
        from specexp.training.distributed import Placement, full_state_dict, make_strategy

        torch.set_num_threads(1)
        cfg = make_cfg([*TINY, "task=train", "train=smoke", "drafter.num_layers=2", "drafter.block_size=4",
                        "train.num_anchors=6", "train.strategy=fsdp"])
        target = registry.build_target(cfg.target, torch.device("cpu"))
        plan, ids, mask = dflash_plan(cfg, target, Path(out))
        _, taps = target.forward(ids[None], 0, target.new_cache(), taps=plan.module().model.config.target_layer_ids)
        taps = taps[0].clone()
        strategy = make_strategy(Placement("gpu", 2, 1, "fsdp", torch.device("cpu"), rank, 2), cfg.train.fsdp,
                                 plan.fsdp_wrap)
        module, reference = plan.module(), plan.module()            # the same seeded init
        full = sum(p.numel() for p in module.parameters())
        # as Lightning runs a step: the training code inside the root unit's forward
        module.forward = lambda: module.blocks_loss(ids, mask, taps, 0)[0]
        sharded = FSDP(module, auto_wrap_policy=strategy.kwargs["auto_wrap_policy"], use_orig_params=True,
                       sharding_strategy=strategy.sharding_strategy, device_id=torch.device("cpu"))
        local = sum(p.numel() for p in module.parameters())         # this rank's shard
        units = sum(isinstance(m, FSDP) for m in sharded.modules())
        opt = torch.optim.SGD(sharded.parameters(), lr=0.5)
        loss = sharded()
        loss.backward()
        opt.step()
        state = full_state_dict(sharded, torch.device("cpu"))
        report = {"rank": rank, "full": full, "local": local, "units": units, "loss": float(loss.detach()),
                  "gathered": state is not None}
        if state is not None:                                        # rank 0: the whole trained weights
            from specexp.training import optim

            ref_losses = []                                          # each rank's loss, with that rank's anchors
            for r in (0, 1):
                optim.rank_and_world = lambda r=r: (r, 2)
                ref_losses.append(reference.blocks_loss(ids, mask, taps, 0)[0])
            ref_loss = (ref_losses[0] + ref_losses[1]) / 2           # FSDP averages the ranks' gradients
            ref_loss.backward()
            with torch.no_grad():
                for p in reference.parameters():
                    p -= 0.5 * p.grad
            report["ref_losses"] = [float(x.detach()) for x in ref_losses]
            fresh = plan.module()
            fresh.load_state_dict(state)                             # strict, as distributed.whole_module loads it
            report["max_diff"] = max(float((a - b).abs().max()) for a, b in
                                     zip(fresh.state_dict().values(), reference.state_dict().values()))
            report["keys_equal"] = set(state) == set(reference.state_dict())
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
        # Rank 1 is done long before rank 0's reference: a group torn down while the peer still works aborted rank 1
        # once under load (gloo: "terminate called without an active exception"); leave together.
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_fsdp_shards_each_draft_layer_and_gathers_the_trained_weights_on_rank_0(tmp_path):
    import torch.multiprocessing as mp

    procs = mp.start_processes(_fsdp_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=False,
                               start_method="spawn")
    deadline = time.monotonic() + 240
    while not procs.join(timeout=5):
        if time.monotonic() > deadline:
            for p in procs.processes:
                p.kill()
            pytest.fail("FSDP workers did not finish in 240 s")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["units"] == r1["units"] == 3                           # root + 2 draft layers
    assert r0["local"] + r1["local"] == r0["full"] and max(r0["local"], r1["local"]) < r0["full"]
    assert r0["gathered"] and not r1["gathered"]
    # each rank drew its own anchors (a different loss on the same sequence), as the unsharded reference did
    assert [r0["loss"], r1["loss"]] == pytest.approx(r0["ref_losses"], rel=1e-6) and r0["loss"] != r1["loss"]
    assert r0["keys_equal"] and r0["max_diff"] < 1e-6


# --------------------------------------------------------------------------- task=train on 2 processes (DDP)
PROBE = '''"""Imported by every rank (SPECEXP_PLUGINS): records what each rank trains on and its final weights."""
import json, os, zlib
from pathlib import Path

import lightning as L
from safetensors.torch import save_file

OUT = Path(os.environ["DDP_PROBE_DIR"])
CRASH = int(os.environ.get("DDP_PROBE_CRASH_AT", "0"))


class Probe(L.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        rec = {"world": trainer.world_size, "step": trainer.global_step, "epoch": trainer.current_epoch,
               "ids": zlib.crc32(batch["ids"].numpy().tobytes()), "pid": os.getpid()}
        with open(OUT / f"batches-{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\\n")

    def on_train_batch_end(self, trainer, *args):
        if CRASH and trainer.global_step == CRASH:
            raise RuntimeError("probe: crash")

    def on_train_end(self, trainer, module):
        state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        save_file(state, OUT / f"weights-{trainer.global_rank}.safetensors")


_real = L.Trainer
L.Trainer = lambda *a, callbacks=(), **k: _real(*a, callbacks=[*callbacks, Probe()], **k)
'''


def run_ddp(tmp_path: Path, name: str, crash_at: int = 0, timeout: int = 420) -> subprocess.CompletedProcess:
    """`python -m specexp task=train` on 2 CPU processes; the whole process group is killed on a timeout."""
    probe = tmp_path / name / "probe"
    probe.mkdir(parents=True)
    (tmp_path / "ddp_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "SLURM_NTASKS",
                        "TORCHELASTIC_RUN_ID")}
    env.update(PYTHONPATH=str(tmp_path), SPECEXP_PLUGINS="ddp_probe", DDP_PROBE_DIR=str(probe),
               DDP_PROBE_CRASH_AT=str(crash_at), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    args = ["task=train", "target=tiny_qwen3", "data=smoke", "train=smoke", "drafter.init=random", "logger=none",
            "device=cpu", "cpu_threads=1", "train.devices=2", "train.strategy=ddp", "train.max_steps=8",
            "train.ckpt_every=4", "train.num_anchors=4", "train.export_dtype=float32",
            f"train.export_dir={tmp_path / name / 'export'}", f"paths.cache={tmp_path / name / 'cache'}",
            f"hydra.run.dir={tmp_path / name / 'run'}"]
    proc = subprocess.Popen([sys.executable, "-m", "specexp", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)                  # rank 0 and the rank it started
        out, _ = proc.communicate()
        pytest.fail(f"DDP run {name} did not finish in {timeout} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def batches(probe: Path, rank: int) -> list[dict]:
    return [json.loads(x) for x in (probe / f"batches-{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_ddp_training_on_two_processes_end_to_end_and_its_exact_resume(cfg_factory, tiny_target, tmp_path):
    from specexp.training import pipeline

    whole = run_ddp(tmp_path, "whole")
    assert whole.returncode == 0, whole.stdout[-4000:]
    probe, stage = tmp_path / "whole" / "probe", next((tmp_path / "whole" / "cache" / "stages").glob("dflash-*"))
    # Both ranks trained, in two processes, each on its own share of every epoch, in the sampler's order.
    cfg = cfg_factory("task=train", "data=smoke", f"paths.cache={tmp_path / 'seqs'}")
    seqs, _ = pipeline.prepare_sequences(cfg.data, cfg.target, tiny_target, tmp_path / "seqs")
    crc = [zlib.crc32(s.ids.numpy().tobytes()) for s in seqs]
    seen = {r: batches(probe, r) for r in (0, 1)}
    assert len(seqs) == 4 and all(len(seen[r]) == 8 and {b["world"] for b in seen[r]} == {2} for r in (0, 1))
    assert {b["pid"] for b in seen[0]}.isdisjoint({b["pid"] for b in seen[1]})
    for r in (0, 1):
        sampler = EpochSampler(len(seqs), cfg.train.seed)
        sampler.shard(r, 2)
        want = [crc[i] for e in range(4) for i in sampler.indices(e)]      # 8 steps = 4 epochs of 2 per rank
        assert [b["ids"] for b in seen[r]] == want
    for e in range(4):
        ours = [{b["ids"] for b in seen[r] if b["epoch"] == e} for r in (0, 1)]
        assert not ours[0] & ours[1] and ours[0] | ours[1] == set(crc)      # disjoint, and all of the data
    # The exported checkpoint loads and equals the trained weights (identical on both ranks under DDP).
    w0, w1 = (load_file(probe / f"weights-{r}.safetensors") for r in (0, 1))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    exported = load_file(tmp_path / "whole" / "export" / "model.safetensors")
    assert {f"model.{k}" for k in exported} == set(w0) and all(torch.equal(v, w0[f"model.{k}"])
                                                               for k, v in exported.items())
    from specexp.drafters.dflash import DFlashDraftModel

    DFlashDraftModel.from_pretrained(tmp_path / "whole" / "export")              # a loadable DFlash checkpoint
    # Rank 0 alone wrote: one log version, one artifact, the run directory, no temporary files anywhere.
    run = tmp_path / "whole" / "run"
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 8 and summary["checkpoint"] == str((tmp_path / "whole" / "export").resolve())
    assert (run / "checkpoint").resolve() == (tmp_path / "whole" / "export").resolve()
    assert json.loads((stage / "train.json").read_text())["steps"] == 8
    assert sorted(p.name for p in (stage / "logs").iterdir()) == ["version_0"]
    assert {p.name for p in (stage / "artifact").iterdir()} == {"config.json", "model.safetensors"}
    assert {p.name for p in (tmp_path / "whole" / "export").iterdir()} == {"config.json", "model.safetensors",
                                                                           "card.json", "README.md"}
    assert json.loads((tmp_path / "whole" / "export" / "card.json").read_text())["steps"] == 8
    leftovers = [p for p in (tmp_path / "whole").rglob("*") if p.name.endswith(".tmp") or "tmp-" in p.name]
    assert not leftovers and not (stage / "artifact.tmp").exists()
    assert "specexp: rank 1 trained 8 steps; rank 0 writes" in whole.stdout
    last = torch.load(stage / "checkpoints" / "last.ckpt", weights_only=True)
    state = next(v for k, v in last["callbacks"].items() if k.startswith("ResumeState"))
    assert last["global_step"] == 8 and state["world_size"] == 2 and len(state["rng_ranks"]) == 2

    # Interrupted at step 6 (after the checkpoint of step 4, mid-epoch 2), then resumed: the same weights.
    crashed = run_ddp(tmp_path, "resumed", crash_at=6)
    assert crashed.returncode != 0 and "probe: crash" in crashed.stdout, crashed.stdout[-3000:]
    ckpt = next((tmp_path / "resumed" / "cache" / "stages").glob("dflash-*/checkpoints/last.ckpt"))
    assert torch.load(ckpt, weights_only=True)["global_step"] == 4
    (tmp_path / "resumed" / "probe").rename(tmp_path / "resumed" / "probe-crashed")
    resumed = run_ddp(tmp_path, "resumed")
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    again = load_file(tmp_path / "resumed" / "export" / "model.safetensors")
    assert again.keys() == exported.keys() and all(torch.equal(again[k], exported[k]) for k in exported)
    after = batches(tmp_path / "resumed" / "probe", 0)
    assert [b["ids"] for b in after] == [b["ids"] for b in seen[0]][4:]      # the steps after the checkpoint
