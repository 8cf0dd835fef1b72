"""The claims table of the mini setting: each claim of the DeLS-Spec paper and the DEdit abstract, measured on
SmolLM2-135M with the committed mini drafters, with its effect, 95% CI and a verdict. Regenerated from kept
summaries only (never imported by the library):

    python experiments/mini_claims.py                      # reads experiments/results/mini_claims/, writes
                                                           # experiments/results/mini_claims.md

Inputs, under `--root` (default experiments/results/mini_claims/; every run directory holds what task=replay or
task=eval writes, samples gzipped):
  grid/a<α>_b<β>/      the α/β grid of the DeLS-RNN head on the TUNE split (task=replay replay.fusion_grid...);
                       kept as one grid/cells.tar.xz (experiments/archive.py, read as the directories)
  grid_markov/...      the same for the Markov head (optional: RNN > Markov then uses each head's best cell)
  eval/<name>/         replays on the EVAL split (50 prompts per benchmark, all 30 of AIME25, 128 new tokens):
                       dflash, dflash_continued (the control), dels_rnn, dels_markov (at the weights chosen
                       on tune), dels_rnn-beta0 (the chosen α, β = 0), dels_rnn-learned (fusion=learned),
                       domino_ft, dedit, dedit-causal, dedit-plain_mix, dedit-E<n> (edit passes),
                       dedit-W<n> (window width)
  online/<name>/       one online task=eval run per drafter on GSM8K (CPU speedup column)
  cards/<name>.json    training cards (train_seconds, peak memory) of dels_rnn and domino_ft
  xl/                  the same layout beside the 1.0M-token backbone (checkpoints/mini/smollm2_135m-dflash-b8-xl):
                       grid/, grid_markov/, eval/{dflash,dels_rnn,dels_rnn-beta0,dels_rnn-a0.3_b0.3,dels_markov};
                       the same heads, α/β chosen again on its tune split; a second table of the claims it decides
The commands that produce them are in the folder's README. A claim whose inputs are missing reads "not measured"
and names them; nothing is filled in by hand.

Verdicts, from the 95% paired-bootstrap CI of the effect (prompts resampled; eval/metrics.py, the same code as
task=compare): "A > B" is reproduced when the CI lies above 0, contradicted when it lies below 0, inconclusive
otherwise; "A ≥ B" is reproduced when the CI's lower end is above −MARGIN (0.02 τ), contradicted when its upper end is
below 0; "on every benchmark" needs every benchmark's CI above 0 (contradicted by any below 0). τ includes the
bonus token. Family effects are the unweighted means over a family's benchmarks (benchmarks.families()).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import archive
import torch

from specexp import benchmarks
from specexp.eval.compare import load_records
from specexp.eval.metrics import paired_replicates, percentiles95

ROOT = Path(__file__).resolve().parent / "results" / "mini_claims"
MARGIN = 0.02                      # τ: "A ≥ B" holds when A is not more than this below B (95% CI)
NAMES = {"dflash": "DFlash", "dels_rnn": "DeLS-RNN", "dels_markov": "DeLS-Markov", "domino_ft": "Domino-FT",
         "dedit": "DEdit", "eagle3": "EAGLE-3"}


class Missing(Exception):
    """An input of a claim is not there: the claim is not measured."""


# ------------------------------------------------------------------------------------------------ inputs
class Inputs:
    def __init__(self, root: Path, evals: Path | None = None):
        self.root, self.evals = root, evals          # evals: a folder of eval runs standing in for root/eval
        self._cache: dict[Path, dict[str, list[dict]]] = {}

    def path(self, rel: str) -> Path:
        if self.evals is not None and rel.startswith("eval/"):
            return self.evals / rel.removeprefix("eval/")
        d = self.root / rel
        if not d.exists() and (d.parent / archive.ARCHIVE).exists():      # a cell of an archived grid
            return archive.cells(d.parent) / d.name
        return d

    def run(self, rel: str) -> dict[str, list[dict]]:
        """A run's records grouped by benchmark (in the run's benchmark order)."""
        d = self.path(rel)
        if not (d / "summary.json").exists():
            raise Missing(rel)
        if d not in self._cache:
            by: dict[str, list[dict]] = {}
            for r in load_records(d):
                by.setdefault(r["benchmark"], []).append(r)
            self._cache[d] = by
        return self._cache[d]

    def summary(self, rel: str) -> dict:
        p = self.path(rel) / "summary.json"
        if not p.exists():
            raise Missing(rel)
        return json.loads(p.read_text())

    def card(self, name: str) -> dict:
        p = self.root / "cards" / f"{name}.json"
        if self.evals is not None or not p.exists():  # the kept cards are the current runs', not the stand-ins'
            raise Missing(f"cards/{name}.json")
        return json.loads(p.read_text())

    def grid(self, rel: str) -> dict[tuple[float, float], str]:
        """(α, β) -> the cell's directory (relative), from each cell's config.yaml."""
        import yaml

        d = self.root / rel
        if not d.is_dir() or self.evals is not None:      # another set of eval runs: not this grid's drafters
            raise Missing(rel)
        out = {}
        for c in sorted(archive.cells(d).iterdir()):
            if (c / "summary.json").exists() and (c / "config.yaml").exists():
                f = yaml.safe_load((c / "config.yaml").read_text())["fusion"]
                out[(float(f["alpha"]), float(f["beta"]))] = f"{rel}/{c.name}"
        if not out:
            raise Missing(rel)
        return out

    def best_cell(self, rel: str) -> tuple[tuple[float, float], float]:
        cells = self.grid(rel)
        taus = {ab: self.summary(p)["macro"]["tau"] for ab, p in cells.items()}
        best = max(taus, key=lambda ab: (taus[ab], -ab[0], -ab[1]))          # ties: the smaller weights
        return best, taus[best]


# ------------------------------------------------------------------------------------------------ effects
def paired(a: dict, b: dict, names: list[str] | None = None):
    """Δτ = τ_A − τ_B per benchmark, and the bootstrap replicates of each (aligned across calls: same seed,
    same prompts)."""
    if names is not None:
        a, b = {n: a[n] for n in names if n in a}, {n: b[n] for n in names if n in b}
    return paired_replicates(a, b)


def mean_reps(per: dict, names: list[str]):
    rows = [per[n] for n in names if n in per and per[n][1] is not None]
    if not rows:
        raise Missing("no common prompts")
    return sum(r[0]["delta"] for r in rows) / len(rows), torch.stack([r[1] for r in rows]).mean(0)


def macro_delta(x: Inputs, a: str, b: str) -> tuple[float, list[float]]:
    """Macro Δτ = τ_a − τ_b of two runs over their common prompts, with its paired-bootstrap 95% CI."""
    per = paired(x.run(a), x.run(b))
    d, reps = mean_reps(per, list(per))
    return d, percentiles95(reps)


def fmt(x: float, ci) -> str:
    return f"{x:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"{x:+.3f}"


def verdict_gt(ci) -> str:
    return "reproduced" if ci[0] > 0 else "contradicted" if ci[1] < 0 else "inconclusive"


def verdict_ge(ci) -> str:
    return "reproduced" if ci[0] > -MARGIN else "contradicted" if ci[1] < 0 else "inconclusive"


def families(present) -> dict[str, list[str]]:
    return {f: [n for n in names if n in present] for f, names in benchmarks.families().items()}


# ------------------------------------------------------------------------------------------------ claims
def c_dels_every_benchmark(x: Inputs):
    per = paired(x.run("eval/dels_rnn"), x.run("eval/dflash"))
    cis = {n: r[0]["delta_ci95"] for n, r in per.items() if r[0]["delta_ci95"]}
    worst = min(cis, key=lambda n: cis[n][0])
    macro, reps = mean_reps(per, list(per))
    above = sum(ci[0] > 0 for ci in cis.values())
    v = "reproduced" if above == len(cis) else "contradicted" if any(ci[1] < 0 for ci in cis.values()) \
        else "inconclusive"
    return (f"macro Δτ {fmt(macro, percentiles95(reps))}; CI above 0 on {above} of {len(cis)} benchmarks "
            f"(weakest: {worst} {fmt(per[worst][0]['delta'], cis[worst])})", v)


def c_gain_math_code_over_chat(x: Inputs):
    per = paired(x.run("eval/dels_rnn"), x.run("eval/dflash"))
    fam = families(per)
    mc, reps_mc = mean_reps(per, fam["math"] + fam["code"])
    ch, reps_ch = mean_reps(per, fam["chat"])
    ci = percentiles95(reps_mc - reps_ch)
    return (f"Δτ math+code {mc:+.3f} − chat {ch:+.3f} = {fmt(mc - ch, ci)}", verdict_gt(ci))


def c_best_weights(x: Inputs):
    """The best cell on the tuning split; whether α = β = 0.3 is worse is measured on the evaluation split when
    both runs exist there (`eval/dels_rnn` at the chosen cell, `eval/dels_rnn-a0.3_b0.3`): the tuning split's own
    difference is biased towards the cell chosen on it."""
    (a, b), tau = x.best_cell("grid")
    near = abs(a - 0.3) <= 0.1 + 1e-9 and abs(b - 0.3) <= 0.1 + 1e-9
    head = f"best on tune: α = {a:g}, β = {b:g} (macro τ {tau:.3f})"
    if near:
        return head, "reproduced"
    try:
        (d, ci), split = macro_delta(x, "eval/dels_rnn", "eval/dels_rnn-a0.3_b0.3"), "eval"
    except Missing:
        cells = x.grid("grid")
        if (0.3, 0.3) not in cells:
            raise Missing("grid cell α = β = 0.3") from None
        (d, ci), split = macro_delta(x, cells[(a, b)], cells[(0.3, 0.3)]), "tune, selection-biased"
    v = "contradicted" if ci[0] > 0 and split == "eval" else "inconclusive"
    return f"{head}; (α, β) = ({a:g}, {b:g}) − (0.3, 0.3) on {split}: macro Δτ {fmt(d, ci)}", v


def c_beta_helps(x: Inputs):
    d, ci = macro_delta(x, "eval/dels_rnn", "eval/dels_rnn-beta0")
    return f"chosen (α, β) − (α, 0), eval split: macro Δτ {fmt(d, ci)}", verdict_gt(ci)


def c_rnn_over_markov(x: Inputs):
    d, ci = macro_delta(x, "eval/dels_rnn", "eval/dels_markov")
    return f"macro Δτ RNN − Markov {fmt(d, ci)}", verdict_gt(ci)


def c_domino_recovery(x: Inputs):
    dflash = x.run("eval/dflash")
    g_dels, r_dels = mean_reps(paired(x.run("eval/dels_rnn"), dflash), list(dflash))
    g_dom, r_dom = mean_reps(paired(x.run("eval/domino_ft"), dflash), list(dflash))
    ratio = r_dels / r_dom
    ci = percentiles95(ratio)
    v = "reproduced" if ci[0] >= 0.75 else "contradicted" if ci[1] < 0.75 else "inconclusive"
    return (f"(τ_DeLS − τ_DFlash) / (τ_Domino − τ_DFlash) = {g_dels:+.3f} / {g_dom:+.3f} = {g_dels / g_dom:.2f} "
            f"[{ci[0]:.2f}, {ci[1]:.2f}]", v)


def c_fixed_ge_learned(x: Inputs):
    d, ci = macro_delta(x, "eval/dels_rnn", "eval/dels_rnn-learned")
    return f"macro Δτ fixed − learned {fmt(d, ci)}", verdict_ge(ci)


def anchored_blocks(card: dict) -> int:
    """Anchored blocks one training run saw: sequences x epochs x anchors per sequence (the card's recipe)."""
    r = card["facts"]["recipe"]
    return int(card["sequences"]) * int(r["epochs"]) * int(r["num_anchors"])


def c_head_cheaper(x: Inputs):
    """Training time per anchored block, so that a run with fewer anchors per sequence (a CPU-time deviation
    a card states) is not counted as cheaper for it; both raw times are printed."""
    head, dom = x.card("dels_rnn"), x.card("domino_ft")
    bh, bd = anchored_blocks(head), anchored_blocks(dom)
    ratio = (dom["train_seconds"] / bd) / (head["train_seconds"] / bh)
    v = "reproduced" if ratio >= 10 else "contradicted"
    return (f"training seconds per anchored block, Domino-FT / RNN head = ({dom['train_seconds']:.0f} s / {bd:,}) / "
            f"({head['train_seconds']:.0f} s / {bh:,}) = {ratio:.1f}× (one run each, no CI; CPU timings)", v)


def _trend(x: Inputs, prefix: str, what: str):
    runs = sorted((int(p.name.removeprefix(f"dedit-{prefix}")), f"eval/{p.name}")
                  for p in x.path("eval").glob(f"dedit-{prefix}*") if (p / "summary.json").exists())
    if len(runs) < 2:
        raise Missing(f"eval/dedit-{prefix}<n> (two values at least)")
    (lo, a), (hi, b) = runs[0], runs[-1]
    d, ci = macro_delta(x, b, a)
    taus = ", ".join(f"{n}: {x.summary(r)['macro']['tau']:.3f}" for n, r in runs)
    return f"macro τ by {what} ({taus}); {what} {hi} − {lo}: {fmt(d, ci)}", verdict_gt(ci)


def c_dedit_passes(x: Inputs):
    return _trend(x, "E", "edit passes E")


def c_dedit_window(x: Inputs):
    return _trend(x, "W", "window W")


def _harmful(records: dict[str, list[dict]]):
    """Per prompt (benchmark, id): harmful, edited and all round counts, from the per-round `edit_outcomes` DEdit's
    metrics record under greedy decoding (drafters/dedit.py: edit_outcome)."""
    out = {}
    for recs in records.values():
        for r in recs:
            o = r.get("edit_outcomes") or []
            h, e, n = out.get((r["benchmark"], r["id"]), (0, 0, 0))
            out[(r["benchmark"], r["id"])] = (h + o.count("harmful"), e + sum(x != "unedited" for x in o),
                                              n + len(o))
    return out


def c_proposal_mix(x: Inputs):
    """"Halves harmful edits": harmful edits per round (the abstract counts edits that shorten the accepted prefix,
    so editing less often counts), ProposalMix / plain mix, with a prompt-bootstrap CI; the harmful share of the
    edited rounds is printed beside it."""
    mix, plain = _harmful(x.run("eval/dedit")), _harmful(x.run("eval/dedit-plain_mix"))
    keys = sorted(mix.keys() & plain.keys())
    hm, em, nm, hp, ep, np_ = (torch.tensor([d[k][i] for k in keys], dtype=torch.float64)
                               for d in (mix, plain) for i in (0, 1, 2))
    if float(em.sum()) == 0 or float(ep.sum()) == 0 or float(hp.sum()) == 0:
        raise Missing("edited rounds with harmful edits in both runs")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(keys), (2000, len(keys)), generator=g)

    def ratio(num_m, den_m, num_p, den_p):
        point = float((num_m.sum() / den_m.sum()) / (num_p.sum() / den_p.sum()))
        reps = (num_m[idx].sum(1) / den_m[idx].sum(1)) / (num_p[idx].sum(1) / den_p[idx].sum(1))
        return point, percentiles95(reps)

    (pr, cr), (pe, ce) = ratio(hm, nm, hp, np_), ratio(hm, em, hp, ep)
    v = "reproduced" if cr[1] <= 0.5 else "contradicted" if cr[0] > 0.5 else "inconclusive"
    return (f"harmful edits per round, ProposalMix / plain mix = {int(hm.sum())} / {int(nm.sum())} ÷ "
            f"{int(hp.sum())} / {int(np_.sum())} = {pr:.2f} [{cr[0]:.2f}, {cr[1]:.2f}]; per edited round "
            f"{float(hm.sum() / em.sum()):.3f} / {float(hp.sum() / ep.sum()):.3f} = {pe:.2f} [{ce[0]:.2f}, "
            f"{ce[1]:.2f}] (ProposalMix edits {int(em.sum())} rounds, plain mix {int(ep.sum())})", v)


