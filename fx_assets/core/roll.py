"""Roll calendar: which outright futures contract is *active* in each session.

Owns the rule of reference/microstructure.md §1.5 as used by the bars:

* the active contract of session d is the outright with the most volume in the previous
  session that has data (the first session uses its own volume — nothing earlier is known);
* a switch needs the new leader to have led ``confirm_sessions`` sessions in a row (default 1);
* the active contract never moves back to an earlier expiry (a late volume spike in the old
  contract does not roll back);
* calendar spreads (raw symbols containing ``-``) never count.

Instrument ids are mapped to raw symbols with the DBN symbology recorded in the sidecar
(``SymbolInterval`` list); expiries come from ``fx_assets.core.contracts.expiry_of`` with the
one-digit year resolved from the data's own dates. Everything is causal: the choice for
session d uses sessions < d only (except the very first session).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit

from fx_assets.core.calendar import interval_of
from fx_assets.core.contracts import expiry_of, is_spread
from fx_assets.core.dbn import SymbolInterval
from fx_assets.core.errors import FxDataError
from fx_assets.core.tables import array_of, dates_of, strings_of

_EPOCH = dt.date(1970, 1, 1)
_SLICE = 1 << 22  # records per pass slice (bounds the temporaries)

ROLL_SCHEMA = pa.schema(
    [
        pa.field("session_day", pa.int32(), nullable=False),
        pa.field("instrument_id", pa.uint32(), nullable=False),
        pa.field("raw_symbol", pa.string()),
        pa.field("expiry", pa.date32()),
        pa.field("is_roll", pa.bool_(), nullable=False),
    ]
)


@dataclass(frozen=True)
class RollEvent:
    """The active contract changes from ``from_*`` to ``to_*`` at the start of ``session_day``."""

    session_day: int
    from_instrument_id: int
    to_instrument_id: int
    from_symbol: str | None
    to_symbol: str | None


@dataclass(frozen=True)
class RollCalendar:
    """One row per session with data: the active outright (id, symbol, expiry) and roll flag."""

    session_day: npt.NDArray[np.int32]
    instrument_id: npt.NDArray[np.uint32]
    raw_symbol: tuple[str | None, ...]
    expiry: tuple[dt.date | None, ...]
    is_roll: npt.NDArray[np.bool_]
    events: tuple[RollEvent, ...]

    def __len__(self) -> int:
        return len(self.session_day)

    @property
    def n_sessions(self) -> int:
        return len(self.session_day)

    @property
    def rolls(self) -> tuple[RollEvent, ...]:
        """Alias of ``events`` (the name the ingest assets use)."""
        return self.events

    def to_arrow(self) -> pa.Table:
        # tables.array_of & co. rather than pa.array: no pandas import (see array_of)
        return pa.Table.from_arrays(
            [
                array_of(np.asarray(self.session_day, np.int32), pa.int32()),
                array_of(np.asarray(self.instrument_id, np.uint32), pa.uint32()),
                strings_of(self.raw_symbol),
                dates_of(self.expiry),
                array_of(np.asarray(self.is_roll, np.bool_), pa.bool_()),
            ],
            schema=ROLL_SCHEMA,
        )

    def active_instrument(
        self, sessions: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_]]:
        """(active instrument id, known) per session; ``known`` is False for sessions not in the calendar."""
        s = np.asarray(sessions, dtype=np.int32)
        if len(self.session_day) == 0:
            return np.zeros(len(s), np.uint32), np.zeros(len(s), bool)
        idx = np.clip(np.searchsorted(self.session_day, s), 0, len(self.session_day) - 1)
        known = self.session_day[idx] == s
        return np.where(known, self.instrument_id[idx], 0).astype(np.uint32), known


def _symbol_resolver(
    symbol_map: Iterable[SymbolInterval] | Mapping[int, str],
) -> dict[int, list[tuple[dt.date, dt.date, str]]]:
    by_id: dict[int, list[tuple[dt.date, dt.date, str]]] = {}
    if isinstance(symbol_map, Mapping):
        for iid, sym in symbol_map.items():
            by_id.setdefault(int(iid), []).append((dt.date.min, dt.date.max, str(sym)))
    else:
        for m in symbol_map:
            by_id.setdefault(int(m.instrument_id), []).append((m.start_date, m.end_date, m.raw_symbol))
    return by_id


def _symbol_on(intervals: list[tuple[dt.date, dt.date, str]] | None, session: int) -> str | None:
    """Raw symbol of an id during a session (its end date, else the evening before, in UTC)."""
    if not intervals:
        return None
    if len({sym for _, _, sym in intervals}) == 1:
        return intervals[0][2]
    for day in (session, session - 1):
        date = _EPOCH + dt.timedelta(days=day)
        for start, end, sym in intervals:
            if start <= date < end:
                return sym
    return None


def _expiry(symbol: str | None, first_session: int) -> dt.date | None:
    """Expiry of an outright, the decade taken from when the data first shows it.

    A contract trading on date d expires on or after d and (for ES) within ~10 years, so the
    year is looked for in [year(d) - 1, year(d) + 9] (``expiry_of`` takes the one nearest to
    its ``ref_year``).
    """
    if symbol is None:
        return None
    seen = _EPOCH + dt.timedelta(days=first_session)
    return expiry_of(symbol, ref_year=seen.year + 4)


def _check_part(s: np.ndarray, iid: np.ndarray, vol: np.ndarray, where: str) -> None:
    if not (s.shape == iid.shape == vol.shape) or s.ndim != 1:
        raise FxDataError(
            f"{where}: sessions/instrument_id/size must be 1-D of one length, got {s.shape}, {iid.shape}, {vol.shape}"
        )
    if vol.size and (vol.dtype.kind not in "iuf" or np.nanmin(vol) < 0):
        raise FxDataError(f"{where}: column 'size' must be non-negative numbers")


def compute_roll_calendar(
    sessions: npt.ArrayLike,
    instrument_id: npt.ArrayLike,
    size: npt.ArrayLike,
    symbol_map: Iterable[SymbolInterval] | Mapping[int, str],
    *,
    confirm_sessions: int = 1,
) -> RollCalendar:
    """Active outright per session from trade sessions / instrument ids / sizes (any order).

    ``sessions`` are ``calendar.session_day`` values (-1 = halt/weekend, ignored);
    ``symbol_map`` is the sidecar's DBN symbology (``sidecar.read_symbol_map``) or a plain
    ``{instrument_id: raw_symbol}``. Ids without a symbol are treated as outrights of unknown
    expiry (the never-backwards rule cannot apply to them). Sessions before the first outright
    trade get no row.
    """
    part = (np.asarray(sessions), np.asarray(instrument_id), np.asarray(size))
    _check_part(*part, "compute_roll_calendar")
    return _roll_calendar([part], symbol_map, confirm_sessions)


@njit(cache=True, nogil=True)
def _session_volume_nb(
    ts: npt.NDArray[np.int64],
    iid: npt.NDArray[np.uint32],
    size: npt.NDArray[np.uint32],
    bounds: npt.NDArray[np.int64],
    ids: npt.NDArray[np.int64],
    vol: npt.NDArray[np.float64],
    cnt: npt.NDArray[np.int64],
    start: int,
    end: int,
    mm: npt.NDArray[np.int64],
) -> int:
    """Add the size / count of trades ``start:end`` to ``[session, id]`` (rows: the sessions of
    ``bounds``, see ``calendar.session_table``; columns: sorted ``ids``); halts and weekends
    skipped; ``mm`` widened to the min / max ``ts`` seen (the caller checks that ``bounds``
    covered them: no separate pass for the range). Returns the record where an id not in
    ``ids`` stops the pass (``end`` when done)."""
    lo_t = mm[0]
    hi_t = mm[1]
    k = 0
    last_id = -1
    col = -1
    row = -1
    # Sums for the current (row, col) are kept in registers and flushed when it changes:
    # consecutive trades nearly always share it, and a read-modify-write of the same array
    # cell per trade would stall on the store.
    acc_v = 0.0
    acc_n = 0
    for i in range(start, end):
        t = ts[i]
        lo_t = min(lo_t, t)
        hi_t = max(hi_t, t)
        k = interval_of(bounds, t, k)
        if not k & 1:
            continue
        x = int(iid[i])
        r = (k - 1) >> 1
        if x != last_id or r != row:
            if x != last_id:
                lo = 0
                hi = ids.shape[0]
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if ids[mid] < x:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo == ids.shape[0] or ids[lo] != x:
                    if acc_n:
                        vol[row, col] += acc_v
                        cnt[row, col] += acc_n
                    mm[0] = lo_t
                    mm[1] = hi_t
                    return i
                new_col = lo
            else:
                new_col = col
            if acc_n:
                vol[row, col] += acc_v
                cnt[row, col] += acc_n
            last_id = x
            col = new_col
            row = r
            acc_v = 0.0
            acc_n = 0
        acc_v += size[i]  # exact: integer sizes, float64 sums below 2**53
        acc_n += 1
    if acc_n:
        vol[row, col] += acc_v
        cnt[row, col] += acc_n
    mm[0] = lo_t
    mm[1] = hi_t
    return end


# Below this many trades one pass is faster than starting threads.
_MIN_TRADES_PER_THREAD = 1 << 20


def _volume_threads(n: int) -> int:
    """Threads for the session-volume pass over ``n`` trades (numba's thread count, the knob
    the other parallel stages follow; 1 for small inputs)."""
    return max(1, min(int(numba.get_num_threads()), n // _MIN_TRADES_PER_THREAD))


_SORTED_BLOCK = 4096  # values per block of _is_sorted_nb


@njit(cache=True, nogil=True)
def _is_sorted_nb(ts: npt.NDArray[np.int64]) -> bool:
    """``ts`` is non-decreasing. Each block's pairs are OR-ed branch-free (a loop the compiler
    vectorises; an exit test per value kept it scalar, 3.4 ns per value) and the block tested
    once."""
    n = ts.shape[0]
    for b0 in range(1, n, _SORTED_BLOCK):
        b1 = min(n, b0 + _SORTED_BLOCK)
        down = False
        for i in range(b0, b1):
            down |= ts[i] < ts[i - 1]
        if down:
            return False
    return True


def _is_sorted(ts: npt.NDArray[np.int64]) -> bool:
    """``ts`` is non-decreasing: contiguous chunks checked on threads (nogil), then where they meet."""
    n = int(ts.shape[0])
    parts = _volume_threads(n)
    if parts == 1:
        return bool(_is_sorted_nb(ts))
    cuts = [n * p // parts for p in range(parts + 1)]
    with ThreadPoolExecutor(parts) as pool:
        oks = list(pool.map(lambda p: bool(_is_sorted_nb(ts[cuts[p] : cuts[p + 1]])), range(parts)))
    return all(oks) and all(ts[c - 1] <= ts[c] for c in cuts[1:-1])


def _last_session_volume(
    path: Path | str, ids: npt.NDArray[np.int64], before: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint32], npt.NDArray[np.float64]] | None:
    """The rows of ``_sidecar_session_volume(path, ids)`` of its last session before session
    day ``before``, from the records of that session only (a previous quarter seeds the roll
    rule with its last session: no pass over the whole quarter). Sessions are read from a tail
    window of the time-ordered records, widened until it holds one, then from that session's
    own open; None when the sidecar is not in ``ts_recv`` order (the caller then scans it all)."""
    from fx_assets.core.calendar import session_bounds_utc
    from fx_assets.core.sidecar import sidecar_columns

    ts = sidecar_columns(path, ["ts_recv"])["ts_recv"]
    if not _is_sorted(ts):
        return None
    open_before = int(session_bounds_utc(np.array([before], np.int32))[0][0])
    hi = int(np.searchsorted(ts, open_before, side="left"))  # records before: sessions < before
    days = 4
    while True:
        lo = int(np.searchsorted(ts, open_before - days * 86_400 * 10**9, side="left"))
        sess, iid, vol = _sidecar_session_volume(path, ids, lo, hi)
        if sess.size or lo == 0:
            break
        days *= 4
    if sess.size == 0:
        return sess, iid, vol
    last = int(sess.max())
    # the whole of that session: every record from its open (ts order) to ``hi``
    lo = int(np.searchsorted(ts, int(session_bounds_utc(np.array([last], np.int32))[0][0]), side="left"))
    sess, iid, vol = _sidecar_session_volume(path, ids, lo, hi)
    take = sess == last
    return sess[take], iid[take], vol[take]


def _sidecar_session_volume(
    path: Path | str, ids: npt.NDArray[np.int64], lo: int = 0, hi: int | None = None
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint32], npt.NDArray[np.float64]]:
    """Traded volume per (session, instrument) of a trades sidecar (its records ``lo:hi``) with
    at least one trade: one numba pass over the memory-mapped columns, no per-trade
    temporaries (``session_day`` is never materialised). Rows in (session, id) order."""
    from fx_assets.core.calendar import _year_range, session_table
    from fx_assets.core.sidecar import sidecar_columns

    cols = {k: v[lo:hi] for k, v in sidecar_columns(path, ["ts_recv", "instrument_id", "size"]).items()}
    ts = cols["ts_recv"]
    if ts.size == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.uint32), np.zeros(0, np.float64)
    # The session table of the first and last records' years (sidecars are in time order);
    # the pass reports the range it saw, and runs again with a wider table in the rare case
    # that it was not covered (the table depends only on the years).
    span = np.array([ts[0], ts[-1]], np.int64)
    while True:
        bounds, days = session_table(int(span.min()), int(span.max()))
        out, seen = _session_volume_pass(ts, cols["instrument_id"], cols["size"], bounds, days, ids)
        if _year_range(seen) == _year_range(span):
            return out
        span = seen


def _session_volume_pass(
    ts: npt.NDArray[np.int64],
    iid: npt.NDArray[np.uint32],
    size: npt.NDArray[np.uint32],
    bounds: npt.NDArray[np.int64],
    days: npt.NDArray[np.int32],
    ids: npt.NDArray[np.int64],
) -> tuple[
    tuple[npt.NDArray[np.int32], npt.NDArray[np.uint32], npt.NDArray[np.float64]], npt.NDArray[np.int64]
]:
    """``_sidecar_session_volume``'s rows from one session table, and the (min, max) ts seen."""
    n = int(ts.shape[0])
    shape = (days.shape[0], ids.shape[0])
    parts = _volume_threads(n)
    if parts > 1:
        # The pass is split into contiguous chunks on threads (the kernel is nogil), each into
        # its own table, summed after: sizes are integers, so the float64 sums are exact and
        # the result does not depend on the split. An unknown id (normally none) falls back
        # to the single pass below.
        cuts = [n * p // parts for p in range(parts + 1)]
        tabs = [(np.zeros(shape, np.float64), np.zeros(shape, np.int64)) for _ in range(parts)]
        mms = [_empty_range() for _ in range(parts)]
        with ThreadPoolExecutor(parts) as pool:
            ends = list(
                pool.map(
                    lambda p: _session_volume_nb(
                        ts, iid, size, bounds, ids, *tabs[p], cuts[p], cuts[p + 1], mms[p]
                    ),
                    range(parts),
                )
            )
        if ends == cuts[1:]:
            vol, cnt = tabs[0]
            for v_part, n_part in tabs[1:]:
                vol += v_part
                cnt += n_part
            r, c = np.nonzero(cnt)
            seen = np.array([min(m[0] for m in mms), max(m[1] for m in mms)], np.int64)
            return (days[r].astype(np.int32), ids[c].astype(np.uint32), vol[r, c]), seen
    vol = np.zeros(shape, dtype=np.float64)
    cnt = np.zeros(shape, dtype=np.int64)
    mm = _empty_range()
    pos = 0
    while True:
        pos = _session_volume_nb(ts, iid, size, bounds, ids, vol, cnt, pos, n, mm)
        if pos >= n:
            break
        # an id the symbology does not know (normally none): add its column and go on
        new_id = int(iid[pos])
        j = int(np.searchsorted(ids, new_id))
        ids = np.insert(ids, j, new_id)
        vol = np.insert(vol, j, 0.0, axis=1)
        cnt = np.insert(cnt, j, 0, axis=1)
    r, c = np.nonzero(cnt)
    return (days[r].astype(np.int32), ids[c].astype(np.uint32), vol[r, c]), mm


def _empty_range() -> npt.NDArray[np.int64]:
    return np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)


