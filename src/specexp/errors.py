"""User-facing errors: one line naming the bad value and what would be valid, never a traceback."""


class UserError(Exception):
    """A mistake in the user's input (config, checkpoint, data). Printed as one line by the CLI."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise UserError(message)


def one_of(name: str, value, valid) -> None:
    """Raise `UserError` unless `value` is in `valid`, listing the valid choices."""
    valid = list(valid)
    if value not in valid:
        raise UserError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, valid))}")
