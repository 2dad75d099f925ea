"""The snapshot row unit: one fxcache row per MBP-10 update of the active contract (no Dagster).

The counterpart of :mod:`bar_rows` (one row per bar); it shares active-contract selection
(:mod:`active_contract`), book gathering (:mod:`book`) and page release (:mod:`page_release`)
with it. The features are :mod:`snapshot_features`'s; this module decides which records are
rows, feeds them to that scan chunk by chunk, joins the bar context and writes the fxcache.

Rows (reference/snapshot.md §0): the MBP-10 records, in ``ts_recv`` order, of the session's
active contract after the roll calendar (halts, spreads and other contracts excluded), with
``F_LAST`` set (the records before it show a half-applied event) and a best bid and ask that
are both present and not crossed (the scan's precondition). ``ts_recv`` is the row timestamp.
Each excluded class is counted.

Columns:

- ``feature`` group: ``feature_names(cfg)`` of :mod:`snapshot_features` (the row's book, its
  event-time flow and clocks), the bar progress (``BAR_PROGRESS_NAMES``: how far the still-open
  bar has got since the last closed bar's close, from the trades sidecar the bars are built
  from, trades with ``ts_recv <=`` the row's only), then ``bar_<name>`` for each bar feature of the last bar closed
  strictly before the row (:func:`snapshot_features.last_closed_bar`: bar j is closed for row n
  when the first row with ``ts_recv >= ts_close_j`` precedes n; an equal ``ts_recv`` after
  that row counts, the row itself does not).
- ``price`` group (f64, exact): ``mid`` = (best bid + best ask) / 2 in index points (on the
  half-tick grid, what :mod:`snapshot_labels` reads), ``session`` (the CME session day, days
  since the epoch) and ``contract`` (expiry ``yyyymm``, or the instrument id when unknown): the
  ids from which ``snapshot_labels.running_breaks`` finds the session breaks and rolls that no
  label may span.

A row whose bar context is undefined (no bar of the quarter closed before it yet, or a bar
whose features are still in their warm-up, NaN) is dropped and counted, as the bar row unit
drops rows with undefined values; the feature scan still runs over it, so dropping changes no
other row. Everything in a row reads records ``<= `` the row only.

Two passes over the memory-mapped sidecar: :func:`plan_snapshot_rows` counts the rows and
finds each bar's closing row (no per-record array), so the fxcache writer knows its row count
up front; :func:`iter_snapshot_rows` then yields the kept rows ``chunk`` records at a time with
the scan's state carried across chunks. Memory is bounded by the chunk, not the quarter, and
the chunk size changes no value. The trades sidecar is walked once, in the second pass: one
forward merge gives each row's trade volume and, on the way, each bar close's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from fx_assets.core.active_contract import _active_at, _active_table, _kept_trade, contract_codes_of
from fx_assets.core.bar_features import FeatureTable
from fx_assets.core.bars import BarTable
from fx_assets.core.book import _BOOK_FIELDS, BookSource, _BookBuffers, _gather_book_nb, _valid_touch
from fx_assets.core.calendar import interval_of
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import DType, FxCacheWriter
from fx_assets.core.page_release import PageReleaser, release_free_heap
from fx_assets.core.sidecar import sidecar_columns
from fx_assets.core.snapshot_features import (
    BAR_PROGRESS_NAMES,
    SnapshotBook,
    SnapshotFeatureConfig,
    SnapshotState,
    feature_names,
    new_state,
    snapshot_features,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

F_LAST = 128  # DBN flag: the last record of the venue's event for the instrument
SNAPSHOT_PRICE_COLUMNS = ("mid", "session", "contract")
DEFAULT_SNAPSHOT_CHUNK = 1 << 18  # MBP-10 records per chunk (~0.3 GB of chunk buffers)
_PLAN_BLOCK = 1 << 22  # records per block of the planning pass (its pages are released after it)
_SIDE_SIGN = np.zeros(256, np.int8)  # side byte -> aggressor sign (dbn.aggressor_sign)
_SIDE_SIGN[ord("B")], _SIDE_SIGN[ord("A")] = 1, -1
# excluded-record counters of the planning pass
_C_INACTIVE, _C_NOT_LAST, _C_NO_TOUCH = 0, 1, 2


@njit(cache=True, inline="always")
def _row_of(
    t: int, iid: int, flags: int, b: int, a: int, bounds: I64, act: I64, k: int
) -> tuple[int, int, int]:
    """(0 = a row, else 1 + the excluded class; session slot or -1; interval index for the next
    call): the one predicate both passes apply."""
    k = interval_of(bounds, t, k)
    if not (k & 1):
        return 1 + _C_INACTIVE, -1, k
    s = (k - 1) >> 1
    if act[s] < 0 or iid != act[s]:
        return 1 + _C_INACTIVE, -1, k
    if not (flags & F_LAST):
        return 1 + _C_NOT_LAST, -1, k
    if not _valid_touch(b, a):
        return 1 + _C_NO_TOUCH, -1, k
    return 0, s, k


# planning-pass state carried from block to block
_P_ROWS, _P_BAR, _P_K, _P_LAST_TS, _P_BAD = 0, 1, 2, 3, 4


@njit(cache=True, nogil=True)
def _plan_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    flags: npt.NDArray[np.uint8],
    bid: I64,
    ask: I64,
    bounds: I64,
    act: I64,
    ts_close: I64,
    lo: int,
    hi: int,
    close_rows: I64,
    counts: I64,
    st: I64,
) -> None:
    """Records ``[lo, hi)``: count the rows (``st[_P_ROWS]``), set each bar's closing row
    ``close_rows[j]`` = the number of rows with ``ts_recv < ts_close[j]`` (the first row at or
    after its close) once a row reaches it, count the excluded records per class, and note the
    first record out of ``ts_recv`` order (``st[_P_BAD]``, -1: none). State in ``st``."""
    nb = ts_close.shape[0]
    n = st[_P_ROWS]
    jb = st[_P_BAR]
    k = st[_P_K]
    last = st[_P_LAST_TS]
    for i in range(lo, hi):
        t = ts[i]
        if t < last and st[_P_BAD] < 0:
            st[_P_BAD] = i
        last = t
        why, _, k = _row_of(t, int(iid[i]), int(flags[i]), bid[i], ask[i], bounds, act, k)
        if why:
            counts[why - 1] += 1
            continue
        while jb < nb and ts_close[jb] <= t:
            close_rows[jb] = n
            jb += 1
        n += 1
    st[_P_ROWS] = n
    st[_P_BAR] = jb
    st[_P_K] = k
    st[_P_LAST_TS] = last


@njit(cache=True, nogil=True)
def _select_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    flags: npt.NDArray[np.uint8],
    bid: I64,
    ask: I64,
    bounds: I64,
    act: I64,
    lo: int,
    hi: int,
    idx: I64,
    slot: I64,
) -> int:
    """Record numbers of the rows in ``[lo, hi)`` into ``idx`` and their session slots into
    ``slot``; their count."""
    m = 0
    k = 0
    for i in range(lo, hi):
        why, s, k = _row_of(ts[i], int(iid[i]), int(flags[i]), bid[i], ask[i], bounds, act, k)
        if why == 0:
            idx[m] = i
            slot[m] = s
            m += 1
    return m


@njit(cache=True, nogil=True)
def _trade_volume_nb(
    tts: I64,
    tiid: npt.NDArray[np.uint32],
    tpx: I64,
    tsz: npt.NDArray[np.uint32],
    bounds: I64,
    act: I64,
    at: I64,
    out: F64,
    tc: I64,
    close_vol: F64,
    st: I64,
    cum: F64,
) -> None:
    """For each time ``at[r]`` (non-decreasing), the volume of the active contract's trades
    with ``ts_recv <= at[r]`` (the trades the bars are built from: ``active_trades``'s filter)
    into ``out[r]``, and on the way, for each bar close ``tc[j] <= at[r]`` not yet passed, the
    volume of the trades with ``ts_recv <= tc[j]`` into ``close_vol[j]``: one forward merge
    over the trades gives both (two merges, one over the bar closes in the plan and one over
    the rows, walked the quarter's trades twice). A bar that is closed for a row closes at or
    before the row's ``ts_recv``, so its ``close_vol`` is set before the row needs it. ``st`` =
    [next trade, interval index, next bar] and ``cum[0]`` = the running volume, carried from
    call to call; the sums run over the same trades in the same order either way (same bits).
    A trade out of ``ts_recv`` order (before the previous one, or after the last record, which
    the session table was built to cover) stops the merge with its index in ``st[3]`` (-1:
    none; the outputs are then incomplete)."""
    i = st[0]
    k = st[1]
    jb = st[2]
    n = tts.shape[0]
    nb = tc.shape[0]
    c = cum[0]
    prev = tts[i - 1] if i > 0 else tts[0] if n else 0
    t_end = tts[n - 1] if n else 0
    for r in range(at.shape[0]):
        t = at[r]
        while True:
            # the next stop: a bar close not after t, else t itself
            closing = jb < nb and tc[jb] <= t
            u = tc[jb] if closing else t
            while i < n and tts[i] <= u:
                x = tts[i]
                if x < prev or x > t_end:
                    st[0] = i
                    st[1] = k
                    st[2] = jb
                    st[3] = i
                    cum[0] = c
                    return
                prev = x
                ok, k = _active_at(bounds, act, x, int(tiid[i]), k)
                p = tpx[i]
                if _kept_trade(ok, p, tsz[i]):
                    c += tsz[i]
                i += 1
            if not closing:
                break
            close_vol[jb] = c
            jb += 1
        out[r] = c
    st[0] = i
    st[1] = k
    st[2] = jb
    cum[0] = c


@njit(cache=True, nogil=True, error_model="numpy")
def _join_bar_nb(
    jj: I64,
    vol: F64,
    ts: I64,
    close_vol: F64,
    bar_volume: F64,
    bar_ts_close: I64,
    bar_duration_ns: I64,
    bar_values: F64,
    block: F64,
    c0: int,
) -> None:
    """Each row's bar progress (``snapshot_features.bar_progress``: the same operations on the
    same values, so the same bits) into ``block[:, c0 : c0 + 3]`` and its last closed bar's
    values (``bar_values[jj[r]]``) after them, row by row: one pass writing each row's columns
    while its line is in cache, where the NumPy form made a dozen temporaries of the chunk and
    a strided ``np.take`` (together more time than the feature scan on the scale-1 quarter)."""
    nv = bar_values.shape[1]
    j_prev = -1
    ld = 0.0
    for r in range(jj.shape[0]):
        j = jj[r]
        x = vol[r] - close_vol[j]
        v = x if (x >= 0.0 or x != x) else 0.0  # np.maximum(x, 0.0)
        bv = bar_volume[j]
        el = float(ts[r] - bar_ts_close[j])
        el_us = (el if (el >= 0.0 or el != el) else 0.0) / 1e3
        if j != j_prev:
            # the bar's log duration: once per run of rows sharing the bar (~3.4 rows a bar on
            # the scale-1 quarter), the same call on the same value as per row
            du = float(bar_duration_ns[j])
            du_us = (du if (du >= 0.0 or du != du) else 0.0) / 1e3
            ld = math.log1p(du_us)
            j_prev = j
        block[r, c0] = v / bv if bv > 0 else 0.0
        lt = math.log1p(el_us)  # libm's log1p, as detmath.log1p calls it
        block[r, c0 + 2] = lt
        block[r, c0 + 1] = lt - ld
        for k in range(nv):
            block[r, c0 + 3 + k] = bar_values[j, k]


@njit(cache=True, nogil=True)
def _chunk_rows_nb(
    idx: I64,
    slot: I64,
    action: npt.NDArray[np.uint8],
    side: npt.NDArray[np.uint8],
    size: npt.NDArray[np.uint32],
    bid0: F64,
    ask0: F64,
    slot_day: F64,
    slot_code: F64,
    last_slot: int,
    n_breaks: int,
    o_action: npt.NDArray[np.uint8],
    o_side: npt.NDArray[np.int8],
    o_size: F64,
    o_breaks: I64,
    prices: F64,
) -> None:
    """The chunk's per-row columns in one pass (what a dozen NumPy gathers and temporaries
    did): the records' action, aggressor sign (``_SIDE_SIGN``: 'B' +1, 'A' -1, else 0) and
    size (float64), the running break count (+1 where the session slot changes, from
    ``last_slot`` / ``n_breaks`` of the previous chunk) and the price columns (mid = (best
    bid + best ask) / 2, the slot's day and contract code)."""
    brk = n_breaks
    prev = last_slot
    for r in range(idx.shape[0]):
        i = idx[r]
        o_action[r] = action[i]
        o_side[r] = _SIDE_SIGN[side[i]]
        o_size[r] = size[i]
        s = slot[r]
        if s != prev:
            brk += 1
            prev = s
        o_breaks[r] = brk
        prices[r, 0] = (bid0[r] + ask0[r]) / 2.0
        prices[r, 1] = slot_day[s]
        prices[r, 2] = slot_code[s]


@njit(cache=True, nogil=True)
def _context_nb(
    close_rows: I64, bar_ok: npt.NDArray[np.bool_], row0: int, keep: npt.NDArray[np.bool_], jj: I64
) -> int:
    """Rows ``row0 .. row0 + m - 1`` (``m = jj.shape[0]``): the last bar closed strictly before
    each (:func:`snapshot_features.last_closed_bar`: the number of bars whose closing row is
    below the row, less one), clipped to 0 where none, into ``jj``; whether the row is kept (a
    closed bar whose context is defined, ``bar_ok``) into ``keep``; the kept count. A forward
    merge over the non-decreasing ``close_rows`` from a binary search for ``row0`` (the
    per-chunk ``np.diff`` check, ``searchsorted`` and masks walked all 680 k bars per chunk)."""
    nb = close_rows.shape[0]
    p = np.searchsorted(close_rows, row0)  # bars with close_rows < row0
    cnt = 0
    for r in range(jj.shape[0]):
        row = row0 + r
        while p < nb and close_rows[p] < row:
            p += 1
        if p == 0:
            jj[r] = 0
            keep[r] = False
        else:
            jj[r] = p - 1
            ok = bar_ok[p - 1]
            keep[r] = ok
            cnt += ok
    return cnt


class _TradeVolume:
    """Active-contract trade volume up to given times and up to each bar close, from the
    memory-mapped trades sidecar (one forward merge; pages released behind it)."""

    def __init__(self, trades: Path | str, book: BookSource, ts_close: I64) -> None:
        self.path = Path(trades)
        self.cols = sidecar_columns(trades, ["ts_recv", "instrument_id", "price", "size"])
        tts = self.cols["ts_recv"]
        # The session table from the first and last records (the merge checks the order of
        # every trade it reads, so these bound them): no pass over the column for its min
        # and max (0.06 s on the scale-1 quarter's 27.6 M trades).
        span = (int(tts[0]), int(tts[-1])) if tts.size else None
        self.bounds, self.act, _ = _active_table(book.calendar, tts, span)
        self.tc = ts_close
        # per bar: the volume to its close, set once the merge passes it (read only for bars
        # closed before a row, which it has passed by then)
        self.close_vol = np.zeros(ts_close.shape[0])
        self.st = np.array([0, 0, 0, -1], np.int64)
        self.cum = np.zeros(1)
        self.releaser = PageReleaser(list(self.cols.values()))

    def upto(self, at: I64, out: F64 | None = None) -> F64:
        """Volume of the trades with ``ts_recv <= at[r]``; ``at`` non-decreasing across calls.
        Sets ``close_vol`` of the bars closing at or before ``at[-1]``."""
        o = np.empty(at.shape[0]) if out is None else out
        c = self.cols
        _trade_volume_nb(
            c["ts_recv"], c["instrument_id"], c["price"], c["size"], self.bounds, self.act,
            np.ascontiguousarray(at, dtype=np.int64), o, self.tc, self.close_vol, self.st, self.cum,
        )  # fmt: skip
        if self.st[3] >= 0:
            raise FxDataError(f"{self.path}: trades are not in ts_recv order at record {int(self.st[3])}")
        self.releaser.release_before(int(self.st[0]))
        return o


def _book_names(levels: int) -> list[str]:
    return ["ts_recv", "instrument_id", "flags", "action", "side", "size"] + [
        f"{f}_{i:02d}" for f in _BOOK_FIELDS for i in range(levels)
    ]


@dataclass(frozen=True)
class SnapshotPlan:
    """What the first pass found: the rows, the bar context and what is dropped."""

    n_selected: int  # rows the scan runs over
    close_rows: I64  # per bar: its closing row (see the module docstring)
    bar_names: list[str]  # bar feature columns, as stored (``bar_<name>``)
    bar_values: F64  # [n_bars, len(bar_names)]
    bar_ok: npt.NDArray[np.bool_]  # per bar: every context value finite
    n_rows: int  # rows kept (written)
    counts: dict[str, int] = field(default_factory=dict)  # excluded records and dropped rows
    trades: Path | None = None  # the trades sidecar the bars are built from (bar progress)
    bar_volume: F64 = field(default_factory=lambda: np.empty(0))  # per bar: its volume
    bar_ts_close: I64 = field(default_factory=lambda: np.empty(0, np.int64))
    bar_duration_ns: I64 = field(default_factory=lambda: np.empty(0, np.int64))

    def context(
        self, row0: int, m: int, out: tuple[npt.NDArray[np.bool_], I64] | None = None
    ) -> tuple[npt.NDArray[np.bool_], I64, int]:
        """(kept mask, last closed bar, clipped to 0 where none, kept count) of rows
        ``row0 .. row0 + m - 1`` (:func:`snapshot_features.last_closed_bar`); into ``out``
        (two arrays of at least ``m``) when given."""
        if out is None:
            keep, jj = np.empty(m, np.bool_), np.empty(m, np.int64)
        else:
            keep, jj = out[0][:m], out[1][:m]
        n_keep = _context_nb(self.close_rows, self.bar_ok, row0, keep, jj)
        return keep, jj, int(n_keep)


_BAR_BLOCK_ROWS = 8192  # rows per block when the bar feature columns are laid out row-major


def _bar_block(bars: BarTable, features: FeatureTable) -> tuple[list[str], F64]:
    if len(features) != len(bars) or not np.array_equal(features.ts_close, bars.ts_close):
        raise FxDataError(
            f"snapshot rows: bars ({len(bars)}) and bar_features ({len(features)}) are not aligned on ts_close"
        )
    names = list(features.columns)
    n = len(bars)
    values = np.empty((n, len(names)))
    # Row blocks that stay in cache: filling whole columns of a row-major block one after the
    # other touched every row's cache line once per column (680 k bars x 43 features: 0.5-1 s
    # against 0.11 s), and stacking then transposing would hold a second copy.
    for lo in range(0, n, _BAR_BLOCK_ROWS):
        hi = min(n, lo + _BAR_BLOCK_ROWS)
        for c, k in enumerate(names):
            values[lo:hi, c] = features.columns[k][lo:hi]
    return [f"bar_{k}" for k in names], values


def plan_snapshot_rows(
    book: BookSource,
    bars: BarTable,
    bar_features: FeatureTable,
    *,
    trades: Path | str,
    partition: str = "?",
) -> SnapshotPlan:
    """First pass: count the rows of ``book`` and place each bar's close among them.
    ``trades`` (the trades sidecar the bars were built from) is recorded for the bar progress,
    which the second pass merges in (the trade volume to each bar's close on the same walk as
    the rows')."""
    cols = sidecar_columns(book.path, ["ts_recv", "instrument_id", "flags", "bid_px_00", "ask_px_00"])
    ts = cols["ts_recv"]
    tc = np.ascontiguousarray(bars.ts_close, dtype=np.int64)
    if tc.size > 1 and bool(np.any(tc[1:] < tc[:-1])):
        raise FxDataError(f"snapshot rows {partition}: bars are not in ts_close order")
    bar_names, bar_values = _bar_block(bars, bar_features)
    bounds, act, _ = _active_table(book.calendar, ts)
    close_rows = np.zeros(tc.shape[0], np.int64)
    excluded = np.zeros(3, np.int64)
    st = np.array([0, 0, 0, np.iinfo(np.int64).min, -1], dtype=np.int64)
    releaser = PageReleaser(list(cols.values()))  # the scan's resident set stays one block
    for lo in range(0, ts.shape[0], _PLAN_BLOCK):
        hi = min(ts.shape[0], lo + _PLAN_BLOCK)
        _plan_nb(
            ts, cols["instrument_id"], cols["flags"], cols["bid_px_00"], cols["ask_px_00"], bounds, act, tc,
            lo, hi, close_rows, excluded, st,
        )  # fmt: skip
        releaser.release_before(hi)
    if st[_P_BAD] >= 0:
        raise FxDataError(
            f"snapshot rows {partition}: {book.path} is not in ts_recv order at record {int(st[_P_BAD])}"
        )
    n = int(st[_P_ROWS])
    close_rows[int(st[_P_BAR]) :] = n  # bars closing after the last row
    bar_ok: npt.NDArray[np.bool_] = np.asarray(np.isfinite(bar_values).all(axis=1), dtype=np.bool_)
    # rows whose last closed bar is j: (close_rows[j], close_rows[j + 1]] (the last bar: to the end)
    ends = np.append(close_rows[1:], n - 1) if tc.size else np.empty(0, np.int64)
    spans = np.clip(np.minimum(ends, n - 1) - close_rows, 0, None)
    kept = int(spans[bar_ok].sum())
    before_first = int(min(close_rows[0] + 1, n)) if tc.size else n
    counts = {
        "records": int(ts.shape[0]),
        "inactive_or_other_contract": int(excluded[_C_INACTIVE]),
        "not_last_in_event": int(excluded[_C_NOT_LAST]),
        "no_or_crossed_touch": int(excluded[_C_NO_TOUCH]),
        "rows_scanned": int(n),
        "dropped_no_closed_bar": before_first,
        "dropped_bar_features_undefined": int(n - kept - before_first),
        "rows": kept,
    }
    return SnapshotPlan(
        n, close_rows, bar_names, bar_values, bar_ok, kept, counts, trades=Path(trades),
        bar_volume=np.ascontiguousarray(bars.volume, dtype=np.float64),
        bar_ts_close=tc, bar_duration_ns=np.ascontiguousarray(bars.duration_ns, dtype=np.int64),
    )  # fmt: skip


@dataclass(frozen=True)
class SnapshotChunk:
    """Kept rows of one chunk: ``ts`` [m], ``features`` [m, F] (snapshot then bar context),
    ``prices`` [m, 3] (``SNAPSHOT_PRICE_COLUMNS``, f64), and their scan row numbers."""

    ts: I64
    features: F64
    prices: F64
    rows: I64


def iter_snapshot_rows(
    book: BookSource,
    plan: SnapshotPlan,
    cfg: SnapshotFeatureConfig,
    *,
    chunk: int = DEFAULT_SNAPSHOT_CHUNK,
    state: SnapshotState | None = None,
) -> Iterator[SnapshotChunk]:
    """Second pass: the kept rows, ``chunk`` sidecar records at a time (state carried). The
    arrays of a yielded chunk are reused for the next one: consume (or copy) each before
    asking for the next."""
    levels = cfg.levels
    c = sidecar_columns(book.path, _book_names(levels))
    ts = c["ts_recv"]
    bounds, act, days = _active_table(book.calendar, ts)
    # per session slot: its day and its active contract's code (rows only occur in active slots)
    slot_day = days.astype(np.float64)
    slot_code = contract_codes_of(book.calendar)(np.where(act >= 0, act, 0).astype(np.uint32))
    tick_units = round(cfg.tick_size * 1e9)
    st = new_state(cfg) if state is None else state
    buffers = _BookBuffers()
    releaser = PageReleaser(list(c.values()))
    bpx, apx, bsz, asz, bct, act_ = (tuple(c[f"{f}_{i:02d}"] for i in range(levels)) for f in _BOOK_FIELDS)
    chunk = max(1, int(chunk))
    idx_buf = np.empty(min(chunk, max(ts.shape[0], 1)), np.int64)
    slot_buf = np.empty_like(idx_buf)
    if plan.trades is None:
        raise FxDataError(f"{book.path}: the snapshot plan has no trades sidecar (bar progress)")
    tvol = _TradeVolume(plan.trades, book, plan.bar_ts_close)
    vol_buf = np.empty(idx_buf.shape[0])
    ctx_bufs = (np.empty(idx_buf.shape[0], np.bool_), np.empty(idx_buf.shape[0], np.int64))
    row0 = 0
    last_slot, n_breaks = np.int64(-1), np.int64(0)
    # Output blocks reused from chunk to chunk (a fresh block per chunk would fault in every
    # page again): a yielded chunk is valid until the next one is requested.
    chunk_cap = int(idx_buf.shape[0])
    nf = len(feature_names(cfg))
    npg = len(BAR_PROGRESS_NAMES)
    width = nf + npg + plan.bar_values.shape[1]
    out_block = np.empty((0, 0))
    out_prices = np.empty((0, len(SNAPSHOT_PRICE_COLUMNS)))
    row_bufs: tuple[np.ndarray, ...] = ()
    for lo in range(0, ts.shape[0], chunk):
        hi = min(ts.shape[0], lo + chunk)
        m = _select_nb(
            ts, c["instrument_id"], c["flags"], c["bid_px_00"], c["ask_px_00"], bounds, act, lo, hi,
            idx_buf, slot_buf,
        )  # fmt: skip
        if m == 0:
            releaser.release_before(hi)
            continue
        idx, slot = idx_buf[:m], slot_buf[:m]
        o_ts, mats = buffers.take(m, levels)
        rank, pos = _gather_book_nb(
            idx, ts, bpx, apx, bsz, asz, bct, act_, tick_units, 0, o_ts, mats[0], mats[1], mats[2], mats[3],
            mats[4], mats[5],
        )  # fmt: skip
        if rank >= 0:
            side_, lvl = divmod(int(rank), levels)
            name = f"{('bid_px', 'ask_px')[side_]}_{lvl:02d}"
            r = int(idx[pos])
            raise FxDataError(
                f"{book.path}: {name} = {int(c[name][r]) * 1e-9!r} at record {r} (ts_recv {int(ts[r])}) "
                f"is off the {cfg.tick_size:g} tick grid (SnapshotFeatureConfig.tick_size)"
            )
        # A row is its session's active contract, so its session slot fixes its day, contract
        # and contract code; the break count (+1 at every change of session or contract, the
        # first row too) moves exactly where the slot does.
        if out_block.shape[0] < m or out_block.shape[1] != width:
            out_block = np.empty((max(m, chunk_cap), width))
            out_prices = np.empty((out_block.shape[0], len(SNAPSHOT_PRICE_COLUMNS)))
            row_bufs = (
                np.empty(out_block.shape[0], np.uint8), np.empty(out_block.shape[0], np.int8),
                np.empty(out_block.shape[0]), np.empty(out_block.shape[0], np.int64),
            )  # fmt: skip
        block, prices = out_block[:m], out_prices[:m]
        action, side, size, breaks = (b[:m] for b in row_bufs)
        _chunk_rows_nb(
            idx, slot, c["action"], c["side"], c["size"], mats[0][:, 0], mats[1][:, 0], slot_day, slot_code,
            int(last_slot), int(n_breaks), action, side, size, breaks, prices,
        )  # fmt: skip
        last_slot, n_breaks = slot[m - 1], breaks[m - 1]
        snap = SnapshotBook(
            ts=o_ts, breaks=breaks, action=action, side=side, size=size, bid_px=mats[0], ask_px=mats[1],
            bid_sz=mats[2], ask_sz=mats[3], bid_ct=mats[4], ask_ct=mats[5],
        )  # fmt: skip
        # one row-major block per chunk: the scan's columns (written there by the scan), the
        # bar progress, then the bar context (the bar features of each row's last closed bar,
        # gathered straight into place)
        _, st = snapshot_features(snap, cfg, st, out=block[:, :nf])
        keep, jj, n_keep = plan.context(row0, m, ctx_bufs)
        if n_keep:
            vol = tvol.upto(o_ts, vol_buf[:m])  # trades with ts_recv <= the row's
            _join_bar_nb(
                jj, vol, o_ts, tvol.close_vol, plan.bar_volume, plan.bar_ts_close, plan.bar_duration_ns,
                plan.bar_values, block, nf,
            )  # fmt: skip
            rows = np.arange(row0, row0 + m, dtype=np.int64)
            if n_keep == m:  # the usual chunk: nothing dropped, no copies
                yield SnapshotChunk(ts=o_ts, features=block, prices=prices, rows=rows)
            else:
                yield SnapshotChunk(ts=o_ts[keep], features=block[keep], prices=prices[keep], rows=rows[keep])
        row0 += m
        releaser.release_before(hi)
    if row0 != plan.n_selected:
        raise FxDataError(f"{book.path}: {row0} snapshot rows, the plan counted {plan.n_selected}")


def snapshot_feature_columns(cfg: SnapshotFeatureConfig, plan: SnapshotPlan) -> list[str]:
    """The ``feature`` group's columns: the snapshot features, the bar progress, then the bar
    context."""
    return [*feature_names(cfg), *BAR_PROGRESS_NAMES, *plan.bar_names]


def write_snapshot_fxcache(
    path: Path | str,
    book: BookSource,
    bars: BarTable,
    bar_features: FeatureTable,
    cfg: SnapshotFeatureConfig,
    dtype: DType,
    cache_key: bytes,
    meta: Mapping[str, Any] | None = None,
    *,
    trades: Path | str,
    chunk: int = DEFAULT_SNAPSHOT_CHUNK,
    partition: str = "?",
) -> dict[str, int]:
    """The snapshot row unit's fxcache stage: plan, scan and write the quarter's rows
    incrementally (:class:`fxcache.FxCacheWriter`) and atomically; returns the row counts
    (also in the file's meta under ``rows``).

    It starts by handing back the free heap that earlier stages of the process left
    (:func:`~fx_assets.core.page_release.release_free_heap`): its own working set is set by its
    chunk, and a book-heavy quarter's OFI stage leaves a few hundred MiB of freed but resident heap
    that this stage, which runs for tens of seconds, would otherwise peak on top of (the
    benchmarks' README, ``bench_snapshot_quarter``). Re-faulting pages costs ~0.06 s per 200 MiB,
    nothing beside the stage's time."""
    release_free_heap()
    plan = plan_snapshot_rows(book, bars, bar_features, trades=trades, partition=partition)
    if plan.n_rows == 0:
        raise FxDataError(f"snapshot rows {partition}: {book.path} gives no rows (counts {plan.counts})")
    names = {
        "feature": snapshot_feature_columns(cfg, plan),
        "price": list(SNAPSHOT_PRICE_COLUMNS),
    }
    head = {**dict(meta or {}), "row_unit": "snapshot"}
    with FxCacheWriter(path, names, dtype, cache_key, plan.n_rows, head, chunk_rows=1 << 16) as w:
        for ch in iter_snapshot_rows(book, plan, cfg, chunk=chunk):
            w.append(ch.ts, {"feature": ch.features, "price": ch.prices})
        w.finish({"rows": plan.counts})
    return plan.counts
