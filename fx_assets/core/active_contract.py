"""The active contract of each session and the records that belong to it (no Dagster).

Shared by both row units (bar and snapshot):

- ``quarter_roll_calendar`` / ``roll_calendar_from_table``: a quarter's roll calendar (seeded by
  the previous quarter's last session) and its inverse of ``RollCalendar.to_arrow``.
- ``active_trades`` (:class:`ActiveTrades`) and ``active_trade_flow`` (:class:`TradeFlow`: ts,
  size and sign only): the trades of the session's active contract (halts and weekends, spreads
  and deferred months dropped), in ``ts_recv`` order.
- ``trade_source`` (:class:`TradeSidecar`): what the OFI stage reads of them, left in the
  memory-mapped sidecar and written out window by window (the flow where the sidecar's
  ``ts_recv`` decreases somewhere).
- ``_active_table`` / ``_active_at``: the session boundary table (``calendar.session_table``)
  and the per-session active id that every record-level kernel looks ``ts_recv`` up in, so no
  per-record session / mask array of a whole quarter is built.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit

from fx_assets.core.calendar import _year_range, interval_of, session_table, ts_range
from fx_assets.core.dbn import PRICE_DIVISOR, UNDEF_PRICE
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import RollCalendar, roll_calendar_from_sidecars
from fx_assets.core.sidecar import sidecar_columns
from fx_assets.core.tables import empty_array, numpy_of, py_dates, py_strings

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_T = TypeVar("_T")
_ACTION_TRADE = ord("T")
_SIDE_BUY = ord("B")
_SIDE_SELL = ord("A")


# --- roll calendar --------------------------------------------------------------------------


def quarter_roll_calendar(trades_sidecar: Path, prev_trades_sidecar: Path | None) -> RollCalendar:
    """Roll calendar of the quarter; the previous quarter's last session seeds its first one."""
    return roll_calendar_from_sidecars(trades_sidecar, prev_trades_sidecar)


def roll_calendar_from_table(table: pa.Table) -> RollCalendar:
    """Inverse of ``RollCalendar.to_arrow`` (events rebuilt from the roll flags)."""
    from fx_assets.core.roll import RollEvent

    # the column readers of ``tables``, not to_pydict: no pandas import (see tables.array_of)
    t = table.combine_chunks()

    def column(name: str) -> pa.Array:
        col = t.column(name)
        return col.chunk(0) if col.num_chunks else empty_array(col.type)

    sess = np.array(numpy_of(column("session_day")), dtype=np.int32)
    iid = np.array(numpy_of(column("instrument_id")), dtype=np.uint32)
    is_roll = np.array(numpy_of(column("is_roll")), dtype=bool)
    symbols = py_strings(column("raw_symbol"))
    expiry = py_dates(column("expiry"))

    # A roll on the first row came from a contract of the previous quarter (unknown here: 0).
    events = tuple(
        RollEvent(
            int(sess[i]),
            int(iid[i - 1]) if i > 0 else 0,
            int(iid[i]),
            symbols[i - 1] if i > 0 else None,
            symbols[i],
        )
        for i in np.flatnonzero(is_roll)
    )
    return RollCalendar(sess, iid, tuple(symbols), tuple(expiry), is_roll, events)


def contract_codes_of(calendar: RollCalendar) -> Callable[[npt.ArrayLike], F64]:
    """A function from instrument ids to their contract codes: the expiry as ``yyyymm`` (or the
    instrument id when the expiry is unknown). Trainers and labels use the codes to keep a
    label from spanning a roll."""
    code_by_iid: dict[int, float] = {}
    for iid, exp in zip(calendar.instrument_id, calendar.expiry, strict=True):
        code_by_iid[int(iid)] = float(exp.year * 100 + exp.month) if exp is not None else float(iid)

    def codes(instrument_id: npt.ArrayLike) -> F64:
        uniq, inv = np.unique(np.asarray(instrument_id), return_inverse=True)
        vals = np.array([code_by_iid.get(int(u), float(u)) for u in uniq], dtype=np.float64)
        return vals[inv].reshape(-1)

    return codes


