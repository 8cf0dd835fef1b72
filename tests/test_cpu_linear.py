"""`target.prepack` (targets/cpu_linear.py): a bf16 CPU target's linear layers with oneDNN-packed weights give the
unpacked model's logits bit for bit and its greedy tokens, on both engines, with a drafter that calls the target's
lm_head; an fp32 target's packed products (each kind forced, and the measured plan) give the unpacked logits to
the last bits, the same greedy tokens, and every drafter's greedy output equals packed AR's; the parameters,
gradients and run settings are unchanged; `auto` resolves per CPU; the switch refuses what it cannot do."""
import json
import os

import pytest
import torch

from helpers import STRONG, OracleDrafter
from specexp import registry
from specexp.errors import UserError
from specexp.targets import cpu_linear

needs_bf16 = pytest.mark.skipif(not cpu_linear.available(), reason="this CPU / torch cannot pack bf16 for oneDNN")


def _target(cfg_factory, prepack, *more):
    cfg = cfg_factory("target.dtype=bfloat16", f"target.prepack={prepack}", *more)
    target = registry.build_target(cfg.target, torch.device("cpu"))
    return cfg, target


@needs_bf16
@pytest.mark.parametrize("engine", ["hf", "static"])
def test_packed_logits_and_greedy_tokens_are_the_unpacked_ones(cfg_factory, engine):
    from specexp.decoding.engine import DecodeConfig, generate

    cfg, plain = _target(cfg_factory, "false", f"target.engine={engine}")
    _, packed = _target(cfg_factory, "auto", f"target.engine={engine}")
    linears = [m for m in packed.model.modules() if type(m) is torch.nn.Linear]
    assert linears and all("packed_weight" in vars(m) for m in linears)
    assert not any("packed_weight" in vars(m) for m in plain.model.modules())
    assert plain.model.state_dict().keys() == packed.model.state_dict().keys()
    ids = torch.randint(5, 1000, (1, 23), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for t in (plain, packed):                         # a prefill, then a 1-row step and a 5-row verify
            cache = t.new_cache(64)
            out = [t.forward(ids[:, :17], 0, cache, taps=(0, 2))]
            out.append(t.forward(ids[:, 17:18], 17, cache))
            out.append(t.forward(ids[:, 18:23], 18, cache))
            t.out = out
    for (lp, hp), (lq, hq) in zip(plain.out, packed.out):
        assert torch.equal(lp, lq) and (hp is None or torch.equal(hp, hq))
    dc = DecodeConfig(max_new_tokens=24, max_drafts=3)
    prompt = ids[0, :12].tolist()
    drafters = [registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, t.name), t)
                for t in (plain, packed)]
    assert generate(plain, None, prompt, dc).tokens == generate(packed, None, prompt, dc).tokens
    a, b = (generate(t, d, prompt, dc) for t, d in zip((plain, packed), drafters))
    assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths


@needs_bf16
def test_a_gradient_through_a_packed_layer_takes_the_modules_own_product():
    lin = torch.nn.Linear(16, 8).to(torch.bfloat16)
    ref = torch.nn.Linear(16, 8).to(torch.bfloat16)
    ref.load_state_dict(lin.state_dict())
    assert cpu_linear.pack(lin) == 1 and cpu_linear.pack(lin) == 0          # idempotent
    x = torch.randn(3, 16, dtype=torch.bfloat16, requires_grad=True)
    y = lin(x)
    y.float().sum().backward()
    g = x.grad.clone()
    x.grad = None
    ref(x).float().sum().backward()
    assert torch.equal(y, ref(x)) and torch.equal(g, x.grad) and lin.weight.grad is not None
    with torch.no_grad():
        assert torch.equal(lin(x), ref(x))                                 # the packed path, the same numbers
        for y in (torch.randn(16, 5, dtype=torch.bfloat16).t(),             # strided: F.linear's own path
                  torch.randn(2, 7, 16, dtype=torch.bfloat16)[:, ::2], torch.randn(4, 3, 16, dtype=torch.bfloat16)):
            assert torch.equal(lin(y), ref(y))


