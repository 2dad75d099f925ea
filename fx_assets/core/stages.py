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
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from fx_assets.core import ofi as ofi_core
from fx_assets.core.atomic import atomic_path
from fx_assets.core.bar_features import BarFeatureConfig, FeatureTable, compute_bar_features, max_window
from fx_assets.core.bars import BarConfig, BarTable, build_bars
from fx_assets.core.calendar import session_day
from fx_assets.core.dbn import UNDEF_PRICE, aggressor_sign, px_to_float
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import RollCalendar, active_mask, roll_calendar_from_sidecars
from fx_assets.core.sidecar import sidecar_columns

N_LEVELS = 10
F64 = npt.NDArray[np.float64]
DEFAULT_BOOK_CHUNK = 2_000_000


# --- Arrow files ------------------------------------------------------------------------------


def write_table(path: Path, table: pa.Table) -> Path:
    """Write an uncompressed Arrow IPC file (one record batch) atomically."""
    table = table.combine_chunks()
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(table.num_rows, 1))
    return path


def read_table(path: Path) -> pa.Table:
    """Memory-map an Arrow IPC file written by :func:`write_table`."""
    try:
        with pa.memory_map(str(path), "r") as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise FxDataError(f"{path}: cannot read Arrow table: {exc}") from exc


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
    """Trades of the active contract, ``ts_recv`` order; prices in index points."""

    ts: npt.NDArray[np.int64]
    price: npt.NDArray[np.float64]
    size: npt.NDArray[np.float64]
    sign: npt.NDArray[np.int8]
    session: npt.NDArray[np.int32]
    instrument_id: npt.NDArray[np.uint32]
    n_source: int

    def __len__(self) -> int:
        return int(self.ts.shape[0])


def active_trades(trades_sidecar: Path, calendar: RollCalendar) -> ActiveTrades:
    cols = sidecar_columns(trades_sidecar, ["ts_recv", "instrument_id", "price", "size", "side", "action"])
    ts = cols["ts_recv"]
    sess = session_day(ts)
    mask = active_mask(sess, cols["instrument_id"], calendar)
    mask &= (cols["price"] != UNDEF_PRICE) & (cols["price"] > 0) & (cols["size"] > 0)
    idx = np.flatnonzero(mask)
    if idx.size and np.any(np.diff(ts[idx]) < 0):
        raise FxDataError(f"{trades_sidecar}: trades are not in ts_recv order")
    return ActiveTrades(
        ts=ts[idx],
        price=px_to_float(cols["price"][idx]),
        size=cols["size"][idx].astype(np.float64),
        sign=aggressor_sign(cols["side"][idx]),
        session=sess[idx],
        instrument_id=cols["instrument_id"][idx].astype(np.uint32),
        n_source=int(ts.shape[0]),
    )


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


def _book_rows(
    src: BookSource, cols: dict[str, np.ndarray], lo: int, hi: int, tick_units: int = 0
) -> ofi_core.BookArrays:
    """Active-contract book rows ``[lo, hi)`` as float matrices; with ``tick_units`` > 0, a
    defined price off the tick grid raises (naming file, column and record)."""
    ts = cols["ts_recv"][lo:hi]
    sess = session_day(ts)
    keep = np.flatnonzero(active_mask(sess, cols["instrument_id"][lo:hi], src.calendar)) + lo

    def mat(prefix: str, price: bool) -> np.ndarray:
        out = np.empty((keep.size, N_LEVELS), dtype=np.float64)
        for i in range(N_LEVELS):
            c = cols[f"{prefix}_{i:02d}"][keep]
            if price and tick_units > 0:
                bad = np.flatnonzero((c != UNDEF_PRICE) & (c % tick_units != 0))
                if bad.size:
                    r = int(keep[bad[0]])
                    raise FxDataError(
                        f"{src.path}: {prefix}_{i:02d} = {int(c[bad[0]]) * 1e-9!r} at record {r} "
                        f"(ts_recv {int(cols['ts_recv'][r])}) is off the {tick_units * 1e-9:g} tick grid "
                        "(OfiConfig.tick_size)"
                    )
            out[:, i] = px_to_float(c) if price else c
        return out

    return ofi_core.BookArrays(
        ts=cols["ts_recv"][keep],
        bid_px=mat("bid_px", True),
        ask_px=mat("ask_px", True),
        bid_sz=mat("bid_sz", False),
        ask_sz=mat("ask_sz", False),
        bid_ct=mat("bid_ct", False),
        ask_ct=mat("ask_ct", False),
    )


