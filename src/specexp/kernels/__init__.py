"""Fused inference kernels (Triton on GPU, torch reference on CPU) and CUDA-graph loops."""
