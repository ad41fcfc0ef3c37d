"""The types a submission may import (`from task import input_t, output_t`), as GPU MODE's task.py provides them."""
from typing import Dict, Tuple, TypeVar

import torch

input_t = TypeVar("input_t", bound=Tuple[torch.Tensor, Dict[str, torch.Tensor], Dict])
output_t = TypeVar("output_t", bound=torch.Tensor)
