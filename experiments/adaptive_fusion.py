"""Adaptive DeLS-Spec fusion (issue #62, item 1): fit the `fusion=entropy` schedule and the `fusion=gate` gate on the
TUNE split, and choose the best fixed (α, β) on the same rows, for the exact eval-split comparison by task=replay.
Never imported by the library.

    python experiments/adaptive_fusion.py collect OUT.pt [overrides...]   # teacher-forced rows of the tune split
    python experiments/adaptive_fusion.py fit OUT.pt RESULT.json          # fixed grid, entropy schedule, gate

`collect` runs what `task=replay replay.fusion_grid...` runs (the same references, taps and teacher-forced block
rows, `SequentialDrafter.matches_all` with an `observe` hook) and keeps, per anchor and draft row, the features the
schedules read (H and max-prob of the DFlash row and of the local head's row) and the tokens that can beat the
reference token for some (α, β) in [0, BOX]² (at most M of them, the ones closest to winning): their logit, W z and
log-prior differences to the reference token. `fit` evaluates any weights on those rows in closed form: a row is a
hit when no candidate's fused score beats the reference's (ties to the lower id), an anchor accepts its leading run
of hits (within the round's budget), and each turn is walked as replay walks it (accept n, move n + 1), giving a
macro τ per benchmark family as the project computes it (mean over prompts per benchmark, then over benchmarks).
It is a fitting proxy: rows the teacher-forced pass never reached count as misses; the decision is task=replay's.
Training (Adam) maximises a smoothed expected acceptance (the reference's probability under the fused softmax over
the candidate set, multiplied along the block); the fit is chosen by the proxy's exact tune τ.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

BOX, M = 1.2, 48


def collect(out: str, overrides: list[str]) -> None:
    from specexp.api import compose
    from specexp.decoding.engine import drafts_per_round
    from specexp.eval import run
    from specexp.eval.references import turns_with_prompts
    from specexp.eval.replay import budget, build_references, cached_teacher_forced, replay_settings, tap_file
    from specexp.kernels.adaptive import entropy_maxp

    cfg, _ = compose(["task=replay", *overrides])
    sel = run.select(cfg)
    rp = replay_settings(sel.typed)
    m = run.build(cfg, sel)
    target, d, dc = m.target, m.drafter, m.dc
    refs = build_references(cfg, target, sel.samples, dc, rp, sel.typed.target)
    K = drafts_per_round(d, dc)
    lp = d.log_prior.float()
    turns = []
    for n_s, sample in enumerate(sel.samples):
        ref = refs.get(sample)
        for turn, prompt, tokens in turns_with_prompts(target, sample, ref):
            tf = cached_teacher_forced(target, prompt, tokens, d.tap_layers,
                                       tap_file(rp, refs, d.tap_layers, ref["key"], turn))
            L = len(tokens) - 1
            if L <= 0:
                continue
            ks = torch.tensor([budget(j, K, dc) for j in range(L)])
            feats = torch.zeros(L, K, 4)
            dl, dz, dp = (torch.zeros(L, K, M) for _ in range(3))
            valid = torch.zeros(L, K, M, dtype=torch.bool)
            lower = torch.zeros(L, K, M, dtype=torch.bool)
            seen = torch.zeros(L, K, dtype=torch.bool)
            hit0 = torch.zeros(L, dtype=torch.bool)

            def observe(i, c0, long, wz, truth, k, feats=feats, dl=dl, dz=dz, dp=dp, valid=valid, lower=lower,
                        seen=seen, hit0=hit0):
                n = len(truth)
                if i == 0:
                    hit0[c0: c0 + n] = long.argmax(-1) == truth
                    return
                hl, pl = entropy_maxp(long)
                hs, ps = entropy_maxp(wz)
                feats[c0: c0 + n, i] = torch.stack([hl, pl, hs, ps], -1)
                t = truth.clamp(min=0)
                rows = torch.arange(n)
                el, ez = long - long[rows, t, None], wz - wz[rows, t, None]
                ep = lp[None, :] - lp[t, None]
                reach = torch.maximum(torch.maximum(el, el + BOX * ez), torch.maximum(el - BOX * ep,
                                                                                      el + BOX * ez - BOX * ep))
                reach[rows, t] = -float("inf")
                top = reach.topk(M, -1)
                keep = top.values >= -1e-3
                idx = top.indices
                for name, src in ((dl, el), (dz, ez), (dp, ep)):
                    name[c0: c0 + n, i] = src.gather(1, idx)
                valid[c0: c0 + n, i] = keep & (truth >= 0)[:, None]
                lower[c0: c0 + n, i] = idx < t[:, None]
                seen[c0: c0 + n, i] = truth >= 0

            ids = torch.tensor(prompt + tokens)
            starts = len(prompt) + torch.arange(L)
            cells = [(0.0, 0.0), (0.6, 0.6), (1.0, 0.3)]
            d.matches_all(tf["taps"], ids, starts, ks, cells, observe=observe)
            turns.append({"benchmark": sample.benchmark, "id": sample.id, "ks": ks, "hit0": hit0, "seen": seen,
                          "feats": feats.half(), "dl": dl.half(), "dz": dz.half(), "dp": dp.half(),
                          "valid": valid, "lower": lower})
        print(f"{n_s + 1}/{len(sel.samples)} {sample.benchmark}", file=sys.stderr, flush=True)
        if (n_s + 1) % 5 == 0 or n_s + 1 == len(sel.samples):     # usable when stopped early
            torch.save({"K": K, "turns": turns, "overrides": overrides, "done": n_s + 1}, out)


# ------------------------------------------------------------------------------------------------- fitting
class Rows:
    """Every turn's rows concatenated: [N, K] (row 0 unused but hit0), [N, K, M] candidates."""

    def __init__(self, data: dict):
        t = data["turns"]
        self.K = data["K"]
        cat = lambda k: torch.cat([x[k] for x in t]).float() if k in ("feats", "dl", "dz", "dp") \
            else torch.cat([x[k] for x in t])                                                      # noqa: E731
        self.ks, self.hit0, self.seen = cat("ks"), cat("hit0"), cat("seen")
        self.feats, self.dl, self.dz, self.dp = cat("feats"), cat("dl"), cat("dz"), cat("dp")
        self.valid, self.lower = cat("valid"), cat("lower")
        self.lengths = [len(x["ks"]) for x in t]
        self.keys = [(x["benchmark"], x["id"]) for x in t]

    def hits(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """[N, K] hard hits at weights A, B [N, K] (row 0: DFlash's own)."""
        s = self.dl + A[..., None] * self.dz - B[..., None] * self.dp                              # [N, K, M]
        win = self.valid & ((s > 0) | ((s == 0) & self.lower))
        h = self.seen & ~win.any(-1)
        h[:, 0] = self.hit0
        return h

    def soft_hits(self, A, B, temp: float = 1.0):
        s = (self.dl + A[..., None] * self.dz - B[..., None] * self.dp) / temp
        s = torch.where(self.valid, s, torch.full_like(s, -1e4))
        p = 1 / (1 + torch.exp(s).sum(-1))
        p = torch.where(self.seen, p, torch.zeros_like(p))
        return torch.cat([self.hit0.float()[:, None], p[:, 1:]], 1)

    def accepted(self, h: torch.Tensor) -> torch.Tensor:
        """[N] leading run of hits within each anchor's budget."""
        k = torch.arange(self.K)[None, :] < self.ks[:, None]
        return (h & k).int().cumprod(1).sum(1)

    def expected(self, p: torch.Tensor) -> torch.Tensor:
        k = (torch.arange(self.K)[None, :] < self.ks[:, None]).float()
        return (p * k).cumprod(1).sum(1).mean()

    def tau(self, h: torch.Tensor) -> tuple[float, dict]:
        """Macro τ of the replay walk (per sample: mean accepted + 1 over its rounds; per benchmark the mean over
        samples; macro the mean over benchmarks), and per-sample τ."""
        acc = self.accepted(h).tolist()
        per: dict = {}
        o = 0
        for (bench, sid), L in zip(self.keys, self.lengths):
            j, rounds, total = 0, 0, 0
            while j < L:
                n = acc[o + j]
                rounds, total, j = rounds + 1, total + n + 1, j + n + 1
            r = per.setdefault((bench, sid), [0, 0])
            r[0] += total
            r[1] += rounds
            o += L
        by: dict = {}
        for (bench, _), (tot, rounds) in per.items():
            by.setdefault(bench, []).append(tot / rounds)
        return sum(sum(v) / len(v) for v in by.values()) / len(by), per


def entropy_weights(p, feats):
    s = torch.sigmoid((feats[..., 0] - p[4]) / p[5].abs().clamp(min=0.05))
    return p[0] + p[1] * s, p[2] + p[3] * s


def gate_weights(p, feats, amax=1.2, bmax=1.2):
    return (amax * torch.sigmoid(p[4] + (feats * p[:4]).sum(-1)),
            bmax * torch.sigmoid(p[9] + (feats * p[5:9]).sum(-1)))


def train(rows: Rows, fn, p0: list[float], steps: int = 300, lr: float = 0.03) -> torch.Tensor:
    p = torch.tensor(p0, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr)
    for _ in range(steps):
        A, B = fn(p, rows.feats)
        loss = -rows.expected(rows.soft_hits(A, B))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return p.detach()


def fit(path: str, out: str) -> None:
    rows = Rows(torch.load(path, weights_only=False))
    shape = rows.ks.shape + (rows.K,)
    res = {"rows": int(rows.ks.numel()), "samples": len({k for k in rows.keys})}
    grid = {}
    for a in [x / 10 for x in range(11)]:
        for b in [x / 10 for x in range(11)]:
            grid[(a, b)] = rows.tau(rows.hits(torch.full(shape, a), torch.full(shape, b)))[0]
    best = max(grid, key=lambda ab: (grid[ab], -ab[0], -ab[1]))
    res["fixed"] = {"alpha": best[0], "beta": best[1], "tune_tau_proxy": grid[best],
                    "tau_0.6_0.6": grid[(0.6, 0.6)], "tau_0.3_0.3": grid[(0.3, 0.3)]}
    print("fixed best", best, grid[best], file=sys.stderr)
    hq = torch.quantile(rows.feats[rows.seen][:, 0], torch.tensor([0.25, 0.5, 0.75])).tolist()
    cands = []
    for h0 in hq:
        for a1, b1 in ((0.4, 0.0), (-0.4, 0.0), (0.0, 0.4), (0.0, -0.4), (0.4, 0.4)):
            p = train(rows, entropy_weights, [best[0] - a1 / 2, a1, best[1] - b1 / 2, b1, h0, 1.0])
            A, B = entropy_weights(p, rows.feats)
            cands.append((rows.tau(rows.hits(A, B))[0], p.tolist()))
            print("entropy", cands[-1], file=sys.stderr)
    tau_e, pe = max(cands)
    pe[5] = max(abs(pe[5]), 0.05)
    res["entropy"] = {"tune_tau_proxy": tau_e, "schedule": dict(zip(["a0", "a1", "b0", "b1", "h0", "width"], pe))}
    g0 = lambda v: float(torch.logit(torch.tensor(v / 1.2)))        # noqa: E731
    gcands = []
    for seed in range(3):
        init = [0.0] * 4 + [g0(max(best[0], 0.05))] + [0.0] * 4 + [g0(max(best[1], 0.05))]
        if seed:
            init = (torch.tensor(init) + torch.randn(10, generator=torch.Generator().manual_seed(seed)) * 0.2).tolist()
        p = train(rows, gate_weights, init)
        A, B = gate_weights(p, rows.feats)
        gcands.append((rows.tau(rows.hits(A, B))[0], p.tolist()))
        print("gate", gcands[-1], file=sys.stderr)
    tau_g, pg = max(gcands)
    res["gate"] = {"tune_tau_proxy": tau_g, "schedule": {"w_alpha": pg[:4], "c_alpha": pg[4], "alpha_max": 1.2,
                                                         "w_beta": pg[5:9], "c_beta": pg[9], "beta_max": 1.2}}
    Path(out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "collect":
        collect(args[0], args[1:])
    elif cmd == "fit":
        fit(args[0], args[1])
    else:
        sys.exit(__doc__)
