"""One-way dependencies, checked on the source (every import, function-local ones included):
no import cycles among specexp's modules, no module imports another's private names, the core layers
(decoding/, drafters/, kernels/) never import what sits above them, and every folder and flat module sits on one
floor of LAYERS and imports only its own floor and those below (docs/architecture.md draws the same floors)."""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "specexp"
CORE = ("specexp.decoding", "specexp.drafters", "specexp.kernels")
ABOVE = ("specexp.eval", "specexp.training", "specexp.registry", "specexp.cli", "specexp.__main__", "specexp.api",
         "specexp.tasks", "specexp.report", "specexp.tracking", "specexp.export.engines")


# Floors, bottom first: a folder (or flat module) imports only its own floor and those below it.
LAYERS = [
    ("errors", "schema", "files", "paths", "pins", "clock", "log", "machine", "overrides", "checkpoints",
     "benchmarks", "tracking", "calibration"),
    ("kernels",),
    ("targets", "drafters"),
    ("decoding",),
    ("registry",),
    ("config",),
    ("rundir",),
    ("report", "export"),
    ("eval",),
    ("training",),
    ("tasks", "cli", "api", "__main__", "specexp"),
]


def _floor(module: str) -> int:
    """The floor of a module: that of its folder (specexp.eval.store -> eval) or of the flat module itself."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    floors = [i for i, names in enumerate(LAYERS) if name in names]
    assert floors, f"{module}: its folder or module {name!r} has no floor in LAYERS (tests/test_architecture.py)"
    return floors[0]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every import statement in the file, relative ones resolved."""
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            names = [a.name for a in node.names]
            # `from . import x` imports the submodule x
            subs = [f"{target}.{n}" for n in names if (SRC.parent / f"{target}.{n}".replace(".", "/")).with_suffix(
                ".py").exists() or (SRC.parent / f"{target}.{n}".replace(".", "/")).is_dir()]
            rest = [n for n in names if f"{target}.{n}" not in subs]
            # `from . import x` of submodules alone: an edge to each submodule, none to the package's __init__
            # (already imported before any of its modules runs; specexp/__init__ imports the API lazily)
            out += [(s, []) for s in subs] + ([(target, rest)] if rest or not subs else [])
    return out


def _graph() -> dict[str, set[str]]:
    mods = {_module_name(p): p for p in SRC.rglob("*.py")}
    return {m: {t for t, _ in _imports(p) if t in mods and t != m} for m, p in mods.items()}


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    # a package's __init__ importing its own submodules is not a cycle of concern; none do today
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_names_imported_across_modules():
    bad = [(str(p.relative_to(SRC)), t, n) for p in SRC.rglob("*.py") for t, names in _imports(p)
           if t.startswith("specexp") for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, f"imports of another module's private names: {bad}"


def test_core_never_imports_what_sits_above_it():
    graph = _graph()
    bad = [(m, t) for m, ts in graph.items() if m.startswith(CORE) for t in ts if t.startswith(ABOVE)]
    assert not bad, f"core modules importing upper layers: {bad}"


def test_no_folder_imports_one_above_it():
    graph = _graph()
    bad = [f"{m} -> {t}" for m, ts in sorted(graph.items()) for t in sorted(ts) if _floor(t) > _floor(m)]
    assert not bad, "imports of a higher floor (LAYERS): " + "; ".join(bad)


def test_config_imports_nothing_above_it():
    graph = _graph()
    assert all(_floor(t) <= _floor("specexp.config") for t in graph["specexp.config"]), sorted(graph["specexp.config"])
