"""Elementwise transcendental functions whose bits do not depend on the machine's SIMD level.

NumPy dispatches ``np.log``, ``np.log1p``, ``np.exp``, ``np.sin``, ``np.cos`` … of float64 arrays
to vector implementations chosen at run time from the CPU's features (AVX-512 machines get
NumPy's own AVX512F kernels or Intel SVML; AVX2 machines the C library's scalar functions).
They differ in the last bit for some inputs, so a cached feature column computed with them
depended on which machine built it: the golden digests written on an AVX-512 machine failed
on an AVX2 one (``log_duration`` and the z-score built on it). The cache key covers the code,
not the CPU, so outputs must not depend on the CPU.

These kernels call the C library's scalar function per element from numba (no vector math
library is linked, so the loop stays scalar): the same bits on every x86-64 CPU with the same
C library, which the test compares against Python's ``math`` module element by element.
Arithmetic (+ - * /, sqrt) is IEEE-exact in every SIMD width and needs none of this.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

F64 = npt.NDArray[np.float64]


@njit(cache=True)
def _log_nb(x: F64, out: F64) -> None:  # pragma: no cover - numba
    for i in range(x.shape[0]):
        out[i] = math.log(x[i])


@njit(cache=True)
def _log1p_nb(x: F64, out: F64) -> None:  # pragma: no cover - numba
    for i in range(x.shape[0]):
        out[i] = math.log1p(x[i])


@njit(cache=True)
def _sin_nb(x: F64, out: F64) -> None:  # pragma: no cover - numba
    for i in range(x.shape[0]):
        out[i] = math.sin(x[i])


@njit(cache=True)
def _cos_nb(x: F64, out: F64) -> None:  # pragma: no cover - numba
    for i in range(x.shape[0]):
        out[i] = math.cos(x[i])


def _apply(kernel: Any, x: npt.ArrayLike, out: F64 | None) -> F64:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"detmath: 1-D input expected, got shape {a.shape}")
    res = np.empty(a.shape[0], dtype=np.float64) if out is None else out
    if res.shape != a.shape or res.dtype != np.float64:
        raise ValueError(f"detmath: out must be float64 of shape {a.shape}, got {res.dtype} {res.shape}")
    kernel(a, res)
    return res


def log(x: npt.ArrayLike, out: F64 | None = None) -> F64:
    """Natural log of each element (float64; -inf at 0, NaN below, as the C library)."""
    return _apply(_log_nb, x, out)


def log1p(x: npt.ArrayLike, out: F64 | None = None) -> F64:
    """ln(1 + x) of each element (float64)."""
    return _apply(_log1p_nb, x, out)


def sin(x: npt.ArrayLike, out: F64 | None = None) -> F64:
    """Sine of each element (radians, float64)."""
    return _apply(_sin_nb, x, out)


def cos(x: npt.ArrayLike, out: F64 | None = None) -> F64:
    """Cosine of each element (radians, float64)."""
    return _apply(_cos_nb, x, out)