# --- trades ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActiveTrades:
    """Trades of the active contract, ``ts_recv`` order; prices in index points.

    ``after_ts``: when set, only the trades with ``ts_recv > after_ts`` were loaded (a previous
    quarter's warm-up tail, see :func:`ofi_warmup_start`); ``n_source`` counts the file."""

    ts: npt.NDArray[np.int64]
    price: npt.NDArray[np.float64]
    size: npt.NDArray[np.float64]
    sign: npt.NDArray[np.int8]
    session: npt.NDArray[np.int32]
    instrument_id: npt.NDArray[np.uint32]
    n_source: int
    after_ts: int | None = None

    def __len__(self) -> int:
        return int(self.ts.shape[0])


def _active_table(
    calendar: RollCalendar, ts: npt.NDArray[np.int64], span: tuple[int, int] | None = None
) -> tuple[I64, I64, npt.NDArray[np.int32]]:
    """Session lookup table around ``ts`` (see ``calendar.session_table``) and, per session, the
    active instrument id (-1 where the roll calendar has no row: nothing is active). ``span``:
    ``ts_range(ts)`` when the caller has it already."""
    if ts.size == 0:
        bounds, days = session_table(0, 0)
    else:
        bounds, days = session_table(*(ts_range(ts) if span is None else span))
    iid, known = calendar.active_instrument(days)
    return bounds, np.where(known, iid.astype(np.int64), -1), days


@njit(cache=True, inline="always")
def _kept_trade(active: bool, price: int, size: int) -> bool:
    """The one rule of which trade records count: the active contract's, with a defined,
    positive price and a positive size."""
    return active and price != UNDEF_PRICE and price > 0 and size > 0


@njit(cache=True, inline="always")
def _aggressor_sign(side: int) -> int:
    """``dbn.aggressor_sign`` of one ASCII side code: B (buy) +1, A (sell) -1, else 0."""
    return 1 if side == _SIDE_BUY else (-1 if side == _SIDE_SELL else 0)


@njit(cache=True, inline="always")
def _active_at(bounds: I64, act: I64, t: int, iid: int, k: int) -> tuple[bool, int]:
    """(is ``iid`` the active contract at ``t``, interval index of ``t`` for the next call)."""
    k = interval_of(bounds, t, k)
    if k & 1:
        a = act[(k - 1) >> 1]
        return a >= 0 and iid == a, k
    return False, k


@njit(cache=True, nogil=True)
def _active_keep_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    price: I64,
    size: npt.NDArray[np.uint32],
    action: npt.NDArray[np.uint8],
    bounds: I64,
    act: I64,
    after: int,
    lo: int,
    hi: int,
    keep: npt.NDArray[np.bool_],
    info: I64,
) -> int:
    """Mark in ``keep`` the kept trades of ``lo:hi`` (1 byte each: no index array); their count.

    The same read of every record also gives ``info``: the min and max ``ts`` of ``lo:hi`` (the
    caller checks that its session table covered them) and the first record that is not a
    trade (action ``T``; -1: none), which took two more passes over the columns before."""
    cnt = 0
    k = 0
    t_lo = ts[lo] if hi > lo else 0
    t_hi = t_lo
    bad = -1
    for i in range(lo, hi):
        t = ts[i]
        if t < t_lo:
            t_lo = t
        elif t > t_hi:
            t_hi = t
        if bad < 0 and action[i] != _ACTION_TRADE:
            bad = i
        if t <= after:
            continue
        ok, k = _active_at(bounds, act, t, int(iid[i]), k)
        p = price[i]
        if _kept_trade(ok, p, size[i]):
            keep[i] = True
            cnt += 1
    info[0] = t_lo
    info[1] = t_hi
    info[2] = bad
    return cnt


@njit(cache=True, nogil=True)
def _active_write_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    price: I64,
    size: npt.NDArray[np.uint32],
    side: npt.NDArray[np.uint8],
    keep: npt.NDArray[np.bool_],
    bounds: I64,
    days: npt.NDArray[np.int32],
    lo: int,
    hi: int,
    j: int,
    o_ts: I64,
    o_px: F64,
    o_sz: F64,
    o_sg: npt.NDArray[np.int8],
    o_ss: npt.NDArray[np.int32],
    o_id: npt.NDArray[np.uint32],
) -> bool:
    """Write the kept trades of ``lo:hi`` from output row ``j`` on; False if they are out of
    ``ts`` order (among themselves: the caller checks across chunks)."""
    j0 = j
    k = 0
    ordered = True
    for i in range(lo, hi):
        if not keep[i]:
            continue
        t = ts[i]
        if j > j0 and t < o_ts[j - 1]:
            ordered = False
        k = interval_of(bounds, t, k)
        o_ts[j] = t
        o_px[j] = price[i] / PRICE_DIVISOR  # as dbn.px_to_float (price is defined here)
        o_sz[j] = size[i]
        c = side[i]
        o_sg[j] = _aggressor_sign(c)
        o_ss[j] = days[(k - 1) >> 1]
        o_id[j] = iid[i]
        j += 1
    return ordered


