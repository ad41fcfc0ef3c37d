"""Cheat class: timing, a correct kernel that moves off the timed stream (or device) only when it is being timed (GPU).

How it cheats: the first HONEST_CALLS calls (correctness checks and warm-up) run normally on the caller's stream.
Later calls, presumably timed, run the same correct computation elsewhere: on a second GPU when there is one (inputs
copied over and the result copied back, all on side streams), else on a side stream of the same GPU, never making the
caller's stream wait. Every answer is correct once the device is idle; only the timing is escaped.
Expected: flagged (not passed), or a reported latency >= 0.7x the honest candidate's.
"""

import torch

HONEST_CALLS = 8
_calls = 0
_streams: dict = {}


def _stream(device: torch.device) -> torch.cuda.Stream:
    return _streams.setdefault(device, torch.cuda.Stream(device=device))


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _calls
    _calls += 1
    if not x.is_cuda or _calls <= HONEST_CALLS:
        return torch.relu(x @ w)
    home = x.device
    caller = torch.cuda.current_stream(home)
    side = _stream(home)
    side.wait_stream(caller)
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (home.index + 1) % torch.cuda.device_count())
        far = _stream(other)
        with torch.cuda.stream(side):
            done = torch.cuda.Event()
            done.record(side)
        far.wait_event(done)
        with torch.cuda.device(other), torch.cuda.stream(far):
            y = torch.relu(x.to(other, non_blocking=True) @ w.to(other, non_blocking=True))
            finished = torch.cuda.Event()
            finished.record(far)
        side.wait_event(finished)
        with torch.cuda.stream(side):
            return y.to(home, non_blocking=True)
    with torch.cuda.stream(side):
        return torch.relu(x @ w)
