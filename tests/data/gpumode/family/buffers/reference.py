"""C = A + B into the output buffer C."""
import torch

from task import input_t, output_t
from utils import device, make_match_reference


def ref_kernel(data: input_t) -> output_t:
    a, b, out = data
    out[...] = a + b
    return out


def generate_input(size: int, seed: int) -> input_t:
    gen = torch.Generator(device=device()).manual_seed(seed)
    a = torch.randn(size, generator=gen, device=device())
    b = torch.randn(size, generator=gen, device=device())
    out = torch.empty(size, device=device())
    return a, b, out


check_implementation = make_match_reference(ref_kernel)
