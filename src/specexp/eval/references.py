"""Reference continuations for replay: the target's own greedy output on every selected prompt.

Under greedy decoding every lossless drafter emits exactly this text, so a drafter's τ is a function of it
(eval/replay.py). A reference is what `task=eval drafter=none` produces, token for token: the same engine
(`decoding.engine.generate` with no drafter, batch 1), the same chat formatting, and for multi-turn samples
each next user turn follows the target's own decoded previous answer.

Store (`ReferenceStore`): a directory `<root>/<fingerprint>/` with
  manifest.json     what the references depend on (see `set_fingerprint`) and its hash, the directory's name
  references.jsonl  one line per sample, appended as each finishes (a rerun resumes; a torn last line is dropped,
                    saying so, and its sample decoded again; any other line that is not a reference is refused):
                    {"benchmark", "id", "key", "turns": [{"prompt_len", "prompt_sha256", "tokens", "stop_reason"}]}
`key` hashes the sample's user turns, so an edited prompt file never reuses a stale reference.
References may instead come from vLLM (`replay.reference_engine=vllm`, `VllmReferences`): the same prompt ids, budget
and stop ids, batched greedy in the target's dtype, one vLLM batch per turn depth (a sample's next user turn follows
its decoded previous answer, as above). Such a set's fingerprint has an `engine` entry (name, distribution, version,
dtype), so the two engines' sets never mix; a fingerprint without one is specexp's (sets made before the key existed
keep their hash).
Export / import: one gzipped JSON file `{"manifest": ..., "references": [...]}` (token ids only, a few hundred
bytes per turn), refused on import when its manifest differs from this run's.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from .. import files, log
from ..decoding.batch import generate_batched
from ..decoding.engine import DecodeConfig, Generation, generate
from ..errors import UserError, check, differing_keys
from .vllm_side import model_dir, run_vllm, vllm_version

FORMAT_VERSION = 1


def _reference(line: bytes) -> dict | None:
    """One line of references.jsonl as a reference record, or None when it is not one (torn, corrupt)."""
    try:
        r = json.loads(line)
    except ValueError:                                  # JSONDecodeError and UnicodeDecodeError
        return None
    ok = isinstance(r, dict) and isinstance(r.get("key"), str) and isinstance(r.get("turns"), list) and all(
        isinstance(t, dict) and isinstance(t.get("prompt_sha256"), str) and isinstance(t.get("tokens"), list)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in t["tokens"]) for t in r["turns"])
    return r if ok else None


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def weights_sha256(model: torch.nn.Module) -> str:
    """Hash of every parameter and buffer (name, dtype, shape, bytes), in name order."""
    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


SPECEXP_ENGINE = {"name": "specexp"}      # the source of a set whose fingerprint names no engine


def set_fingerprint(target, dc: DecodeConfig, engine: dict | None = None) -> dict:
    """What every reference of a set depends on besides its prompt: target weights, tokenizer and chat format,
    token budget and stop ids (greedy decoding, batch 1), and `engine` when another engine than specexp's decoded
    them (`VllmReferences.identity`; None: specexp's, no key, so older sets keep their hash)."""
    tok = target.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    return {
        "version": FORMAT_VERSION, "target": target.name,
        "weights_sha256": weights_sha256(target.model),
        "tokenizer_sha256": hashlib.sha256(backend.to_str().encode()).hexdigest() if backend is not None else None,
        "chat_template_sha256": _sha([getattr(tok, "chat_template", None), target.chat_kwargs]),
        "max_new_tokens": dc.max_new_tokens, "stop_token_ids": list(dc.stop_token_ids),
        **({"engine": engine} if engine is not None else {}),
    }


def reference_source(fingerprint: dict) -> dict:
    """The engine that decoded a set: its fingerprint's `engine`, or specexp's own when it names none."""
    return fingerprint.get("engine", SPECEXP_ENGINE)


def sample_key(sample) -> str:
    return _sha([sample.benchmark, sample.id, list(sample.turns)])[:32]


def prompt_sha(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:32]


class ReferenceStore:
    """The reference set of one fingerprint under `root`; appends only (a crash loses at most the sample in flight)."""

    def __init__(self, root: str | os.PathLike, fingerprint: dict):
        self.fingerprint = fingerprint
        self.hash = _sha(fingerprint)[:16]
        self.dir = Path(os.path.expanduser(str(root))) / self.hash
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = self.dir / "references.jsonl"
        manifest = self.dir / "manifest.json"
        if not manifest.exists():
            files.write_text_atomic(manifest, json.dumps({"fingerprint": fingerprint, "hash": self.hash,
                                                          "source": self.source}, indent=1) + "\n")
        self.refs: dict[str, dict] = {}
        if self.file.exists():
            data = self.file.read_bytes()
            lines = data.splitlines()
            for i, line in enumerate(lines):
                r = _reference(line)
                if r is None:
                    check(i == len(lines) - 1, f"{self.file} line {i + 1} is corrupt (not a reference record); move "
                                               f"the file away (its references are then decoded again)")
                    log.LOG.warning(f"{self.file} ends in a torn line (line {i + 1}: a run stopped while writing it); "
                                    f"it is dropped and its sample decoded again")
                    break
                self.refs[r["key"]] = r
            if data and (len(self.refs) < len(lines) or not data.endswith(b"\n")):
                self._rewrite()           # every line whole and terminated before the next append

    @property
    def source(self) -> dict:
        """The engine that decoded this set (`reference_source`)."""
        return reference_source(self.fingerprint)

    def _rewrite(self) -> None:
        files.write_text_atomic(self.file, "".join(json.dumps(r) + "\n" for r in self.refs.values()))

    def get(self, sample) -> dict | None:
        return self.refs.get(sample_key(sample))

    def add(self, refs: list[dict]) -> None:
        refs = [r for r in refs if r["key"] not in self.refs]
        if not refs:
            return
        files.append_text(self.file, "".join(json.dumps(r) + "\n" for r in refs))
        self.refs.update((r["key"], r) for r in refs)

    def export(self, path: str | os.PathLike, samples) -> int:
        """Write the references of `samples` (all must be present) to one gzipped JSON file; returns the count."""
        refs = [self.get(s) for s in samples]
        check(all(r is not None for r in refs), "replay.export: some references are missing; run replay first")
        payload = {"manifest": {"fingerprint": self.fingerprint, "hash": self.hash}, "references": refs}

        def write(tmp: Path) -> None:
            with gzip.open(tmp, "wt") as f:
                json.dump(payload, f, separators=(",", ":"))

        # the caller has checked the name (files.check_new_file: no directory, no file replaced unasked)
        path = Path(os.path.expanduser(str(path)))
        path.parent.mkdir(parents=True, exist_ok=True)
        files.replace_atomic(path, write)
        return len(refs)

    def import_file(self, path: str | os.PathLike) -> int:
        """Add the references of an exported file; its fingerprint must equal this set's. Returns the count."""
        path = Path(os.path.expanduser(str(path)))
        check(path.is_file(), f"replay.references={str(path)!r}: no such file")
        try:
            with gzip.open(path, "rt") as f:
                data = json.load(f)
            fp, refs = data["manifest"]["fingerprint"], data["references"]
        except (OSError, EOFError, json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"replay.references={str(path)!r}: not a reference file written by replay.export") \
                from None
        diff = differing_keys(fp, self.fingerprint)
        fp = self.fingerprint
        check(not diff, f"replay.references={str(path)!r} was made with different {', '.join(diff)} than this run "
                        f"(target {fp['target']}, eval.max_new_tokens={fp['max_new_tokens']})")
        self.add(refs)
        return len(refs)


def turn_prompt(target, messages: list[dict]) -> list[int]:
    return target.encode_chat(messages)


class SampleJob:
    """One sample's turns as the reference run decodes them: each next user turn follows the target's own decoded
    previous answer. `next_prompt` (decoding/batch.py's job protocol) hands out the turns' prompts in order; once
    it returns None, `reference` is the sample's store record."""

    def __init__(self, target, sample, dc: DecodeConfig):
        self.target, self.sample, self.dc = target, sample, dc
        self.messages: list[dict] = []
        self.turns: list[dict] = []
        self._prompt: list[int] = []

    def next_prompt(self, previous: Generation | None) -> list[int] | None:
        if previous is not None:
            self.turns.append({"prompt_len": len(self._prompt), "prompt_sha256": prompt_sha(self._prompt),
                               "tokens": previous.tokens, "stop_reason": previous.stop_reason})
            self.messages.append({"role": "assistant", "content": self.target.decode(previous.tokens)})
        if len(self.turns) == len(self.sample.turns):
            return None
        self.messages.append({"role": "user", "content": self.sample.turns[len(self.turns)]})
        ids = turn_prompt(self.target, self.messages)
        check(len(ids) + self.dc.max_new_tokens <= self.target.max_context,
              f"sample {self.sample.id}: prompt of {len(ids)} tokens + eval.max_new_tokens={self.dc.max_new_tokens} "
              f"exceeds the target context of {self.target.max_context}; lower eval.max_new_tokens")
        self._prompt = ids
        return ids

    @property
    def reference(self) -> dict:
        s = self.sample
        return {"benchmark": s.benchmark, "id": s.id, "key": sample_key(s), "turns": self.turns}


def compute_reference(target, sample, dc: DecodeConfig) -> dict:
    """All turns of one sample by greedy AR decoding, exactly as `task=eval drafter=none` runs them."""
    job = SampleJob(target, sample, dc)
    gen = None
    while (ids := job.next_prompt(gen)) is not None:
        gen = generate(target, None, ids, dc)
    return job.reference


def compute_references(target, samples, dc: DecodeConfig, batch_size: int, on_done) -> None:
    """Every sample's reference, `on_done(record)` as each finishes: at batch 1 one sample at a time through the
    target's own engine (`compute_reference`), else `batch_size` prompts side by side through the static engine
    (decoding/batch.py: a row that finishes takes the next turn or sample). Either way a record is the same
    tokens in float32 (tests/eval/test_batched_references.py), so the fingerprint does not name the batch."""
    if batch_size == 1:
        for sample in samples:
            on_done(compute_reference(target, sample, dc))
        return
    rows = batch_engine(target)
    # Shortest first prompt first: the rows of a step then hold contexts of similar lengths, and a step's attention,
    # which reads every row's keys and values up to the longest row's length (the batch's window), reads little
    # that a mask then drops (at 16 rows and windows of 1,024 that read was half of a CPU step).
    by_length = sorted(samples, key=lambda s: len(turn_prompt(target, [{"role": "user", "content": s.turns[0]}])))
    generate_batched(rows, (SampleJob(target, s, dc) for s in by_length), dc, batch_size,
                     lambda job: on_done(job.reference))


def batch_engine(target):
    """`target` as the static engine (the same modules and weights), which batched generation runs on; a model the
    static engine cannot run is refused in one line (`StaticTarget.of`)."""
    from ..targets.static import StaticTarget

    return target if isinstance(target, StaticTarget) else StaticTarget.of(target)


def turns_with_prompts(target, sample, ref: dict):
    """Yield `(turn, prompt ids, reference tokens)`, rebuilding each prompt as the reference run did and checking
    it is the one the reference was made from."""
    messages = []
    for turn, (user, t) in enumerate(zip(sample.turns, ref["turns"])):
        messages.append({"role": "user", "content": user})
        ids = turn_prompt(target, messages)
        check(prompt_sha(ids) == t["prompt_sha256"],
              f"sample {sample.id} turn {turn}: the prompt differs from the one its reference was made from "
              f"(tokenizer or chat template changed?); clear replay.cache_dir to rebuild the references")
        yield turn, ids, t["tokens"]
        messages.append({"role": "assistant", "content": target.decode(t["tokens"])})


class VllmReferences:
    """vLLM as the reference engine (`replay.reference_engine=vllm`): the prompts specexp builds (`SampleJob`, chat
    template and all), greedy, `dc`'s budget and stop ids, in the target's dtype, run by `python` (a Python with
    vllm: `.venv-serve`'s CPU build here, `vllm` itself on a GPU; export/vllm_runner.py is the same for both).

    Every sample's turn t is in one batched vLLM call (vLLM schedules the batch itself), one call per turn depth: a
    turn's prompt needs the previous turn's decoded answer. A stop token ends a generation only when it is one of
    `dc.stop_token_ids` (vLLM's own end-of-sequence rule is off), which is specexp's rule."""

    def __init__(self, python: str, target, target_settings, timeout_s: int, key: str = "replay.vllm_python"):
        self.python, self.target_settings, self.timeout_s = python, target_settings, timeout_s
        self.distribution, self.version = vllm_version(python, key)
        self.dtype = str(target.dtype).removeprefix("torch.")
        self.model: str | None = None        # what vLLM loads (`model_dir`), found at the first batch

    @property
    def identity(self) -> dict:
        """The fingerprint's `engine`: what decides vLLM's tokens besides the set's other keys."""
        return {"name": "vllm", "distribution": self.distribution, "version": self.version, "dtype": self.dtype}

    def generate(self, target, prompts: list[list[int]], dc: DecodeConfig, work: Path) -> list[list[int]]:
        """Greedy continuations of `prompts` in one vLLM batch; vLLM's spec, output and log are kept in `work`."""
        if self.model is None:              # a random-weight test target is saved once, not once per turn depth
            self.model = model_dir(target, self.target_settings, work.parent / "target")
        spec = {"model": self.model, "prompts": prompts,
                "runs": [{"name": "ar", "speculative_config": None}], "batched": True, "warmup": False,
                "dtype": self.dtype, "max_new_tokens": dc.max_new_tokens, "ignore_eos": True,
                "stop_token_ids": list(dc.stop_token_ids),
                "max_model_len": max(len(p) for p in prompts) + dc.max_new_tokens}
        run = run_vllm(self.python, spec, work, self.timeout_s, "references", "replay.vllm_timeout_s")["runs"][0]
        check(not run.get("error") and len(run.get("prompts", [])) == len(prompts),
              f"references: vLLM could not decode the prompts: {run.get('error')}; its log: {work / 'vllm.log'}")
        return [list(p["output_ids"]) for p in run["prompts"]]

    def compute(self, target, samples, dc: DecodeConfig, work: Path, on_done) -> None:
        """Every sample's reference, `on_done(record)` as each finishes (after the batch of its last turn)."""
        stops = set(dc.stop_token_ids)
        pending = [(job, job.next_prompt(None)) for job in (SampleJob(target, s, dc) for s in samples)]
        depth = 0
        while pending:
            t0 = time.perf_counter()
            outs = self.generate(target, [ids for _, ids in pending], dc, work / f"turn{depth}")
            log.LOG.info(f"references: vLLM decoded turn {depth + 1} of {len(pending)} samples "
                         f"({sum(map(len, outs))} tokens) in {time.perf_counter() - t0:.0f} s")
            later = []
            for (job, ids), tokens in zip(pending, outs):
                gen = Generation(prompt_len=len(ids), tokens=tokens,
                                 stop_reason="stop" if tokens and tokens[-1] in stops else "length")
                nxt = job.next_prompt(gen)
                if nxt is None:
                    on_done(job.reference)
                else:
                    later.append((job, nxt))
            pending, depth = later, depth + 1
