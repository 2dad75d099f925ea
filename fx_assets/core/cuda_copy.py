"""Timed host→device copies submitted without giving up the GIL (CUDA driver API; no Dagster).

The fxcache upload (``device_store.DeviceStore.add_fxcaches``) times each staging chunk's copy
between two CUDA events on its copy stream. Submitted through torch, the start event, the copy
and the end event are three calls that each release the GIL and wait to get it back from the 16
reader and hasher threads; while the main thread waits, the copy stream has already run the
start event and sits idle inside the timed interval. On the H200 that idle time made the leg
read 31-34 GB/s with 8 MiB chunks against 53-54 GB/s for the same copies alone
(``benchmarks/results/diag_upload_gilfix.json``). :class:`TimedCopies` queues the three through
``libcuda`` with the GIL held (``ctypes.PyDLL``): nothing runs between them on the host, and
the copies start as soon as their data is in.

The handles are the driver's: a torch stream's ``cuda_stream`` and a tensor's ``data_ptr()``
are a ``CUstream`` and a ``CUdeviceptr``; the caller's thread must have that device's context
current (torch makes a device's primary context current when it is the thread's current device).
"""

from __future__ import annotations

import ctypes
from typing import Any

_DRIVER: list[Any] = []  # libcuda, loaded once (None where absent)


def _driver() -> Any:
    if not _DRIVER:
        try:
            lib = ctypes.PyDLL("libcuda.so.1")  # PyDLL: calls keep the GIL
        except OSError:
            lib = None
        if lib is not None:
            vp, sz = ctypes.c_void_p, ctypes.c_size_t
            lib.cuCtxGetCurrent.argtypes = (ctypes.POINTER(vp),)
            lib.cuCtxGetDevice.argtypes = (ctypes.POINTER(ctypes.c_int),)
            lib.cuEventCreate.argtypes = (ctypes.POINTER(vp), ctypes.c_uint)
            lib.cuEventRecord.argtypes = (vp, vp)
            lib.cuEventSynchronize.argtypes = (vp,)
            lib.cuEventElapsedTime.argtypes = (ctypes.POINTER(ctypes.c_float), vp, vp)
            lib.cuEventDestroy_v2.argtypes = (vp,)
            lib.cuMemcpyHtoDAsync_v2.argtypes = (ctypes.c_uint64, vp, sz, vp)
            for f in ("cuCtxGetCurrent", "cuCtxGetDevice", "cuEventCreate", "cuEventRecord", "cuEventSynchronize",
                      "cuEventElapsedTime", "cuEventDestroy_v2", "cuMemcpyHtoDAsync_v2"):  # fmt: skip
                getattr(lib, f).restype = ctypes.c_int
        _DRIVER.append(lib)
    return _DRIVER[0]


class CudaDriverError(RuntimeError):
    """A CUDA driver call returned an error code."""


def _check(code: int, what: str) -> None:
    if code != 0:
        raise CudaDriverError(f"{what} failed: CUDA driver error {code}")


class TimedCopies:
    """Host→device copies on one stream, each between two timing events, queued with the GIL held.

    :meth:`available` says whether the driver API can be used on this thread (``libcuda`` loads
    and the stream's device's context is current); otherwise the caller keeps its torch path. :meth:`copy` queues
    one copy of ``nbytes`` from pinned host memory to device memory; :meth:`busy_seconds` waits
    for the stream's copies and sums their event intervals. :meth:`close` frees the events.
    """

    def __init__(self, stream_handle: int) -> None:
        self._lib = _driver()
        self._stream = ctypes.c_void_p(stream_handle)
        self._events: list[tuple[ctypes.c_void_p, ctypes.c_void_p, int]] = []

    @staticmethod
    def available(device_index: int) -> bool:
        """Whether ``libcuda`` loads and this thread's current context is device ``device_index``'s
        (a stream and events of two contexts cannot be mixed)."""
        lib = _driver()
        if lib is None:
            return False
        ctx, dev = ctypes.c_void_p(), ctypes.c_int(-1)
        if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
            return False
        return lib.cuCtxGetDevice(ctypes.byref(dev)) == 0 and dev.value == device_index

    def _event(self) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        _check(self._lib.cuEventCreate(ctypes.byref(ev), 0), "cuEventCreate")  # 0: timing on
        return ev

    def copy(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        """Queue ``nbytes`` from host ``src_ptr`` (pinned) to device ``dst_ptr`` on the stream."""
        lib = self._lib
        e0, e1 = self._event(), self._event()  # made first: the three calls below run back to back
        self._events.append((e0, e1, nbytes))
        _check(lib.cuEventRecord(e0, self._stream), "cuEventRecord")
        _check(
            lib.cuMemcpyHtoDAsync_v2(dst_ptr, ctypes.c_void_p(src_ptr), nbytes, self._stream),
            "cuMemcpyHtoDAsync",
        )
        _check(lib.cuEventRecord(e1, self._stream), "cuEventRecord")

    def busy_seconds(self) -> tuple[float, int]:
        """(seconds between each copy's two events, summed; bytes copied), once all have run."""
        total, nbytes, ms = 0.0, 0, ctypes.c_float()
        for e0, e1, n in self._events:
            _check(self._lib.cuEventSynchronize(e1), "cuEventSynchronize")
            _check(self._lib.cuEventElapsedTime(ctypes.byref(ms), e0, e1), "cuEventElapsedTime")
            total += ms.value / 1e3
            nbytes += n
        return total, nbytes

    def close(self) -> None:
        for e0, e1, _ in self._events:
            self._lib.cuEventDestroy_v2(e0)
            self._lib.cuEventDestroy_v2(e1)
        self._events.clear()
