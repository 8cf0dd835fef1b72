"""Online lossless check: a greedy output that leaves AR's where the target's two tokens are within `eval.near_tie`
of the best logit is a near-tie (bf16 rounding of a verify block vs an AR step), anything else a failure. The
tiny target in fp32; the drafter's output is made up, so the check has something to classify."""
from types import SimpleNamespace

import torch

from specexp.decoding.engine import DecodeConfig, Generation, generate
from specexp.eval import evaluator
from specexp.eval import metrics as M


def _ar(t, ids, n=12):
    return generate(t, None, ids, DecodeConfig(max_new_tokens=n)).tokens


def _ranked(t, ids, prefix, rank):
    """The token of the given rank (0 = argmax) after prompt + prefix."""
    logits, _ = t.forward(torch.tensor([ids + prefix]), 0, t.new_cache(), last_only=True)
    return int(logits[0, -1].float().argsort(descending=True)[rank]), logits[0, -1]


def test_mismatch_position_gap_and_near_tie(tiny_target):
    t = tiny_target
    ids = t.encode_chat([{"role": "user", "content": "Name three colours."}])
    ar = _ar(t, ids)
    second, logits = _ranked(t, ids, ar[:5], 1)
    spec = ar[:5] + [second] + ar[6:]
    gap = float(M.top2_gap(logits))
    out = evaluator.mismatch(t, ids, spec, ar, near_tie=gap * 1.01)
    assert out["mismatch_at"] == 5 and abs(out["mismatch_gap"] - gap) < 1e-5 and out["lossless_near_tie"]
    assert not evaluator.mismatch(t, ids, spec, ar, near_tie=gap * 0.99)["lossless_near_tie"]
    far, _ = _ranked(t, ids, ar[:5], 1000)
    out = evaluator.mismatch(t, ids, ar[:5] + [far], ar, near_tie=gap * 1.01)
    assert out["mismatch_gap"] > gap and not out["lossless_near_tie"]
    assert evaluator.mismatch(t, ids, ar[:7], ar, 1e9) == {"mismatch_at": 7, "mismatch_gap": None,
                                                             "lossless_near_tie": False}


def test_run_sample_records_and_summary_count_near_ties_apart(tiny_target, monkeypatch):
    """The spec run (the drafter's) swaps one token for the runner-up; the AR run is the real one."""
    t = tiny_target
    sample = SimpleNamespace(id="s", benchmark="b", turns=["Name three colours."])
    ids = t.encode_chat([{"role": "user", "content": sample.turns[0]}])
    ar = _ar(t, ids)
    second, logits = _ranked(t, ids, ar[:3], 1)
    calls = []

    def fake_generate(target, drafter, prompt, dc, g=None):
        calls.append(drafter)
        out = generate(target, None, prompt, dc, g)
        if drafter is not None:
            return Generation(len(prompt), out.tokens[:3] + [second] + out.tokens[4:], [1] * 11, [1] * 11)
        return out

    monkeypatch.setattr(evaluator, "generate", fake_generate)
    drafter = SimpleNamespace(max_drafts=1, name="fake")
    gap = float(M.top2_gap(logits))
    for near_tie, ties in ((gap * 1.01, 1), (gap * 0.99, 0)):
        ev = SimpleNamespace(run_ar=True, check_lossless="auto", save_text=False, near_tie=near_tie)
        (rec,) = evaluator.run_sample(t, drafter, sample, DecodeConfig(max_new_tokens=12), ev, 0)
        assert rec["lossless"] is False and rec["mismatch_at"] == 3 and rec["lossless_near_tie"] == bool(ties)
        assert M.lossless_counts([rec]) == {"lossless_mismatches": 1 - ties, "lossless_near_ties": ties}
