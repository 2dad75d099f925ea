"""Bar-level feature registry: returns, volatility, Wilder/TA indicators, CUSUM, trend t-value,
volume, duration and clock features, computed strictly causally from a ``BarTable``.

Owns the ``bar_features`` table contract (docs/ARCHITECTURE.md, "Feature tables"): one row per
bar, ``ts_close`` plus one float64 column per registry entry. Every entry of the registry
(``FEATURES`` for the default config, ``build_registry(config)`` for another one) has a name
that says indicator and window, a formula, a ``window`` (trailing bars needed to reproduce the
value: for recursive indicators the length after which a different start changes it by less
than ``memory_tol`` relative), a ``warmup`` (leading bars of a fresh series that are NaN),
documented bounds and a kernel. Kernels are numba (``_nb``) over plain arrays.

Conventions (reference/microstructure.md §5):

* **Causality.** The value at bar j uses bars <= j only (every kernel is a forward recursion or
  a trailing window).
* **Rolls.** Bar j is a *roll bar* when its ``instrument_id`` differs from bar j-1's (bar 0 of
  a series counts as one, without a previous bar). The return of a roll bar is the
  within-contract ``ln(C_j/O_j)``: there is never a jump across contracts. Price-level
  indicators run on the ratio back-adjusted series as of bar j: at a roll bar their state is
  multiplied by ``R_j = O_j / C_{j-1}`` (all of them are homogeneous in the price scale), so
  the previous close seen by the roll bar is its own open.
* **Sessions.** CUSUM state, ``cusum_bars_since`` and ``bars_since_session_open`` restart at a
  session's first bar; everything else runs across session breaks (prices are continuous within
  a contract across the daily halt).
* **Warm-up / partitions.** ``compute_bar_features(bars, config, warmup)`` runs over
  ``warmup + bars`` and keeps the rows of ``bars``. With ``warmup`` = the previous quarter's
  last ``max_window()`` bars (a quarter starts at a session start) an interior quarter equals
  one pass over all quarters to ~``memory_tol`` and has no NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit
from pydantic import Field, model_validator

from fx_assets.core import calendar, detmath
from fx_assets.core.bars import BarTable
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.tables import array_of, numpy_of

F64 = npt.NDArray[np.float64]


class BarFeatureConfig(ConfigModel):
    """Parameters of the bar features. Windows are in bars; names follow the windows."""

    log_return_clamp: float = Field(
        0.1,
        gt=0,
        description="|log return| clamp (natural-log units); part of the log_return definition: "
        "real 1-bar moves are far below 0.1, corrupt prints far above. Clamped bars are flagged "
        "by log_return_clamped.",
    )
    rv_windows: list[int] = Field(
        default_factory=lambda: [20, 50],
        description="Windows (bars) of realised volatility sqrt(sum r^2) features.",
    )
    ewma_vol_span: int = Field(
        100, ge=2, description="Span (bars) of the EWMA volatility; alpha = 2/(span+1)."
    )
    wilder_period: int = Field(
        14, ge=2, description="n (bars) of ATR, NATR, +DI, -DI, ADX and RSI (Wilder smoothing)."
    )
    macd_fast: int = Field(12, ge=2, description="Fast EMA span (bars) of MACD.")
    macd_slow: int = Field(26, ge=3, description="Slow EMA span (bars) of MACD.")
    macd_signal: int = Field(9, ge=2, description="Signal EMA span (bars) of MACD.")
    bb_window: int = Field(20, ge=2, description="Bollinger window (bars), population sigma.")
    bb_k: float = Field(2.0, gt=0, description="Bollinger band width in sigmas.")
    z_window: int = Field(50, ge=2, description="Window (bars) of the volume and duration z-scores.")
    cusum_k: float = Field(
        1.5,
        gt=0,
        description="CUSUM threshold h_j = k * sigma_{j-1} (sigma = EWMA vol of log returns; "
        "dimensionless k, AFML uses 1..2).",
    )
    trend_min_len: int = Field(5, ge=3, description="Shortest trailing OLS window L (bars).")
    trend_max_len: int = Field(20, ge=3, description="Longest trailing OLS window L (bars).")
    trend_t_clip: float = Field(
        50.0,
        gt=0,
        description="|t| clip of the trend t-value: near-perfect fits give huge t that carry no "
        "more information than p < 1e-30.",
    )
    memory_tol: float = Field(
        1e-12,
        gt=0,
        lt=1e-3,
        description="Relative weight below which a recursive indicator forgets its start; sets "
        "the window (warm-up bars needed for partition equivalence) of recursive features.",
    )

    @model_validator(mode="after")
    def _check(self) -> BarFeatureConfig:
        if self.macd_fast >= self.macd_slow:
            raise ValueError("macd_fast must be < macd_slow")
        if self.trend_min_len > self.trend_max_len:
            raise ValueError("trend_min_len must be <= trend_max_len")
        if (
            not self.rv_windows
            or min(self.rv_windows) < 2
            or len(set(self.rv_windows)) != len(self.rv_windows)
        ):
            raise ValueError("rv_windows must be distinct windows >= 2")
        return self


# --- kernels --------------------------------------------------------------------------------


@njit(cache=True)
def _returns_nb(o, c, inst, clamp):
    """Roll-safe clamped log returns, clamp flag, roll flag and roll ratio R_j = O_j/C_{j-1}."""
    n = c.shape[0]
    r = np.empty(n, np.float64)
    flag = np.zeros(n, np.float64)
    roll = np.zeros(n, np.bool_)
    ratio = np.ones(n, np.float64)
    for j in range(n):
        if j == 0 or inst[j] != inst[j - 1]:
            roll[j] = True
            if j > 0:
                ratio[j] = o[j] / c[j - 1]
            x = math.log(c[j] / o[j])
        else:
            x = math.log(c[j] / c[j - 1])
        if x > clamp:
            x = clamp
            flag[j] = 1.0
        elif x < -clamp:
            x = -clamp
            flag[j] = 1.0
        r[j] = x
    return r, flag, roll, ratio


@njit(cache=True)
def _rv_nb(r, w):
    """sqrt(sum of r^2 over bars j-w+1..j), not demeaned; summed per window (exact locality)."""
    n = r.shape[0]
    out = np.full(n, np.nan)
    for j in range(w - 1, n):
        s = 0.0
        for m in range(j - w + 1, j + 1):
            s += r[m] * r[m]
        out[j] = math.sqrt(s)
    return out


# Bars per block of the rolling-window kernels (_rv_block_nb, _rolling_z_block_nb): a block's
# sums (2 KB) and its slice of the input stay in L1 while the window slides over them.
_WINDOW_BLOCK = 256


@njit(cache=True, error_model="numpy")
def _rv_block_nb(r, w):
    """``_rv_nb`` on blocks of ``_WINDOW_BLOCK`` bars, bit for bit: each bar's window sum is the
    same additions in the same order (m = j-w+1 .. j), but the loop over the block's bars is
    the inner one, so the compiler adds several bars' sums in one vector instruction (IEEE
    operations per lane: the same roundings) instead of one dependent chain at a time."""
    n = r.shape[0]
    out = np.full(n, np.nan)
    s = np.empty(_WINDOW_BLOCK, np.float64)
    j0 = w - 1
    while j0 < n:
        k = min(_WINDOW_BLOCK, n - j0)
        s[:k] = 0.0
        for m in range(w):
            rs = r[j0 - w + 1 + m : j0 - w + 1 + m + k]
            for q in range(k):
                s[q] += rs[q] * rs[q]
        for q in range(k):
            out[j0 + q] = math.sqrt(s[q])
        j0 += k
    return out


@njit(cache=True)
def _ewma_vol_nb(r, alpha):
    """sqrt of the recursive (adjust=False) EWMA of r^2, seeded with r_0^2 (zero-mean vol)."""
    n = r.shape[0]
    out = np.empty(n, np.float64)
    m = 0.0
    for j in range(n):
        x = r[j] * r[j]
        if j == 0:
            m = x
        else:
            m += alpha * (x - m)
        out[j] = math.sqrt(m)
    return out


@njit(cache=True, inline="always")
def _roll_ratio(o, c, inst, j):
    """R_j = O_j / C_{j-1} at a roll bar j > 0 (instrument changed from bar j-1), else 1."""
    if j > 0 and inst[j] != inst[j - 1]:
        return o[j] / c[j - 1]
    return 1.0


# The indicator kernels below find roll bars themselves (instrument change) and rescale their
# state by R_j there: one pass over the bars, no shared temporaries. Outputs are written in
# place (an output of length 0 is not wanted and not written) with NaN over the warm-up. The
# warm-up (seeding) bars run in a loop of their own, and the steady-state loop runs from roll
# to roll (``_next_roll``) so that no roll test sits on the recursion's critical path.
# Wilder smoothing (S*(n-1) + x)/n is evaluated as S*a + x*b, a = (n-1)/n, b = 1/n: no
# division on the critical path; the recursion contracts by a per bar, so the rounding
# difference stays within a few ulps of S (the parity test bounds it by 1e-12).
# error_model="numpy": a float division by zero gives inf/NaN instead of a raised exception,
# so numba emits no zero test per division (which kept the loops from vectorising); inputs
# are positive prices (compute_bar_features checks them) and every 0/0 case is guarded.


# Bars per block of the indicator kernels' steady-state loops; a multiple of 4, so that the
# steps of several bars start at the same bars (counted from the last roll) in any series
# that shares the prefix: a value never depends on where the series ends.
_BLOCK = 512
# Bars per block of the ATR kernel's software-pipelined runs (see _natr_span): short, so that
# the out-of-order core holds one block's output pass and the next block's serial recursion
# at once, yet long enough to amortise the per-block set-up; and of the RSI kernel's passes
# (_rsi_run). Both the best lengths measured on the ES bars, and multiples of 4: the steps
# start where they would with _BLOCK, so the values do not depend on them.
_WILDER_BLOCK = 48
_RSI_BLOCK = 128


@njit(cache=True)
def _next_roll(inst, j):
    """The first roll bar k >= j >= 1 (inst[k] != inst[k-1]), or len(inst). Scans blocks with a
    count of changes (vectorised) and searches only a block that has one."""
    nb = inst.shape[0]
    k0 = j
    while k0 < nb:
        k1 = min(k0 + _BLOCK, nb)
        cur = inst[k0:k1]
        prev = inst[k0 - 1 : k1 - 1]
        changes = 0
        for i in range(k1 - k0):
            changes += cur[i] != prev[i]
        if changes:
            for i in range(k1 - k0):
                if cur[i] != prev[i]:
                    return k0 + i
        k0 = k1
    return nb


@njit(cache=True)
def _step_powers(a, k, length):
    """a, a^2, .., a^k repeated over a block of ``length`` bars (bar p of a k-bar step is
    a^(p % k + 1)), each power formed as in the steps' own code (a^2 = a a, a^3 = a^2 a,
    a^4 = a^2 a^2)."""
    a2 = a * a
    pw = np.empty(4, np.float64)
    pw[0] = a
    pw[1] = a2
    pw[2] = a2 * a
    pw[3] = a2 * a2
    out = np.empty(length, np.float64)
    for p in range(length):
        out[p] = pw[p % k]
    return out


@njit(cache=True, error_model="numpy")
def _atr_into_nb(o, h, lo, c, inst, n, atr, natr):
    """Wilder ATR with TA-Lib seeding (mean of TR_1..TR_n at bar n, then (S*(n-1)+TR)/n) into
    ``atr`` and NATR = 100 * ATR / C into ``natr``."""
    nb = c.shape[0]
    want_a = atr.shape[0] == nb
    want_n = natr.shape[0] == nb
    for j in range(min(n, nb)):
        if want_a:
            atr[j] = np.nan
        if want_n:
            natr[j] = np.nan
    if nb <= n or not (want_a or want_n):
        return
    s = 0.0
    for j in range(1, n + 1):
        if inst[j] != inst[j - 1]:
            s *= o[j] / c[j - 1]
            pc = o[j]
        else:
            pc = c[j - 1]
        s += max(h[j] - lo[j], abs(h[j] - pc), abs(lo[j] - pc))
    s = s / n
    if want_a:
        atr[n] = s
    if want_n:
        natr[n] = 100.0 * s / c[n]
    a = (n - 1) / n
    b = 1.0 / n
    apw = _step_powers(a, 4, _WILDER_BLOCK)
    w = np.empty(2 * _WILDER_BLOCK, np.float64)
    sb = np.empty(2 * _WILDER_BLOCK, np.float64)
    pct = natr if want_n else np.empty(nb, np.float64)  # ATR alone: NATR to scratch
    j = n + 1
    while j < nb:
        if want_a:
            s, e = _atr_natr_run(h, lo, c, inst, j, s, a, b, apw, w, sb, atr, pct)
        else:
            s, e = _natr_run(h, lo, c, inst, j, s, a, b, apw, w, sb, natr)
        if e == nb:
            break
        s *= o[e] / c[e - 1]
        pc = o[e]
        s = s * a + max(h[e] - lo[e], abs(h[e] - pc), abs(lo[e] - pc)) * b
        if want_a:
            atr[e] = s
        if want_n:
            natr[e] = 100.0 * s / c[e]
        j = e + 1


@njit(cache=True, error_model="numpy", inline="always")
def _wilder_tr_starts(h, lo, pc, s, a, b, apw, w, sb):
    """Wilder-smoothed true range over a block without a roll (pc: the previous closes), four
    bars per step from the block's start: S_{k+3} = S_{k-1} a^4 + (((TR_k a + TR_{k+1}) a +
    TR_{k+2}) a + TR_{k+3}) b and the bars between from S_{k-1} likewise (S_{k+i} = S_{k-1}
    a^(i+1) + U_{k+i} b, U the Horner sums); a partial last step is the step's first bars, so
    a series cut there keeps every value. ``apw`` holds a, a^2, a^3, a^4 repeated (bar p's
    power at apw[p]). Leaves U b in ``w`` and S_{k-1} of each bar's step in ``sb`` (scratch of
    at least the block's length), so that bar p's S is sb[p] * apw[p] + w[p], the same
    expression, hence the same bits, as in a bar-by-bar step; returns the last S.

    Two passes over the block (it stays in L1): the true ranges (vectorised), then the steps:
    the Horner sums (independent across steps) and the recursion (one multiply and one add per
    four bars, the only loop-carried chain); the caller's output pass is vectorised too."""
    m = h.shape[0]
    for p in range(m):
        w[p] = _true_range(h[p], lo[p], pc[p])
    m4 = m - m % 4
    a4 = apw[3]
    for p in range(0, m4, 4):
        u1 = w[p]
        u2 = u1 * a + w[p + 1]
        u3 = u2 * a + w[p + 2]
        u4 = u3 * a + w[p + 3]
        w[p] = u1 * b
        w[p + 1] = u2 * b
        w[p + 2] = u3 * b
        x4 = u4 * b
        w[p + 3] = x4
        sb[p] = s
        sb[p + 1] = s
        sb[p + 2] = s
        sb[p + 3] = s
        s = s * a4 + x4
    if m4 < m:  # a partial step: the same sums, cut
        u = w[m4]
        w[m4] = u * b
        sb[m4] = s
        for p in range(m4 + 1, m):
            u = u * a + w[p]
            w[p] = u * b
            sb[p] = s
        s = s * apw[m - 1] + w[m - 1]
    return s


