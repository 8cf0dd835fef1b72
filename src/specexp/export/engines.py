"""`task=export`: a trained drafter as a directory a serving engine loads (docs/export.md holds the facts).

  export.format  vllm | sglang  the engine whose serving command the card gives first
                 zlab           the z-lab DFlash layout (DFlash only), what the reference runtime reads
                 hf             the same files for a hub repository (the card with hub metadata)

What is written (one layout per drafter, every format; only the card's commands differ):
  dflash   config.json (Qwen3 fields, `block_size`, `num_target_layers`, `dflash_config.{mask_token_id,
           target_layer_ids}`, architectures ["DFlashDraftModel"]) + model.safetensors (`layers.i.*`, `fc`,
           `hidden_norm`, `norm`; no embedding, no lm_head): the z-lab layout that vLLM and SGLang both load.
  domino_ft  (SGLang, and `hf`) the DFlash layout with the Domino head in one directory, as SGLang's Domino path
           reads it: config.json's `dflash_config` adds `projector_type: "domino"`, `emb_dim`, `gru_hidden_dim`,
           `pure_draft_prefix_len: 1`, `shift_label`; model.safetensors adds `prefix_gru.weight_ih_l0`,
           `prefix_gru.weight_hh_l0`, `embed_proj.0.weight`, `embed_proj.2.weight`; bf16 (SGLang's requirement).
           A head SGLang would decode differently (guidance != 1: its rollout adds the correction unscaled; another
           vocabulary than the backbone's) is refused unless `export.force=true`, and the card then says so.
  eagle3   config.json (Llama fields, architectures ["LlamaForCausalLMEagle3"], `draft_vocab_size`,
           `target_hidden_size`, the taps twice: `eagle_config.eagle_aux_hidden_state_layer_ids` for SGLang and
           SpecForge, top-level `eagle_aux_hidden_state_layer_ids` in vLLM's indexing) + model.safetensors
           (`midlayer.*`, `fc`, `norm`, `lm_head`; `d2t` int64 and `t2d` bool for a reduced draft vocabulary): the
           layout vLLM, SGLang and SpecForge load. No `norm_output` (the engines' meaning is not specexp's).
  every    config.json is checked against export/contract.py (what each key means to each engine) first.
  both     README.md (the model card: target, data, τ, the serving command) and export.json (the same, as data).
Weights are written by the drafter's own `save_pretrained` (one saver), in the checkpoint's dtypes unless
`export.dtype` casts them: an export of a bf16 checkpoint is bit-identical to it.

DeLS-Spec and DEdit have no serving route in these engines: refused in one line naming what would be needed.
Every check runs before anything is written; a new directory appears whole (written beside it, then renamed),
and an existing one is touched only with `export.overwrite=true` (the new files written whole beside it, then each
renamed over its old one: a write that fails leaves the earlier export as it was).
`export.push=true` uploads the directory with huggingface_hub's HfApi when the hub is reachable and a token is
configured; the token is never read into a file or a message.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from .. import log
from ..config import Config, ExportConfig, checked
from ..errors import UserError, check
from ..targets.settings import TINY_VOCAB, TargetSettings

EXPORTABLE = ("dflash", "eagle3", "domino_ft")
# Why a drafter cannot be served today, and what would be needed (one line each).
NO_ROUTE = {
    "dels_rnn": "DeLS-Spec fuses a GRU local head and a unigram prior into DFlash's logits per position, which no "
                "vLLM or SGLang drafter does; it needs an engine-side fused-logits DFlash proposer",
    "dels_markov": "DeLS-Spec fuses a bigram local head and a unigram prior into DFlash's logits per position, "
                   "which no vLLM or SGLang drafter does; it needs an engine-side fused-logits DFlash proposer",
    "dedit": "DEdit's token-to-token edit passes run in no vLLM or SGLang drafter; it needs an engine-side edit "
             "step (its backbone alone is a DFlash drafter: drafter=dflash drafter.checkpoint=DIR exports it, "
             "without the edits)",
}
WEIGHTS, CONFIG, CARD, RECORD = "model.safetensors", "config.json", "README.md", "export.json"

# What the engines' public loaders read from config.json (docs/export.md names the files): field -> JSON type.
ENGINE_FIELDS = {
    "dflash": {"architectures": list, "model_type": str, "hidden_size": int, "intermediate_size": int,
               "num_hidden_layers": int, "num_attention_heads": int, "num_key_value_heads": int, "head_dim": int,
               "vocab_size": int, "rms_norm_eps": float, "rope_theta": float, "max_position_embeddings": int,
               "attention_bias": bool, "hidden_act": str, "layer_types": list, "block_size": int,
               "num_target_layers": int, "dflash_config": dict},
    "eagle3": {"architectures": list, "model_type": str, "hidden_size": int, "intermediate_size": int,
               "num_hidden_layers": int, "num_attention_heads": int, "num_key_value_heads": int, "head_dim": int,
               "vocab_size": int, "draft_vocab_size": int, "target_hidden_size": int, "rms_norm_eps": float,
               "rope_theta": float, "max_position_embeddings": int, "hidden_act": str, "tie_word_embeddings": bool,
               "eagle_aux_hidden_state_layer_ids": list, "eagle_config": dict},
}
ENGINE_FIELDS["domino_ft"] = ENGINE_FIELDS["dflash"]
# What SGLang's Domino path reads beyond the DFlash fields: dflash_config entries and the head's tensors.
DOMINO_FIELDS = {"projector_type": str, "emb_dim": int, "gru_hidden_dim": int, "pure_draft_prefix_len": int,
                 "shift_label": bool}
ARCHITECTURE = {"dflash": "DFlashDraftModel", "eagle3": "LlamaForCausalLMEagle3", "domino_ft": "DFlashDraftModel"}
TITLE = {"dflash": "DFlash", "eagle3": "EAGLE-3", "domino_ft": "Domino-FT"}
ENGINES = {"dflash": ("vllm", "sglang"), "eagle3": ("vllm", "sglang"), "domino_ft": ("sglang",)}


@dataclass
class Plan:
    """Everything an export writes, decided and checked before a byte is written."""

    kind: str                       # dflash | eagle3 | domino_ft
    fmt: str
    source: Path                    # the checkpoint directory
    out: Path
    overwrite: bool
    dtype: object                   # a torch dtype, or None = the checkpoint's
    model: object                   # the loaded draft model (domino_ft: the state dict of backbone + head)
    config: dict                    # config.json as written
    card: dict                      # the source's card.json ({} when none)
    info: dict = field(default_factory=dict)      # target, data, τ, commands: the card's facts (export.json)
    push: dict | None = None        # {"repo_id", "private"} or None
    caveats: list = field(default_factory=list)    # what the card must say (a forced export's difference)


# --------------------------------------------------------------------------------------------------- checks
def refusal(drafter: str) -> str | None:
    """The one line for a drafter that cannot be exported, or None."""
    if drafter in NO_ROUTE:
        return f"task=export: drafter={drafter} has no serving route in vLLM or SGLang: {NO_ROUTE[drafter]}"
    if drafter not in EXPORTABLE:
        return (f"task=export: drafter={drafter} is not exportable; export writes drafter="
                f"{' or drafter='.join(EXPORTABLE)}")
    return None


def _truthy(v: str | None) -> bool:
    return (v or "").strip().upper() in ("1", "ON", "YES", "TRUE")      # huggingface_hub's reading of its flags


def check_push(ex: ExportConfig) -> dict | None:
    """`export.push` preconditions: a repo id, a reachable hub, a token (only its presence is looked at)."""
    if not ex.push:
        return None
    check(bool(ex.repo_id), "export.push=true needs export.repo_id=OWNER/NAME (the hub repository to create "
                                   "or update)")
    check(not _truthy(os.environ.get("HF_HUB_OFFLINE")),
          "export.push=true but the hub is offline (HF_HUB_OFFLINE=1); unset HF_HUB_OFFLINE, or export now and "
          "upload the directory later")
    from huggingface_hub import get_token

    check(get_token() is not None, "export.push=true needs a hub token: set HF_TOKEN or run `hf auth login`; none "
                                   "is configured")
    return {"repo_id": str(ex.repo_id), "private": ex.private}


def out_dir_of(ex: ExportConfig, run_dir) -> Path:
    """`export.out`, else `<run dir>/model`; a file, or a non-empty directory without `export.overwrite=true`, is
    refused. A relative `export.out` is relative to the current directory (as every path of the command line), not
    to the run directory; `export.out` may be the run directory itself (its log and lock do not count)."""
    out = Path(str(ex.out)).expanduser() if ex.out else Path(run_dir) / "model"
    key = f"export.out={str(out)!r}" if ex.out else f"the export directory {out}"
    check(not out.exists() or out.is_dir(), f"{key} is a file; expected a directory to write the drafter into")
    parent = next((p for p in out.parents if p.exists()), None)
    check(parent is None or parent.is_dir(), f"{key}: {parent} is a file, not a directory")
    own = {log.FILE, ".lock"} if out.resolve() == Path(run_dir).resolve() else set()   # this run's, not an export
    check(ex.overwrite or not (out.is_dir() and any(f.name not in own for f in out.iterdir())),
          f"{key} is not empty; choose another directory, or set export.overwrite=true to replace the files "
          f"export writes there")
    return out


def _nested(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents or a in b.parents


def plan(cfg, run_dir, typed: Config | None = None) -> Plan:
    """Check everything an export needs and load the drafter; nothing is written. One `UserError` line per fault.
    `typed`: the checked config (config.checked); the drafter group stays the mapping of its own keys."""
    import torch

    from .. import checkpoints as ckpt
    from ..drafters import dflash, eagle3

    typed = checked(cfg, typed)
    ex, d = typed.export, cfg.drafter
    check(ex is not None, "the export group is missing: run task=export, which composes it")
    if (line := refusal(d.name)) is not None:
        raise UserError(line)
    check(not (d.name == "domino_ft" and ex.format not in ("sglang", "hf")),
          f"export.format={ex.format} with drafter=domino_ft: only SGLang serves Domino (dflash_config.projector_type"
          f"=domino); vLLM has no Domino drafter and z-lab's runtime none either. Choose export.format=sglang (or hf: "
          f"the same files for a hub repository)")
    check(not (d.name == "eagle3" and ex.format == "zlab"),
          "export.format=zlab is the DFlash layout; for drafter=eagle3 choose vllm, sglang or hf (one EAGLE-3 layout "
          "serves all three)")
    check(d.get("init") != "random" and bool(d.get("checkpoint")),
          f"task=export writes a trained drafter: set drafter.checkpoint=DIR (drafter.init={d.get('init')} with "
          f"drafter.checkpoint={d.get('checkpoint')} has nothing to export)")
    out = out_dir_of(ex, run_dir)
    push = check_push(ex)
    where = f"drafter.checkpoint={str(d.checkpoint)!r}"
    resolve = eagle3.resolve_eagle3 if d.name == "eagle3" else ckpt.resolve   # EAGLE's .bin too
    source = Path(resolve(str(d.checkpoint), d.get("revision")))
    check(not _nested(out, source), f"the export directory {out} and {where} nest; choose an export.out outside "
                                    f"the checkpoint")
    card = _read_card(source, where)
    trained_for = card.get("target")
    check(trained_for in (None, typed.target.name), f"{where} was trained for target {trained_for} (its card.json), "
                                                    f"not target={typed.target.name}; pass target={trained_for}")
    dtype = getattr(torch, ex.dtype) if ex.dtype else None
    caveats = []
    shape = target_shape(typed.target)
    if d.name == "domino_ft":
        model, config, dtype, caveats, card = domino_plan(d, ex, source, where, dtype, card, shape)
    elif d.name == "dflash":
        model = dflash.load_model(source, where)
        check(not isinstance(model, dflash.DSparkDFlashModel),
              f"{where} is a DSpark-format DFlash drafter (its own embedding and lm_head, shifted rows); export "
              f"writes the z-lab layout only (vLLM serves DSpark releases as method=dspark from their own files)")
        if shape is not None:             # the card and the serving commands pair it with this target
            dflash.check_fits(model.config, shape, where)
        config = served(model.config.to_dict())
        check_contract("dflash", config, model.config, where)
    else:
        model = eagle3.Eagle3DraftModel.from_pretrained(source, where)
        c = model.config
        check(c.norm_output,
              f"{where}: norm_output=false (the lm_head reads the un-normed state): vLLM's and SGLang's EAGLE-3 "
              f"drafters always norm before the lm_head; only norm_output=true exports")
        taps = list(d.get("tap_layers") or c.tap_layers or [])
        check(len(taps) == 3, f"{where} names no tap layers (eagle_config.eagle_aux_hidden_state_layer_ids); set "
                              f"drafter.tap_layers=[LOW,MID,HIGH], the output-of-layer ids it was trained on")
        c.tap_layers = taps
        if shape is not None:
            eagle3.check_fits(model, shape, taps, where)
        config = served(serving_config_eagle3(c))
        check_contract("eagle3", config, c, where)
    p = Plan(d.name, ex.format, source, out, ex.overwrite, dtype, model, config, card, push=push,
             caveats=caveats)
    p.info = card_facts(typed.target, cfg.drafter, p)
    return p


def target_shape(t: TargetSettings) -> SimpleNamespace | None:
    """The target's width, vocabulary and depth where they are known without loading it: tiny_qwen3's settings, or
    the config.json of a local target directory or of a hub target already in the HF cache; None otherwise (an
    unreadable config included: the export then checks the drafter alone, as before)."""
    if t.loader == "tiny_qwen3":
        return SimpleNamespace(name=t.name, hidden_size=t.hidden_size, vocab_size=TINY_VOCAB, num_layers=t.num_layers)
    config = None
    try:
        if t.path and (Path(t.path).expanduser() / CONFIG).is_file():
            config = Path(t.path).expanduser() / CONFIG
        elif t.hub_id:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(t.hub_id, CONFIG, revision=t.revision)
            config = Path(found) if isinstance(found, str) else None
        raw = json.loads(config.read_text()) if config is not None else None
    except (OSError, ValueError):
        return None
    dims = [raw.get(k) for k in ("hidden_size", "vocab_size", "num_hidden_layers")] if isinstance(raw, dict) else []
    if len(dims) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in dims):
        return None
    return SimpleNamespace(name=t.name, hidden_size=dims[0], vocab_size=dims[1], num_layers=dims[2])


def domino_plan(d, ex, source: Path, where: str, dtype, card: dict, shape=None):
    """A Domino-FT export's (state, config.json, dtype, caveats, card): the backbone and the head from a released
    Domino directory (`drafter.checkpoint`) or from `drafter.checkpoint` + `drafter.head.checkpoint`; what SGLang
    would run differently is refused unless `export.force=true` (then named on the card)."""
    import torch

    from .. import checkpoints as ckpt
    from ..drafters import dflash, domino

    raw = ckpt.read_config(source, where)
    head_dir = (d.get("head") or {}).get("checkpoint")
    if domino.is_release(raw):
        backbone, head = domino.load_release(source, where, raw)
    else:
        check(bool(head_dir), f"task=export drafter=domino_ft needs the trained head: drafter.head.checkpoint=DIR "
                              f"(or a released Domino drafter as {where})")
        backbone = dflash.load_model(source, where)
        head_where = f"drafter.head.checkpoint={str(head_dir)!r}"
        head_path = Path(ckpt.resolve(str(head_dir)))
        head = domino.load_head(head_path, head_where)
        card = _read_card(head_path, head_where) or card          # the trained head's card: its data and τ
    check(not isinstance(backbone, dflash.DSparkDFlashModel),
          f"{where} is a DSpark-format DFlash backbone (its own embedding and lm_head); SGLang's Domino path uses the "
          f"target's, so only a z-lab backbone exports")
    c, bc = head.config, backbone.config
    if shape is not None:
        dflash.check_fits(bc, shape, where)
    check(c.vocab_size == bc.vocab_size and c.hidden_size == bc.hidden_size,
          f"task=export drafter=domino_ft: the head's vocabulary / width ({c.vocab_size} / {c.hidden_size}) differ "
          f"from the backbone's ({bc.vocab_size} / {bc.hidden_size}): the head reads the backbone's hidden states and "
          f"adds to the target's logits, so no engine can run the pair (export.force does not apply); pair "
          f"drafter.head.checkpoint with the backbone it was trained on")
    force = ex.force
    guidance = float((d.get("head") or {}).get("guidance", 1.0))
    caveats = []
    for bad, line in ((guidance != 1.0, f"drafter.head.guidance={guidance:g}: SGLang's Domino rollout adds the "
                                        f"correction unscaled (guidance 1), so it would decode otherwise than "
                                        f"specexp measured"),
                      (dtype not in (None, torch.bfloat16), f"export.dtype={ex.dtype}: SGLang's Domino runtime "
                                                            f"requires bf16 weights")):
        if bad:
            check(force, f"task=export drafter=domino_ft: {line}; set export.force=true to export anyway (the card "
                         f"says so)")
            caveats.append(line)
    config = served(bc.to_dict())
    config["dflash_config"] = {**config["dflash_config"], "projector_type": "domino", "emb_dim": c.emb_dim,
                               "gru_hidden_dim": c.gru_hidden, "pure_draft_prefix_len": 1,
                               "shift_label": c.alignment == "shifted"}
    check_contract("domino_ft", config, SimpleNamespace(**vars(bc), shifted=c.alignment == "shifted"), where)
    state = {**backbone.state_dict(), **head.state_dict()}
    return state, config, (dtype or torch.bfloat16), caveats, card


REMOTE_CODE = ("auto_map", "trust_remote_code")     # a source's pointers to modelling code the export does not ship
STALE = ("model-*-of-*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
         "pytorch_model.bin.index.json")             # weights an engine might load instead of model.safetensors


def served(config: dict) -> dict:
    """config.json as exported: without a source's `auto_map` / `trust_remote_code` (an export ships no code, and an
    `auto_map` would point a loader at a modelling file that is not there)."""
    return {k: v for k, v in config.items() if k not in REMOTE_CODE}


def check_contract(kind: str, config: dict, c, where: str) -> None:
    """Refuse an export whose config.json an engine would read otherwise than specexp's drafter `c` computes
    (export/contract.py): a key specexp writes, or one copied through from the source's config.json."""
    from .contract import faults

    bad = faults(kind, config, c)
    check(not bad, f"{where}: the export would be served otherwise than specexp runs it: {bad[0] if bad else ''}"
                   f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}")


