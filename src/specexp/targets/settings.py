"""The `target` group's keys, typed: `TargetSettings`, the view config.py validates the group as and the loaders,
the static engine and the packing read (`registry.build_target` builds it once). No torch here: the command
line checks a config before anything heavy is imported."""
from __future__ import annotations

from typing import Any

from ..schema import (
    DTYPES,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_TOKENS,
    MAX_WIDTH,
    Settings,
    choice,
    frozen,
    int_list,
    ints,
    is_int,
    null_or,
    setting,
)

TINY_VOCAB = 151936          # loader=tiny_qwen3's embedding rows: the Qwen3 tokenizer's (targets/hf.py)


@frozen
class TargetSettings(Settings):
    """`target`: the model being accelerated (config.py validates the group as this view; the loaders, the static
    engine and the packing read it). The architecture keys (hidden_size ...) belong to loader=tiny_qwen3."""
    KEY = "target"
    name: str = "smollm2_135m"
    loader: str = "smollm2"
    hub_id: str | None = None
    path: str | None = None
    revision: str | None = None
    source: str = choice("auto", "hub", "gguf")
    dtype: str = choice("auto", *DTYPES)
    engine: str = choice("auto", "hf", "static")
    compile: bool = choice(False, True, words="true or false")
    prepack: Any = choice("auto", True, False)
    attn_implementation: str = "auto"
    mask_token_id: int | None = setting(None, null_or(is_int(0)), "an int >= 0 or null")
    chat_kwargs: dict = setting(factory=dict)          # the chat template's own keyword arguments: free-form
    stop_token_ids: list | None = setting(None, null_or(int_list()), "a non-empty list of ints >= 0, or null")
    cache_dir: str | None = None
    hidden_size: int = setting(64, *ints(1, MAX_WIDTH))
    intermediate_size: int = setting(128, *ints(1, MAX_WIDTH))
    num_layers: int = setting(4, *ints(1, MAX_LAYERS))
    num_heads: int = setting(4, *ints(1, MAX_HEADS))
    num_kv_heads: int = setting(2, *ints(1, MAX_HEADS))
    max_context: int = setting(4096, *ints(2, MAX_TOKENS))
    init_std: float = 0.1
    seed: int = 0


def resolve_dtype_name(dtype: str, device) -> str:
    """`target.dtype` as the name of a concrete dtype on `device` (a torch.device or 'cpu' / 'cuda'); `auto` = bf16
    on CUDA and on a CPU with native bf16 (machine.py: AVX512-BF16 or AMX), fp32 on any other CPU (bf16 there is
    emulated through fp32: slower, and less exact). The one place that says what `auto` means: config.resolve_auto
    calls it once at a run's edge, and the loaders (targets/hf.resolve_dtype) for a caller that passes `auto`."""
    if dtype != "auto":
        return dtype
    from ..machine import device_type, native_bf16  # torch: only once a run resolves its device

    return "bfloat16" if device_type(device) == "cuda" or native_bf16() else "float32"
