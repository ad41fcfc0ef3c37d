"""How long a timed call's two hand-overs take (the judge's ``Go`` to the candidate's process, its ``Done`` back)
when both processes poll their socket, around input memory lent per call as the harness lends it.

    python tools/diagnostics/diagnose_handover.py [--device cuda] [--calls 150] [--max-mb 256] [--json FILE]

Why: with ``POLICY.spin_wait_s`` on, an H100 host showed hand-overs of 1.5-3 ms a call on the GQA task's largest
workloads (hundreds of MB of inputs), against 130-250 us elsewhere (docs/timing.md, "Polling instead of
sleeping"). One suspect is the driver work of making, mapping and releasing a fresh VMM region per call. This
measures the hand-over (the judge's round trip less the other process's own time) with no harness around it, for
small and large regions, fresh per call and reused, so the suspect can be confirmed or cleared in seconds.
Needs only torch and this repository (run from its root).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ksearch_graph.harness.wire import Channel  # noqa: E402  (the standard library only, no torch)

MB = 1 << 20
CASES = [("2 MB fresh", 2 * MB, 2 * MB, False), ("256 MB fresh, read all", 256 * MB, 256 * MB, False),
         ("256 MB reused, read all", 256 * MB, 256 * MB, True), ("256 MB fresh, read 1 MB", 256 * MB, MB, False),
         ("2 MB fresh (again)", 2 * MB, 2 * MB, False)]


def poll(sock, seconds: float = 0.05) -> None:
    """Wait for the next message without sleeping, as the harness's polling does (``wire.Channel.spin``)."""
    Channel(sock).spin(seconds)


def send(sock, obj: dict, fds: tuple = ()) -> None:
    data = json.dumps(obj).encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def receive(sock) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_LEN(8 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def other_process(sock, device: str) -> None:
    """The candidate's side: map what it is lent, poll for the go, read the memory, say how long it took."""
    import torch

    from ksearch_graph.harness.shared_memory import Region

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.zeros(1, device="cuda")
        sync()
    send(sock, {"ready": True})
    kept = None
    while True:
        msg, fds = receive(sock)
        if msg.get("exit"):
            os._exit(0)
        region = kept if fds == [] else Region.take(fds[0], msg["nbytes"], device)
        kept = region if msg["reuse"] else None
        send(sock, {"staged": True})
        poll(sock)
        receive(sock)  # go
        t0 = time.perf_counter()
        total = region.bytes[:msg["read"]].sum()
        sync()
        send(sock, {"own_us": (time.perf_counter() - t0) * 1e6})
        receive(sock)  # taken
        del total
        if not msg["reuse"]:
            region.close()
        del region


def one_case(sock, device: str, label: str, size: int, read: int, calls: int, reuse: bool) -> dict:
    """The judge's side of ``calls`` timed calls: (round trip, hand-over) us per call, the first five left out."""
    import torch

    from ksearch_graph.harness.shared_memory import Region

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, kept, started = [], None, time.perf_counter()
    for k in range(calls):
        region = kept or Region.make(size, device)
        send(sock, {"nbytes": region.nbytes, "read": read, "reuse": reuse}, () if kept else (region.fd,))
        kept = region if reuse else None
        receive(sock)  # staged
        region.bytes[:read].fill_(k % 7)  # the inputs, written after the other side mapped the memory
        sync()
        t0 = time.perf_counter()
        send(sock, {"go": True})
        poll(sock)
        done, _ = receive(sock)
        round_trip = (time.perf_counter() - t0) * 1e6
        rows.append((round_trip, round_trip - done["own_us"]))
        send(sock, {"taken": True})
        if not reuse:
            region.close()
    if kept is not None:
        kept.close()
    rows = rows[5:]
    trips, hands = sorted(r for r, _ in rows), sorted(h for _, h in rows)

    def at(values, q):
        return values[int(q * (len(values) - 1))]

    row = {"case": label, "calls": len(rows), "round_trip_median_us": at(trips, 0.5),
           "handover_median_us": at(hands, 0.5), "handover_p90_us": at(hands, 0.9), "handover_max_us": hands[-1],
           "over_1ms": sum(h > 1000 for h in hands), "seconds": time.perf_counter() - started}
    print(f"{label:26s} round trip {row['round_trip_median_us']:7.0f} us | hand-over median "
          f"{row['handover_median_us']:6.0f} p90 {row['handover_p90_us']:6.0f} max {row['handover_max_us']:6.0f} | "
          f"over 1 ms: {row['over_1ms']} of {len(rows)}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--calls", type=int, default=150)
    p.add_argument("--max-mb", type=int, default=256, help="cap on a region's size (a CPU run needs small ones)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()  # before torch is imported: the child makes its own CUDA context
    if pid == 0:
        ours.close()
        other_process(theirs, args.device)
    theirs.close()
    import torch

    if args.device == "cuda":
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    receive(ours)
    cap = args.max_mb * MB
    rows = [one_case(ours, args.device, label, min(size, cap), min(read, cap), args.calls, reuse)
            for label, size, read, reuse in CASES]
    send(ours, {"exit": True})
    os.waitpid(pid, 0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