def c_causal_loses(x: Inputs):
    per = paired(x.run("eval/dedit"), x.run("eval/dedit-causal"))
    d, reps = mean_reps(per, list(per))
    ci = percentiles95(reps)
    base = x.summary("eval/dflash")["benchmarks"]
    fam = families(per)
    ftau = {f: sum(base[n]["tau"] for n in ns) / len(ns) for f, ns in fam.items() if ns}
    easy, hard = max(ftau, key=ftau.get), min(ftau, key=ftau.get)
    de, re_ = mean_reps(per, fam[easy])
    dh, rh = mean_reps(per, fam[hard])
    ci2 = percentiles95(re_ - rh)
    v = verdict_gt(ci) if verdict_gt(ci) != "reproduced" else ("reproduced" if ci2[0] > 0 else "inconclusive")
    return (f"bidirectional − causal: macro {fmt(d, ci)}; on the most predictable family ({easy}) − the least "
            f"({hard}): {fmt(de - dh, ci2)}", v)


def c_dedit_highest(x: Inputs):
    dedit = x.run("eval/dedit")
    others = {}
    for n in ("dflash", "dels_rnn", "dels_markov", "domino_ft"):
        try:
            others[n] = x.summary(f"eval/{n}")["macro"]["tau"]
        except Missing:
            pass
    if not others:
        raise Missing("eval runs of the other drafters")
    best = max(others, key=others.get)
    d, reps = mean_reps(paired(dedit, x.run(f"eval/{best}")), list(dedit))
    ci = percentiles95(reps)
    return f"DEdit − the best other ({NAMES[best]}, macro τ {others[best]:.3f}): {fmt(d, ci)}", verdict_gt(ci)


