"""DeLS-Spec logit fusion for one drafted position, without materialising the local head's logits.

    fused = long + alpha * (W @ z) - beta * log_prior            # [V]
    token = argmax(fused)                                          greedy / protocol A drafts
    token ~ softmax(fused / T), prob = softmax(fused / T)[token]   protocol B drafts

`long [V]` are the DFlash logits of the position, `z [r]` the local head's rank-r state and `W [V, r]` its
merged output factor (target lm_head @ up-projection), `log_prior [V]` the smoothed log unigram prior. The
arithmetic is fp32 whatever the input dtype. Sampling is Gumbel-max, `argmax(fused / T + g)` with
`g = -log(-log(u))`, so sampling and argmax are the same streaming reduction; the Triton kernel draws `u`
with Philox from a seed held in device memory (a CUDA graph replays it with a fresh seed), or reads given
noise (how the tests compare it with the reference bit for bit).

Two implementations of the same contract live here: `fuse_torch` (the reference, used on CPU) and
`TritonFusion` (GPU; one program per vocabulary tile, each writes its tile's best score, token, max and
sum-exp, and a few torch ops combine the tiles). `pick_backend` chooses by device. Ties go to the lowest token id in
both, as torch.argmax.

Tiles (`TILES`): a program holds a BLOCK x BLOCK_R fp32 tile of W spread over 32 * warps threads. Compiled for sm_90
as a launch specialises them (16-byte-aligned pointers and V = 151936 get tt.divisibility=16; r = 256, Triton 3.6 and
3.9), the tiles of `AUTOTUNE` use 56 to 97 registers and no stack, and the first shipped tile, 1024 x 64 on 4 warps
(512 values per thread), 255 registers and 152 B of stack per thread (compiled without those hints, as an earlier
check did, it showed 13.6 KB). On a GPU
`triton.autotune` picks among the spill-free tiles (`AUTOTUNE`) once per vocabulary size, rank, mode and dtype,
outside any CUDA-graph capture (the graph's warm-up calls run first); under `TRITON_INTERPRET` (no registers, no
timing) one fixed tile runs. The GPU check measures every tile (scripts/gpu_parts/fusion_tiles_compile.py: time per
call, registers, stack).
Draws do not depend on the tile: Philox is keyed by the token id, not by the program.
"""
from __future__ import annotations

import os

import torch

from ..errors import invariant

try:
    import triton
    import triton.language as tl
except ImportError:            # pragma: no cover - triton ships with torch on Linux
    triton = None

BACKENDS = ("auto", "torch", "triton")
# name -> (BLOCK vocabulary rows per program, BLOCK_R rank columns per step, warps); values per thread of the W
# tile = BLOCK * BLOCK_R / (32 * warps)
TILES = {
    "1024x64w4": (1024, 64, 4),     # 512 per thread: spills; the first shipped tile, kept to be measured against
    "1024x16w8": (1024, 16, 8),
    "512x16w4": (512, 16, 4),
    "512x32w8": (512, 32, 8),
    "256x32w4": (256, 32, 4),
    "2048x8w8": (2048, 8, 8),
}
AUTOTUNE = ("1024x16w8", "512x16w4", "512x32w8", "256x32w4", "2048x8w8")     # 64 per thread: no spills on sm_90
INTERPRETED = "1024x64w4"           # the interpreter has no registers: the fewest programs run fastest


