"""Cheat class: timing, work on a side stream only while the harness might be deciding whether it does (GPU).

How it cheats: as side_stream (the matmul and relu on a stream the caller's stream never waits for), but only on the
first 12 input sets of each shape it sees (about the warm-up's, the heat's and the first burst's 10 timed calls);
later calls are honest. An input set is new when its tensor is not the one of the call before: the heat repeats one
set, while every timed call gets a set of its own, lent at an address an earlier one may have had (so addresses
cannot tell them apart). A harness that forgives a first burst that seems to leave work running, and keeps its
times, would keep its escaped times.
Expected: flagged, or a reported latency >= 0.7x the honest candidate's (the harness drops that burst and times the
workload again).
"""

import torch

_streams: dict = {}
_sets: dict = {}  # per input shape: [input sets seen so far, the last call's x]
ESCAPING_INPUT_SETS = 12


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return torch.relu(x @ w)
    seen = _sets.setdefault(tuple(x.shape), [0, None])
    new = x is not seen[1]
    if new:
        seen[0] += 1
    seen[1] = x
    if not (new and seen[0] <= ESCAPING_INPUT_SETS):
        return torch.relu(x @ w)
    side = _streams.setdefault(x.device, torch.cuda.Stream(device=x.device))
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        out = torch.relu(x @ w)
    return out
