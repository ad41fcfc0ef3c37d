"""What the judge checks in what the candidate's process reports, beyond its types (wire.py): the flags sent with
every output and burst, and a burst's timings. A failed check is Failure("suspicious") naming what it saw."""

from __future__ import annotations

from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.reporting import Failure


def check_flags(flags: dict, where: str) -> None:
    """The in-process guards' flags (wire.parse_flags: already of the protocol's types): any finding is a cheat.
    They are a first filter that names the cheat; a candidate that silenced them meets the judge's own checks."""

    def named(found: list[str]) -> str:
        return ", ".join(found)[:300]

    if flags["interpreter_hooks"]:
        raise Failure("suspicious", f"{where}: the candidate installed {named(flags['interpreter_hooks'])}: Python "
                      "would run its code between a call's return and the copy of its output, untimed")
    if flags["library_patches"]:
        raise Failure("suspicious", f"{where}: the candidate replaced {named(flags['library_patches'])}, which the "
                      "harness calls between making its inputs and timing it: its code would run there, untimed")
    if flags["harness_changed"]:  # integrity.py
        raise Failure("suspicious", f"{where}: the candidate changed the harness's own objects in its process "
                      f"({named(flags['harness_changed'])}): they time its calls, so its timings cannot be trusted")
    if flags["introspection"]:  # audit.py
        raise Failure("suspicious", f"{where}: the candidate reached for the harness's own objects "
                      f"({named(flags['introspection'])}): blocked, as it could change how its calls are timed")
    if flags["persisting_l2_bytes"]:
        raise Failure("suspicious", f"{where}: the candidate reserved {flags['persisting_l2_bytes']} bytes of "
                      "persisting L2 cache, which survives the harness's cache flush")


def work_us(times: list[float]) -> float:
    """A timed call's device time ([device, tail, probe, host, launch, ...] us) less the part of its host's launch
    that the launch cover's hold (POLICY.cover_s) did not hide: a launch longer than the hold (a Python-heavy call
    path, CuPy's argument packing) leaves the device idle between the call's events, while back-to-back untimed calls
    hide it behind the call before. At most POLICY.launch_allowance_us: a call that waits for the device inside
    itself has a launch as long as its work."""
    idle = min(max(0.0, times[4] - POLICY.cover_s * 1e6), POLICY.launch_allowance_us)
    return max(0.0, times[0] - idle)


def check_burst_timings(timed: list[list[float]], untimed: float | None, where: str, floor_us: float = 0.0,
                        reference: tuple[float, float] | None = None) -> None:
    """A burst's calls ([device, tail, probe, host, launch, own] us each, of the protocol's types): untimed calls on
    repeated inputs not much faster than timed ones on fresh inputs, and no call whose device time exceeds the host
    time around it. A timed call's work is ``work_us``: its device time less a launch the cover did not hide.
    ``floor_us``: the device time of a timed call that does nothing, measured by the judge's calibration before any
    candidate code existed: every timed call carries it (flush, cover, events), back-to-back untimed calls do not, so
    only the work above it is compared. ``reference``: the reference's own (untimed, fastest timed work) us in the
    judge, the same procedure: repeated inputs are warm in L2 where fresh ones come after the flush, which speeds an
    honest memory-bound kernel up several times; the candidate is held to at most that speed-up."""
    # Against the fastest timed call: a timed call slowed by the GPU (a clock state, another process) must
    # not make an honest candidate suspicious.
    fastest = min(work_us(t) for t in timed)
    floor = min(max(0.0, floor_us), fastest)
    expected, why = fastest - floor, ""
    if reference is not None and reference[1] - floor > 0:
        warm = min(1.0, max(0.0, reference[0] / (reference[1] - floor)))
        expected, why = expected * warm, f", and the reference itself ran repeated inputs at {warm:.2f} of that"
    if untimed is not None and untimed < POLICY.untimed_ratio * expected:
        raise Failure("suspicious", f"{where}: untimed calls on repeated inputs (the heat before the timed "
                      f"calls) took {untimed:.1f} us, the fastest timed call on fresh inputs "
                      f"{fastest:.1f} us of work ({floor:.1f} us of it the floor of a call that does nothing{why}): "
                      "the candidate does less work when it sees inputs again (cached results?)")
    for us, _tail, _probe, host_us, *_ in timed:
        if us < 0 or us > host_us * 1.05 + 50:
            raise Failure("suspicious", f"{where}: the device time ({us:.0f} us) is negative or exceeds the "
                          f"host time around the call ({host_us:.0f} us): the timer was tampered with")
