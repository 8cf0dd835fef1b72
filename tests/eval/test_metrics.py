"""Metric formulas on hand-made records (values computed by hand in the comments)."""
import pytest
import torch

from specexp.eval import metrics as M


def rec(acc, drafted, tpot=0.01, ar=0.02, id="a"):
    return {"id": id, "accept_lengths": acc, "drafted": drafted, "tpot": tpot, "ar_tpot": ar, "ttft": 0.1,
            "new_tokens": 1 + sum(acc), "lossless": True}


def test_tau_is_a_macro_average_over_turns_with_the_bonus():
    r = [rec([1, 3, 4], [3, 3, 3]), rec([2], [3], id="b"), rec([], [], id="c")]
    assert M.turn_tau([1, 3, 4]) == 8 / 3
    assert M.tau(r) == (8 / 3 + 2) / 2            # the turn with no verification is skipped


def test_per_position_acceptance_and_histogram():
    r = [rec([1, 3, 4], [3, 3, 3]), rec([2, 1], [3, 1], id="b")]
    # steps (committed, drafted): (1,3) (3,3) (4,3) (2,3) (1,1); accepted drafts 0, 2, 3, 1, 0
    assert M.accept_rate_per_position(r, 3) == [3 / 5, 2 / 4, 1 / 4]
    # conditional: position 1 reached by all 5; position 2 reached by steps with >=1 accepted (3); position 3 by 2
    assert M.conditional_accept_rate(r, 3) == [3 / 5, 2 / 3, 1 / 2]
    assert M.tau_histogram(r, 3) == [2, 1, 1, 1]


def test_speedup_is_a_ratio_of_means():
    r = [rec([2], [3], tpot=0.01, ar=0.03), rec([2], [3], tpot=0.03, ar=0.03, id="b")]
    assert M.speedup(r) == 0.03 / 0.02
    assert M.speedup([rec([2], [3], ar=None)]) is None
    s = M.summarize_benchmark(r, 3)
    assert s["num_samples"] == 2 and s["lossless_mismatches"] == 0 and abs(s["tpot_ms"] - 20.0) < 1e-9
    assert M.macro({"x": s, "y": {**s, "tau": 4.0, "speedup": None}}) == {"tau": (2 + 4) / 2, "speedup": 1.5}


def test_speedup_ci_brackets_the_speedup_at_millisecond_tpots():
    # TPOTs of a few ms sum to well under a second: the CI is a ratio of seconds, not of turn counts
    r = [rec([2], [3], tpot=0.07 + 0.002 * i, ar=0.06 + 0.001 * i, id=str(i)) for i in range(10)]
    lo, hi = M.speedup_ci95(r)
    assert lo < M.speedup(r) < hi and hi - lo < 0.05
    fast = [{**x, "tpot": x["tpot"] / 1000, "ar_tpot": x["ar_tpot"] / 1000} for x in r]    # units cancel
    assert M.speedup_ci95(fast) == pytest.approx([lo, hi])


def test_near_tie_gaps_and_lossless_counts():
    import torch

    logits = torch.tensor([[1.0, 5.0, 4.75, -2.0], [0.0, 0.0, 1.0, 3.0]])
    assert M.top2_gap(logits).tolist() == [0.25, 2.0]
    assert M.tie_gap(logits[0], (1, 2)) == 0.25           # the two best: the top-2 gap
    assert M.tie_gap(logits[0], (1, 3)) == 7.0            # a token far below the best is no near-tie
    r = [{"lossless": True}, {"lossless": False, "lossless_near_tie": True}, {"lossless": False},
         {"lossless": False, "lossless_near_tie": False}, {"lossless": None}]
    assert M.lossless_counts(r) == {"lossless_mismatches": 2, "lossless_near_ties": 1}
    assert M.lossless_counts([{"lossless": None}]) == {"lossless_mismatches": None, "lossless_near_ties": None}


def _prompts(taus_by_prompt, bench="b"):
    """Records from per-prompt lists of per-turn τ values (each turn a single verification committing τ tokens)."""
    return [{"id": f"p{i}", "benchmark": bench, "turn": t, "accept_lengths": [a], "drafted": [7]}
            for i, turns in enumerate(taus_by_prompt) for t, a in enumerate(turns)]


def test_bootstrap_ci_brackets_tau_is_reproducible_and_narrows_with_prompts():
    import random

    rng = random.Random(0)
    few = _prompts([[rng.choice([1, 2, 3])] for _ in range(10)])
    many = _prompts([[rng.choice([1, 2, 3])] for _ in range(400)])
    ci_few = M.tau_ci95({"b": few})[0]["b"]
    ci_many = M.tau_ci95({"b": many})[0]["b"]
    assert ci_few[0] <= M.tau(few) <= ci_few[1] and ci_many[0] <= M.tau(many) <= ci_many[1]
    assert ci_many[1] - ci_many[0] < (ci_few[1] - ci_few[0]) / 2
    assert M.tau_ci95({"b": few}) == M.tau_ci95({"b": few})                  # fixed seed
    assert M.tau_ci95({"b": _prompts([[2], [2], [2]])})[0]["b"] == [2.0, 2.0]   # no spread, no width


