"""The types a submission may import."""
from typing import TypeVar

import torch

input_t = TypeVar("input_t", bound=tuple)
output_t = TypeVar("output_t", bound=torch.Tensor)
