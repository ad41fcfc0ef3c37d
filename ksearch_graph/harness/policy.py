"""The timing constants of both processes."""

MIN_RUNS, MAX_RUNS = 3, 100
MIN_RUNS_GPU = 10  # three steady samples can all come from one clock state (seen on the H200: 157 vs 133 us)
# Timed calls are measured as under sustained load, the state ``triton.testing.do_bench`` and a serving loop measure
# in. A kernel that drives an H200 past its 700 W limit runs at lower clocks under its own load (an 8192^3 bf16
# matmul: 1.44 ms for the first 50 ms, 1.59-1.63 ms from 150 ms on, SM clock 1500 MHz instead of 1980; a 4096^3:
# 178 us, then 185-190 us at 1740-1815 MHz), and recovers within ~50 ms of lighter work (BENCHMARKS.md, sessions 5
# and 8). Before a workload's first burst of timed calls, the candidate's own calls run back to back on other inputs
# (a heat, HEAT_WINDOW_S at a time, until a window is no slower than the one before). The kernel is power-limited
# when NVML's instantaneous power, read while they run and refreshed within the heat, is at POWER_LIMITED of the
# enforced limit or more (PowerGauge; the clock and its reasons only where the driver has no power reading), or
# when the calls slowed down near the cap (LOAD_SLOWDOWN, SLOWDOWN_POWER). A heat that finds no limit goes on
# until such a power reading exists (NVML refreshes it about every 100 ms on an H200: the second refresh,
# 100-250 ms in); a limited one lasts at least HEAT_MIN_S (FIRST_HEAT_MIN_S for a process's first, from a possibly
# cool GPU), and between timed calls more untimed calls keep the candidate's calls at FILL_DUTY of the time (input
# generation, checks and copies fill the rest, and draw less power), at most FILL_MAX x the timed call's time.
# Other kernels run at top clocks either way and get neither. A later burst of a workload gets HEAT_S, or HEAT_MIN_S
# where it is power-limited: the GPU idled through the judge's checks since the last burst and is back at its top
# clock, and 20 ms of calls do not bring it down again (session 14, H200, two bursts 50 ms apart: a 4096^3 bf16 matmul's
# second burst read 2.9% faster than its first after 20 ms of heat, 0.3% after 200 ms; an 8192^3 1.9% and 0.1%).
HEAT_S, HEAT_WINDOW_S, HEAT_MIN_S, FIRST_HEAT_MIN_S, HEAT_MAX_S = 0.02, 0.025, 0.2, 0.3, 0.5
UNLIMITED_HEAT_WINDOWS = 2, 4  # windows before a heat may call a kernel not power-limited (later, process's first)
CLOCK_LIMITED = 0.97
# 0.95: a 3072^3 bf16 matmul at 640-664 W (0.92-0.95) kept its top clock on an H200; a 4096^3 at 700-759 W
# did not. Calling a kernel limited that is not costs fillers (time), never accuracy; the other way round it reads
# fast.
POWER_LIMITED = 0.95
# Calls that slow down under their own load by more than LOAD_SLOWDOWN (the last heat window against the fastest
# after the first) are limited too, when NVML read at least SLOWDOWN_POWER of the limit during the heat (or has no
# power reading): the cap cannot hold a GPU far below it, and a few-us kernel's window means move by 3% without
# it (session 10: a 64K-element multiply at 358 W of 700 and the softmax example were called limited).
LOAD_SLOWDOWN, SLOWDOWN_POWER = 0.03, 0.8
# An 8192^3 bf16 matmul on an H200 with a 2 ms gap between timed calls, against do_bench (session 9):
# 0.85 / 8: -8.4%, 0.92 / 16: -3.3%, 0.97 / 32: +0.5%, at 0.60, 0.86 and 1.37 s for 20 calls. A 4096^3 read
# -5.5 to -6.8% at all three (do_bench's own figure moves by 2-3% between calls).
FILL_DUTY = 0.92
FILL_MAX = 16.0
# A host that has waited (on the judge's pipe, or asleep) or made inputs on the CPU takes 130-230 us to launch the next
# call instead of ~40 (an H200 host, session 7), and the device idles between the start event and the call's kernels
# meanwhile: a 32 us matmul read 96-190 us. So before each timed call a kernel that flushes the L2 and then holds
# every SM until COVER_S after it started runs on the timed stream, and the host launches the call behind it
# (launch_cover.py, which also says why it fills every SM). Back-to-back use hides launches the same way.
COVER_S = 0.5e-3
UNTIMED_RATIO = 0.5  # untimed calls faster than this share of the timed ones: the candidate tells them apart (a cache)
TARGET_RSE = 0.01  # stop timing once the relative standard error of the mean is below 1%
# A power-limited kernel's calls vary more (an 8192^3 bf16 matmul: 2% per call, its clock moving under the cap), and
# 10 calls left three evaluations 2.5% apart on an H200 (session 9): half the error, for ~4x the calls. Judged on
# burst means (precise_enough), the power-limited matmuls of the calibration rarely reach it: they time until the
# budget is spent (4 bursts of a 4096^3 in 1 s).
TARGET_RSE_LIMITED = 0.005
LIMITED_MIN_BURSTS = 3  # bursts for a power-limited workload, where they fit in the budget (see precise_enough)
FLUSH_BYTES = 256 << 20  # at least 2x the L2 of any current GPU (H200: 50 MB)
SMALL_BLOCK_BYTES = 1 << 20  # torch's caching allocator serves requests up to 1 MB from its small pool (2 MB segments)
ESCAPE_SLACK_US = 10.0  # device work past a call's end event (a burst's mean), before it counts as the call's
CHECK_PROBABILITY = 0.2  # share of timed calls (besides the first and last) whose output is re-checked
# Timed calls run in bursts (see timing.timed_burst), whose inputs and output copies are kept until the judge has picked
# and checked some: at most a BURST_MEMORY_SHARE of the GPU's memory (17.4 GiB of an H200's 139, 10 GiB on an 80 GB
# H100, 3 GiB on a 24 GB card), 256 MB on CPU. Each burst of a power-limited workload gets a heat of its own
# (Timer.heat), so for large inputs the memory decides how many heats there are: TriMul's three largest workloads
# (1.2, 2.0 and 3.5 GB a call) filled a fixed 8 GiB after 7, 4 and 2 calls, 7 later bursts in all; 2 now (session 14).
BURST_MEMORY_SHARE, BURST_BYTES_CPU = 8, 256 << 20
