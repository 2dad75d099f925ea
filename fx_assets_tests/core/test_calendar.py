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