def test_auto_packs_fp32_only_where_it_pays_and_true_refuses_what_it_cannot_do(cfg_factory, tmp_path):
    _, t = _target(cfg_factory, "auto", "target.dtype=float32", f"target.cache_dir={tmp_path}")
    # the tiny model's weights stay in the CPU's caches: under the size floor, left plain and nothing measured
    assert not cpu_linear.is_packed(t.model) and not (tmp_path / "cpu_linear").exists()
    assert cpu_linear.wanted("auto", torch.device("cpu"), torch.float32) == cpu_linear.available(torch.float32)
    assert not cpu_linear.wanted("auto", torch.device("cpu"), torch.float16)
    assert not cpu_linear.wanted("auto", torch.device("cuda"), torch.bfloat16)
    assert not cpu_linear.wanted("auto", torch.device("cpu"), torch.bfloat16, compiled=True)
    assert not cpu_linear.wanted(False, torch.device("cpu"), torch.bfloat16)
    with pytest.raises(UserError, match=r"^target.prepack=true needs a bf16 or float32 target on a CPU \(this one: "
                                        r"torch.float16"):
        _target(cfg_factory, "true", "target.dtype=float16")
    with pytest.raises(UserError, match="target.prepack=true with target.compile=true"):
        cpu_linear.wanted(True, torch.device("cpu"), torch.bfloat16, compiled=True)


def test_prepack_is_not_a_setting_of_a_run(cfg_factory):
    """bf16: bit-identical outputs; fp32: last-bit differences, as between machines: a run made with it resumes
    without it, so run.json does not record it (run_info.json does)."""
    from specexp.targets.hf import target_settings

    a, b = (target_settings(cfg_factory(f"target.prepack={p}").target, torch.device("cpu")) for p in ("auto", "false"))
    assert a == b and "prepack" not in a


def test_a_bad_prepack_value_is_one_line(cfg_factory):
    from specexp.config import validate

    with pytest.raises(UserError, match=r"^target.prepack='maybe' is not valid; expected auto, true or false$"):
        validate(cfg_factory("target.prepack=maybe"))


@needs_bf16
@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_a_drafter_beside_a_packed_target_is_packed_too_and_drafts_the_same(cfg_factory, drafter):
    from specexp.decoding.engine import DecodeConfig, generate

    runs = []
    for prepack in ("false", "auto"):
        cfg, t = _target(cfg_factory, prepack, f"drafter={drafter}", "drafter.init=random")
        d = registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, t.name), t)
        assert cpu_linear.is_packed(d.model) == (prepack == "auto")
        runs.append(generate(t, d, list(range(5, 17)), DecodeConfig(max_new_tokens=20)))
    assert runs[0].tokens == runs[1].tokens and runs[0].accept_lengths == runs[1].accept_lengths


@needs_bf16
def test_a_trainable_or_rewritten_weight_is_never_served_from_the_packed_copy():
    lin = torch.nn.Linear(16, 8).to(torch.bfloat16)
    ref = torch.nn.Linear(16, 8).to(torch.bfloat16)
    ref.load_state_dict(lin.state_dict())
    cpu_linear.pack(lin)
    x = torch.randn(3, 16, dtype=torch.bfloat16)                          # no gradient to the input
    lin(x).float().sum().backward()                                        # ... but one to the weight
    assert lin.weight.grad is not None
    with torch.no_grad():
        lin.weight.mul_(2)                                                 # an optimizer step, in place
        ref.weight.mul_(2)
        assert torch.equal(lin(x), ref(x))                                 # not the stale packed copy


@needs_bf16
def test_the_compiled_step_refuses_a_packed_model(cfg_factory):
    from specexp.targets.static import StaticTarget

    _, t = _target(cfg_factory, "true")
    with pytest.raises(UserError, match="target.compile=true on a model whose linear layers are packed"):
        StaticTarget.of(t, compile=True)
    StaticTarget.of(t, compile=True, inductor=False)                       # the plain fixed-shape step is fine


@needs_bf16
def test_a_model_made_in_inference_mode_packs_and_runs():
    with torch.inference_mode():
        lin = torch.nn.Linear(16, 8).to(torch.bfloat16)
        ref = torch.nn.Linear(16, 8).to(torch.bfloat16)
        ref.load_state_dict(lin.state_dict())
    assert cpu_linear.pack(lin) == 1
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(lin(x), ref(x))


