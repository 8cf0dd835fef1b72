"""experiments/bench_engine.py and its helpers (experiments/engine_measure.py): what they count and cut, that they
leave torch and the engine as they found them, HF's built-in DFlash holding our drafter's weights, and one smoke run.
Nothing here asserts a speed."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import engine_measure as em  # noqa: E402

from specexp import registry  # noqa: E402
from specexp.decoding.engine import DecodeConfig, generate  # noqa: E402
from specexp.drafters import head_loop  # noqa: E402
from specexp.kernels import fusion  # noqa: E402


def test_sync_counter_counts_host_reads_and_restores_torch():
    before = {n: (n in vars(torch.Tensor), getattr(torch.Tensor, n)) for n in em.READS}
    made = (torch.equal, torch.tensor, torch.as_tensor)
    t = torch.arange(4)
    with em.SyncCounter() as s:
        t.sum().item()
        t.tolist()
        int(t[1])
        torch.tensor([1, 2], device="cpu")       # host data onto a device: a blocking copy on a GPU
        torch.tensor([1, 2])                     # no device named: not counted
        t + 1                                    # no read
    assert s.n == 4 and s.where == {"item": 1, "tolist": 1, "__int__": 1, "torch.tensor(host data, device=)": 1}
    assert {n: (n in vars(torch.Tensor), getattr(torch.Tensor, n)) for n in em.READS} == before
    assert (torch.equal, torch.tensor, torch.as_tensor) == made


@pytest.mark.parametrize("name", ["dflash", "eagle3"])
def test_syncs_per_round_counts_complete_rounds(name, static, count_ids, cfg_factory, one_thread):
    drafter = registry.build_drafter(cfg_factory(f"drafter={name}", "drafter.init=random").drafter, static)
    dc = DecodeConfig(max_new_tokens=12)
    rounds = len(generate(static, drafter, count_ids, dc).accept_lengths)
    counts = em.syncs_per_round(static, drafter, count_ids, dc)
    assert counts == [1] * (rounds - 1)          # the last verification has no proposal after it: left out
    assert "forward" not in vars(static)


@pytest.mark.parametrize("name", ["none", "dflash", "dels_rnn", "eagle3"])
def test_timed_rounds_cut_every_round_into_its_parts(name, static, count_ids, cfg_factory, one_thread):
    cfg = cfg_factory(f"drafter={name}", "drafter.init=random") if name != "none" else None
    drafter = registry.build_drafter(cfg.drafter, static) if cfg is not None else None
    dc = DecodeConfig(max_new_tokens=12)
    gen, parts = em.timed_rounds(static, drafter, count_ids, dc)
    n = len(gen.accept_lengths) - 1              # complete rounds: from one verification to the next
    assert n >= 2 and all(len(v) == n for v in parts.values())
    for i in range(n):
        assert parts["wall"][i] >= parts["verify"][i] > 0 and parts["rest"][i] >= 0
        assert parts["projection"][i] <= parts["propose"][i]
        # Every proposal projects onto a vocabulary (none at the budget's end, where k = 0: no proposal).
        assert (parts["projection"][i] > 0) == (parts["propose"][i] > 0)
    assert (parts["propose"][0] > 0) == (drafter is not None)
    for i in range(n):
        assert abs(parts["wall"][i] - parts["verify"][i] - parts["propose"][i] - parts["commit"][i]
                   - parts["rest"][i]) < 1e-9
    # Everything put back: the target's and the drafter's methods, the module hooks, the fusion function.
    assert "forward" not in vars(static) and head_loop.fuse_torch is fusion.fuse_torch
    if drafter is not None:
        assert "propose" not in vars(drafter) and "commit" not in vars(drafter)
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in em.projection_modules(drafter))
    assert generate(static, drafter, count_ids, dc).tokens == gen.tokens


def test_hf_dflash_assistant_computes_what_the_drafter_computes(tiny_target, cfg_factory, one_thread):
    """The same block hidden states from the same context taps, and HF's DFlash decoding losslessly with it."""
    drafter = registry.build_drafter(cfg_factory("drafter=dflash", "drafter.init=random").drafter, tiny_target)
    hf = em.hf_dflash_assistant(drafter)
    c, b = 11, drafter.block_size
    g = torch.Generator().manual_seed(0)
    taps = torch.randn(1, c, len(drafter.tap_layers) * tiny_target.hidden_size, generator=g)   # [1, C, n*H]
    block = torch.full((1, b), drafter.mask_token_id)
    block[0, 0] = 5                                                                            # [1, B]
    emb = drafter.embed(block)                                                                 # [1, B, H]
    with torch.inference_mode():
        ctx = drafter.model.context_kv(taps, torch.arange(c)[None])
        ours = drafter.model(emb, torch.arange(c, c + b)[None], ctx)                          # [1, B, H]
        theirs = hf(noise_embeds=emb, context_hidden_states=taps,
                    position_ids=torch.arange(c + b)[None]).last_hidden_state                 # [1, B, H]
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)

    ids = tiny_target.encode_chat([{"role": "user", "content": "Hello"}])
    kw = dict(do_sample=False, max_new_tokens=10, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        plain = tiny_target.model.generate(torch.tensor([ids]), **kw)
        spec = tiny_target.model.generate(torch.tensor([ids]), assistant_model=hf, speculation_type="dflash", **kw)
    assert spec.tolist() == plain.tolist()


def test_hf_dflash_assistant_refuses_other_drafters(static, cfg_factory):
    eagle = registry.build_drafter(cfg_factory("drafter=eagle3", "drafter.init=random").drafter, static)
    with pytest.raises(RuntimeError, match="z-lab-format DFlash"):
        em.hf_dflash_assistant(eagle)


def test_projection_study_agreement_outside_and_certified():
    g = torch.Generator().manual_seed(0)
    v, h = 64, 8
    w = torch.zeros(v, h)                                                                     # [V, H]
    w[:, 4:] = torch.randn(v, 4, generator=g) * 0.01             # short rows in dims 4-7
    w[:4] = torch.eye(4, h) * 10                                 # 4 long rows in dims 0-3
    w[40, 4], w[41, 5] = 0.05, 0.05                              # the best rows of hidden rows 4, 5: left out
    hidden = torch.eye(6, h)                                     # rows 0-3: one long row each (certified)
    counts = torch.zeros(v, dtype=torch.long)
    counts[:4] = 100                                             # the pruned head keeps rows 0-3 (and 4 more)
    counts[10:14] = 50
    out = {r["variant"]: r for r in em.projection_study(hidden, [hidden[:3]], w, counts, (8,), reps=1)}
    assert out["fp32 full head"]["agree"] == 1.0 and out["fp32 full head"]["rows"] == v
    assert out["fp32 full head"]["ms_per_call"] > 0
    top = out["fp32 top-8 head"]
    assert top["rows"] == 8
    best = (hidden @ w.T).argmax(-1)
    assert best[4:].tolist() == [40, 41] and top["outside"] == pytest.approx(2 / 6)
    assert top["agree"] == pytest.approx(4 / 6)                  # inside the head its argmax is the full one
    assert top["certified"] == pytest.approx(4 / 6)              # 10 >= 1 x the longest excluded row (0.05)
    assert em.projection_study(hidden, [], w, None, (8,), reps=1)[0]["ms_per_call"] is None


def test_response_token_counts_of_the_committed_answers():
    regen = ROOT / "data/regen/smollm2_135m-greedy256"
    manifest = json.loads((regen / "manifest.json").read_text())
    counts = em.response_token_counts(regen, SimpleNamespace(name="smollm2_135m", vocab_size=49152))
    assert counts.shape == (49152,) and counts.sum().item() == manifest["response_tokens"]
    with pytest.raises(RuntimeError, match="smollm2_135m's answers, not tiny_qwen3's"):
        em.response_token_counts(regen, SimpleNamespace(name="tiny_qwen3", vocab_size=151936))


def test_weight_and_kv_bytes():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight                                     # tied: read once
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "norm": torch.nn.LayerNorm(4)})
    assert em.weight_bytes(model) == (40 + 4 + 4) * 4
    cfg = SimpleNamespace(num_hidden_layers=3, num_key_value_heads=2, hidden_size=16, num_attention_heads=4)
    assert em.kv_bytes(cfg, 5, torch.bfloat16) == 2 * 3 * 2 * 4 * 5 * 2
    assert em.read_bandwidth(mib=8, reps=1) > 0


