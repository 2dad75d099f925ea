"""Tests of the synthetic ES market (fx_assets.core.synth): genuine DBN, determinism, quarter
independence and continuity, every realism property of docs/synthetic-market.md, book/trade
consistency, spreads and symbology, and the planted signal versus the null market."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import warnings
from pathlib import Path

import databento as db
import numpy as np
import pytest
import zstandard

from fx_assets.core import calendar
from fx_assets.core.contracts import is_spread
from fx_assets.core.errors import FxDataError
from fx_assets.core.synth import SynthConfig, generate_market, iter_quarter_records, market, nb
from fx_assets.core.synth.dbn_writer import MBP10_DTYPE, TRADE_DTYPE

Q1 = dt.date(2024, 1, 1)
Q2 = dt.date(2024, 4, 1)
Q3 = dt.date(2024, 7, 1)
TICK = 250_000_000


def _store(path: Path) -> db.DBNStore:
    return db.DBNStore.from_file(path)


def _paths(root: Path, q: dt.date, symbol: str = "ES.FUT") -> tuple[Path, Path]:
    label = calendar.quarter_label(q)
    return (
        root / "raw" / "trades" / symbol / f"{symbol}_{label}.dbn.zst",
        root / "raw" / "mbp-10" / symbol / f"{symbol}_{label}.dbn.zst",
    )


def _ids(store: db.DBNStore) -> dict[str, int]:
    return {k: int(v[0]["symbol"]) for k, v in store.metadata.mappings.items()}


def _local_tod(ts: np.ndarray) -> np.ndarray:
    return calendar.local_time_of_day_ns(ts.astype(np.int64))


def _is_rth(ts: np.ndarray) -> np.ndarray:
    tod = _local_tod(ts)
    return (tod >= calendar.RTH_OPEN_LOCAL_NS) & (tod < calendar.RTH_CLOSE_LOCAL_NS)


@pytest.fixture(scope="module")
def mkt(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One quarter (2024-Q1, spans the March DST change and the H->M roll) at a tiny scale,
    with every outright trade in the book feed."""
    root = tmp_path_factory.mktemp("synth_q1")
    cfg = SynthConfig(quarters=(Q1,), scale=0.004, seed=7, signal=0.0, book_ratio=2.5)
    report = generate_market(root, cfg)
    tp, bp = _paths(root, Q1)
    ts, bs = _store(tp), _store(bp)
    return {
        "root": root,
        "cfg": cfg,
        "report": report,
        "tstore": ts,
        "bstore": bs,
        "t": ts.to_ndarray(),
        "b": bs.to_ndarray(),
        "ids": _ids(ts),
    }


# --- genuine DBN ---------------------------------------------------------------------------------


def _raw_records(path: Path, dtype: np.dtype) -> np.ndarray:
    with open(path, "rb") as fh:
        raw = zstandard.ZstdDecompressor().stream_reader(fh).read()
    assert raw[:3] == b"DBN"
    md_len = int.from_bytes(raw[4:8], "little")
    return np.frombuffer(raw[8 + md_len :], dtype=dtype)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("test_data.trades.dbn.zst", TRADE_DTYPE), ("test_data.mbp-10.dbn.zst", MBP10_DTYPE)],
)
def test_dtype_matches_real_fixture(dbn_fixtures: Path, name: str, dtype: np.dtype) -> None:
    path = dbn_fixtures / "databento-python" / "GLBX.MDP3" / name
    mine = _raw_records(path, dtype)
    ref = _store(path).to_ndarray()
    assert len(mine) == len(ref) == 4
    assert list(mine.dtype.names or ()) == list(ref.dtype.names or ())
    for f in ref.dtype.names or ():
        np.testing.assert_array_equal(mine[f], ref[f], err_msg=f)


