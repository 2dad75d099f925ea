import datetime as dt

import numpy as np
import pytest

from fx_assets.core import calendar as cal


def ns(text: str) -> int:
    return int(np.datetime64(text, "ns").astype(np.int64))


@pytest.mark.parametrize(
    ("utc", "session"),
    [
        ("2024-03-08T21:30:00", "2024-03-08"),  # Fri 15:30 CST: Friday's session
        ("2024-03-08T22:30:00", None),  # Fri 16:30 CST: halt
        ("2024-03-09T12:00:00", None),  # Saturday
        ("2024-03-10T06:59:59", None),  # Sunday 00:59 CST
        ("2024-03-10T22:30:00", "2024-03-11"),  # Sun 17:30 CDT (after the DST switch): Monday
        ("2024-03-11T21:30:00", None),  # Mon 16:30 CDT: halt
        ("2024-03-11T22:00:00", "2024-03-12"),  # Mon 17:00 CDT: Tuesday's session opens
        ("2024-11-04T22:59:59", None),  # Mon 16:59:59 CST (after fall-back): halt
        ("2024-11-04T23:00:00", "2024-11-05"),
    ],
)
def test_session_day_across_dst(utc: str, session: str | None) -> None:
    got = int(cal.session_day(np.array([ns(utc)]))[0])
    assert (cal.session_label(got) if got >= 0 else None) == session


def test_session_bounds_round_trip() -> None:
    days = cal.sessions_between(dt.date(2024, 1, 1), dt.date(2024, 12, 31))
    assert len(days) == 262  # Mon-Fri of 2024, holidays not modelled
    opens, closes = cal.session_bounds_utc(days)
    assert np.all(closes - opens == 23 * cal.NS_PER_HOUR)
    assert np.array_equal(cal.session_day(opens), days)
    assert np.array_equal(cal.session_day(closes - 1), days)
    assert np.all(cal.session_day(closes) == -1)


def test_quarters() -> None:
    assert cal.parse_quarter("2024-Q3") == dt.date(2024, 7, 1)
    assert cal.parse_quarter("2024q3") == dt.date(2024, 7, 1)
    assert cal.parse_quarter("2024-07") == dt.date(2024, 7, 1)
    assert cal.quarter_label(dt.date(2024, 10, 1)) == "2024-Q4"
    assert cal.next_quarter(dt.date(2024, 10, 1)) == dt.date(2025, 1, 1)
    assert cal.previous_quarter(dt.date(2024, 1, 1)) == dt.date(2023, 10, 1)
    assert [cal.quarter_label(q) for q in cal.quarter_range("2024-Q3:2025-Q2")] == [
        "2024-Q3",
        "2024-Q4",
        "2025-Q1",
        "2025-Q2",
    ]
    for bad in ("2024-Q5", "2024-02", "nonsense"):
        with pytest.raises(ValueError, match="not a quarter"):
            cal.parse_quarter(bad)
    with pytest.raises(ValueError, match="ends before"):
        cal.quarter_range("2024-Q3:2024-Q1")


def _around_boundaries(days: np.ndarray) -> np.ndarray:
    """Every session open and close, and the instants 1 ns either side of each."""
    opens, closes = cal.session_bounds_utc(days)
    edges = np.concatenate([opens, closes])
    return np.concatenate([edges - 1, edges, edges + 1])


@pytest.mark.parametrize("seed", [0, 1])
def test_session_day_equals_the_local_time_definition(seed: int) -> None:
    """The boundary-table lookup gives the local-wall-clock definition on random instants over
    several years (DST changes both ways, halts, weekends, New Year), on the exact session edges
    and 1 ns either side, on the DST switch instants, sorted or not, in any shape."""
    rng = np.random.default_rng(seed)
    lo, hi = ns("2019-12-25T00:00:00"), ns("2025-01-06T00:00:00")
    uniform = rng.integers(lo, hi, 400_000)
    # Dense around the DST changes (2nd Sunday of March, 1st Sunday of November) and the
    # Friday close / Sunday open of those weekends.
    starts, _ = cal._offset_table(2019, 2025)
    near_dst = (
        starts[:, None] + rng.integers(-3 * cal.NS_PER_DAY, 3 * cal.NS_PER_DAY, (starts.size, 2000))
    ).ravel()
    days = cal.sessions_between(dt.date(2019, 12, 20), dt.date(2025, 1, 10))
    edges = _around_boundaries(days)
    ts = np.concatenate([uniform, near_dst, edges, starts, starts - 1])
    expected = cal._session_day_local(ts)
    assert np.array_equal(cal.session_day(ts), expected)  # unsorted
    order = np.argsort(ts, kind="stable")
    assert np.array_equal(cal.session_day(ts[order]), expected[order])  # sorted: the fast path
    assert np.array_equal(cal.session_day(ts[: 1000 * 6].reshape(1000, 6)), expected[:6000].reshape(1000, 6))
    # the data spans halts, weekends and sessions
    assert (expected == -1).mean() > 0.2 and len(np.unique(expected)) > 1000
    assert cal.session_day(np.array([], dtype=np.int64)).shape == (0,)
    assert cal.session_day(np.array([], dtype=np.int64)).dtype == np.int32


def test_session_table_is_the_sessions_in_order() -> None:
    bounds, days = cal.session_table(ns("2024-03-01T00:00:00"), ns("2024-03-31T00:00:00"))
    assert bounds.shape == (2 * days.shape[0],)
    assert np.all(np.diff(bounds) > 0)
    opens, closes = cal.session_bounds_utc(days)
    assert np.array_equal(bounds[0::2], opens) and np.array_equal(bounds[1::2], closes)
    k = np.searchsorted(bounds, ns("2024-03-11T12:00:00"), side="right")
    assert k % 2 == 1 and cal.session_label(int(days[(k - 1) // 2])) == "2024-03-11"