def test_bootstrap_resamples_prompts_with_all_their_turns():
    """Two turns of one prompt move together: a prompt with turns (1, 3) contributes both or neither, so every
    replicate of [[1, 3]] * n has τ exactly 2."""
    recs = _prompts([[1, 3]] * 20)
    assert M.tau_ci95({"b": recs})[0]["b"] == [2.0, 2.0]


def test_macro_ci_and_missing_tau():
    a, b = _prompts([[1], [2], [3]] * 5, "a"), _prompts([[4]] * 15, "b")
    per, macro = M.tau_ci95({"a": a, "b": b})
    assert per["b"] == [4.0, 4.0]
    assert macro[0] == pytest.approx((per["a"][0] + 4) / 2, abs=0.1) and macro[0] <= 3.0 <= macro[1]
    assert M.tau_ci95({"x": [{"id": "p", "benchmark": "x", "accept_lengths": [], "drafted": []}]}) == ({}, None)


def test_paired_comparison_delta_ci_and_win_shares():
    base = [[1], [2], [3], [2], [1], [3], [2], [2]] * 4
    a = {"b": _prompts([[t[0] + 1] for t in base[:16]] + base[16:])}        # A better on half the prompts
    b = {"b": _prompts(base)}
    per, macro = M.paired_comparison(a, b)
    c = per["b"]
    assert c["num_prompts"] == 32 and c["delta"] == pytest.approx(0.5)
    assert 0 < c["delta_ci95"][0] < 0.5 < c["delta_ci95"][1]                # paired: the shared noise cancels
    assert (c["a_wins"], c["ties"], c["b_wins"]) == (0.5, 0.5, 0.0)
    assert macro["delta"] == pytest.approx(0.5)
    same, _ = M.paired_comparison(b, b)
    assert same["b"]["delta"] == 0 and same["b"]["delta_ci95"] == [0.0, 0.0] and same["b"]["ties"] == 1.0


def test_paired_speedup_cancels_the_shared_prompt_noise_and_skips_replays():
    # per-prompt AR TPOTs vary 3x between prompts; B's drafter takes 0.8x A's TPOT on every prompt
    ar = [0.02 + 0.01 * (i % 3) for i in range(30)]
    a = {"g": [rec([2], [3], tpot=0.9 * t, ar=t, id=str(i)) for i, t in enumerate(ar)]}
    b = {"g": [rec([2], [3], tpot=0.72 * t, ar=t, id=str(i)) for i, t in enumerate(ar)]}
    per, macro = M.paired_speedup(a, b)
    c = per["g"]
    assert c["num_prompts"] == 30 and c["speedup_a"] == pytest.approx(1 / 0.9) and c["speedup_b"] == pytest.approx(
        1 / 0.72)
    assert c["delta"] == pytest.approx(1 / 0.9 - 1 / 0.72) and c["delta_ci95"] == pytest.approx([c["delta"]] * 2)
    assert macro["delta"] == pytest.approx(c["delta"])
    replay = {"g": [{**r, "tpot": None, "ar_tpot": None} for r in a["g"]]}
    assert M.paired_speedup(a, replay) is None and M.paired_speedup(replay, replay) is None


def test_the_near_tie_tolerance_is_the_floor_or_two_ulps_of_the_dtype():
    top20 = torch.tensor([20.0, 19.9, -3.0])
    assert M.tie_tolerance(top20, torch.float32, 0.01) == 0.01               # fp32 steps at 20: 2e-6
    assert M.tie_tolerance(top20, torch.bfloat16, 0.01) == 0.25              # bf16 steps at 16..32: 0.125
    assert M.tie_tolerance(top20, torch.bfloat16, 0.5) == 0.5
    assert M.tie_tolerance(torch.tensor([0.7, -0.2]), torch.bfloat16, 0.01) == 0.01   # 2 ulps at 0.7: 0.0039
    assert M.tie_tolerance(torch.tensor([-40.0, 1.0]), torch.float16, 0.0) == 2 * 2.0 ** -10 * 32
    # a gap of exactly two bf16 steps is still a near-tie; one step more is not
    assert M.is_near_tie(0.25, M.tie_tolerance(top20, torch.bfloat16, 0.01))
    assert not M.is_near_tie(0.375, M.tie_tolerance(top20, torch.bfloat16, 0.01))
