"""User-facing errors: one line naming the bad value and what would be valid, never a traceback."""


class UserError(Exception):
    """A mistake in the user's input (config, checkpoint, data). Printed as one line by the CLI."""


class CheckFailed(Exception):
    """A check task ran and found a disagreement (e.g. task=serve_check: a serving engine decodes an export otherwise
    than specexp). One line, exit 3: neither the user's mistake (2) nor an internal error (1)."""


def clip(text, limit: int = 120) -> str:
    """`text` as an error line may quote it: at most `limit` characters, saying how long it was (a 3,000-item list
    override must not make a 17 KB line)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def check(cond: bool, message: str) -> None:
    if not cond:
        raise UserError(message)


def one_of(name: str, value, valid) -> None:
    """Raise `UserError` unless `value` is in `valid`, listing the valid choices."""
    valid = list(valid)
    if value not in valid:
        raise UserError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, valid))}")


def differing_keys(recorded: dict, wanted: dict) -> list[str]:
    """Keys whose values differ between what an earlier run recorded and what this run needs."""
    return sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))


def invariant(cond: bool, message: str) -> None:
    """An internal invariant (not the user's input): a `RuntimeError` naming it. A check, not an `assert`, so that
    `python -O` keeps it."""
    if not cond:
        raise RuntimeError(f"specexp internal invariant broken: {message}")
