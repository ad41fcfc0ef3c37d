"""The types a GPU MODE TriMul submission imports (`from task import input_t, output_t`): GPU MODE puts the problem's
task.py next to submission.py, so submissions written for its leaderboard start with that import. reference.py
registers this file as the module `task`."""
from typing import TypeVar

import torch

input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict])
output_t = TypeVar("output_t", bound=torch.Tensor)
