"""DeLS-Spec Table 6 (and §5.7) against the shipped recipes: for every hyperparameter, the paper's value, the reference
runtime's, and the value in the composed config of each paper experiment (conf/experiment/paper_*.yaml), so the
comparison stays true when a file changes. Never imported by the library; loads no model.

    python experiments/dels_table6.py                            # every conf/experiment/paper_*.yaml that trains
    python experiments/dels_table6.py paper_dels_rnn_qwen3_8b --out experiments/results/paper_recipes.md

A row prints ✓ when the config equals the paper's value, ✗ when it differs, and nothing when the paper states none.
"""
import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).parent))
from paper_values import cite, load  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
BATCH = "batch"          # not a config key: specexp trains one sequence per step and rank (train.accumulate = more)


def compose(name: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=[f"experiment={name}"])


def value(cfg, key: str):
    if key == BATCH:
        return 1
    v = OmegaConf.select(cfg, key, default="<absent>", throw_on_missing=False)
    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def same(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def rows_for(cfg, pv: dict) -> tuple[str, list[tuple[str, str, object, object]]]:
    """(what trains, [(hyperparameter, key, paper value or None, reference value or None)]) for one recipe."""
    drafter, part = cfg.drafter.name, OmegaConf.select(cfg, "drafter.head.train.part", default=None)
    t6, ref = pv["dels_t6"], pv["dels_t6"]["reference"]["values"]
    if drafter == "dflash":
        d = pv["dflash_recipe"]
        rows = [(k.split(".")[-1], k, v, None) for k, v in d["values"].items()]
        rows.append(("sequences per optimizer step", "train.devices x train.accumulate",
                     None, d["specforge"]["effective_batch"]))
        return f"DFlash drafter ({cite(d)}; reference column: SpecForge's launcher)", rows
    if part == "fusion_weights":
        rows = [(r["row"], r["key"], r["value"], None) for r in t6["rows"]
                if r.get("applies") == "fusion_weights" or r["key"] in (BATCH, "train.accumulate")]
        rows += [(k.split(".")[-1], k, None, v) for k, v in ref.items() if k.startswith("train.")]
        return f"learned α/β on the {drafter} head ({cite(t6)})", rows
    rows = [(r["row"], r["key"], r["value"], ref.get(r["key"])) for r in t6["rows"] if "applies" not in r]
    if drafter == "domino_ft":          # §5.7: the DeLS head's data and epochs; the rest is not stated for it
        dom = t6["domino_reference"]
        rows = [(r[0], r[1], r[2], dom["values"].get(r[1])) for r in rows if r[1] == "drafter.head.train.epochs"]
        rows += [(k.split(".")[-1], k, None, v) for k, v in dom["values"].items() if k != "drafter.head.train.epochs"]
        return f"Domino-FT head (paper: {cite(t6)}; reference: {dom['source']})", rows
    if drafter == "dels_markov":        # trained densely over every position: no anchors, no GRU
        rows = [r for r in rows if r[1] != "drafter.head.train.num_anchors"]
        skip = ("num_anchors", "gru_hidden", "input_rank", "gamma")
    else:
        skip = ()
    stated = {r[1] for r in rows}
    rows += [(k.split(".")[-1], k, None, v) for k, v in ref.items() if k not in stated and not k.endswith(skip)]
    return f"{drafter} local head ({cite(t6)}; reference: {pv['dels_t6']['reference']['source']})", rows


def table(name: str, pv: dict) -> str:
    cfg = compose(name)
    what, rows = rows_for(cfg, pv)
    lines = [f"### experiment={name}: {what}", "", "| hyperparameter | config key | paper | reference | config | |",
             "|---|---|---:|---:|---:|---|"]
    for label, key, paper, ref in rows:
        if key == "train.devices x train.accumulate":
            conf = int(value(cfg, "train.devices")) * int(value(cfg, "train.accumulate"))
        else:
            conf = value(cfg, key)
        mark = "" if paper is None else ("✓" if same(conf, paper) else "✗")
        if paper is None and ref is not None:
            mark = "= reference" if same(conf, ref) else "≠ reference"
        show = (lambda v: "–" if v is None else f"{v:g}" if isinstance(v, float) else str(v))     # noqa: E731
        lines.append(f"| {label} | `{key}` | {show(paper)} | {show(ref)} | {show(conf)} | {mark} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", help="experiment names (default: every conf/experiment/paper_*.yaml "
                    "that trains)")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args(argv)
    names = args.experiments or [n for n in sorted(p.stem for p in (CONF / "experiment").glob("paper_*.yaml"))
                                 if compose(n).task.name == "train"]        # training recipes (not eval-only rows)
    pv = load()
    text = ("# Paper recipes: paper value / config value per hyperparameter\n\n"
            "Written by `python experiments/dels_table6.py --out experiments/results/paper_recipes.md` from the "
            "composed configs. paper = " + cite(pv["dels_t6"]) + " (DFlash: " + cite(pv["dflash_recipe"]) + "); "
            "reference = the reference implementation's recipe, shown where the paper states no value; batch = "
            "sequences per step and rank (specexp trains one; `train.accumulate` adds more per optimizer step).\n\n"
            + "\n".join(table(n, pv) for n in names))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
