"""Cheat: a full protocol takeover. The import never returns: it takes the harness's socket (its number is on the
runner's command line) and answers the judge itself, so no in-process guard ever runs again. It computes correct
outputs on the inputs the judge lends, and then lies, by MODE:

- "forged_times": every timed call reported as 1 us.
- "late_output": ``Done`` sent at once, with zeros in the judge's slot; the real output written there just after.
- "forked_worker": the work done in a forked child while this process reports 1 us (the judge's CPU clock used to
  leave out the waits of one thread only).
- "work_ahead": the output worked out on the memory lent for a timed call before the judge's clock starts, and
  ``Done`` sent the moment ``Go`` comes (the memory holds no inputs until the judge has started its clock).
- "minority_lie": every third timed call reported as 1 us, the others as measured (the median stays honest).
- "wildcards": fields of other types than the protocol's (a bool for an int, a dict for a number, an offset outside
  the slot).

Expected: suspicious (the judge's clock, or the schema) or incorrect (the judge's copy of the slot at ``Done``); the
minority lie may pass, counted at what the judge's clock leaves for each call.
"""

import os
import sys
import time

MODE = "forged_times"


def _serve():
    import torch

    from ksearch_graph.harness import wire
    from ksearch_graph.harness.lending import put_output, rebuild
    from ksearch_graph.harness.shared_memory import Region

    channel = wire.Channel(__import__("socket").socket(fileno=int(sys.argv[sys.argv.index("--fd") + 1])))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    flags = dict.fromkeys(wire.FLAG_FIELDS) | {"reference_calls": 0, "power_limited": False, "heat_s": 0.0,
                                               "fill_s": 0.0}
    # The slot the judge lent before the import: an informed attacker takes it from the runner that imports it
    # (walking up from its own frame through f_back raises no audit event).
    slot, frame = None, sys._getframe(0)
    while frame is not None and slot is None:
        slot = getattr(frame.f_locals.get("self"), "slot", None)
        frame = frame.f_back

    def compute(tree, regions, fds):
        taken = [Region.take(fd, n, "cuda" if d == "cuda" else "cpu") for (d, n), fd in zip(regions, fds)]
        x, w = rebuild(tree, taken)
        return torch.relu(x @ w)

    def in_worker(tree, regions, fds):
        """The output computed in a forked child, which writes it straight into the slot."""
        pid = os.fork()
        if pid == 0:
            try:
                put_output(slot, compute(tree, regions, fds), sync)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        out = compute(tree, regions, fds)  # only for its shape: the child already wrote the same values
        return {"tensors": [[0, "float32", list(out.shape)]], "tuple": False}

    channel.send(wire.Imported(0.1))
    while True:
        msg, fds = channel.receive_from_judge()
        if isinstance(msg, wire.Exit):
            os._exit(0)
        if isinstance(msg, wire.Lend):
            slot = Region.take(fds[0], msg.nbytes, device)
        elif isinstance(msg, wire.Warm):
            channel.send(wire.Warmed(1e-6))
        elif isinstance(msg, wire.Call):
            channel.send(wire.Output(put_output(slot, compute(msg.inputs, msg.regions, fds), sync), 1e-6, flags))
        elif isinstance(msg, wire.Burst):
            for k in range(msg.count):
                channel.send(wire.Ready(k))
                go, fds = channel.receive_from_judge()  # Stage: the memory, empty until the judge's clock runs
                ahead = put_output(slot, compute(go.inputs, go.regions, fds), sync) if MODE == "work_ahead" else None
                channel.send(wire.Staged(k))
                channel.receive_from_judge()  # Go
                if ahead is not None:
                    channel.send(wire.Done(k, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], ahead))
                elif MODE == "late_output":
                    slot.bytes.zero_()
                    sync()
                    x_shape = [r for r in go.inputs[1]]  # ["T", region, offset, dtype, shape, strides] of x and w
                    shape = [x_shape[0][4][0], x_shape[1][4][1]]
                    channel.send(wire.Done(k, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], {"tensors": [[0, "float32", shape]],
                                                                      "tuple": False}))
                    put_output(slot, compute(go.inputs, go.regions, fds), sync)  # the real answer, computed late
                elif MODE == "forked_worker":
                    channel.send(wire.Done(k, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], in_worker(go.inputs, go.regions, fds)))
                elif MODE == "minority_lie":
                    t0 = time.perf_counter()
                    output = put_output(slot, compute(go.inputs, go.regions, fds), sync)
                    us = 1.0 if k % 3 == 1 else (time.perf_counter() - t0) * 1e6
                    channel.send(wire.Done(k, [us, 0.0, 0.0, us, us, us], output))
                elif MODE == "wildcards":
                    output = put_output(slot, compute(go.inputs, go.regions, fds), sync)
                    channel.sock.send(wire.json.dumps({"type": "Done", "index": True, "times": [
                        {"dtype": "float16", "value": "inf"}, 0, 0, 0], "output": output}).encode())
                else:
                    output = put_output(slot, compute(go.inputs, go.regions, fds), sync)
                    channel.send(wire.Done(k, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], output))
                channel.receive_from_judge()  # Taken
            channel.send(wire.Timed(flags, None))
        time.sleep(0)


_serve()


def kernel(x, w):  # never reached
    raise AssertionError("the import never returns")
