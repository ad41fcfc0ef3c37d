"""The template submission of the test problem: PyTorch, correct."""
import torch

from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    x, weights, _config = data
    return torch.addmm(weights["bias"], x, weights["weight"].T)
