"""The parts of scripts/gpu_check.py, one module each (`run(ctx) -> {figures, checks, notes}`), and common.py, what
they share. The runner imports a part's module only to run it or to list it (`--help`); nothing here imports torch
at module level."""
