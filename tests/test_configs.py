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


@pytest.mark.parametrize("size", ["4b", "8b"])
def test_paper_eagle3_recipes_use_eagle_s_qwen3_tree_and_soft_labels(size):
    """paper_eagle3_qwen3_*: EAGLE's Qwen3 evaluation script's tree (gen_ea_answer_qwen3.py: 32 tokens, depth 8,
    top-k 4), and when trained EAGLE-3's loss (soft labels) over SpecForge's 32,000-token draft vocabulary; the
    training command of the header composes and validates. The mini recipe keeps its named hard labels."""
    from specexp.config import validate

    cfg = make_cfg([f"experiment=paper_eagle3_qwen3_{size}"])
    tree = cfg.drafter.tree
    assert (tree.total_tokens, tree.depth, tree.top_k) == (32, 8, 4) and cfg.drafter.mode == "tree"
    assert cfg.drafter.labels == "soft" and cfg.drafter.draft_vocab_size == 32000
    train = make_cfg([f"experiment=paper_eagle3_qwen3_{size}", "task=train", "drafter.init=random",
                      "drafter.checkpoint=null", f"data=paper_qwen3_{size}"])
    validate(train, job={})
    assert train.task.name == "train" and train.drafter.labels == "soft"
    assert make_cfg(["experiment=mini_eagle3"]).drafter.labels == "hard"
    assert make_cfg(["drafter=eagle3"]).drafter.labels == "soft"