def gumbel(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Gumbel(0, 1) noise in fp32."""
    u = torch.rand(shape, generator=generator, device=device)
    return -torch.log(-torch.log(u))


def fused_logits(long, z, w, alpha: float, beta: float, log_prior, short: torch.Tensor | None = None) -> torch.Tensor:
    """The formula, materialised: `long + alpha * W z - beta * log_prior` in fp32 `[V]`; or `[a, V]` for a batch
    of rows of the same draft position (`long [a, V]`, `z [a, r]`: greedy replay, propose_all)."""
    if torch.is_tensor(alpha) or torch.is_tensor(beta):      # adaptive weights (kernels/adaptive.py): [] | [a]
        return _fused_logits_rows(long, z, w, alpha, beta, log_prior, short)
    fused = long.float()                                                                        # [V] | [a, V]
    if beta:
        fused = fused - beta * log_prior.float()
    if alpha:
        if fused.dim() == 1:
            fused = torch.addmv(fused, w.float(), z.float(), alpha=alpha)                      # + alpha * W z
        else:
            fused = torch.addmm(fused, z.float(), w.float().T, alpha=alpha)                    # + alpha * z_j W^T
    return fused


def _fused_logits_rows(long, z, w, alpha, beta, log_prior, short=None) -> torch.Tensor:
    """`fused_logits` with weights per row, fp32 tensors `[]` (one row `[V]`) or `[a]` (rows `[a, V]`), in the
    kernel's order `(long - beta * lp) + alpha * W z`; no term is skipped (a weight may be 0 on some rows only).
    `short`: W z already computed (fp32, as below), e.g. by a gate that read it."""
    lead = (...,) + (None,)
    a = torch.as_tensor(alpha, dtype=torch.float32, device=long.device)[lead]                # [1] | [a, 1]
    b = torch.as_tensor(beta, dtype=torch.float32, device=long.device)[lead]
    if short is None:
        short = w.float() @ z.float() if z.dim() == 1 else z.float() @ w.float().T             # [V] | [a, V]
    return (long.float() - b * log_prior.float()) + a * short


def fuse_torch(long, z, w, alpha: float, beta: float, log_prior, temperature: float = 0.0,
               noise: torch.Tensor | None = None, short: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference. Returns `(token [] long, prob [] fp32 | None)`; `noise [V]` = Gumbel noise when sampling.
    Greedy (temperature 0) also takes a batch of rows (`fused_logits`) and returns tokens `[a]`. alpha / beta may be
    fp32 tensors, one per row (adaptive weights; `short` = W z when already computed)."""
    fused = fused_logits(long, z, w, alpha, beta, log_prior, short)
    if temperature <= 0:
        return fused.argmax(-1), None
    s = fused / temperature                                                                     # [V]
    token = (s + noise).argmax()
    return token, torch.exp(s.gather(0, token.view(1))[0] - torch.logsumexp(s, 0))


if triton is not None:
    @triton.jit
    def _fuse_tiles(long_ptr, z_ptr, w_ptr, lp_ptr, noise_ptr, seed_ptr,
                    best_ptr, tok_ptr, tmax_ptr, tsum_ptr, sbest_ptr, ab_ptr,
                    alpha, beta, inv_t, seed_add, V, R: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr,
                    SAMPLE: tl.constexpr, HAS_NOISE: tl.constexpr, AB_IN_MEMORY: tl.constexpr):
        pid = tl.program_id(0)
        if AB_IN_MEMORY:                                 # adaptive weights, computed on the device (no host read)
            alpha = tl.load(ab_ptr).to(tl.float32)
            beta = tl.load(ab_ptr + 1).to(tl.float32)
        offs = pid * BLOCK + tl.arange(0, BLOCK)                                                # [BLOCK]
        valid = offs < V
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):                  # short = W[tile] @ z, streamed over the rank
            rr = r0 + tl.arange(0, BLOCK_R)
            zr = tl.load(z_ptr + rr, mask=rr < R, other=0.0).to(tl.float32)                     # [BLOCK_R]
            wt = tl.load(w_ptr + offs[:, None] * R + rr[None, :], mask=valid[:, None] & (rr[None, :] < R),
                         other=0.0).to(tl.float32)                                               # [BLOCK, BLOCK_R]
            acc += tl.sum(wt * zr[None, :], axis=1)
        lg = tl.load(long_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        lp = tl.load(lp_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        fused = (lg - beta * lp) + alpha * acc           # the order of fused_logits (same rounding)
        if SAMPLE:
            s = tl.where(valid, fused * inv_t, float("-inf"))
            if HAS_NOISE:
                g = tl.load(noise_ptr + offs, mask=valid, other=0.0)
            else:
                u = tl.rand(tl.load(seed_ptr) + seed_add, offs)
                g = -tl.log(-tl.log(u))
            score = tl.where(valid, s + g, float("-inf"))
            m = tl.max(s, axis=0)
            tl.store(tmax_ptr + pid, m)
            tl.store(tsum_ptr + pid, tl.sum(tl.exp(s - m), axis=0))
        else:
            score = tl.where(valid, fused, float("-inf"))
        i = tl.argmax(score, axis=0)
        tl.store(best_ptr + pid, tl.max(score, axis=0))
        tl.store(tok_ptr + pid, pid * BLOCK + i)
        if SAMPLE:
            tl.store(sbest_ptr + pid, tl.sum(tl.where(tl.arange(0, BLOCK) == i, s, 0.0), axis=0))


    _fuse_tiles_tuned = triton.autotune(
        configs=[triton.Config({"BLOCK": b, "BLOCK_R": r}, num_warps=w) for b, r, w in map(TILES.get, AUTOTUNE)],
        key=["V", "R", "SAMPLE", "HAS_NOISE", "AB_IN_MEMORY"])(_fuse_tiles)


def interpreted() -> bool:
    """Whether Triton kernels run in its interpreter (`TRITON_INTERPRET`, read when the kernel was defined)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def tile_name(block: int, block_r: int, warps: int) -> str:
    return next((n for n, t in TILES.items() if t == (block, block_r, warps)), f"{block}x{block_r}w{warps}")


class TritonFusion:
    """Preallocated tile buffers for one vocabulary size, so repeated calls (and CUDA-graph capture) allocate
    nothing. `seed` is a device tensor read by the kernel: fill it before each sampled call or replay.
    `tile`: a name of `TILES`, or auto (autotuned among `AUTOTUNE` on a GPU, `INTERPRETED` in the interpreter)."""

    def __init__(self, vocab_size: int, device, tile: str = "auto"):
        invariant(triton is not None, "the Triton fusion kernel was called without triton installed")
        if tile not in ("auto", *TILES):
            raise ValueError(f"tile={tile!r}; valid: auto, {', '.join(TILES)}")
        self.V = vocab_size
        self.tile = INTERPRETED if tile == "auto" and interpreted() else tile
        # sized for the smallest block: the tuner runs every tile on these buffers, and only the first
        # cdiv(V, block) entries of the chosen tile are read back
        n = triton.cdiv(vocab_size, min(b for b, _, _ in TILES.values()))
        f = dict(device=device, dtype=torch.float32)
        self.best, self.tmax, self.tsum, self.sbest = (torch.empty(n, **f) for _ in range(4))
        self.tok = torch.empty(n, device=device, dtype=torch.int64)
        self.seed = torch.zeros(1, device=device, dtype=torch.int64)
        self.ab = torch.zeros(2, **f)                    # adaptive (alpha, beta) of the next call, on the device

    @property
    def chosen_tile(self) -> str | None:
        """The tile of the latest call (the autotuner's pick when tuned; None before the first tuned call)."""
        if self.tile != "auto":
            return self.tile
        c = getattr(_fuse_tiles_tuned, "best_config", None)
        return None if c is None else tile_name(c.kwargs["BLOCK"], c.kwargs["BLOCK_R"], c.num_warps)

    def reseed(self, generator: torch.Generator | None) -> None:
        """A fresh Philox seed for the next sampled block (device to device: no host sync)."""
        self.seed.copy_(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=self.seed.device))

    def __call__(self, long, z, w, alpha: float, beta: float, log_prior, temperature: float = 0.0,
                 noise: torch.Tensor | None = None, seed_add: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`seed_add` separates the random streams of the positions of one block (same seed, one replay). `alpha`,
        `beta`: numbers, or 0-d fp32 device tensors (adaptive weights, kernels/adaptive.py), read by the kernel
        from device memory."""
        sample = temperature > 0
        r = z.numel()
        in_memory = torch.is_tensor(alpha) or torch.is_tensor(beta)
        if in_memory:
            self.ab[0].copy_(torch.as_tensor(alpha).reshape(()))
            self.ab[1].copy_(torch.as_tensor(beta).reshape(()))
        args = (long, z, w, log_prior, noise if noise is not None else self.best, self.seed,
                self.best, self.tok, self.tmax, self.tsum, self.sbest, self.ab,
                0.0 if in_memory else float(alpha), 0.0 if in_memory else float(beta),
                1.0 / temperature if sample else 1.0, int(seed_add), self.V)
        if self.tile == "auto":
            _fuse_tiles_tuned[lambda meta: (triton.cdiv(self.V, meta["BLOCK"]),)](
                *args, R=r, SAMPLE=sample, HAS_NOISE=noise is not None, AB_IN_MEMORY=in_memory)
            block = _fuse_tiles_tuned.best_config.kwargs["BLOCK"]
        else:
            block, block_r, warps = TILES[self.tile]
            _fuse_tiles[(triton.cdiv(self.V, block),)](
                *args, R=r, BLOCK=block, BLOCK_R=min(block_r, triton.next_power_of_2(r)),
                SAMPLE=sample, HAS_NOISE=noise is not None, AB_IN_MEMORY=in_memory, num_warps=warps)
        n = triton.cdiv(self.V, block)
        best, tok, tmax, tsum, sbest = (b[:n] for b in (self.best, self.tok, self.tmax, self.tsum, self.sbest))
        # gather, not tok[t]: a 0-d tensor index is read on the host, which a CUDA graph forbids
        t = best.argmax().view(1)                            # the first tile holding the maximum
        token = tok.gather(0, t)[0]
        if not sample:
            return token, None
        m = tmax.max()
        log_z = m + torch.log((tsum * torch.exp(tmax - m)).sum())
        return token, torch.exp(sbest.gather(0, t)[0] - log_z)


def pick_backend(backend: str, device: torch.device) -> str:
    """`auto` = Triton on CUDA, the torch reference elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(backend)
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton is not None else "torch"
    return backend
