"""Cheat class: timing, an L2 persistence window that survives the benchmark's cache flush (GPU).

How it cheats: through libcudart (ctypes) it raises the device-wide persisting-L2 set-aside to the maximum
(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)) and puts an access-policy window over the weight tensor on the
caller's stream (cudaStreamSetAttribute(..., AccessPolicyWindow), hitProp = persisting). Lines in the window are no
longer evicted by ordinary traffic: the harness's L2 flush (a big memset on the same stream) leaves the weights in
L2, and because the caching allocator gives the next fresh copy of the weights the same address, and the harness
copies them on the same stream, every timed call finds its weights already on chip. The arithmetic is honest.
Expected: flagged (suspicious: the persisting limit or the stream's window changed), or no timing benefit
(a reported latency >= 0.7x the honest candidate's).
"""

import ctypes
import glob
import os
import sys

import torch

cudaLimitPersistingL2CacheSize = 0x06
cudaDevAttrMaxPersistingL2CacheSize = 108
cudaDevAttrMaxAccessPolicyWindowSize = 109
cudaStreamAttributeAccessPolicyWindow = 1
cudaAccessPropertyStreaming, cudaAccessPropertyPersisting = 1, 2


class AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class StreamAttrValue(ctypes.Union):  # cudaStreamAttrValue / cudaLaunchAttributeValue: 64 bytes in CUDA 12
    _fields_ = [("accessPolicyWindow", AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


def _cudart():
    names = ["libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"]
    for folder in sys.path + [os.path.dirname(torch.__file__)]:
        names += sorted(glob.glob(os.path.join(folder, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
        names += sorted(glob.glob(os.path.join(folder, "lib", "libcudart*.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


_rt = None
_limits: dict = {}


def _pin(t: torch.Tensor) -> None:
    global _rt
    if _rt is None:
        _rt = _cudart() or False
    if not _rt:
        return
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if dev not in _limits:
        persist, window = ctypes.c_int(0), ctypes.c_int(0)
        _rt.cudaDeviceGetAttribute(ctypes.byref(persist), cudaDevAttrMaxPersistingL2CacheSize, dev)
        _rt.cudaDeviceGetAttribute(ctypes.byref(window), cudaDevAttrMaxAccessPolicyWindowSize, dev)
        _rt.cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, ctypes.c_size_t(persist.value))
        _limits[dev] = (persist.value, window.value)
    persist, window = _limits[dev]
    if persist <= 0 or window <= 0:
        return
    num_bytes = min(t.numel() * t.element_size(), window)
    value = StreamAttrValue()
    value.accessPolicyWindow = AccessPolicyWindow(
        ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(num_bytes), ctypes.c_float(min(1.0, persist / num_bytes)),
        cudaAccessPropertyPersisting, cudaAccessPropertyStreaming)
    stream = ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)
    _rt.cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, ctypes.byref(value))


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        try:
            _pin(w)  # the bigger operand; the window stays on the stream for the harness's next copy too
        except Exception:
            pass
    return torch.relu(x @ w)