CLAIMS = [  # (source, claim, function)
    ("DeLS-Spec T1", "DeLS-Spec beats DFlash on every benchmark", c_dels_every_benchmark),
    ("DeLS-Spec T1", "the gains are larger on math and code than on chat", c_gain_math_code_over_chat),
    ("DeLS-Spec Fig. 2", "the best fusion weights are α ≈ β ≈ 0.3", c_best_weights),
    ("DeLS-Spec Fig. 2", "β > 0 helps once α is set", c_beta_helps),
    ("DeLS-Spec T1", "the RNN head beats the Markov head", c_rnn_over_markov),
    ("DeLS-Spec T3", "DeLS-Spec recovers ≥ 75 % of Domino-FT's gain over DFlash", c_domino_recovery),
    ("DeLS-Spec T4", "fixed α/β are at least as good as learned ones", c_fixed_ge_learned),
    ("DeLS-Spec T5", "the local head is ≥ 10× cheaper to train than Domino-FT", c_head_cheaper),
    ("DEdit abstract", "DEdit's τ rises with the number of edit passes", c_dedit_passes),
    ("DEdit abstract", "DEdit's τ rises with the window width", c_dedit_window),
    ("DEdit abstract", "ProposalMix halves harmful edits", c_proposal_mix),
    ("DEdit abstract", "a causal editor loses, most on predictable text", c_causal_loses),
    ("DEdit abstract", "DEdit has the highest τ", c_dedit_highest),
]


