"""`target.prepack` (kernels/cpu_linear.py): a bf16 CPU target's linear layers with oneDNN-packed weights give the
unpacked model's logits bit for bit and its greedy tokens, on both engines, with a drafter that calls the target's
lm_head; the parameters, gradients and run settings are unchanged; the switch refuses what it cannot do."""
import pytest
import torch

from specexp import registry
from specexp.errors import UserError
from specexp.kernels import cpu_linear

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


def test_auto_leaves_fp32_alone_and_true_refuses_what_it_cannot_do(cfg_factory):
    _, t = _target(cfg_factory, "auto", "target.dtype=float32")
    assert not any("packed_weight" in vars(m) for m in t.model.modules())
    assert not cpu_linear.wanted("auto", torch.device("cpu"), torch.float32)
    assert not cpu_linear.wanted("auto", torch.device("cuda"), torch.bfloat16)
    assert not cpu_linear.wanted("auto", torch.device("cpu"), torch.bfloat16, compiled=True)
    assert not cpu_linear.wanted(False, torch.device("cpu"), torch.bfloat16)
    with pytest.raises(UserError, match=r"^target.prepack=true needs a bf16 target on a CPU \(this one: torch.float32"):
        _target(cfg_factory, "true", "target.dtype=float32")
    with pytest.raises(UserError, match="target.prepack=true with target.compile=true"):
        cpu_linear.wanted(True, torch.device("cpu"), torch.bfloat16, compiled=True)


def test_prepack_is_not_a_setting_of_a_run(cfg_factory):
    """Bit-identical outputs: a run made with it resumes without it, so run.json does not record it."""
    from specexp.targets import target_settings

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
    from specexp.static_target import StaticTarget

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
