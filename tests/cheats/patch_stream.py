"""Cheat class: timing, monkey-patching what the timer calls: torch.cuda.current_stream, which
torch.cuda.Event.record looks up each time it is called without a stream.

How it cheats: a harness that records its events with ``event.record()`` calls torch.cuda.current_stream() after
a timed call's inputs exist and before its start event. This candidate replaces it with a version that, the first
time it runs after each of the kernel's calls, finds the newest pair of input tensors through the garbage collector,
computes relu(x @ w) for them on the spot (before the start event: untimed) and keeps it under their addresses;
the kernel returns the kept answer when there is one. On CPU nothing calls current_stream, and the kernel is
honest.
Expected: suspicious (the harness names torch functions the candidate replaced; on a GPU its timer does not call
torch.cuda.current_stream either), or no faster than the honest candidate.
"""

import gc

import torch

_current_stream = torch.cuda.current_stream
_answers: dict = {}
_armed = [False]


def _work_ahead():
    tensors = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.is_cuda and o.dim() == 2
               and o.dtype == torch.float32]
    for x in tensors:
        for w in tensors:
            if x is not w and x.shape[1] == w.shape[0] and x.shape[1] != x.shape[0]:
                key = (x.data_ptr(), w.data_ptr())
                if key not in _answers:
                    _answers[key] = torch.relu(x @ w)


def current_stream(device=None):
    if _armed[0]:
        _armed[0] = False
        _work_ahead()
    return _current_stream(device)


torch.cuda.current_stream = current_stream


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _armed[0] = True
    kept = _answers.pop((x.data_ptr(), w.data_ptr()), None)
    if kept is not None and kept.shape == (x.shape[0], w.shape[1]):
        return kept
    return torch.relu(x @ w)