def speed_table(x: Inputs) -> list[str]:
    rows = []
    for d in sorted((x.root / "online").glob("*")) if (x.root / "online").is_dir() else []:
        if (d / "summary.json").exists():
            s = json.loads((d / "summary.json").read_text())
            for name, b in s["benchmarks"].items():
                sp = "–" if b.get("speedup") is None else f"{b['speedup']:.2f}×"
                rows.append(f"| {NAMES.get(s['drafter'], s['drafter'])} | {name} | {b['num_samples']} | "
                            f"{b['tau']:.3f} | {sp} |")
    if not rows:
        return ["No online runs kept yet (`online/<name>/`)."]
    return ["| drafter | benchmark | prompts | τ | CPU speedup vs AR |", "|---|---|---:|---:|---:|", *rows]


def tau_table(x: Inputs) -> list[str]:
    rows = []
    ev = x.path("eval/")
    # the DEdit variants after DEdit (E2 is eval/dedit, the default passes, under a second name)
    variants = sorted(p.name for p in ev.glob("dedit-*") if p.name != "dedit-E2") if ev.is_dir() else []
    for name in ("dflash", "dflash_continued", "dels_rnn", "dels_markov", "dels_rnn-beta0", "dels_rnn-a0.3_b0.3",
                 "dels_rnn-learned", "domino_ft", "dedit", *variants):
        try:
            s = x.summary(f"eval/{name}")
        except Missing:
            continue
        ci = s["macro"].get("tau_ci95")
        fam = {f: [s["benchmarks"][n]["tau"] for n in ns if n in s["benchmarks"]]
               for f, ns in benchmarks.families().items()}
        cells = " | ".join(f"{sum(v) / len(v):.3f}" if v else "–" for v in fam.values())
        rows.append(f"| {name} | {s['macro']['tau']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {cells} |")
    if not rows:
        return []
    return ["| run (eval split) | macro τ [95% CI] | " + " | ".join(benchmarks.families()) + " |",
            "|---|---|" + "---:|" * len(benchmarks.families()), *rows]


