"""Every timing constant of the harness, in one frozen ``TimingPolicy``; ``POLICY`` is the one both processes use.

A frozen dataclass, not a pydantic model: the judge and the candidate's process import only the standard library,
torch and this package (pydantic is not among them), and nothing here is read from user input. The figures behind
each default are in docs/timing.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingPolicy:
    # How many timed calls: at least min_runs (min_runs_gpu on a GPU), at most max_runs, per workload.
    min_runs: int = 3  # timed calls per workload at least, on CPU
    min_runs_gpu: int = 10  # on a GPU: three steady calls can all come from one clock state
    max_runs: int = 100  # timed calls per workload at most
    # The heat: the candidate's own calls back to back before a burst, so timed calls run under sustained load.
    heat_s: float = 0.02  # heat before a later burst of a workload that is not power-limited
    heat_window_s: float = 0.025  # one window of a first heat; it ends when a window is no slower than the last
    heat_min_s: float = 0.2  # least heat of a power-limited workload's burst
    first_heat_min_s: float = 0.3  # least first heat of a process's first power-limited workload (a cool GPU)
    heat_max_s: float = 0.5  # longest first heat
    unlimited_heat_windows: tuple[int, int] = (2, 4)  # windows before a heat may call a kernel not power-limited
    # (later workloads, a process's first)
    # When a workload counts as power-limited (guards the lower clock that sustained load brings).
    clock_limited: float = 0.97  # SM clock below this share of its top: held (only without a power reading)
    power_limited: float = 0.95  # NVML instantaneous power at this share of the enforced limit: limited
    load_slowdown: float = 0.03  # calls slowing by more than this over the heat: limited, when near the cap...
    slowdown_power: float = 0.8  # ... that is, at this share of the power limit or more
    # Fillers: untimed calls between timed calls of a power-limited workload.
    fill_duty: float = 0.92  # share of the time the candidate's calls fill between timed calls
    fill_max: float = 16.0  # fillers per gap at most, in timed calls' time
    # The launch cover and the L2 flush before each timed call.
    cover_s: float = 20e-6  # how long the cover holds every SM (covers the host's launch; a forger may skip it)
    # On a GPU, the judge and the candidate's process may poll their socket for this long instead of sleeping when
    # a timed call's message is due. Off: on an H100 host it narrowed the overhead's spread about 5x, but the round
    # trip of some workloads then took 1.5-3 ms more than calibrated, which failed honest kernels
    # (docs/timing.md, "Polling instead of sleeping").
    spin_wait_s: float = 0.0
    flush_bytes: int = 256 << 20  # bytes written to flush the L2 (at least 2x any current GPU's L2)
    # The stopping rule (timing.precise_enough).
    target_rse: float = 0.01  # stop once the mean's relative standard error is below this
    target_rse_limited: float = 0.005  # the same, for a power-limited workload (judged on burst means too)
    limited_min_bursts: int = 3  # bursts of a power-limited workload, where they fit in the budget
    # What the judge checks.
    # Untimed calls faster than this share of the fastest timed one: suspicious. An honest memory-bound kernel whose
    # inputs fit in L2 runs 2-5x faster warm than after the flush on fresh memory; a cache answers at a copy's speed.
    untimed_ratio: float = 0.2
    # A timed call's launch beyond the cover's hold that the check counts as the device idling, not as work: more
    # than a Python-heavy launch takes (CuPy's 40-60 us on a cold host); a candidate that waits for the device inside
    # its call gains no more than this from it.
    launch_allowance_us: float = 100.0
    escape_slack_us: float = 10.0  # device work past a call's end event (a burst's mean) allowed before it counts
    check_probability: float = 0.2  # share of timed calls (besides the first and last) whose output is re-checked
    # The judge's own clock around each timed call bounds the reported time (time_bound.py).
    # A burst's floor: this quantile of its calls' (a forged clock shortens every call; a busy or lent host stalls
    # a share of the steps around a call, on CPU and on a GPU host alike).
    bound_quantile: float = 0.25
    bound_quantile_cpu: float = 0.25
    bound_max_dropped: int = 3  # contradicted bursts of a workload dropped and timed again before one fails it (GPU)
    bound_max_dropped_cpu: int = 1
    bound_rel_slack: float = 0.10  # a call may report this share less than the judge's interval leaves for it
    bound_rel_slack_cpu: float = 0.10  # on CPU (CPU time of the whole tree against the call's wall time)
    bound_noise_spreads: float = 3.0  # ... and this many spreads of the calibrated overhead less
    bound_min_noise_us: float = 5.0  # the overhead's spread is never taken to be smaller than this (GPU host)
    bound_min_noise_us_cpu: float = 30.0  # on CPU
    bound_overhead_slack: float = 0.1  # ... and this share of the overhead less (the host drifting from calibration)
    bound_overhead_slack_cpu: float = 0.5  # on CPU: a busy SMT sibling slows the steps around a call
    bound_hiccup_us: float = 50_000.0  # one stall a burst may hold beyond the calibration's worst (its sum's check)
    calibration_calls: int = 8  # calls of a do-nothing function per timed workload, before the candidate's import
    # Burst memory: a burst's inputs and output copies, kept until the judge has checked some.
    burst_memory_share: int = 8  # at most 1/burst_memory_share of the GPU's memory
    burst_bytes_cpu: int = 256 << 20  # on CPU

    def later_heat_s(self, limited: bool) -> float:
        """The heat before a workload's later bursts: heat_min_s if power-limited, else heat_s."""
        return self.heat_min_s if limited else self.heat_s


POLICY = TimingPolicy()