def roll_calendar_from_sidecars(
    trades_sidecar: Path | str, prev_trades_sidecar: Path | str | None = None, *, confirm_sessions: int = 1
) -> RollCalendar:
    """Roll calendar of the quarter in a trades sidecar; the last session of the previous
    quarter's sidecar (when given) decides the first session's active contract.

    Rows are kept for this quarter's sessions only (a roll on its first session keeps its flag
    and event). The previous quarter contributes only its last session's volume. Each sidecar
    is reduced to its volume per (session, instrument) in one pass (``_sidecar_session_volume``);
    the rule only needs those sums and whether a pair traded at all, so the result is the
    one ``compute_roll_calendar`` gives on the trades themselves.
    """
    from fx_assets.core.sidecar import read_symbol_map

    symbols = list(read_symbol_map(trades_sidecar))
    prev_symbols = list(read_symbol_map(prev_trades_sidecar)) if prev_trades_sidecar is not None else []
    ids = np.array(sorted({int(m.instrument_id) for m in symbols + prev_symbols}), dtype=np.int64)
    cur = _sidecar_session_volume(trades_sidecar, ids)
    parts = [cur]
    if cur[0].size == 0:
        return _roll_calendar(parts, symbols, confirm_sessions)
    first = int(cur[0].min())
    if prev_trades_sidecar is not None:
        tail = _last_session_volume(prev_trades_sidecar, ids, first)
        if tail is None:  # not in time order: every record can be of any session
            p_sess, p_iid, p_vol = _sidecar_session_volume(prev_trades_sidecar, ids)
            earlier = p_sess[p_sess < first]
            take = p_sess == (int(earlier.max()) if earlier.size else first)
            tail = (p_sess[take], p_iid[take], p_vol[take]) if earlier.size else None
        if tail is not None and tail[0].size:
            parts.insert(0, tail)
            symbols += prev_symbols
    cal = _roll_calendar(parts, symbols, confirm_sessions)
    keep = cal.session_day >= first
    return RollCalendar(
        session_day=cal.session_day[keep],
        instrument_id=cal.instrument_id[keep],
        raw_symbol=tuple(x for x, k in zip(cal.raw_symbol, keep, strict=True) if k),
        expiry=tuple(x for x, k in zip(cal.expiry, keep, strict=True) if k),
        is_roll=cal.is_roll[keep],
        events=tuple(e for e in cal.events if e.session_day >= first),
    )