CONTROLS = [  # (A, B, what A − B tells)
    ("dflash_continued", "dflash", "what the extra steps alone buy DFlash (same data, one epoch, DFlash loss only)"),
    ("dedit", "dflash_continued", "DEdit's training beyond those extra steps (same data, same steps)"),
    ("domino_ft", "dflash_continued", "Domino-FT beyond more DFlash training (its own anchors: its card)"),
]


def controls_table(x: Inputs) -> list[str]:
    """The continued-DFlash control: more training of the backbone with its own loss, against what the drafters
    that fine-tune it (DEdit, Domino-FT) gain."""
    rows = []
    for a, b, what in CONTROLS:
        try:
            d, ci = macro_delta(x, f"eval/{a}", f"eval/{b}")
        except Missing:
            continue
        rows.append(f"| {a} − {b} | {fmt(d, ci)} | {verdict_gt(ci)} | {what} |")
    if not rows:
        return []
    return ["| A − B (eval split) | macro Δτ [95% CI] | verdict of A > B | what it tells |", "|---|---|---|---|", *rows]


KEPT = ("summary.json", "summary.md", "config.yaml", "run.json")


def collect(src: Path, root: Path) -> None:
    """Copy the finished runs under `src` (src/eval/<name>, src/grid/<cell>, src/online/<name>, ...: any directory
    with a summary.json two levels down) into `root`, samples gzipped (mtime 0: the archive is reproducible) without
    their texts and token ids (text_sha256 stays); the grid cells without run.json / summary.md (what τ and paired
    comparisons read is kept), each grid packed into one cells.tar.xz (experiments/archive.py). Also the
    grid's own files (grid.md, the Figure 2 panels of experiments/dels_alpha_beta.py)."""
    import gzip
    import shutil

    for summary in sorted(src.glob("*/*/summary.json")):
        run = summary.parent
        dst = root / run.relative_to(src)
        dst.mkdir(parents=True, exist_ok=True)
        grid = run.parent.name.startswith("grid")
        for name in KEPT:
            if (run / name).exists() and not (grid and name in ("run.json", "summary.md")):
                shutil.copy2(run / name, dst / name)
        # the per-turn accept lengths, not the texts and tokens (a replay's are its references', kept once beside them)
        lines = [json.dumps({k: v for k, v in r.items() if k not in ("text", "tokens")}) for r in load_records(run)]
        with gzip.GzipFile(dst / "samples.jsonl.gz", "wb", mtime=0) as g:
            g.write("".join(x + "\n" for x in lines).encode())
        print(f"collected {run} -> {dst}")
    for grid in sorted(src.glob("grid*")):
        for name in ("grid.md", "alpha_beta.md", "alpha_beta.png"):
            if (grid / name).exists():
                (root / grid.name).mkdir(parents=True, exist_ok=True)
                shutil.copy2(grid / name, root / grid.name / name)
        if (root / grid.name).is_dir() and any((c / "summary.json").exists() for c in (root / grid.name).iterdir()):
            print(f"packed {root / grid.name / archive.ARCHIVE}: {archive.pack(root / grid.name):,} bytes")