def test_metadata_layout(mkt: dict) -> None:
    for store, schema in ((mkt["tstore"], "trades"), (mkt["bstore"], "mbp-10")):
        md = store.metadata
        assert md.version in (2, 3)
        assert md.dataset == "GLBX.MDP3"
        assert str(md.schema) == schema
        assert str(md.stype_in) == "parent" and str(md.stype_out) == "instrument_id"
        assert md.symbols == ["ES.FUT"]
        sessions = calendar.quarter_sessions(Q1)
        o, c = calendar.session_bounds_utc(sessions)
        assert md.start == int(o[0]) and md.end == int(c[-1])
    tmap = mkt["tstore"].metadata.mappings
    assert set(tmap) == {"ESH4", "ESM4", "ESH4-ESM4", "ESM4-ESU4"}
    assert tmap["ESH4"][0]["end_date"] == dt.date(2024, 3, 16)  # expiry + 1, end exclusive
    assert tmap["ESM4"][0]["start_date"] == dt.date(2023, 12, 31)  # first session opens Sunday
    assert tmap["ESM4"][0]["end_date"] == dt.date(2024, 3, 30)
    assert set(mkt["bstore"].metadata.mappings) == {"ESH4", "ESM4"}  # no spreads in the book
    # Every instrument in the files is mapped.
    assert set(np.unique(mkt["t"]["instrument_id"])) <= set(mkt["ids"].values())
    assert set(np.unique(mkt["b"]["instrument_id"])) <= {mkt["ids"]["ESH4"], mkt["ids"]["ESM4"]}


