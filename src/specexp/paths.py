"""Where things are: the repository (its root, the config tree conf/, the committed data), computed here once,
and the cache directory a config names (`paths.cache`, `target.cache_dir`).

Relative paths in a config (a committed checkpoint `checkpoints/mini/...`, a packed data directory) are relative
to the repository when they do not exist where the command runs (`repo_path`), so a command works from any
working directory.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
DATA_DIR = REPO_ROOT / "data"


def repo_path(p: str | Path) -> Path:
    """A path as given when it exists (or is absolute), else relative to the repository (committed data)."""
    path = Path(p).expanduser()
    return path if path.exists() or path.is_absolute() else REPO_ROOT / path


def cache_root(path: str) -> Path:
    """The cache directory a config names (`~` expanded): downloaded and converted models, training stages."""
    return Path(os.path.expanduser(path))
