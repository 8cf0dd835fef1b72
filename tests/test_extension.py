"""The extension story: a new drafter is one module + one YAML + one `register_drafter` call, and nothing else.

The drafter below lives in a temporary directory outside the package (as a user's would), is loaded through
`SPECEXP_PLUGINS`, runs through `task=eval` losslessly, and appears among the CLI's choices."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
"""History lookup: propose what followed the anchor's last occurrence in the text generated so far."""
from pathlib import Path

import torch

from specexp import registry
from specexp.drafters.base import Proposal


class HistoryLookup:
    tap_layers = ()

    def __init__(self, max_drafts: int, device, vocab: int):
        self.name, self.max_drafts, self.device, self.vocab = "lookup", max_drafts, device, vocab

    def reset(self):
        self.history, self.last = [], []

    def prefill(self, taps):
        pass

    def propose(self, anchor, start, k, sampling):
        self.history.append(anchor)
        h = self.history
        hits = [i for i in range(len(h) - 1) if h[i] == anchor]
        follow = h[hits[-1] + 1:][:k] if hits else []
        self.last = follow + [anchor] * (k - len(follow))
        tokens = torch.tensor(self.last, dtype=torch.long, device=self.device)
        if sampling is None:
            return Proposal(tokens)
        q = torch.zeros(k, self.vocab, device=self.device)
        q[torch.arange(k), tokens] = 1.0                     # point masses: a deterministic draft
        return Proposal(tokens, q)

    def commit(self, n, taps):
        self.history += self.last[:n]


def build(cfg, target):
    return HistoryLookup(cfg.max_drafts, target.device, target.vocab_size)


registry.register_drafter(registry.DrafterEntry("lookup", build, conf_dir=Path(__file__).parent / "conf",
                                                summary="history lookup (a plugin)"))
'''

YAML = """\
# History lookup: a drafter that lives outside specexp (tests/test_extension.py)
name: lookup
max_drafts: 4
"""


def _run(tmp_path, *args, plugin=True):
    cache = os.environ.get("SPECEXP_CACHE", str(ROOT / ".cache" / "specexp"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(tmp_path), "SPECEXP_CACHE": cache}
    env.pop("SPECEXP_PLUGINS", None)
    if plugin:
        env["SPECEXP_PLUGINS"] = "lookup_drafter"
    return subprocess.run([sys.executable, "-m", "specexp", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def plugin_dir(tmp_path):
    (tmp_path / "lookup_drafter.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "conf" / "drafter").mkdir(parents=True)
    (tmp_path / "conf" / "drafter" / "lookup.yaml").write_text(YAML)
    return tmp_path


def test_plugin_drafter_is_listed_among_the_choices(plugin_dir):
    out = _run(plugin_dir, "drafter=nope")
    assert out.returncode == 2 and "lookup" in out.stderr and "dflash" in out.stderr, out.stderr
    without = _run(plugin_dir, "drafter=nope", plugin=False)
    assert without.returncode == 2 and "lookup" not in without.stderr


@pytest.mark.slow
def test_plugin_drafter_runs_through_eval_losslessly(plugin_dir):
    run = plugin_dir / "run"
    out = _run(plugin_dir, "drafter=lookup", "target=tiny_qwen3", "benchmark=gsm8k", "eval.num_samples=2",
               "eval.max_new_tokens=40", "eval.warmup=0", "eval.progress=false", "logger=none", "device=cpu",
               "eval.max_drafts=null",                                      # its own K = 4 (auto: 3 on a CPU)
               f"hydra.run.dir={run}")
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    b = s["benchmarks"]["gsm8k"]
    assert s["drafter"] == "lookup" and b["lossless_mismatches"] == 0 and b["num_samples"] == 2
    assert s["num_draft_tokens"] == 4 and b["tau"] >= 1.0