def _concat_book(parts: list[ofi_core.BookArrays]) -> ofi_core.BookArrays:
    if len(parts) == 1:
        return parts[0]
    return ofi_core.BookArrays(
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("ts", "bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")
        )
    )


_BOOK_COLUMNS = ["ts_recv", "instrument_id"] + [
    f"{s}_{q}_{i:02d}" for s in ("bid", "ask") for q in ("px", "sz", "ct") for i in range(N_LEVELS)
]


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


def _has_valid_snapshot(
    sources: list[tuple[BookSource, dict[str, np.ndarray]]], ts_close: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Per bar: does its window ``(τ_{j-1}, τ_j]`` hold a valid snapshot of the active contract
    (the OFI kernel's rule: both touches present, not crossed)? Bar 0 counts every earlier
    snapshot. Streams the book in ``DEFAULT_BOOK_CHUNK`` records."""
    upto = np.zeros(ts_close.shape[0], dtype=np.int64)
    for src, c in sources:
        ts = c["ts_recv"]
        for lo in range(0, ts.shape[0], DEFAULT_BOOK_CHUNK):
            hi = min(lo + DEFAULT_BOOK_CHUNK, ts.shape[0])
            t = ts[lo:hi]
            b = c["bid_px_00"][lo:hi]
            a = c["ask_px_00"][lo:hi]
            keep = active_mask(session_day(t), c["instrument_id"][lo:hi], src.calendar)
            keep &= (b != UNDEF_PRICE) & (a != UNDEF_PRICE) & (b > 0) & (b <= a)
            upto += np.searchsorted(t[keep], ts_close, side="right")
    return np.diff(upto, prepend=0) > 0


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


def quarter_ofi(
    bars: BarTable,
    trades: ActiveTrades,
    book: BookSource,
    config: ofi_core.OfiConfig,
    *,
    prev_bars: BarTable | None = None,
    prev_trades: ActiveTrades | None = None,
    prev_book: BookSource | None = None,
    book_chunk: int = DEFAULT_BOOK_CHUNK,
    partition: str = "?",
) -> ofi_core.OfiFeatures:
    """OFI features of ``bars`` (one quarter), warmed up from the previous quarter's tail.

    The bar list is the previous quarter's last ``ofi_warmup_bars`` bars followed by this
    quarter's; it is cut into chunks of about ``book_chunk`` book events, and each chunk after
    the first replays the ``ofi_warmup_bars`` bars before it, so every chunk starts from the
    state the sequential pass would have. Both replays reach further back where needed to hold a
    valid book snapshot (see :func:`_replay_start`).
    """
    book_cols = sidecar_columns(book.path, _BOOK_COLUMNS)
    if book_cols["ts_recv"].size == 0:
        raise FxDataError(f"OFI {partition}: the MBP-10 sidecar {book.path} holds no book records")
    tick = config.tick_size
    tick_units = round(tick * 1e9)
    sources: list[tuple[BookSource, dict[str, np.ndarray]]] = []
    n_warm = 0
    before_first: int | None = None  # close of the bar before bar 0 of the bar list
    if prev_bars is not None and len(prev_bars) and prev_book is not None and prev_trades is not None:
        sources.append((prev_book, sidecar_columns(prev_book.path, _BOOK_COLUMNS)))
        n_prev = len(prev_bars)
        has_prev = _has_valid_snapshot(sources, prev_bars.ts_close)
        k = _replay_start(
            n_prev - ofi_core.ofi_warmup_bars(prev_bars.volume, config), has_prev, prev_bars.instrument_id
        )
        n_warm = n_prev - k
        all_bars = BarTable.concat([prev_bars.slice(k, n_prev), bars])
        before_first = int(prev_bars.ts_close[k - 1]) if k > 0 else None
        t_ts = np.concatenate([prev_trades.ts, trades.ts])
        t_px = np.concatenate([prev_trades.price, trades.price])
        t_sz = np.concatenate([prev_trades.size, trades.size])
        t_sg = np.concatenate([prev_trades.sign, trades.sign])
    else:
        all_bars = bars
        t_ts, t_px, t_sz, t_sg = trades.ts, trades.price, trades.size, trades.sign
    sources.append((book, book_cols))
    ts_close = all_bars.ts_close
    inst = all_bars.instrument_id
    n_all = len(ts_close)

    def close_before(j: int) -> int | None:
        return int(ts_close[j - 1]) if j > 0 else before_first

    has_snap = _has_valid_snapshot(sources, ts_close)

    # Book events up to each bar's close, over all sources: sets the chunk boundaries.
    cum = np.zeros(n_all, dtype=np.int64)
    for _, c in sources:
        cum += np.searchsorted(c["ts_recv"], ts_close, side="right")
    bounds = [n_warm]
    while bounds[-1] < n_all:
        start = bounds[-1]
        base = int(cum[start - 1]) if start > 0 else 0
        nxt = int(np.searchsorted(cum, base + book_chunk, side="right"))
        bounds.append(min(max(nxt, start + 1), n_all))

    outs: list[ofi_core.OfiFeatures] = []
    for b0, b1 in itertools.pairwise(bounds):
        w0 = (
            0
            if b0 == n_warm
            else _replay_start(b0 - ofi_core.ofi_warmup_bars(all_bars.volume[:b0], config), has_snap, inst)
        )
        t_start = close_before(w0)
        lo_t = t_start if t_start is not None else np.iinfo(np.int64).min
        hi_t = int(ts_close[b1 - 1])
        parts = []
        for src, c in sources:
            lo = int(np.searchsorted(c["ts_recv"], lo_t, side="right"))
            hi = int(np.searchsorted(c["ts_recv"], hi_t, side="right"))
            if hi > lo:
                parts.append(_book_rows(src, c, lo, hi, tick_units))
        book_arr = _concat_book(parts) if parts else _book_rows(book, book_cols, 0, 0)
        tl = int(np.searchsorted(t_ts, lo_t, side="right"))
        th = int(np.searchsorted(t_ts, hi_t, side="right"))
        outs.append(
            ofi_core.compute_ofi_features(
                book_arr,
                ofi_core.TradeArrays(t_ts[tl:th], t_px[tl:th], t_sz[tl:th], t_sg[tl:th]),
                ts_close[w0:b1],
                inst[w0:b1],
                config,
                tick_size=tick,
                n_warmup=b0 - w0,
                ts_window_start=t_start,
                partition=partition,
            )
        )
    if not outs:  # a quarter without bars
        return ofi_core.compute_ofi_features(
            _book_rows(book, book_cols, 0, 0),
            ofi_core.TradeArrays(t_ts[:0], t_px[:0], t_sz[:0], t_sg[:0]),
            ts_close[:0],
            inst[:0],
            config,
            tick_size=tick,
            partition=partition,
        )
    return _concat_ofi(outs)


def quarter_first_day(bars: BarTable) -> dt.date | None:
    if not len(bars):
        return None
    return dt.date(1970, 1, 1) + dt.timedelta(days=int(bars.session_id[0]))


# --- fxcache assembly -----------------------------------------------------------------------


def book_mid_asof(
    book: BookSource,
    ts_query: npt.NDArray[np.int64],
    chunk: int = DEFAULT_BOOK_CHUNK,
    *,
    instrument_id: npt.NDArray[np.uint32] | None = None,
) -> F64:
    """Mid price of the active contract's book as of each query time (last valid snapshot with
    ``ts_recv <= t``; NaN before the first). Streams the book in chunks of ``chunk`` records.

    ``instrument_id`` (one per query, optional): only snapshots of that contract count. A bar
    right after a roll must not get the previous contract's mid (the last active snapshot
    before its open is usually the old contract's, from the session before)."""
    cols = sidecar_columns(book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    ts = cols["ts_recv"]
    q = np.asarray(ts_query, dtype=np.int64)
    out = np.full(q.shape[0], np.nan)
    last_ts: list[np.ndarray] = []
    last_mid: list[np.ndarray] = []
    last_iid: list[np.ndarray] = []
    for lo in range(0, ts.shape[0], chunk):
        hi = min(lo + chunk, ts.shape[0])
        t = ts[lo:hi]
        keep = active_mask(session_day(t), cols["instrument_id"][lo:hi], book.calendar)
        b = cols["bid_px_00"][lo:hi]
        a = cols["ask_px_00"][lo:hi]
        keep &= (b != UNDEF_PRICE) & (a != UNDEF_PRICE) & (b > 0) & (b <= a)
        if keep.any():
            last_ts.append(t[keep])
            last_mid.append((px_to_float(b[keep]) + px_to_float(a[keep])) / 2.0)
            last_iid.append(cols["instrument_id"][lo:hi][keep])
        # Only the valid snapshots are kept: 20 bytes each, far less than the 368-byte records.
    if not last_ts:
        return out
    vt = np.concatenate(last_ts)
    vm = np.concatenate(last_mid)
    if instrument_id is None:
        groups = [(np.arange(q.shape[0]), vt, vm)]
    else:
        qi = np.asarray(instrument_id, dtype=np.uint32)
        if qi.shape != q.shape:
            raise FxDataError(
                f"book_mid_asof: instrument_id {qi.shape} and ts_query {q.shape} differ in shape"
            )
        vi = np.concatenate(last_iid)
        groups = []
        for iid in np.unique(qi):
            sel = vi == iid
            groups.append((np.flatnonzero(qi == iid), vt[sel], vm[sel]))
    for rows, gt, gm in groups:
        if gt.size == 0:
            continue
        idx = np.searchsorted(gt, q[rows], side="right") - 1
        ok = idx >= 0
        out[rows[ok]] = gm[idx[ok]]
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


PRICE_COLUMNS = ("open", "high", "low", "close", "vwap", "mid_open", "contract")


def assemble_fxcache_columns(
    bars: BarTable,
    features: FeatureTable,
    ofi: ofi_core.OfiFeatures,
    book: BookSource,
) -> tuple[npt.NDArray[np.int64], dict[str, tuple[list[str], F64]], dict[str, int]]:
    """(ts_close, {group: (names, values)}, dropped-row counts) for ``write_fxcache``.

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
    price = (
        np.column_stack(
            [
                bars.open,
                bars.high,
                bars.low,
                bars.close,
                bars.vwap,
                book_mid_asof(book, bars.ts_open, instrument_id=bars.instrument_id),
                contract_codes(bars, book.calendar),
            ]
        )
        if n
        else np.zeros((0, len(PRICE_COLUMNS)))
    )
    f_names = list(features.columns)
    o_names = list(ofi.columns)
    feat = np.column_stack([features.columns[k] for k in f_names]) if n else np.zeros((0, len(f_names)))
    ofiv = np.column_stack([ofi.columns[k] for k in o_names]) if n else np.zeros((0, len(o_names)))
    ok_f = np.isfinite(feat).all(axis=1)
    ok_o = np.isfinite(ofiv).all(axis=1)
    ok_p = np.isfinite(price).all(axis=1)
    keep = ok_f & ok_o & ok_p
    dropped = {
        "bar_features_undefined": int((~ok_f).sum()),
        "ofi_undefined": int((~ok_o).sum()),
        "no_book_at_open": int((~ok_p).sum()),
        "total": int((~keep).sum()),
    }
    groups = {
        "feature": (f_names, feat[keep]),
        "price": (list(PRICE_COLUMNS), price[keep]),
        "ofi": (o_names, ofiv[keep]),
    }
    return bars.ts_close[keep], groups, dropped