def test_bench_engine_runs_every_contender(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_engine.py"), "--target", "tiny_qwen3",
                          "--drafters", "dflash,eagle3", "--prompts", "1", "--tokens", "6", "--repeats", "1",
                          "--threads", "1", "--bw-mib", "8", "--max-drafts", "2", "--out", str(tmp_path),
                          "drafter.init=random"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads((tmp_path / "bench_engine.json").read_text())
    names = [row["contender"] for row in r["rows"]]
    assert names == ["HF generate greedy", "HF generate, static cache", "HF prompt lookup (3)", "HF built-in DFlash",
                     "specexp AR, engine=hf", "specexp AR, engine=static", "specexp dflash, engine=static",
                     "specexp dflash, engine=hf", "specexp eagle3, engine=static"]
    assert all(row.get("equals_hf_greedy") == "1/1" or "not_run" in row for row in r["rows"])
    assert set(r["round_parts"]) == set(names[4:])
    assert all(p["syncs_per_round_max"] in (None, 1) for p in r["round_parts"].values())
    assert r["max_drafts"] == 2 and {p["k"] for n, p in r["round_parts"].items() if "AR" not in n} == {2}
    assert r["memory_floor"]["floor_ms"] > 0
    heads = [v["variant"] for v in r["vocab_projection"]]
    assert heads == ["fp32 full head", "bf16 full head"]          # no pruned heads: the answers are SmolLM2's
    assert "holds smollm2_135m's answers, not tiny_qwen3's" in (tmp_path / "bench_engine.md").read_text()
