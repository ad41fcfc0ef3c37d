"""Memory the judge owns and lends to the candidate's process by file descriptor: inputs the judge made for one call,
and the slot the candidate's process writes each output into, which the judge copies into its own memory at once.

Why descriptors: the candidate's process runs in its own PID namespace (sandbox.py), where CUDA's legacy IPC handles
do not open, and a message naming an address or a path would have the judge act on what the candidate chose. A
descriptor travels over the judge's own socket (SCM_RIGHTS, ``wire.py``) and names nothing.

On CPU a region is a memfd mapped by both processes. On a GPU it is device memory from CUDA's virtual memory API
(``cuMemCreate`` with a POSIX file descriptor handle), mapped into each process's address space; both see the same
bytes. A region lent for one call's inputs is fresh, never lent before: a candidate keeps what it mapped, so memory
it saw once must never carry later inputs.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os

from ksearch_graph.harness._torch import load_torch

ALIGN = 256  # bytes: every tensor in a region starts here or at a multiple (CUDA's allocation alignment)


def aligned(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


class Region:
    """``nbytes`` of memory both processes see, as one uint8 tensor (``bytes``); ``fd`` lends it. Made by the judge
    (``Region.make``) or taken from a descriptor it was lent (``Region.take``).

    The mapping lives as long as any tensor viewing it (the tensors hold what backs them): ``close`` lets go of the
    region, and a candidate that kept a view of its inputs past its call reads memory that is still there, never a
    hole that would crash its process."""

    def __init__(self, nbytes: int, device: str, fd: int, buffer):
        self.nbytes, self.device, self.fd = nbytes, device, fd
        self.bytes = buffer

    @classmethod
    def make(cls, nbytes: int, device: str) -> Region:
        nbytes = max(ALIGN, aligned(nbytes))
        if device == "cuda":
            return _vmm_region(nbytes, None)
        fd = os.memfd_create("ksearch-region", os.MFD_CLOEXEC)
        os.ftruncate(fd, nbytes)
        return _cpu_region(nbytes, fd)

    @classmethod
    def take(cls, fd: int, nbytes: int, device: str) -> Region:
        """The region behind a descriptor this process was lent (the candidate's side); ``fd`` becomes its own."""
        if device == "cuda":
            return _vmm_region(nbytes, fd)
        return _cpu_region(nbytes, fd)

    def view(self, offset: int, dtype, shape: tuple, strides: tuple | None = None):
        """A tensor of ``dtype`` and ``shape`` (row-major, or ``strides`` in elements) over the bytes from ``offset``."""
        torch = load_torch()
        size = torch.empty((), dtype=dtype).element_size()
        count = span_elements(shape, strides)
        if offset < 0 or offset % ALIGN or offset + count * size > self.nbytes:
            raise ValueError(f"{count * size} bytes at offset {offset} do not fit in a region of {self.nbytes}")
        flat = self.bytes[offset:offset + count * size].view(dtype)
        if strides is None:
            return flat.view(shape)
        return flat.as_strided(shape, strides)

    def close(self) -> None:
        self.bytes = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def span_elements(shape: tuple, strides: tuple | None) -> int:
    """Elements a tensor of ``shape`` and non-negative ``strides`` reaches from its first (all of them if row-major)."""
    if any(s == 0 for s in shape):
        return 0
    if strides is None:
        count = 1
        for s in shape:
            count *= s
        return count
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def _cpu_region(nbytes: int, fd: int) -> Region:
    torch = load_torch()
    if os.fstat(fd).st_size < nbytes:
        raise ValueError(f"the descriptor holds {os.fstat(fd).st_size} bytes, not {nbytes}")
    mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    import warnings

    with warnings.catch_warnings():  # frombuffer warns about sharing memory it does not own: that is the point here
        warnings.simplefilter("ignore")
        buffer = torch.frombuffer(mapping, dtype=torch.uint8)
    return Region(nbytes, "cpu", fd, buffer)  # the tensor holds the mmap: unmapped with its last view


# --- GPU: CUDA's virtual memory management API, through the driver library torch already loaded -------------------

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.cache
def _cuda():
    """The CUDA driver's VMM calls, loaded on first use. Cached by functools, not in a module global: a global set
    after the candidate's process took its snapshot of the harness's objects would read as tampering."""
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                 "cuMemAddressFree", "cuMemRelease", "cuMemExportToShareableHandle",
                 "cuMemImportFromShareableHandle", "cuMemGetAllocationGranularity"):
        getattr(lib, name).restype = ctypes.c_int
    lib.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t,
                                ctypes.POINTER(_AllocationProp), ctypes.c_ulonglong]
    lib.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t, ctypes.c_size_t,
                                        ctypes.c_ulonglong, ctypes.c_ulonglong]
    lib.cuMemMap.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_ulonglong,
                             ctypes.c_ulonglong]
    lib.cuMemSetAccess.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, ctypes.POINTER(_AccessDesc),
                                   ctypes.c_size_t]
    lib.cuMemUnmap.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t]
    lib.cuMemAddressFree.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t]
    lib.cuMemRelease.argtypes = [ctypes.c_ulonglong]
    lib.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int,
                                                 ctypes.c_ulonglong]
    lib.cuMemImportFromShareableHandle.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_void_p,
                                                   ctypes.c_int]
    lib.cuMemGetAllocationGranularity.argtypes = [ctypes.POINTER(ctypes.c_size_t),
                                                  ctypes.POINTER(_AllocationProp), ctypes.c_int]
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        if code == 2:  # CUDA_ERROR_OUT_OF_MEMORY
            raise MemoryError(f"{what}: the GPU is out of memory")
        raise RuntimeError(f"{what} failed (CUDA driver error {code})")


