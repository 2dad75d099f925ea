"""CME Globex trading calendar: Chicago local time, sessions and quarters.

Owns the one definition of a *session* used everywhere (synthetic market, roll calendar,
bars): Globex trades from 17:00 America/Chicago on the previous day to 16:00, with a daily
halt 16:00-17:00 and no trading from Friday 16:00 to Sunday 17:00. A session is named by the
calendar day it ends on and is represented as an int32 count of days since 1970-01-01
(``session_day``). Exchange holidays are not modelled (every Monday-Friday is a session).

All functions are vectorised over int64 UNIX-nanosecond arrays; DST is taken from the IANA
database through ``zoneinfo`` (transition instants are tabulated once per year range).

``session_day`` is on every hot path (roll calendar, active trades, every book chunk), so it
does not convert to local time per record: a session is one UTC interval [open, close) (its
ends are at 16:00/17:00 local, never inside a DST change), and each timestamp is looked up
in the sorted, cached array of those boundaries (``session_table``) by a numba kernel that
walks forward from the previous record's interval (records are nearly sorted) and falls back
to a binary search. Numba kernels that select records by session (``fx_assets.core.active_contract``)
use the same table and ``interval_of``.
"""

from __future__ import annotations

import datetime as dt
from functools import lru_cache
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
from numba import njit

CHICAGO = ZoneInfo("America/Chicago")
NS_PER_SECOND = 1_000_000_000
NS_PER_MINUTE = 60 * NS_PER_SECOND
NS_PER_HOUR = 60 * NS_PER_MINUTE
NS_PER_DAY = 24 * NS_PER_HOUR

SESSION_OPEN_LOCAL_NS = 17 * NS_PER_HOUR  # 17:00 Chicago, previous calendar day
SESSION_CLOSE_LOCAL_NS = 16 * NS_PER_HOUR  # 16:00 Chicago
RTH_OPEN_LOCAL_NS = 8 * NS_PER_HOUR + 30 * NS_PER_MINUTE  # 08:30
RTH_CLOSE_LOCAL_NS = 15 * NS_PER_HOUR + 15 * NS_PER_MINUTE  # 15:15
NO_SESSION = np.int32(-1)

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


