"""Command-line checks that run before Hydra: a wrong group option or key is one line listing the valid
choices (Hydra's own messages span many lines and end with a stack-trace hint). The checks raise `UserError`;
the entry point (`__main__.main`) prints it as one line and exits 2, and the Python API (api.py) raises it."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from . import log
from .config import unknown_key_message
from .errors import UserError, clip
from .overrides import PLAIN_VALUE, duplicate_key, hydra_quote
from .paths import CONF_DIR

# Hydra flags that take a value as the next argument (--info takes one only when it names what to show).
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c",
                     "--package", "-p", "--experimental-rerun"}
_INFO_FLAGS, _INFO_CHOICES = {"--info", "-i"}, {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
# Hydra flags that run nothing: help, version, shell completion (`-sc install=bash`, and the `-sc query=bash` the
# installed script calls at every <TAB>: their `install=`/`query=` words are Hydra's, not overrides) and --info.
# The command line is Hydra's to read then; precheck stays out of the way.
PASS_THROUGH = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", *_INFO_FLAGS}


LOG_NAME = log.FILE                 # Hydra's job log (hydra.job.name + .log): internal errors' tracebacks go there
ERROR_FILE = "error.txt"            # a multirun job's one-line error, in its own directory


def _first_line(e: BaseException) -> str:
    while e is not None and not str(e).strip():
        e = e.__cause__ or e.__context__
    return str(e).strip().splitlines()[0] if e is not None else "invalid command line"


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "(no message)"


def fail(message: str, code: int = 2) -> None:
    print(f"specexp: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def log_traceback(e: BaseException, log: Path) -> Path:
    """Append `e`'s full traceback to `log` (the run's specexp.log) and return where it went: the log, or a temp
    file when the log cannot be written (a read-only run directory must not hide the traceback too)."""
    import tempfile
    import time
    import traceback

    text = (f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][specexp][ERROR] - internal error\n"
            + "".join(traceback.format_exception(type(e), e, e.__traceback__)))
    for path in (Path(log), Path(tempfile.gettempdir()) / f"specexp-{os.getpid()}.log"):
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return Path(log)


def record_job_error(path: Path, message: str) -> None:
    """A multirun job's one line, in its directory (`FailedJobs` collects them when the sweep ends)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message + "\n", encoding="utf-8")
    except OSError as e:            # an unwritable job directory: the warning line still says what failed
        log.LOG.warning(f"cannot write {path} ({e.strerror})")


def failed_jobs(sweep_dir: Path, since: float) -> list[tuple[str, str]]:
    """(job directory relative to the sweep's, its one line) of every job of this sweep that failed: an error.txt
    written since the sweep began (older ones belong to jobs of an earlier sweep into the same directory)."""
    out = []
    for f in sorted(Path(sweep_dir).rglob(ERROR_FILE), key=lambda f: (len(f.parts), str(f))):
        try:
            if f.stat().st_mtime >= since:
                out.append((str(f.parent.relative_to(sweep_dir)), f.read_text(encoding="utf-8").strip()))
        except OSError:
            continue
    return out


MULTIRUN_TABLE = "multirun"         # <sweep dir>/multirun.md and .json: every job's overrides -> τ, CI, speedup


