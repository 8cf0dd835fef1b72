"""The tracked tree stays under 48 MiB: a GPU machine receives a copy of it (64 MiB at most, the wheels of its
check included; scripts/device_wheels.sh), and a user's clone stays small. Checkpoints are committed packed
(scripts/pack_checkpoint.py), corpora gzipped, α/β grids archived (experiments/archive.py)."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 48 * 2**20


def _tracked() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_tracked_tree_fits_the_budget():
    sizes = {p: p.stat().st_size for p in _tracked() if p.is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= BUDGET, (f"tracked tree {total / 2**20:.1f} MiB > {BUDGET / 2**20:.0f} MiB; largest: "
                             + ", ".join(f"{p.relative_to(ROOT)} {sizes[p] / 2**20:.1f} MiB" for p in largest))


def test_no_plain_checkpoint_weights_are_tracked():
    """A checkpoint's weights are committed packed (0.71 of the size); a plain copy is git-ignored."""
    plain = [p for p in _tracked() if p.suffix == ".safetensors" and "checkpoints" in p.relative_to(ROOT).parts]
    assert not plain, f"commit {plain[0].relative_to(ROOT)} packed: python scripts/pack_checkpoint.py DIR"
