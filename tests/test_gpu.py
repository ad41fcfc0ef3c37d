"""What the harness reads of the GPU (harness/gpu.py, launch_cover.py): NVML's power, clock and reasons through a
stand-in library, and the launch cover's kernel, compiled for sm_90 without a GPU and run on one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ksearch_graph.harness import _torch, gpu
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.timer import Timer

CUDA = torch.cuda.is_available()


def test_the_power_gauge_reads_nvmls_power_clock_and_reasons():
    """PowerGauge's side of NVML through ctypes, against a fake libnvidia-ml that writes what the real one would:
    the instantaneous power as any of nvmlValue_t's types, failed queries as None, the clock or a power-cap reason
    as held."""
    import ctypes
    from types import SimpleNamespace


    now = {"mhz": 1980, "reasons": 0x0, "field": (1, 812_000), "field_return": 0, "call_return": 0}

    def field_values(handle, count, ref):
        field = ref._obj
        assert count == 1 and field.fieldId == gpu.PowerGauge.POWER_INSTANT
        kind, value = now["field"]
        field.valueType, field.nvmlReturn = kind, now["field_return"]
        setattr(field.value, gpu.NvmlValue.KINDS[kind], value)
        return now["call_return"]

    def clock(handle, which, ref):
        ref._obj.value = now["mhz"]
        return 0

    def reasons(handle, ref):
        ref._obj.value = now["reasons"]
        return 0

    gauge = gpu.PowerGauge(None)  # no PCI bus id: NVML not opened
    assert not gauge.available and not gauge.has_power
    gauge.lib = SimpleNamespace(nvmlDeviceGetClockInfo=clock)
    gauge.top, gauge.limit_mw, gauge.reasons, gauge.field_values = 1980, 700_000, reasons, field_values
    assert gauge.read() == (False, 812.0) and gauge.at_limit(812.0)
    assert ctypes.sizeof(gpu.NvmlField) == 40  # nvml.h's layout: 4 + 4 + 8 + 8 + 4 + 4 + 8
    now["field"] = (0, 664.5e3)  # a double
    assert gauge.power() == 664.5 and not gauge.at_limit(664.5) and gauge.at_limit(665.0)  # 95% of 700 W
    now["field_return"] = 3  # NVML_ERROR_NOT_SUPPORTED in the field
    assert gauge.power() is None
    now["field_return"], now["call_return"] = 0, 999
    assert gauge.power() is None
    now["call_return"] = 0
    gauge.limit_mw = 0  # no enforced limit to compare with
    assert gauge.power() is None
    gauge.limit_mw = 700_000
    now["mhz"] = 1500
    assert gauge.read()[0]
    now["mhz"], now["reasons"] = 1980, 0x4  # the software power cap
    assert gauge.read()[0]
    now["reasons"] = 0x1  # idle: not held
    assert not gauge.read()[0]


COMPILE_THE_COVER = """
import json, re, subprocess, sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ksearch_graph.harness import launch_cover as cover


source = ASTSource(fn=cover._flush_then_hold, constexprs={"BLOCK": cover.BLOCK},
                   signature={"words": "*i64", "n": "i32", "per_block": "i32", "hold_ns": "i32", "BLOCK": "constexpr"})
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": cover.THREADS // 32})
cubin = Path(sys.argv[1]) / "cover.cubin"
cubin.write_bytes(kernel.asm["cubin"])
tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
usage = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                       check=True).stdout
print(json.dumps({"timer": "%globaltimer" in kernel.asm["ptx"], "threads": cover.THREADS, "usage": usage,
                  **{key: int(re.search(key + r":(\\d+)", usage).group(1)) for key in ("REG", "SHARED")}}))
"""


def test_the_launch_cover_fills_every_sm_of_hopper_and_ada_gpus(tmp_path):
    """The launch cover (ksearch_graph/harness/launch_cover.py), compiled for sm_90 without a GPU, with the argument types it
    runs with: it reads the GPU's nanosecond timer, uses no shared memory and few enough registers that its blocks
    fill every thread slot of an SM of 2048 threads (Hopper) or 1536 (Ada), so no other kernel can place a block
    beside it while it holds (what keeps work on another stream from starting before the timed call's start event:
    tests/cheats/overlap_cover.py, and the GPU test below). In a child process: compiling for a GPU here would leave
    Triton's state unfit for the interpreter the task tests use."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_THE_COVER, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["timer"] and got["SHARED"] == 0 and got["REG"] * 2048 <= 65536, got["usage"]  # 64K registers per SM
    assert 2048 % got["threads"] == 0 and 1536 % got["threads"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_launch_cover_holds_the_gpu_then_leaves_the_l2_flushed():
    """On a GPU: the Timer got the Triton cover, not the fallback; it lasts COVER_S; a kernel launched on a
    high-priority stream while it holds ends after it; and it zeroes the whole flush buffer."""

    _torch.load_torch()
    timer = Timer("cuda")
    assert timer.cover_kind == "every SM held", timer.cover_kind
    timer.flush.fill_(1)
    x = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream(priority=-1)
    torch.cuda.synchronize()
    before, after, beside = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    before.record()
    timer.cover()
    after.record()
    with torch.cuda.stream(side):
        x.mul_(2)
        beside.record(side)
    torch.cuda.synchronize()
    assert before.elapsed_time(after) >= POLICY.cover_s * 1e3 * 0.95
    assert after.elapsed_time(beside) >= 0, "a kernel on another stream finished while the cover held the GPU"
    assert int(timer.flush.count_nonzero()) == 0