@lru_cache(maxsize=16)
def _offset_table(year_lo: int, year_hi: int) -> tuple[I64, I64]:
    """UTC instants (ns) at which Chicago's UTC offset changes, and the offset (ns) from each."""
    starts = [int(dt.datetime(year_lo - 1, 12, 31, tzinfo=dt.UTC).timestamp()) * NS_PER_SECOND]
    offsets = []
    first = dt.datetime(year_lo - 1, 12, 31, tzinfo=dt.UTC).astimezone(CHICAGO).utcoffset()
    assert first is not None
    offsets.append(int(first.total_seconds()) * NS_PER_SECOND)
    # Walk hour by hour is too slow; DST changes happen at most twice a year, so probe daily.
    day = dt.datetime(year_lo - 1, 12, 31, 12, tzinfo=dt.UTC)
    end = dt.datetime(year_hi + 1, 1, 2, tzinfo=dt.UTC)
    prev = offsets[0]
    while day < end:
        nxt = day + dt.timedelta(days=1)
        off = nxt.astimezone(CHICAGO).utcoffset()
        assert off is not None
        off_ns = int(off.total_seconds()) * NS_PER_SECOND
        if off_ns != prev:
            # Bisect to the exact second inside (day, nxt].
            lo, hi = int(day.timestamp()), int(nxt.timestamp())
            while hi - lo > 1:
                mid = (lo + hi) // 2
                m_off = dt.datetime.fromtimestamp(mid, dt.UTC).astimezone(CHICAGO).utcoffset()
                assert m_off is not None
                if int(m_off.total_seconds()) * NS_PER_SECOND == prev:
                    lo = mid
                else:
                    hi = mid
            starts.append(hi * NS_PER_SECOND)
            offsets.append(off_ns)
            prev = off_ns
        day = nxt
    return np.asarray(starts, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


def _year_range(ts_ns: I64) -> tuple[int, int]:
    if ts_ns.size == 0:
        return 2000, 2000
    lo = int(ts_ns.min()) // NS_PER_DAY
    hi = int(ts_ns.max()) // NS_PER_DAY
    y0 = (np.datetime64(lo, "D").astype("datetime64[Y]").astype(int)) + 1970
    y1 = (np.datetime64(hi, "D").astype("datetime64[Y]").astype(int)) + 1970
    return int(y0), int(y1)


def utc_offset_ns(ts_ns: I64) -> I64:
    """Chicago's UTC offset (ns, negative) in force at each UTC instant."""
    ts_ns = np.asarray(ts_ns, dtype=np.int64)
    starts, offsets = _offset_table(*_year_range(ts_ns))
    idx = np.searchsorted(starts, ts_ns, side="right") - 1
    return offsets[np.clip(idx, 0, None)]


def to_local_ns(ts_ns: I64) -> I64:
    """UTC ns -> Chicago wall-clock ns (a naive timestamp in ns since 1970-01-01 local)."""
    ts_ns = np.asarray(ts_ns, dtype=np.int64)
    return ts_ns + utc_offset_ns(ts_ns)


def local_to_utc_ns(local_ns: I64) -> I64:
    """Chicago wall-clock ns -> UTC ns. Ambiguous/non-existent hours (02:00 on DST days) resolve
    to the standard-time reading; Globex sessions never start or end inside them."""
    local_ns = np.asarray(local_ns, dtype=np.int64)
    guess = local_ns - utc_offset_ns(local_ns)
    return local_ns - utc_offset_ns(guess)


def _session_day_local(ts_ns: I64) -> I32:
    """Reference definition of ``session_day`` through local wall-clock time (slow: int64
    temporaries per record); kept for the tests that check ``session_day`` against it."""
    local = to_local_ns(np.asarray(ts_ns, dtype=np.int64))
    day = local // NS_PER_DAY
    tod = local - day * NS_PER_DAY
    sess = np.where(tod >= SESSION_OPEN_LOCAL_NS, day + 1, day)
    in_halt = (tod >= SESSION_CLOSE_LOCAL_NS) & (tod < SESSION_OPEN_LOCAL_NS)
    weekday = (sess + 3) % 7  # 1970-01-01 was a Thursday -> Monday == 0
    valid = (~in_halt) & (weekday < 5)
    return np.where(valid, sess, -1).astype(np.int32)


@lru_cache(maxsize=16)
def _session_table_years(year_lo: int, year_hi: int) -> tuple[I64, I32]:
    # A week of margin on each side: a timestamp late on 31 December belongs to a session
    # ending in the next year, and the lookup must see the sessions around every timestamp.
    days = sessions_between(dt.date(year_lo - 1, 12, 24), dt.date(year_hi + 1, 1, 8))
    opens, closes = session_bounds_utc(days)
    bounds = np.empty(2 * days.shape[0], dtype=np.int64)
    bounds[0::2] = opens
    bounds[1::2] = closes
    if np.any(np.diff(bounds) <= 0):  # an invariant of the calendar, not of the data
        raise AssertionError("session boundaries are not strictly increasing")
    bounds.flags.writeable = False
    days.flags.writeable = False
    return bounds, days


def session_table(ts_lo: int, ts_hi: int) -> tuple[I64, I32]:
    """Sessions around the UTC instants ``[ts_lo, ts_hi]`` (ns), as a lookup table.

    Returns ``bounds`` (int64 ns, strictly increasing: ``bounds[2k]`` is the open, inclusive,
    and ``bounds[2k + 1]`` the close, exclusive, of session ``days[k]``) and ``days`` (int32
    session days). An instant ``t`` with ``k = interval_of(bounds, t, ·)`` is in session
    ``days[(k - 1) // 2]`` when ``k`` is odd, else in a halt or weekend. Cached per year range.
    """
    y0, y1 = _year_range(np.array([ts_lo, ts_hi], dtype=np.int64))
    return _session_table_years(y0, y1)


@njit(cache=True, inline="always")
def interval_of(bounds: I64, t: int, k: int) -> int:
    """``searchsorted(bounds, t, side="right")``, trying ``k`` (the previous answer) and
    ``k + 1`` first: consecutive records are nearly always in the same or the next interval."""
    m = bounds.shape[0]
    if (k == 0 or bounds[k - 1] <= t) and (k == m or t < bounds[k]):
        return k
    if k < m and bounds[k] <= t and (k + 1 == m or t < bounds[k + 1]):
        return k + 1
    lo = 0
    hi = m
    while lo < hi:
        mid = (lo + hi) >> 1
        if bounds[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _session_day_nb(ts: I64, bounds: I64, days: I32, out: I32) -> None:
    k = 0
    for i in range(ts.shape[0]):
        k = interval_of(bounds, ts[i], k)
        out[i] = days[(k - 1) >> 1] if k & 1 else -1


@njit(cache=True, nogil=True)
def _range_nb(ts: I64) -> tuple[int, int]:
    lo = ts[0]
    hi = ts[0]
    for i in range(1, ts.shape[0]):
        t = ts[i]
        if t < lo:
            lo = t
        elif t > hi:
            hi = t
    return lo, hi


def ts_range(ts_ns: I64) -> tuple[int, int]:
    """(min, max) of a non-empty 1-D int64 array in one pass (numpy's min and max take two)."""
    lo, hi = _range_nb(ts_ns)
    return int(lo), int(hi)


def session_day(ts_ns: npt.ArrayLike) -> I32:
    """Session (days since epoch of the day it ends) of each UTC instant; -1 in the halt/weekend.

    A timestamp at or after 17:00 local belongs to the next day's session; one before 16:00 to
    today's; 16:00-17:00 is the daily halt. Sessions end Monday to Friday only. One pass, no
    temporaries beyond the int32 result (see the module docstring).
    """
    ts = np.asarray(ts_ns, dtype=np.int64)
    out = np.empty(ts.shape, dtype=np.int32)
    if ts.size == 0:
        return out
    flat = ts.reshape(-1)
    bounds, days = session_table(*ts_range(flat))
    _session_day_nb(flat, bounds, days, out.reshape(-1))
    return out


def session_bounds_utc(sessions: I32) -> tuple[I64, I64]:
    """UTC open (inclusive) and close (exclusive) instants, in ns, of the given session days."""
    s = np.asarray(sessions, dtype=np.int64)
    open_local = (s - 1) * NS_PER_DAY + SESSION_OPEN_LOCAL_NS
    close_local = s * NS_PER_DAY + SESSION_CLOSE_LOCAL_NS
    return local_to_utc_ns(open_local), local_to_utc_ns(close_local)


def sessions_between(first_day: dt.date, last_day: dt.date) -> I32:
    """Session days (Mon-Fri) ending in [first_day, last_day], as days since epoch."""
    lo = (first_day - dt.date(1970, 1, 1)).days
    hi = (last_day - dt.date(1970, 1, 1)).days
    days = np.arange(lo, hi + 1, dtype=np.int32)
    return days[(days + 3) % 7 < 5]


def session_label(day: int) -> str:
    """``2024-01-02`` for a session day."""
    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat()


def local_time_of_day_ns(ts_ns: I64) -> I64:
    """Chicago wall-clock time of day in ns."""
    local = to_local_ns(np.asarray(ts_ns, dtype=np.int64))
    return local % NS_PER_DAY


# --- quarters -------------------------------------------------------------------------------


def quarter_label(start: dt.date | dt.datetime | str) -> str:
    """``2024-Q1`` for a quarter's first day (date, datetime or ``2024-01``/``2024-01-01``)."""
    if isinstance(start, str):
        start = parse_quarter(start)
    return f"{start.year}-Q{(start.month - 1) // 3 + 1}"


def parse_quarter(text: str) -> dt.date:
    """First day of a quarter from ``2024-Q1``, ``2024q1``, ``2024-01`` or ``2024-01-01``."""
    t = text.strip().upper()
    try:
        if "Q" in t:
            year_s, q_s = t.replace("-", "").split("Q")
            q = int(q_s)
            if not 1 <= q <= 4:
                raise ValueError
            return dt.date(int(year_s), 3 * (q - 1) + 1, 1)
        parts = t.split("-")
        month = int(parts[1])
        if month not in (1, 4, 7, 10):
            raise ValueError
        return dt.date(int(parts[0]), month, 1)
    except (ValueError, IndexError) as exc:
        raise ValueError(f"not a quarter: {text!r} (expected e.g. 2024-Q1)") from exc


def quarter_bounds(first_day: dt.date) -> tuple[dt.date, dt.date]:
    """First and last calendar day of the quarter starting at ``first_day``."""
    nxt = next_quarter(first_day)
    return first_day, nxt - dt.timedelta(days=1)


def next_quarter(first_day: dt.date) -> dt.date:
    m = first_day.month + 3
    return dt.date(first_day.year + (m - 1) // 12, (m - 1) % 12 + 1, 1)


def previous_quarter(first_day: dt.date) -> dt.date:
    m = first_day.month - 3
    return dt.date(first_day.year - (1 if m < 1 else 0), (m - 1) % 12 + 1, 1)


def quarter_range(spec: str) -> list[dt.date]:
    """Quarters of ``2024-Q1:2024-Q4`` (inclusive) or a single ``2024-Q1``."""
    lo_s, _, hi_s = spec.partition(":")
    lo = parse_quarter(lo_s)
    hi = parse_quarter(hi_s) if hi_s else lo
    if hi < lo:
        raise ValueError(f"quarter range {spec!r} ends before it starts")
    out = [lo]
    while out[-1] < hi:
        out.append(next_quarter(out[-1]))
    return out


def quarter_sessions(first_day: dt.date) -> I32:
    """Session days ending inside the quarter."""
    lo, hi = quarter_bounds(first_day)
    return sessions_between(lo, hi)
