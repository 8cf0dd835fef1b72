"""Hydra's override grammar, as far as specexp writes or explains overrides (no Hydra import: the command line's
first checks and the recorded `rerun` line use it).

A value Hydra reads unquoted holds letters, digits and `_-+./:\\?@%~*$` only. Anything else (a space, a non-ASCII
letter, a quote) needs Hydra's own quotes, inside the shell's: `"hydra.run.dir='runs/résumé 1'"`.
"""
from __future__ import annotations

import re

PLAIN_VALUE = re.compile(r"[A-Za-z0-9_\-+./:\\?@%~*$]*")


def hydra_quote(value: str) -> str:
    """`value` as Hydra reads it back unchanged: as it is when plain, else single-quoted (a quote escaped)."""
    value = str(value)
    if PLAIN_VALUE.fullmatch(value) and value not in ("", "null", "true", "false"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

