"""DeLS-Spec Table 6 (and §5.7) against the shipped recipes: for every hyperparameter, the paper's value, the reference
runtime's, and the value in the composed config of each paper experiment (conf/experiment/paper_*.yaml), so the
comparison stays true when a file changes. Never imported by the library; loads no model.

    python experiments/dels_table6.py                            # every conf/experiment/paper_*.yaml that trains
    python experiments/dels_table6.py paper_dels_rnn_qwen3_8b --out experiments/results/paper_recipes.md

A row prints ✓ when the config equals the paper's value and ✗ when it differs; a value the paper does not state for
that trained part reads "not stated" (never a value attributed to it), compared with the reference implementation's
where there is one. Every compared value is read from the composed config, the batch included: sequences per forward
step over all ranks, PER_RANK_BATCH × train.devices × train.num_nodes.
"""
import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).parent))
from paper_values import cite, load  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
BATCH = "batch"          # not a config key: sequences per forward step over all ranks (train.accumulate = more)
PER_RANK_BATCH = 1       # specexp's training loader takes one sequence per step and rank (training/pipeline.py)
NOT_STATED = "not stated"


def compose(name: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=[f"experiment={name}"])


def ranks(cfg) -> int | str:
    """Training processes: train.devices (a count or a list of ids) x train.num_nodes; 'auto' stays unresolved
    (it means every GPU of the machine, so the batch is not fixed by the config)."""
    devices, nodes = (OmegaConf.select(cfg, k) for k in ("train.devices", "train.num_nodes"))
    devices = len(devices) if OmegaConf.is_list(devices) or isinstance(devices, list) else devices
    return int(devices) * int(nodes) if isinstance(devices, int) else f"{devices} devices x {nodes} nodes"


def value(cfg, key: str):
    if key == BATCH:
        r = ranks(cfg)
        return PER_RANK_BATCH * r if isinstance(r, int) else f"{PER_RANK_BATCH} per rank, {r}"
    v = OmegaConf.select(cfg, key, default="<absent>", throw_on_missing=False)
    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def same(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def stated(t6: dict, part: str) -> list[tuple[str, str, object]]:
    """(row, key, paper value) of every Table 6 / §5.x value the paper states for this trained part."""
    return [(r["row"], r["key"], r["value"]) for r in t6["rows"] if part in r.get("for", ())]


def rows_for(cfg, pv: dict) -> tuple[str, list[tuple[str, str, object, object]]]:
    """(what trains, [(hyperparameter, key, paper value or None, reference value or None)]) for one recipe: the
    values the paper states for this part first, then the reference implementation's other values."""
    drafter, part = cfg.drafter.name, OmegaConf.select(cfg, "drafter.head.train.part", default=None)
    t6, ref = pv["dels_t6"], pv["dels_t6"]["reference"]["values"]
    if drafter == "dflash":
        d = pv["dflash_recipe"]
        rows = [(k.split(".")[-1], k, v, None) for k, v in d["values"].items()]
        rows.append(("sequences per optimizer step", "train.devices x train.accumulate",
                     None, d["specforge"]["effective_batch"]))
        return f"DFlash drafter ({cite(d)}; reference column: SpecForge's launcher)", rows
    if part == "fusion_weights":
        rows = [(label, key, v, None) for label, key, v in stated(t6, "fusion_weights")]
        rows += [(k.split(".")[-1], k, None, v) for k, v in ref.items() if k.startswith("train.")]
        return f"learned α/β on the {drafter} head ({cite(t6)})", rows
    if drafter == "domino_ft":          # §5.7: batch, accumulation, anchors, and the DeLS head's data and epochs
        dom = t6["domino_reference"]
        rows = [(label, key, v, dom["values"].get(key)) for label, key, v in stated(t6, "domino_ft")]
        keys = {r[1] for r in rows}
        rows += [(k.split(".")[-1], k, None, v) for k, v in dom["values"].items() if k not in keys]
        return f"Domino-FT head (paper: {cite(t6)}; reference: {dom['source']})", rows
    rows = [(label, key, v, ref.get(key)) for label, key, v in stated(t6, drafter)]
    # the Markov head is trained densely over every position: no anchors, no GRU, no loss decay over a block
    skip = ("num_anchors", "gru_hidden", "input_rank", "gamma") if drafter == "dels_markov" else ()
    keys = {r[1] for r in rows}
    rows += [(k.split(".")[-1], k, None, v) for k, v in ref.items() if k not in keys and not k.endswith(skip)]
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
        shown_key = "train.devices x train.num_nodes (x 1 per rank)" if key == BATCH else key
        lines.append(f"| {label} | `{shown_key}` | {NOT_STATED if paper is None else show(paper)} | {show(ref)} | "
                     f"{show(conf)} | {mark} |")
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
            "reference = the reference implementation's recipe; \"not stated\" = the paper states no value for "
            "this trained part; batch = sequences per forward step over all ranks (specexp's loader takes one per "
            "rank; `train.accumulate` adds more per optimizer step).\n\n"
            + "\n".join(table(n, pv) for n in names))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
