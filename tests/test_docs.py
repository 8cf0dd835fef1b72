"""The documentation matches the repository: the README's first screen holds the two commands for a fresh machine,
the README's config-group table lists every option of every group in conf/, the experiments and sweeps READMEs
list every script and sweep file, relative links resolve, and no text points at notes that live outside the
repository. Pure file reads: well under a second."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini"}
# Paths that exist only beside a developer's checkout, never in a user's clone (spelt in pieces so that this
# file does not match itself).
OUTSIDE = re.compile("|".join([r"(?<![\w-])" + "research" + r"/[\w.-]+", r"\b" + "DESIGN" + r"\.md\b",
                               r"\.\./" + "shared" + r"\b", "/work/" + "shared"]))


def groups() -> dict[str, set[str]]:
    """{group: options} of every directory under conf/ that holds option files, named by its path (`hydra/launcher`
    for Hydra's own group conf/hydra/launcher/)."""
    dirs = sorted(d for d in CONF.rglob("*") if d.is_dir() and any(d.glob("*.yaml")))
    return {d.relative_to(CONF).as_posix(): {p.stem for p in d.glob("*.yaml")} for d in dirs}


def cells(line: str) -> list[str]:
    """The cells of a markdown table row (escaped pipes `\\|` stay inside their cell)."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [c.strip() for c in parts[1:-1]]


def option_table(text: str) -> dict[str, set[str]]:
    """{group: options} from every README table whose header starts `| group | options |`: the options are
    the backticked words of the second cell (`a b c` or `a`, `b`), "(default)" and prose ignored."""
    rows: dict[str, set[str]] = {}
    in_table = False
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        c = cells(line)
        if len(c) >= 2 and c[0].lower() == "group" and c[1].lower() == "options":
            in_table = True
            continue
        if in_table and len(c) >= 2 and not set(c[0]) <= set("-: "):
            name = c[0].strip("`")
            rows.setdefault(name, set()).update(w for span in re.findall(r"`([^`]*)`", c[1]) for w in span.split())
    return rows


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):       # not a git checkout: everything but the usual outputs
        skip = {".git", ".venv", "outputs", "multirun", "runs", "wandb", ".cache", "__pycache__"}
        files = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in files if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.parent.name == ".ci")]


# The README's two commands for a fresh machine: the main job, and the test suite as CI runs it (.ci/run).
MAIN_COMMAND = "bash scripts/install.sh && .venv/bin/python -m specexp"
TEST_COMMAND = "bash scripts/install.sh test && .venv/bin/python -m pytest -n auto --dist loadfile"


def test_readme_first_screen_and_length():
    """The README's first 30 lines hold both commands, verbatim, each on its own line of a code block; the README
    stays a summary (under 400 lines: measurements and long references live under docs/)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = [line.strip() for line in lines[:30]]
    missing = [c for c in (MAIN_COMMAND, TEST_COMMAND) if c not in first]
    assert not missing, f"README.md's first 30 lines lack: {missing}"
    assert len(lines) < 400, f"README.md has {len(lines)} lines; move details to docs/ (the limit is 400)"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install.sh test" in ci and "-n auto --dist loadfile" in ci, \
        ".ci/run no longer runs the README's test command"


def test_readme_layout_names_every_module():
    """The README's Layout block names every module of the package (a new module gets its line there)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout\n```\n")
    block = text[start: text.index("```", start + len("## Layout\n```\n"))]
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "src" / "specexp").rglob("*.py"))
               if p.stem != "__init__" and not re.search(rf"\b{re.escape(p.stem)}\b", block)]
    assert not missing, f"README.md's Layout block does not name: {', '.join(missing)}"


def test_config_yaml_comments_list_every_option_of_their_groups():
    """conf/config.yaml's defaults: a group whose comment lists options (a | b | ...) lists all of them."""
    lines = (ROOT / "conf" / "config.yaml").read_text().splitlines()
    problems = []
    for n, line in enumerate(lines):
        m = re.match(r"\s*- (\w+): (\S+)\s+#(.*)", line)
        if not m or "|" not in m.group(3):
            continue
        comment = m.group(3)
        for more in lines[n + 1:]:                      # a comment continued on the lines below
            if not more.strip().startswith("#"):
                break
            comment += more
        group = m.group(1)
        options = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        if missing := sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", comment)):
            problems.append(f"{group}: {', '.join(missing)}")
    assert not problems, f"conf/config.yaml's comments do not list: {'; '.join(problems)}"


def test_readme_option_table_lists_every_config_option():
    table = option_table((ROOT / "README.md").read_text())
    assert table, "README.md has no '| group | options |' table"
    problems = []
    for group, options in groups().items():
        if group not in table:
            problems.append(f"group `{group}` has no row (options: {', '.join(sorted(options))})")
            continue
        if missing := options - table[group]:
            problems.append(f"`{group}` row lacks {', '.join(sorted(missing))}")
        if stale := table[group] - options:
            problems.append(f"`{group}` row lists {', '.join(sorted(stale))}, not in conf/{group}/")
    for group in set(table) - set(groups()):
        problems.append(f"row `{group}` is not a directory of conf/")
    assert not problems, "README.md config table vs conf/: " + "; ".join(problems)


def test_no_pointer_outside_the_repository():
    hits = []
    for f in tracked_text_files():
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if m := OUTSIDE.search(line):
                hits.append(f"{f.relative_to(ROOT)}:{i}: {m.group(0)}")
    assert not hits, "references to files outside the repository (point into docs/ instead):\n" + "\n".join(hits)


@pytest.mark.parametrize("folder,pattern", [("experiments", "*.py"), ("sweeps", "*.yaml")])
def test_readmes_list_every_script_and_sweep(folder, pattern):
    files = sorted((ROOT / folder).glob(pattern))
    text = (ROOT / folder / "README.md").read_text()
    missing = [p.name for p in files if f"`{p.name}`" not in text]
    assert not missing, f"{folder}/README.md does not list: {', '.join(missing)}"
    top = (ROOT / "README.md").read_text()
    missing = [f"{folder}/{p.name}" for p in files if f"`{folder}/{p.name}`" not in top]
    assert not missing, f"README.md (Paper tables, figures and sweeps) does not list: {', '.join(missing)}"


def test_docs_index_and_relative_links():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "docs/ is empty"
    index = (ROOT / "docs" / "README.md").read_text()
    unlisted = [p.name for p in docs if p.name != "README.md" and f"]({p.name}" not in index]
    assert not unlisted, f"docs/README.md does not link: {', '.join(unlisted)}"
    broken = []
    for f in [ROOT / "README.md", *docs, ROOT / "experiments" / "README.md", ROOT / "sweeps" / "README.md",
              ROOT / "experiments" / "results" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", f.read_text()):
            path = target.split("#", 1)[0]
            if path and "://" not in path and not (f.parent / path).exists():
                broken.append(f"{f.relative_to(ROOT)} -> {target}")
    assert not broken, "broken relative links: " + ", ".join(broken)
