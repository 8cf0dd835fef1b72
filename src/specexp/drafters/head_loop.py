"""The head loop: the sequential loop shared by the drafters that correct a DFlash block draft by draft
(DeLS-Spec's local heads, Domino-FT's prefix GRU). One block of K drafts:

    d1      = pick(long_1)                                          DFlash's row alone
    state   = begin(x, d1)
    for i = 1..K-1:
        z_i     = feature(x, state, i)                              [r]  a rank-r state
        d_{i+1} = pick(long_{i+1} + alpha_i * W_out z_i - beta_i * log_prior)
        state   = advance(state, d_{i+1})

`x` holds the block's inputs (`long` `[k, V]` and whatever the subclass reads: DFlash hidden rows, the anchor
token); `pick` is argmax (greedy, protocol A) or Gumbel-max with the drafted token's probability (protocol B),
through the Triton fusion kernel or its torch reference (kernels/fusion.py). The loop writes into
preallocated buffers and never synchronises with the host, so on CUDA the whole block is captured once per
temperature as a graph (kernels/graphs.py) and replayed for every block.
"""
from __future__ import annotations

import torch

from ..checkpoints import resolve_init
from ..errors import check
from ..kernels.adaptive import Schedule
from ..kernels.fusion import TritonFusion, fuse_torch, fused_logits, gumbel, pick_backend
from .base import LazyDist, OnBackbone, Proposal, Sampling, sequence_at
from .block_tree import Candidates, grow, top


def random_init(module: torch.nn.Module, seed: int, std: float) -> torch.nn.Module:
    """Every weight N(0, std), zero-initialised up-projections too (a random head must have an opinion), from a
    private generator (the global RNG is left alone)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return module


def matvec(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`w [O, I]` applied to one vector `x [I]` (propose: the matrix-vector product) or to a batch of them `x [a, I]`
    (propose_all: the blocks still alive at a row, one matrix product) → `[O]` | `[a, O]`."""
    return w @ x if x.dim() == 1 else x @ w.T


