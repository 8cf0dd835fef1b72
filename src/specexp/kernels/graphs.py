"""CUDA graphs for the sequential loops of a drafted block (DeLS local heads, Domino's GRU): a block's loop is
K small kernels (a GRU cell, a rank-r projection, a fused vocabulary reduction) whose launch overhead
dominates eager PyTorch, so the whole loop is captured once and replayed per block.

`body()` must read and write only tensors allocated before capture and must not synchronise with the host
(no `.item()`, no Python branching on tensor values). The same body runs eagerly on CPU, which is how the
tests check the captured logic without a GPU.
"""
from __future__ import annotations

from typing import Callable

import torch


class GraphedLoop:
    def __init__(self, body: Callable[[], None], warmup: int = 2):
        self.body = body
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(warmup):             # Triton compiles and cuBLAS picks its kernels outside the capture
                body()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            body()

    def __call__(self) -> None:
        self.graph.replay()
