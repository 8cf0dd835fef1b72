"""Command-line checks that run before Hydra: a wrong group option or key is one line listing the valid
choices (Hydra's own messages span many lines and end with a stack-trace hint)."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from .config import unknown_key_message

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Hydra flags that take a value as the next argument.
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c",
                     "--package", "-p", "--info", "-i", "--experimental-rerun"}


def _first_line(e: BaseException) -> str:
    while e is not None and not str(e).strip():
        e = e.__cause__ or e.__context__
    return str(e).strip().splitlines()[0] if e is not None else "invalid command line"


def fail(message: str, code: int = 2) -> None:
    print(f"specexp: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def plugin_config_dirs() -> list:
    """Config directories of the drafters registered by `SPECEXP_PLUGINS` modules (registry.py); none without."""
    import os

    if not os.environ.get("SPECEXP_PLUGINS"):
        return []                   # keep the common path free of the registry's torch import
    from . import registry
    from .errors import UserError

    try:
        registry.load_plugins()
    except UserError as e:
        fail(str(e))
    return registry.config_dirs()


def groups() -> dict[str, list[str]]:
    """Options of every config group: the YAML files of conf/ and of the plugins' config directories (not Hydra's
    own groups under conf/hydra/: `launchers` checks those)."""
    out: dict[str, set[str]] = {}
    for root in [CONF_DIR, *plugin_config_dirs()]:
        for d in sorted(root.iterdir()):
            if d.is_dir() and d.name != "hydra":
                out.setdefault(d.name, set()).update(p.stem for p in d.glob("*.yaml"))
    return {k: sorted(v) for k, v in sorted(out.items())}


# Hydra launcher plugins: their launcher names -> (pip package, the specexp extra that installs it).
LAUNCHER_PLUGINS = {
    "joblib": ("hydra-joblib-launcher", "joblib"),
    "submitit_slurm": ("hydra-submitit-launcher", "slurm"),
    "submitit_local": ("hydra-submitit-launcher", "slurm"),
    "ray": ("hydra-ray-launcher", "ray"),
    "ray_aws": ("hydra-ray-launcher", "ray"),
}


def installed_launchers() -> set[str]:
    """The hydra/launcher names Hydra can load now: its own and those of the installed launcher plugins."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()                          # imports the installed plugins, which register their launchers
    return {Path(n).stem for n in ConfigStore.instance().list("hydra/launcher")}


def launchers() -> dict[str, str]:
    """hydra/launcher options -> the launcher each one runs: Hydra's own and the plugins' (installed or not, by their
    names), and specexp's conf/hydra/launcher/NAME.yaml, which extend a plugin's (their first defaults entry)."""
    out = {name: name for name in sorted(installed_launchers() | set(LAUNCHER_PLUGINS))}
    for f in sorted((CONF_DIR / "hydra" / "launcher").glob("*.yaml")):
        out[f.stem] = str((OmegaConf.load(f).get("defaults") or ["basic"])[0])
    return out


def _check_launcher(parsed) -> None:
    """`hydra/launcher=NAME`: an option, whose plugin is installed (else Hydra fails deep inside its own code)."""
    for o in parsed:
        if o.key_or_group != "hydra/launcher" or o.is_delete():
            continue
        known, installed = launchers(), installed_launchers()
        for name in (list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]):
            if name not in known:
                fail(f"hydra/launcher={name} is not an option; choose one of: {', '.join(sorted(known))}")
            if known[name] not in installed and known[name] in LAUNCHER_PLUGINS:
                package, extra = LAUNCHER_PLUGINS[known[name]]
                fail(f"hydra/launcher={name} needs the {package} plugin, which is not installed: "
                     f"pip install -e '.[{extra}]' (or pip install {package})")


def _overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _FLAGS_WITH_VALUE:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def _check_output_dir(parsed, multirun: bool) -> None:
    """Hydra creates the run directory before any specexp code runs, and a failure there is a stack trace: check
    that its nearest existing ancestor is a writable directory first."""
    import tempfile

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    value = ([str(o.value()) for o in parsed if o.key_or_group == key] or [None])[-1]     # the last one wins
    label = f"{key}={value}"
    if value is None or "${" in value:          # the default: a new directory under the working directory
        value, label = ".", f"the working directory (where {key} goes by default)"
    p = Path(value).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        fail(f"{label}: {p} is not a directory")
    try:
        tempfile.TemporaryFile(dir=p).close()
    except OSError as e:
        fail(f"{label}: cannot write in {p} ({e.strerror})")


def precheck(argv: list[str]) -> None:
    """Validate group options and keys of the command line against the conf tree; exit with one line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(_overrides(argv))
    except HydraException as e:
        fail(_first_line(e))
    _check_output_dir(parsed, multirun=any(a in ("-m", "--multirun") for a in argv))
    _check_launcher(parsed)
    options = groups()
    group_args = []
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.package is not None:
            continue
        if key in options and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            for v in values:
                if str(v) not in options[key]:
                    fail(f"{key}={v} is not an option; choose one of: {', '.join(options[key])}")
            group_args.append(f"{o.get_key_element()}={values[0]}")
    if any(a in ("--config-name", "-cn", "--config-dir", "-cd") or a.startswith(("--config-name=", "--config-dir="))
           for a in argv):
        return                  # another primary config (a sweep file): its keys are Hydra's to check
    group_args += [a for a in _overrides(argv) if a.startswith("hydra.searchpath=")]    # plugins' conf dirs
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=group_args)
    except HydraException as e:
        fail(_first_line(e))
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or key in options or o.is_add() or o.is_force_add() or o.is_delete():
            continue
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>":
            fail(unknown_key_message(OmegaConf.to_container(cfg), key))
