"""One quarter of each feature stage, from sidecar files to tables (no Dagster).

Owns how the per-quarter stages are fed: which records are the active contract's, how a
quarter is warmed up from the previous one, and how the book is streamed in bounded chunks.
The kernels themselves live in :mod:`bars`, :mod:`bar_features` and :mod:`ofi`.

- ``quarter_roll_calendar``: roll calendar of a quarter, seeded by the last session of the
  previous quarter (the first session's active contract is decided by the session before it).
- ``active_trades``: the trades of the session's active contract (halts and weekends, spreads
  and deferred months dropped), in ``ts_recv`` order.
- ``quarter_bars``: bars of those trades. Bar state resets at every session start, so a
  quarter's bars never depend on another quarter.
- ``quarter_bar_features``: bar features, warmed up from the tail of the previous quarters'
  bars so that no bar of an interior quarter is dropped.
- ``quarter_ofi``: OFI / book features. The bars (previous quarter's warm-up tail plus the
  quarter) are processed in chunks of about ``book_chunk`` book events; each chunk replays
  enough earlier bars to rebuild every rolling state (at least ``ofi_warmup_bars``, and back to
  a bar whose window holds a valid snapshot, which carries the book state), which gives the
  sequential numbers, so peak memory is set by the chunk, not the quarter.

The record-level passes are numba kernels over the memory-mapped sidecar columns that look
each ``ts_recv`` up in the session boundary table (``calendar.session_table``) and the roll
calendar's active contract per session, so no per-record session / mask / index array of a
whole quarter is built: ``active_trades`` writes only its outputs, a book chunk is written
straight into its [n, levels] matrices (reused from chunk to chunk), and of the previous
quarter only the warm-up tail is read (``ofi_warmup_start``).
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit

from fx_assets.core import ofi as ofi_core
from fx_assets.core.bar_features import BarFeatureConfig, FeatureTable, compute_bar_features, max_window
from fx_assets.core.bars import BarConfig, BarTable, build_bars
from fx_assets.core.calendar import interval_of, session_table, ts_range
from fx_assets.core.dbn import PRICE_DIVISOR, UNDEF_PRICE
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import ColumnBlock
from fx_assets.core.roll import RollCalendar, roll_calendar_from_sidecars
from fx_assets.core.sidecar import sidecar_columns
from fx_assets.core.tables import read_table, write_table  # noqa: F401  (stage table IO, re-exported)

N_LEVELS = 10
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_T = TypeVar("_T")
DEFAULT_BOOK_CHUNK = 500_000
# A trade costs the OFI pass about 1/8 of a book event's memory (~50 B: its slice and the
# kernel's cumulative sums, against ~500 B for ten levels of six float64 matrices), so a chunk
# holds about ``book_chunk`` book events + trades / TRADE_WEIGHT: a quarter with a thin book
# is still cut into bounded chunks.
TRADE_WEIGHT = 8
_ACTION_TRADE = ord("T")
_SIDE_BUY = ord("B")
_SIDE_SELL = ord("A")


# --- roll calendar --------------------------------------------------------------------------


def quarter_roll_calendar(trades_sidecar: Path, prev_trades_sidecar: Path | None) -> RollCalendar:
    """Roll calendar of the quarter; the previous quarter's last session seeds its first one."""
    return roll_calendar_from_sidecars(trades_sidecar, prev_trades_sidecar)


def roll_calendar_from_table(table: pa.Table) -> RollCalendar:
    """Inverse of ``RollCalendar.to_arrow`` (events rebuilt from the roll flags)."""
    d = table.to_pydict()
    sess = np.asarray(d["session_day"], dtype=np.int32)
    iid = np.asarray(d["instrument_id"], dtype=np.uint32)
    is_roll = np.asarray(d["is_roll"], dtype=bool)
    from fx_assets.core.roll import RollEvent

    # A roll on the first row came from a contract of the previous quarter (unknown here: 0).
    events = tuple(
        RollEvent(
            int(sess[i]),
            int(iid[i - 1]) if i > 0 else 0,
            int(iid[i]),
            d["raw_symbol"][i - 1] if i > 0 else None,
            d["raw_symbol"][i],
        )
        for i in np.flatnonzero(is_roll)
    )
    return RollCalendar(sess, iid, tuple(d["raw_symbol"]), tuple(d["expiry"]), is_roll, events)


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
    calendar: RollCalendar, ts: npt.NDArray[np.int64]
) -> tuple[I64, I64, npt.NDArray[np.int32]]:
    """Session lookup table around ``ts`` (see ``calendar.session_table``) and, per session, the
    active instrument id (-1 where the roll calendar has no row: nothing is active)."""
    if ts.size == 0:
        bounds, days = session_table(0, 0)
    else:
        bounds, days = session_table(*ts_range(ts))
    iid, known = calendar.active_instrument(days)
    return bounds, np.where(known, iid.astype(np.int64), -1), days


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
    bounds: I64,
    act: I64,
    after: int,
    lo: int,
    hi: int,
    keep: npt.NDArray[np.bool_],
) -> int:
    """Mark in ``keep`` the kept trades of ``lo:hi`` (1 byte each: no index array); their count."""
    cnt = 0
    k = 0
    for i in range(lo, hi):
        if ts[i] <= after:
            continue
        ok, k = _active_at(bounds, act, ts[i], int(iid[i]), k)
        p = price[i]
        if ok and p != UNDEF_PRICE and p > 0 and size[i] > 0:
            keep[i] = True
            cnt += 1
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
        o_sg[j] = 1 if c == _SIDE_BUY else (-1 if c == _SIDE_SELL else 0)  # dbn.aggressor_sign
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


