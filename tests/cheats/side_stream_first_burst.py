"""Cheat class: timing, work on a side stream only while the harness might be deciding whether it does (GPU).

How it cheats: as side_stream (the matmul and relu on a stream the caller's stream never waits for), but only on the
first 12 input addresses of each shape it sees (about the warm-up's, the heat's and the first burst's 10 timed calls,
which all exist at once, so their addresses differ; where the allocator gives the warm-up's and the heat's inputs one
address, one more call escapes); later calls are honest. A harness that forgives a first burst that
seems to leave work running, and keeps its times, would keep its escaped times.
Expected: flagged, or a reported latency >= 0.7x the honest candidate's (the harness drops that burst and times the
workload again).
"""

import torch

_streams: dict = {}
_seen: dict = {}  # per input shape: the addresses of the input sets seen so far
ESCAPING_INPUT_SETS = 12


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return torch.relu(x @ w)
    seen = _seen.setdefault(tuple(x.shape), set())
    new = x.data_ptr() not in seen
    seen.add(x.data_ptr())
    if not (new and len(seen) <= ESCAPING_INPUT_SETS):
        return torch.relu(x @ w)
    side = _streams.setdefault(x.device, torch.cuda.Stream(device=x.device))
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        out = torch.relu(x @ w)
    return out