# The ATR kernel's steady-state spans over bars k0..e-1 (no roll among them) go in blocks of
# _WILDER_BLOCK bars, software-pipelined: the loop body takes the next block's vector pass
# (true ranges, and the steps' Horner sums), then this block's outputs (vectorised,
# divisions included), then the next block's recursion (a serial chain of few instructions),
# so that the out-of-order core runs this block's divisions while the chain waits on its
# latency (blocks are short so that both fit in its window). The loop body has no branch, so
# numba drops the reference counting of its slices (a branch there keeps an atomic increment
# and decrement per slice and block, which costs more than the block's arithmetic). Bars after
# the last full block take the unpipelined passes (_wilder_tr_starts), which give the same
# values.


@njit(cache=True, error_model="numpy", inline="always")
def _tr_horner(h, lo, pc, a, b, w):
    """True ranges of a full block (a multiple of 4 bars; pc: the previous closes), then each
    four-bar step's Horner sums times b (U b, as in _wilder_tr_starts), into ``w``."""
    m = h.shape[0]
    for p in range(m):
        w[p] = _true_range(h[p], lo[p], pc[p])
    for p in range(0, m, 4):
        u1 = w[p]
        u2 = u1 * a + w[p + 1]
        u3 = u2 * a + w[p + 2]
        u4 = u3 * a + w[p + 3]
        w[p] = u1 * b
        w[p + 1] = u2 * b
        w[p + 2] = u3 * b
        w[p + 3] = u4 * b


@njit(cache=True, error_model="numpy", inline="always")
def _tr_chain(w, s, a4, sb):
    """The recursion over a full block's four-bar steps (``w`` from _tr_horner): S_{k-1} of
    each bar's step into ``sb``; returns the last S."""
    for p in range(0, w.shape[0], 4):
        sb[p] = s
        sb[p + 1] = s
        sb[p + 2] = s
        sb[p + 3] = s
        s = s * a4 + w[p + 3]
    return s


@njit(cache=True, error_model="numpy", inline="always")
def _natr_out(sb, apw, w, cb, natr):
    """NATR = 100 S / C of a block (S = sb apw + w, cb: the closes) into ``natr``."""
    for p in range(cb.shape[0]):
        natr[p] = 100.0 * (sb[p] * apw[p] + w[p]) / cb[p]


@njit(cache=True, error_model="numpy", inline="always")
def _atr_natr_out(sb, apw, w, cb, atr, natr):
    """S into ``atr`` and NATR = 100 S / C into ``natr``, for a block."""
    for p in range(cb.shape[0]):
        x = sb[p] * apw[p] + w[p]
        atr[p] = x
        natr[p] = 100.0 * x / cb[p]


@njit(cache=True, error_model="numpy")
def _natr_span(h, lo, c, k0, e, s, a, b, apw, w, sb, natr):
    """NATR = 100 S / C of bars k0..e-1 into ``natr`` (``w``, ``sb``: scratch of two blocks);
    returns the last S."""
    m = _WILDER_BLOCK
    a4 = apw[3]
    nfull = (e - k0) // m
    if nfull > 0:
        _tr_horner(h[k0 : k0 + m], lo[k0 : k0 + m], c[k0 - 1 : k0 + m - 1], a, b, w[:m])
        s = _tr_chain(w[:m], s, a4, sb[:m])
        for i in range(nfull - 1):
            u = (i & 1) * m  # this block's half of the scratch; the next block's is v
            v = m - u
            q = k0 + m
            _tr_horner(h[q : q + m], lo[q : q + m], c[q - 1 : q + m - 1], a, b, w[v : v + m])
            _natr_out(sb[u : u + m], apw, w[u : u + m], c[k0:q], natr[k0:q])
            s = _tr_chain(w[v : v + m], s, a4, sb[v : v + m])
            k0 = q
        u = ((nfull - 1) & 1) * m
        _natr_out(sb[u : u + m], apw, w[u : u + m], c[k0 : k0 + m], natr[k0 : k0 + m])
        k0 += m
    if k0 < e:
        s = _wilder_tr_starts(h[k0:e], lo[k0:e], c[k0 - 1 : e - 1], s, a, b, apw, w, sb)
        _natr_out(sb, apw, w, c[k0:e], natr[k0:e])
    return s


@njit(cache=True, error_model="numpy")
def _atr_natr_span(h, lo, c, k0, e, s, a, b, apw, w, sb, atr, natr):
    """ATR S into ``atr`` and NATR = 100 S / C into ``natr``, bars k0..e-1 (as _natr_span);
    returns the last S."""
    m = _WILDER_BLOCK
    a4 = apw[3]
    nfull = (e - k0) // m
    if nfull > 0:
        _tr_horner(h[k0 : k0 + m], lo[k0 : k0 + m], c[k0 - 1 : k0 + m - 1], a, b, w[:m])
        s = _tr_chain(w[:m], s, a4, sb[:m])
        for i in range(nfull - 1):
            u = (i & 1) * m
            v = m - u
            q = k0 + m
            _tr_horner(h[q : q + m], lo[q : q + m], c[q - 1 : q + m - 1], a, b, w[v : v + m])
            _atr_natr_out(sb[u : u + m], apw, w[u : u + m], c[k0:q], atr[k0:q], natr[k0:q])
            s = _tr_chain(w[v : v + m], s, a4, sb[v : v + m])
            k0 = q
        u = ((nfull - 1) & 1) * m
        q = k0 + m
        _atr_natr_out(sb[u : u + m], apw, w[u : u + m], c[k0:q], atr[k0:q], natr[k0:q])
        k0 = q
    if k0 < e:
        s = _wilder_tr_starts(h[k0:e], lo[k0:e], c[k0 - 1 : e - 1], s, a, b, apw, w, sb)
        _atr_natr_out(sb, apw, w, c[k0:e], atr[k0:e], natr[k0:e])
    return s


@njit(cache=True, inline="always")
def _changes(cur, prev):
    """How many bars of a block have another instrument id than the bar before (vectorised)."""
    k = 0
    for i in range(cur.shape[0]):
        k += cur[i] != prev[i]
    return k


# The runs below go from bar k0 up to the next roll bar e (or the end) and return (S, e): they
# look for the roll one block ahead, inside the pipelined loop (so the instrument ids are read
# along with the prices, not in a pass of their own), and hand the block that holds it to
# _next_roll and the span.


@njit(cache=True, error_model="numpy")
def _natr_run(h, lo, c, inst, k0, s, a, b, apw, w, sb, natr):
    """NATR = 100 S / C from bar k0 to the next roll bar e into ``natr``; returns (S, e)."""
    nb = c.shape[0]
    m = _WILDER_BLOCK
    a4 = apw[3]
    if k0 + m <= nb and _changes(inst[k0 : k0 + m], inst[k0 - 1 : k0 + m - 1]) == 0:
        _tr_horner(h[k0 : k0 + m], lo[k0 : k0 + m], c[k0 - 1 : k0 + m - 1], a, b, w[:m])
        s = _tr_chain(w[:m], s, a4, sb[:m])
        i = 0
        while True:
            q = k0 + m
            if q + m > nb or _changes(inst[q : q + m], inst[q - 1 : q + m - 1]) != 0:
                break
            u = (i & 1) * m  # this block's half of the scratch; the next block's is v
            v = m - u
            _tr_horner(h[q : q + m], lo[q : q + m], c[q - 1 : q + m - 1], a, b, w[v : v + m])
            _natr_out(sb[u : u + m], apw, w[u : u + m], c[k0:q], natr[k0:q])
            s = _tr_chain(w[v : v + m], s, a4, sb[v : v + m])
            k0 = q
            i += 1
        u = (i & 1) * m
        _natr_out(sb[u : u + m], apw, w[u : u + m], c[k0 : k0 + m], natr[k0 : k0 + m])
        k0 += m
    e = _next_roll(inst, k0)
    s = _natr_span(h, lo, c, k0, e, s, a, b, apw, w, sb, natr)
    return s, e


