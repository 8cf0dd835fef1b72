"""Replace the measured section of a committed checkpoint's card with a new evaluation run, e.g. after the
backbone a head is evaluated beside has changed (the head's weights and training facts stay as they are):

    python -m specexp drafter=dels_rnn hydra.run.dir=runs/card-eval/dels_rnn          # the mini eval (eval=mini)
    python scripts/card_eval.py checkpoints/mini/smollm2_135m-dels-rnn runs/card-eval/dels_rnn

card.json's `eval` becomes the run's per-benchmark τ and speedup (what task=train with train.eval_after=true
records), plus `eval_run`: the run directory, the backbone and head it read, the git commit and the device;
README.md's measured section (from the line starting "Measured" to the end) is rewritten from it.
tests/test_golden.py checks that the committed checkpoints still reach the τ their cards give.
"""
import argparse
import json
import sys
from pathlib import Path

import yaml

from specexp import registry


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("card_dir", type=Path)
    ap.add_argument("run_dir", type=Path, help="a task=eval run directory (summary.json, config.yaml)")
    ap.add_argument("--note", default="", help="appended to the measured section's heading, e.g. 'timed while other "
                                               "jobs ran (busy)'")
    args = ap.parse_args(argv)
    card_path, readme = args.card_dir / "card.json", args.card_dir / "README.md"
    summary_path, config_path = args.run_dir / "summary.json", args.run_dir / "config.yaml"
    for p in (card_path, summary_path, config_path):
        if not p.is_file():
            sys.exit(f"card_eval: {p} does not exist (a checkpoint directory with card.json, and a task=eval run)")
    card, s = json.loads(card_path.read_text()), json.loads(summary_path.read_text())
    if s.get("mode", "online") != "online":
        sys.exit(f"card_eval: {summary_path} is a {s['mode']} run; a card records an online task=eval run")
    cfg = yaml.safe_load(config_path.read_text())
    d, fusion = cfg["drafter"], cfg.get("fusion") or {}
    defaults = registry.drafter_entry(d["name"]).checkpoints.get(cfg["target"]["name"], {})
    backbone = d.get("checkpoint") or defaults.get("checkpoint")
    head = (d.get("head") or {}).get("checkpoint") or defaults.get("head.checkpoint")
    card["eval"] = {"benchmarks": {k: {"tau": v["tau"], "speedup": v["speedup"]} for k, v in s["benchmarks"].items()},
                    "macro": s["macro"], "max_new_tokens": s["max_new_tokens"], "decoding": s["decoding"]["protocol"]}
    if "head" in d:
        card["eval"] |= {"alpha": fusion.get("alpha"), "beta": fusion.get("beta")}
    run_info = json.loads((args.run_dir / "run_info.json").read_text()) if (args.run_dir / "run_info.json").exists() \
        else {}
    card["eval_run"] = {"run_dir": str(args.run_dir), "backbone": backbone, "head": head, "git": run_info.get("git"),
                        "device": run_info.get("device")}
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    e = card["eval"]
    beside = f" with fusion alpha={e['alpha']}, beta={e['beta']} beside the backbone `{backbone}`" if "alpha" in e \
        else ""
    note = f"; {args.note}" if args.note else ""
    prompts = next(iter(s["benchmarks"].values()))["num_samples"]
    lines = [f"Measured{beside} ({e['decoding']}, {e['max_new_tokens']} new tokens, "
             f"{prompts} prompts per benchmark; τ includes the bonus token; "
             f"speedups are wall-time ratios against AR on {card['eval_run']['device']['type']}{note}):", "",
             "| benchmark | τ | speedup |", "|---|---:|---:|"]
    for name, b in e["benchmarks"].items():
        sp = "–" if b["speedup"] is None else f"{b['speedup']:.2f}×"
        lines.append(f"| {name} | {b['tau']:.2f} | {sp} |")
    text = readme.read_text() if readme.exists() else ""
    head = text.split("\nMeasured", 1)[0].rstrip("\n")
    readme.write_text(head + "\n\n" + "\n".join(lines) + "\n")
    print(f"card_eval: {card_path} eval <- {summary_path} (macro τ {s['macro']['tau']:.3f})")


if __name__ == "__main__":
    main()
