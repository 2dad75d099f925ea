"""The bar row unit: one fxcache row per bar; one entry point per stage (no Dagster).

Owns how the per-quarter bar stages are fed; the kernels live in :mod:`bars`,
:mod:`bar_features` and :mod:`ofi`, the parts shared with the snapshot row unit in
:mod:`active_contract`, :mod:`book`, :mod:`ofi_warmup`, :mod:`page_release` and :mod:`mid_asof`.

- ``quarter_bars``: bars of the active trades. Bar state resets at every session start, so a
  quarter's bars never depend on another quarter.
- ``sidecar_bars``: the bars stage's path: the same bars in one pass over the trades sidecar
  (active-contract selection fused with the bar kernel), sharded at session opens over threads.
- ``quarter_bar_features``: bar features, warmed up from the tail of the previous quarters'
  bars so that no bar of an interior quarter is dropped.
- ``quarter_ofi``: OFI / book features. The bars (previous quarter's warm-up tail plus the
  quarter) are processed in chunks of about ``book_chunk / workers`` book events, ``workers``
  chunks at a time (one thread each); each chunk replays enough earlier bars to rebuild every
  rolling state (at least ``ofi_warmup_bars``, and back to a bar whose window holds a valid
  snapshot, which carries the book state), which gives the sequential numbers, so peak memory
  is set by the chunks in flight (about ``book_chunk`` events together), not the quarter.
- ``assemble_fxcache_columns``: the fxcache column groups of a quarter's bars (rows with an
  undefined value dropped and counted).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import numpy.typing as npt
from numba import njit

from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import (
    ActiveTrades,
    TradeFlow,
    TradeSidecar,
    _active_table,
    _flow_outputs_nb,
    active_trades,
    contract_codes_of,
)
from fx_assets.core.bar_features import BarFeatureConfig, FeatureTable, compute_bar_features, max_window
from fx_assets.core.bars import (
    BarConfig,
    BarTable,
    _finish,
    _session_cut_nb,
    _sidecar_threshold_bars_nb,
    build_bars,
)
from fx_assets.core.book import DEFAULT_BOOK_CHUNK, BookSource, _book_columns, _book_rows, _BookBuffers
from fx_assets.core.calendar import _year_range
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import ColumnBlock
from fx_assets.core.mid_asof import book_mid_asof
from fx_assets.core.ofi_warmup import _replay_start_scanned, _warmup_first_bar
from fx_assets.core.page_release import PageReleaser
from fx_assets.core.roll import RollCalendar
from fx_assets.core.sidecar import sidecar_columns

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
# A trade costs the OFI pass about 1/8 of a book event's memory (~50 B: its slice and the
# kernel's cumulative sums, against ~500 B for ten levels of six float64 matrices), so a chunk
# holds about ``book_chunk`` book events + trades / TRADE_WEIGHT: a quarter with a thin book
# is still cut into bounded chunks.
TRADE_WEIGHT = 8


def quarter_bars(trades: ActiveTrades, config: BarConfig) -> BarTable:
    return build_bars(
        trades.ts, trades.price, trades.size, trades.sign, trades.session, trades.instrument_id, config
    )


@dataclass(frozen=True)
class SidecarBars:
    """The bars of a trades sidecar's active-contract trades, and what they were built from:
    ``n_trades`` / ``volume`` of those trades (the volume check's side), ``n_source`` records
    in the file."""

    bars: BarTable
    n_trades: int
    volume: float
    n_source: int


# Below this many records per thread one pass is faster than starting threads.
_MIN_RECORDS_PER_THREAD = 1 << 20
# First output capacity of a shard: about one bar per 50 records on ES, so records / 32 + 1024
# rows rarely grow (the kernel doubles them when they do).
_CAP_RECORDS_PER_BAR = 32
_CAP_MIN_BARS = 1024


def sidecar_bars(trades_sidecar: Path, calendar: RollCalendar, config: BarConfig) -> SidecarBars:
    """``quarter_bars(active_trades(trades_sidecar, calendar), config)`` in one pass over the
    memory-mapped sidecar, without the active trades in between (the same bars, bit for bit,
    and the same errors).

    Volume and dollar bars: the records are cut at session opens into one contiguous shard per
    thread (numba's thread count), each shard's bars built by a nogil kernel on its own thread
    and concatenated. Bar state restarts at every session start (and at a roll, which is a
    session start), so the bars do not depend on the cut; the shards are checked to meet in
    time order at a change of session or contract, else the records are built in one shard.
    Imbalance bars (whose expectations carry across sessions) go through ``active_trades``.
    """
    if config.kind not in ("volume", "dollar"):
        trades = active_trades(trades_sidecar, calendar)
        bars = quarter_bars(trades, config)
        return SidecarBars(bars, len(trades), float(trades.size.sum()), trades.n_source)
    cols = sidecar_columns(trades_sidecar, ["ts_recv", "instrument_id", "price", "size", "side", "action"])
    ts = cols["ts_recv"]
    n = int(ts.shape[0])
    # The session table of the first and last records' years; the pass checks that every
    # record's time fell in those years (else: again with the table of their full range).
    span = np.array([ts[0], ts[-1]] if n else [0, 0], np.int64)
    while True:
        bounds, act, days = _active_table(calendar, span)
        parts = max(1, min(int(numba.get_num_threads()), n // _MIN_RECORDS_PER_THREAD))
        cuts = [0]
        for p in range(1, parts):
            cuts.append(max(cuts[-1], int(_session_cut_nb(ts, bounds, n * p // parts))))
        cuts.append(n)
        shards = _bar_shards(cols, bounds, act, days, cuts, config)
        if len(shards) > 1 and not _shards_meet(shards):
            shards = _bar_shards(cols, bounds, act, days, [0, n], config)
        if any(err[0] for _, _, err in shards):
            # a record that is not a trade, or trades out of time order: active_trades raises
            # the error it would have raised
            trades = active_trades(trades_sidecar, calendar)
            return SidecarBars(quarter_bars(trades, config), len(trades), float(trades.size.sum()), n)
        seen = np.array([min(int(i[7]) for _, i, _ in shards), max(int(i[8]) for _, i, _ in shards)])
        if not n or _year_range(seen) == _year_range(span):
            break
        span = seen
    nbs = [int(sh[0][5]) for sh in shards]
    if len(shards) == 1:
        of, oi, o_inst, o_sess, o_forced = shards[0][0][:5]
        nb = nbs[0]
        if of.shape[1] > 2 * nb + 1024:  # do not pin the slack of the grown outputs
            of, oi = of[:, :nb].copy(), oi[:, :nb].copy()
            o_inst, o_sess, o_forced = o_inst[:nb].copy(), o_sess[:nb].copy(), o_forced[:nb].copy()
    else:
        outs = [(sh[0], nb) for sh, nb in zip(shards, nbs, strict=True)]
        of = np.concatenate([o[0][:, :nb] for o, nb in outs], axis=1)
        oi = np.concatenate([o[1][:, :nb] for o, nb in outs], axis=1)
        o_inst, o_sess, o_forced = (np.concatenate([o[j][:nb] for o, nb in outs]) for j in (2, 3, 4))
        nb = sum(nbs)
    volume = 0.0
    for sh in shards:
        volume += float(sh[0][6])  # integer sums: exact in any order
    kept = sum(int(sh[1][0]) for sh in shards)
    return SidecarBars(_finish(of, oi, nb, o_inst, o_sess, o_forced), kept, volume, n)


def _bar_shards(
    cols: dict[str, np.ndarray],
    bounds: I64,
    act: I64,
    days: npt.NDArray[np.int32],
    cuts: list[int],
    config: BarConfig,
) -> list[tuple[tuple, I64, I64]]:
    """``_sidecar_threshold_bars_nb`` on records ``cuts[p]:cuts[p + 1]``, one thread each:
    (outputs, info, err) per shard."""
    dollar = config.kind == "dollar"
    threshold = float(config.dollar_bar_size if dollar else config.volume_bar_size)
    mult = float(config.multiplier)
    ts, iid, price, size, side, action = (
        cols[k] for k in ("ts_recv", "instrument_id", "price", "size", "side", "action")
    )

    def run(p: int) -> tuple[tuple, I64, I64]:
        lo, hi = cuts[p], cuts[p + 1]
        info, err = np.zeros(9, np.int64), np.zeros(2, np.int64)
        cap = (hi - lo) // _CAP_RECORDS_PER_BAR + _CAP_MIN_BARS
        out = _sidecar_threshold_bars_nb(
            ts,
            iid,
            price,
            size,
            side,
            action,
            bounds,
            act,
            days,
            lo,
            hi,
            dollar,
            threshold,
            mult,
            cap,
            err,
            info,
        )
        return out, info, err

    if len(cuts) == 2:
        return [run(0)]
    with ThreadPoolExecutor(len(cuts) - 1) as pool:
        return list(pool.map(run, range(len(cuts) - 1)))


def _shards_meet(shards: list[tuple[tuple, I64, I64]]) -> bool:
    """Consecutive shards with trades meet in time order at a change of session or contract
    (where one pass would have closed the bar too)."""
    full = [info for _, info, _ in shards if info[0]]
    return all(
        a[2] <= b[1] and (int(a[5]), int(a[6])) != (int(b[3]), int(b[4])) for a, b in itertools.pairwise(full)
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


# float64 values per 4 KiB page: one write each faults a column's pages in.
_F64_PER_PAGE = 512


def _populated_columns(k: int, n: int) -> list[F64]:
    """``k`` float64 columns of ``n`` rows, each page already faulted in (one write per page;
    values undefined), so that the chunk threads do not take ~46 k page faults (the scale-1
    quarter's OFI columns, 0.07-0.2 s of their system time) as they first copy their rows in;
    ``quarter_ofi`` has this done on a second thread while it plans the chunks. Allocated as
    before (numba's allocator, i.e. malloc): memory the process frees at the end of the stage
    stays where the next stage can reuse it (an anonymous mapping of its own goes back to the OS
    on free; with one, the fxcache stage read +0.1 s CPU in bench_features_ofi7_15421f0)."""
    cols = [ofi_core._empty_1d(n) for _ in range(k)]
    for c in cols:
        c[::_F64_PER_PAGE] = 0.0
    return cols


class _OfiOutput:
    """The quarter's OFI columns, allocated once; each chunk copies its bars in at their offset
    (on its own thread, right after computing them), so no chunk result is held for a final
    concatenation and no concatenation runs on one core at the end."""

    def __init__(self, n: int, ts_close: npt.NDArray[np.int64], config: ofi_core.OfiConfig) -> None:
        self.ts_close = np.ascontiguousarray(ts_close, dtype=np.int64).copy()
        self.bars_since_reset = np.empty(n, np.int32)
        names = ofi_core.feature_names(config)
        self.columns = dict(zip(names, _populated_columns(len(names), n), strict=True))
        self.first: ofi_core.OfiFeatures | None = None

    def put(self, offset: int, part: ofi_core.OfiFeatures) -> None:
        if not np.array_equal(part.ts_close, self.ts_close[offset : offset + len(part)]):
            raise AssertionError("OFI chunk rows do not line up with the bar list")  # a bug, not data
        stop = offset + len(part)
        self.bars_since_reset[offset:stop] = part.bars_since_reset
        if list(part.columns) != list(self.columns):
            raise AssertionError("OFI chunk columns differ from the registry's")
        for nm, col in part.columns.items():
            self.columns[nm][offset:stop] = col
        if offset == 0:
            self.first = part

    def table(self) -> ofi_core.OfiFeatures:
        assert self.first is not None
        return ofi_core.OfiFeatures(
            ts_close=self.ts_close,
            bars_since_reset=self.bars_since_reset,
            columns=self.columns,
            config=self.first.config,
            tick_size=self.first.tick_size,
            meta=dict(self.first.meta),
        )


_TradeSource = ActiveTrades | TradeFlow | TradeSidecar


class _TradeBuffers:
    """One thread's trade window (ts, size, sign and the cumulative volumes), reused from chunk
    to chunk (numba's allocator, as the flow's outputs): a chunk's trades are views into it."""

    def __init__(self) -> None:
        self.cap = -1
        self.take(0)

    def take(self, n: int) -> tuple[I64, F64, npt.NDArray[np.int8], F64, F64]:
        if n > self.cap:
            self.cap = max(n, int(self.cap * 1.25))
            self.cols = (
                *_flow_outputs_nb(self.cap),
                ofi_core._empty_1d(self.cap),
                ofi_core._empty_1d(self.cap),
            )
        return self.cols


def _trade_ranges(sources: Sequence[_TradeSource], lo_t: int, hi_t: int) -> list[tuple[int, int]]:
    """Per source, the range of ``lo_t < ts <= hi_t``: its records (a :class:`TradeSidecar`),
    else its trades."""
    return [
        t.records(lo_t, hi_t)
        if isinstance(t, TradeSidecar)
        else (int(np.searchsorted(t.ts, lo_t, side="right")), int(np.searchsorted(t.ts, hi_t, side="right")))
        for t in sources
    ]


def _trade_slices(
    sources: Sequence[_TradeSource], lo_t: int, hi_t: int, buffers: _TradeBuffers | None = None
) -> ofi_core.TradeArrays:
    """Trades with ``lo_t < ts <= hi_t`` of the sources (consecutive, each in ts order): a view
    when one in-memory source holds them, else a copy of only those trades (no prices: OFI
    reads none), into ``buffers`` when given. A :class:`TradeSidecar`'s are written out there;
    when every source is one, the result is an ``ofi.PreparedTrades`` (its cumulative
    volumes written with the trades, over the sources in order)."""
    in_memory = [t for t in sources if not isinstance(t, TradeSidecar)]
    if len(in_memory) == len(sources):
        spans = [
            (
                t,
                int(np.searchsorted(t.ts, lo_t, side="right")),
                int(np.searchsorted(t.ts, hi_t, side="right")),
            )
            for t in in_memory
        ]
        got = [g for g in spans if g[2] > g[1]]
        if len(got) <= 1:
            t, lo, hi = got[0] if got else spans[-1]
            return ofi_core.TradeArrays(t.ts[lo:hi], None, t.size[lo:hi], t.sign[lo:hi])
    ranges = _trade_ranges(sources, lo_t, hi_t)
    room = sum(max(hi - lo, 0) for lo, hi in ranges)
    cols = (buffers or _TradeBuffers()).take(room)
    o_ts, o_sz, o_sg = cols[:3]
    acc = np.zeros(2)  # the running sums, carried from one source to the next
    j = 0
    for src, (lo, hi) in zip(sources, ranges, strict=True):
        if hi <= lo:
            continue
        if isinstance(src, TradeSidecar):
            j += src.window(lo, hi, tuple(c[j:] for c in cols), acc, j == 0)  # type: ignore[arg-type]
        else:
            m = hi - lo
            o_ts[j : j + m], o_sz[j : j + m], o_sg[j : j + m] = (
                src.ts[lo:hi],
                src.size[lo:hi],
                src.sign[lo:hi],
            )
            j += m
    if in_memory:  # (their sums are not written: compute_ofi_features adds them up)
        return ofi_core.TradeArrays(o_ts[:j], None, o_sz[:j], o_sg[:j])
    return ofi_core.PreparedTrades(o_ts[:j], None, o_sz[:j], o_sg[:j], cols[3][:j], cols[4][:j])


def quarter_ofi(
    bars: BarTable,
    trades: _TradeSource,
    book: BookSource,
    config: ofi_core.OfiConfig,
    *,
    prev_bars: BarTable | None = None,
    prev_trades: _TradeSource | None = None,
    prev_book: BookSource | None = None,
    book_chunk: int = DEFAULT_BOOK_CHUNK,
    partition: str = "?",
) -> ofi_core.OfiFeatures:
    """OFI features of ``bars`` (one quarter), warmed up from the previous quarter's tail.

    The bar list is the previous quarter's last ``ofi_warmup_bars`` bars followed by this
    quarter's; it is cut into chunks of about ``book_chunk / config.workers`` events (book
    events plus trades / ``TRADE_WEIGHT``), run ``config.workers`` at a time, and each chunk
    after the first replays the ``ofi_warmup_bars`` bars before it, so every chunk starts from the state the sequential pass would have. Both
    replays reach further back where needed to hold a valid book snapshot (see
    :func:`_replay_start`). Only the events of a chunk's bars are materialised: the sidecar
    columns are memory-mapped views, and the trades of a chunk are slices of ``trades`` /
    ``prev_trades`` (of the previous quarter only its warm-up tail is ever touched), or, for a
    :class:`TradeSidecar` (``trade_source``, the asset's loader), written out of the sidecar
    into a buffer each thread reuses.
    """
    levels = config.levels
    names = _book_columns(levels)
    book_cols = sidecar_columns(book.path, names)
    if book_cols["ts_recv"].size == 0:
        raise FxDataError(f"OFI {partition}: the MBP-10 sidecar {book.path} holds no book records")
    tick = config.tick_size
    tick_units = round(tick * 1e9)
    sources: list[tuple[BookSource, dict[str, np.ndarray]]] = []
    trade_sources: list[_TradeSource] = []
    n_warm = 0
    before_first: int | None = None  # close of the bar before bar 0 of the bar list
    if prev_bars is not None and len(prev_bars) and prev_book is not None and prev_trades is not None:
        sources.append((prev_book, sidecar_columns(prev_book.path, names)))
        n_prev = len(prev_bars)
        k = _warmup_first_bar(prev_bars, sources[0], config)
        n_warm = n_prev - k
        # The bar list (warm-up tail + quarter): only these four columns of it are read, so
        # the quarter's other ten are not copied.
        tail = prev_bars.slice(k, n_prev)
        ts_close, inst, volume, n_trades = (
            np.concatenate([getattr(tail, f), getattr(bars, f)])
            for f in ("ts_close", "instrument_id", "volume", "n_trades")
        )
        before_first = int(prev_bars.ts_close[k - 1]) if k > 0 else None
        if prev_trades.after_ts is not None and (before_first is None or prev_trades.after_ts > before_first):
            raise FxDataError(
                f"OFI {partition}: prev_trades were loaded after ts_recv {prev_trades.after_ts}, but the "
                f"warm-up needs them after {before_first} (use ofi_warmup_start with the same bars, book "
                "and config)"
            )
        trade_sources.append(prev_trades)
    else:
        ts_close, inst, volume, n_trades = bars.ts_close, bars.instrument_id, bars.volume, bars.n_trades
    trade_sources.append(trades)
    sources.append((book, book_cols))
    n_all = len(ts_close)
    # The output columns are allocated (and their pages faulted in) on a second thread while
    # this one plans the chunks (the planning runs on one core).
    alloc = ThreadPoolExecutor(1, thread_name_prefix="quarter_ofi-out")
    output = alloc.submit(_OfiOutput, n_all - n_warm, ts_close[n_warm:], config)
    alloc.shutdown(wait=False)

    def close_before(j: int) -> int | None:
        return int(ts_close[j - 1]) if j > 0 else before_first

    # Chunks run ``workers`` at a time, each on one thread (its kernels are nogil): every step
    # of a chunk (book gather, input checks, cumulative trade volumes, both passes, deltas)
    # then runs in parallel, where threads inside one chunk left its serial steps on one core.
    # ``book_chunk`` bounds the events of all chunks in flight, so each holds 1/workers of it
    # and peak memory stays that of one ``book_chunk`` chunk.
    workers = max(1, int(config.workers))
    per_chunk = max(1, book_chunk // workers)

    # Events up to each bar's close, over all sources: sets the chunk boundaries. Only
    # differences are used, so the previous quarter's events before the warm-up cancel out.
    # One forward merge per book source (the closes ascend). Trades are counted by the bars'
    # own ``n_trades`` (a trade sharing a close's stamp may count in the next bar): the
    # boundaries only balance the chunks, the results do not depend on them, and the merge
    # over the quarter's ~25 M trade stamps ran on one core before any chunk could start.
    cum = np.cumsum(n_trades, dtype=np.int64) // TRADE_WEIGHT
    hits = np.empty(n_all, dtype=np.int64)
    tc = np.ascontiguousarray(ts_close, dtype=np.int64)
    for _, c in sources:
        ofi_core.search_right(c["ts_recv"], tc, hits)
        cum += hits
    del hits
    bounds = [n_warm]
    while bounds[-1] < n_all:
        start = bounds[-1]
        base = int(cum[start - 1]) if start > 0 else 0
        nxt = int(np.searchsorted(cum, base + per_chunk, side="right"))
        bounds.append(min(max(nxt, start + 1), n_all))
    del cum

    tables = [_active_table(src.calendar, c["ts_recv"])[:2] for src, c in sources]
    # The trades left in their sidecars are read chunk by chunk too: their pages are released
    # the same way (after the book's in each plan's list of first records).
    in_sidecar = [t for t in trade_sources if isinstance(t, TradeSidecar)]
    releasers = [PageReleaser(list(c.values())) for _, c in sources]
    releasers += [PageReleaser(list(t.columns.values())) for t in in_sidecar]
    # Each chunk's plan: its bars [b0, b1), replay start w0, time window and record ranges.
    plans = []
    for b0, b1 in itertools.pairwise(bounds):
        # (the book is scanned only around the chunk's replay start, not for every bar)
        w0 = (
            0
            if b0 == n_warm
            else _replay_start_scanned(
                sources, ts_close, inst, b0 - ofi_core.ofi_warmup_bars(volume[:b0], config), before_first
            )
        )
        t_start = close_before(w0)
        lo_t = t_start if t_start is not None else int(np.iinfo(np.int64).min)
        hi_t = int(ts_close[b1 - 1])
        spans = [
            (
                int(np.searchsorted(c["ts_recv"], lo_t, side="right")),
                int(np.searchsorted(c["ts_recv"], hi_t, side="right")),
            )
            for _, c in sources
        ]
        plans.append((b0, b1, w0, t_start, lo_t, hi_t, spans))
    # First record any chunk from k on reads, per source: pages before it can be released.
    first_rec = [[lo for lo, _ in p[6]] + [t.records(p[4], p[5])[0] for t in in_sidecar] for p in plans]
    for k in range(len(plans) - 2, -1, -1):
        first_rec[k] = [min(a, b) for a, b in zip(first_rec[k], first_rec[k + 1], strict=True)]
    buffers = threading.local()  # one _BookBuffers and _TradeBuffers per thread, reused by its chunks
    # Sized once for the chunk with the most records (an active row is one of them): the
    # buffers never grow, and pages no chunk writes are never touched.
    most = max((sum(hi - lo for lo, hi in p[6]) for p in plans), default=0)
    # The trade windows' buffers likewise (a growth would re-fault them): the most trade
    # records (or trades) of any chunk's window.
    most_trades = max(
        (sum(max(hi - lo, 0) for lo, hi in _trade_ranges(trade_sources, p[4], p[5])) for p in plans),
        default=0,
    )

    result = output.result()

    def run_chunk(k: int) -> None:
        b0, b1, w0, t_start, lo_t, hi_t, spans = plans[k]
        if not hasattr(buffers, "book"):
            buffers.book = _BookBuffers(small_pages=True)
            buffers.book.reserve(most, levels, most)
            buffers.trades = _TradeBuffers()
            buffers.trades.take(most_trades)
        parts = [(src, c, lo, hi) for (src, c), (lo, hi) in zip(sources, spans, strict=True)]
        book_arr = _book_rows(parts, levels, tick_units, buffers.book, tables)
        part = ofi_core.compute_ofi_features(
            book_arr,
            _trade_slices(trade_sources, lo_t, hi_t, buffers.trades),
            ts_close[w0:b1],
            inst[w0:b1],
            config,
            tick_size=tick,
            n_warmup=b0 - w0,
            ts_window_start=t_start,
            partition=partition,
            workers=1 if workers > 1 else None,
        )
        result.put(b0 - n_warm, part)

    n_threads = min(workers, len(plans))
    pool = ThreadPoolExecutor(n_threads) if n_threads > 1 else None
    try:
        # Results are taken in chunk order, so the first failing chunk's error is the one raised.
        chunks = range(len(plans))
        for k, _ in enumerate(map(run_chunk, chunks) if pool is None else pool.map(run_chunk, chunks)):
            if k + 1 < len(plans):  # chunks up to k are done: no later one reads before these
                for rel, lo in zip(releasers, first_rec[k + 1], strict=True):
                    rel.release_before(lo)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)  # after an error, chunks not started are dropped
    if not plans:  # a quarter without bars
        return ofi_core.compute_ofi_features(
            _book_rows([], levels),
            _trade_slices(trade_sources, 0, 0),
            ts_close[:0],
            inst[:0],
            config,
            tick_size=tick,
            partition=partition,
        )
    return result.table()


# --- fxcache assembly -----------------------------------------------------------------------


def contract_codes(bars: BarTable, calendar: RollCalendar) -> F64:
    """Per bar, the contract's expiry as ``yyyymm`` (or the instrument id when the expiry is
    unknown): trainers use it to keep labels from spanning a roll."""
    return contract_codes_of(calendar)(bars.instrument_id)


@njit(cache=True, nogil=True)
def _finite_rows_nb(col, ok):
    """``ok[r] &= col[r]`` is finite: one read of the column, no boolean temporary."""
    for r in range(ok.shape[0]):
        x = col[r]
        if x - x != 0:  # NaN or inf
            ok[r] = False


def _all_finite_rows(block: ColumnBlock) -> npt.NDArray[np.bool_]:
    """Per row of ``block`` (no row selection): is every column's value finite (True for no
    columns). One column per kernel call: a single numba specialisation whatever the width."""
    ok = np.ones(block.n_rows, dtype=np.bool_)
    for col in block.columns:
        _finite_rows_nb(col, ok)
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
    # float64 views of the columns (ColumnBlock), masked, then handed to the writer with the
    # kept rows: no stacked [n, k] group and no boolean-indexed copy of one.
    f_block = ColumnBlock([features.columns[k] for k in f_names], n)
    o_block = ColumnBlock([ofi.columns[k] for k in o_names], n)
    p_block = ColumnBlock(price_cols, n)
    ok_f = _all_finite_rows(f_block)
    ok_o = _all_finite_rows(o_block)
    ok_p = _all_finite_rows(p_block)
    keep = ok_f & ok_o & ok_p
    n_drop = int((~keep).sum())
    dropped = {
        "bar_features_undefined": int((~ok_f).sum()),
        "ofi_undefined": int((~ok_o).sum()),
        "no_book_at_open": int((~ok_p).sum()),
        "total": n_drop,
    }
    # The kept rows are selected as the writer copies each column into the file.
    rows = np.flatnonzero(keep) if n_drop else None
    groups: dict[str, tuple[list[str], ColumnBlock]] = {
        "feature": (f_names, f_block.select(rows)),
        "price": (list(PRICE_COLUMNS), p_block.select(rows)),
        "ofi": (o_names, o_block.select(rows)),
    }
    return bars.ts_close[keep], groups, dropped