# The pass's large arrays come from numba's allocator, not numpy's: numpy advises the kernel to
# back large arrays with transparent huge pages, and on the 2-core benchmark VM the first touch
# of those is several times slower when the process starts after an idle spell (the ~600 MB of
# outputs of a scale-1 quarter: 0.75-1.6 s against 0.17-0.33 s).
@njit(cache=True)
def _zeros_bool_nb(n: int) -> npt.NDArray[np.bool_]:
    return np.zeros(n, np.bool_)


@njit(cache=True)
def _active_outputs_nb(
    n: int,
) -> tuple[I64, F64, F64, npt.NDArray[np.int8], npt.NDArray[np.int32], npt.NDArray[np.uint32]]:
    return (
        np.empty(n, np.int64),
        np.empty(n, np.float64),
        np.empty(n, np.float64),
        np.empty(n, np.int8),
        np.empty(n, np.int32),
        np.empty(n, np.uint32),
    )


# Below this many trades per thread one pass is faster than starting threads.
_MIN_TRADES_PER_THREAD = 1 << 20


def _parallel(n: int) -> tuple[list[int], Callable[[Callable[[int], _T]], list[_T]]]:
    """Cuts of ``n`` records into contiguous parts, one per thread (numba's thread count, at
    most one per ``_MIN_TRADES_PER_THREAD``), and a runner of a function over the parts."""
    parts = max(1, min(int(numba.get_num_threads()), n // _MIN_TRADES_PER_THREAD))
    cuts = [n * p // parts for p in range(parts + 1)]

    def run(fn: Callable[[int], _T]) -> list[_T]:
        if parts == 1:
            return [fn(0)]
        with ThreadPoolExecutor(parts) as pool:
            return list(pool.map(fn, range(parts)))

    return cuts, run


def _keep_pass(
    trades_sidecar: Path,
    cols: dict[str, np.ndarray],
    calendar: RollCalendar,
    after: int,
    cuts: list[int],
    run: Callable[[Callable[[int], int]], list[int]],
) -> tuple[npt.NDArray[np.bool_], list[int], I64, npt.NDArray[np.int32]]:
    """The kept trades of the sidecar (``keep``, count per part) and the session table used.

    Raises ``check_trade_actions``' error if a record is not a trade. The session table is
    built from the first and last records' times; the pass checks that every record's time
    fell in the years that table covers (``session_table`` depends on the year range only), else
    it runs again with the table of their full range: the same selection as a table from
    ``ts_range`` of the whole column, without a separate pass to find it."""
    ts = cols["ts_recv"]
    n = int(ts.shape[0])
    iid, price, size, action = cols["instrument_id"], cols["price"], cols["size"], cols["action"]

    def one(
        span: tuple[int, int] | None,
    ) -> tuple[npt.NDArray[np.bool_], list[int], I64, npt.NDArray[np.int32], list[I64]]:
        keep = _zeros_bool_nb(n)
        bounds, act, days = _active_table(calendar, ts, span)
        infos = [np.zeros(3, np.int64) for _ in cuts[1:]]
        counts = run(
            lambda p: _active_keep_nb(
                ts, iid, price, size, action, bounds, act, after, cuts[p], cuts[p + 1], keep, infos[p]
            )
        )
        if any(int(i[2]) >= 0 for i in infos):
            check_trade_actions(trades_sidecar, action)  # raises, naming the records
        return (
            keep,
            counts,
            bounds,
            days,
            [i for i, a, b in zip(infos, cuts, cuts[1:], strict=False) if b > a],
        )

    span = (int(ts[0]), int(ts[n - 1])) if n else None
    while True:
        keep, counts, bounds, days, ran = one(span)
        if span is None:
            return keep, counts, bounds, days
        seen = (min(int(i[0]) for i in ran), max(int(i[1]) for i in ran))
        if _year_range(np.array(seen, np.int64)) == _year_range(np.array(span, np.int64)):
            return keep, counts, bounds, days
        span = seen


def _active_pass(
    trades_sidecar: Path, cols: dict[str, np.ndarray], calendar: RollCalendar, after: int
) -> tuple[I64, F64, F64, npt.NDArray[np.int8], npt.NDArray[np.int32], npt.NDArray[np.uint32], bool]:
    # Pass 1 marks the kept trades (1 byte each), pass 2 writes them: no index array and no
    # full-length int64 / float64 temporaries. Both passes run on contiguous chunks on
    # numba's thread count of threads (nogil kernels): faulting in the mapped sidecar and the
    # outputs is the cost, and it spreads over cores; pass 2 writes each chunk at the offset
    # the counts of pass 1 give, so the output does not depend on the split.
    ts = cols["ts_recv"]
    cuts, run = _parallel(int(ts.shape[0]))
    keep, counts, bounds, days = _keep_pass(trades_sidecar, cols, calendar, after, cuts, run)
    offsets = [0, *itertools.accumulate(counts)]
    cnt = offsets[-1]
    o_ts, o_px, o_sz, o_sg, o_ss, o_id = _active_outputs_nb(cnt)
    iid, price, size, side = cols["instrument_id"], cols["price"], cols["size"], cols["side"]
    oks = run(
        lambda p: _active_write_nb(
            ts,
            iid,
            price,
            size,
            side,
            keep,
            bounds,
            days,
            cuts[p],
            cuts[p + 1],
            offsets[p],
            o_ts,
            o_px,
            o_sz,
            o_sg,
            o_ss,
            o_id,
        )
    )
    ordered = all(oks) and all(o_ts[j] >= o_ts[j - 1] for j in offsets[1:-1] if 0 < j < cnt)
    return o_ts, o_px, o_sz, o_sg, o_ss, o_id, ordered


def check_trade_actions(where: Path | str, action: npt.NDArray[np.uint8]) -> None:
    """FxDataError unless every record is a trade (action ``T``): a book file that reached the
    trades path would otherwise turn its adds, cancels and modifies into trades."""
    bad = np.flatnonzero(action != _ACTION_TRADE)
    if bad.size:
        i = int(bad[0])
        codes = sorted({chr(int(c)) for c in np.unique(action[bad])})
        raise FxDataError(
            f"{where}: {bad.size} of {action.size} records are not trades (actions {codes}; first at "
            f"row {i}, action {chr(int(action[i]))!r}); expected only 'T' in a trades file"
        )


def active_trades(
    trades_sidecar: Path, calendar: RollCalendar, *, after_ts: int | None = None
) -> ActiveTrades:
    """Trades of each session's active contract with a defined positive price and size (and,
    with ``after_ts``, ``ts_recv > after_ts`` only: a previous quarter's OFI warm-up tail).

    One numba pass over the memory-mapped sidecar columns (session lookup, roll calendar,
    filters) and one writing the kept trades: the only allocations are the outputs.
    """
    cols = sidecar_columns(trades_sidecar, ["ts_recv", "instrument_id", "price", "size", "side", "action"])
    ts = cols["ts_recv"]
    o_ts, o_px, o_sz, o_sg, o_ss, o_id, ordered = _active_pass(
        trades_sidecar, cols, calendar, np.iinfo(np.int64).min if after_ts is None else int(after_ts)
    )
    if not ordered:
        raise FxDataError(f"{trades_sidecar}: trades are not in ts_recv order")
    return ActiveTrades(
        ts=o_ts,
        price=o_px,
        size=o_sz,
        sign=o_sg,
        session=o_ss,
        instrument_id=o_id,
        n_source=int(ts.shape[0]),
        after_ts=after_ts,
    )


@dataclass(frozen=True)
class TradeFlow:
    """The part of :class:`ActiveTrades` that OFI reads: the same trades (``ts_recv`` order),
    their size (contracts) and aggressor sign, without price, session and contract columns."""

    ts: npt.NDArray[np.int64]
    size: npt.NDArray[np.float64]
    sign: npt.NDArray[np.int8]
    n_source: int
    after_ts: int | None = None

    def __len__(self) -> int:
        return int(self.ts.shape[0])


@njit(cache=True, nogil=True)
def _flow_write_nb(
    ts: I64,
    size: npt.NDArray[np.uint32],
    side: npt.NDArray[np.uint8],
    keep: npt.NDArray[np.bool_],
    lo: int,
    hi: int,
    j: int,
    o_ts: I64,
    o_sz: F64,
    o_sg: npt.NDArray[np.int8],
) -> bool:
    """``_active_write_nb`` for ts, size and sign only (the same values)."""
    j0 = j
    ordered = True
    for i in range(lo, hi):
        if not keep[i]:
            continue
        t = ts[i]
        if j > j0 and t < o_ts[j - 1]:
            ordered = False
        o_ts[j] = t
        o_sz[j] = size[i]
        c = side[i]
        o_sg[j] = _aggressor_sign(c)
        j += 1
    return ordered


@njit(cache=True)
def _flow_outputs_nb(n: int) -> tuple[I64, F64, npt.NDArray[np.int8]]:
    return np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.int8)


def active_trade_flow(
    trades_sidecar: Path, calendar: RollCalendar, *, after_ts: int | None = None
) -> TradeFlow:
    """``active_trades`` reduced to what OFI reads (ts, size, sign): the same selection and
    values, half the output to write."""
    cols = sidecar_columns(trades_sidecar, ["ts_recv", "instrument_id", "price", "size", "side", "action"])
    ts = cols["ts_recv"]
    n = int(ts.shape[0])
    cuts, run = _parallel(n)
    after = np.iinfo(np.int64).min if after_ts is None else int(after_ts)
    keep, counts, _, _ = _keep_pass(trades_sidecar, cols, calendar, after, cuts, run)
    offsets = [0, *itertools.accumulate(counts)]
    cnt = offsets[-1]
    o_ts, o_sz, o_sg = _flow_outputs_nb(cnt)
    size, side = cols["size"], cols["side"]
    oks = run(
        lambda p: _flow_write_nb(ts, size, side, keep, cuts[p], cuts[p + 1], offsets[p], o_ts, o_sz, o_sg)
    )
    ordered = all(oks) and all(o_ts[j] >= o_ts[j - 1] for j in offsets[1:-1] if 0 < j < cnt)
    if not ordered:
        raise FxDataError(f"{trades_sidecar}: trades are not in ts_recv order")
    return TradeFlow(ts=o_ts, size=o_sz, sign=o_sg, n_source=n, after_ts=after_ts)


# --- the trades OFI reads, left in the sidecar ------------------------------------------------


_CHECK_BLOCK = 4096  # records per block of _order_actions_nb's branch-free scans


@njit(cache=True, nogil=True)
def _order_actions_nb(ts: I64, action: npt.NDArray[np.uint8], lo: int, hi: int, info: I64) -> None:
    """``info[0]``: the first record of ``lo:hi`` whose ``ts_recv`` is below the record before
    it (-1: none; record ``lo`` is compared with ``lo - 1`` too, so the parts of a split cover
    every pair); ``info[1]``: the first record that is not a trade (-1: none). Each block is
    first scanned without an exit (a loop the compiler vectorises: 0.11 -> 0.05 s for 24.8 M
    records on one core), and only a flagged block is searched for its first record."""
    b_ts = -1
    b_act = -1
    for b0 in range(max(lo, 1), hi, _CHECK_BLOCK):
        b1 = min(b0 + _CHECK_BLOCK, hi)
        m = 0
        for i in range(b0, b1):
            m |= ts[i] < ts[i - 1]
        if m:
            for i in range(b0, b1):
                if ts[i] < ts[i - 1]:
                    b_ts = i
                    break
            break
    for b0 in range(lo, hi, _CHECK_BLOCK):
        b1 = min(b0 + _CHECK_BLOCK, hi)
        m = 0
        for i in range(b0, b1):
            m |= action[i] != _ACTION_TRADE
        if m:
            for i in range(b0, b1):
                if action[i] != _ACTION_TRADE:
                    b_act = i
                    break
            break
    info[0] = b_ts
    info[1] = b_act


@njit(cache=True, nogil=True)
def _flow_range_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    price: I64,
    size: npt.NDArray[np.uint32],
    side: npt.NDArray[np.uint8],
    bounds: I64,
    act: I64,
    after: int,
    lo: int,
    hi: int,
    o_ts: I64,
    o_sz: F64,
    o_sg: npt.NDArray[np.int8],
    o_cv: F64,
    o_cd: F64,
    acc: F64,
    first: bool,
) -> int:
    """The kept trades of records ``lo:hi`` (``_active_keep_nb``'s rule) written as
    ``_flow_write_nb`` writes them, from row 0 of the outputs; their count. With them, the
    cumulative volume and signed volume (``o_cv``, ``o_cd``) as ``ofi._trade_prep_nb`` adds
    them up, carried in ``acc`` (volume, signed volume) from an earlier call; ``first``: these
    are the first trades of the sums (assigned, not added, as that pass does at row 0)."""
    j = 0
    k = 0
    v = acc[0]
    d = acc[1]
    for i in range(lo, hi):
        t = ts[i]
        if t <= after:
            continue
        ok, k = _active_at(bounds, act, t, int(iid[i]), k)
        p = price[i]
        if _kept_trade(ok, p, size[i]):
            o_ts[j] = t
            o_sz[j] = size[i]
            c = side[i]
            g = _aggressor_sign(c)
            o_sg[j] = g
            x = o_sz[j]
            xd = x * float(g)
            if first and j == 0:
                v = x
                d = xd
            else:
                v += x
                d += xd
            o_cv[j] = v
            o_cd[j] = d
            j += 1
    acc[0] = v
    acc[1] = d
    return j


@dataclass(frozen=True)
class TradeSidecar:
    """The trades of :func:`active_trade_flow`, left in the memory-mapped sidecar: the kept
    trades of a ``ts_recv`` window are written out when a caller needs that window
    (:meth:`window`), the same times, sizes and signs as that window of the flow, without the
    quarter-long copy (420 MB for a scale-1 quarter, faulted in page by page) and its second
    pass. Only built (:func:`trade_source`) for a sidecar whose ``ts_recv`` never decreases, so a
    window's trades are the kept records of one record range."""

    path: Path
    columns: dict[str, np.ndarray]
    bounds: I64
    active: I64
    n_source: int
    after_ts: int | None = None

    def records(self, lo_t: int, hi_t: int) -> tuple[int, int]:
        """The record range of ``lo_t < ts_recv <= hi_t``."""
        ts = self.columns["ts_recv"]
        return int(np.searchsorted(ts, lo_t, side="right")), int(np.searchsorted(ts, hi_t, side="right"))

    def window(
        self,
        lo: int,
        hi: int,
        out: tuple[I64, F64, npt.NDArray[np.int8], F64, F64],
        acc: F64,
        first: bool,
    ) -> int:
        """The kept trades of records ``lo:hi`` into ``out`` (ts, size, sign, cumulative
        volume and signed volume; from row 0, room for ``hi - lo``), the sums carried in
        ``acc`` (see ``_flow_range_nb``); their count."""
        c = self.columns
        after = np.iinfo(np.int64).min if self.after_ts is None else int(self.after_ts)
        n = _flow_range_nb(
            c["ts_recv"], c["instrument_id"], c["price"], c["size"], c["side"], self.bounds,
            self.active, after, lo, hi, *out, acc, first,
        )  # fmt: skip
        return int(n)


def trade_source(
    trades_sidecar: Path, calendar: RollCalendar, *, after_ts: int | None = None
) -> TradeSidecar | TradeFlow:
    """What the OFI stage reads of the trades: a :class:`TradeSidecar` when the sidecar's
    ``ts_recv`` never decreases (one pass over ``ts_recv`` and ``action``, which also makes
    :func:`check_trade_actions`' check), else :func:`active_trade_flow` itself (a sidecar
    whose out-of-order records are all dropped is accepted there; its errors are its own).
    Either gives the same trades for any window."""
    cols = sidecar_columns(trades_sidecar, ["ts_recv", "instrument_id", "price", "size", "side", "action"])
    ts, action = cols["ts_recv"], cols["action"]
    n = int(ts.shape[0])
    cuts, run = _parallel(n)
    infos = [np.full(2, -1, np.int64) for _ in cuts[1:]]
    run(lambda p: _order_actions_nb(ts, action, cuts[p], cuts[p + 1], infos[p]))
    if any(int(i[1]) >= 0 for i in infos):
        check_trade_actions(trades_sidecar, action)  # raises, naming the records
    if any(int(i[0]) >= 0 for i in infos):
        return active_trade_flow(trades_sidecar, calendar, after_ts=after_ts)
    # sorted: the first and last records span every time (the table active_trade_flow uses)
    bounds, act, _ = _active_table(calendar, ts, (int(ts[0]), int(ts[n - 1])) if n else None)
    return TradeSidecar(
        path=Path(trades_sidecar), columns=cols, bounds=bounds, active=act, n_source=n, after_ts=after_ts
    )
