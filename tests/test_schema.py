"""One schema: the typed dataclasses of config.py and the drafters' `settings` are the keys, types and rules of the
config; the YAML presets hold values for them; the code reads the same dataclasses (`from_cfg`); a new built-in
drafter declares its keys in its own module and touches no central table."""
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from dataclasses import FrozenInstanceError, fields, is_dataclass
from pathlib import Path

import pytest
from conftest import ROOT, make_cfg

from specexp import config, registry
from specexp.errors import UserError
from specexp.schema import Settings, hints_of, nested

GROUPS = {"eval": config.EvalConfig, "decoding": config.DecodingConfig, "train": config.TrainConfig,
          "data": config.DataConfig, "target": config.TargetConfig, "fusion": config.FusionConfig,
          "benchmark": config.BenchmarkConfig, "logger": config.LoggerConfig}


def _missing(tree: dict, cls, at: str) -> list[str]:
    """Preset keys without a field (nested groups followed)."""
    hints, names, out = hints_of(cls), {f.name for f in fields(cls)}, []
    for k, v in tree.items():
        if k not in names:
            out.append(f"{at}.{k}")
        elif isinstance(v, dict) and (sub := nested(hints[k])) is not None:
            out += _missing(v, sub, f"{at}.{k}")
    return out


def _settings_classes():
    seen, todo = set(), [config.Config, *(e.settings for e in registry.DRAFTERS.values() if e.settings)]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += [sub for t in hints_of(cls).values() if (sub := nested(t)) is not None]
    return seen


def test_every_annotation_is_a_type_and_every_class_a_frozen_settings():
    """A field annotation that does not resolve (a name shadowed in its module) would check nothing: refused here."""
    for cls in _settings_classes():
        assert issubclass(cls, Settings) and cls.__dataclass_params__.frozen, cls
        for name, t in hints_of(cls).items():
            members = typing.get_args(t) or (t,)
            assert all(m is typing.Any or isinstance(m, type) or typing.get_origin(m) for m in members), (cls, name, t)


def test_every_preset_key_has_its_field():
    """A key added to a YAML preset without its field fails here (and would be refused by validate)."""
    missing = []
    for group, cls in GROUPS.items():
        for name in config.options(group):
            missing += _missing(config.option_tree(group, name), cls, f"{group}={name}: {group}")
    for name in config.options("task"):
        tree = config.option_tree("task", name)
        missing += _missing(tree if "task" in tree else {"task": tree}, config.Config, f"task={name}:")
    for name in config.options("drafter"):
        settings = registry.drafter_entry(name).settings
        assert settings is not None, f"built-in drafter {name} declares no settings"
        missing += _missing(config.option_tree("drafter", name), settings, f"drafter={name}: drafter")
    assert not missing, missing


def test_drafter_rules_live_with_the_drafters():
    """config.py names no drafter key: the drafters' rules are on their own settings classes."""
    text = (ROOT / "src" / "specexp" / "config.py").read_text()
    assert not re.findall(r"drafter\.[a-z_.]+=", text) and "RULES" not in text     # no drafter key, no table
    assert registry.drafter_entry("eagle3").settings.__module__ == "specexp.drafters.eagle3"
    with pytest.raises(UserError, match=r"drafter.tree.depth=99 is not valid; expected an int >= 0"):
        config.validate(make_cfg(["drafter=eagle3", "drafter.tree.depth=99"]), job={})


def test_typed_views_read_the_composed_values():
    """The frozen views the code reads hold the composed values, nested groups as their own Settings."""
    cfg = make_cfg(["train=smoke", "train.lr=0.5", "data=mini_regen", "eval.max_new_tokens=17"])
    t = config.TrainConfig.from_cfg(cfg.train)
    assert t.lr == 0.5 and t.max_steps == 40 and isinstance(t.fsdp, config.FsdpConfig)
    assert t.fsdp.sharding_strategy == cfg.train.fsdp.sharding_strategy
    with pytest.raises(FrozenInstanceError):
        t.lr = 1.0
    d = config.DataConfig.from_cfg(cfg.data)
    assert isinstance(d.regen, config.RegenConfig) and d.regen.max_new_tokens == cfg.data.regen.max_new_tokens
    assert config.EvalConfig.from_cfg(cfg.eval).max_new_tokens == 17
    for group, cls in GROUPS.items():
        view = cls.from_cfg(cfg[group])
        for f in fields(cls):
            if f.name in cfg[group] and not is_dataclass(getattr(view, f.name)):
                assert getattr(view, f.name) == cfg[group][f.name] or f.name == "chat_kwargs", (group, f.name)