def test_databento_reads_back_every_field(tmp_path: Path) -> None:
    cfg = SynthConfig(quarters=(Q2,), scale=0.0015, seed=3, signal=0.5, book_ratio=0.4)
    generate_market(tmp_path, cfg)
    plan, sessions = iter_quarter_records(cfg, "ES.FUT", Q2)
    trades: list[np.ndarray] = []
    book: list[np.ndarray] = []
    for sr in sessions:
        trades.append(sr.trades)
        book.extend(sr.book_chunks)
    mem_t, mem_b = np.concatenate(trades), np.concatenate(book)
    tp, bp = _paths(tmp_path, Q2)
    for path, mem in ((tp, mem_t), (bp, mem_b)):
        store = _store(path)
        arr = store.to_ndarray()
        assert arr.dtype.itemsize == mem.dtype.itemsize
        assert len(arr) == len(mem) > 0
        for f in mem.dtype.names or ():
            np.testing.assert_array_equal(arr[f], mem[f], err_msg=f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = store.to_df(pretty_ts=False, price_type="fixed", map_symbols=True)
        np.testing.assert_array_equal(df["price"].to_numpy(), mem["price"])
        np.testing.assert_array_equal(df["size"].to_numpy(), mem["size"])
        np.testing.assert_array_equal(df["side"].to_numpy().astype("S1"), mem["side"])
        np.testing.assert_array_equal(df["action"].to_numpy().astype("S1"), mem["action"])
        np.testing.assert_array_equal(df.index.to_numpy().astype(np.uint64), mem["ts_recv"])
        inv = {v: k for k, v in _ids(store).items()}
        assert list(df["symbol"]) == [inv[int(i)] for i in mem["instrument_id"]]
    assert (mem_t["length"] == 12).all() and (mem_t["rtype"] == 0).all()
    assert (mem_b["length"] == 92).all() and (mem_b["rtype"] == 10).all()
    assert (mem_t["publisher_id"] == 1).all() and (mem_b["publisher_id"] == 1).all()
    assert plan.sessions.size == calendar.quarter_sessions(Q2).size


# --- determinism, quarter independence, continuity ------------------------------------------


def test_determinism_same_seed_identical_bytes(tmp_path: Path) -> None:
    cfg = SynthConfig(quarters=(Q1,), scale=0.001, seed=11, signal=1.0, book_ratio=0.5)
    generate_market(tmp_path / "a", cfg)
    generate_market(tmp_path / "b", cfg)
    generate_market(
        tmp_path / "c", SynthConfig(quarters=(Q1,), scale=0.001, seed=12, signal=1.0, book_ratio=0.5)
    )
    for pa, pb, pc in zip(
        _paths(tmp_path / "a", Q1), _paths(tmp_path / "b", Q1), _paths(tmp_path / "c", Q1), strict=True
    ):
        assert pa.read_bytes() == pb.read_bytes()
        assert pa.read_bytes() != pc.read_bytes()


def test_quarter_independence_and_continuity(tmp_path: Path) -> None:
    quarters = tuple(calendar.quarter_range("2024-Q1:2024-Q4"))
    cfg_all = SynthConfig(quarters=quarters, scale=0.001, seed=5, signal=1.0, book_ratio=0.2)
    cfg_one = SynthConfig(quarters=(Q3,), scale=0.001, seed=5, signal=1.0, book_ratio=0.2)
    generate_market(tmp_path / "all", cfg_all)
    generate_market(tmp_path / "one", cfg_one)
    for pa, po in zip(_paths(tmp_path / "all", Q3), _paths(tmp_path / "one", Q3), strict=True):
        assert pa.read_bytes() == po.read_bytes()
    # Continuity: the contract that is front at the end of quarter k (its "next" contract) is the
    # expiring contract of quarter k+1; its last price in k and first price in k+1 are close.
    for qa, qb in itertools.pairwise(quarters):
        plan_a = market.plan_quarter(5, "ES.FUT", qa)
        plan_b = market.plan_quarter(5, "ES.FUT", qb)
        assert plan_b.y0 == plan_a.closes[-1]  # the skeleton's open of k+1 is the close of k, exactly
        assert plan_a.y.raw_symbol == plan_b.x.raw_symbol
        ta = _store(_paths(tmp_path / "all", qa)[0]).to_ndarray()
        tb = _store(_paths(tmp_path / "all", qb)[0]).to_ndarray()
        iid = plan_a.ids[1]
        last = ta["price"][ta["instrument_id"] == iid][-1] / 1e9
        first = tb["price"][tb["instrument_id"] == iid][0] / 1e9
        assert abs(np.log(first / last)) < 0.006, (qa, last, first)


# --- calendar and sessions -----------------------------------------------------------------------


def test_sessions_halt_weekends_and_dst(mkt: dict) -> None:
    t, b = mkt["t"], mkt["b"]
    for arr in (t, b):
        sess = calendar.session_day(arr["ts_recv"].astype(np.int64))
        assert (sess >= 0).all()  # nothing in the daily halt or the weekend
        tod = _local_tod(arr["ts_recv"])
        assert not ((tod >= calendar.SESSION_CLOSE_LOCAL_NS) & (tod < calendar.SESSION_OPEN_LOCAL_NS)).any()
    sess = calendar.session_day(t["ts_recv"].astype(np.int64))
    np.testing.assert_array_equal(np.unique(sess), calendar.quarter_sessions(Q1))
    # DST (2024-03-10): activity follows Chicago wall-clock time on both sides of the change. The
    # RTH open burst sits at 08:30-09:30 local (not an hour off, as a UTC-based profile would).
    dst_day = (dt.date(2024, 3, 10) - dt.date(1970, 1, 1)).days
    tod = _local_tod(t["ts_recv"])
    h = calendar.NS_PER_HOUR
    for part in (sess < dst_day, sess > dst_day):
        open_hour = t["size"][part & (tod >= 8 * h + h // 2) & (tod < 9 * h + h // 2)].sum()
        hour_before = t["size"][part & (tod >= 7 * h + h // 2) & (tod < 8 * h + h // 2)].sum()
        assert open_hour > 3 * hour_before
    assert mkt["report"].quarters[0].n_sessions == calendar.quarter_sessions(Q1).size


def test_session_edges_stay_inside_the_session() -> None:
    """Latency never pushes a record past 16:00 into the halt (dense trading at the close)."""
    plan = market.plan_quarter(0, "ES.FUT", Q1)
    res = market.simulate_session(
        plan, 3, seed=0, scale=0.3, signal=0.0, book_ratio=2.0, d_start=0.0, seq_start=0
    )
    o, c = int(plan.open_ns[3]), int(plan.close_ns[3])
    for ts in (res.trades.ts_recv, res.trades.ts_event, res.book.ev_ts_recv, res.book.ev_ts_event):
        assert ts.min() >= o and ts.max() < c
        assert (calendar.session_day(ts) == plan.sessions[3]).all()
    last_min = res.trades.ts_event >= c - calendar.NS_PER_MINUTE
    assert last_min.sum() > 0  # trading runs up to the close


def test_u_shape_and_overnight_share(mkt: dict) -> None:
    t = mkt["t"]
    rth = _is_rth(t["ts_recv"])
    overnight = 1.0 - t["size"][rth].sum() / t["size"].sum()
    assert 0.10 <= overnight <= 0.20
    tod = _local_tod(t["ts_recv"][rth])
    bucket = (tod - calendar.RTH_OPEN_LOCAL_NS) // (30 * calendar.NS_PER_MINUTE)
    vol = np.bincount(bucket, weights=t["size"][rth].astype(float))
    mid = vol[5:9].mean()
    assert vol[0] > 2 * mid and vol[-2] > 1.8 * mid  # high at the open and into the close
    # Overnight per-minute activity is far below RTH.
    assert overnight / (1 - overnight) < 0.3 * (1380 - 405) / 405


# --- prices, vol, sizes, sides --------------------------------------------------------------------


def _front_minutes(t: np.ndarray, ids: dict[str, int]) -> dict[int, np.ndarray]:
    """Per session, the front outright's trades (most volume in that session)."""
    out = {}
    sess = calendar.session_day(t["ts_recv"].astype(np.int64))
    outr = np.isin(t["instrument_id"], [ids["ESH4"], ids["ESM4"]])
    for s in np.unique(sess):
        sel = (sess == s) & outr
        iid = np.bincount(t["instrument_id"][sel].astype(np.int64)).argmax()
        out[int(s)] = t[sel & (t["instrument_id"] == iid)]
    return out


def test_ticks_levels_volatility_and_clustering(mkt: dict) -> None:
    t, b, ids = mkt["t"], mkt["b"], mkt["ids"]
    assert (t["price"] % TICK == 0).all()
    for k in range(10):
        assert (b[f"bid_px_{k:02d}"] % TICK == 0).all() and (b[f"ask_px_{k:02d}"] % TICK == 0).all()
    outr = ~np.isin(t["instrument_id"], [ids["ESH4-ESM4"], ids["ESM4-ESU4"]])
    px = t["price"][outr] / 1e9
    assert 4000 <= px.min() and px.max() <= 6000
    front = _front_minutes(t, ids)
    rets, rv = [], []
    for tr in front.values():
        p = tr["price"] / 1e9
        rets.append(np.log(p[-1] / p[0]))
        # Realised variance from ~5-minute sampled mid proxies (trade price less half-tick bounce).
        mid = p - np.where(tr["side"] == b"B", 0.125, -0.125)
        w = (tr["ts_recv"].astype(np.int64) - int(tr["ts_recv"][0])) // (300 * calendar.NS_PER_SECOND)
        last = np.full(int(w[-1]) + 1, np.nan)
        last[w] = mid
        last = last[~np.isnan(last)]
        rv.append(np.sum(np.diff(np.log(last)) ** 2))
    r = np.asarray(rets)
    assert 0.004 < r.std() < 0.02  # daily vol around 1%
    lrv = np.log(np.asarray(rv))
    assert np.corrcoef(lrv[:-1], lrv[1:])[0, 1] > 0.3  # volatility clustering


def test_trade_sizes_and_sides(mkt: dict) -> None:
    t = mkt["t"]
    s = t["size"].astype(np.int64)
    assert s.min() >= 1
    assert np.median(s) <= 2 and (s <= 5).mean() > 0.85
    assert 1.5 < s.mean() < 6
    assert s.max() >= 100  # occasional hundreds
    assert set(np.unique(t["side"])) == {b"A", b"B"}
    assert 0.4 < (t["side"] == b"B").mean() < 0.6
    assert (t["action"] == b"T").all()


def test_timestamps(mkt: dict) -> None:
    for arr in (mkt["t"], mkt["b"]):
        recv = arr["ts_recv"].astype(np.int64)
        ev = arr["ts_event"].astype(np.int64)
        assert (np.diff(recv) >= 0).all()
        lat = recv - ev
        assert (lat >= 0).all() and np.median(lat) < 1_000_000 and lat.max() < 50_000_000
        assert (arr["ts_in_delta"] > 0).all() and (arr["ts_in_delta"] < 100_000).all()
        assert (np.diff(arr["sequence"].astype(np.int64)) >= 0).all()


# --- contracts, roll, spreads ----------------------------------------------------------------------


def test_roll_volume_migration(mkt: dict) -> None:
    t, ids = mkt["t"], mkt["ids"]
    sess = calendar.session_day(t["ts_recv"].astype(np.int64))
    days = calendar.quarter_sessions(Q1)
    roll = int(np.searchsorted(days, (dt.date(2024, 3, 7) - dt.date(1970, 1, 1)).days))
    expiry = int(np.searchsorted(days, (dt.date(2024, 3, 15) - dt.date(1970, 1, 1)).days))
    share_y, n_x = [], []
    for d in days:
        sel = sess == d
        vx = t["size"][sel & (t["instrument_id"] == ids["ESH4"])].sum()
        vy = t["size"][sel & (t["instrument_id"] == ids["ESM4"])].sum()
        share_y.append(vy / max(vx + vy, 1))
        n_x.append(int((sel & (t["instrument_id"] == ids["ESH4"])).sum()))
    share = np.asarray(share_y)
    assert share[: roll - 3].mean() < 0.08  # a few percent before the roll
    assert share[roll - 2] < 0.3 and share[roll + 2] > 0.85  # migrates over 2-3 sessions
    assert share[roll + 3 : expiry + 1].mean() > 0.9
    assert sum(n_x[roll + 3 : expiry + 1]) > 0  # the old contract trades thinly to expiry
    assert sum(n_x[expiry + 1 :]) == 0  # ... and not after
    x_trades = t[t["instrument_id"] == ids["ESH4"]]
    assert calendar.session_day(x_trades["ts_recv"][-1:].astype(np.int64))[0] >= days[expiry - 1]
    # Expires at 08:30 Chicago on the expiry Friday (CDT by then: 13:30 UTC).
    assert (
        int(x_trades["ts_event"][-1])
        < int(dt.datetime(2024, 3, 15, 13, 30, tzinfo=dt.UTC).timestamp()) * 10**9
    )


def test_calendar_spreads(mkt: dict) -> None:
    t, ids = mkt["t"], mkt["ids"]
    names = {v: k for k, v in ids.items()}
    spread_ids = [i for k, i in ids.items() if is_spread(k)]
    assert {"ESH4-ESM4", "ESM4-ESU4"} <= set(ids)
    sp = np.isin(t["instrument_id"], spread_ids)
    assert 0.01 < sp.mean() < 0.06
    assert all(is_spread(names[int(i)]) for i in np.unique(t["instrument_id"][sp]))
    px = t["price"][sp] / 1e9
    assert np.abs(px).max() < 150 and np.abs(px).mean() > 4  # tens of points
    assert (px[t["instrument_id"][sp] == ids["ESH4-ESM4"]] < 0).mean() > 0.95  # near < far: carry
    # The spread trades near the difference of its legs (nearest leg trades within 15 s).
    xy = t[t["instrument_id"] == ids["ESH4-ESM4"]]
    diffs = []
    legs = []
    for leg in ("ESH4", "ESM4"):
        lt = t[t["instrument_id"] == ids[leg]]
        j = np.clip(np.searchsorted(lt["ts_recv"], xy["ts_recv"]), 1, len(lt) - 1)
        j = np.where(
            np.abs(lt["ts_recv"][j].astype(np.int64) - xy["ts_recv"].astype(np.int64))
            < np.abs(lt["ts_recv"][j - 1].astype(np.int64) - xy["ts_recv"].astype(np.int64)),
            j,
            j - 1,
        )
        legs.append(
            (lt["price"][j] / 1e9, np.abs(lt["ts_recv"][j].astype(np.int64) - xy["ts_recv"].astype(np.int64)))
        )
    close = (legs[0][1] < 15 * calendar.NS_PER_SECOND) & (legs[1][1] < 15 * calendar.NS_PER_SECOND)
    diffs = np.abs(legs[0][0] - legs[1][0] - xy["price"] / 1e9)[close]
    assert diffs.size > 20
    # Up to 15 s of price moves between the prints plus two bid-ask bounces.
    assert np.median(diffs) <= 1.5 and np.percentile(diffs, 95) < 5.0
    # Heavier around the roll.
    sess = calendar.session_day(t["ts_recv"].astype(np.int64))
    roll_day = (dt.date(2024, 3, 7) - dt.date(1970, 1, 1)).days
    near_roll = np.abs(sess - roll_day) <= 1
    assert sp[near_roll].mean() > 1.5 * sp[~near_roll].mean()


# --- the book ------------------------------------------------------------------------------------


def test_book_shape_spread_and_depth(mkt: dict) -> None:
    b = mkt["b"]
    for k in range(1, 10):
        assert (b[f"bid_px_{k - 1:02d}"] - b[f"bid_px_{k:02d}"] == TICK).all()
        assert (b[f"ask_px_{k:02d}"] - b[f"ask_px_{k - 1:02d}"] == TICK).all()
        assert (b[f"bid_sz_{k:02d}"] > 0).all() and (b[f"ask_ct_{k:02d}"] > 0).all()
    spread = (b["ask_px_00"] - b["bid_px_00"]) // TICK
    assert (spread >= 1).all()
    rth = _is_rth(b["ts_recv"])
    assert (spread[rth] == 1).mean() > 0.97
    assert (spread[~rth] > 1).mean() > 0.01  # sometimes wider overnight
    depth = b["bid_sz_00"].astype(float) + b["ask_sz_00"]
    assert 150 < np.median(depth[rth]) / 2 < 1000  # hundreds in RTH
    assert np.median(depth[~rth]) < 0.5 * np.median(depth[rth])  # thinner overnight
    assert (b["bid_ct_00"] <= b["bid_sz_00"]).all()
    assert set(np.unique(b["action"])) == {b"A", b"C", b"M", b"T"}


def test_book_consistent_with_trades(mkt: dict) -> None:
    t, b, ids = mkt["t"], mkt["b"], mkt["ids"]
    # Each T record prints at the best ask (buy) / best bid (sell) of the previous record of its
    # instrument: the book just before the trade.
    for iid in (ids["ESH4"], ids["ESM4"]):
        bi = b[b["instrument_id"] == iid]
        is_t = np.flatnonzero(bi["action"] == b"T")
        is_t = is_t[is_t > 0]
        prev = bi[is_t - 1]
        expected = np.where(bi["side"][is_t] == b"B", prev["ask_px_00"], prev["bid_px_00"])
        np.testing.assert_array_equal(bi["price"][is_t], expected)
    # book_ratio >= 1: every outright trade appears as a T record with the same fields.
    outr = np.isin(t["instrument_id"], [ids["ESH4"], ids["ESM4"]])
    bt = b[b["action"] == b"T"]
    assert len(bt) == int(outr.sum())
    for f in ("ts_recv", "ts_event", "instrument_id", "price", "size", "side", "sequence"):
        np.testing.assert_array_equal(bt[f], t[outr][f], err_msg=f)
    # The book feed covers both outrights, no spread.
    assert set(np.unique(b["instrument_id"])) == {ids["ESH4"], ids["ESM4"]}
    n_out = int(outr.sum())
    assert 2.2 < len(b) / n_out < 2.8  # book_ratio 2.5


def test_thinned_book_feed(tmp_path: Path) -> None:
    cfg = SynthConfig(quarters=(Q1,), scale=0.004, seed=2, book_ratio=0.1)
    rep = generate_market(tmp_path, cfg)
    tp, bp = _paths(tmp_path, Q1)
    t, b = _store(tp).to_ndarray(), _store(bp).to_ndarray()
    n_out = len(t) - rep.quarters[0].n_spread_trades
    assert 0.07 < len(b) / n_out < 0.13
    bt = b[b["action"] == b"T"]
    assert 0.25 < len(bt) / (0.1 * n_out) < 0.55  # 0.4 x book_ratio of the outright trades
    key_t = set(zip(t["ts_recv"].tolist(), t["sequence"].tolist(), strict=True))
    assert all(k in key_t for k in zip(bt["ts_recv"].tolist(), bt["sequence"].tolist(), strict=True))


# --- scale and book ratio -----------------------------------------------------------------------------


def test_scale_and_book_ratio_are_linear(tmp_path: Path) -> None:
    a = generate_market(tmp_path / "a", SynthConfig(quarters=(Q2,), scale=0.001, book_ratio=2.5))
    b = generate_market(tmp_path / "b", SynthConfig(quarters=(Q2,), scale=0.002, book_ratio=2.5))
    na, nb_ = a.quarters[0].n_trades, b.quarters[0].n_trades
    assert 1.8 < nb_ / na < 2.2
    n_sess = calendar.quarter_sessions(Q2).size
    per_q = nb_ / 0.002 * 63 / n_sess
    assert 12e6 < per_q < 30e6  # ~20 M trades per quarter at scale 1
    q = b.quarters[0]
    assert 2.2 < q.n_book_records / (q.n_trades - q.n_spread_trades) < 2.8


# --- the planted signal ------------------------------------------------------------------------------


def _flow_return_corr(cfg: SynthConfig, q: dt.date) -> tuple[float, int]:
    """corr(net aggressor volume of a 1-minute window, next window's mid-proxy log return) on
    the front outright."""
    plan, sessions = iter_quarter_records(cfg, "ES.FUT", q)
    xs, ys = [], []
    for sr in sessions:
        for _ in sr.book_chunks:
            pass
        t = sr.trades
        sel = t["instrument_id"] == plan.ids[0 if sr.index < plan.roll_index else 1]
        if sel.sum() < 10:
            continue
        ts = t["ts_recv"][sel].astype(np.int64)
        sign = np.where(t["side"][sel] == b"B", 1.0, -1.0)
        mid = t["price"][sel] / 1e9 - sign * 0.125  # remove the bid-ask bounce
        w = (ts - ts[0]) // calendar.NS_PER_MINUTE
        nw = int(w[-1]) + 1
        nv = np.bincount(w, weights=sign * t["size"][sel], minlength=nw)
        last = np.full(nw, np.nan)
        last[w] = mid
        idx = np.flatnonzero(~np.isnan(last))
        idx = idx[np.isin(idx + 1, idx)]
        if idx.size < 10:
            continue
        r = np.log(last[idx + 1] / last[idx])
        # Standardise per session so that volatile days do not dominate the pooled correlation.
        xs.append(nv[idx] / (np.abs(nv[idx]).mean() + 1e-12))
        ys.append(r / (r.std() + 1e-12))
    x, y = np.concatenate(xs), np.concatenate(ys)
    return float(np.corrcoef(x, y)[0, 1]), int(x.size)


def test_signal_versus_null() -> None:
    base = {"quarters": (Q2,), "scale": 0.002, "seed": 21, "book_ratio": 0.0}
    c_sig, n = _flow_return_corr(SynthConfig(signal=1.0, **base), Q2)  # type: ignore[arg-type]
    c_null, n0 = _flow_return_corr(SynthConfig(signal=0.0, **base), Q2)  # type: ignore[arg-type]
    assert n > 5000 and n0 > 5000
    assert c_sig > 0.07 and c_sig > 6 / np.sqrt(n)
    assert abs(c_null) < 3.5 / np.sqrt(n0)


def test_signal_kernel_is_causal() -> None:
    rng = np.random.default_rng(0)
    n = 2000
    flow = rng.normal(size=n)
    vol = np.abs(flow) + 1
    sd = np.full(n, 1e-4)
    d1, _ = nb.signal_path_nb(flow, vol, sd, 0.98, 0.999, 0.1, 0.0)
    flow2 = flow.copy()
    flow2[1200:] += 5.0  # change the future only
    d2, _ = nb.signal_path_nb(flow2, vol * 1.0, sd, 0.98, 0.999, 0.1, 0.0)
    np.testing.assert_array_equal(d1[:1201], d2[:1201])  # d[s] uses flow of seconds < s
    assert not np.array_equal(d1[1201:], d2[1201:])
    d0, _ = nb.signal_path_nb(flow, vol, sd, 0.98, 0.999, 0.0, 0.0)
    assert (d0 == 0).all()  # signal 0: no dependence on flow at all


def test_null_session_ends_on_skeleton_close() -> None:
    """With signal 0 the log level is a Gaussian bridge between the skeleton's session closes
    (martingale increments, no flow term): the front's last mid of each session sits on the
    skeleton close plus the contract's carry."""
    plan = market.plan_quarter(0, "ES.FUT", Q1)
    for i in (0, 1, 30):
        res = market.simulate_session(
            plan, i, seed=0, scale=0.001, signal=0.0, book_ratio=0.0, d_start=0.0, seq_start=0
        )
        assert res.d_end == 0.0
        front = plan.x
        t_end = float(plan.close_ns[i])
        tau = (market.contract_expiry_ns(front) - t_end) / (365.25 * calendar.NS_PER_DAY)
        carry = float(market.carry_rate(t_end, 0, "ES.FUT"))
        expected = 5000.0 * np.exp(plan.closes[i]) * np.exp(carry * tau)
        last_mid = res.mid_ticks_front[-1] / 2 * 0.25
        per_sec_sd = plan.daily_sd[i] * 5000.0 * 0.05  # generous: a few seconds' moves + ticks
        assert abs(last_mid - expected) < 0.5 + per_sec_sd, (i, last_mid, expected)


# --- report, manifest, validation ---------------------------------------------------------------------


def test_report_and_manifest(mkt: dict) -> None:
    rep = mkt["report"]
    d = rep.to_dict()
    json.dumps(d)
    assert d["n_trades"] == len(mkt["t"]) and d["n_book_records"] == len(mkt["b"])
    assert len(d["files"]) == 2 and all(Path(p).exists() for p in d["files"])
    q = rep.quarters[0]
    assert q.roll == {"from": "ESH4", "to": "ESM4", "roll_date": "2024-03-07", "expiry": "2024-03-15"}
    assert q.contracts == mkt["ids"]
    man = json.loads((mkt["root"] / "raw" / "synth_manifest.json").read_text())
    assert man["config"]["seed"] == 7 and man["config"]["quarters"] == ["2024-Q1"]
    assert man["signal"]["null"] is True and "ft[s]" in man["signal"]["description"]


def test_other_symbol_reuses_model(tmp_path: Path) -> None:
    cfg = SynthConfig(quarters=(Q1,), symbols=("NQ.FUT",), scale=0.0005, book_ratio=0.0)
    generate_market(tmp_path, cfg)
    store = _store(_paths(tmp_path, Q1, "NQ.FUT")[0])
    assert store.metadata.symbols == ["NQ.FUT"]
    assert set(store.metadata.mappings) == {"NQH4", "NQM4", "NQH4-NQM4", "NQM4-NQU4"}
    px = store.to_ndarray()["price"] / 1e9
    assert px.max() > 10000


@pytest.mark.parametrize(
    "kwargs",
    [
        {"quarters": ()},
        {"quarters": (dt.date(2024, 2, 1),)},
        {"quarters": (Q1,), "scale": 0.0},
        {"quarters": (Q1,), "book_ratio": -1.0},
        {"quarters": (Q1,), "symbols": ("ES/FUT",)},
        {"quarters": (Q1,), "signal": float("nan")},
        {"quarters": (Q1,), "symbols": "ES.FUT"},
        {"quarters": ("2024-Q1",)},
    ],
)
def test_config_validation(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(FxDataError):
        generate_market(tmp_path, SynthConfig(**kwargs))