def _fresh(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def sweep_table(sweep_dir: Path, since: float) -> tuple[list[dict], list[str]]:
    """(jobs, swept keys) of this sweep: every job directory under `sweep_dir` whose command.json (written when a
    job claims its directory, tracking.command_record) or error.txt is from this sweep, in job order, with its
    overrides, the swept keys among them (those whose values differ between jobs), and the macro τ, its 95% CI
    and the macro speedup as its summary.json has them (the evaluator's; nothing is recomputed here)."""
    from .tracking import COMMAND_FILE, read_command

    dirs = {f.parent for name in (COMMAND_FILE, ERROR_FILE) for f in Path(sweep_dir).rglob(name) if _fresh(f, since)}
    jobs = []
    order = lambda d: [(0, int(p)) if p.isdigit() else (1, p) for p in d.relative_to(sweep_dir).parts]  # noqa: E731
    for d in sorted(dirs, key=order):                     # job 2 before job 10
        record = read_command(d) if _fresh(d / COMMAND_FILE, since) else None
        overrides = dict(o.lstrip("+~").split("=", 1) for o in (record or {}).get("overrides", []) if "=" in o)
        job = {"job": str(d.relative_to(sweep_dir)), "overrides": overrides, "tau": None, "tau_ci95": None,
               "speedup": None, "error": None, "rerun": (record or {}).get("rerun")}
        if _fresh(d / ERROR_FILE, since):
            job["error"] = (d / ERROR_FILE).read_text(encoding="utf-8", errors="replace").strip()
        elif (d / "summary.json").is_file():
            try:
                macro = json.loads((d / "summary.json").read_text(encoding="utf-8")).get("macro") or {}
                job.update(tau=macro.get("tau"), tau_ci95=macro.get("tau_ci95"), speedup=macro.get("speedup"))
            except (OSError, ValueError, AttributeError):
                job["error"] = "summary.json unreadable"
        jobs.append(job)
    keys = list(dict.fromkeys(k for j in jobs for k in j["overrides"]))
    swept = [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1] or (keys if len(jobs) == 1 else [])
    for j in jobs:
        j["swept"] = {k: j["overrides"].get(k) for k in swept}
    return jobs, swept


def write_sweep_table(sweep_dir: Path, since: float) -> str | None:
    """Print the sweep's table and write it beside its jobs (MULTIRUN_TABLE .md and .json); None without jobs.
    A sweep directory that cannot be written still gets the table printed (and one warning line)."""
    from .files import write_json, write_text_atomic
    from .report.tables import multirun_markdown

    jobs, swept = sweep_table(sweep_dir, since)
    if not jobs:
        return None
    md = (f"# multirun {sweep_dir}: {len(jobs)} jobs (τ includes the bonus token; 95% CI: bootstrap over prompts)\n\n"
          + multirun_markdown(jobs, swept))
    try:
        write_text_atomic(Path(sweep_dir) / f"{MULTIRUN_TABLE}.md", md)
        write_json(Path(sweep_dir) / f"{MULTIRUN_TABLE}.json", {"sweep_dir": str(sweep_dir), "swept": swept,
                                                                "jobs": jobs})
    except OSError as e:
        log.LOG.warning(f"cannot write the sweep's table into {sweep_dir} ({e.strerror})")
    log.table(md)
    return md


try:
    from hydra.experimental.callback import Callback
except ImportError:                 # pragma: no cover - Hydra < 1.1
    Callback = object


class FailedJobs(Callback):
    """A multirun ends with one table of its jobs (`write_sweep_table`: overrides -> τ, CI, speedup, printed and
    written to <sweep dir>/multirun.md + .json), then, when jobs failed, one line listing them and a non-zero exit:
    2 when every failure was the user's input, 1 when one was an internal error. Configured in conf/config.yaml
    (hydra.callbacks); it runs in the launching process, so it sees every launcher's jobs through their
    directories (basic, joblib, submitit)."""

    def __init__(self) -> None:
        self.since = 0.0

    def on_multirun_start(self, config, **kwargs) -> None:
        import time

        self.since = time.time() - 1.0            # file times may be coarser than time.time()

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        write_sweep_table(sweep_dir, self.since)
        failed = failed_jobs(sweep_dir, self.since)
        if not failed:
            return
        internal = any(m.startswith("internal error") for _, m in failed)
        listed = "; ".join(f"job {job}: {m}" for job, m in failed)
        fail(f"{len(failed)} job(s) of the sweep failed (each one's line is in its {ERROR_FILE} under {sweep_dir}): "
             f"{listed}", 1 if internal else 2)


def plugin_config_dirs() -> list:
    """Config directories of the drafters registered by `SPECEXP_PLUGINS` modules (registry.py); none without."""
    if not os.environ.get("SPECEXP_PLUGINS"):
        return []                   # keep the common path free of the registry's torch import
    from . import registry

    registry.load_plugins()                     # a plugin that fails: one UserError line
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
                raise UserError(f"hydra/launcher={name} is not an option; choose one of: {', '.join(sorted(known))}")
            if known[name] not in installed and known[name] in LAUNCHER_PLUGINS:
                package, extra = LAUNCHER_PLUGINS[known[name]]
                raise UserError(f"hydra/launcher={name} needs the {package} plugin, which is not installed: "
                     f"pip install -e '.[{extra}]' (or pip install {package})")


def _overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a in _FLAGS_WITH_VALUE or (a in _INFO_FLAGS and i + 1 < len(argv) and argv[i + 1] in _INFO_CHOICES):
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def passes_through(argv: list[str]) -> bool:
    """Whether the command line is one of Hydra's own that runs no task (PASS_THROUGH): not specexp's to check."""
    return any(a.split("=", 1)[0] in PASS_THROUGH for a in argv)


def _check_output_dir(parsed, multirun: bool) -> None:
    """Hydra creates the run directory before any specexp code runs, and a failure there is a stack trace: check
    that its nearest existing ancestor is a writable directory first."""
    import tempfile

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    value = ([str(o.value()) for o in parsed if o.key_or_group == key] or [None])[-1]     # the last one wins
    label = f"{key}={value}"
    if value is not None and not value.strip():     # Hydra would take it as the working directory itself
        raise UserError(f"{key}={value!r} is empty; name a directory for the run's files (or drop it for the default, "
             f"outputs/TASK/DATE_TIME)")
    if value is None or "${" in value:          # the default: a new directory under the working directory
        value, label = ".", f"the working directory (where {key} goes by default)"
    p = Path(value).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise UserError(f"{label}: {p} is not a directory")
    try:
        tempfile.TemporaryFile(dir=p).close()
    except OSError as e:
        raise UserError(f"{label}: cannot write in {p} ({e.strerror})")


# Hydra flags refused outright: --experimental-rerun unpickles its file, so a crafted file runs any code.
REFUSED_FLAGS = {"--experimental-rerun": "it unpickles FILE (a crafted file runs code); rerun the same command "
                                         "line instead (the run directory's config.yaml records the config)"}


# Every flag Hydra's command line knows (hydra/_internal/utils.py get_args_parser); any other is one line.
KNOWN_FLAGS = {*_FLAGS_WITH_VALUE, *PASS_THROUGH, "--multirun", "-m", "--run", "-r", "--resolve"}


def _check_flags(argv: list[str]) -> None:
    for a in argv:
        flag = a.split("=", 1)[0]
        if flag in REFUSED_FLAGS:
            raise UserError(f"{flag} is refused: {REFUSED_FLAGS[flag]}")
        if a.startswith("-") and flag not in KNOWN_FLAGS:
            raise UserError(f"unknown flag {clip(a, 60)}: specexp takes key=value and group=option overrides, and "
                            f"Hydra's flags (-m/--multirun, --cfg job, --info, --config-name NAME, ...; "
                            f"`python -m specexp --hydra-help` lists them)")


def parse_overrides(overrides: list[str]):
    """Hydra's parse of the overrides, or one line naming the one it cannot read (cut to a readable length) and, for
    a value with spaces or non-ASCII characters, how to quote it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        return parser.parse_overrides(overrides)
    except HydraException as e:
        bad = next((o for o in overrides if not _parses(parser, o)), None)
        if bad is None:
            raise UserError(clip(_first_line(e), 300)) from None
        key, _, value = bad.partition("=")
        if not PLAIN_VALUE.fullmatch(value) and not value.startswith(("'", '"', "[", "{", "${")):
            raise UserError(f"cannot read the override {clip(bad, 300)!r}: a value with spaces, non-ASCII letters or "
                            f"quotes must be quoted for Hydra inside the shell's quotes: "
                            f"\"{key}={hydra_quote(clip(value, 300))}\"") from None
        raise UserError(f"cannot read the override {clip(bad)!r} ({clip(_first_line(e), 120)})") from None


def _parses(parser, override: str) -> bool:
    from hydra.errors import HydraException

    try:
        parser.parse_overrides([override])
    except HydraException:
        return False
    return True


def precheck(argv: list[str], keys: bool = True) -> None:
    """Validate group options and keys of the command line against the conf tree; raise one `UserError` line.
    Hydra's own flags that run nothing (help, --info, shell completion) are left to Hydra. `keys=False`: only what
    the command line itself shows (flags, group options, output dir, launcher), no composition: `__main__` and the
    API check that much first and leave the composition to Hydra, calling `precheck(argv)` only when Hydra's
    composition failed (`explain_failure`), so a run composes its config once."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    _check_flags(argv)
    if passes_through(argv):
        return
    parsed = parse_overrides(_overrides(argv))
    _check_output_dir(parsed, multirun=any(a in ("-m", "--multirun") for a in argv))
    _check_launcher(parsed)
    options = groups()
    group_args = []
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.package is not None:
            continue
        text = (o.input_line or "").split("=", 1)[-1]
        if (twice := duplicate_key(text)) is not None:
            raise UserError(f"{key}={clip(text)}: the key {twice} is written twice (Hydra would keep the last one "
                            f"silently); write each key once")
        if o.is_delete():             # every task reads its whole config (config.py): a missing key is a crash later
            raise UserError(
                f"~{key}: the {key} group cannot be removed; choose one of its options instead: "
                f"{', '.join(options[key])}" if key in options else
                f"~{key}: a key cannot be deleted, every run reads it; set it instead ({key}=VALUE; `python -m "
                f"specexp --cfg job` shows every key and its default)")
        if key in options:
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            for v in values:
                if str(v) not in options[key]:
                    raise UserError(f"{key}={clip(v)} is not an option; choose one of: {', '.join(options[key])}")
            group_args.append(f"{o.get_key_element()}={values[0]}")
    if not keys:
        return
    if any(a in ("--config-name", "-cn", "--config-dir", "-cd") or a.startswith(("--config-name=", "--config-dir="))
           for a in argv):
        return                  # another primary config (a sweep file): its keys are Hydra's to check
    group_args += [a for a in _overrides(argv) if a.startswith("hydra.searchpath=")]    # plugins' conf dirs
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=group_args)
    except HydraException as e:
        raise UserError(_first_line(e))
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or key in options or o.is_add() or o.is_force_add() or o.is_delete():
            continue
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>":
            raise UserError(unknown_key_message(OmegaConf.to_container(cfg), key))
        if not o.is_sweep_override() and isinstance(o.value(), dict):
            _check_merged_keys(cfg, key, o.value())