def test_a_task_group_belongs_to_its_task():
    """export.* is a key of task=export only (as its preset composes it), whatever the schema's union."""
    with pytest.raises(UserError, match=r"unknown key 'export'"):
        config.validate(make_cfg(["+export.format=vllm"]), job={})


TOY = '''"""A toy built-in drafter (tests/test_schema.py): propose the anchor again, `max_drafts` times."""
from __future__ import annotations

import torch

from ..schema import MAX_BLOCK, Settings, frozen, is_int, setting, upto
from .base import Proposal


@frozen
class ToySettings(Settings):
    name: str = "toy"
    max_drafts: int = setting(3, is_int(1, MAX_BLOCK), f"an int >= 1; {upto(MAX_BLOCK)}")


class Repeat:
    tap_layers = ()

    def __init__(self, max_drafts: int, device, vocab: int):
        self.name, self.max_drafts, self.device, self.vocab = "toy", max_drafts, device, vocab

    def reset(self):
        pass

    def prefill(self, taps):
        pass

    def propose(self, anchor, start, k, sampling):
        tokens = torch.full((k,), int(anchor), dtype=torch.long, device=self.device)
        if sampling is None:
            return Proposal(tokens)
        q = torch.zeros(k, self.vocab, device=self.device)
        q[torch.arange(k), tokens] = 1.0
        return Proposal(tokens, q)

    def commit(self, n, taps):
        pass


def build(cfg, target):
    return Repeat(cfg.max_drafts, target.device, target.vocab_size)
'''
ENTRY = '''
from .drafters import toy  # noqa: E402  (the toy's entry: tests/test_schema.py)

register_drafter(DrafterEntry("toy", toy.build, settings=toy.ToySettings, summary="repeat the anchor"))
'''


@pytest.fixture
def repo_with_toy(tmp_path):
    """A copy of the package and its conf tree with the toy added as a built-in drafter: its module, its preset,
    one registry entry. Nothing else changes."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "conf", repo / "conf")
    (repo / "data").symlink_to(ROOT / "data")
    (repo / "src" / "specexp" / "drafters" / "toy.py").write_text(TOY)
    (repo / "conf" / "drafter" / "toy.yaml").write_text("# a toy built-in drafter (tests/test_schema.py)\n"
                                                        "name: toy\nmax_drafts: 3\n")
    reg = repo / "src" / "specexp" / "registry.py"
    reg.write_text(reg.read_text() + ENTRY)
    return repo


def _changed(repo: Path) -> list[str]:
    out = []
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if p.is_file() and rel.parts[0] in ("src", "conf") and "__pycache__" not in rel.parts:
            orig = ROOT / rel
            if not orig.is_file() or orig.read_bytes() != p.read_bytes():
                out.append(str(rel))
    return out


def _run(repo: Path, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(repo / "src"),
           "SPECEXP_CACHE": os.environ.get("SPECEXP_CACHE", str(ROOT / ".cache" / "specexp"))}
    env.pop("SPECEXP_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "specexp", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_built_in_toy_drafter_touches_its_module_its_preset_and_one_entry(repo_with_toy):
    assert _changed(repo_with_toy) == ["conf/drafter/toy.yaml", "src/specexp/drafters/toy.py",
                                       "src/specexp/registry.py"]
    tiny = ["target=tiny_qwen3", "benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=24", "eval.warmup=0",
            "eval.progress=false", "logger=none", "device=cpu"]
    bad = _run(repo_with_toy, "drafter=toy", "drafter.max_drafts=0", *tiny)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "specexp: error: drafter.max_drafts=0 is not valid; expected an int >= 1; at most 1,024"], bad.stderr
    typo = _run(repo_with_toy, "drafter=toy", "+drafter.max_draft=2", *tiny)
    assert typo.returncode == 2 and "unknown key 'drafter.max_draft'" in typo.stderr, typo.stderr
    assert "valid keys under 'drafter': max_drafts, name" in typo.stderr, typo.stderr
    run = repo_with_toy / "run"
    ok = _run(repo_with_toy, "drafter=toy", *tiny, f"hydra.run.dir={run}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["drafter"] == "toy" and s["benchmarks"]["gsm8k"]["lossless_mismatches"] == 0
    assert s["num_draft_tokens"] == 3