def _roll_calendar(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    symbol_map: Iterable[SymbolInterval] | Mapping[int, str],
    confirm_sessions: int,
) -> RollCalendar:
    if confirm_sessions < 1:
        raise FxDataError(f"compute_roll_calendar: confirm_sessions must be >= 1, got {confirm_sessions}")
    resolver = _symbol_resolver(symbol_map)
    empty = RollCalendar(np.zeros(0, np.int32), np.zeros(0, np.uint32), (), (), np.zeros(0, bool), ())
    valid_s = [s[s >= 0] for s, _, _ in parts]
    if not any(v.size for v in valid_s):
        return empty
    d0 = min(int(v.min()) for v in valid_s if v.size)
    span = max(int(v.max()) for v in valid_s if v.size) - d0 + 1
    del valid_s

    # Dense id codes: the symbology's ids by binary search, plus any id the map does not know
    # (normally none). Both passes run over bounded slices: a quarter of ES trades is ~1e8
    # records, and whole-array int64 temporaries would cost GBs.
    ids = np.array(sorted(resolver), dtype=np.int64)
    slices = [(p, slice(a, a + _SLICE)) for p in parts for a in range(0, len(p[0]), _SLICE)]
    unknown: set[int] = set()
    for (_, iid, _), sl in slices:
        chunk = iid[sl].astype(np.int64)
        if len(ids):
            pos = np.clip(np.searchsorted(ids, chunk), 0, len(ids) - 1)
            chunk = chunk[ids[pos] != chunk]
        unknown.update(np.unique(chunk).tolist())
    if unknown:
        ids = np.union1d(ids, np.array(sorted(unknown), dtype=np.int64))
    k_ids = len(ids)
    vol_flat = np.zeros(span * k_ids, dtype=np.float64)
    cnt_flat = np.zeros(span * k_ids, dtype=np.int64)
    for (s, iid, vol), sl in slices:
        ok = s[sl] >= 0
        cell = (s[sl][ok].astype(np.int64) - d0) * k_ids + np.searchsorted(ids, iid[sl][ok].astype(np.int64))
        vol_flat += np.bincount(cell, weights=vol[sl][ok], minlength=span * k_ids)
        cnt_flat += np.bincount(cell, minlength=span * k_ids)
    volume = vol_flat.reshape(span, k_ids)
    count = cnt_flat.reshape(span, k_ids)
    data_sessions = np.flatnonzero(count.sum(axis=1) > 0)

    first_seen = {
        int(ids[j]): d0 + int(np.flatnonzero(count[:, j])[0]) for j in range(k_ids) if count[:, j].any()
    }
    symbol_cache: dict[tuple[int, int], str | None] = {}

    def symbol(j: int, session: int) -> str | None:
        key = (j, session)
        if key not in symbol_cache:
            symbol_cache[key] = _symbol_on(resolver.get(int(ids[j])), session)
        return symbol_cache[key]

    expiry_cache: dict[tuple[int, str | None], dt.date | None] = {}

    def expiry(j: int, sym: str | None) -> dt.date | None:
        key = (j, sym)
        if key not in expiry_cache:
            expiry_cache[key] = _expiry(sym, first_seen.get(int(ids[j]), d0))
        return expiry_cache[key]

    def tradable(j: int, session: int) -> bool:
        """An outright (not a spread) that has not expired before the session's date."""
        sym = symbol(j, session)
        if sym is not None and is_spread(sym):
            return False
        exp = expiry(j, sym)
        return exp is None or exp >= _EPOCH + dt.timedelta(days=session)

    def leader(row: int, target: int) -> int | None:
        """Most volume in session ``d0 + row`` among contracts tradable in session ``target``;
        ties -> earlier expiry, then smaller id."""
        best: tuple[float, dt.date, int] | None = None
        best_j: int | None = None
        for jj in np.flatnonzero(count[row]):
            j = int(jj)
            if not (tradable(j, d0 + row) and tradable(j, target)):
                continue
            exp = expiry(j, symbol(j, target)) or dt.date.max
            key = (-float(volume[row, j]), exp, int(ids[j]))
            if best is None or key < best:
                best, best_j = key, j
        return best_j

    # lead[k]: the contract the data says should be active in data session k (the leader of
    # the previous data session; the first session has only its own volume)
    rows = [int(r) for r in data_sessions]
    lead = [leader(rows[max(k - 1, 0)], d0 + r) for k, r in enumerate(rows)]
    out_sessions: list[int] = []
    out_ids: list[int] = []
    out_syms: list[str | None] = []
    out_exp: list[dt.date | None] = []
    out_roll: list[bool] = []
    events: list[RollEvent] = []
    active: int | None = None
    for k, row in enumerate(rows):
        session = d0 + row
        window = lead[max(0, k - confirm_sessions + 1) : k + 1]
        candidate = lead[k]
        confirmed = candidate is not None and len(set(window)) == 1
        rolled = False
        if active is not None and not tradable(active, session):
            # the active contract expired (or its id now names a spread): move on at once
            confirmed = candidate is not None
        elif active is not None and confirmed and candidate != active:
            e_new = expiry(candidate, symbol(candidate, session))  # type: ignore[arg-type]
            e_old = expiry(active, symbol(active, session))
            # never back to an earlier expiry (a late volume spike in the old contract)
            confirmed = e_new is None or e_old is None or e_new > e_old
        if confirmed and candidate is not None and candidate != active:
            if active is not None:
                events.append(
                    RollEvent(
                        session,
                        int(ids[active]),
                        int(ids[candidate]),
                        symbol(active, session),
                        symbol(candidate, session),
                    )
                )
                rolled = True
            active = candidate
        if active is None:
            continue
        sym = symbol(active, session)
        out_sessions.append(session)
        out_ids.append(int(ids[active]))
        out_syms.append(sym)
        out_exp.append(expiry(active, sym))
        out_roll.append(rolled)
    if not out_sessions:
        return empty
    return RollCalendar(
        session_day=np.array(out_sessions, dtype=np.int32),
        instrument_id=np.array(out_ids, dtype=np.uint32),
        raw_symbol=tuple(out_syms),
        expiry=tuple(out_exp),
        is_roll=np.array(out_roll, dtype=bool),
        events=tuple(events),
    )


def active_mask(
    session_of_trade: npt.ArrayLike, instrument_id: npt.ArrayLike, calendar: RollCalendar
) -> npt.NDArray[np.bool_]:
    """True for the records of the session's active contract (False in halts / unknown sessions)."""
    s = np.asarray(session_of_trade)
    iid = np.asarray(instrument_id)
    if s.shape != iid.shape:
        raise FxDataError(f"active_mask: session ({s.shape}) and instrument_id ({iid.shape}) lengths differ")
    active, known = calendar.active_instrument(s)
    return known & (iid.astype(np.int64) == active.astype(np.int64))
