"""The Triton fusion kernel equals the torch reference (TRITON_INTERPRET=1, set in conftest before the
kernel module is imported): argmax tokens exactly, sampled tokens exactly given the same Gumbel noise, and
probabilities to fp32 tolerance; at Qwen3's vocabulary and at odd sizes. The in-kernel sampler draws from
softmax(fused / T)."""
import pytest
import torch
from scipy.stats import chisquare

from specexp.kernels.fusion import AUTOTUNE, INTERPRETED, TILES, TritonFusion, fuse_torch, gumbel, pick_backend


def case(V, r, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    long = torch.randn(V, generator=g) * 3
    z, w = torch.randn(r, generator=g), torch.randn(V, r, generator=g) / r ** 0.5
    lp = torch.log_softmax(torch.randn(V, generator=g), 0)
    return long.to(dtype), z.to(dtype), w.to(dtype), lp.to(dtype), g


@pytest.mark.parametrize("V,r", [(151936, 256), (50001, 100), (1000, 7), (5, 3), (1025, 1)])
def test_kernel_equals_reference(V, r):
    long, z, w, lp, g = case(V, r, V)
    k = TritonFusion(V, "cpu")
    for alpha, beta in ((0.3, 0.3), (0.0, 0.0), (2.0, -1.0)):
        tok, prob = k(long, z, w, alpha, beta, lp)
        ref, _ = fuse_torch(long, z, w, alpha, beta, lp)
        assert prob is None and int(tok) == int(ref)
        if V > 1000 and alpha == 0.3:                     # the expensive sizes: one sampled call is enough
            break
    noise = gumbel(V, g, "cpu")
    tok, prob = k(long, z, w, 0.3, 0.3, lp, 0.7, noise)
    ref, ref_prob = fuse_torch(long, z, w, 0.3, 0.3, lp, 0.7, noise)
    assert int(tok) == int(ref)
    torch.testing.assert_close(prob, ref_prob, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("tile", list(TILES))
def test_every_tile_equals_reference(tile):
    """Each tile the GPU may run (its blocks split V = 4999 unevenly, rank 40 is no multiple of BLOCK_R): argmax and
    the sampled token given the noise; the tile buffers, sized for the smallest block, are read only up to the
    chosen tile's count (a stale larger count would pick a stale tile)."""
    V, r = 4999, 40
    long, z, w, lp, g = case(V, r, 3)
    k = TritonFusion(V, "cpu", tile)
    k.best.fill_(1e30)                                    # stale entries beyond this tile's count must be ignored
    assert k.chosen_tile == tile
    assert int(k(long, z, w, 0.3, 0.3, lp)[0]) == int(fuse_torch(long, z, w, 0.3, 0.3, lp)[0])
    noise = gumbel(V, g, "cpu")
    tok, prob = k(long, z, w, 0.5, 0.2, lp, 0.8, noise)
    ref, ref_prob = fuse_torch(long, z, w, 0.5, 0.2, lp, 0.8, noise)
    assert int(tok) == int(ref)
    torch.testing.assert_close(prob, ref_prob, rtol=1e-4, atol=1e-7)


def test_tile_choice():
    assert set(AUTOTUNE) < set(TILES) and INTERPRETED in TILES
    assert TritonFusion(10, "cpu").tile == INTERPRETED                # auto, under TRITON_INTERPRET (conftest)
    with pytest.raises(ValueError, match="tile='9x9'.*valid: auto, 1024x64w4"):
        TritonFusion(10, "cpu", "9x9")


def test_kernel_reads_bf16_inputs():
    long, z, w, lp, g = case(3001, 64, 1, torch.bfloat16)
    tok, _ = TritonFusion(3001, "cpu")(long, z, w, 0.3, 0.5, lp)
    assert int(tok) == int(fuse_torch(long, z, w, 0.3, 0.5, lp)[0])


@pytest.mark.slow
def test_kernel_sampler_follows_the_fused_distribution():
    """Mass on a few tokens in different tiles (V = 2500: three tiles of 1024), the rest in one bucket."""
    V, n, hot = 2500, 400, [3, 1030, 1500, 2080, 2499]
    long, z, w, lp, g = case(V, 4, 7)
    long = long - 8.0
    long[hot] += torch.tensor([9.0, 8.5, 8.0, 9.5, 7.5])
    k = TritonFusion(V, "cpu")
    counts, probs = torch.zeros(V), torch.zeros(V)
    for _ in range(n):
        k.reseed(g)
        tok, p = k(long, z, w, 0.5, 0.2, lp, 1.3)
        counts[tok] += 1
        probs[tok] = p
    q = torch.softmax((long + 0.5 * (w @ z) - 0.2 * lp) / 1.3, 0)
    obs = [*counts[hot].tolist(), n - counts[hot].sum().item()]
    exp = [*(q[hot] * n).tolist(), (1 - q[hot].sum().item()) * n]
    assert chisquare(obs, exp).pvalue > 1e-3, (obs, exp)
    seen = counts > 0
    torch.testing.assert_close(probs[seen], q[seen], rtol=1e-5, atol=1e-7)     # the reported probability
    # One seed, different positions of a block (seed_add): independent streams, not the same draw.
    k.seed.fill_(12345)
    draws = {int(k(long, z, w, 0.5, 0.2, lp, 1.3, seed_add=i)[0]) for i in range(12)}
    assert len(draws) > 1


def test_backend_choice():
    assert pick_backend("auto", torch.device("cpu")) == "torch"
    assert pick_backend("torch", torch.device("cuda")) == "torch"
    assert pick_backend("auto", torch.device("cuda")) == "triton"
