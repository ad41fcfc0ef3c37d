"""What the judge checks in what the candidate's process reports before it believes it: the flags sent with every
output and burst, and a burst's timings. A failed check is Failure("suspicious") naming what the candidate did."""

from __future__ import annotations

import math

from .policy import POLICY
from .protocol import Flags
from .reporting import Failure


def check_flags(flags: Flags, where: str) -> None:
    """The flags the candidate's process sends with an output or a burst: any of them set is a cheat."""
    if not isinstance(flags, Flags):
        raise Failure("suspicious", f"{where}: the candidate's process sent {type(flags).__name__[:40]} where its "
                      "flags belong")

    def named(found) -> str:  # what the candidate's process listed (its own data: any type)
        return (", ".join(map(str, found)) if isinstance(found, list) else str(found))[:300]

    if flags.interpreter_hooks:
        raise Failure("suspicious", f"{where}: the candidate installed {named(flags.interpreter_hooks)}: Python "
                      "would run its code between a call's return and the copy of its output, untimed")
    if flags.library_patches:
        raise Failure("suspicious", f"{where}: the candidate replaced {named(flags.library_patches)}, which the "
                      "harness calls between making its inputs and timing it: its code would run there, untimed")
    if flags.harness_changed:  # integrity.py
        raise Failure("suspicious", f"{where}: the candidate changed the harness's own objects in its process "
                      f"({named(flags.harness_changed)}): they time its calls, so its timings cannot be trusted")
    if flags.introspection:  # audit.py
        raise Failure("suspicious", f"{where}: the candidate reached for the harness's own objects "
                      f"({named(flags.introspection)}): blocked, as it could change how its calls are timed")
    if flags.persisting_l2_bytes:
        raise Failure("suspicious", f"{where}: the candidate reserved {flags.persisting_l2_bytes} bytes of "
                      "persisting L2 cache, which survives the harness's cache flush")


def check_burst_timings(timed, prints, untimed, count: int, where: str) -> None:
    """A burst's reply (``Timed``): ``count`` sets of 4 finite numbers (device, tail, probe, host us) and as many
    fingerprints, untimed calls on repeated inputs not much faster than timed ones on fresh inputs, and no call
    whose device time exceeds the host time around it."""
    if not (isinstance(timed, list) and isinstance(prints, list) and len(timed) == len(prints) == count
            and all(isinstance(t, (list, tuple)) and len(t) == 4 and all(
                isinstance(v, float) and math.isfinite(v) and v >= -1e6 for v in t) for t in timed)
            and (untimed is None or isinstance(untimed, float) and math.isfinite(untimed))):
        raise Failure("suspicious", f"{where}: the candidate's process sent timings that are not "
                      f"{count} sets of 4 finite numbers (device, tail, probe, host)")
    # Against the fastest timed call: a timed call slowed by the GPU (a clock state, another process) must
    # not make an honest candidate suspicious.
    fastest = min(t[0] for t in timed)
    if untimed is not None and untimed < POLICY.untimed_ratio * fastest:
        raise Failure("suspicious", f"{where}: untimed calls on repeated inputs (the heat before the timed "
                      f"calls) took {untimed:.1f} us, the fastest timed call on fresh inputs "
                      f"{fastest:.1f} us: "
                      "the candidate does less work when it sees inputs again (cached results?)")
    for us, tail, probe, host_us in timed:
        if us < 0 or us > host_us * 1.05 + 50:
            raise Failure("suspicious", f"{where}: the device time ({us:.0f} us) is negative or exceeds the "
                          f"host time around the call ({host_us:.0f} us): the timer was tampered with")