def serving_config_eagle3(c) -> dict:
    """The EAGLE-3 config.json with the fields the engines read beyond ours: the taps in vLLM's indexing at the
    top level (vLLM reads no `eagle_config` ids), `use_aux_hidden_state` (fc over the fused taps) and an untied
    lm_head (SGLang ties lm_head to embed_tokens when tie_word_embeddings is true). Without `norm_output`: specexp
    means "norm before the lm_head" by it (SpecForge's option), vLLM and SGLang "feed the normed state to the next
    step" (export/contract.py); with it true specexp computes what both engines compute when it is absent. `fc_norm`
    is written only when true (the engines' meaning is specexp's)."""
    from ..drafters.eagle3 import vllm_layer_ids

    config = c.to_dict()
    config.pop("norm_output", None)
    if not c.fc_norm:
        config.pop("fc_norm", None)
    config["eagle_config"] = {**config.get("eagle_config", {}), "use_aux_hidden_state": True}
    config["eagle_aux_hidden_state_layer_ids"] = vllm_layer_ids(c.tap_layers)
    config["tie_word_embeddings"] = False
    config.setdefault("hidden_act", "silu")
    return config


def _read_card(source: Path, where: str) -> dict:
    from ..checkpoints import read_object  # torch: not at import

    f = source / "card.json"
    return read_object(f, where) if f.is_file() else {}