class _DeviceBytes:
    """One VMM allocation mapped into this process, as torch.as_tensor reads it (the CUDA array interface). The
    tensors over it hold it; when the last one goes, the range is unmapped and the handle released (after the
    device is idle: no kernel may still use it)."""

    def __init__(self, handle: int, ptr: int, nbytes: int):
        self.handle, self.ptr, self.nbytes = handle, ptr, nbytes
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}

    def __del__(self):
        try:
            load_torch().cuda.synchronize()
            lib = _cuda()
            lib.cuMemUnmap(self.ptr, self.nbytes)
            lib.cuMemAddressFree(self.ptr, self.nbytes)
            lib.cuMemRelease(self.handle)
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone; the process ends anyway
            pass


def _vmm_region(nbytes: int, fd: int | None) -> Region:
    """A new allocation exported as a descriptor (``fd`` None: the judge's side), or the one behind ``fd``."""
    torch = load_torch()
    torch.cuda.init()
    torch.cuda.synchronize()  # the primary context is current on this thread from here on
    lib = _cuda()
    device = torch.cuda.current_device()
    prop = _AllocationProp(type=_PINNED, requestedHandleTypes=_POSIX_FD, location=_Location(_ON_DEVICE, device))
    granularity = ctypes.c_size_t(0)
    _check(lib.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0), "cuMemGetAllocationGranularity")
    size = aligned(nbytes, granularity.value)
    handle = ctypes.c_ulonglong(0)
    imported = fd is not None
    if not imported:
        _check(lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), f"cuMemCreate({size})")
        exported = ctypes.c_int(-1)
        code = lib.cuMemExportToShareableHandle(ctypes.byref(exported), handle.value, _POSIX_FD, 0)
        if code != 0:
            lib.cuMemRelease(handle.value)
            _check(code, "cuMemExportToShareableHandle")
        fd = exported.value
    else:
        _check(lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD),
               "cuMemImportFromShareableHandle")
    ptr = ctypes.c_ulonglong(0)
    try:
        _check(lib.cuMemAddressReserve(ctypes.byref(ptr), size, granularity.value, 0, 0), "cuMemAddressReserve")
        _check(lib.cuMemMap(ptr.value, size, 0, handle.value, 0), "cuMemMap")
        access = _AccessDesc(location=_Location(_ON_DEVICE, device), flags=_READ_WRITE)
        _check(lib.cuMemSetAccess(ptr.value, size, ctypes.byref(access), 1), "cuMemSetAccess")
    except BaseException:
        if ptr.value:
            lib.cuMemUnmap(ptr.value, size)
            lib.cuMemAddressFree(ptr.value, size)
        lib.cuMemRelease(handle.value)
        os.close(fd)
        raise
    buffer = torch.as_tensor(_DeviceBytes(handle.value, ptr.value, size), device="cuda")
    if not imported:  # new physical memory may hold what this process freed before: lent only once zeroed
        buffer.zero_()
        torch.cuda.synchronize()
    return Region(size, "cuda", fd, buffer)