# ---------------------------------------------------------------------------------------------------------- fp32
needs_fp32 = pytest.mark.skipif(not (cpu_linear.available(torch.float32) and cpu_linear._has_mkl()),
                                reason="this torch cannot pack fp32 weights (oneDNN and MKL)")
PLANS = {"mkl": dict.fromkeys(cpu_linear.ROWS, "mkl"), "onednn": dict.fromkeys(cpu_linear.ROWS, "onednn"),
         "mixed": {1: "plain", 2: "onednn", 4: "mkl", 8: "mkl", 16: "plain"}}


def _fp32(cfg_factory, engine, plan=None, *more):
    cfg, t = _target(cfg_factory, "false", "target.dtype=float32", f"target.engine={engine}", *more)
    if plan is not None:
        assert cpu_linear.pack(t.model, plan=PLANS[plan]) > 0
    return cfg, t


@needs_fp32
@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("engine", ["hf", "static"])
def test_fp32_packed_logits_are_the_unpacked_to_the_last_bits_and_greedy_tokens_the_same(cfg_factory, engine, plan):
    from specexp.decoding.engine import DecodeConfig, generate

    _, plain = _fp32(cfg_factory, engine)
    _, packed = _fp32(cfg_factory, engine, plan)
    assert cpu_linear.describe(packed.model)["fp32_plan"] == PLANS[plan]
    assert plain.model.state_dict().keys() == packed.model.state_dict().keys()
    ids = torch.randint(5, 1000, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for t in (plain, packed):           # a prefill (F.linear), then blocks of 1, 3, 5, 8 and 16 rows (buckets)
            cache, start = t.new_cache(64), 7
            t.out = [t.forward(ids[:, :7], 0, cache, taps=(0, 1))]
            for n in (1, 3, 5, 8, 16):
                t.out.append(t.forward(ids[:, start:start + n], start, cache, taps=(0, 1)))
                start += n
    for (lp, hp), (lq, hq) in zip(plain.out, packed.out):
        assert torch.allclose(lp, lq, rtol=1e-5, atol=1e-5) and torch.allclose(hp, hq, rtol=1e-5, atol=1e-5)
        assert torch.equal(lp.argmax(-1), lq.argmax(-1))
    prompt, dc = ids[0, :12].tolist(), DecodeConfig(max_new_tokens=32)
    assert generate(plain, None, prompt, dc).tokens == generate(packed, None, prompt, dc).tokens


@needs_fp32
@pytest.mark.parametrize("engine", ["hf", "static"])
def test_a_packed_row_is_the_same_whatever_the_blocks_length(cfg_factory, engine):
    """Each bucket is one product at one row count: the zero rows padding a block never reach its real rows."""
    lin = torch.nn.Linear(64, 48)
    cpu_linear.pack(lin, plan=PLANS["mkl"])
    x = torch.randn(1, 8, 64)
    with torch.inference_mode():
        full = lin(x)
        for m in (5, 6, 7):                                    # bucket 8, padded with 3, 2, 1 zero rows
            assert torch.equal(lin(x[:, :m]), full[:, :m])
        assert torch.allclose(full, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)


@needs_fp32
@pytest.mark.parametrize("name", ["dflash", "dels_rnn", "dels_markov", "domino_ft", "dedit", "eagle3"])
def test_every_drafter_on_a_packed_fp32_target_outputs_packed_ar(cfg_factory, name):
    """Lossless on the packed path, with deep acceptance: an oracle that drafts packed AR's own continuation
    (corrupted at random, so every acceptance length and so every bucket occurs), and the real drafter, whose
    layers are packed beside the target's."""
    from specexp.decoding.engine import DecodeConfig, generate

    cfg, t = _fp32(cfg_factory, "static", "mixed", f"drafter={name}", "drafter.init=random", *STRONG.get(name, []))
    d = registry.build_drafter(registry.fill_default_checkpoints(cfg.drafter, t.name), t)
    assert cpu_linear.is_packed(t.model)
    prompt = list(range(5, 17))
    ar = generate(t, None, prompt, DecodeConfig(max_new_tokens=40)).tokens
    oracle = OracleDrafter(ar, len(prompt), 15, 0.15, t.vocab_size, seed=3)
    out = generate(t, oracle, prompt, DecodeConfig(max_new_tokens=40, max_drafts=15))
    assert out.tokens == ar and len(set(out.accept_lengths)) >= 3 and max(out.accept_lengths) >= 4
    assert generate(t, d, prompt, DecodeConfig(max_new_tokens=40)).tokens == ar


@needs_fp32
def test_fp32_grad_mode_strided_input_and_a_rewritten_weight_take_the_modules_own_product():
    lin, ref = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    ref.load_state_dict(lin.state_dict())
    assert cpu_linear.pack(lin, plan=PLANS["mkl"]) == 1 and cpu_linear.pack(lin, plan=PLANS["mkl"]) == 0
    x = torch.randn(3, 16, requires_grad=True)
    lin(x).sum().backward()
    assert lin.weight.grad is not None and x.grad is not None
    with torch.no_grad():
        y = torch.randn(16, 5).t()                                           # strided: F.linear
        assert torch.equal(lin(y), ref(y))
        big = torch.randn(2, 20, 16)                                         # past the last bucket: F.linear
        assert torch.equal(lin(big), ref(big))
        lin.weight.mul_(2)
        ref.weight.mul_(2)
        z = torch.randn(4, 16)
        assert torch.equal(lin(z), ref(z))                                   # not the stale packed copy


@needs_fp32
def test_the_fp32_plan_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_linear, "_load", lambda: 0.0)                  # an idle machine (the busy case: below)
    weights = [torch.randn(96, 64), torch.randn(64, 96)]
    plan = cpu_linear.fp32_plan(weights, tmp_path)
    assert set(plan) == set(cpu_linear.ROWS) and set(plan.values()) <= set(cpu_linear.KINDS)
    stored = json.loads(cpu_linear.plan_file(tmp_path).read_text())
    entry = next(iter(stored["models"].values()))
    assert stored["machine"]["threads"] == torch.get_num_threads() and entry["layers"] == 2
    for b, kind in plan.items():                      # a packed kind only where it measured GAIN faster
        ms = entry["ms"][str(b)]
        assert kind == "plain" or ms[kind] <= cpu_linear.GAIN * ms["plain"]
    monkeypatch.setattr(cpu_linear, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert cpu_linear.fp32_plan(weights, tmp_path) == plan                  # the cached plan
    here = cpu_linear.plan_file(tmp_path)
    other = "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2"     # (a run already limited)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", other)                         # another ISA limit: another file
    assert cpu_linear.plan_file(tmp_path) != here


@needs_fp32
def test_a_plan_measured_busy_is_used_and_measured_again_once_idle(tmp_path, monkeypatch):
    weights = [torch.randn(96, 64), torch.randn(64, 96)]
    busy = 2.0 * (os.cpu_count() or 1)
    monkeypatch.setattr(cpu_linear, "_load", lambda: busy)
    plan = cpu_linear.fp32_plan(weights, tmp_path)
    entry = next(iter(json.loads(cpu_linear.plan_file(tmp_path).read_text())["models"].values()))
    assert entry["busy"] is True and entry["load"] == busy
    real = cpu_linear.measure
    monkeypatch.setattr(cpu_linear, "measure", lambda *a, **k: pytest.fail("measured again while still busy"))
    assert cpu_linear.fp32_plan(weights, tmp_path) == plan                  # still busy: the stored plan serves
    calls = []
    monkeypatch.setattr(cpu_linear, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(cpu_linear, "_load", lambda: 0.0)
    cpu_linear.fp32_plan(weights, tmp_path)                                 # idle now: measured again, once
    cpu_linear.fp32_plan(weights, tmp_path)
    entry = next(iter(json.loads(cpu_linear.plan_file(tmp_path).read_text())["models"].values()))
    assert calls == [1] and entry["busy"] is False


@needs_fp32
def test_two_runs_measuring_different_models_at_once_keep_both_plans(tmp_path, monkeypatch):
    """Issue #59's probe: the run that writes second adds its entry to the file as it is then (under a lock), instead
    of the file as it read it before measuring (which dropped the other run's plan)."""
    monkeypatch.setattr(cpu_linear, "_load", lambda: 0.0)
    a, b = [torch.randn(96, 64), torch.randn(64, 96)], [torch.randn(48, 32), torch.randn(32, 48)]
    real = cpu_linear.measure

    def measure(weights, *args, **kw):
        if weights is a:                            # while this run measures, another finishes its model's plan
            cpu_linear.fp32_plan(b, tmp_path)
        return real(weights, *args, **kw)

    monkeypatch.setattr(cpu_linear, "measure", measure)
    cpu_linear.fp32_plan(a, tmp_path)
    models = json.loads(cpu_linear.plan_file(tmp_path).read_text())["models"]
    assert sorted(e["layers"] for e in models.values()) == [2, 2] and len(models) == 2


def _with_kinds(kind):
    def change(stored):
        for entry in stored["models"].values():
            entry["plan"] = dict.fromkeys(entry["plan"], kind)
        return stored
    return change


@needs_fp32
@pytest.mark.parametrize("damage, why", [
    (lambda stored: [], "a JSON list without a 'models' mapping"),
    (lambda stored: "{not json", "unreadable: JSONDecodeError"),
    (_with_kinds("bogus"), "product 'bogus' is not one this torch runs"),
    (lambda stored: {**stored, "models": dict.fromkeys(stored["models"], {"layers": 2, "plan": {"1": "mkl"}})},
     "for 2 layers of None bytes"),
    (lambda stored: {**stored, "models": {k: {**e, "layers": 5} for k, e in stored["models"].items()}},
     "for 5 layers"),
    (lambda stored: {**stored, "models": {k: {**e, "plan": {"1": "mkl"}} for k, e in stored["models"].items()}},
     "its plan is not one product per row bucket 1, 2, 4, 8, 16"),
], ids=["list", "not_json", "bogus_kind", "no_bytes", "other_layers", "one_bucket"])
def test_a_damaged_or_foreign_plan_is_measured_again_saying_so(tmp_path, monkeypatch, capsys, damage, why):
    """Issue #59 row 8: a plan file replaced by [] was a raw TypeError at load, its kinds replaced by 'bogus' a raw
    KeyError in the first forward; now the file is checked on read (schema, shapes, kinds), and a damaged one is
    measured again with one warning line, then packed and run as a fresh plan would be."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64))
    monkeypatch.setattr(cpu_linear, "MIN_FP32_BYTES", 0)
    measured = []
    monkeypatch.setattr(cpu_linear, "measure", lambda weights, kinds: measured.append(1) or {
        "plan": PLANS["mixed"], "ms": {}})
    weights = [m.weight.detach() for m in model]
    assert cpu_linear.fp32_plan(weights, tmp_path) == PLANS["mixed"] and len(measured) == 1
    path = cpu_linear.plan_file(tmp_path)
    bad = damage(json.loads(path.read_text()))
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    capsys.readouterr()
    assert cpu_linear.pack(model, cache_dir=tmp_path) == 2 and len(measured) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith(f"specexp: warning: target.prepack: the packing plan {path} is "
                                               "damaged or foreign (") and why in err[0], err
    assert err[0].endswith("); measuring it again")
    with torch.inference_mode():
        for rows in (1, 3, 8):
            x = torch.randn(rows, 64)
            assert torch.allclose(model(x), torch.nn.functional.linear(
                torch.nn.functional.linear(x, model[0].weight, model[0].bias), model[1].weight, model[1].bias),
                atol=1e-5)
    assert cpu_linear.fp32_plan(weights, tmp_path) == PLANS["mixed"] and len(measured) == 2     # mended on disk


def test_measuring_the_plan_stops_repeating_on_a_busy_machine(monkeypatch):
    """Issue #59 row 9: measuring took 536 s on a busy 2-core machine. A clock on which every product takes a second
    (a machine far busier than any): each bucket stops after its first timed round once its share of the budget is
    spent; idle (a real clock, tiny weights), every bucket runs its five rounds."""
    weights = [torch.randn(8, 4), torch.randn(4, 8)]
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(cpu_linear.time, "perf_counter", lambda: float(next(ticks)))
    busy = cpu_linear.measure(weights, ("plain",))
    assert busy["passes"] == dict.fromkeys(cpu_linear.ROWS, 1) and set(busy["plan"].values()) == {"plain"}
    monkeypatch.undo()
    assert cpu_linear.measure(weights, ("plain",))["passes"] == dict.fromkeys(cpu_linear.ROWS, 5)


@needs_fp32
def test_a_model_over_the_size_floor_is_packed_by_its_measured_plan(tmp_path, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64))
    monkeypatch.setattr(cpu_linear, "MIN_FP32_BYTES", 0)
    monkeypatch.setattr(cpu_linear, "measure", lambda weights, kinds: {"plan": PLANS["mixed"], "ms": {}})
    assert cpu_linear.pack(model, cache_dir=tmp_path) == 2
    assert cpu_linear.describe(model) == {"fp32": 2, "fp32_plan": PLANS["mixed"]}
    assert next(iter(json.loads(cpu_linear.plan_file(tmp_path).read_text())["models"].values()))["layers"] == 2


@pytest.mark.parametrize("flags, dtype, cap", [({"avx2"}, torch.float32, "fp32"),
                                               ({"avx2", "avx512f"}, torch.float32, "fp32"),
                                               ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16, "bf16"),
                                               ({"avx2", "amx_bf16", "amx_tile"}, torch.bfloat16, "bf16")])
def test_auto_resolves_dtype_packing_cap_and_engine_per_cpu(monkeypatch, flags, dtype, cap):
    from specexp import machine
    from specexp.decoding import settings
    from specexp.targets import hf as targets

    info = {"model": "mocked", "flags": {f: f in flags for f in machine.FLAGS}, "cores": 2}
    monkeypatch.setattr(machine, "cpu_info", lambda: info)
    monkeypatch.delenv("SPECEXP_CPU_BF16", raising=False)                # the suite pins fp32; here the flags decide
    cpu = torch.device("cpu")
    assert targets.resolve_dtype("auto", cpu) == dtype
    assert cpu_linear.wanted("auto", cpu, dtype) == cpu_linear.available(dtype)
    want = settings.CPU_BF16_MAX_DRAFTS if cap == "bf16" else settings.CPU_FP32_MAX_DRAFTS
    assert settings.max_drafts("auto", cpu, dtype) == want
    assert targets.resolve_engine("auto", cpu) == "static"


@pytest.mark.parametrize("plan", [None, "mkl", "onednn", "mixed"])
def test_joined_qkv_and_gate_up_products_are_the_separate_ones_bit_for_bit(cfg_factory, plan):
    """The static engine's joined q/k/v and gate/up products (cpu_linear.Joined) on a packed target: logits and taps
    of a prefill and of blocks of every bucket, and of a batched step, equal the separate products' bit for bit
    (bf16: oneDNN; fp32: each forced plan), and a weight rewritten after packing is served by the parts."""
    if plan is None and not cpu_linear.available():
        pytest.skip("this CPU / torch cannot pack bf16 for oneDNN")
    if plan is not None and not (cpu_linear.available(torch.float32) and cpu_linear._has_mkl()):
        pytest.skip("this torch cannot pack fp32 weights (oneDNN and MKL)")
    if plan is None:
        _, t = _target(cfg_factory, "auto", "target.engine=static")
    else:
        _, t = _fp32(cfg_factory, "static", plan)
    joins = t.joins()
    assert all(q is not None and g is not None for q, g in joins)
    ids = torch.randint(5, 1000, (2, 40), generator=torch.Generator().manual_seed(2))

    def run():
        with torch.inference_mode():
            cache, start = t.new_cache(64), 7
            out = [t.forward(ids[:1, :7], 0, cache, taps=(0, 1))]
            for n in (1, 3, 5, 8, 16):
                out.append(t.forward(ids[:1, start:start + n], start, cache, taps=(0, 1)))
                start += n
            rows = t.new_rows_cache(2, 64)
            rows.lengths = [0, 0]
            out.append(t.forward_rows(ids[:, :9], rows, taps=(1,)))
            rows.lengths = [9, 9]
            out.append(t.forward_rows(ids[:, 9:10], rows, taps=(1,)))
        return out

    joined = run()
    t._joins = (t._joins[0], [(None, None)] * len(joins))              # the separate products, same packed layers
    for (a, ha), (b, hb) in zip(joined, run()):
        assert torch.equal(a, b) and torch.equal(ha, hb)
    q = t.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        q.weight.mul_(2.0)                           # written after packing: the joined copy is stale, parts serve
    x = torch.randn(1, 1, q.in_features, dtype=q.weight.dtype)
    with torch.inference_mode():
        assert torch.equal(joins[0][0](x)[..., :q.out_features], q(x))