def decidable(x: Inputs, title: str, blurb: str) -> list[str]:
    """A section of the claims that another set of runs can decide (the others are left out)."""
    lines = [title, "", blurb, "", "| source | claim | measured effect [95% CI] | verdict |", "|---|---|---|---|"]
    for source, claim, fn in CLAIMS:
        try:
            effect, verdict = fn(x)
        except Missing:
            continue
        lines.append(f"| {source} | {claim} | {effect} | {verdict} |")
    taus = tau_table(x)
    return lines + ["", *(["τ of these runs (eval split):", "", *taus, ""] if taus else [])]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collect", type=Path, default=None,
                    help="first copy the finished runs under this directory (e.g. runs/claims) into --root")
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--out", type=Path, default=ROOT.parent / "mini_claims.md")
    ap.add_argument("--previous", type=Path, default=ROOT.parent / "replay_mini" / "replay50",
                    help="eval-split replays of the previous mini drafters (38k-token backbone, α = β = 0.3 not "
                         "tuned), for a second table of the claims they can decide")
    args = ap.parse_args(argv)
    if args.collect is not None:
        collect(args.collect, args.root)
    x = Inputs(args.root)
    lines = ["# Mini claims: the papers' claims measured on SmolLM2-135M", "",
             "Regenerated by `python experiments/mini_claims.py` from the summaries kept in `mini_claims/` (its "
             "README gives the command of every input). τ includes the bonus token; effects are paired over "
             "identical prompts with 95% bootstrap CIs; α/β were chosen on the tune split and every effect is "
             "measured on the eval split. Verdict rules: the script's docstring.", "",
             "| source | claim | measured effect [95% CI] | verdict |", "|---|---|---|---|"]
    counts: dict[str, int] = {}
    for source, claim, fn in CLAIMS:
        try:
            effect, verdict = fn(x)
        except Missing as e:
            effect, verdict = f"input missing: `{e}`", "not measured"
        counts[verdict] = counts.get(verdict, 0) + 1
        lines.append(f"| {source} | {claim} | {effect} | {verdict} |")
    lines += ["", "Verdicts: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())), ""]
    if (args.root / "xl").is_dir():
        lines += decidable(Inputs(args.root / "xl"), "## The same claims beside the 1.0M-token backbone (`xl/`)",
                           "`checkpoints/mini/smollm2_135m-dflash-b8-xl` (the last point of the data-scaling curve) "
                           "with the same committed heads, α/β chosen again on the tune split, the same eval prompts. "
                           "Claims these runs cannot decide are left out.")
    if args.previous is not None and args.previous.is_dir():
        lines += decidable(Inputs(args.root, evals=args.previous),
                           f"## The same claims on the previous mini drafters (`{args.previous.name}`)",
                           "The 38k-token DFlash backbone with heads, Domino-FT and DEdit trained beside it; α = β = "
                           "0.3 throughout (not chosen on a tuning split), 50 eval prompts per benchmark (all 30 of "
                           "AIME25), 128 new tokens. Claims these runs cannot decide are left out.")
    taus = tau_table(x)
    if taus:
        lines += ["## τ of the runs (eval split, family = unweighted mean of its benchmarks)", "", *taus, ""]
    ctrl = controls_table(x)
    if ctrl:
        lines += ["## The continued-DFlash control", "", *ctrl, ""]
    lines += ["## Online CPU speedup (one run per drafter; the load each was timed under: mini_claims/README.md)", "",
              *speed_table(x), ""]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
