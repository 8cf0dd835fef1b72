"""specexp: block-parallel speculative decoding research (DFlash, DeLS-Spec, Domino-FT, DEdit)."""

__version__ = "0.1.0"
