"""Roll calendar (fx_assets.core.roll): hand-made volumes and the real multi-instrument fixtures."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import databento
import numpy as np
import pyarrow as pa
import pytest

from fx_assets.core import calendar, dbn, sidecar
from fx_assets.core.dbn import SymbolInterval
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import ROLL_SCHEMA, active_mask, compute_roll_calendar
from fx_assets_tests.conftest import fixtures_dir

FIX = fixtures_dir()
EPOCH = dt.date(1970, 1, 1)

# instrument ids of a hand-made market (2024): H4 expires 2024-03-15, M4 2024-06-21
H4, M4, U4, SPREAD = 101, 102, 103, 900
SYMBOLS = {H4: "ESH4", M4: "ESM4", U4: "ESU4", SPREAD: "ESH4-ESM4"}


def day(d: str) -> int:
    return (dt.date.fromisoformat(d) - EPOCH).days


DAYS = [int(x) for x in calendar.sessions_between(dt.date(2024, 3, 4), dt.date(2024, 3, 15))]  # 10 sessions


def market(volumes: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trades (session, id, size): per id, one list of daily volumes over DAYS, split into 3 trades."""
    s, i, v = [], [], []
    for iid, daily in volumes.items():
        for d, vol in zip(DAYS, daily, strict=True):
            for part in (vol // 3, vol // 3, vol - 2 * (vol // 3)):
                if vol:
                    s.append(d)
                    i.append(iid)
                    v.append(part)
    order = np.argsort(s, kind="stable")
    return (
        np.array(s, np.int32)[order],
        np.array(i, np.uint32)[order],
        np.array(v, np.uint32)[order],
    )


def test_leader_takeover_no_move_back_and_spreads_ignored() -> None:
    k = 4  # M4 out-trades H4 on DAYS[4] -> active from DAYS[5]
    vols = {
        H4: [900, 900, 900, 800, 300, 200, 100, 5000, 50, 10],  # spikes back on DAYS[7]
        M4: [100, 150, 200, 300, 900, 1000, 1100, 1200, 1300, 1400],
        U4: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        SPREAD: [10_000] * 10,  # the largest volume every day, but a spread
    }
    s, i, v = market(vols)
    cal = compute_roll_calendar(s, i, v, SYMBOLS)
    assert cal.session_day.tolist() == DAYS
    want = [H4] * (k + 1) + [M4] * (len(DAYS) - k - 1)
    assert cal.instrument_id.tolist() == want  # DAYS[8] follows DAYS[7]'s H4 spike: no move back
    assert cal.is_roll.tolist() == [j == k + 1 for j in range(len(DAYS))]
    assert [
        (e.session_day, e.from_instrument_id, e.to_instrument_id, e.from_symbol, e.to_symbol)
        for e in cal.events
    ] == [(DAYS[k + 1], H4, M4, "ESH4", "ESM4")]
    assert cal.raw_symbol[0] == "ESH4" and cal.expiry[0] == dt.date(2024, 3, 15)
    assert cal.expiry[-1] == dt.date(2024, 6, 21)
    t = cal.to_arrow()
    assert t.schema.equals(ROLL_SCHEMA)
    assert t.column("expiry").type == pa.date32() and t.num_rows == len(DAYS)
    assert t.column("is_roll").to_pylist() == cal.is_roll.tolist()
    # active_mask keeps exactly the active contract's trades, never spreads / U4
    m = active_mask(s, i, cal)
    active_of_session = dict(zip(DAYS, want, strict=True))
    assert m.tolist() == [int(ii) == active_of_session[int(ss)] for ss, ii in zip(s, i, strict=True)]
    assert not m[i == SPREAD].any() and not m[i == U4].any()


def test_first_session_uses_its_own_volume_and_changes_follow_previous_session() -> None:
    s, i, v = market({H4: [10] + [100] * 9, M4: [20] + [50] * 9})
    cal = compute_roll_calendar(s, i, v, SYMBOLS)
    # day 0: M4 led day 0 itself; day 1 follows day 0 (M4); day 2 follows day 1 (H4 leads)
    # but H4 expires before M4: never backwards, so M4 stays
    assert cal.instrument_id.tolist() == [M4] * len(DAYS)
    assert not cal.is_roll.any() and cal.events == ()


def test_confirm_sessions_and_halt_records_ignored() -> None:
    vols = {
        H4: [900, 900, 900, 100, 900, 100, 100, 100, 100, 100],
        M4: [100, 100, 100, 900, 100, 900, 900, 900, 900, 900],
    }
    s, i, v = market(vols)
    one = compute_roll_calendar(s, i, v, SYMBOLS)
    assert one.instrument_id.tolist() == [H4] * 4 + [M4] * 6
    two = compute_roll_calendar(s, i, v, SYMBOLS, confirm_sessions=2)
    # M4 leads DAYS[3] only once (H4 back on DAYS[4]); from DAYS[5], DAYS[6] on it has led twice
    assert two.instrument_id.tolist() == [H4] * 7 + [M4] * 3
    assert [e.session_day for e in two.events] == [DAYS[7]]
    # records in the halt (session -1) do not count
    s2 = np.concatenate([s, np.full(5, -1, np.int32)])
    i2 = np.concatenate([i, np.full(5, U4, np.uint32)])
    v2 = np.concatenate([v, np.full(5, 10**6, np.uint32)])
    assert compute_roll_calendar(s2, i2, v2, SYMBOLS).instrument_id.tolist() == one.instrument_id.tolist()


def test_unknown_ids_and_symbol_intervals() -> None:
    """Ids missing from the map are outrights of unknown expiry; intervals pick the session's symbol."""
    s, i, v = market({H4: [100] * 10, 555: [1] * 5 + [1000] * 5})
    cal = compute_roll_calendar(s, i, v, SYMBOLS)
    assert cal.instrument_id.tolist() == [H4] * 6 + [555] * 4
    assert cal.raw_symbol[-1] is None and cal.expiry[-1] is None
    # an id reused for another symbol later: intervals decide per session
    mid = EPOCH + dt.timedelta(days=DAYS[5])
    intervals = [
        SymbolInterval("ESH4", 7, dt.date(2024, 1, 1), mid),
        SymbolInterval("ESH4-ESM4", 7, mid, dt.date(2024, 12, 31)),
        SymbolInterval("ESM4", 8, dt.date(2024, 1, 1), dt.date(2024, 12, 31)),
    ]
    s, i, v = market({7: [100] * 10, 8: [10] * 10})
    cal = compute_roll_calendar(s, i, v, intervals)
    # from DAYS[5] on id 7 names a spread: it can no longer be active, 8 takes over at once
    assert cal.instrument_id.tolist() == [7] * 5 + [8] * 5
    assert cal.raw_symbol == ("ESH4",) * 5 + ("ESM4",) * 5
    assert [e.session_day for e in cal.events] == [DAYS[5]]


def test_expired_active_contract_is_replaced() -> None:
    """H4 expires 2024-03-15 (the last of DAYS); a session after that cannot keep it active."""
    later = [*DAYS, day("2024-03-18")]
    s = np.array(later + later, np.int32)
    i = np.array([H4] * len(later) + [M4] * len(later), np.uint32)
    v = np.array([100] * len(later) + [1] * len(later), np.uint32)
    cal = compute_roll_calendar(s, i, v, SYMBOLS)
    assert cal.instrument_id.tolist() == [H4] * len(DAYS) + [M4]
    assert cal.is_roll.tolist() == [False] * len(DAYS) + [True]


def test_sliced_passes_give_the_same_calendar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Volumes are accumulated over bounded slices; tiny slices (and unknown ids) change nothing."""
    import fx_assets.core.roll as roll

    vols = {
        H4: [900, 900, 900, 800, 300, 200, 100, 5000, 50, 10],
        M4: [100, 150, 200, 300, 900, 1000, 1100, 1200, 1300, 1400],
        555: [3] * 10,
    }
    s, i, v = market(vols)
    whole = compute_roll_calendar(s, i, v, SYMBOLS)
    monkeypatch.setattr(roll, "_SLICE", 7)
    sliced = compute_roll_calendar(s, i, v, SYMBOLS)
    assert sliced.instrument_id.tolist() == whole.instrument_id.tolist() == [H4] * 5 + [M4] * 5
    assert sliced.events == whole.events


def test_empty_and_bad_input() -> None:
    cal = compute_roll_calendar(
        np.zeros(0, np.int32), np.zeros(0, np.uint32), np.zeros(0, np.uint32), SYMBOLS
    )
    assert len(cal) == 0 and cal.to_arrow().schema.equals(ROLL_SCHEMA)
    assert active_mask(np.array([DAYS[0]], np.int32), np.array([H4], np.uint32), cal).tolist() == [False]
    with pytest.raises(FxDataError, match="one length"):
        compute_roll_calendar(np.zeros(2, np.int32), np.zeros(3, np.uint32), np.zeros(2, np.uint32), SYMBOLS)
    with pytest.raises(FxDataError, match="size"):
        compute_roll_calendar(np.zeros(1, np.int32), np.zeros(1, np.uint32), np.array([-1]), SYMBOLS)
    with pytest.raises(FxDataError, match="lengths differ"):
        active_mask(np.zeros(2, np.int32), np.zeros(1, np.uint32), cal)


def test_futspread_symbology_outrights_and_spreads() -> None:
    h = dbn.read_header(FIX / "nautilus_trader" / "definition-glbx-es-futspread.dbn.zst")
    raw = {m.raw_symbol for m in h.mappings}
    spreads = {r for r in raw if "-" in r}
    outrights = raw - spreads
    assert (len(raw), len(outrights), len(spreads)) == (41, 21, 20)
    assert "ESM4-ESU4" in spreads
    # one volume-less trade per instrument: only outrights can become active, the earliest
    # expiry wins the tie, and every outright's expiry is a third Friday after the file date
    ids = np.array(sorted({m.instrument_id for m in h.mappings}), np.uint32)
    sess = np.full(len(ids), day("2023-08-01"), np.int32)
    cal = compute_roll_calendar(sess, ids, np.ones(len(ids), np.uint32), list(h.mappings))
    assert cal.raw_symbol == ("ESU3",) and cal.expiry == (dt.date(2023, 9, 15),)
    from fx_assets.core.roll import _expiry

    for sym in outrights:
        e = _expiry(sym, day("2023-08-01"))
        assert e is not None and e.weekday() == 4 and 15 <= e.day <= 21 and e >= dt.date(2023, 8, 1), sym
    assert all(_expiry(sym, day("2023-08-01")) is None for sym in spreads)


def test_futures_settlement_fixture() -> None:
    """ESZ5 + ESH6 on the ESZ5 expiry day (bbo-1m): symbology from the file, volume from `size`."""
    p = (
        FIX
        / "nautilus_trader/futures_settlement/futures_settlement_bbo-1m_2025-12-19T14-25-00_2025-12-19T14-35-00.dbn.zst"
    )
    recs = databento.DBNStore.from_file(p).to_ndarray()
    h = dbn.read_header(p)
    assert {(m.raw_symbol, m.instrument_id) for m in h.mappings} == {("ESZ5", 294973), ("ESH6", 42140878)}
    sess = calendar.session_day(recs["ts_recv"].astype(np.int64))
    assert set(sess.tolist()) == {day("2025-12-19")}
    cal = compute_roll_calendar(sess, recs["instrument_id"], recs["size"], list(h.mappings))
    vol = {
        int(i): int(recs["size"][recs["instrument_id"] == i].sum()) for i in np.unique(recs["instrument_id"])
    }
    leader = max(vol, key=lambda k: vol[k])
    assert leader == 42140878  # ESH6 out-trades the expiring ESZ5 on its last day
    assert cal.instrument_id.tolist() == [leader] and cal.raw_symbol == ("ESH6",)
    assert cal.expiry == (dt.date(2026, 3, 20),)
    assert active_mask(sess, recs["instrument_id"], cal).sum() == (recs["instrument_id"] == leader).sum()


def test_from_real_trades_sidecar(tmp_path: Path) -> None:
    """The ESU4 trades fixture through its sidecar: one session, ESU4, expiry 2024-09-20."""
    p = (
        FIX
        / "nautilus_trader/historical_bars_catalog/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
    )
    info = sidecar.build_sidecar(p, tmp_path / "t.arrow")
    cols = sidecar.sidecar_columns(info.path, ["ts_recv", "instrument_id", "size"])
    sess = calendar.session_day(cols["ts_recv"])
    cal = compute_roll_calendar(sess, cols["instrument_id"], cols["size"], sidecar.read_symbol_map(info.path))
    assert cal.session_day.tolist() == [day("2024-07-02")]
    assert (
        cal.raw_symbol == ("ESU4",)
        and cal.expiry == (dt.date(2024, 9, 20),)
        and cal.instrument_id.tolist() == [118]
    )
    assert active_mask(sess, cols["instrument_id"], cal).all()


def _trades_file(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    """A trades DBN (fixture header: ESH1 = 5482) with (UTC time, instrument id, size) rows."""
    from fx_assets_tests.core.test_dbn import TRADES_V1, write_dbn

    recs = np.zeros(len(rows), dtype=dbn.TRADES_DTYPE)
    recs["length"], recs["rtype"], recs["publisher_id"] = 12, 0, 1
    for k, (ts, iid, size) in enumerate(rows):
        ns = int(dt.datetime.fromisoformat(ts).replace(tzinfo=dt.UTC).timestamp()) * 10**9
        recs[k]["ts_recv"] = recs[k]["ts_event"] = ns
        recs[k]["instrument_id"], recs[k]["size"] = iid, size
    return write_dbn(path, dbn.read_header(TRADES_V1).header_bytes, recs, zstd=True)


def test_roll_calendar_from_sidecars_seeds_from_previous_quarter(tmp_path: Path) -> None:
    from fx_assets.core.roll import roll_calendar_from_sidecars

    other = 999  # not in the fixture's symbology: outright of unknown expiry
    prev = _trades_file(
        tmp_path / "prev.dbn.zst",
        [("2020-12-24T14:00", 5482, 5), ("2020-12-28T14:00", other, 50), ("2020-12-28T15:00", 5482, 10)],
    )
    cur = _trades_file(
        tmp_path / "cur.dbn.zst",
        [("2020-12-29T14:00", 5482, 30), ("2020-12-29T15:00", other, 20), ("2020-12-30T14:00", 5482, 1)],
    )
    p_info = sidecar.build_sidecar(prev, tmp_path / "prev.arrow")
    c_info = sidecar.build_sidecar(cur, tmp_path / "cur.arrow")
    alone = roll_calendar_from_sidecars(c_info.path)
    assert alone.session_day.tolist() == [day("2020-12-29"), day("2020-12-30")]
    assert alone.instrument_id.tolist() == [5482, 5482] and alone.raw_symbol == ("ESH1", "ESH1")
    seeded = roll_calendar_from_sidecars(c_info.path, p_info.path)
    # 12-28 (the previous quarter's last session) was led by 999 -> active on 12-29; 12-29 led
    # by ESH1 -> roll on 12-30 (999's expiry is unknown, so no never-backwards veto)
    assert seeded.session_day.tolist() == alone.session_day.tolist()
    assert seeded.instrument_id.tolist() == [other, 5482]
    assert seeded.is_roll.tolist() == [False, True] and seeded.n_sessions == 2
    assert [(e.session_day, e.from_instrument_id, e.to_instrument_id) for e in seeded.rolls] == [
        (day("2020-12-30"), other, 5482)
    ]
    assert seeded.to_arrow().schema.equals(ROLL_SCHEMA)


@pytest.mark.parametrize("ordered", [True, False])
def test_last_session_of_previous_quarter_from_its_tail(tmp_path: Path, ordered: bool) -> None:
    """The previous quarter's last session before ``before``, read from the tail of its sidecar,
    equals that session's rows of the full scan: after a three-week gap (the tail window has to
    widen), with trades of that session on both sides of midnight UTC, and for a sidecar out of
    time order (full scan)."""
    from fx_assets.core.roll import _last_session_volume, _sidecar_session_volume

    rows = [
        ("2020-11-02T14:00", 5482, 7),
        ("2020-11-30T23:30", 5482, 2),  # 17:30 Chicago: session 12-01
        ("2020-12-01T03:00", 999, 4),
        ("2020-12-01T14:00", 5482, 3),
        ("2020-12-01T15:00", 999, 9),
        ("2020-12-24T14:00", 5482, 5),
    ]
    if not ordered:
        rows = [rows[1], rows[0], *rows[2:]]
    info = sidecar.build_sidecar(_trades_file(tmp_path / "p.dbn.zst", rows), tmp_path / "p.arrow")
    ids = np.array([999, 5482], dtype=np.int64)
    full = _sidecar_session_volume(info.path, ids)
    for before in ("2020-11-02", "2020-11-03", "2020-12-01", "2020-12-02", "2020-12-24", "2020-12-28"):
        got = _last_session_volume(info.path, ids, day(before))
        if not ordered:
            assert got is None
            continue
        assert got is not None
        earlier = full[0][full[0] < day(before)]
        take = full[0] == (int(earlier.max()) if earlier.size else -2)
        for g, w in zip(got, full, strict=True):
            assert g.tolist() == w[take].tolist(), before


@pytest.mark.parametrize("threads", [1, 2])
def test_session_volume_of_records_outside_the_first_and_last_records_years(
    tmp_path: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass takes its session table from the first and last records' years; a record of
    another year in between (a file out of time order) is still counted in its session."""
    from fx_assets.core import roll

    monkeypatch.setattr(roll, "_MIN_TRADES_PER_THREAD", 1)
    monkeypatch.setattr(roll.numba, "get_num_threads", lambda: threads)
    rows = [
        ("2020-12-01T14:00", 5482, 3),
        ("2019-11-05T14:00", 5482, 4),
        ("2021-01-05T14:00", 999, 6),
        ("2020-12-02T14:00", 999, 5),
    ]
    info = sidecar.build_sidecar(_trades_file(tmp_path / "y.dbn.zst", rows), tmp_path / "y.arrow")
    sess, iid, vol = roll._sidecar_session_volume(info.path, np.array([999, 5482], dtype=np.int64))
    got = sorted(zip(sess.tolist(), iid.tolist(), vol.tolist(), strict=True))
    want = sorted((day(ts[:10]), i, float(v)) for ts, i, v in rows)
    assert got == want


def test_is_sorted_blocks_match_pairwise_check() -> None:
    """``_is_sorted_nb`` (block-wise) and ``_is_sorted`` (threads) say what a pairwise NumPy check
    says: sorted series with ties, and one decrease planted at and around the block edges, at
    both ends, and between the threads' chunks."""
    from fx_assets.core import roll

    rng = np.random.default_rng(2)
    block = roll._SORTED_BLOCK
    for n in (0, 1, 2, block - 1, block, block + 1, 3 * block + 17, (1 << 21) + 5):
        base = np.cumsum(rng.integers(0, 3, n)).astype(np.int64)  # ties included
        assert roll._is_sorted_nb(base) and roll._is_sorted(base)
        spots = {1, n - 1, n // 2, block - 1, block, block + 1, 2 * block, n // 2 + 1}
        for i in sorted(j for j in spots if 0 < j < n):
            ts = base.copy()
            ts[i] = ts[i - 1] - 1  # one decrease, at pair (i - 1, i)
            want = bool(np.all(ts[1:] >= ts[:-1]))
            assert not want
            assert roll._is_sorted_nb(ts) is want and roll._is_sorted(ts) is want, (n, i)
