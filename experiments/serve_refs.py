"""How many references vLLM decodes exactly as specexp's own engine does (issue 60 item 4).

    python experiments/serve_refs.py SPECEXP_RUN VLLM_RUN [OUT.json] [--gaps VLLM_SET_DIR --dtype DTYPE]

Both arguments are `task=replay` run directories on the same prompts, one on specexp's references (the default
`replay.reference_engine=specexp`) and one on vLLM's (`replay.reference_engine=vllm`). Their samples.jsonl carry each
turn's reference token ids (`tokens`); this compares them turn by turn and sample by sample (a sample is equal when
every turn is) and, where they part, says where: the first differing position and the common prefix's share of the
shorter reference, and whether replay flagged a near-tie there (the vLLM run's `tf_argmax_mismatches`: reference
tokens that specexp's teacher-forced pass ranks second, each an exact or near tie broken the other way).
A turn after a differing turn of its sample has another prompt (`same_prompt` false): it is counted, not explained.

`--gaps VLLM_SET_DIR --dtype DTYPE` (the vLLM reference set's cache directory, whose vllm/turn*/ hold the prompt ids
vLLM was given): where a turn with the same prompt parts, specexp's mini target in DTYPE scores the common prefix
once more and reports the logits of both engines' tokens at the split (`logit_gap`: specexp's token's minus vLLM's;
0 or a step of the dtype's rounding is a tie the two engines broke differently) and the top-2 gap there.
"""
import json
import sys
from pathlib import Path


def records(run: Path) -> dict:
    out = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[(r["benchmark"], r["id"], r["turn"])] = r
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter's length when one is the other's prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(ours: dict, theirs: dict) -> dict:
    keys = sorted(ours.keys() & theirs.keys())
    turns, by_sample = [], {}
    for k in keys:
        a, b = ours[k]["tokens"], theirs[k]["tokens"]
        at = first_difference(a, b)
        same_prompt = all(by_sample.get(k[:2], []))              # every earlier turn of the sample equal
        turns.append({"benchmark": k[0], "id": k[1], "turn": k[2], "equal": at is None, "first_difference": at,
                      "same_prompt": same_prompt,
                      "specexp_tokens": len(a), "vllm_tokens": len(b),
                      "vllm_ref_tf_argmax_mismatches": theirs[k].get("tf_argmax_mismatches")})
        by_sample.setdefault(k[:2], []).append(at is None)
    return {"turns": len(turns), "turns_equal": sum(t["equal"] for t in turns),
            "samples": len(by_sample), "samples_equal": sum(all(v) for v in by_sample.values()),
            "tokens_compared": sum(min(t["specexp_tokens"], t["vllm_tokens"]) for t in turns),
            "different": [t for t in turns if not t["equal"]], "missing_in_one_run": len(ours.keys() ^ theirs.keys())}


def vllm_prompts(set_dir: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, vLLM's output ids) of every prompt of every turn depth of a vLLM reference set."""
    out = []
    for turn in sorted((set_dir / "vllm").glob("turn*")):
        spec = json.loads((turn / "vllm_spec.json").read_text())
        got = json.loads((turn / "vllm_out.json").read_text())["runs"][0]["prompts"]
        out += [(ids, p["output_ids"]) for ids, p in zip(spec["prompts"], got)]
    return out


def split_gaps(result: dict, ours: dict, theirs: dict, set_dir: Path, dtype: str) -> None:
    """Adds to each differing turn with the same prompt specexp's logits of both tokens at the split (module doc)."""
    import torch

    from specexp import registry
    from specexp.api import compose

    cfg, _ = compose(["target=smollm2_135m", f"target.dtype={dtype}", "target.prepack=false", "drafter=none"])
    target = registry.build_target(cfg.target, torch.device("cpu"))
    prompts = vllm_prompts(set_dir)
    for t in result["different"]:
        k = (t["benchmark"], t["id"], t["turn"])
        a, b, at = ours[k]["tokens"], theirs[k]["tokens"], t["first_difference"]
        prompt = next((ids for ids, out in prompts if out == b), None)
        if not t["same_prompt"] or prompt is None or at >= min(len(a), len(b)):
            continue
        with torch.inference_mode():
            ids = torch.tensor([prompt + a[:at]])
            logits = target.forward(ids, 0, target.new_cache())[0][0, -1].float()
        top2 = logits.topk(2).values
        t["split"] = {"specexp_token": a[at], "vllm_token": b[at],
                      "logit_gap": float(logits[a[at]] - logits[b[at]]), "top2_gap": float(top2[0] - top2[1]),
                      "vllm_token_rank": int((logits > logits[b[at]]).sum())}


def main(argv: list[str]) -> int:
    gaps = "--gaps" in argv
    if gaps:
        i = argv.index("--gaps")
        set_dir, dtype = Path(argv[i + 1]), argv[argv.index("--dtype") + 1]
        argv = argv[:i]
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    ours, theirs = records(Path(argv[1])), records(Path(argv[2]))
    result = compare(ours, theirs)
    if gaps:
        split_gaps(result, ours, theirs, set_dir, dtype)
    text = json.dumps(result, indent=1)
    if len(argv) == 4:
        Path(argv[3]).write_text(text + "\n")
    print(f"references equal token for token: {result['samples_equal']}/{result['samples']} samples, "
          f"{result['turns_equal']}/{result['turns']} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