# ------------------------------------------------------------------------------------------------ the card
def tau_of(card: dict) -> dict | None:
    """τ from the checkpoint's card: a replay summary (`replay`) first, else a greedy decode (`eval`), which gives
    the same τ under greedy decoding (eval/replay.py); None when neither was measured."""
    for key, how in (("replay", "replay (task=replay)"), ("eval", "greedy decoding (task=eval)")):
        r = card.get(key)
        if isinstance(r, dict) and isinstance((r.get("macro") or {}).get("tau"), (int, float)) \
                and r.get("decoding", "greedy") == "greedy":
            per = {b: v.get("tau") for b, v in (r.get("benchmarks") or {}).items() if isinstance(v, dict)}
            return {"how": how, "macro": r["macro"]["tau"], "ci95": r["macro"].get("tau_ci95"), "benchmarks": per,
                    "max_new_tokens": r.get("max_new_tokens")}
    return None


def serving_commands(kind: str, config: dict, target: str, where: str, num_drafts: int) -> dict[str, str]:
    """The engine commands that serve the exported drafter (`where`: its directory or hub id) beside `target`. SGLang
    picks its Domino path from the config (`projector_type`), with DFlash's flags."""
    if kind == "domino_ft":   # pool 0: the correction's argmax over the whole vocabulary, as specexp (default: 2,048)
        return {"sglang": serving_commands("dflash", config, target, where, num_drafts)["sglang"]
                + " --speculative-domino-candidate-pool-size 0"}
    if kind == "dflash":
        b = config["block_size"]
        spec = json.dumps({"method": "dflash", "model": where, "num_speculative_tokens": b - 1})
        return {"vllm": f"vllm serve {target} --speculative-config '{spec}'",
                "sglang": f"python -m sglang.launch_server --model-path {target} --speculative-algorithm DFLASH "
                          f"--speculative-draft-model-path {where} --speculative-num-draft-tokens {b}"}
    spec = json.dumps({"method": "eagle3", "model": where, "num_speculative_tokens": num_drafts})
    return {"vllm": f"vllm serve {target} --speculative-config '{spec}'",
            "sglang": f"python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
                      f"--speculative-draft-model-path {where} --speculative-num-steps {num_drafts} "
                      f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {num_drafts + 1}"}


def card_facts(t: TargetSettings, drafter, p: Plan) -> dict:
    """The facts of the card and of export.json: target, data, τ, the commands (export's own and the engines')."""
    card = p.card
    target = t.hub_id or t.path or f"<the {t.name} weights>"
    where = p.push["repo_id"] if p.push else str(p.out)
    num_drafts = int(drafter.get("num_drafts") or 7)
    commands = serving_commands(p.kind, p.config, target, where, num_drafts)
    # a Domino export is a released-format directory, which drafter.checkpoint reads whole
    replay = (f"python -m specexp task=replay target={t.name} drafter={p.kind} drafter.checkpoint="
              f"{p.out if p.kind == 'domino_ft' else p.source} eval.num_samples=50 eval.max_new_tokens=128")
    return {"format": p.fmt, "drafter": p.kind, "architecture": ARCHITECTURE[p.kind], "target": t.name,
            "target_weights": target, "trained_against": card.get("target_source"),
            "data": {k: card[k] for k in ("data_hash", "sequences", "response_tokens") if k in card},
            "trained_by": card.get("command"), "tau": tau_of(card), "replay_command": replay,
            "source": str(p.source), "commands": commands, "caveats": list(p.caveats),
            "dtype": str(p.dtype).removeprefix("torch.") if p.dtype is not None else "the checkpoint's"}


def card_markdown(info: dict, config: dict) -> str:
    """README.md: hub metadata, then what the drafter is, for which target, from which data, its τ and how to serve
    it. The chosen engine's command first (`zlab` / `hf`: both engines)."""
    engines = ENGINES[info["drafter"]]
    order = [info["format"]] if info["format"] in engines else list(engines)
    order += [e for e in engines if e not in order]
    tags = ["speculative-decoding", info["drafter"], "specexp"]
    base = info["target_weights"] if "/" in info["target_weights"] and not info["target_weights"].startswith(
        ("/", ".", "<")) else None
    head = ["---", "library_name: vllm" if info["format"] != "sglang" else "library_name: sglang",
            *([f"base_model: {base}"] if base else []), "tags:", *[f"- {x}" for x in tags], "---", ""]
    title = TITLE[info["drafter"]]
    lines = [f"# {title} drafter for {info['target_weights']}", "",
             f"A speculative-decoding drafter ({info['architecture']}) exported by specexp (`task=export "
             f"export.format={info['format']}`) from `{info['source']}`; weights in {info['dtype']} dtypes.", ""]
    lines.append(f"- target: `{info['target_weights']}` (specexp target `{info['target']}`)"
                 + (f"; trained against `{info['trained_against']}`" if info.get("trained_against") else ""))
    data = info["data"]
    lines.append("- data: " + (", ".join(f"{k} {v}" for k, v in data.items()) if data else "not recorded (no "
                                                                                           "card.json beside the "
                                                                                           "checkpoint)"))
    if info.get("trained_by"):
        lines.append(f"- trained by: `{info['trained_by']}`")
    if info["drafter"] in ("dflash", "domino_ft"):
        dc = config["dflash_config"]
        lines.append(f"- block size {config['block_size']}, {config['num_hidden_layers']} layer(s), target layers "
                     f"{dc['target_layer_ids']}, mask token id {dc['mask_token_id']}")
    else:
        lines.append(f"- taps {config['eagle_config']['eagle_aux_hidden_state_layer_ids']} (outputs of those target "
                     f"layers; vLLM's indexing {config['eagle_aux_hidden_state_layer_ids']}), draft vocabulary "
                     f"{config['draft_vocab_size']} of {config['vocab_size']}")
    if info["drafter"] == "domino_ft":
        dc = config["dflash_config"]
        lines.append(f"- Domino head: prefix GRU of {dc['gru_hidden_dim']}, residual rank {dc['emb_dim']}, "
                     f"shift_label {str(dc['shift_label']).lower()}; SGLang adds its correction unscaled (guidance 1)")
    if info["drafter"] == "dflash":
        lines.append("- Transformers: z-lab's path loads DFlash as remote code through `auto_map`; this export ships "
                     "no code and no `auto_map`. Load it with specexp (`drafter=dflash drafter.checkpoint=DIR`), or "
                     "add z-lab's modelling file and its `auto_map` yourself")
    for caveat in info.get("caveats") or []:
        lines.append(f"- **exported with export.force=true**: {caveat}")
    tau = info["tau"]
    lines += ["", "## τ (tokens per verification, bonus included)", ""]
    if tau is None:
        lines += ["Not measured for this checkpoint. Measure it by replay (exact under greedy decoding, no decoding):",
                  "", "```bash", info["replay_command"], "```"]
    else:
        ci = f" [{tau['ci95'][0]:.3f}, {tau['ci95'][1]:.3f}]" if tau.get("ci95") else ""
        lines.append(f"Macro τ {tau['macro']:.3f}{ci}, by {tau['how']}, {tau.get('max_new_tokens')} new tokens "
                     f"(under greedy decoding replay gives the same τ):")
        lines += ["", "| benchmark | τ |", "|---|---:|"]
        lines += [f"| {b} | {v:.3f} |" for b, v in tau["benchmarks"].items() if isinstance(v, (int, float))]
    lines += ["", "## Serving", ""]
    for engine in order:
        lines += [f"{'vLLM' if engine == 'vllm' else 'SGLang'}:", "", "```bash", info["commands"][engine], "```", ""]
    lines += ["The files follow the layout both engines' loaders read (specexp docs/export.md lists the fields and "
              "tensors); the engines were not run by the export. No code is shipped: safetensors and JSON only.", ""]
    return "\n".join(head + lines)


# --------------------------------------------------------------------------------------------------- write
def write(p: Plan) -> list[str]:
    """Write the export; a new directory is built beside its final name and renamed into place whole, an existing
    one (export.overwrite=true) gets the new files written whole beside the old ones, then each renamed over its old
    one. Returns the file names written."""
    from .. import checkpoints as ckpt
    from ..files import write_json, write_text_atomic

    def fill(d: Path) -> None:
        if p.kind == "dflash":
            ckpt.save_module(p.model, d, p.config, p.dtype)
        elif p.kind == "domino_ft":
            ckpt.save(d, p.model, p.config, p.dtype)
        else:
            p.model.save_pretrained(d, p.dtype, p.config)
        write_text_atomic(d / CARD, card_markdown(p.info, p.config))
        write_json(d / RECORD, p.info)

    def staged(tmp: Path, move) -> None:
        """Fill `tmp`, then `move` it into place; an OSError names the file the user asked for, not `tmp`'s."""
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            fill(tmp)
            move(tmp)
        except OSError as e:
            if e.filename and str(e.filename).startswith(str(tmp)):
                raise OSError(e.errno, e.strerror, str(p.out) + str(e.filename)[len(str(tmp)):]) from None
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    if p.out.is_dir():
        # Every new file is written whole beside the old export first (a full disk, a fault or Ctrl-C while writing
        # leaves the earlier export as it was), then each is renamed over its old one.
        def move(tmp: Path) -> None:
            for f in sorted(tmp.iterdir()):
                os.replace(f, p.out / f.name)

        staged(p.out / f".export.{os.getpid()}.tmp", move)
        for pattern in STALE:             # after the new files are in place: a failed write leaves the old export
            for f in p.out.glob(pattern):
                f.unlink()
    else:
        p.out.parent.mkdir(parents=True, exist_ok=True)
        staged(p.out.with_name(f".{p.out.name}.{os.getpid()}.tmp"), lambda tmp: os.replace(tmp, p.out))
    return sorted(n for n in (CONFIG, WEIGHTS, CARD, RECORD) if (p.out / n).is_file())


def upload(out: Path, repo_id: str, private: bool) -> str:
    """Create (or reuse) the hub model repository and upload the directory; returns the commit URL. A failure is
    one line: the export itself stays on disk."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(out), repo_id=repo_id, repo_type="model",
                                 commit_message="specexp task=export")
    except Exception as e:          # network, permission, quota: huggingface_hub raises many types
        first = (str(e).strip().splitlines() or ["(no message)"])[0]
        raise UserError(f"export.push: uploading {out} to {repo_id} failed ({type(e).__name__}: {first}); the "
                        f"export is complete on disk, upload it again later") from None
    return str(getattr(info, "commit_url", None) or info)


def run_export(cfg, out_dir, typed: Config | None = None) -> dict:
    """`task=export`: plan (every check, the drafter loaded), claim the run directory, write, push when asked."""
    from ..files import write_json
    from ..rundir import claimed_for

    p = plan(cfg, out_dir, typed)
    with claimed_for(out_dir, "export") as d:     # never into another run's directory, nor while one runs there
        files = write(p)
        summary = {"out": str(p.out), "files": files, **p.info}
        if p.push is not None:
            summary["pushed"] = upload(p.out, p.push["repo_id"], p.push["private"])
        write_json(d / "export_summary.json", summary)
    tau = p.info["tau"]
    log.LOG.info(f"exported drafter={p.kind} ({p.fmt}) to {p.out}: {', '.join(files)}; τ "
                 f"{'%.3f' % tau['macro'] if tau else 'not measured'}")
    first = p.fmt if p.fmt in p.info["commands"] else next(iter(p.info["commands"]))
    log.LOG.info(f"serve with: {p.info['commands'][first]}")
    return summary