def gru_step(w_ih: torch.Tensor, w_hh: torch.Tensor, x: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
    """One bias-free torch.nn.GRU step (gates r, z, n) on `x [I]` or `[a, I]`; h = None is the zero state."""
    gi = matvec(w_ih, x)                                                                # [..., 3G]
    gh = torch.zeros_like(gi) if h is None else matvec(w_hh, h)                         # [..., 3G]
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n if h is None else (1 - z) * n + z * h                          # [..., G]


def head_init(cfg, target, what: str, train_cmd: str) -> str:
    """`drafter.head.init` resolved to random | checkpoint. auto = random next to a random DFlash backbone (tests,
    smoke runs), else the head checkpoint, which must then be set: a random head beside a trained backbone would
    measure nothing, so that is an error rather than a silent default."""
    init, head = cfg.head.init, cfg.head.checkpoint
    if init != "auto":
        return resolve_init(init, head, "drafter.head", f"(train one with {train_cmd})")
    random_backbone = resolve_init(cfg.init, cfg.checkpoint) == "random"
    check(bool(head) or random_backbone,
          f"no {what} head for target {target.name}: train one with {train_cmd} and pass "
          f"drafter.head.checkpoint=DIR (drafter.head.init=random runs a random head: τ then means nothing)")
    return "random" if random_backbone else "checkpoint"


def _grid_hits(long: torch.Tensor, wz: torch.Tensor, log_prior: torch.Tensor, truth: torch.Tensor,
               cells: list[tuple[float, float]] | None = None,
               weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Whether the greedy fused draft (`fused_logits` with `W z` given as `wz` `[n, V]`) equals `truth` `[n]` for
    every cell, `[C, n]`, without the full argmax per cell. A cell is a pair (alpha, beta) for every row (`cells`),
    or `weights` = (alpha, beta) `[C, n]`, one pair per cell and row (adaptive weights, kernels/adaptive.py). Token
    v beats the truth t at (alpha, beta) when the linear function
    (long_v - long_t) + alpha (wz_v - wz_t) - beta (lp_v - lp_t) is >= 0; over the rectangle spanned by all the
    weights it is largest at a corner, so only the tokens whose largest corner value reaches -slack (a margin far
    above float rounding) can win anywhere, and the exact fused values (`(long - beta lp) + alpha wz`, elementwise,
    the order of fused_logits; a term at weight 0 adds an exact 0) are compared over those candidates only. Ties
    go to the lowest token id, as torch.argmax."""
    if weights is None:
        a = torch.tensor([c[0] for c in cells], dtype=long.dtype, device=long.device)[:, None].expand(-1, len(truth))
        b = torch.tensor([c[1] for c in cells], dtype=long.dtype, device=long.device)[:, None].expand(-1, len(truth))
    else:
        a, b = (w.to(dtype=long.dtype) for w in weights)                                            # [C, n]
    t = truth.clamp(min=0)                                                                          # [n]
    rows = torch.arange(len(t), device=long.device)

    def fused(lg, z, p, ca, cb):       # lg, z [m] (or [n]), p [m]; ca, cb [C] (or [C, n]) -> [C, m]
        if ca.dim() == 1:
            ca, cb = ca[:, None], cb[:, None]
        return (lg.unsqueeze(0) - cb * p.unsqueeze(0)) + ca * z.unsqueeze(0)

    at_truth = fused(long[rows, t], wz[rows, t], log_prior[t], a, b)                                # [C, n]
    slack = 1e-3 * (1 + at_truth.abs().max(0).values)                                               # [n]
    dl, dz = long - long[rows, t, None], wz - wz[rows, t, None]                                     # [n, V]
    dp = log_prior[None, :] - log_prior[t, None]                                                    # [n, V]
    reach = None
    for ca in {float(a.min()), float(a.max())}:
        for cb in {float(b.min()), float(b.max())}:
            corner = dl + ca * dz - cb * dp                                                         # [n, V]
            reach = corner if reach is None else torch.maximum(reach, corner)
    hits = torch.zeros(a.shape, dtype=torch.bool, device=long.device)
    for r in range(len(t)):
        if truth[r] < 0:            # past the sequence's end: nothing to match
            continue
        cand = torch.nonzero(reach[r] >= -slack[r])[:, 0]                                           # [m] ascending
        best = cand[fused(long[r, cand], wz[r, cand], log_prior[cand], a[:, r], b[:, r]).argmax(-1)]   # [C]
        hits[:, r] = best == truth[r]
    return hits


def cell_weights(cells: list, long: torch.Tensor, wz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha, beta) `[C, n]` of grid cells over rows `long [n, V]` (W z = `wz`): a pair (alpha, beta) for every
    row, or a Schedule's weights of each row."""
    cols_a, cols_b = [], []
    for c in cells:
        if isinstance(c, Schedule):
            a, b = c(long, wz if c.needs_short else None)                                   # [n]
        else:
            a, b = (torch.full((long.shape[0],), float(v), device=long.device) for v in c)
        cols_a.append(a.float()), cols_b.append(b.float())
    return torch.stack(cols_a), torch.stack(cols_b)


class SequentialDrafter(OnBackbone):
    name: str
    first_row = 1                     # backbone block row of draft 1 (0 for a shifted Domino backbone)

    def __init__(self, backbone, w_out: torch.Tensor, log_prior: torch.Tensor, alpha: list[float],
                 beta: list[float], max_drafts: int, backend: str = "auto", cuda_graph: str | bool = "auto",
                 schedule: Schedule | None = None):
        self.backbone, self.max_drafts, self.tap_layers = backbone, max_drafts, backbone.tap_layers
        self.schedule = schedule          # adaptive weights (kernels/adaptive.py); None = alpha, beta as given
        self.w_out = w_out                                                                  # [V, r]
        self.rank = w_out.shape[1]
        self.alpha, self.beta = alpha, beta                                                 # K-1 each
        dev = w_out.device
        self.log_prior = log_prior.to(device=dev, dtype=w_out.dtype)                       # [V]
        self.zero_z = torch.zeros(self.rank, device=dev, dtype=w_out.dtype)
        self.backend = pick_backend(backend, dev)
        self.kernel = TritonFusion(self.log_prior.numel(), dev) if self.backend == "triton" else None
        # The torch formula multiplies in fp32 (fused_logits' w.float()); a bf16 table would be cast anew for every
        # drafted row (3.1 AR steps a DeLS round on a CPU). One fp32 copy gives the same values once; the Triton
        # kernel reads the table in its own dtype and needs none.
        self.w_fuse = w_out.float() if self.kernel is None else w_out                     # [V, r]
        use_graph = dev.type == "cuda" if cuda_graph == "auto" else bool(cuda_graph)
        check(not use_graph or dev.type == "cuda", "fusion.cuda_graph=true needs a CUDA device")
        self.graphs: dict | None = {} if use_graph else None

    # --- the subclass's part
    def block_inputs(self, anchor: int, start: int, k: int) -> dict[str, torch.Tensor]:
        """`long` `[k, V]` plus any per-row `[k, ...]` or 0-d tensors that begin/feature read."""
        raise NotImplementedError

    def begin(self, x: dict, first: torch.Tensor):
        raise NotImplementedError

    def feature(self, x: dict, state, i: int) -> torch.Tensor:
        raise NotImplementedError

    def advance(self, state, token: torch.Tensor):
        raise NotImplementedError

    prepared_drafts: tuple | None = None      # (start, anchor, drafts [K]) from prepare_rows, read once by propose
    proposes_trees, tree_top_k, tree_nodes = False, 0, 0

    def as_tree(self, top_k: int, total_tokens: int) -> "SequentialDrafter":
        """Draft best-first trees along the head (drafters/block_tree.py): `total_tokens` verified rows a round, the
        anchor included, `top_k` tokens considered after each node."""
        self.proposes_trees, self.tree_top_k, self.tree_nodes = True, top_k, total_tokens - 1
        return self

    @torch.inference_mode()
    def _tree(self, anchor: int, start: int, k: int) -> Proposal:
        """The tree of the most probable paths (block_tree.grow): a node's children are the top_k of the fused row
        its branch's state gives, the state advanced by the node's own token; one batched head step a level."""
        x = self.block_inputs(anchor, start, k)
        long, dev, states = x["long"], x["long"].device, {}                               # [k, V]; node → state

        def expand(d: int, ids: list[int], parents: list[int], toks: list[int]) -> list[Candidates]:
            t = torch.tensor(toks, device=dev)                                              # [a]
            if d == 0:
                state = self.begin(x, t)                                                    # [a, ...]
            else:
                state = self.advance(torch.stack([states[p] for p in parents]), t)
            states.update(zip(ids, state))
            z = self.feature(x, state, d + 1)                                               # [a, r]
            return top(self.fused_row(long[d + 1].expand(len(ids), -1), z, d + 1), self.tree_top_k)

        roots = top(self.fused_row(long[0], self.zero_z, 0)[None], self.tree_top_k)[0]   # DFlash's first row alone
        return grow(roots, expand, self.tree_nodes, k, dev)

    def reset(self) -> None:
        super().reset()
        self.prepared_drafts = None

    @staticmethod
    @torch.inference_mode()
    def prepare_rows(rows: list["SequentialDrafter"], anchors: list[int], starts: list[int], ks: list[int],
                     argmax: bool) -> None:
        """Batched speculation (drafters/base.py): the backbone's block passes of every row in one, then, for argmax
        drafts (greedy, protocol A), the head loop over all rows' blocks at once: one fusion a draft position for B
        rows (as `propose_all` runs it, without the teacher forcing: each row's state follows its own drafts). A row
        with k < K keeps its first k drafts (a draft depends only on those before it). Protocol B samples each row
        from its own stream: the loop then runs row by row in `propose`."""
        me, backbone = rows[0], rows[0].backbone
        if not hasattr(backbone, "prepare_rows"):
            return
        backbone.prepare_rows([r.backbone for r in rows], anchors, starts, ks, argmax)
        if not argmax:
            return
        dev, k_max = me.w_out.device, max(ks)
        hidden = rows[0].backbone.prepared[2].hidden                                        # [n, B, H]
        hid = hidden[:, me.first_row: me.first_row + k_max].transpose(0, 1)                 # [K, n, H]
        x = {"hidden": hid, "anchor": torch.tensor(anchors, device=dev)}
        out = torch.empty(len(rows), k_max, dtype=torch.long, device=dev)                  # [n, K]
        state = d = None
        for i in range(k_max):
            if i == 1:
                state = me.begin(x, d)
            elif i > 1:
                state = me.advance(state, d)
            z = me.zero_z if i == 0 else me.feature(x, state, i)                            # [r] | [n, r]
            long = backbone.lm_head(hid[i].contiguous())                                    # [n, V]
            a, b, short = me._row_weights(long, z, i)
            d = fuse_torch(long, z, me.w_fuse, a, b, me.log_prior, short=short)[0]          # [n]
            out[:, i] = d
        for r, s, a, drafts in zip(rows, starts, anchors, out):
            r.backbone.prepared = None                                  # the drafts are made: no block left to read
            r.prepared_drafts = (s, a, drafts)

    # --- the backbone keeps the context (OnBackbone); the loop state lives only within a block
    def _weights(self, i: int) -> tuple[float, float]:
        return (0.0, 0.0) if i == 0 else (self.alpha[i - 1], self.beta[i - 1])

    def _row_weights(self, long_i: torch.Tensor, z: torch.Tensor, i: int):
        """(alpha, beta, short) of draft row i: the fixed numbers and None, or with `schedule` the adaptive weights of
        these logits (fp32 tensors `[]` for a row `[V]`, `[a]` for rows `[a, V]`) and, when the schedule read it,
        the local head's row W z (fp32, reused by the torch fusion). Row 0 is DFlash's alone."""
        if i == 0 or self.schedule is None:
            return (*self._weights(i), None)
        short = None
        if self.schedule.needs_short:
            w = self.w_fuse.float()
            short = w @ z.float() if z.dim() == 1 else z.float() @ w.T                     # [V] | [a, V]
        a, b = self.schedule(long_i, short)
        return a, b, short

    def _pick(self, long_i, z, i: int, temperature: float, generator):
        a, b, short = self._row_weights(long_i, z, i)
        if self.kernel is not None:
            return self.kernel(long_i, z, self.w_out, a, b, self.log_prior, temperature, seed_add=i)
        noise = gumbel(long_i.shape[-1], generator, long_i.device) if temperature > 0 else None
        return fuse_torch(long_i, z, self.w_fuse, a, b, self.log_prior, temperature, noise, short=short)

    def fused_row(self, long_i: torch.Tensor, z: torch.Tensor, i: int) -> torch.Tensor:
        """The full fused logits of row i `[V]` (protocol B's residual needs the first rejected row); rows `[a, V]`
        (trees)."""
        a, b, short = self._row_weights(long_i, z, i)
        return fused_logits(long_i, z, self.w_fuse, a, b, self.log_prior, short)

    def draft(self, x: dict, out_tokens, out_probs, out_z, temperature: float = 0.0, generator=None) -> None:
        """One block: tokens `[k]`, probs `[k]` (sampling only) and the rank states `[k, r]` the fused rows
        were built from, written into the given buffers with no host synchronisation."""
        long = x["long"]
        k = long.shape[0]
        out_z[0].copy_(self.zero_z)
        tok, p = self._pick(long[0], self.zero_z, 0, temperature, generator)
        out_tokens[0].copy_(tok)
        state = self.begin(x, out_tokens[0]) if k > 1 else None
        for i in range(1, k):
            z = self.feature(x, state, i)                                                   # [r]
            out_z[i].copy_(z)
            tok, p_i = self._pick(long[i], z, i, temperature, generator)
            out_tokens[i].copy_(tok)
            if p_i is not None:
                out_probs[i].copy_(p_i)
            if i + 1 < k:
                state = self.advance(state, out_tokens[i])
        if p is not None:
            out_probs[0].copy_(p)

    def propose(self, anchor: int, start: int, k: int, sampling: Sampling | None) -> Proposal:
        if self.proposes_trees:                                          # greedy / protocol A, batch 1 (engine)
            return self._tree(anchor, start, k)
        prepared, self.prepared_drafts = self.prepared_drafts, None
        if prepared is not None and sampling is None and prepared[:2] == (start, anchor):    # this row's share
            return Proposal(prepared[2][:k])
        x = self.block_inputs(anchor, start, k)
        long = x["long"]                                                                    # [k, V]
        temperature = sampling.temperature if sampling is not None else 0.0
        generator = sampling.generator if sampling is not None else None
        # Sampling inside a graph needs the kernel's own Philox stream (a torch generator is not captured).
        if self.graphs is not None and (temperature == 0 or self.kernel is not None):
            tokens, probs, zs = self._replay(x, temperature, generator)
        else:
            dev = long.device
            tokens = torch.empty(k, dtype=torch.long, device=dev)
            probs = torch.empty(k, dtype=torch.float32, device=dev)
            zs = torch.empty(k, self.rank, dtype=self.zero_z.dtype, device=dev)
            if self.kernel is not None and temperature > 0:
                self.kernel.reseed(generator)
            with torch.inference_mode():
                self.draft(x, tokens, probs, zs, temperature, generator)
        if sampling is None:
            return Proposal(tokens)
        t = sampling.temperature
        return Proposal(tokens, LazyDist(probs, lambda j: torch.softmax(self.fused_row(long[j], zs[j], j) / t, -1)))

    @torch.inference_mode()
    def propose_all(self, taps: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, ks: torch.Tensor,
                    chunk: int = 64) -> torch.Tensor:
        """Greedy drafts at many anchors of a known sequence (drafters/base.py): the backbone's blocks in one batched
        pass per chunk (DFlash's), then `draft`'s loop over a batch of blocks, row i only for the blocks whose
        drafts so far equal the sequence (acceptance ends at the first that does not). The loop state is per block
        and reads only the block (its anchor, rows, drafts so far), so for those blocks it is the state after the
        sequence's own tokens: one batched begin / feature / advance serves them all, and each row goes through
        the same fusion (kernels/fusion.py, the torch reference). Returns `[N, K]`, -1 where not computed."""
        bb, dev = self.backbone, self.w_out.device
        ids, starts, ks = ids.to(dev), starts.to(dev), ks.to(dev)
        ctx = bb.context(taps)
        out = torch.full((len(starts), self.max_drafts), -1, dtype=torch.long, device=dev)  # [N, K]
        for c0 in range(0, len(starts), chunk):
            s, k = starts[c0: c0 + chunk], ks[c0: c0 + chunk]                               # [n]
            hidden = bb.blocks(ctx, bb.mask_blocks(ids, s), s)                              # [n, B, H]
            rows = hidden[:, self.first_row: self.first_row + self.max_drafts].transpose(0, 1)   # [K, n, H]
            alive, state, d = torch.arange(len(s), device=dev)[k > 0], None, None
            for i in range(self.max_drafts):
                if alive.numel() == 0:
                    break
                # what `draft` reads, for the alive blocks: per-row tensors [K, a, ...] (x[name][i] = row i of each)
                x = {"hidden": rows[:, alive], "anchor": ids[s[alive]]}
                if i == 1:
                    state = self.begin(x, d)
                elif i > 1:
                    state = self.advance(state, d)
                z = self.zero_z if i == 0 else self.feature(x, state, i)                    # [r] | [a, r]
                long = bb.lm_head(rows[i, alive])                                           # [a, V]
                a, b, short = self._row_weights(long, z, i)
                d = fuse_torch(long, z, self.w_fuse, a, b, self.log_prior, short=short)[0]  # [a]
                out[c0 + alive, i] = d
                go = (d == sequence_at(ids, s[alive] + i + 1)) & (k[alive] > i + 1)        # right, and a next row
                alive, d = alive[go], d[go]
                state = state[go] if state is not None else None
        return out

    def matches_all(self, taps: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, ks: torch.Tensor,
                    cells: list, chunk: int = 32, observe=None) -> torch.Tensor:
        """For fusion-weight grids (replay.fusion_grid, eval/fusion_grid.py): at many anchors of a known sequence,
        how many leading greedy drafts equal the sequence, for every weight pair `cells` [(alpha, beta), ...]
        (the pair applies at every draft position). Exact for the reason `propose_all` is: while a block's drafts
        equal the sequence its loop state is the state after the sequence's own tokens, whatever the weights. So
        the backbone rows, the loop states and W z are computed once per block, teacher-forced on the sequence,
        and only `fused_logits`' sum and the argmax run per cell. A cell may also be an adaptive schedule
        (kernels/adaptive.py): its weights are computed per row from the same teacher-forced rows. The drafter's own
        weights are not read. `observe(i, c0, long [n, V], wz [n, V] | None, truth [n], ks [n])` (c0: the chunk's
        first anchor), when given, sees
        every teacher-forced row (experiments/adaptive_fusion.py fits schedules on them). Returns `[C, N]` counts
        (at most ks)."""
        bb, dev = self.backbone, self.w_out.device
        ids, starts, ks = ids.to(dev), starts.to(dev), ks.to(dev)
        ctx = bb.context(taps)
        lp, w = self.log_prior.float(), self.w_fuse.float()                                 # [V], [V, r]
        out = torch.zeros((len(cells), len(starts)), dtype=torch.long, device=dev)          # [C, N]
        for c0 in range(0, len(starts), chunk):
            s, k = starts[c0: c0 + chunk], ks[c0: c0 + chunk]                               # [n]
            hidden = bb.blocks(ctx, bb.mask_blocks(ids, s), s)                              # [n, B, H]
            rows = hidden[:, self.first_row: self.first_row + self.max_drafts].transpose(0, 1)   # [K, n, H]
            x = {"hidden": rows, "anchor": ids[s]}
            alive = (k > 0).expand(len(cells), -1).clone()                                  # [C, n] still matching
            state = None
            for i in range(self.max_drafts):
                if not alive.any():
                    break
                truth = sequence_at(ids, s + i + 1)                                         # [n] what row i must draft
                long = bb.lm_head(rows[i]).float()                                          # [n, V]
                if i == 0:                                                                  # DFlash's row alone
                    hit = (long.argmax(-1) == truth).expand(len(cells), -1)                 # [C, n]
                    if observe is not None:
                        observe(i, c0, long, None, truth, k)
                else:
                    prev = sequence_at(ids, s + i).clamp(min=0)     # row i-1's draft where the block still matches
                    state = self.begin(x, prev) if i == 1 else self.advance(state, prev)
                    wz = self.feature(x, state, i).float() @ w.T                            # [n, V]
                    if observe is not None:
                        observe(i, c0, long, wz, truth, k)
                    hit = _grid_hits(long, wz, lp, truth, weights=cell_weights(cells, long, wz))   # [C, n]
                alive &= hit & (k > i)
                out[:, c0: c0 + len(s)] += alive
        return out

    def _replay(self, x: dict, temperature: float, generator):
        """CUDA graph of the whole block loop, one per temperature, on static buffers sized for K drafts;
        k < K runs the full block and keeps the first k drafts (draft i depends only on drafts before it)."""
        from ..kernels.graphs import GraphedLoop

        k, K = x["long"].shape[0], self.max_drafts
        if temperature not in self.graphs:
            dev = x["long"].device
            inputs = {n: torch.zeros((K, *v.shape[1:]) if v.dim() else (), device=dev, dtype=v.dtype)
                      for n, v in x.items()}
            outs = (torch.zeros(K, dtype=torch.long, device=dev), torch.zeros(K, dtype=torch.float32, device=dev),
                    torch.zeros(K, self.rank, dtype=self.zero_z.dtype, device=dev))
            body = lambda: self.draft(inputs, *outs, temperature)  # noqa: E731
            self.graphs[temperature] = (GraphedLoop(body), inputs, outs)
        graph, inputs, outs = self.graphs[temperature]
        for n, v in x.items():
            (inputs[n][:k] if v.dim() else inputs[n]).copy_(v)
        if temperature > 0:
            self.kernel.reseed(generator)
        graph()
        return tuple(o[:k].clone() for o in outs)
