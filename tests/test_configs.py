"""Every option of every config group and every experiment composes; precheck accepts them."""
import pytest
from conftest import make_cfg

from specexp.cli import groups, precheck
from specexp.errors import UserError

OPTIONS = [(g, o) for g, opts in groups().items() for o in opts]


@pytest.mark.parametrize("group, option", OPTIONS)
def test_every_option_composes(group, option):
    cfg = make_cfg([f"{group}={option}"])
    assert cfg.task.name and cfg.target.name and cfg.drafter.name
    precheck([f"{group}={option}"])


def test_experiment_header_gives_its_command():
    from conftest import CONF

    for f in (CONF / "experiment").glob("*.yaml"):
        text = f.read_text()
        assert text.startswith("# @package _global_") and f"python -m specexp experiment={f.stem}" in text


def test_sweep_syntax_is_checked_per_value():
    precheck(["-m", "decoding=greedy,sample_a", "eval.max_new_tokens=8,16"])
    with pytest.raises(UserError, match="decoding=sample_c is not an option; choose one of: "):
        precheck(["-m", "decoding=greedy,sample_c"])
