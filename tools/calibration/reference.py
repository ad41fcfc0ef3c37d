"""Calibration workloads: a compute-bound bf16 matmul and a memory-bound fp32 scale (CPU-sized when device is cpu)."""

import torch


def make_inputs(params: dict, seed: int, device: str) -> tuple:
    g = torch.Generator(device=device).manual_seed(seed)
    n = int(params["n"]) if device == "cuda" else min(int(params["n"]), 256 if params["op"] == "mm" else 4096)
    if params["op"] == "mm":
        a = torch.randn(n, n, generator=g, device=device).to(torch.bfloat16)
        b = torch.randn(n, n, generator=g, device=device).to(torch.bfloat16)
        return (a, b)
    return (torch.randn(n, generator=g, device=device), 1.5)


def reference(a, b):
    return a @ b if isinstance(b, torch.Tensor) else a * b
