"""task=serve_check (src/specexp/eval/serve_check.py) without vLLM: the round lengths rebuilt from vLLM's counters,
the refusals before any work, and the comparison of a drafter's rows. The lane itself, with vLLM running, is
tests/eval/test_serve_lane.py."""
import random

import pytest
from test_bad_input import SMALL, files_under, run_cli

from specexp.eval import metrics
from specexp.eval.serve_check import compare_drafter, rounds_from_counts


def counters(rounds: list[int], k: int) -> list[int]:
    """What vLLM counts per position for these rounds (committed tokens each): rounds whose j-th draft was accepted."""
    return [sum(r - 1 >= j for r in rounds) for j in range(1, k + 1)]


def test_round_lengths_are_rebuilt_exactly_from_vllms_counters():
    rng = random.Random(0)
    for _ in range(200):
        k = rng.randint(1, 15)
        rounds = [rng.randint(1, k + 1) for _ in range(rng.randint(0, 40))]
        got = rounds_from_counts(len(rounds), counters(rounds, k))
        assert got == sorted(rounds, reverse=True)
        rec = [{"id": "p", "accept_lengths": got, "drafted": [k] * len(got)}]
        want = [{"id": "p", "accept_lengths": rounds, "drafted": [k] * len(rounds)}]
        assert metrics.tau(rec) == pytest.approx(metrics.tau(want)) if rounds else metrics.tau(rec) is None
        assert metrics.accept_rate_per_position(rec, k) == metrics.accept_rate_per_position(want, k)


def test_counters_that_are_not_prefix_closed_are_refused():
    from specexp.errors import UserError

    with pytest.raises(UserError, match="not prefix-closed"):
        rounds_from_counts(3, [2, 3, 0])                  # more rounds accepted draft 2 than draft 1: impossible


def _run(prompts_tau: list[tuple[list[int], list[int]]], k: int, ours_tau: list[list[int]], same=True):
    """A drafter's vLLM run dict and specexp records for prompts given as (vLLM rounds, vLLM output); an output one
    token longer than its rounds commit (the prefill's token) unless said otherwise."""
    class S:
        def __init__(self, i):
            self.id, self.benchmark = f"p{i}", "gsm8k"
    prompts = [(S(i), [1, 2, 3]) for i in range(len(prompts_tau))]
    run = {"prompts": [{"output_ids": out, "num_drafts": len(r), "accepted_per_pos": counters(r, k)}
                       for r, out in prompts_tau]}
    ours = [{"id": f"p{i}", "benchmark": "gsm8k", "accept_lengths": r, "drafted": [k] * len(r)}
            for i, r in enumerate(ours_tau)]
    vllm_ar = [out if same else out[:-1] + [0] for _, out in prompts_tau]
    return compare_drafter("dflash", run, ours, prompts, vllm_ar, vllm_ar, k)


def test_a_drafter_agrees_only_with_identical_output_and_a_ci_around_zero():
    rng = random.Random(1)
    rounds = [[rng.randint(1, 4) for _ in range(20)] for _ in range(12)]
    outs = [[rng.randint(0, 99) for _ in range(sum(r) + 1)] for r in rounds]
    row = _run(list(zip(rounds, outs)), 7, rounds)
    assert row["agrees"] and row["delta"] == pytest.approx(0) and row["identical_to_vllm_ar"] == 12
    assert row["vllm_accept_rate_per_position"] == row["specexp_accept_rate_per_position"]
    # vLLM accepting one token less a round than specexp on every prompt (norm_output's kind of drift): disagrees
    worse = [[max(1, x - 1) for x in r] for r in rounds]
    row = _run([(w, o[:sum(w) + 1]) for w, o in zip(worse, outs)], 7, rounds)
    assert not row["agrees"] and row["delta"] < 0 and row["delta_ci95"][1] < 0
    # the same acceptance but an output that is not vLLM's own AR output: disagrees
    assert not _run(list(zip(rounds, outs)), 7, rounds, same=False)["agrees"]


def test_drafts_vllm_accepted_past_the_token_budget_do_not_count():
    """vLLM counts every draft of its last round, also those past max_tokens it then dropped; specexp's τ counts
    committed tokens. The rebuilt rounds sum to the output's tokens after the prefill's one."""
    rounds, k = [3, 1, 5, 2], 7                       # committed 11 tokens, but the last round had 6 accepted
    counted = rounds[:-1] + [7]
    row = _run([(counted, list(range(12)))], k, [rounds])
    assert row["per_prompt"][0]["vllm_tau"] == pytest.approx(11 / 4) == row["per_prompt"][0]["specexp_tau"]
    assert row["agrees"] and row["delta"] == pytest.approx(0)
    from specexp.errors import UserError

    with pytest.raises(UserError, match="count 16 tokens for 3 generated"):  # more than one round's K past: refused
        _run([(counted, [1, 2, 3])], k, [rounds])


def test_a_drafter_vllm_could_not_load_is_reported_not_compared():
    row = compare_drafter("eagle3", {"error": "KeyError: draft_id_to_target_id", "log": ["x"]}, [], [], [], [], 7)
    assert row == {"drafter": "eagle3", "loaded": False, "error": "KeyError: draft_id_to_target_id", "log": ["x"],
                   "agrees": False}


@pytest.mark.parametrize("extra, message", [
    (["serve_check.python=/nowhere/python"], r"^serve_check.python='/nowhere/python' is not an executable; run "
                                             r"`bash scripts/install.sh serve`"),
    (["serve_check.drafters=[dels_rnn]"], r"^serve_check.drafters=\['dels_rnn'\] is not valid; expected a non-empty "
                                          r"list of distinct drafters vLLM serves: dflash, eagle3"),
    (["serve_check.num_drafts=0"], r"^serve_check.num_drafts=0 is not valid; expected an int >= 1"),
])
def test_serve_check_refuses_bad_input_before_any_work(extra, message, tmp_path, monkeypatch, capsys):
    import re

    monkeypatch.chdir(tmp_path)
    code, lines, _ = run_cli(["task=serve_check", *SMALL, *extra], tmp_path / "run", monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and re.search(message, lines[0].removeprefix("specexp: error: ")), lines
    assert files_under(tmp_path) == {}                 # nothing but Hydra's job log
