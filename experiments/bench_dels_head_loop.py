"""Per-block cost of the sequential loops (drafters/head_loop.py: DeLS-Spec's RNN / Markov heads and Domino-FT's
prefix GRU + residual head; K-1 corrected positions after DFlash's first draft) at Qwen3-8B shapes with random
weights: eager torch vs eager Triton vs CUDA graph + Triton (and + torch).
Checks that every variant drafts the same tokens. Prints a markdown table; never imported by the library.

    python experiments/bench_dels_head_loop.py                      # GPU: V=151936, H=4096, K=15, bf16
    python experiments/bench_dels_head_loop.py --device cpu --vocab 49152 --hidden 576 --iters 20   # CPU smoke
"""
import argparse
import statistics
import time

import torch

from specexp.drafters import dels, domino


class _NoBackbone:
    max_drafts, tap_layers = 15, ()


def make(kind, V, H, K, dtype, device, backend, graph, seed=0):
    # The V x H tables are drawn on the device: on the host, 622 M values at Qwen3-8B shapes take seconds per variant.
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    if kind == "domino":                                              # reference sizes: GRU 1024, rank 256
        head = domino.random_head(domino.DominoConfig(H, V), seed, 0.02)
        bb = _NoBackbone()
        bb.block_size = K + 1                                         # unshifted: rows 1..K are the drafts
        embed = (torch.randn(V, H, generator=g, device=device) * 0.02).to(dtype)
        return domino.DominoDrafter(bb, head, embed, 1.0, backend, graph)
    c = dels.LocalHeadConfig(kind, H, V)                               # reference sizes: 256 / 1024 / 256
    head = dels.random_head(c, seed, 0.02)
    embed = (torch.randn(V, H, generator=g, device=device) * 0.02).to(dtype)
    lm = (torch.randn(V, H, generator=g, device=device) * 0.02).to(dtype)
    merged = dels.MergedHead(head, embed, lm, dtype, device)
    lp = torch.log_softmax(torch.randn(V, generator=g, device=device), 0)
    bb = _NoBackbone()
    bb.max_drafts = K
    return dels.DeLSDrafter(bb, merged, lp, 0.3, 0.3, backend, graph)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(drafter, x, iters, warmup=3):
    device, K = x["long"].device, x["long"].shape[0]
    bufs = (torch.empty(K, dtype=torch.long, device=device), torch.empty(K, device=device),
            torch.empty(K, drafter.rank, dtype=drafter.zero_z.dtype, device=device))

    def once():
        if drafter.graphs is not None:
            return drafter._replay(x, 0.0, None)[0]
        with torch.inference_mode():
            drafter.draft(x, *bufs)
        return bufs[0]

    for _ in range(warmup):
        once()
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        tokens = once()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, tokens.clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--drafts", type=int, default=15, help="K: drafts per block (b16 unshifted: 15)")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    long = (torch.randn(args.drafts, args.vocab) * 3).to(device, dtype)            # DFlash logits [K, V]
    variants = [("eager", "torch", False)]
    if device.type == "cuda":
        variants += [("eager", "triton", False), ("CUDA graph", "torch", True), ("CUDA graph", "triton", True)]
    print(f"Sequential loop per block: V={args.vocab}, H={args.hidden}, K={args.drafts}, {dtype}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}; median of {args.iters}\n")
    print("| head | loop | fusion | ms / block | µs / position | speedup vs eager torch | same tokens |")
    print("|---|---|---|---:|---:|---:|:---:|")
    hidden = (torch.randn(args.drafts, args.hidden) * 0.5).to(device, dtype)        # DFlash rows [K, H]
    for kind in ("rnn", "markov", "domino"):
        x = {"long": long} if kind != "domino" else {"long": long, "hidden": hidden,
                                                     "anchor": torch.tensor(7, device=device)}
        base = ref = None
        for loop, backend, graph in variants:
            d = make(kind, args.vocab, args.hidden, args.drafts, dtype, device, backend, graph)
            ms, tokens = bench(d, x, args.iters)
            base, ref = (ms, tokens) if base is None else (base, ref)
            same = "yes" if torch.equal(tokens, ref) else "NO"
            per_draft_us = ms * 1e3 / args.drafts
            print(f"| {kind} | {loop} | {backend} | {ms:.3f} | {per_draft_us:.1f} | {base / ms:.2f}× | {same} |")
            del d
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
