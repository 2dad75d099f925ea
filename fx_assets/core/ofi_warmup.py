"""How far back the OFI pass replays to start from the sequential state (no Dagster).

The OFI event pass carries rolling bar windows and the last valid book snapshot. A replay
(a chunk of ``quarter_ofi``, or the previous quarter's warm-up tail) starts ``ofi_warmup_bars``
bars back and further, to a bar whose window holds a valid snapshot of the active contract
(``_has_valid_snapshot``, ``_replay_start``; ``_replay_start_scanned`` scans only the book around
the replay start). ``ofi_warmup_start`` gives the ``ts_recv`` after which the previous quarter's
trades and book are needed, so only that tail is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numba import njit

from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import _active_at, _active_table
from fx_assets.core.bars import BarTable
from fx_assets.core.book import BookSource, _valid_touch
from fx_assets.core.sidecar import sidecar_columns

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@njit(cache=True, nogil=True)
def _mark_snapshot_bars_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    bid: I64,
    ask: I64,
    bounds: I64,
    act: I64,
    ts_close: I64,
    has: npt.NDArray[np.bool_],
) -> None:
    """``has[j] = True`` for the bar whose window holds each valid active snapshot: the first
    bar with ``ts_close >= ts`` (bar 0 takes every earlier one; later than the last bar: none)."""
    nb = ts_close.shape[0]
    k = 0
    j = 0
    for i in range(ts.shape[0]):
        b = bid[i]
        a = ask[i]
        if not _valid_touch(b, a):
            continue
        t = ts[i]
        ok, k = _active_at(bounds, act, t, int(iid[i]), k)
        if not ok:
            continue
        # lower bound of t in ts_close, from the previous answer (the book is in ts order,
        # so it moves forward a few bars at a time; a binary search otherwise)
        steps = 0
        while j < nb and ts_close[j] < t and steps < 8:
            j += 1
            steps += 1
        if not ((j == 0 or ts_close[j - 1] < t) and (j == nb or ts_close[j] >= t)):
            j = np.searchsorted(ts_close, t)
        if j < nb:
            has[j] = True


def _has_valid_snapshot(
    sources: Sequence[tuple[BookSource, dict[str, np.ndarray]]],
    ts_close: npt.NDArray[np.int64],
    after: int | None = None,
) -> npt.NDArray[np.bool_]:
    """Per bar: does its window ``(τ_{j-1}, τ_j]`` hold a valid snapshot of the active contract
    (the OFI kernel's rule: both touches present, not crossed)? Bar 0 counts every earlier
    snapshot (after ``after``, when given: ``_replay_start`` never looks at bar 0). One numba
    pass over each source's memory-mapped columns (their records after ``after``)."""
    has = np.zeros(ts_close.shape[0], dtype=np.bool_)
    tc = np.ascontiguousarray(ts_close, dtype=np.int64)
    if tc.size == 0:
        return has
    for src, c in sources:
        lo = 0 if after is None else int(np.searchsorted(c["ts_recv"], after, side="right"))
        # records after the last close mark no bar: the scan stops there (the book is in ts
        # order), so a window of bars costs its own records, not the rest of the quarter's
        hi = int(np.searchsorted(c["ts_recv"], tc[-1], side="right"))
        ts = c["ts_recv"][lo:hi]
        if ts.size == 0:
            continue
        bounds, act, _ = _active_table(src.calendar, ts)
        _mark_snapshot_bars_nb(
            ts, c["instrument_id"][lo:hi], c["bid_px_00"][lo:hi], c["ask_px_00"][lo:hi], bounds, act, tc, has
        )
    return has


_WARMUP_SCAN_BARS = 256  # bars before the warm-up whose book is scanned first


def _warmup_first_bar(
    prev_bars: BarTable, prev_src: tuple[BookSource, dict[str, np.ndarray]], config: ofi_core.OfiConfig
) -> int:
    """First bar of ``prev_bars`` that ``quarter_ofi`` replays: ``ofi_warmup_bars`` from the
    end, moved back by ``_replay_start`` (:func:`_replay_start_scanned`)."""
    n = len(prev_bars)
    j0 = max(n - ofi_core.ofi_warmup_bars(prev_bars.volume, config), 0)
    if j0 == 0:
        return 0
    return _replay_start_scanned([prev_src], prev_bars.ts_close, prev_bars.instrument_id, j0, None)


def _replay_start_scanned(
    sources: Sequence[tuple[BookSource, dict[str, np.ndarray]]],
    ts_close: npt.NDArray[np.int64],
    inst: npt.NDArray[np.uint32],
    j0: int,
    before_first: int | None,
) -> int:
    """``_replay_start(j0, _has_valid_snapshot(sources, ts_close, before_first), inst)``, with
    only the book of a window of bars before ``j0`` scanned (the window grows while the walk
    back reaches its start): the flags of a window's bars are those of the whole list (bar
    ``lo``'s window is ``(ts_close[lo - 1], ts_close[lo]]`` either way), and the walk reads
    no other bar."""
    j0 = max(j0, 0)
    w = _WARMUP_SCAN_BARS
    while True:
        lo = max(j0 - w, 0)
        after = int(ts_close[lo - 1]) if lo > 0 else before_first
        has = _has_valid_snapshot(sources, ts_close[lo : j0 + 1], after)
        k = lo + _replay_start(j0 - lo, has, inst[lo : j0 + 1])
        if k > lo or lo == 0:
            return k
        w *= 4


def ofi_warmup_start(prev_bars: BarTable, prev_book: BookSource, config: ofi_core.OfiConfig) -> int | None:
    """``ts_recv`` (ns) after which ``quarter_ofi`` uses the previous quarter's trades and book:
    the close of the bar before its warm-up replay (None: from the start). Load the previous
    quarter's trades with ``active_trades(..., after_ts=ofi_warmup_start(...))`` to keep only
    that tail in memory."""
    if not len(prev_bars):
        return None
    src = (prev_book, sidecar_columns(prev_book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"]))
    k = _warmup_first_bar(prev_bars, src, config)
    return int(prev_bars.ts_close[k - 1]) if k > 0 else None


def _replay_start(j: int, has_snap: npt.NDArray[np.bool_], inst: npt.NDArray[np.uint32]) -> int:
    """First bar to replay so that bar ``j``'s replay starts from the sequential book state.

    ``ofi_warmup_bars`` counts bars and contracts, but the OFI event pass also carries the last
    valid snapshot, which a replay only rebuilds once a window holds one: where the book is
    thin (overnight) several bars can have none. So the replay moves back to a bar whose window
    holds a valid snapshot, or to the start of its contract segment (where the sequential pass
    resets too), or to bar 0.
    """
    j = max(j, 0)
    while j > 0 and not has_snap[j] and inst[j] == inst[j - 1]:
        j -= 1
    return j
