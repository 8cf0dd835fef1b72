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


def duplicate_key(value: str) -> str | None:
    """The first key written twice within one `{...}` of an override's value text (Hydra's parser builds a dict and
    keeps the last silently: `eval.max_drafts={1: 3, 1: 4}` would run with 4), else None. Keys are compared as
    written; quoted text and the values after a key's colon (`cuda:0`) are skipped."""
    levels: list[list] = []             # per open bracket: [keys seen, or None for a list; in a value?]
    token, quote, escaped = "", None, False
    for c in value:
        if quote:
            token += c
            quote = None if c == quote and not escaped else quote
            escaped = c == "\\" and not escaped
            continue
        if c in "'\"":
            quote, token = c, token + c
        elif c in "{[":
            levels.append([set() if c == "{" else None, False])
            token = ""
        elif c in "}]" or c == ",":
            if c != "," and levels:
                levels.pop()
            elif levels:
                levels[-1][1] = False
            token = ""
        elif c == ":" and levels and levels[-1][0] is not None and not levels[-1][1]:
            key = token.strip()
            if key in levels[-1][0]:
                return key
            levels[-1][0].add(key)
            levels[-1][1], token = True, ""
        else:
            token += c
    return None
