"""Where the repository is: its root, the config tree (conf/) and the committed data, computed here once.

Relative paths in a config (a committed checkpoint `checkpoints/mini/...`, a packed data directory) are relative
to the repository when they do not exist where the command runs (`repo_path`), so a command works from any
working directory.
"""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
DATA_DIR = REPO_ROOT / "data"


def repo_path(p: str | Path) -> Path:
    """A path as given when it exists (or is absolute), else relative to the repository (committed data)."""
    path = Path(p).expanduser()
    return path if path.exists() or path.is_absolute() else REPO_ROOT / path
