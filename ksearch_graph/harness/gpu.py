"""What the harness asks of the GPU beyond torch: the CUDA runtime (host spin-wait, persisting L2), NVML (power,
clocks), the launch cover (``launch_cover.py``), and whether the GPU still works after a candidate failed."""

from __future__ import annotations

import ctypes
import importlib

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.reporting import progress


class CudaRuntime:
    """The few CUDA runtime calls torch does not expose, through the libcudart torch already loaded."""

    LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize

    def __init__(self):
        self.lib = None
        self.default_persisting_l2 = 0
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "libcudart.so" in line}
            for path in sorted(paths) or ["libcudart.so"]:
                self.lib = ctypes.CDLL(path)
                break
        except OSError:
            self.lib = None
        # Spin while waiting for the device, set before the context exists: a host thread that yields can wake up
        # tens of us late, and the escape check compares wake-ups (docs/timing.md, "The launch cover and the flush").
        self.spin_wait = self.lib is not None and self.lib.cudaSetDeviceFlags(1) == 0  # cudaDeviceScheduleSpin
        # The device's own persisting-L2 carve-out, read before any candidate code runs.
        self.default_persisting_l2 = self.persisting_l2_bytes() or 0

    def pci_bus_id(self) -> bytes | None:
        """The current device's PCI bus id ("0000:3B:00.0"), which NVML knows it by (its indices ignore
        CUDA_VISIBLE_DEVICES)."""
        if self.lib is None:
            return None
        buf, device = ctypes.create_string_buffer(64), ctypes.c_int(0)
        if self.lib.cudaGetDevice(ctypes.byref(device)) != 0 or self.lib.cudaDeviceGetPCIBusId(buf, 64, device) != 0:
            return None
        return buf.value

    def persisting_l2_bytes(self) -> int | None:
        if self.lib is None:
            return None
        value = ctypes.c_size_t(0)
        if self.lib.cudaDeviceGetLimit(ctypes.byref(value), self.LIMIT_PERSISTING_L2) != 0:
            return None
        return value.value

    def reset_persisting_l2(self) -> None:
        """Evict persisting lines (a flush cannot: it is what they survive) and restore the device's carve-out."""
        if self.lib is not None:
            self.lib.cudaCtxResetPersistingL2Cache()
            self.lib.cudaDeviceSetLimit(self.LIMIT_PERSISTING_L2, ctypes.c_size_t(self.default_persisting_l2))


class NvmlValue(ctypes.Union):
    """nvmlValue_t (nvml.h); ``NvmlField.valueType`` says which member NVML wrote (the order of KINDS)."""
    KINDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class NvmlField(ctypes.Structure):
    """nvmlFieldValue_t (nvml.h): one value of nvmlDeviceGetFieldValues. Its timestamp is when the value was asked
    for, not when the driver measured it: a fresh reading is one that changed."""
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", NvmlValue)]

    def number(self) -> float | None:
        if self.nvmlReturn != 0 or not 0 <= self.valueType < len(NvmlValue.KINDS):
            return None
        return float(getattr(self.value, NvmlValue.KINDS[self.valueType]))


class PowerGauge:
    """What NVML (the driver's libnvidia-ml, loaded by ctypes) says about the GPU's power limit: ``read()`` gives
    whether the clock is held now (the SM clock below clock_limited of its top clock, or a clock-event reason that
    says the power cap or a slowdown holds it: THROTTLED) and the instantaneous power; ``at_limit`` compares the
    power with the enforced limit (POLICY.power_limited). ``Timer.heat`` decides which reading counts: the power
    tells early, the clock and its reasons lag the load (docs/timing.md, "Which kernels are power-limited").
    """

    SM, POWER_INSTANT = 1, 186  # NVML_CLOCK_SM, NVML_FI_DEV_POWER_INSTANT (mW)
    THROTTLED = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, HW power brake

    def __init__(self, pci_bus_id: bytes | None):
        self.lib = self.handle = self.reasons = self.field_values = None
        self.top = self.limit_mw = 0
        self.has_power = False  # the driver has the instantaneous power field (r535 on) and an enforced limit
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            handle, top, limit = ctypes.c_void_p(), ctypes.c_uint(0), ctypes.c_uint(0)
            if pci_bus_id and lib.nvmlInit_v2() == 0 \
                    and lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, ctypes.byref(handle)) == 0 \
                    and lib.nvmlDeviceGetMaxClockInfo(handle, self.SM, ctypes.byref(top)) == 0 and top.value:
                self.lib, self.handle, self.top = lib, handle, top.value
                if lib.nvmlDeviceGetEnforcedPowerLimit(handle, ctypes.byref(limit)) == 0:
                    self.limit_mw = limit.value
                # Renamed from ...ThrottleReasons in driver 535; either reads the same bits.
                self.reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
                    lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
                self.field_values = getattr(lib, "nvmlDeviceGetFieldValues", None)
                self.has_power = self.power() is not None
        except (OSError, AttributeError):
            pass

    @property
    def available(self) -> bool:
        return self.lib is not None

    def power(self) -> float | None:
        """Instantaneous power in W; None where the driver has no such field or no enforced limit to compare it
        with, or the query failed. NVML refreshes it about every 100 ms, and its timestamp is the query's
        (NvmlField): a fresh reading is one that changed."""
        field = NvmlField(fieldId=self.POWER_INSTANT)
        if not self.limit_mw or self.field_values is None \
                or self.field_values(self.handle, 1, ctypes.byref(field)) != 0:
            return None
        mw = field.number()
        return None if mw is None else mw / 1e3

    def read(self) -> tuple[bool, float | None]:
        """(whether the clock is held now: below clock_limited of its top, or a THROTTLED reason; ``power()``)."""
        now, reasons = ctypes.c_uint(0), ctypes.c_ulonglong(0)
        held = self.lib.nvmlDeviceGetClockInfo(self.handle, self.SM, ctypes.byref(now)) == 0 \
            and now.value < POLICY.clock_limited * self.top
        held = held or (self.reasons is not None and self.reasons(self.handle, ctypes.byref(reasons)) == 0
                        and bool(reasons.value & self.THROTTLED))
        return held, self.power()

    def at_limit(self, watts: float, share: float = POLICY.power_limited) -> bool:
        return watts * 1e3 >= share * self.limit_mw


def launch_cover(flush) -> tuple:
    """(cover, what it is): the Triton kernel of launch_cover.py; where Triton cannot build it, a one-thread spin
    and the flush, which cover the launch as well but let work on other streams run beside them (the result's
    environment says which ran)."""
    torch = load_torch()
    try:
        cover = importlib.import_module(f"{__package__}.launch_cover")
        return cover.LaunchCover(flush, POLICY.cover_s), "every SM held"
    except Exception as e:  # noqa: BLE001 - any failure to build it leaves the weaker cover, reported
        spin, zero_, cycles = torch.cuda._sleep, torch.Tensor.zero_, int(POLICY.cover_s * 2e9)

        def cover():
            spin(cycles)
            zero_(flush)

        progress(f"launch cover: Triton kernel unavailable ({type(e).__name__}: {e}); a one-thread spin instead")
        return cover, f"one-thread spin ({type(e).__name__}: {str(e)[:160]})"



def gpu_healthy() -> bool:
    torch = load_torch()
    try:
        x = torch.ones(1 << 20, device="cuda")
        return float(x.sum()) == float(1 << 20)
    except Exception:
        return False

