"""The messages between the judge and the candidate's process: named types that pickle as plain data, read by the
judge's strict unpickler; and the two processes' import set (the standard library, torch and the harness only)."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch

from ksearch_graph.harness import protocol
from ksearch_graph.harness.protocol import Error, Flags, Next, Output, Timed, TensorsOnly

ROOT = Path(__file__).resolve().parents[1]


def through_the_socket(message):
    """What the judge reads of ``message`` as the candidate's process sends it (ForkingPickler, as Connection.send)."""
    return TensorsOnly(io.BytesIO(bytes(ForkingPickler.dumps(message)))).load()


def test_every_reply_arrives_as_the_named_type_with_its_tensors():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    replies = [
        Output(x, [x.clone(), {"k": 2}], [((2, 3), "torch.float32", 1, 0, 2)], 0.5, Flags(power_limited=True)),
        Timed([[1.0, 2.0, 3.0, 4.0]], [[((2, 3), "torch.float32", 1, 0, 2)]], Flags(heat_s=0.2), None),
        Next(3), Error("runtime_error", "boom"), protocol.Loaded({"device": "cpu"}), protocol.Ready(1.5),
        protocol.Warmed(0.1), protocol.Pong(), protocol.Armed(412.5),
        Timed([[1.0, 2.0, 3.0, 4.0]], [None], Flags(harness_changed=["the timer.perf"], introspection=["gc.get_objects"]),
              2.0),
    ]
    for reply in replies:
        got = through_the_socket(reply)
        assert type(got) is type(reply)
        assert repr(got) == repr(reply)
    out = through_the_socket(replies[0])
    assert torch.equal(out.out, x) and out.flags.power_limited is True and out.inputs[1] == {"k": 2}


def test_the_judge_rebuilds_no_other_class_and_no_request_type():
    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        through_the_socket(Output(Payload(), None, None, 0.0, Flags()))
    # Requests are the judge's own: a reply that claims to be one is refused like any other class.
    with pytest.raises(pickle.UnpicklingError, match="protocol.Burst"):
        through_the_socket(protocol.Burst("w", {}, 1, 2, True))
    with pytest.raises(pickle.UnpicklingError, match="protocol.Ping"):
        through_the_socket(protocol.Ping())
    # A reply type named with a dotted path (pickle protocol 4) reaches none of its methods.
    data = bytes(ForkingPickler.dumps(Next(1))).replace(b"\x8c\x04Next", b"\x8c\nNext._make")
    with pytest.raises(pickle.UnpicklingError):
        TensorsOnly(io.BytesIO(data)).load()


def test_a_reply_type_with_the_wrong_fields_fails_to_load():
    data = bytes(ForkingPickler.dumps(Next(1)))
    assert isinstance(TensorsOnly(io.BytesIO(data)).load(), Next)
    with pytest.raises(TypeError):  # Next(1, 2): the judge turns this into "suspicious" (RunnerProcess.request)
        TensorsOnly(io.BytesIO(pickle.dumps(_Reduced(Next, (1, 2))))).load()


class _Reduced:
    """Pickles as ``cls(*args)``: how a candidate's process could send a reply type with the wrong fields."""

    def __init__(self, cls, args):
        self.cls, self.args = cls, args

    def __reduce__(self):
        return self.cls, self.args


def test_the_two_processes_import_only_the_standard_library_torch_and_the_harness():
    """Importing the judge's and the runner's modules loads neither torch (the runner leaves its network namespace
    first) nor anything of the rest of ksearch_graph or its LLM stack."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]);"
            "import ksearch_graph.harness.judge, ksearch_graph.harness.runner;"
            "print(json.dumps(sorted(sys.modules)))")
    mods = json.loads(subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True,
                                     check=True).stdout)
    ours = {m for m in mods if m.startswith("ksearch_graph")}
    assert ours and all(m == "ksearch_graph" or m.startswith("ksearch_graph.harness") for m in ours), ours
    assert "ksearch_graph.harness.client" not in ours
    heavy = [m for m in mods if m.split(".")[0] in ("torch", "triton", "pydantic", "langgraph", "langchain_core")]
    assert heavy == []
