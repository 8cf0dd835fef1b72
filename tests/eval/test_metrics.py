"""Metric formulas on hand-made records (values computed by hand in the comments)."""
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