@njit(cache=True, error_model="numpy")
def _atr_natr_run(h, lo, c, inst, k0, s, a, b, apw, w, sb, atr, natr):
    """ATR S into ``atr`` and NATR = 100 S / C into ``natr`` from bar k0 to the next roll bar
    e (as _natr_run); returns (S, e)."""
    nb = c.shape[0]
    m = _WILDER_BLOCK
    a4 = apw[3]
    if k0 + m <= nb and _changes(inst[k0 : k0 + m], inst[k0 - 1 : k0 + m - 1]) == 0:
        _tr_horner(h[k0 : k0 + m], lo[k0 : k0 + m], c[k0 - 1 : k0 + m - 1], a, b, w[:m])
        s = _tr_chain(w[:m], s, a4, sb[:m])
        i = 0
        while True:
            q = k0 + m
            if q + m > nb or _changes(inst[q : q + m], inst[q - 1 : q + m - 1]) != 0:
                break
            u = (i & 1) * m
            v = m - u
            _tr_horner(h[q : q + m], lo[q : q + m], c[q - 1 : q + m - 1], a, b, w[v : v + m])
            _atr_natr_out(sb[u : u + m], apw, w[u : u + m], c[k0:q], atr[k0:q], natr[k0:q])
            s = _tr_chain(w[v : v + m], s, a4, sb[v : v + m])
            k0 = q
            i += 1
        u = (i & 1) * m
        q = k0 + m
        _atr_natr_out(sb[u : u + m], apw, w[u : u + m], c[k0:q], atr[k0:q], natr[k0:q])
        k0 = q
    e = _next_roll(inst, k0)
    s = _atr_natr_span(h, lo, c, k0, e, s, a, b, apw, w, sb, atr, natr)
    return s, e


@njit(cache=True, inline="always")
def _true_range(h, lo, pc):
    """max(H - L, |H - C_prev|, |L - C_prev|), as compare-selects (no branches)."""
    x = h - lo
    y = abs(h - pc)
    x = y if y > x else x
    y = abs(lo - pc)
    return y if y > x else x


@njit(cache=True, error_model="numpy")
def _dmi_into_nb(o, h, lo, c, inst, n, pdi, mdi, adx):
    """+DI, -DI and ADX, replicating TA-Lib: Wilder *sums* seeded with n-1 raw DM/TR, first DI
    at bar n, ADX = mean of the first n DX at bar 2n-1, then (ADX*(n-1)+DX)/n. When the
    smoothed TR or the DI sum is 0 the previous DI / ADX is carried (DI starts at 0)."""
    nb = c.shape[0]
    want_p = pdi.shape[0] == nb
    want_m = mdi.shape[0] == nb
    want_a = adx.shape[0] == nb
    for j in range(min(n, nb)):
        if want_p:
            pdi[j] = np.nan
        if want_m:
            mdi[j] = np.nan
    if want_a:
        for j in range(min(2 * n - 1, nb)):
            adx[j] = np.nan
    a = (n - 1) / n
    b = 1.0 / n
    sp = 0.0
    sm = 0.0
    st = 0.0
    p_v = 0.0
    m_v = 0.0
    adx_s = 0.0
    for j in range(1, nb):
        if inst[j] != inst[j - 1]:
            rr = o[j] / c[j - 1]
            sp *= rr
            sm *= rr
            st *= rr
            ph = h[j - 1] * rr
            pl = lo[j - 1] * rr
            pc = o[j]
        else:
            ph = h[j - 1]
            pl = lo[j - 1]
            pc = c[j - 1]
        up = h[j] - ph
        dn = pl - lo[j]
        pdm = up if (up > dn and up > 0.0) else 0.0
        mdm = dn if (dn > up and dn > 0.0) else 0.0
        tr = max(h[j] - lo[j], abs(h[j] - pc), abs(lo[j] - pc))
        if j < n:
            sp += pdm
            sm += mdm
            st += tr
            continue
        sp = sp - sp * b + pdm
        sm = sm - sm * b + mdm
        st = st - st * b + tr
        valid = False
        dx = 0.0
        if st != 0.0:
            p_v = 100.0 * sp / st
            m_v = 100.0 * sm / st
            tot = p_v + m_v
            if tot != 0.0:
                dx = 100.0 * abs(p_v - m_v) / tot
                valid = True
        if want_p:
            pdi[j] = p_v
        if want_m:
            mdi[j] = m_v
        if j < 2 * n:
            if valid:
                adx_s += dx
            if j == 2 * n - 1:
                adx_s = adx_s / n
                if want_a:
                    adx[j] = adx_s
        else:
            if valid:
                adx_s = adx_s * a + dx * b
            if want_a:
                adx[j] = adx_s


@njit(cache=True, error_model="numpy")
def _rsi_nb(o, c, inst, n):
    """Wilder RSI, TA-Lib seeding (mean gain/loss of the first n changes, first value at bar
    n). A flat window (mean gain + mean loss == 0) gives 50 (TA-Lib gives 0)."""
    nb = c.shape[0]
    out = np.empty(nb, np.float64)
    for j in range(min(n, nb)):
        out[j] = np.nan
    if nb <= n:
        return out
    g = 0.0
    lo = 0.0
    for j in range(1, n + 1):
        if inst[j] != inst[j - 1]:
            rr = o[j] / c[j - 1]
            g *= rr
            lo *= rr
            d = c[j] - o[j]
        else:
            d = c[j] - c[j - 1]
        g += d if d > 0.0 else 0.0
        lo += -d if d < 0.0 else 0.0
    g /= n
    lo /= n
    tot = g + lo
    out[n] = 100.0 * g / tot if tot > 0.0 else 50.0
    a = (n - 1) / n
    b = 1.0 / n
    apw = _step_powers(a, 2, _RSI_BLOCK)
    scratch = np.empty((4, _RSI_BLOCK), np.float64)
    j = n + 1
    while j < nb:
        e = _next_roll(inst, j)
        g, lo = _rsi_run(c, j, e, g, lo, a, b, apw, scratch, out)
        if e == nb:
            break
        rr = o[e] / c[e - 1]
        g *= rr
        lo *= rr
        d = c[e] - o[e]
        g = g * a + (d if d > 0.0 else 0.0) * b
        lo = lo * a + (-d if d < 0.0 else 0.0) * b
        tot = g + lo
        out[e] = 100.0 * g / tot if tot > 0.0 else 50.0
        j = e + 1
    return out


@njit(cache=True, error_model="numpy", inline="always")
def _rsi_starts(c, pc, g, lo, a, b, apw, wg, wl, gb, lb):
    """Wilder means of gains / losses over a block without a roll, two bars per step from the
    block's start: G_{k+1} = G_{k-1} a^2 + (U_k a + U_{k+1}) b, G_k = G_{k-1} a + U_k b (a
    partial last step is the step's first bar, so a cut series keeps every value), losses
    likewise. ``apw`` holds a, a^2 repeated. Leaves the Horner sums times b in ``wg`` / ``wl``
    and G_{k-1} / L_{k-1} of each bar's step in ``gb`` / ``lb`` (scratch of at least the
    block's length), so that bar p's G is gb[p] * apw[p] + wg[p], the same expression, hence
    the same bits, as in a bar-by-bar step; returns the last pair.

    Two passes (the block stays in L1): gains and losses (vectorised), then the steps, whose
    recursion (one multiply and one add per two bars and mean) is the only loop-carried
    chain; the caller's RSI pass is vectorised, divisions included."""
    m = c.shape[0]
    for p in range(m):
        d = c[p] - pc[p]
        wg[p] = d if d > 0.0 else 0.0
        wl[p] = -d if d < 0.0 else 0.0
    m2 = m - m % 2
    a2 = apw[1]
    for p in range(0, m2, 2):
        u1 = wg[p]
        v1 = wl[p]
        x2 = (u1 * a + wg[p + 1]) * b
        y2 = (v1 * a + wl[p + 1]) * b
        wg[p] = u1 * b
        wl[p] = v1 * b
        wg[p + 1] = x2
        wl[p + 1] = y2
        gb[p] = g
        gb[p + 1] = g
        lb[p] = lo
        lb[p + 1] = lo
        g = g * a2 + x2
        lo = lo * a2 + y2
    if m2 < m:  # a partial step: its first bar
        p = m2
        wg[p] = wg[p] * b
        wl[p] = wl[p] * b
        gb[p] = g
        lb[p] = lo
        g = g * a + wg[p]
        lo = lo * a + wl[p]
    return g, lo


@njit(cache=True, error_model="numpy")
def _rsi_run(c, k0, e, g, lo, a, b, apw, scratch, out):
    """RSI of bars k0..e-1 (no roll among them) into ``out``, blocks of _RSI_BLOCK bars in turn
    (pipelined as _natr_span, it measured slower: the step loop of two recursions is the
    bottleneck either way); ``scratch``: 4 rows of _RSI_BLOCK. Returns the last G, L."""
    wg = scratch[0]
    wl = scratch[1]
    gb = scratch[2]
    lb = scratch[3]
    while k0 < e:
        k1 = min(k0 + _RSI_BLOCK, e)
        g, lo = _rsi_starts(c[k0:k1], c[k0 - 1 : k1 - 1], g, lo, a, b, apw, wg, wl, gb, lb)
        r = out[k0:k1]
        for p in range(k1 - k0):
            gp = gb[p] * apw[p] + wg[p]
            r[p] = _rsi_value(gp, gp + (lb[p] * apw[p] + wl[p]))
        k0 = k1
    return g, lo


@njit(cache=True, error_model="numpy", inline="always")
def _rsi_value(g, tot):
    """100 G / (G + L), 50 for a flat window (G + L == 0)."""
    return 100.0 * g / tot if tot > 0.0 else 50.0


@njit(cache=True)
def _adjusted_mean_nb(x, off, o, c, inst, j, length):
    """Mean of the values of bars j-length+1..j (bar m's value is x[m - off]), each rescaled
    into bar j's contract units."""
    s = 0.0
    f = 1.0
    for m in range(j, j - length, -1):
        s += x[m - off] * f
        f *= _roll_ratio(o, c, inst, m)
    return s / length