def _active_pass(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    price: I64,
    size: npt.NDArray[np.uint32],
    side: npt.NDArray[np.uint8],
    bounds: I64,
    act: I64,
    days: npt.NDArray[np.int32],
    after: int,
) -> tuple[I64, F64, F64, npt.NDArray[np.int8], npt.NDArray[np.int32], npt.NDArray[np.uint32], bool]:
    # Pass 1 marks the kept trades (1 byte each), pass 2 writes them: no index array and no
    # full-length int64 / float64 temporaries. Both passes run on contiguous chunks on
    # numba's thread count of threads (nogil kernels): faulting in the mapped sidecar and the
    # outputs is the cost, and it spreads over cores; pass 2 writes each chunk at the offset
    # the counts of pass 1 give, so the output does not depend on the split.
    n = int(ts.shape[0])
    parts = max(1, min(int(numba.get_num_threads()), n // _MIN_TRADES_PER_THREAD))
    cuts = [n * p // parts for p in range(parts + 1)]
    keep = _zeros_bool_nb(n)

    def run(fn: Callable[[int], _T]) -> list[_T]:
        if parts == 1:
            return [fn(0)]
        with ThreadPoolExecutor(parts) as pool:
            return list(pool.map(fn, range(parts)))

    counts = run(
        lambda p: _active_keep_nb(ts, iid, price, size, bounds, act, after, cuts[p], cuts[p + 1], keep)
    )
    offsets = [0, *itertools.accumulate(counts)]
    cnt = offsets[-1]
    o_ts, o_px, o_sz, o_sg, o_ss, o_id = _active_outputs_nb(cnt)
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
    check_trade_actions(trades_sidecar, cols["action"])
    ts = cols["ts_recv"]
    bounds, act, days = _active_table(calendar, ts)
    o_ts, o_px, o_sz, o_sg, o_ss, o_id, ordered = _active_pass(
        ts,
        cols["instrument_id"],
        cols["price"],
        cols["size"],
        cols["side"],
        bounds,
        act,
        days,
        np.iinfo(np.int64).min if after_ts is None else int(after_ts),
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
        o_sg[j] = 1 if c == _SIDE_BUY else (-1 if c == _SIDE_SELL else 0)  # dbn.aggressor_sign
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
    check_trade_actions(trades_sidecar, cols["action"])
    ts = cols["ts_recv"]
    bounds, act, _ = _active_table(calendar, ts)
    n = int(ts.shape[0])
    parts = max(1, min(int(numba.get_num_threads()), n // _MIN_TRADES_PER_THREAD))
    cuts = [n * p // parts for p in range(parts + 1)]
    keep = _zeros_bool_nb(n)
    after = np.iinfo(np.int64).min if after_ts is None else int(after_ts)

    def run(fn: Callable[[int], _T]) -> list[_T]:
        if parts == 1:
            return [fn(0)]
        with ThreadPoolExecutor(parts) as pool:
            return list(pool.map(fn, range(parts)))

    iid, price, size = cols["instrument_id"], cols["price"], cols["size"]
    counts = run(
        lambda p: _active_keep_nb(ts, iid, price, size, bounds, act, after, cuts[p], cuts[p + 1], keep)
    )
    offsets = [0, *itertools.accumulate(counts)]
    cnt = offsets[-1]
    o_ts, o_sz, o_sg = _flow_outputs_nb(cnt)
    side = cols["side"]
    oks = run(
        lambda p: _flow_write_nb(ts, size, side, keep, cuts[p], cuts[p + 1], offsets[p], o_ts, o_sz, o_sg)
    )
    ordered = all(oks) and all(o_ts[j] >= o_ts[j - 1] for j in offsets[1:-1] if 0 < j < cnt)
    if not ordered:
        raise FxDataError(f"{trades_sidecar}: trades are not in ts_recv order")
    return TradeFlow(ts=o_ts, size=o_sz, sign=o_sg, n_source=n, after_ts=after_ts)


def quarter_bars(trades: ActiveTrades, config: BarConfig) -> BarTable:
    return build_bars(
        trades.ts, trades.price, trades.size, trades.sign, trades.session, trades.instrument_id, config
    )


# --- bar features ---------------------------------------------------------------------------


def warmup_tail(previous: Sequence[BarTable], n: int) -> BarTable | None:
    """The last ``n`` bars of the earlier quarters (oldest first in ``previous``)."""
    tables = [b for b in previous if len(b)]
    if not tables or n <= 0:
        return None
    joined = BarTable.concat(tables) if len(tables) > 1 else tables[0]
    start = max(len(joined) - n, 0)
    return joined.slice(start, len(joined))


def quarter_bar_features(
    bars: BarTable, previous: Sequence[BarTable], config: BarFeatureConfig
) -> FeatureTable:
    """Features of ``bars`` warmed up from the previous quarters' last ``max_window`` bars."""
    return compute_bar_features(bars, config, warmup=warmup_tail(previous, max_window(config)))


# --- book -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BookSource:
    """A quarter's MBP-10 sidecar and the calendar selecting its active contract."""

    path: Path
    calendar: RollCalendar


_BOOK_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")


def _book_columns(levels: int) -> list[str]:
    """The MBP-10 sidecar columns the OFI pass reads: levels ``0 .. levels-1`` only."""
    return ["ts_recv", "instrument_id"] + [f"{f}_{i:02d}" for f in _BOOK_FIELDS for i in range(levels)]


@njit(cache=True, nogil=True)
def _select_active_nb(
    ts: I64, iid: npt.NDArray[np.uint32], bounds: I64, act: I64, lo: int, hi: int, out: I64
) -> int:
    """Record numbers in ``[lo, hi)`` of the session's active contract, into ``out``; count."""
    n = 0
    k = 0
    for i in range(lo, hi):
        ok, k = _active_at(bounds, act, ts[i], int(iid[i]), k)
        if ok:
            out[n] = i
            n += 1
    return n


_GATHER_BLOCK = 4096  # rows per block: every column's slice of a block stays in cache


@njit(cache=True, nogil=True)
def _gather_book_nb(
    idx: I64,
    ts: I64,
    bid_px: tuple[np.ndarray, ...],
    ask_px: tuple[np.ndarray, ...],
    bid_sz: tuple[np.ndarray, ...],
    ask_sz: tuple[np.ndarray, ...],
    bid_ct: tuple[np.ndarray, ...],
    ask_ct: tuple[np.ndarray, ...],
    tick_units: int,
    row0: int,
    o_ts: I64,
    o_bpx: F64,
    o_apx: F64,
    o_bsz: F64,
    o_asz: F64,
    o_bct: F64,
    o_act: F64,
) -> tuple[int, int]:
    """Rows ``idx`` of the level columns into rows ``row0 ..`` of the [n, levels] matrices.

    Prices as ``dbn.px_to_float`` (int / 1e9, UNDEF_PRICE -> NaN). With ``tick_units`` > 0,
    returns the first defined price off the grid as (column rank, position in ``idx``) in the
    order a column-by-column check finds it (bid levels 0.., then ask levels 0.., then record
    order); (-1, -1) if none. One thread: the copy is memory-bound (two threads measured
    slower on the 2-core machine).
    """
    n = idx.shape[0]
    levels = len(bid_px)
    n_blocks = (n + _GATHER_BLOCK - 1) // _GATHER_BLOCK
    big = 2 * levels  # above every rank
    bad_rank = np.full(n_blocks, big, np.int64)
    bad_pos = np.zeros(n_blocks, np.int64)
    for blk in range(n_blocks):
        b0 = blk * _GATHER_BLOCK
        b1 = min(b0 + _GATHER_BLOCK, n)
        for r in range(b0, b1):
            o_ts[row0 + r] = ts[idx[r]]
        for lvl in range(levels):
            for side in range(2):
                col = bid_px[lvl] if side == 0 else ask_px[lvl]
                out = o_bpx if side == 0 else o_apx
                rank = side * levels + lvl
                # The grid check (a 64-bit modulo, the costliest step here) runs once per run of
                # equal prices: a level's price mostly repeats from record to record, and a
                # repeat of an off-grid price was already recorded at its first row.
                last = UNDEF_PRICE
                for r in range(b0, b1):
                    v = col[idx[r]]
                    if v == UNDEF_PRICE:
                        out[row0 + r, lvl] = np.nan
                    else:
                        out[row0 + r, lvl] = v / PRICE_DIVISOR
                        if tick_units > 0 and v != last:
                            last = v
                            if v % tick_units != 0 and rank < bad_rank[blk]:
                                bad_rank[blk] = rank  # rows ascend within a block: the first is kept
                                bad_pos[blk] = r
            c1 = bid_sz[lvl]
            c2 = ask_sz[lvl]
            c3 = bid_ct[lvl]
            c4 = ask_ct[lvl]
            for r in range(b0, b1):
                i = idx[r]
                o_bsz[row0 + r, lvl] = c1[i]
                o_asz[row0 + r, lvl] = c2[i]
                o_bct[row0 + r, lvl] = c3[i]
                o_act[row0 + r, lvl] = c4[i]
    best_rank = big
    best_pos = -1
    for blk in range(n_blocks):  # blocks in row order: lowest rank, then earliest row
        if bad_rank[blk] < best_rank:
            best_rank = bad_rank[blk]
            best_pos = bad_pos[blk]
    if best_rank == big:
        return -1, -1
    return best_rank, best_pos


class _BookBuffers:
    """Output matrices reused from one OFI chunk to the next: a fresh 100-MB-class allocation
    per chunk would page-fault every page again (a chunk's ``BookArrays`` are views into
    these, dead before the next chunk is built)."""

    def __init__(self) -> None:
        self.rows = 0
        self.levels = 0
        self.ts = np.empty(0, np.int64)
        self.mats: list[F64] = []

    def take(self, n: int, levels: int) -> tuple[I64, list[F64]]:
        if n > self.rows or levels != self.levels:
            cap = max(n, int(self.rows * 1.25)) if levels == self.levels else n
            self.ts = np.empty(cap, np.int64)
            self.mats = [np.empty((cap, levels), np.float64) for _ in _BOOK_FIELDS]
            self.rows, self.levels = cap, levels
        return self.ts[:n], [m[:n] for m in self.mats]


def _book_rows(
    parts: Sequence[tuple[BookSource, dict[str, np.ndarray], int, int]],
    levels: int,
    tick_units: int = 0,
    buffers: _BookBuffers | None = None,
    tables: Sequence[tuple[I64, I64]] | None = None,
) -> ofi_core.BookArrays:
    """Active-contract book rows of the record ranges ``[lo, hi)`` of each source, in order, as
    [n, ``levels``] float matrices written in place (no per-column temporaries, no second
    concatenation copy; into ``buffers`` when given). With ``tick_units`` > 0, a defined price
    off the tick grid raises (naming file, column, record and ts_recv). ``tables``: each
    part's ``_active_table`` (bounds, active ids) over its whole source, built once by the
    caller (any table covering the records gives the same selection)."""
    picked: list[tuple[BookSource, dict[str, np.ndarray], I64]] = []
    for p, (src, c, lo, hi) in enumerate(parts):
        if hi <= lo:
            continue
        ts = c["ts_recv"]
        if tables is None:
            bounds, act, _ = _active_table(src.calendar, ts[lo:hi])
        else:
            bounds, act = tables[p]
        idx = np.empty(hi - lo, dtype=np.int64)
        n = _select_active_nb(ts, c["instrument_id"], bounds, act, lo, hi, idx)
        picked.append((src, c, idx[:n]))
    total = sum(int(i.shape[0]) for _, _, i in picked)
    if buffers is None:
        o_ts = np.empty(total, dtype=np.int64)
        mats = [np.empty((total, levels), dtype=np.float64) for _ in _BOOK_FIELDS]
    else:
        o_ts, mats = buffers.take(total, levels)
    row = 0
    for src, c, idx in picked:
        if idx.size == 0:
            continue
        c_bpx, c_apx, c_bsz, c_asz, c_bct, c_act = (
            tuple(c[f"{f}_{i:02d}"] for i in range(levels)) for f in _BOOK_FIELDS
        )
        m_bpx, m_apx, m_bsz, m_asz, m_bct, m_act = mats
        rank, pos = _gather_book_nb(
            idx, c["ts_recv"], c_bpx, c_apx, c_bsz, c_asz, c_bct, c_act, tick_units, row, o_ts,
            m_bpx, m_apx, m_bsz, m_asz, m_bct, m_act,
        )  # fmt: skip
        if rank >= 0:
            side, lvl = divmod(int(rank), levels)
            name = f"{('bid_px', 'ask_px')[side]}_{lvl:02d}"
            r = int(idx[pos])
            raise FxDataError(
                f"{src.path}: {name} = {int(c[name][r]) * 1e-9!r} at record {r} "
                f"(ts_recv {int(c['ts_recv'][r])}) is off the {tick_units * 1e-9:g} tick grid "
                "(OfiConfig.tick_size)"
            )
        row += int(idx.shape[0])
    return ofi_core.BookArrays(o_ts, *mats)


def _concat_ofi(parts: list[ofi_core.OfiFeatures]) -> ofi_core.OfiFeatures:
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    return ofi_core.OfiFeatures(
        ts_close=np.concatenate([p.ts_close for p in parts]),
        bars_since_reset=np.concatenate([p.bars_since_reset for p in parts]),
        columns={k: np.concatenate([p.columns[k] for p in parts]) for k in first.columns},
        config=first.config,
        tick_size=first.tick_size,
        meta=dict(first.meta),
    )


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
        if b == UNDEF_PRICE or a == UNDEF_PRICE or b <= 0 or b > a:
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
            lo = 0
            hi = nb
            while lo < hi:
                mid = (lo + hi) >> 1
                if ts_close[mid] < t:
                    lo = mid + 1
                else:
                    hi = mid
            j = lo
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
    for src, c in sources:
        lo = 0 if after is None else int(np.searchsorted(c["ts_recv"], after, side="right"))
        ts = c["ts_recv"][lo:]
        if ts.size == 0 or tc.size == 0:
            continue
        bounds, act, _ = _active_table(src.calendar, ts)
        _mark_snapshot_bars_nb(
            ts, c["instrument_id"][lo:], c["bid_px_00"][lo:], c["ask_px_00"][lo:], bounds, act, tc, has
        )
    return has


_WARMUP_SCAN_BARS = 256  # bars before the warm-up whose book is scanned first


def _warmup_first_bar(
    prev_bars: BarTable, prev_src: tuple[BookSource, dict[str, np.ndarray]], config: ofi_core.OfiConfig
) -> int:
    """First bar of ``prev_bars`` that ``quarter_ofi`` replays: ``ofi_warmup_bars`` from the
    end, moved back by ``_replay_start``. Only the book after a window of bars before that
    point is scanned (the window grows while the walk back reaches its start)."""
    n = len(prev_bars)
    j0 = max(n - ofi_core.ofi_warmup_bars(prev_bars.volume, config), 0)
    if j0 == 0:
        return 0
    tc = prev_bars.ts_close
    w = _WARMUP_SCAN_BARS
    while True:
        lo = max(j0 - w, 0)
        after = int(tc[lo - 1]) if lo > 0 else None
        has = _has_valid_snapshot([prev_src], tc[lo : j0 + 1], after)
        k = lo + _replay_start(j0 - lo, has, prev_bars.instrument_id[lo : j0 + 1])
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


def _trade_slices(sources: Sequence[ActiveTrades | TradeFlow], lo_t: int, hi_t: int) -> ofi_core.TradeArrays:
    """Trades with ``lo_t < ts <= hi_t`` of the sources (consecutive, each in ts order): a view
    when one source holds them, else a copy of only those trades (no prices: OFI reads none)."""
    spans = [
        (t, int(np.searchsorted(t.ts, lo_t, side="right")), int(np.searchsorted(t.ts, hi_t, side="right")))
        for t in sources
    ]
    got = [g for g in spans if g[2] > g[1]]
    if len(got) <= 1:
        t, lo, hi = got[0] if got else spans[-1]
        return ofi_core.TradeArrays(t.ts[lo:hi], None, t.size[lo:hi], t.sign[lo:hi])
    ts, size, sign = (
        np.concatenate([getattr(t, f)[lo:hi] for t, lo, hi in got]) for f in ("ts", "size", "sign")
    )
    return ofi_core.TradeArrays(ts, None, size, sign)


def quarter_ofi(
    bars: BarTable,
    trades: ActiveTrades | TradeFlow,
    book: BookSource,
    config: ofi_core.OfiConfig,
    *,
    prev_bars: BarTable | None = None,
    prev_trades: ActiveTrades | TradeFlow | None = None,
    prev_book: BookSource | None = None,
    book_chunk: int = DEFAULT_BOOK_CHUNK,
    partition: str = "?",
) -> ofi_core.OfiFeatures:
    """OFI features of ``bars`` (one quarter), warmed up from the previous quarter's tail.

    The bar list is the previous quarter's last ``ofi_warmup_bars`` bars followed by this
    quarter's; it is cut into chunks of about ``book_chunk`` events (book events plus trades /
    ``TRADE_WEIGHT``), and each chunk after the first replays the ``ofi_warmup_bars`` bars
    before it, so every chunk starts from the state the sequential pass would have. Both
    replays reach further back where needed to hold a valid book snapshot (see
    :func:`_replay_start`). Only the events of a chunk's bars are materialised: the sidecar
    columns are memory-mapped views, and the trades of a chunk are slices of ``trades`` /
    ``prev_trades`` (of the previous quarter only its warm-up tail is ever touched).
    """
    levels = config.levels
    names = _book_columns(levels)
    book_cols = sidecar_columns(book.path, names)
    if book_cols["ts_recv"].size == 0:
        raise FxDataError(f"OFI {partition}: the MBP-10 sidecar {book.path} holds no book records")
    tick = config.tick_size
    tick_units = round(tick * 1e9)
    sources: list[tuple[BookSource, dict[str, np.ndarray]]] = []
    trade_sources: list[ActiveTrades | TradeFlow] = []
    n_warm = 0
    before_first: int | None = None  # close of the bar before bar 0 of the bar list
    if prev_bars is not None and len(prev_bars) and prev_book is not None and prev_trades is not None:
        sources.append((prev_book, sidecar_columns(prev_book.path, names)))
        n_prev = len(prev_bars)
        k = _warmup_first_bar(prev_bars, sources[0], config)
        n_warm = n_prev - k
        all_bars = BarTable.concat([prev_bars.slice(k, n_prev), bars])
        before_first = int(prev_bars.ts_close[k - 1]) if k > 0 else None
        if prev_trades.after_ts is not None and (before_first is None or prev_trades.after_ts > before_first):
            raise FxDataError(
                f"OFI {partition}: prev_trades were loaded after ts_recv {prev_trades.after_ts}, but the "
                f"warm-up needs them after {before_first} (use ofi_warmup_start with the same bars, book "
                "and config)"
            )
        trade_sources.append(prev_trades)
    else:
        all_bars = bars
    trade_sources.append(trades)
    sources.append((book, book_cols))
    ts_close = all_bars.ts_close
    inst = all_bars.instrument_id
    n_all = len(ts_close)

    def close_before(j: int) -> int | None:
        return int(ts_close[j - 1]) if j > 0 else before_first

    has_snap = _has_valid_snapshot(sources, ts_close, before_first)

    # Events up to each bar's close, over all sources: sets the chunk boundaries. Only
    # differences are used, so the previous quarter's events before the warm-up cancel out.
    cum = np.zeros(n_all, dtype=np.int64)
    for _, c in sources:
        cum += np.searchsorted(c["ts_recv"], ts_close, side="right")
    for t in trade_sources:
        cum += np.searchsorted(t.ts, ts_close, side="right") // TRADE_WEIGHT
    bounds = [n_warm]
    while bounds[-1] < n_all:
        start = bounds[-1]
        base = int(cum[start - 1]) if start > 0 else 0
        nxt = int(np.searchsorted(cum, base + book_chunk, side="right"))
        bounds.append(min(max(nxt, start + 1), n_all))
    del cum

    outs: list[ofi_core.OfiFeatures] = []
    buffers = _BookBuffers()
    tables = [_active_table(src.calendar, c["ts_recv"])[:2] for src, c in sources]
    releasers = [PageReleaser(list(c.values())) for _, c in sources]
    for b0, b1 in itertools.pairwise(bounds):
        w0 = (
            0
            if b0 == n_warm
            else _replay_start(b0 - ofi_core.ofi_warmup_bars(all_bars.volume[:b0], config), has_snap, inst)
        )
        t_start = close_before(w0)
        lo_t = t_start if t_start is not None else int(np.iinfo(np.int64).min)
        hi_t = int(ts_close[b1 - 1])
        parts = []
        for (src, c), rel in zip(sources, releasers, strict=True):
            lo = int(np.searchsorted(c["ts_recv"], lo_t, side="right"))
            hi = int(np.searchsorted(c["ts_recv"], hi_t, side="right"))
            parts.append((src, c, lo, hi))
            rel.release_before(lo)  # later chunks start at or after this window
        book_arr = _book_rows(parts, levels, tick_units, buffers, tables)
        outs.append(
            ofi_core.compute_ofi_features(
                book_arr,
                _trade_slices(trade_sources, lo_t, hi_t),
                ts_close[w0:b1],
                inst[w0:b1],
                config,
                tick_size=tick,
                n_warmup=b0 - w0,
                ts_window_start=t_start,
                partition=partition,
            )
        )
        del book_arr
    if not outs:  # a quarter without bars
        return ofi_core.compute_ofi_features(
            _book_rows([], levels),
            _trade_slices(trade_sources, 0, 0),
            ts_close[:0],
            inst[:0],
            config,
            tick_size=tick,
            partition=partition,
        )
    return _concat_ofi(outs)


# --- releasing consumed pages of memory-mapped sidecars ---------------------------------------

_MADV_DONTNEED = 4
_LIBC = ctypes.CDLL(None, use_errno=True)


def _file_backed_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process's file-backed mappings (from /proc/self/maps)."""
    out = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/"):
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    out.append((lo, hi))
    except OSError:
        return []
    return out


class PageReleaser:
    """Drops the pages of memory-mapped sidecar columns that a forward scan has finished with.

    The pages stay in the page cache (a later read faults them back in), but they leave this
    process's resident set, so scanning a 17 GB book sidecar does not grow the RSS to 17 GB.
    Only arrays that lie wholly inside a file-backed mapping are touched: ``MADV_DONTNEED`` on
    anonymous memory would discard data.
    """

    def __init__(self, columns: Sequence[np.ndarray]) -> None:
        ranges = _file_backed_ranges()
        self.columns = []
        for a in columns:
            if a.size == 0 or not a.flags.c_contiguous:
                continue
            lo = a.ctypes.data
            hi = lo + a.nbytes
            if any(r0 <= lo and hi <= r1 for r0, r1 in ranges):
                self.columns.append(a)
        self.done = 0

    def release_before(self, row: int) -> None:
        """Release rows ``[previous row, row)`` of every column (whole pages inside them only)."""
        if row <= self.done:
            return
        page = mmap.PAGESIZE
        for a in self.columns:
            base, isz = a.ctypes.data, a.itemsize
            start = -(-(base + self.done * isz) // page) * page
            stop = ((base + min(row, a.shape[0]) * isz) // page) * page
            if stop > start:
                _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), _MADV_DONTNEED)
        self.done = row


# --- fxcache assembly -----------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _mid_asof_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    bid: I64,
    ask: I64,
    bounds: I64,
    act: I64,
    q: I64,
    order: I64,
    q_slot: I64,
    slot_iid: I64,
    out: F64,
) -> None:
    """One forward merge of the book (ts order) with the queries (in ``order``: ascending
    time): ``out[j]`` = mid of the last valid active snapshot with ``ts_recv <= q[j]`` of
    instrument ``slot_iid[q_slot[j]]`` (of any instrument when ``slot_iid`` is empty); NaN
    before the first. Mid as ``(px_to_float(bid) + px_to_float(ask)) / 2``."""
    n_slots = slot_iid.shape[0]
    last = np.full(max(n_slots, 1), np.nan)
    n = ts.shape[0]
    i = 0
    k = 0
    for r in range(order.shape[0]):
        jq = order[r]
        t = q[jq]
        while i < n and ts[i] <= t:
            b = bid[i]
            a = ask[i]
            if b != UNDEF_PRICE and a != UNDEF_PRICE and b > 0 and b <= a:
                ok, k = _active_at(bounds, act, ts[i], int(iid[i]), k)
                if ok:
                    mid = (b / PRICE_DIVISOR + a / PRICE_DIVISOR) / 2.0
                    if n_slots == 0:
                        last[0] = mid
                    else:
                        for s in range(n_slots):
                            if slot_iid[s] == iid[i]:
                                last[s] = mid
                                break
            i += 1
        out[jq] = last[q_slot[jq]]


def book_mid_asof(
    book: BookSource,
    ts_query: npt.NDArray[np.int64],
    chunk: int = DEFAULT_BOOK_CHUNK,
    *,
    instrument_id: npt.NDArray[np.uint32] | None = None,
) -> F64:
    """Mid price of the active contract's book as of each query time (last valid snapshot with
    ``ts_recv <= t``; NaN before the first): one numba merge of the memory-mapped book columns
    with the queries, no per-record temporaries (``chunk`` is accepted for compatibility).

    ``instrument_id`` (one per query, optional): only snapshots of that contract count. A bar
    right after a roll must not get the previous contract's mid (the last active snapshot
    before its open is usually the old contract's, from the session before)."""
    del chunk
    cols = sidecar_columns(book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    ts = cols["ts_recv"]
    q = np.ascontiguousarray(ts_query, dtype=np.int64)
    out = np.full(q.shape[0], np.nan)
    if instrument_id is None:
        slot_iid = np.empty(0, np.int64)
        q_slot = np.zeros(q.shape[0], np.int64)
    else:
        qi = np.asarray(instrument_id, dtype=np.uint32)
        if qi.shape != q.shape:
            raise FxDataError(
                f"book_mid_asof: instrument_id {qi.shape} and ts_query {q.shape} differ in shape"
            )
        uniq, inv = np.unique(qi, return_inverse=True)
        slot_iid = uniq.astype(np.int64)
        q_slot = inv.astype(np.int64).reshape(-1)
    if ts.shape[0] == 0 or q.shape[0] == 0:
        return out
    ordered = q.shape[0] < 2 or bool(np.all(q[1:] >= q[:-1]))
    order = np.arange(q.shape[0], dtype=np.int64) if ordered else np.argsort(q, kind="stable")
    bounds, act, _ = _active_table(book.calendar, ts)
    _mid_asof_nb(
        ts, cols["instrument_id"], cols["bid_px_00"], cols["ask_px_00"], bounds, act, q, order,
        q_slot, slot_iid, out,
    )  # fmt: skip
    return out


def contract_codes(bars: BarTable, calendar: RollCalendar) -> F64:
    """Per bar, the contract's expiry as ``yyyymm`` (or the instrument id when the expiry is
    unknown): trainers use it to keep labels from spanning a roll."""
    code_by_iid: dict[int, float] = {}
    for iid, exp in zip(calendar.instrument_id, calendar.expiry, strict=True):
        code_by_iid[int(iid)] = float(exp.year * 100 + exp.month) if exp is not None else float(iid)
    uniq, inv = np.unique(bars.instrument_id, return_inverse=True)
    codes = np.array([code_by_iid.get(int(u), float(u)) for u in uniq], dtype=np.float64)
    return codes[inv]


def _all_finite_rows(cols: Sequence[np.ndarray], n: int) -> npt.NDArray[np.bool_]:
    """Per row: is every column's value finite (True for no columns)."""
    ok = np.ones(n, dtype=np.bool_)
    fin = np.empty(n, dtype=np.bool_)
    for c in cols:
        np.isfinite(c, out=fin)
        ok &= fin
    return ok


PRICE_COLUMNS = ("open", "high", "low", "close", "vwap", "mid_open", "contract")


def assemble_fxcache_columns(
    bars: BarTable,
    features: FeatureTable,
    ofi: ofi_core.OfiFeatures,
    book: BookSource,
) -> tuple[npt.NDArray[np.int64], dict[str, tuple[list[str], ColumnBlock]], dict[str, int]]:
    """(ts_close, {group: (names, values)}, dropped-row counts) for ``write_fxcache``; each
    group's values a :class:`fxcache.ColumnBlock` (its columns and the kept rows, not stacked).

    Rows with any undefined value are dropped and counted: the first quarter's warm-up and the
    bars right after a roll, where the OFI state was reset (VPIN, Kyle λ, deltas). Nothing
    forward-looking is included: prices are the bar's own, the mid is as of the bar's open.
    """
    n = len(bars)
    if len(features) != n or len(ofi) != n:
        raise FxDataError(
            f"fxcache: bars ({n}), bar_features ({len(features)}) and ofi_features ({len(ofi)}) differ in length"
        )
    if not (np.array_equal(features.ts_close, bars.ts_close) and np.array_equal(ofi.ts_close, bars.ts_close)):
        raise FxDataError("fxcache: bars, bar_features and ofi_features are not aligned on ts_close")
    price_cols = [
        bars.open,
        bars.high,
        bars.low,
        bars.close,
        bars.vwap,
        book_mid_asof(book, bars.ts_open, instrument_id=bars.instrument_id),
        contract_codes(bars, book.calendar),
    ]
    f_names = list(features.columns)
    o_names = list(ofi.columns)
    f_cols = [np.asarray(features.columns[k]) for k in f_names]
    o_cols = [np.asarray(ofi.columns[k]) for k in o_names]
    ok_f = _all_finite_rows(f_cols, n)
    ok_o = _all_finite_rows(o_cols, n)
    ok_p = _all_finite_rows(price_cols, n)
    keep = ok_f & ok_o & ok_p
    n_drop = int((~keep).sum())
    dropped = {
        "bar_features_undefined": int((~ok_f).sum()),
        "ofi_undefined": int((~ok_o).sum()),
        "no_book_at_open": int((~ok_p).sum()),
        "total": n_drop,
    }
    # The kept rows are selected as the writer copies each column into the file: no stacked
    # [n, k] group and no boolean-indexed copy of one.
    rows = np.flatnonzero(keep) if n_drop else None
    groups: dict[str, tuple[list[str], ColumnBlock]] = {
        "feature": (f_names, ColumnBlock(f_cols, n, rows)),
        "price": (list(PRICE_COLUMNS), ColumnBlock(price_cols, n, rows)),
        "ofi": (o_names, ColumnBlock(o_cols, n, rows)),
    }
    return bars.ts_close[keep], groups, dropped
