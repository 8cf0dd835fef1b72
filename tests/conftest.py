"""Shared fixtures. Everything runs offline on CPU; the config is the real one, composed at tiny scale."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Before anything imports transformers, wandb or a Triton kernel module.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("SPECEXP_CACHE", str(ROOT / ".cache" / "specexp"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# target.dtype=auto follows the CPU (bf16 where it is native): pinned to fp32 here, so that the goldens and the
# token-for-token tests mean the same on every machine (bf16 is tested by asking for it).
os.environ["SPECEXP_CPU_BF16"] = "0"
# Under pytest-xdist (`-n auto`, what CI runs) each worker, and every CLI process it starts, keeps to its share of
# the cores: two workers of two threads each on two cores spin against each other and run slower than one.
# SPECEXP_TEST_THREADS overrides it (e.g. 1, beside a long job that holds the other core).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = int(os.environ.get("SPECEXP_TEST_THREADS", 0)) or (
    max(1, (os.cpu_count() or 2) // WORKERS) if WORKERS > 1 else 2)
if WORKERS > 1 or "SPECEXP_TEST_THREADS" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

torch.set_num_threads(THREADS)
CONF = ROOT / "conf"
BASE = ["target=tiny_qwen3", "logger=none", "eval.warmup=0", "eval.progress=false", "device=cpu"]
TINY = [*BASE, "drafter=dflash", "drafter.init=random"]


def make_cfg(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="session")
def tiny_target():
    from specexp import registry

    cfg = make_cfg(TINY)
    return registry.build_target(cfg.target, torch.device("cpu"))


@pytest.fixture(scope="module")
def static(tiny_target):
    """The tiny target on the static engine (targets/static.py): the same modules and weights, another KV cache."""
    from specexp.targets.static import StaticTarget

    return StaticTarget.of(tiny_target)


@pytest.fixture(scope="module")
def count_ids(tiny_target):
    """A prompt whose greedy answer runs long enough for several rounds of every drafter (sync counting)."""
    return tiny_target.encode_chat([{"role": "user", "content": "Count from one to twenty."}])


@pytest.fixture(scope="session")
def tiny_dflash(tiny_target):
    from specexp import registry

    cfg = make_cfg(TINY)
    return registry.build_drafter(cfg.drafter, tiny_target)


@pytest.fixture
def cfg_factory():
    """Compose the real config at tiny scale; `drafter=none` among the overrides drops the DFlash defaults."""
    return lambda *o: make_cfg([*(BASE if "drafter=none" in o else TINY), *o])


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread (an OpenMP team on a busy 2-core machine waits more than it computes)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