def explain_failure(argv: list[str], e: Exception) -> UserError:
    """The one line of a failed Hydra composition of `argv`: the key check's (`precheck`: an unknown key with the
    nearest known ones, a typo inside a mapping), else the first line of Hydra's own message."""
    try:
        precheck(argv)
    except UserError as known:
        return known
    return UserError(_first_line(e))


def _check_merged_keys(cfg, key: str, value: dict) -> None:
    """`key={a: 1}` over a mapping merges into it (Hydra), so its keys must be the mapping's: an unknown one is
    one line (Hydra's own message spans several), e.g. a typo in `eval.tune_samples={gsm9k: 2}`."""
    node = OmegaConf.select(cfg, key)
    if not OmegaConf.is_dict(node):
        return                                  # a scalar or a list is replaced, not merged
    for k, v in value.items():
        if k not in node:
            raise UserError(unknown_key_message(OmegaConf.to_container(cfg), f"{key}.{k}"))
        if isinstance(v, dict):
            _check_merged_keys(cfg, f"{key}.{k}", v)


def record_job_command(job_dir: Path, job: dict) -> None:
    """A failed multirun job's command.json, unless its directory has one (it may be another run's, which a refused
    job must not change): the sweep's table then names the failed job's overrides, and `rerun` repeats it."""
    from .files import write_json
    from .tracking import COMMAND_FILE, command_record

    path = Path(job_dir) / COMMAND_FILE
    if path.exists():
        return
    try:
        write_json(path, command_record(job_dir, job, sys.argv))
    except OSError:
        pass                            # error.txt (or the warning line) already says what failed
