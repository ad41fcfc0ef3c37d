"""The wire between the judge and the candidate's process (harness/wire.py): what the judge accepts of what the
candidate's process sends is exactly the protocol's schema; descriptors travel only from the judge; memory it lends
holds what it wrote, both ways (harness/shared_memory.py, lending.py); and the two processes import only the standard
library, torch and the harness."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ksearch_graph.harness import lending, wire
from ksearch_graph.harness.shared_memory import Region

ROOT = Path(__file__).resolve().parents[1]
FLAGS = {"reference_calls": 0, "power_limited": False, "heat_s": 0.0, "fill_s": 0.0, "interpreter_hooks": None,
         "library_patches": None, "persisting_l2_bytes": None, "harness_changed": None, "introspection": None}
OUTPUT = {"tensors": [[0, "float32", [2, 3]]], "tuple": False}


def raw(kind: str, **fields) -> bytes:
    return json.dumps({"type": kind, **fields}).encode()


def test_every_message_of_the_candidates_side_parses_as_its_type():
    for msg in (wire.Loaded({"network_isolated": "yes", "device": "cpu", "host_spin_wait": False,
                             "launch_cover": "none"}), wire.Prepared(), wire.Imported(1.5),
                wire.Output(OUTPUT, 0.1, FLAGS), wire.Warmed(0.1), wire.Ready(3),
                wire.Done(3, [1.0, 2.0, 0.5, 3.0, 2.0, 9.0], {"other": "NoneType"}), wire.Timed(FLAGS, None),
                wire.Error("runtime_error", "boom")):
        got = wire.parse(wire.encode(msg), (type(msg),))
        assert type(got) is type(msg)


@pytest.mark.parametrize("data, why", [
    (raw("Done", index=0, times=[{"__tensor__": 1}, 0, 0, 0, 0, 0], output=OUTPUT), "finite number"),
    (raw("Done", index=True, times=[1.0, 0, 0, 0, 0, 0], output=OUTPUT), "an int"),  # a bool is not an int
    (raw("Done", index=0, times=[1.0, 0, 0, 0], output=OUTPUT), "times are"),
    (b'{"type": "Done", "index": 0, "times": [NaN, 0, 0, 0, 0, 0], "output": {"other": "x"}}', "not a JSON"),
    (b'{"type": "Done", "index": 0, "times": [1e999, 0, 0, 0, 0, 0], "output": {"other": "x"}}', "finite"),
    (raw("Done", index=0, times=[1.0, 0, 0, 0, 0, 0], output=OUTPUT, extra=1), "other fields"),
    (raw("Done", index=0, times=[1.0, 0, 0, 0, 0, 0], output={"tensors": [[0, "object", [2]]], "tuple": False}),
     "unknown dtype"),
    (raw("Done", index=0, times=[1.0, 0, 0, 0, 0, 0], output={"tensors": [[-256, "float32", [2]]], "tuple": False}),
     "an int in"),
    (raw("Timed", flags=FLAGS | {"power_limited": "yes"}, untimed_median_us=None), "true or false"),
    (raw("Timed", flags=FLAGS | {"extra": 1}, untimed_median_us=None), "other fields"),
    (raw("Output", output=OUTPUT, seconds=0.1, flags=FLAGS | {"harness_changed": "x" * 400}), "a list"),
    (raw("Go", index=0), "does not send"),  # a judge's message
    (raw("Error", status="passed", message="x"), "unknown status"),  # the candidate cannot pass itself
    (b"\x80\x04\x95", "not a JSON"),  # a pickle
    (b"[1, 2]", "without a type"),
])
def test_what_is_off_the_schema_is_refused(data, why):
    with pytest.raises(wire.Malformed, match=why):
        wire.parse(data, (wire.Done, wire.Timed, wire.Output))


def test_an_expected_type_is_enforced_but_an_error_is_always_heard():
    with pytest.raises(wire.Malformed, match="not Done"):
        wire.parse(wire.encode(wire.Ready(1)), (wire.Done,))
    assert isinstance(wire.parse(wire.encode(wire.Error("timeout", "slow")), (wire.Done,)), wire.Error)


def test_descriptors_travel_from_the_judge_and_are_dropped_from_the_candidate():
    judge, candidate = (wire.Channel(s) for s in wire.pair())
    region = Region.make(1 << 12, "cpu")
    judge.send(wire.Lend(region.nbytes), (region.fd,))
    msg, fds = candidate.receive_from_judge()
    assert msg == wire.Lend(region.nbytes) and len(fds) == 1
    # The candidate's process sends a descriptor of its own: the judge's reader takes no descriptor at all.
    r, w = os.pipe()
    candidate.sock.sendmsg([wire.encode(wire.Prepared())], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                          __import__("array").array("i", [r]))])
    with pytest.raises(wire.Malformed, match="descriptors"):
        judge.receive_untrusted()
    # Too long a message.
    candidate.sock.send(b"x" * (wire.MAX_FROM_CANDIDATE + 10))
    with pytest.raises(wire.Malformed, match="over"):
        judge.receive_untrusted()
    for fd in (r, w, *fds):
        os.close(fd)
    region.close()


def test_a_large_message_from_the_judge_travels_in_a_memfd():
    judge, candidate = (wire.Channel(s) for s in wire.pair())
    files = {"reference.py": "x = 1\n" * 60_000}
    judge.send(wire.Import({"reference_files": files}))
    msg, fds = candidate.receive_from_judge()
    assert msg.task["reference_files"] == files and fds == []


def test_lent_inputs_rebuild_as_the_judge_made_them_and_writes_reach_the_judges_view():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    inputs = ({"w": x.t(), "n": 7, "f": 0.5, "d": torch.float16}, [torch.ones(5, dtype=torch.int64), None], "s")
    lent = lending.LentInputs(inputs)  # staged: the candidate's process maps it before it holds anything
    tree, made = lent.tree, lent.regions
    theirs = [Region.take(os.dup(r.fd), r.nbytes, "cpu") for r in made]
    got = lending.rebuild(json.loads(json.dumps(tree)), theirs)
    assert not got[0]["w"].any() and not got[1][0].any()  # no input is there before the judge fills it in
    lent.fill()
    assert got[0]["n"] == 7 and got[0]["d"] is torch.float16 and got[1][1] is None and got[2] == "s"
    assert torch.equal(got[0]["w"], x.t()) and got[0]["w"].stride() == x.t().stride()  # the layout kept
    got[0]["w"].mul_(2)  # the candidate writes into what it was lent: the judge's own view shows it
    assert torch.equal(lending.rebuild(tree, made)[0]["w"], 2 * x.t())
    with pytest.raises(ValueError, match="cannot lend|lends tensors"):
        lending.lend((object(),))


def test_an_output_goes_through_the_slot_and_the_judge_keeps_its_own_copy():
    slot = Region.make(1 << 12, "cpu")
    theirs = Region.take(os.dup(slot.fd), slot.nbytes, "cpu")
    out = (torch.ones(2, 3), torch.arange(4))
    described = wire.parse_output(json.loads(json.dumps(lending.put_output(theirs, out, lambda: None))))
    mine = lending.take_output(slot, described, lambda: None)
    theirs.bytes.fill_(0)  # written after the judge took its copy: reaches nothing the judge compares
    assert torch.equal(mine[0], torch.ones(2, 3)) and torch.equal(mine[1], torch.arange(4))
    assert lending.put_output(theirs, torch.ones(1 << 12), lambda: None)["other"].startswith("an output of")
    assert lending.put_output(theirs, [1, 2], lambda: None) == {"other": "list"}
    lying = {"tensors": [(slot.nbytes - 256, "float32", (1 << 20,))], "tuple": False}
    assert "outside the harness's slot" in lending.take_output(slot, lying, lambda: None)


def test_the_two_processes_import_only_the_standard_library_torch_and_the_harness():
    """Importing the judge's and the runner's modules loads neither torch (the runner leaves its network namespace
    first) nor anything of the rest of ksearch_graph or its LLM stack."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]);"
            "import ksearch_graph.harness.judge.judge, ksearch_graph.harness.candidate.runner;"
            "print(json.dumps(sorted(sys.modules)))")
    mods = json.loads(subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True,
                                     check=True).stdout)
    ours = {m for m in mods if m.startswith("ksearch_graph")}
    assert ours and all(m == "ksearch_graph" or m.startswith("ksearch_graph.harness") for m in ours), ours
    assert "ksearch_graph.harness.parent.client" not in ours
    heavy = [m for m in mods if m.split(".")[0] in ("torch", "triton", "pydantic", "langgraph", "langchain_core")]
    assert heavy == []


def test_spinning_for_a_message_sees_it_or_gives_up_in_time():
    judge, candidate = (wire.Channel(s) for s in wire.pair())
    assert candidate.spin(0.002) is False  # nothing sent: gives up after its time
    judge.send(wire.Taken(3))
    assert candidate.spin(1.0) is True
    assert candidate.receive_from_judge()[0] == wire.Taken(3)
