"""Reference and inputs of the test problem: a linear layer, the bias all zeros where `nobias` is truthy."""
import torch

from task import input_t, output_t
from utils import device, make_match_reference


def ref_kernel(data: input_t) -> output_t:
    x, weights, _config = data
    return x @ weights["weight"].T + weights["bias"]


def generate_input(m: int, n: int, k: int, seed: int, nobias) -> input_t:
    gen = torch.Generator(device=device()).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device())
    weight = torch.randn(n, k, generator=gen, device=device()) / k ** 0.5
    bias = torch.zeros(n, device=device()) if nobias else torch.randn(n, generator=gen, device=device())
    return x, {"weight": weight, "bias": bias}, {"n": n}


check_implementation = make_match_reference(ref_kernel, rtol=1e-2, atol=1e-2)
