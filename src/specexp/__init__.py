"""specexp: block-parallel speculative decoding research (DFlash, DeLS-Spec, Domino-FT, DEdit).

The Python API (api.py), imported on first use so that `import specexp` stays light:
`load`, `Pipeline`, `Output`, `evaluate`, `replay`, `compare`, `export`, `run`, `compose`; errors are `UserError`
(one line).
"""

__version__ = "0.1.0"
__all__ = ["load", "Pipeline", "Output", "evaluate", "replay", "compare", "export", "run", "compose", "UserError"]


def __getattr__(name: str):
    if name == "UserError":
        from .errors import UserError

        return UserError
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'specexp' has no attribute {name!r}")
