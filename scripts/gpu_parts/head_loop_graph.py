"""The sequential head loops (DeLS RNN / Markov, Domino-FT) at Qwen3-8B shapes: eager torch,
eager Triton, CUDA graph + torch, CUDA graph + Triton; same greedy tokens, same sampled
tokens (eager Triton vs graph Triton, one seed), host syncs per block, ms per block

Why: DeLS and Domino-FT draft their K tokens one after another, a chain of small launches per block: the CUDA-graph
path is there to remove the launches and host syncs, and must draw the tokens the eager loops draw.

Time limit 20 -> 18 -> 17 s (PARTS in scripts/gpu_check.py; seconds on one H200): H200 16 s. CPU dry run 20 s
"""
from gpu_parts.common import step, syncs_of


def run(ctx) -> dict:
    import bench_dels_head_loop as hl
    import torch

    dev = ctx.device
    cuda = dev.type == "cuda"
    V, H, K = (2048, 128, 5) if ctx.dry else (151936, 4096, 15)
    dtype = torch.bfloat16 if cuda else torch.float32
    variants = [("eager", "torch", False), ("eager", "triton", False)]
    if cuda:
        variants += [("graph", "torch", True), ("graph", "triton", True)]
    iters = 1 if ctx.dry else 100
    g = torch.Generator().manual_seed(0)
    long = (torch.randn(K, V, generator=g) * 3).to(dev, dtype)                                  # [K, V]
    hidden = (torch.randn(K, H, generator=g) * 0.5).to(dev, dtype)                              # [K, H]
    figures, checks = {}, {}
    for kind in ("rnn", "markov", "domino"):
        x = {"long": long} if kind != "domino" else {"long": long, "hidden": hidden,
                                                     "anchor": torch.tensor(7, device=dev)}
        rows = figures[kind] = {}
        for loop, backend, graph in variants:
            with step(figures, checks, f"{kind}/{loop}/{backend}"):
                d = hl.make(kind, V, H, K, dtype, dev, backend, graph)
                ms, tokens = hl.bench(d, x, iters)
                bufs = (torch.empty(K, dtype=torch.long, device=dev), torch.empty(K, device=dev),
                        torch.empty(K, d.rank, dtype=d.zero_z.dtype, device=dev))

                def block(temperature=0.0, gen=None, d=d, bufs=bufs):
                    if d.graphs is not None:
                        return d._replay(x, temperature, gen)[0]
                    if d.kernel is not None and temperature > 0:
                        d.kernel.reseed(gen)
                    with torch.inference_mode():
                        d.draft(x, *bufs, temperature, gen)
                    return bufs[0].clone()

                row = {"ms_per_block": ms, "us_per_position": ms * 1e3 / K, "tokens": tokens.tolist(),
                       "syncs_per_block": syncs_of(block, dev)}
                if backend == "triton":                            # the kernel's Philox sampler, one seed
                    row["sampled_tokens"] = block(1.0, torch.Generator(device=dev).manual_seed(5)).tolist()
                rows[f"{loop}/{backend}"] = row
            d = block = None
            if cuda:
                torch.cuda.empty_cache()
        for row in rows.values():
            if "eager/torch" in rows:
                row["speedup_vs_eager_torch"] = rows["eager/torch"]["ms_per_block"] / row["ms_per_block"]
        checks[f"{kind}_same_greedy_tokens"] = len({tuple(r["tokens"]) for r in rows.values()}) == 1
        if cuda:                                                   # one seed: eager and graph draw the same
            sampled = {tuple(r["sampled_tokens"]) for r in rows.values() if "sampled_tokens" in r}
            checks[f"{kind}_same_sampled_tokens_eager_and_graph"] = len(sampled) == 1
            checks[f"{kind}_graph_replay_has_no_host_sync"] = rows.get("graph/triton", {}).get("syncs_per_block") == 0
    return {"figures": {"vocab": V, "hidden": H, "drafts": K, "dtype": str(dtype).split(".")[-1], **figures},
            "checks": checks,
            "notes": [] if cuda else ["CPU: eager loops only (a CUDA graph needs a GPU), Triton in its interpreter"]}
