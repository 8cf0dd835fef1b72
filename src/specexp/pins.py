"""Hub revisions the defaults are pinned to.

`hub_pins.json`, beside this module, maps each hub repo the defaults download (targets, released drafters and
heads, training corpora, benchmark datasets) to a commit: `{"model": {repo_id: sha}, "dataset": {repo_id: sha}}`.
A revision set in the config (`target.revision`, `drafter.revision`, `drafter.head.revision`,
`data.hub.revision`) always wins; a repo without a pin downloads its default branch. The file is written by
`python scripts/pin_hub_revisions.py` on a machine that reaches the hub (this project's build machines do not:
until it is run there, the file is empty and every default is unpinned, which run_info.json records as null).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PINS_FILE = Path(__file__).with_name("hub_pins.json")
KINDS = ("model", "dataset")


@lru_cache(maxsize=None)
def _table(path: str) -> dict[str, dict[str, str]]:
    p = Path(path)
    raw = json.loads(p.read_text()) if p.exists() else {}
    return {k: dict(raw.get(k) or {}) for k in KINDS}


def pinned(repo_id: str, kind: str = "model") -> str | None:
    """The commit `repo_id` is pinned to, or None."""
    return _table(str(PINS_FILE))[kind].get(repo_id)


def revision(repo_id: str, asked: str | None, kind: str = "model") -> str | None:
    """The revision to download `repo_id` at: `asked` when the config sets one, else its pin (None: the default
    branch)."""
    return asked if asked is not None else pinned(repo_id, kind)