@njit(cache=True, error_model="numpy")
def _macd_into_nb(o, c, inst, fast, slow, sig, line_out, sig_out, hist_out):
    """MACD line, signal and histogram divided by C_j, replicating TA-Lib's TA_MACD seeding:
    both EMAs are seeded at bar slow-1 with the SMA of the last (fast | slow) closes, the signal
    EMA at bar slow+sig-2 with the SMA of the first sig MACD values; EMA_t = EMA + k (x - EMA),
    k = 2/(span+1). The division by C_j is a multiplication by 1/C_j (<= 1 ulp apart)."""
    nb = c.shape[0]
    kf = 2.0 / (fast + 1.0)
    ks = 2.0 / (slow + 1.0)
    kg = 2.0 / (sig + 1.0)
    first_sig = slow + sig - 2
    for j in range(min(first_sig, nb)):
        sig_out[j] = np.nan
        hist_out[j] = np.nan
        if j < slow - 1:
            line_out[j] = np.nan
    if nb < slow:
        return
    j = slow - 1
    ef = _adjusted_mean_nb(c, 0, o, c, inst, j, fast)
    es = _adjusted_mean_nb(c, 0, o, c, inst, j, slow)
    seed = np.empty(sig, np.float64)  # MACD values (price units) of bars slow-1..first_sig
    seed[0] = ef - es
    line_out[j] = seed[0] / c[j]
    for j in range(slow, min(first_sig + 1, nb)):
        if inst[j] != inst[j - 1]:
            rr = o[j] / c[j - 1]
            ef *= rr
            es *= rr
        ef += kf * (c[j] - ef)
        es += ks * (c[j] - es)
        seed[j - (slow - 1)] = ef - es
        line_out[j] = seed[j - (slow - 1)] / c[j]
    if nb <= first_sig:
        return
    eg = _adjusted_mean_nb(seed, slow - 1, o, c, inst, first_sig, sig)
    line = seed[sig - 1]
    sig_out[first_sig] = eg / c[first_sig]
    hist_out[first_sig] = (line - eg) / c[first_sig]
    # EMA_t = EMA + k (x - EMA) is evaluated as EMA (1-k) + x k, two bars per step (as in
    # _rsi_starts); the raw line and signal go to the outputs block by block and are
    # divided by C in a loop of their own
    af, as_, ag = 1.0 - kf, 1.0 - ks, 1.0 - kg
    af2, as2, ag2 = af * af, as_ * as_, ag * ag
    j = first_sig + 1
    while j < nb:
        e = _next_roll(inst, j)
        k0 = j
        while k0 < e:
            k1 = min(k0 + _BLOCK, e)
            ks3 = (kf, ks, kg, af, as_, ag, af2, as2, ag2)
            ef, es, eg = _macd_block(c[k0:k1], ef, es, eg, ks3, line_out[k0:k1], sig_out[k0:k1])
            _macd_scale(c[k0:k1], line_out[k0:k1], sig_out[k0:k1], hist_out[k0:k1])
            k0 = k1
        if e == nb:
            break
        rr = o[e] / c[e - 1]
        ck = c[e]
        ef = ef * rr * af + ck * kf
        es = es * rr * as_ + ck * ks
        line = ef - es
        eg = eg * rr * ag + line * kg
        line_out[e] = line
        sig_out[e] = eg
        _macd_scale(c[e : e + 1], line_out[e : e + 1], sig_out[e : e + 1], hist_out[e : e + 1])
        j = e + 1


@njit(cache=True, error_model="numpy")
def _macd_block(c, ef, es, eg, coef, line_out, sig_out):
    """The three EMAs over a block without a roll, two bars per step (as _rsi_starts):
    writes the MACD line and signal in price units; returns the EMAs."""
    kf, ks, kg, af, as_, ag, af2, as2, ag2 = coef
    m = c.shape[0]
    for i in range(m // 2):
        p = 2 * i
        q = p + 1
        c1 = c[p]
        c2 = c[q]
        l1 = (ef * af + c1 * kf) - (es * as_ + c1 * ks)
        ef = ef * af2 + (c1 * af + c2) * kf
        es = es * as2 + (c1 * as_ + c2) * ks
        l2 = ef - es
        line_out[p] = l1
        sig_out[p] = eg * ag + l1 * kg
        eg = eg * ag2 + (l1 * ag + l2) * kg
        line_out[q] = l2
        sig_out[q] = eg
    if m % 2:
        p = m - 1
        ef = ef * af + c[p] * kf
        es = es * as_ + c[p] * ks
        line = ef - es
        eg = eg * ag + line * kg
        line_out[p] = line
        sig_out[p] = eg
    return ef, es, eg


@njit(cache=True, error_model="numpy", inline="always")
def _macd_scale(c, line, sgl, hist):
    """(line, signal) in price units -> (line, signal, line - signal) divided by C."""
    for i in range(c.shape[0]):
        inv = 1.0 / c[i]
        x = line[i]
        y = sgl[i]
        line[i] = x * inv
        sgl[i] = y * inv
        hist[i] = (x - y) * inv


_BB_BLOCK = 256  # bars per block of the Bollinger kernels (their sums stay in L1)
# Closes on this binary grid (multiples of 1/256: ES / NQ 0.25, YM 1, treasury 1/32..1/128
# ticks) are integers once scaled, so their window sums are exact in int64.
_BB_GRID = 256.0


@njit(cache=True, error_model="numpy")
def _bb_exact_nb(o, c, inst, w, kk, out, need):
    """Bollinger %b of every bar whose window of w closes holds no roll and only closes on the
    ``_BB_GRID`` grid, from exact integer window sums; ``need[j]`` set for the other bars
    (j >= w - 1), which the two-pass kernel then computes. Returns how many those are.

    With X = close * grid (integers), S1 = sum X and S2 = sum X^2 over the window:
    C - mu = N / (w grid) with N = w X_j - S1, and sigma = sqrt(D) / (w grid) with
    D = w S2 - S1^2 (population), so %b = 0.5 + N / (2 k sqrt(D)), D == 0 -> 0.5. N and D are
    exact integers (|X| <= 2^31 / w keeps w S2 and S1^2 below 2^62), so a bar's value has four
    roundings whatever came before it: running sums that add the new close and drop the old
    one stay exact, where float sums would carry their start's rounding along. Whether a bar
    takes this kernel depends on its own window only (causal; the same whatever the series'
    start or chunking). Each block: scale and test (vectorised), the running sums (the only
    serial loop), %b (vectorised), then a per-bar pass only where a roll or an off-grid close
    is within reach of the block."""
    nb = c.shape[0]
    lim = 2147483648.0 / w
    # X of the block's bars after those of the w bars before it (zeros before bar 0): bar
    # j0 + i adds xb[w + i] and drops xb[i]. Block-sized scratch: the kernel's temporaries do
    # not grow with the series (the output and the ``need`` flags are the caller's).
    xb = np.zeros(_BB_BLOCK + w, np.int64)
    bad = np.zeros(_BB_BLOCK, np.uint8)
    s1a = np.empty(_BB_BLOCK, np.int64)
    s2a = np.empty(_BB_BLOCK, np.int64)
    h = 0.5 / kk
    s1 = 0
    s2 = 0
    last_bad = -nb - w  # the latest off-grid close, the latest roll bar seen
    last_roll = -nb - w
    n_need = 0
    j0 = 0
    while j0 < nb:
        j1 = min(j0 + _BB_BLOCK, nb)
        nj = j1 - j0
        cj = c[j0:j1]
        xj = xb[w : w + nj]
        bj = bad[:nj]
        n_bad = 0
        for i in range(nj):  # vectorises
            x = cj[i] * _BB_GRID
            ok = x == math.floor(x) and abs(x) <= lim  # False for NaN and inf
            xj[i] = np.int64(x) if ok else 0
            bj[i] = 0 if ok else 1
            n_bad += 0 if ok else 1
        n_roll = 0
        for k in range(max(j0, 1), j1):
            n_roll += 1 if inst[k] != inst[k - 1] else 0
        yj = xb[:nj]
        for i in range(nj):  # serial: exact, so adding and dropping in any order is the same
            x = xj[i]
            y = yj[i]
            s1 += x - y
            s2 += (x - y) * (x + y)
            s1a[i] = s1
            s2a[i] = s2
        oj = out[j0:j1]
        for i in range(nj):  # vectorises: the square roots and divisions
            s = s1a[i]
            d = w * s2a[i] - s * s
            oj[i] = 0.5 + h * (float(w * xj[i] - s) / math.sqrt(float(d))) if d > 0 else 0.5
        if n_bad or n_roll or last_bad > j0 - w or last_roll > j0 - w + 1:
            for j in range(j0, j1):
                if bj[j - j0]:
                    last_bad = j
                if j > 0 and inst[j] != inst[j - 1]:
                    last_roll = j
                # R_k rescales the windows of bars k..k+w-2
                if j >= w - 1 and (last_bad > j - w or last_roll > j - w + 1):
                    need[j] = True
                    n_need += 1
        for i in range(w):  # the last w closes of the block lead the next block's window
            xb[i] = xb[nj + i]
        j0 = j1
    for j in range(min(w - 1, nb)):
        out[j] = np.nan
    return n_need


@njit(cache=True, error_model="numpy")
def _bb_two_pass_nb(o, c, inst, w, kk, out, need):
    """Bollinger %b = (C - (mu - k sigma)) / (2 k sigma) on the last w adjusted closes,
    population sigma (two-pass), sigma == 0 -> 0.5, into ``out`` for the bars with ``need``
    set (windows with a roll or closes off the exact kernel's grid); blocks without one are
    skipped.

    Blocks of bars whose windows hold no roll take the sums across bars (the inner loop runs
    over the bars of the block, so it vectorises; eight window terms per sweep, then four, then
    one, added in the per-bar order, so each bar's sums are bit-identical to the per-bar loop;
    fewer sweeps, fewer loads and stores of the running sums); a block that a roll rescales
    runs the per-bar loop. The inner loops index slices from 0: numba then omits
    its negative-index wraparound, which would otherwise block vectorisation."""
    nb = c.shape[0]
    acc_buf = np.empty(_BB_BLOCK, np.float64)
    var_buf = np.empty(_BB_BLOCK, np.float64)
    buf = np.empty(w, np.float64)
    w8 = w - w % 8
    w4 = w - w % 4
    j0 = w - 1
    while j0 < nb:
        j1 = min(j0 + _BB_BLOCK, nb)
        wanted = False
        for j in range(j0, j1):
            if need[j]:
                wanted = True
                break
        if not wanted:
            j0 = j1
            continue
        rolled = False
        for k in range(max(j0 - w + 2, 1), j1):  # R_k rescales the windows of bars k..k+w-2
            if inst[k] != inst[k - 1]:
                rolled = True
                break
        if rolled:
            for j in range(j0, j1):
                if not need[j]:
                    continue
                f = 1.0
                s = 0.0
                for m in range(w):
                    x = c[j - m] * f
                    buf[m] = x
                    s += x
                    f *= _roll_ratio(o, c, inst, j - m)
                mu = s / w
                v = 0.0
                for m in range(w):
                    d = buf[m] - mu
                    v += d * d
                sd = math.sqrt(v / w)
                out[j] = (c[j] - mu + kk * sd) / (2.0 * kk * sd) if sd > 0.0 else 0.5
        else:
            nj = j1 - j0
            acc = acc_buf[:nj]
            var = var_buf[:nj]
            for i in range(nj):
                acc[i] = 0.0
                var[i] = 0.0
            for m in range(0, w8, 8):
                c0 = c[j0 - m : j1 - m]
                c1 = c[j0 - m - 1 : j1 - m - 1]
                c2 = c[j0 - m - 2 : j1 - m - 2]
                c3 = c[j0 - m - 3 : j1 - m - 3]
                c4 = c[j0 - m - 4 : j1 - m - 4]
                c5 = c[j0 - m - 5 : j1 - m - 5]
                c6 = c[j0 - m - 6 : j1 - m - 6]
                c7 = c[j0 - m - 7 : j1 - m - 7]
                for i in range(nj):
                    x = (((acc[i] + c0[i]) + c1[i]) + c2[i]) + c3[i]
                    acc[i] = (((x + c4[i]) + c5[i]) + c6[i]) + c7[i]
            for m in range(w8, w4, 4):
                c0 = c[j0 - m : j1 - m]
                c1 = c[j0 - m - 1 : j1 - m - 1]
                c2 = c[j0 - m - 2 : j1 - m - 2]
                c3 = c[j0 - m - 3 : j1 - m - 3]
                for i in range(nj):
                    acc[i] = (((acc[i] + c0[i]) + c1[i]) + c2[i]) + c3[i]
            for m in range(w4, w):
                c0 = c[j0 - m : j1 - m]
                for i in range(nj):
                    acc[i] += c0[i]
            for i in range(nj):
                acc[i] = acc[i] / w
            for m in range(0, w8, 8):
                c0 = c[j0 - m : j1 - m]
                c1 = c[j0 - m - 1 : j1 - m - 1]
                c2 = c[j0 - m - 2 : j1 - m - 2]
                c3 = c[j0 - m - 3 : j1 - m - 3]
                c4 = c[j0 - m - 4 : j1 - m - 4]
                c5 = c[j0 - m - 5 : j1 - m - 5]
                c6 = c[j0 - m - 6 : j1 - m - 6]
                c7 = c[j0 - m - 7 : j1 - m - 7]
                for i in range(nj):
                    mu = acc[i]
                    d0 = c0[i] - mu
                    d1 = c1[i] - mu
                    d2 = c2[i] - mu
                    d3 = c3[i] - mu
                    d4 = c4[i] - mu
                    d5 = c5[i] - mu
                    d6 = c6[i] - mu
                    d7 = c7[i] - mu
                    x = (((var[i] + d0 * d0) + d1 * d1) + d2 * d2) + d3 * d3
                    var[i] = (((x + d4 * d4) + d5 * d5) + d6 * d6) + d7 * d7
            for m in range(w8, w4, 4):
                c0 = c[j0 - m : j1 - m]
                c1 = c[j0 - m - 1 : j1 - m - 1]
                c2 = c[j0 - m - 2 : j1 - m - 2]
                c3 = c[j0 - m - 3 : j1 - m - 3]
                for i in range(nj):
                    mu = acc[i]
                    d0 = c0[i] - mu
                    d1 = c1[i] - mu
                    d2 = c2[i] - mu
                    d3 = c3[i] - mu
                    var[i] = (((var[i] + d0 * d0) + d1 * d1) + d2 * d2) + d3 * d3
            for m in range(w4, w):
                c0 = c[j0 - m : j1 - m]
                for i in range(nj):
                    d = c0[i] - acc[i]
                    var[i] += d * d
            cj = c[j0:j1]
            oj = out[j0:j1]
            nd = need[j0:j1]
            for i in range(nj):
                if nd[i]:
                    mu = acc[i]
                    sd = math.sqrt(var[i] / w)
                    oj[i] = (cj[i] - mu + kk * sd) / (2.0 * kk * sd) if sd > 0.0 else 0.5
        j0 = j1


@njit(cache=True)
def _rolling_z_nb(x, w):
    """(x_j - mean) / population std over x[j-w+1..j]; std == 0 -> 0."""
    nb = x.shape[0]
    out = np.full(nb, np.nan)
    for j in range(w - 1, nb):
        s = 0.0
        for m in range(j - w + 1, j + 1):
            s += x[m]
        mu = s / w
        v = 0.0
        for m in range(j - w + 1, j + 1):
            d = x[m] - mu
            v += d * d
        sd = math.sqrt(v / w)
        out[j] = (x[j] - mu) / sd if sd > 0.0 else 0.0
    return out


# error_model="numpy": the z of a window whose std is 0 is divided by zero (inf / NaN, no
# exception) and then discarded by the select, so that the divisions vectorise.
@njit(cache=True, error_model="numpy")
def _rolling_z_block_nb(x, w):
    """``_rolling_z_nb`` on blocks of ``_WINDOW_BLOCK`` bars, bit for bit: each window's sum and
    squared deviations are the same additions in the same order, with the block's bars in the
    inner (vectorised) loops, as in :func:`_rv_block_nb`."""
    nb = x.shape[0]
    out = np.full(nb, np.nan)
    s = np.empty(_WINDOW_BLOCK, np.float64)
    mu = np.empty(_WINDOW_BLOCK, np.float64)
    v = np.empty(_WINDOW_BLOCK, np.float64)
    fw = float(w)
    j0 = w - 1
    while j0 < nb:
        k = min(_WINDOW_BLOCK, nb - j0)
        s[:k] = 0.0
        for m in range(w):
            xs = x[j0 - w + 1 + m : j0 - w + 1 + m + k]
            for q in range(k):
                s[q] += xs[q]
        for q in range(k):
            mu[q] = s[q] / fw
        v[:k] = 0.0
        for m in range(w):
            xs = x[j0 - w + 1 + m : j0 - w + 1 + m + k]
            for q in range(k):
                d = xs[q] - mu[q]
                v[q] += d * d
        for q in range(k):
            # _rolling_z_nb's z without its branch: the same value
            sd = math.sqrt(v[q] / fw)
            z = (x[j0 + q] - mu[q]) / sd
            out[j0 + q] = z if sd > 0.0 else 0.0
        j0 += k
    return out


@njit(cache=True)
def _cusum_into_nb(r, sigma, session, k, ev, dirn, since):
    """Symmetric CUSUM on log close (increments r): S+ = max(0, S+ + r), S- = min(0, S- + r);
    event if S- < -h (reset S-) else if S+ > h (reset S+), h = k * sigma_{j-1}. Restarts at
    each session's first bar (no event there before sigma exists). Writes, in place, the event
    flag, the direction of the latest event in the session (0 if none) and bars since that
    event (or since the session's first bar); an output of length 0 is not wanted and not
    written (the CUSUM filter alone needs only the flags: no memory traffic for the others)."""
    nb = r.shape[0]
    want_e = ev.shape[0] == nb
    want_d = dirn.shape[0] == nb
    want_s = since.shape[0] == nb
    sp = 0.0
    sm = 0.0
    last = 0.0
    ref = 0
    for j in range(nb):
        if j == 0 or session[j] != session[j - 1]:
            sp = 0.0
            sm = 0.0
            last = 0.0
            ref = j
        sp = max(0.0, sp + r[j])
        sm = min(0.0, sm + r[j])
        e = 0.0
        if j > 0:
            h = k * sigma[j - 1]
            if sm < -h:
                sm = 0.0
                e = 1.0
                last = -1.0
                ref = j
            elif sp > h:
                sp = 0.0
                e = 1.0
                last = 1.0
                ref = j
        if want_e:
            ev[j] = e
        if want_d:
            dirn[j] = last
        if want_s:
            since[j] = j - ref
    return


@njit(cache=True)
def _cusum_nb(r, sigma, session, k):
    """``_cusum_into_nb`` into three new arrays: event flag, direction, bars since the event."""
    nb = r.shape[0]
    ev = np.empty(nb, np.float64)
    dirn = np.empty(nb, np.float64)
    since = np.empty(nb, np.float64)
    _cusum_into_nb(r, sigma, session, k, ev, dirn, since)
    return ev, dirn, since


@njit(cache=True, inline="always")
def _trend_pick(best, beta, sse, L, sxx, clip):
    """``_trend_tvalue_rows_nb``'s t of one length L from its slope and SSE, and the running
    pick (the largest |t| so far; the earlier, shorter L on ties)."""
    s2 = sse / (L - 2)
    if s2 > 0.0:
        t = beta / math.sqrt(s2 / sxx)
    elif beta > 0.0:
        t = clip
    elif beta < 0.0:
        t = -clip
    else:
        t = 0.0
    t = min(max(t, -clip), clip)
    return t if abs(t) > abs(best) else best


@njit(cache=True, nogil=True)
def _trend_tvalue_rows_nb(r, lmin, lmax, clip, lo, hi, out):
    """Trailing trend-scanning t-value of bars lo..hi-1 (from bar lmax-1 on) into ``out``: for
    L in [lmin, lmax], OLS of ln C on time over bars j-L+1..j; keep the t with the largest |t|
    (shortest L on ties), clipped to +-clip. ln C is rebuilt locally from the roll-safe returns
    (origin-free, exact under any warm-up start)."""
    y = np.empty(lmax, np.float64)
    # sum (x - xm)^2 depends on L only: computed once, with the per-bar loop's operations.
    sxx_of = np.zeros(lmax + 1, np.float64)
    for L in range(lmin, lmax + 1):
        xm = -(L - 1) / 2.0
        sxx = 0.0
        for m in range(L):
            dx = -m - xm
            sxx += dx * dx
        sxx_of[L] = sxx
    for j in range(max(lo, lmax - 1), hi):
        y[0] = 0.0
        for m in range(1, lmax):
            y[m] = y[m - 1] - r[j - m + 1]  # ln C_{j-m} - ln C_j
        best = 0.0
        # running sum of y[0..L-1]: the same additions, in the same order, as summing per L
        acc = 0.0
        for m in range(lmin - 1):
            acc += y[m]
        for L in range(lmin, lmax + 1):
            # x = -m (time increases toward bar j); slope is shift invariant
            xm = -(L - 1) / 2.0
            acc += y[L - 1]
            ym = acc / L
            sxx = sxx_of[L]
            sxy = 0.0
            for m in range(L):
                dx = -m - xm
                sxy += dx * (y[m] - ym)
            beta = sxy / sxx
            sse = 0.0
            for m in range(L):
                e = y[m] - ym - beta * (-m - xm)
                sse += e * e
            best = _trend_pick(best, beta, sse, L, sxx, clip)
        out[j] = best


# Bars per block of the trend kernel: its (lmax x block) trailing log prices and six block-long
# sums stay in L1 (64 bars x 20 lengths: 10 KB).
_TREND_BLOCK = 64


# error_model="numpy": a float division by zero gives inf / NaN instead of raising, so the
# compiler may vectorise the divisions (the python model tests every divisor). The only
# division by a possible zero is the t of a length whose s^2 is not > 0, computed and then
# discarded by the select (the one-bar kernel does not compute it); every division whose result
# is used has the one-bar kernel's non-zero divisor (L >= 3, so L - 2 >= 1 and sxx > 0).
@njit(cache=True, nogil=True, error_model="numpy")
def _trend_tvalue_block_nb(r, lmin, lmax, clip, lo, hi, out):
    """``_trend_tvalue_rows_nb`` on blocks of ``_TREND_BLOCK`` bars, bit for bit: for each bar
    the same operations in the same order (every sum over m for one L is still added m = 0, 1,
    ... into its own accumulator), but with the bars of a block in the innermost loops, where
    the compiler runs several bars' operations in one vector instruction (IEEE operations per
    lane: the same roundings). The per-bar kernel's time was its divisions and square roots
    (six per length and bar) and its chains of dependent additions; here both are vector wide."""
    nbk = _TREND_BLOCK
    Y = np.empty((lmax, nbk), np.float64)  # Y[m, q] = ln C_{j-m} - ln C_j of bar j = j0 + q
    acc = np.empty(nbk, np.float64)
    ym = np.empty(nbk, np.float64)
    sxy = np.empty(nbk, np.float64)
    sse = np.empty(nbk, np.float64)
    beta = np.empty(nbk, np.float64)
    best = np.empty(nbk, np.float64)
    sxx_of = np.zeros(lmax + 1, np.float64)
    for L in range(lmin, lmax + 1):
        xm = -(L - 1) / 2.0
        sxx = 0.0
        for m in range(L):
            dx = -m - xm
            sxx += dx * dx
        sxx_of[L] = sxx
    j0 = max(lo, lmax - 1)
    while j0 < hi:
        nb = min(nbk, hi - j0)
        y0 = Y[0]
        for q in range(nb):
            y0[q] = 0.0
        acc[:nb] = 0.0
        best[:nb] = 0.0
        for m in range(1, lmax):
            yp = Y[m - 1]
            yc = Y[m]
            rs = r[j0 - m + 1 : j0 - m + 1 + nb]
            for q in range(nb):
                yc[q] = yp[q] - rs[q]
        for m in range(lmin - 1):
            yc = Y[m]
            for q in range(nb):
                acc[q] += yc[q]
        for L in range(lmin, lmax + 1):
            xm = -(L - 1) / 2.0
            yl = Y[L - 1]
            fl = float(L)
            fl2 = float(L - 2)
            for q in range(nb):
                acc[q] += yl[q]
            for q in range(nb):
                ym[q] = acc[q] / fl
            sxy[:nb] = 0.0
            sse[:nb] = 0.0
            sxx = sxx_of[L]
            for m in range(L):
                dx = -m - xm
                yc = Y[m]
                for q in range(nb):
                    sxy[q] += dx * (yc[q] - ym[q])
            for q in range(nb):
                beta[q] = sxy[q] / sxx
            for m in range(L):
                dx = -m - xm
                yc = Y[m]
                for q in range(nb):
                    e = yc[q] - ym[q] - beta[q] * dx
                    sse[q] += e * e
            for q in range(nb):
                # _trend_pick without branches (so that it vectorises): the same values
                bq = beta[q]
                s2 = sse[q] / fl2
                tm = bq / math.sqrt(s2 / sxx)  # used only where s2 > 0
                ta = clip if bq > 0.0 else (-clip if bq < 0.0 else 0.0)
                t = tm if s2 > 0.0 else ta
                t = min(max(t, -clip), clip)
                bb = best[q]
                best[q] = t if abs(t) > abs(bb) else bb
        for q in range(nb):
            out[j0 + q] = best[q]
        j0 += nb


# --- indicator wrappers (validate, then one kernel pass) -------------------------------------

_EMPTY = np.empty(0, np.float64)


def _series(n_min: int, **arrays: np.ndarray) -> list[np.ndarray]:
    """The named 1-D arrays, all of one length (prices as contiguous float64, ``inst`` as is);
    FxDataError naming the array otherwise. ``n_min``: the period, checked >= 1."""
    if n_min < 1:
        raise FxDataError(f"indicator period {n_min} must be >= 1")
    out = []
    length = None
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if a.ndim != 1:
            raise FxDataError(f"indicator input {name!r} has shape {a.shape}, expected 1-D")
        if length is None:
            length = a.shape[0]
        elif a.shape[0] != length:
            raise FxDataError(f"indicator input {name!r} has {a.shape[0]} bars, expected {length}")
        if name == "inst":
            if a.dtype.kind not in "iu":
                raise FxDataError(f"indicator input 'inst' has dtype {a.dtype}, expected integer ids")
            out.append(np.ascontiguousarray(a))
        else:
            out.append(np.ascontiguousarray(a, dtype=np.float64))
    return out


def atr_natr(o: F64, h: F64, lo: F64, c: F64, inst: np.ndarray, n: int) -> tuple[F64, F64]:
    """Roll-adjusted Wilder ATR (price units) and NATR (percent of C) of bars (open, high, low,
    close, instrument id); NaN before bar n."""
    o, h, lo, c, inst = _series(n, o=o, h=h, lo=lo, c=c, inst=inst)
    atr = np.empty_like(c)
    natr = np.empty_like(c)
    _atr_into_nb(o, h, lo, c, inst, n, atr, natr)
    return atr, natr


def natr(o: F64, h: F64, lo: F64, c: F64, inst: np.ndarray, n: int) -> F64:
    """Roll-adjusted NATR (percent of C) alone; as ``atr_natr(...)[1]``."""
    o, h, lo, c, inst = _series(n, o=o, h=h, lo=lo, c=c, inst=inst)
    out = np.empty_like(c)
    _atr_into_nb(o, h, lo, c, inst, n, _EMPTY, out)
    return out


def dmi(o: F64, h: F64, lo: F64, c: F64, inst: np.ndarray, n: int) -> tuple[F64, F64, F64]:
    """Roll-adjusted +DI, -DI (NaN before bar n) and ADX (NaN before bar 2n-1), TA-Lib seeding."""
    o, h, lo, c, inst = _series(n, o=o, h=h, lo=lo, c=c, inst=inst)
    pdi, mdi, adx_ = np.empty_like(c), np.empty_like(c), np.empty_like(c)
    _dmi_into_nb(o, h, lo, c, inst, n, pdi, mdi, adx_)
    return pdi, mdi, adx_


def adx(o: F64, h: F64, lo: F64, c: F64, inst: np.ndarray, n: int) -> F64:
    """Roll-adjusted ADX alone; as ``dmi(...)[2]``."""
    o, h, lo, c, inst = _series(n, o=o, h=h, lo=lo, c=c, inst=inst)
    out = np.empty_like(c)
    _dmi_into_nb(o, h, lo, c, inst, n, _EMPTY, _EMPTY, out)
    return out


def rsi(o: F64, c: F64, inst: np.ndarray, n: int) -> F64:
    """Roll-adjusted Wilder RSI (0..100, flat window 50); NaN before bar n."""
    o, c, inst = _series(n, o=o, c=c, inst=inst)
    return _rsi_nb(o, c, inst, n)


def macd(o: F64, c: F64, inst: np.ndarray, fast: int, slow: int, sig: int) -> tuple[F64, F64, F64]:
    """Roll-adjusted MACD line, signal and histogram, each divided by C_j (TA-Lib seeding)."""
    if not fast < slow:
        raise FxDataError(f"MACD: fast span {fast} must be < slow span {slow}")
    o, c, inst = _series(min(fast, sig), o=o, c=c, inst=inst)
    line, sgl, hist = np.empty_like(c), np.empty_like(c), np.empty_like(c)
    _macd_into_nb(o, c, inst, fast, slow, sig, line, sgl, hist)
    return line, sgl, hist


def bollinger_pctb(o: F64, c: F64, inst: np.ndarray, w: int, k: float) -> F64:
    """Roll-adjusted Bollinger %b over w closes, population sigma, k sigmas; NaN before bar w-1."""
    if not (math.isfinite(k) and k > 0):
        raise FxDataError(f"Bollinger: k = {k!r} must be finite and > 0")
    o, c, inst = _series(w, o=o, c=c, inst=inst)
    out = np.empty(c.shape[0], np.float64)
    need = np.zeros(c.shape[0], np.bool_)
    if _bb_exact_nb(o, c, inst, w, float(k), out, need):
        _bb_two_pass_nb(o, c, inst, w, float(k), out, need)
    return out


@njit(cache=True, nogil=True)
def _cusum_filter_nb(price, h, out):
    """Event indices of the symmetric CUSUM filter with constant threshold ``h`` on log prices
    into ``out``; their count, or ``-(j + 1)`` for the first ``price[j]`` that is not positive
    and finite. The increment ``log(p_j / p_{j-1})`` is taken inline (no return series in
    memory) and the recursion is ``_cusum_into_nb``'s with one session and ``k * sigma = h``:
    the same events as that kernel on ``math.log`` returns."""
    sp = 0.0
    sm = 0.0
    n = 0
    if price.shape[0] and not (price[0] > 0.0 and price[0] - price[0] == 0.0):
        return -1
    for j in range(1, price.shape[0]):
        p = price[j]
        if not (p > 0.0 and p - p == 0.0):
            return -(j + 1)
        if p == price[j - 1]:
            # r = log(1) = 0 exactly: the sums keep their values (sp >= 0 >= sm) and, both
            # inside the threshold after the last step, fire nothing; most trades repeat a price
            continue
        r = math.log(p / price[j - 1])
        sp = max(0.0, sp + r)
        sm = min(0.0, sm + r)
        if sm < -h:
            sm = 0.0
            out[n] = j
            n += 1
        elif sp > h:
            sp = 0.0
            out[n] = j
            n += 1
    return n


def cusum_filter(price: F64, threshold: float) -> npt.NDArray[np.int64]:
    """Indices ``j`` where the symmetric CUSUM of log price increments crosses ``threshold``
    (the filter of López de Prado, AFML 2.5.2.1, with a constant threshold; the same events
    as the ``cusum_event`` bar feature with one session and ``cusum_k * sigma = threshold``).
    ``price``: one series, positive and finite; ``threshold`` in log-return units."""
    if not (math.isfinite(threshold) and threshold > 0):
        raise FxDataError(f"CUSUM filter: threshold = {threshold!r} must be finite and > 0")
    p = np.ascontiguousarray(price, dtype=np.float64)
    if p.ndim != 1:
        raise FxDataError(f"CUSUM filter: price has shape {p.shape}, expected one series")
    out = np.empty(max(p.shape[0] - 1, 0), dtype=np.int64)  # untouched pages cost nothing
    n = _cusum_filter_nb(p, float(threshold), out)
    if n < 0:
        j = -n - 1
        raise FxDataError(f"CUSUM filter: price[{j}] = {float(p[j])!r} is not a positive finite price")
    return out[:n].copy()


# Below this many bars per thread one call is faster than starting threads.
_MIN_BARS_PER_THREAD = 50_000


def _trend_tvalue(r: F64, lmin: int, lmax: int, clip: float) -> F64:
    """``_trend_tvalue_rows_nb`` over all bars (NaN before bar lmax-1). Rows are independent,
    so contiguous blocks run on numba's thread count of threads (the kernel is nogil) with
    results identical to one pass: it is most of the bar-feature time."""
    nb = int(r.shape[0])
    out = np.full(nb, np.nan)
    parts = max(1, min(int(numba.get_num_threads()), nb // _MIN_BARS_PER_THREAD))
    cuts = [nb * p // parts for p in range(parts + 1)]
    if parts == 1:
        _trend_tvalue_block_nb(r, lmin, lmax, clip, 0, nb, out)
        return out
    with ThreadPoolExecutor(parts) as pool:
        list(
            pool.map(
                lambda p: _trend_tvalue_block_nb(r, lmin, lmax, clip, cuts[p], cuts[p + 1], out), range(parts)
            )
        )
    return out


@njit(cache=True)
def _bars_since_session_open_nb(session):
    nb = session.shape[0]
    out = np.empty(nb, np.float64)
    cnt = 0.0
    for j in range(nb):
        if j == 0 or session[j] != session[j - 1]:
            cnt = 0.0
        else:
            cnt += 1.0
        out[j] = cnt
    return out


# --- registry -------------------------------------------------------------------------------


class _Ctx:
    """Inputs of one feature computation plus a memo of shared kernel results."""

    def __init__(self, bars: BarTable, config: BarFeatureConfig) -> None:
        self.bars = bars
        self.cfg = config
        self._memo: dict[str, Any] = {}

    def get(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = fn()
        value = self._memo[key]
        if isinstance(value, Future):  # started ahead on another thread (start_trend)
            value = self._memo[key] = value.result()
        return value

    def trend(self) -> F64:
        c = self.cfg
        return self.get(
            "trend",
            lambda: _trend_tvalue(self.returns()[0], c.trend_min_len, c.trend_max_len, c.trend_t_clip),
        )

    def start_trend(self, pool: ThreadPoolExecutor) -> None:
        """Compute the trend t-values on ``pool`` while this thread computes the other features
        (:meth:`trend` then waits for them): they are the largest single kernel, and nothing
        else depends on them."""
        if "trend" not in self._memo:
            c = self.cfg
            r = self.returns()[0]
            self._memo["trend"] = pool.submit(
                _trend_tvalue, r, c.trend_min_len, c.trend_max_len, c.trend_t_clip
            )

    def returns(self) -> tuple[F64, F64, np.ndarray, F64]:
        b = self.bars
        return self.get(
            "returns",
            lambda: _returns_nb(b.open, b.close, b.instrument_id, self.cfg.log_return_clamp),
        )

    def ewma_vol(self) -> F64:
        alpha = 2.0 / (self.cfg.ewma_vol_span + 1.0)
        return self.get("ewma_vol", lambda: _ewma_vol_nb(self.returns()[0], alpha))

    def dmi(self) -> tuple[F64, F64, F64]:
        b = self.bars
        n = self.cfg.wilder_period
        return self.get("dmi", lambda: dmi(b.open, b.high, b.low, b.close, b.instrument_id, n))

    def atr(self) -> tuple[F64, F64]:
        b = self.bars
        n = self.cfg.wilder_period
        return self.get("atr", lambda: atr_natr(b.open, b.high, b.low, b.close, b.instrument_id, n))

    def macd(self) -> tuple[F64, F64, F64]:
        c = self.cfg
        b = self.bars
        return self.get(
            "macd",
            lambda: macd(b.open, b.close, b.instrument_id, c.macd_fast, c.macd_slow, c.macd_signal),
        )

    def cusum(self) -> tuple[F64, F64, F64]:
        return self.get(
            "cusum",
            lambda: _cusum_nb(self.returns()[0], self.ewma_vol(), self.bars.session_id, self.cfg.cusum_k),
        )

    def log_volume(self) -> F64:
        return self.get("log_volume", lambda: detmath.log(self.bars.volume))

    def log_duration(self) -> F64:
        return self.get("log_duration", lambda: detmath.log1p(self.bars.duration_ns.astype(np.float64) / 1e6))

    def tod_angle(self) -> F64:
        return self.get(
            "tod",
            lambda: (
                2.0
                * np.pi
                * calendar.local_time_of_day_ns(self.bars.ts_close).astype(np.float64)
                / calendar.NS_PER_DAY
            ),
        )


@dataclass(frozen=True)
class FeatureSpec:
    """One feature: ``window`` = trailing bars its value depends on (for recursive indicators:
    bars after which the start is forgotten to ``memory_tol``), ``warmup`` = leading bars of a
    fresh series that are NaN, ``bounds`` = documented closed range (None: any finite value)."""

    name: str
    description: str
    window: int
    warmup: int
    bounds: tuple[float, float] | None
    kernel: Callable[[_Ctx], F64] = field(repr=False, compare=False)


def _memory(alpha: float, tol: float) -> int:
    """Bars after which a recursion with weight (1-alpha) per bar forgets its start to tol."""
    return math.ceil(math.log(tol) / math.log1p(-alpha))


def build_registry(config: BarFeatureConfig | None = None) -> list[FeatureSpec]:
    """The feature registry for a config (names follow the configured windows)."""
    c = config or BarFeatureConfig()
    n = c.wilder_period
    tol = c.memory_tol
    wild = _memory(1.0 / n, tol)
    ew = _memory(2.0 / (c.ewma_vol_span + 1.0), tol)
    macd_mem = _memory(2.0 / (c.macd_slow + 1.0), tol)
    sig_mem = _memory(2.0 / (c.macd_signal + 1.0), tol)
    clamp = c.log_return_clamp
    zb = math.sqrt(c.z_window - 1)  # |z| <= sqrt(w-1) for a population z-score (Samuelson)
    bbb = math.sqrt(c.bb_window - 1) / (2 * c.bb_k)
    eps = 1e-9
    specs = [
        FeatureSpec(
            "log_return",
            f"r_j = ln(C_j/C_{{j-1}}); roll bar (instrument changed, or first bar): ln(C_j/O_j); "
            f"clamped to ±{clamp:g} (the clamp is part of the definition)",
            2,
            0,
            (-clamp, clamp),
            lambda x: x.returns()[0],
        ),
        FeatureSpec(
            "log_return_clamped",
            "1 when log_return was clamped, else 0",
            2,
            0,
            (0.0, 1.0),
            lambda x: x.returns()[1],
        ),
    ]
    for w in c.rv_windows:
        specs.append(
            FeatureSpec(
                f"rv_{w}",
                f"sqrt(sum_{{i=j-{w - 1}..j}} r_i^2), not demeaned",
                w + 1,
                w - 1,
                (0.0, clamp * math.sqrt(w) + eps),
                _rv_kernel(w),
            )
        )
    specs += [
        FeatureSpec(
            f"ewma_vol_{c.ewma_vol_span}",
            f"sqrt(m_j), m_j = m_{{j-1}} + a (r_j^2 - m_{{j-1}}), a = 2/({c.ewma_vol_span}+1), "
            "m_0 = r_0^2 (recursive, adjust=False, zero-mean)",
            ew + 1,
            0,
            (0.0, clamp + eps),
            lambda x: x.ewma_vol(),
        ),
        FeatureSpec(
            f"atr_{n}",
            f"Wilder ATR_{n} of TR = max(H-L, |H-C_prev|, |L-C_prev|) (price units), TA-Lib "
            "seeding; C_prev of a roll bar is its open",
            wild + n + 1,
            n,
            (0.0, math.inf),
            lambda x: x.atr()[0],
        ),
        FeatureSpec(
            f"natr_{n}",
            f"100 * atr_{n} / C_j (percent, as TA-Lib NATR)",
            wild + n + 1,
            n,
            (0.0, math.inf),
            lambda x: x.atr()[1],
        ),
        FeatureSpec(
            f"plus_di_{n}",
            f"100 W(+DM)/W(TR), Wilder sums, TA-Lib seeding (n={n}); carry when W(TR)=0",
            wild + n + 1,
            n,
            (0.0, 100.0),
            lambda x: x.dmi()[0],
        ),
        FeatureSpec(
            f"minus_di_{n}",
            f"100 W(-DM)/W(TR), Wilder sums, TA-Lib seeding (n={n}); carry when W(TR)=0",
            wild + n + 1,
            n,
            (0.0, 100.0),
            lambda x: x.dmi()[1],
        ),
        FeatureSpec(
            f"adx_{n}",
            f"Wilder(DX), DX = 100|+DI - -DI|/(+DI + -DI), seeded by the mean of the first {n} "
            "DX (first value at bar 2n-1); carry when DI sum = 0",
            2 * wild + 2 * n + 1,
            2 * n - 1,
            (0.0, 100.0),
            lambda x: x.dmi()[2],
        ),
        FeatureSpec(
            f"rsi_{n}",
            f"100 U/(U+D), Wilder means of gains/losses (n={n}), TA-Lib seeding; flat window -> 50",
            wild + n + 1,
            n,
            (0.0, 100.0),
            lambda x: x.get("rsi", lambda: rsi(x.bars.open, x.bars.close, x.bars.instrument_id, n)),
        ),
        FeatureSpec(
            f"macd_{c.macd_fast}_{c.macd_slow}",
            f"(EMA_{c.macd_fast}(C) - EMA_{c.macd_slow}(C)) / C_j, TA-Lib MACD seeding",
            macd_mem + c.macd_slow,
            c.macd_slow - 1,
            (-1.0, 1.0),
            lambda x: x.macd()[0],
        ),
        FeatureSpec(
            f"macd_signal_{c.macd_signal}",
            f"EMA_{c.macd_signal}(MACD line) / C_j, TA-Lib seeding",
            macd_mem + sig_mem + c.macd_slow + c.macd_signal,
            c.macd_slow + c.macd_signal - 2,
            (-1.0, 1.0),
            lambda x: x.macd()[1],
        ),
        FeatureSpec(
            "macd_hist",
            "(MACD line - signal) / C_j",
            macd_mem + sig_mem + c.macd_slow + c.macd_signal,
            c.macd_slow + c.macd_signal - 2,
            (-1.0, 1.0),
            lambda x: x.macd()[2],
        ),
        FeatureSpec(
            f"bb_pctb_{c.bb_window}",
            f"(C - mu + {c.bb_k:g} sigma)/({2 * c.bb_k:g} sigma) over {c.bb_window} adjusted "
            "closes, population sigma; sigma = 0 -> 0.5",
            c.bb_window + 1,
            c.bb_window - 1,
            (0.5 - bbb - eps, 0.5 + bbb + eps),
            lambda x: x.get(
                "bb",
                lambda: bollinger_pctb(x.bars.open, x.bars.close, x.bars.instrument_id, c.bb_window, c.bb_k),
            ),
        ),
        FeatureSpec(
            "cusum_event",
            f"1 if the symmetric CUSUM on ln C fires at bar j (h_j = {c.cusum_k:g} * "
            f"ewma_vol_{c.ewma_vol_span}_{{j-1}}; restarts each session), else 0",
            ew + 2,
            0,
            (0.0, 1.0),
            lambda x: x.cusum()[0],
        ),
        FeatureSpec(
            "cusum_direction",
            "+1/-1: direction of the latest CUSUM event in the session, 0 if none yet",
            ew + 2,
            0,
            (-1.0, 1.0),
            lambda x: x.cusum()[1],
        ),
        FeatureSpec(
            "cusum_bars_since",
            "bars since the latest CUSUM event in the session (since its first bar if none)",
            ew + 2,
            0,
            (0.0, math.inf),
            lambda x: x.cusum()[2],
        ),
        FeatureSpec(
            f"trend_tvalue_{c.trend_min_len}_{c.trend_max_len}",
            f"t of the OLS slope of ln C on time over trailing bars j-L+1..j, the largest |t| "
            f"over L in [{c.trend_min_len}, {c.trend_max_len}]; |t| clipped at "
            f"{c.trend_t_clip:g}; s^2 = 0 -> ±clip (0 if slope 0)",
            c.trend_max_len + 1,
            c.trend_max_len - 1,
            (-c.trend_t_clip, c.trend_t_clip),
            lambda x: x.trend(),
        ),
        FeatureSpec(
            "log_volume",
            "ln(volume_j) (contracts)",
            1,
            0,
            None,
            lambda x: x.log_volume(),
        ),
        FeatureSpec(
            f"volume_z_{c.z_window}",
            f"z-score of log_volume over the last {c.z_window} bars (population sigma; 0 if flat)",
            c.z_window,
            c.z_window - 1,
            (-zb - eps, zb + eps),
            lambda x: x.get("vz", lambda: _rolling_z_block_nb(x.log_volume(), c.z_window)),
        ),
        FeatureSpec(
            "buy_volume_frac",
            "buy_volume_j / volume_j (aggressor or tick-rule buys)",
            1,
            0,
            (0.0, 1.0),
            lambda x: x.bars.buy_volume / x.bars.volume,
        ),
        FeatureSpec(
            "log_duration",
            "ln(1 + duration_ns_j / 1e6): log1p of the bar duration in milliseconds",
            1,
            0,
            (0.0, math.inf),
            lambda x: x.log_duration(),
        ),
        FeatureSpec(
            f"duration_z_{c.z_window}",
            f"z-score of log_duration over the last {c.z_window} bars (population sigma; 0 if flat)",
            c.z_window,
            c.z_window - 1,
            (-zb - eps, zb + eps),
            lambda x: x.get("dz", lambda: _rolling_z_block_nb(x.log_duration(), c.z_window)),
        ),
        FeatureSpec(
            "time_of_day_sin",
            "sin(2 pi tod/24h), tod = Chicago wall-clock time of ts_close",
            1,
            0,
            (-1.0, 1.0),
            lambda x: detmath.sin(x.tod_angle()),
        ),
        FeatureSpec(
            "time_of_day_cos",
            "cos(2 pi tod/24h), tod = Chicago wall-clock time of ts_close",
            1,
            0,
            (-1.0, 1.0),
            lambda x: detmath.cos(x.tod_angle()),
        ),
        FeatureSpec(
            "session_progress",
            "(ts_close - session open) / (session close - session open), CME session of the bar",
            1,
            0,
            (0.0, 1.0),
            _session_progress,
        ),
        FeatureSpec(
            "bars_since_session_open",
            "bars since the session's first bar (0 for the first bar)",
            1,
            0,
            (0.0, math.inf),
            lambda x: _bars_since_session_open_nb(x.bars.session_id),
        ),
    ]
    return specs


def _rv_kernel(w: int) -> Callable[[_Ctx], F64]:
    def kernel(x: _Ctx) -> F64:
        return x.get(f"rv_{w}", lambda: _rv_block_nb(x.returns()[0], w))

    return kernel


def _session_progress(x: _Ctx) -> F64:
    # session bounds once per run of equal session ids (a session holds thousands of bars),
    # then repeated: the same values as looking up every bar's session
    s = x.bars.session_id
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1]))) if len(s) else np.zeros(0, np.int64)
    open_u, close_u = calendar.session_bounds_utc(s[starts])
    runs = np.diff(np.append(starts, len(s)))
    open_, close = np.repeat(open_u, runs), np.repeat(close_u, runs)
    return (x.bars.ts_close - open_).astype(np.float64) / (close - open_).astype(np.float64)


FEATURES: list[FeatureSpec] = build_registry()


def feature_names(config: BarFeatureConfig | None = None) -> list[str]:
    """Feature column names, in table order."""
    return [s.name for s in (FEATURES if config is None else build_registry(config))]


def max_window(config: BarFeatureConfig | None = None) -> int:
    """Bars of the previous quarter to pass as ``warmup`` for exact partition equivalence."""
    return max(s.window for s in (FEATURES if config is None else build_registry(config)))


# --- table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureTable:
    """``ts_close`` plus one float64 column per feature; ``n_prior`` = warm-up bars that
    preceded the first row (validation allows NaN only where history < a feature's warmup)."""

    ts_close: npt.NDArray[np.int64]
    columns: dict[str, F64]
    n_prior: int
    config: BarFeatureConfig

    def __len__(self) -> int:
        return int(self.ts_close.shape[0])

    def to_arrow(self) -> pa.Table:
        # tables.array_of rather than pa.array: zero copy, and no pandas import (see array_of)
        arrays = [array_of(np.asarray(self.ts_close, np.int64), pa.int64())]
        arrays += [array_of(np.asarray(v, np.float64), pa.float64()) for v in self.columns.values()]
        names = ["ts_close", *self.columns]
        meta = {
            b"fx.n_prior_bars": str(self.n_prior).encode(),
            b"fx.bar_feature_config": self.config.model_dump_json().encode(),
            b"fx.features": json.dumps({s.name: s.description for s in build_registry(self.config)}).encode(),
        }
        return pa.Table.from_arrays(arrays, names=names).replace_schema_metadata(meta)

    @classmethod
    def from_arrow(cls, table: pa.Table, source: str = "bar_features") -> FeatureTable:
        meta = table.schema.metadata or {}
        try:
            n_prior = int(meta[b"fx.n_prior_bars"])
            config = BarFeatureConfig.model_validate_json(meta[b"fx.bar_feature_config"])
        except (KeyError, ValueError) as exc:
            raise FxDataError(f"{source}: missing or bad feature-table metadata ({exc})") from exc
        names = feature_names(config)
        missing = [n for n in ["ts_close", *names] if n not in table.column_names]
        if missing:
            raise FxDataError(f"{source}: missing feature columns {missing}")
        # numpy_of: to_numpy without its pandas import
        cols = {n: np.asarray(numpy_of(table.column(n)), dtype=np.float64) for n in names}
        ts = np.asarray(numpy_of(table.column("ts_close")), dtype=np.int64)
        return cls(ts_close=ts, columns=cols, n_prior=n_prior, config=config)


def _check_bars(bars: BarTable, what: str) -> None:
    n = len(bars)
    for name, arr in bars.columns().items():
        if arr.shape != (n,):
            raise FxDataError(f"{what}: column {name!r} has shape {arr.shape}, expected ({n},)")
    for name in ("open", "high", "low", "close"):
        arr = getattr(bars, name)
        bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
        if bad.size:
            raise FxDataError(f"{what}: column {name!r} bar {int(bad[0])} is {arr[bad[0]]!r}")
    bad = np.flatnonzero(~(bars.volume > 0))
    if bad.size:
        raise FxDataError(f"{what}: column 'volume' bar {int(bad[0])} is {bars.volume[bad[0]]!r}")
    bad = np.flatnonzero(bars.session_id < 0)
    if bad.size:
        raise FxDataError(f"{what}: column 'session_id' bar {int(bad[0])} is outside any session")
    bad = np.flatnonzero(np.diff(bars.ts_close) < 0)
    if bad.size:
        raise FxDataError(f"{what}: column 'ts_close' not ordered at bar {int(bad[0]) + 1}")


def compute_bar_features(
    bars: BarTable, config: BarFeatureConfig | None = None, warmup: BarTable | None = None
) -> FeatureTable:
    """Features of ``bars``, one row per bar of ``bars``.

    ``warmup``: the last ``max_window(config)`` bars before ``bars`` (the previous quarter's
    tail, reaching into earlier quarters if that one is shorter), or None for the first quarter.
    It only builds indicator state and is dropped from the output. ``bars`` must start at a
    session start (quarters do) for the session-scoped features to match one pass exactly.
    Raises FxDataError on malformed bars or a warm-up that does not precede them."""
    cfg = config or BarFeatureConfig()
    _check_bars(bars, "bars")
    n_prior = 0
    full = bars
    if warmup is not None and len(warmup):
        _check_bars(warmup, "warmup bars")
        if len(bars) and warmup.ts_close[-1] > bars.ts_close[0]:
            raise FxDataError(
                f"warmup bars: last ts_close {int(warmup.ts_close[-1])} is after the first bar's "
                f"{int(bars.ts_close[0])}"
            )
        n_prior = len(warmup)
        full = BarTable.concat([warmup, bars])
    ctx = _Ctx(full, cfg)
    cols: dict[str, F64] = {}
    # The trend t-values (threaded over blocks themselves) run beside the other features, which
    # are one thread each: on two cores the stage's wall is then about the larger of the two.
    with ThreadPoolExecutor(1, thread_name_prefix="bar-features-trend") as pool:
        ctx.start_trend(pool)
        for spec in build_registry(cfg):
            values = np.asarray(spec.kernel(ctx), dtype=np.float64)
            cols[spec.name] = np.ascontiguousarray(values[n_prior:])
    return FeatureTable(
        ts_close=np.ascontiguousarray(bars.ts_close, dtype=np.int64),
        columns=cols,
        n_prior=n_prior,
        config=cfg,
    )


_VALIDATE_BLOCK = 1024  # values screened per block by _first_invalid_nb


@njit(cache=True, nogil=True)
def _first_invalid_nb(v, n_prior, warmup, check_bounds, lo, hi):
    """(first bar ``j`` whose value is infinite, or NaN at history row ``n_prior + j >= warmup``,
    else -1; first bar whose finite value is outside ``[lo, hi]`` when ``check_bounds``, else
    -1, and -1 whenever the first is found): what :func:`validate_features` tests, without its
    five column-sized temporaries per feature. Blocks of ``_VALIDATE_BLOCK`` values are first
    screened branch-free (a loop the compiler vectorises); only a block that holds a NaN, an
    inf or (while none was found) a value outside the bounds is walked value by value."""
    out = -1
    n = v.shape[0]
    for b0 in range(0, n, _VALIDATE_BLOCK):
        b1 = min(n, b0 + _VALIDATE_BLOCK)
        odd = False
        outside = False
        for j in range(b0, b1):
            x = v[j]
            odd |= x - x != 0  # NaN or inf
            outside |= (x < lo) | (x > hi)  # False for NaN
        if not (odd or (outside and check_bounds and out < 0)):
            continue
        for j in range(b0, b1):
            x = v[j]
            if x - x != 0:
                if not (x != x and n_prior + j < warmup):
                    return j, -1
            elif out < 0 and check_bounds and (x < lo or x > hi):
                out = j
    return -1, out


def validate_features(table: FeatureTable, partition: str) -> None:
    """Raise FxDataError (naming partition, feature and bar) on a NaN/Inf outside a feature's
    warm-up or a value outside its documented bounds."""
    for spec in build_registry(table.config):
        v = table.columns.get(spec.name)
        if v is None:
            raise FxDataError(f"{partition}: feature {spec.name!r} missing")
        if v.shape != (len(table),):
            raise FxDataError(f"{partition}: feature {spec.name!r} has shape {v.shape}")
        lo, hi = spec.bounds if spec.bounds is not None else (0.0, 0.0)
        bad, out = _first_invalid_nb(
            np.ascontiguousarray(v, dtype=np.float64),
            int(table.n_prior),
            int(spec.warmup),
            spec.bounds is not None,
            float(lo),
            float(hi),
        )
        if bad >= 0:
            j = int(bad)
            raise FxDataError(
                f"{partition}: feature {spec.name!r} bar {j} is {v[j]!r} outside its warm-up "
                f"({spec.warmup} bars; {table.n_prior} warm-up bars preceded)"
            )
        if out >= 0:
            j = int(out)
            raise FxDataError(
                f"{partition}: feature {spec.name!r} bar {j} is {v[j]!r}, outside its bounds [{lo}, {hi}]"
            )
