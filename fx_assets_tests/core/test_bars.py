"""Bar builders: hand examples, conservation, OHLC/VWAP consistency, breaks and forced closes,
imbalance guards against a plain-Python reference, truncation causality, partition equivalence."""

from __future__ import annotations

import datetime as dt
import itertools

import numpy as np
import pyarrow as pa
import pytest

from fx_assets.core import calendar
from fx_assets.core.bars import (
    BarConfig,
    BarTable,
    ImbalanceDiagnostics,
    bars_per_session,
    build_bars,
    build_imbalance_bars_with_diagnostics,
    check_bar_density,
)
from fx_assets.core.errors import FxDataError

KINDS = ["volume", "dollar", "tick_imbalance", "volume_imbalance"]


def synthetic_trades(
    seed: int = 0,
    n_sessions: int = 6,
    per_session: int = 3000,
    roll_after: int | None = 3,
    first_day: dt.date = dt.date(2024, 3, 4),
) -> dict[str, np.ndarray]:
    """Trades inside CME sessions (Mon-Fri), an ES-like 0.25-tick random walk, sizes 1..20,
    aggressor sign with ~10% unknown, and a contract roll (new id, +60 points) after
    ``roll_after`` sessions. Session ids come from the calendar, so ts and session agree."""
    rng = np.random.default_rng(seed)
    days = calendar.sessions_between(first_day, first_day + dt.timedelta(days=3 * n_sessions))
    days = days[:n_sessions]
    opens, closes = calendar.session_bounds_utc(days)
    ts, price, size, sign, sess, inst = [], [], [], [], [], []
    level = 5000.0
    for k, (d, o, c) in enumerate(zip(days, opens, closes, strict=True)):
        t = np.sort(rng.integers(int(o), int(c), per_session))
        steps = rng.choice(np.array([-1, 0, 0, 1]), per_session) * 0.25
        p = level + np.cumsum(steps)
        level = float(p[-1])
        iid = 1 if roll_after is None or k < roll_after else 2
        if roll_after is not None and k >= roll_after:
            p = p + 60.0
        s = rng.choice(np.array([-1, 1], dtype=np.int8), per_session)
        s[rng.random(per_session) < 0.1] = 0
        ts.append(t)
        price.append(p)
        size.append(rng.integers(1, 21, per_session).astype(np.uint32))
        sign.append(s)
        sess.append(np.full(per_session, d, np.int32))
        inst.append(np.full(per_session, iid, np.uint32))
    out: dict[str, np.ndarray] = {
        "ts": np.concatenate(ts).astype(np.int64),
        "price": np.concatenate(price),
        "size": np.concatenate(size),
        "sign": np.concatenate(sign),
        "session": np.concatenate(sess),
        "instrument_id": np.concatenate(inst),
    }
    assert np.array_equal(calendar.session_day(out["ts"]), out["session"])
    return out


def _cfg(kind: str, **kw: object) -> BarConfig:
    base: dict[str, object] = {
        "kind": kind,
        "volume_bar_size": 100,
        "dollar_bar_size": 100 * 5000.0 * 50.0,
        "imbalance_expected_ticks_init": 30,
    }
    base.update(kw)
    return BarConfig.model_validate(base)


def _build(tr: dict[str, np.ndarray], cfg: BarConfig) -> BarTable:
    return build_bars(tr["ts"], tr["price"], tr["size"], tr["sign"], tr["session"], tr["instrument_id"], cfg)


def _cut(tr: dict[str, np.ndarray], stop: int) -> dict[str, np.ndarray]:
    return {k: v[:stop] for k, v in tr.items()}


def _bars_equal(a: BarTable, b: BarTable) -> None:
    assert len(a) == len(b)
    for k, v in a.columns().items():
        np.testing.assert_array_equal(v, getattr(b, k), err_msg=k)


def _resolved_signs(tr: dict[str, np.ndarray]) -> np.ndarray:
    """Plain-Python aggressor sign with tick-rule fallback, reset at session/instrument change."""
    out = np.zeros(tr["ts"].size, np.int64)
    prev_b, prev_p = 0, 0.0
    for i in range(out.size):
        if i == 0 or (tr["session"][i], tr["instrument_id"][i]) != (
            tr["session"][i - 1],
            tr["instrument_id"][i - 1],
        ):
            prev_b, prev_p = 0, tr["price"][i]
        s = int(tr["sign"][i])
        p = float(tr["price"][i])
        if s != 0:
            b = 1 if s > 0 else -1
        elif p > prev_p:
            b = 1
        elif p < prev_p:
            b = -1
        else:
            b = prev_b
        out[i] = b
        prev_b, prev_p = b, p
    return out


# --- hand examples ----------------------------------------------------------------------------


def test_volume_bars_hand_example() -> None:
    # V = 10: sizes 3,4,5 -> bar 1 (12 >= 10, the crossing trade stays whole);
    # 2,9 -> bar 2 (11); 1 -> final partial bar, forced.
    ts = np.array([10, 20, 30, 40, 50, 60], np.int64)
    price = np.array([100.0, 101.0, 99.0, 99.0, 102.0, 101.5])
    size = np.array([3, 4, 5, 2, 9, 1], np.uint32)
    sign = np.array([1, 0, -1, 0, 0, 0], np.int8)  # resolved: +1, +1 (tick), -1, -1 (carry), +1, -1
    sess = np.full(6, 19800, np.int32)
    inst = np.full(6, 7, np.uint32)
    bars = build_bars(ts, price, size, sign, sess, inst, BarConfig(volume_bar_size=10))
    assert len(bars) == 3
    np.testing.assert_array_equal(bars.ts_open, [10, 40, 60])
    np.testing.assert_array_equal(bars.ts_close, [30, 50, 60])
    np.testing.assert_array_equal(bars.open, [100.0, 99.0, 101.5])
    np.testing.assert_array_equal(bars.high, [101.0, 102.0, 101.5])
    np.testing.assert_array_equal(bars.low, [99.0, 99.0, 101.5])
    np.testing.assert_array_equal(bars.close, [99.0, 102.0, 101.5])
    np.testing.assert_array_equal(bars.volume, [12.0, 11.0, 1.0])
    np.testing.assert_array_equal(bars.buy_volume, [7.0, 9.0, 0.0])
    np.testing.assert_allclose(bars.vwap, [(300 + 404 + 495) / 12, (198 + 918) / 11, 101.5], rtol=1e-15)
    np.testing.assert_array_equal(bars.n_trades, [3, 2, 1])
    np.testing.assert_array_equal(bars.duration_ns, [20, 10, 0])
    np.testing.assert_array_equal(bars.forced_close, [False, False, True])
    assert bars.instrument_id.dtype == np.uint32 and bars.session_id.dtype == np.int32


def test_breaks_force_close_and_reset_tick_rule() -> None:
    # A session change after trade 1 and a roll after trade 3; V = 100 is never reached.
    ts = np.arange(6, dtype=np.int64) * 10
    price = np.array([100.0, 101.0, 101.0, 100.0, 100.0, 99.0])
    size = np.ones(6, np.uint32)
    sign = np.zeros(6, np.int8)
    sess = np.array([5, 5, 6, 6, 6, 6], np.int32)
    inst = np.array([1, 1, 1, 1, 2, 2], np.uint32)
    bars = build_bars(ts, price, size, sign, sess, inst, BarConfig(volume_bar_size=100))
    np.testing.assert_array_equal(bars.n_trades, [2, 2, 2])
    np.testing.assert_array_equal(bars.session_id, [5, 6, 6])
    np.testing.assert_array_equal(bars.instrument_id, [1, 1, 2])
    assert bars.forced_close.all()
    # tick rule: trade 0 unknown (0), trade 1 up; trade 2 restarts at the session (unknown),
    # trade 3 down; trade 4 restarts at the roll (unknown), trade 5 down -> no buys after 1.
    np.testing.assert_array_equal(bars.buy_volume, [1.0, 0.0, 0.0])


# --- properties on synthetic markets -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_conservation_ohlc_and_no_spanning(kind: str) -> None:
    tr = synthetic_trades(seed=1)
    bars = _build(tr, _cfg(kind))
    assert bars.volume.sum() == tr["size"].sum()
    assert bars.n_trades.sum() == tr["ts"].size
    assert (bars.low <= bars.open).all() and (bars.open <= bars.high).all()
    assert (bars.low <= bars.close).all() and (bars.close <= bars.high).all()
    assert (bars.low <= bars.vwap).all() and (bars.vwap <= bars.high).all()
    assert (bars.buy_volume >= 0).all() and (bars.buy_volume <= bars.volume).all()
    assert (bars.duration_ns == bars.ts_close - bars.ts_open).all()
    # buy volume matches an independent sign resolution
    b = _resolved_signs(tr)
    ends = np.cumsum(bars.n_trades)
    starts = ends - bars.n_trades
    buys = np.array([tr["size"][s:e][b[s:e] > 0].sum() for s, e in zip(starts, ends, strict=True)])
    np.testing.assert_array_equal(bars.buy_volume, buys)
    # each bar's trades lie in one session and one contract, and match its stamps
    seg = np.r_[True, (np.diff(tr["session"]) != 0) | (np.diff(tr["instrument_id"]) != 0)]
    seg_id = np.cumsum(seg)
    assert (seg_id[starts] == seg_id[ends - 1]).all()
    np.testing.assert_array_equal(bars.session_id, tr["session"][starts])
    np.testing.assert_array_equal(bars.instrument_id, tr["instrument_id"][starts])
    np.testing.assert_array_equal(bars.ts_open, tr["ts"][starts])
    np.testing.assert_array_equal(bars.ts_close, tr["ts"][ends - 1])
    # every segment's last trade closes a bar (forced unless its rule closed it right there)
    last_of_segment = np.flatnonzero(np.r_[seg[1:], True])
    assert np.isin(last_of_segment, ends - 1).all()
    at_break = np.isin(ends - 1, last_of_segment)
    if kind in ("volume", "dollar"):
        # threshold bars are forced only at a break (see test_threshold_bars_close_at_first_crossing
        # for the converse: an unreached threshold at a break is forced)
        assert at_break[bars.forced_close].all()


@pytest.mark.parametrize("kind", ["volume", "dollar"])
def test_threshold_bars_close_at_first_crossing(kind: str) -> None:
    tr = synthetic_trades(seed=2)
    cfg = _cfg(kind)
    bars = _build(tr, cfg)
    ends = np.cumsum(bars.n_trades)
    starts = ends - bars.n_trades
    amount = tr["size"].astype(float) * (tr["price"] * cfg.multiplier if kind == "dollar" else 1.0)
    thr = cfg.dollar_bar_size if kind == "dollar" else cfg.volume_bar_size
    for j in range(len(bars)):
        a = amount[starts[j] : ends[j]]
        cum = np.cumsum(a)
        if bars.forced_close[j]:
            assert cum[-1] < thr
        else:
            assert cum[-1] >= thr and (cum[:-1] < thr).all()


# --- imbalance bars: reference and guards --------------------------------------------------------


def _imbalance_reference(
    tr: dict[str, np.ndarray], cfg: BarConfig
) -> tuple[list[int], list[bool], list[float]]:
    """Plain-Python imbalance bars: close indices, forced flags, thresholds (NaN: warm-up)."""
    b = _resolved_signs(tr)
    t_init = cfg.imbalance_expected_ticks_init
    a_b = 2.0 / (cfg.imbalance_ewma_span_bars + 1)
    a_t = 2.0 / (cfg.imbalance_ewma_span_ticks + 1)
    lo, hi = cfg.imbalance_ticks_min_factor * t_init, cfg.imbalance_ticks_max_factor * t_init
    closes: list[int] = []
    forced: list[bool] = []
    thrs: list[float] = []
    n = b.size
    i = 0
    while i < n:
        # one session/contract segment
        j = i
        while j + 1 < n and (tr["session"][j + 1], tr["instrument_id"][j + 1]) == (
            tr["session"][i],
            tr["instrument_id"][i],
        ):
            j += 1
        e0t, e0x, e0a, have, warm = float(t_init), 0.0, 0.0, False, True
        theta, cnt, thr, limit = 0.0, 0, 0.0, 0.0
        for k in range(i, j + 1):
            if cnt == 0 and not warm:
                thr = e0t * max(abs(e0x), cfg.imbalance_floor_frac * e0a)
                limit = cfg.imbalance_force_close_factor * e0t
            x = float(b[k]) * (float(tr["size"][k]) if cfg.kind == "volume_imbalance" else 1.0)
            theta += x
            cnt += 1
            if have:
                e0x += a_t * (x - e0x)
                e0a += a_t * (abs(x) - e0a)
            else:
                e0x, e0a, have = x, abs(x), True
            if warm:
                close, f = cnt >= t_init, False
            elif thr > 0 and abs(theta) >= thr:
                close, f = True, False
            elif cnt >= limit:
                close, f = True, True
            else:
                close, f = False, False
            if close:
                closes.append(k)
                forced.append(f)
                thrs.append(np.nan if warm else thr)
                if warm:
                    e0t, warm = float(cnt), False
                else:
                    e0t += a_b * (cnt - e0t)
                e0t = min(max(e0t, lo), hi)
                theta, cnt = 0.0, 0
        if cnt:
            closes.append(j)
            forced.append(True)
            thrs.append(np.nan if warm else thr)
        i = j + 1
    return closes, forced, thrs


@pytest.mark.parametrize("kind", ["tick_imbalance", "volume_imbalance"])
def test_imbalance_bars_match_reference(kind: str) -> None:
    tr = synthetic_trades(seed=3, n_sessions=3, per_session=1500)
    cfg = _cfg(kind, imbalance_ewma_span_ticks=50)
    diag = build_imbalance_bars_with_diagnostics(
        tr["ts"], tr["price"], tr["size"], tr["sign"], tr["session"], tr["instrument_id"], cfg
    )
    closes, forced, thrs = _imbalance_reference(tr, cfg)
    np.testing.assert_array_equal(np.cumsum(diag.bars.n_trades) - 1, closes)
    np.testing.assert_array_equal(diag.bars.forced_close, forced)
    np.testing.assert_allclose(diag.threshold, thrs, rtol=1e-12, equal_nan=True)
    assert len(diag.bars) > 20


def _series(signs: list[int] | np.ndarray, sizes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    s = np.asarray(signs, np.int8)
    n = s.size
    return {
        "ts": np.arange(n, dtype=np.int64),
        "price": np.full(n, 100.0),
        "size": np.ones(n, np.uint32) if sizes is None else sizes.astype(np.uint32),
        "sign": s,
        "session": np.full(n, 19800, np.int32),
        "instrument_id": np.full(n, 1, np.uint32),
    }


def _diag(tr: dict[str, np.ndarray], cfg: BarConfig) -> ImbalanceDiagnostics:
    return build_imbalance_bars_with_diagnostics(
        tr["ts"], tr["price"], tr["size"], tr["sign"], tr["session"], tr["instrument_id"], cfg
    )


def test_imbalance_warmup_bar_and_upper_clamp_and_force_close() -> None:
    # 20 buys seed E0[x] ~ 1 and E0[T] = 20; then alternating flow: |theta| <= 1 never reaches
    # E0[T] * max(|E0[x]|, 0.5 E0[|x|]) >= 10, so every bar is force-closed at 3 E0[T] ticks
    # and E0[T] grows until the clamp 4 T_init = 80 holds it.
    signs = [1] * 20 + [1, -1] * 3000
    cfg = BarConfig(
        kind="tick_imbalance",
        imbalance_expected_ticks_init=20,
        imbalance_floor_frac=0.5,
        imbalance_ewma_span_ticks=10,
    )
    d = _diag(_series(signs), cfg)
    assert d.bars.n_trades[0] == 20 and not d.bars.forced_close[0]
    assert np.isnan(d.expected_ticks[0]) and np.isnan(d.threshold[0])
    body = slice(1, len(d.bars) - 1)
    assert d.bars.forced_close[body].all()
    np.testing.assert_array_equal(
        d.bars.n_trades[body], np.ceil(3.0 * d.expected_ticks[body]).astype(np.int64)
    )
    assert np.nanmax(d.expected_ticks) == 80.0
    assert (d.bars.n_trades[body][-3:] == 240).all()


def test_imbalance_lower_clamp() -> None:
    # Seed with 20 one-lot buys, then 1000-lot buys: each closes its bar at once, E0[T] falls
    # toward 1 and is held at T_init/4 = 5.
    sizes = np.r_[np.ones(20), np.full(60, 1000.0)]
    cfg = BarConfig(kind="volume_imbalance", imbalance_expected_ticks_init=20)
    d = _diag(_series(np.ones(80, np.int8), sizes), cfg)
    e = d.expected_ticks[1:]
    assert e.min() == 5.0 and (e >= 5.0).all()
    assert (d.bars.n_trades[1:20] == 1).all()


def test_imbalance_floor() -> None:
    # Balanced flow: E0[x] ~ 0, so the threshold is the floor E0[T] * 0.05 * E0[|x|].
    # For a tick-imbalance series E0[|x|] = 1 exactly, so the floor is 0.05 * E0[T].
    signs = [1, -1] * 2000
    cfg = BarConfig(kind="tick_imbalance", imbalance_expected_ticks_init=40, imbalance_ewma_span_ticks=100)
    d = _diag(_series(signs), cfg)
    thr, ticks, ex = d.threshold[1:], d.expected_ticks[1:], np.abs(d.expected_imbalance[1:])
    floored = ex < 0.05
    assert floored.sum() > 10 and (~floored).sum() > 0
    np.testing.assert_allclose(thr[floored], 0.05 * ticks[floored], rtol=1e-12)
    np.testing.assert_allclose(thr[~floored], ticks[~floored] * ex[~floored], rtol=1e-12)
    # the floor keeps bars from shrinking below what 0.05 * E0[T] allows
    assert (thr >= 0.05 * ticks * (1 - 1e-12)).all()


def test_imbalance_state_resets_at_session_and_roll() -> None:
    tr = synthetic_trades(seed=4, n_sessions=4, per_session=800, roll_after=2)
    cfg = _cfg("tick_imbalance")
    whole = _diag(tr, cfg)
    first_bar = np.r_[True, np.diff(whole.bars.session_id) != 0]
    # the first bar of every session is the T_init warm-up tick bar
    assert np.isnan(whole.threshold[first_bar]).all()
    assert (whole.bars.n_trades[first_bar] == 30).all()


# --- causality and partitions -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_truncation_and_perturbation_leave_earlier_bars_unchanged(kind: str) -> None:
    tr = synthetic_trades(seed=5, n_sessions=4, per_session=2000)
    cfg = _cfg(kind)
    full = _build(tr, cfg)
    ends = np.cumsum(full.n_trades)
    rng = np.random.default_rng(0)
    for t in rng.choice(len(full) - 1, 6, replace=False):
        stop = int(ends[t])
        cut = _build(_cut(tr, stop), cfg)
        _bars_equal(cut.slice(0, t + 1), full.slice(0, t + 1))
        assert len(cut) == t + 1
        # altering every later trade changes nothing up to bar t
        alt = {k: v.copy() for k, v in tr.items()}
        alt["price"][stop:] += rng.choice(np.array([-0.5, 0.25, 1.0]), alt["price"].size - stop)
        alt["size"][stop:] = rng.integers(1, 50, alt["size"].size - stop).astype(np.uint32)
        alt["sign"][stop:] = -alt["sign"][stop:]
        _bars_equal(_build(alt, cfg).slice(0, t + 1), full.slice(0, t + 1))


@pytest.mark.parametrize("kind", KINDS)
def test_partition_equivalence_at_session_starts(kind: str) -> None:
    tr = synthetic_trades(seed=6, n_sessions=6, per_session=1500)
    cfg = _cfg(kind)
    whole = _build(tr, cfg)
    starts = np.flatnonzero(np.r_[True, np.diff(tr["session"]) != 0])
    cuts = [0, int(starts[2]), int(starts[4]), tr["ts"].size]  # three "quarters"
    parts = [_build({k: v[a:b] for k, v in tr.items()}, cfg) for a, b in itertools.pairwise(cuts)]
    _bars_equal(BarTable.concat(parts), whole)


# --- tables and helpers --------------------------------------------------------------------------


def test_arrow_roundtrip_and_schema_errors() -> None:
    bars = _build(synthetic_trades(seed=7, n_sessions=2, per_session=500), _cfg("volume"))
    t = bars.to_arrow()
    assert t.column_names == [
        "ts_open", "ts_close", "open", "high", "low", "close", "volume", "buy_volume", "vwap",
        "n_trades", "duration_ns", "instrument_id", "session_id", "forced_close",
    ]  # fmt: skip
    _bars_equal(BarTable.from_arrow(t), bars)
    with pytest.raises(FxDataError, match="'vwap'"):
        BarTable.from_arrow(t.drop_columns(["vwap"]), source="bars[2024-Q1]")
    bad = t.set_column(t.schema.get_field_index("volume"), "volume", pa.array(bars.n_trades))
    with pytest.raises(FxDataError, match="volume"):
        BarTable.from_arrow(bad)


def test_bars_per_session_and_density_check() -> None:
    tr = synthetic_trades(seed=8, n_sessions=4, per_session=1200)
    bars = _build(tr, _cfg("tick_imbalance"))
    ids, counts = bars_per_session(bars)
    np.testing.assert_array_equal(ids, np.unique(tr["session"]))
    assert counts.sum() == len(bars)
    mean = counts.mean()
    assert check_bar_density(bars, mean) is None or "sessions outside" in str(check_bar_density(bars, mean))
    msg = check_bar_density(bars, 3 * mean)
    assert msg is not None and "mean" in msg and "2024-03" in msg
    assert check_bar_density(bars, float(np.median(counts)), tolerance=10.0) is None


@pytest.mark.parametrize(
    ("column", "index", "value", "pattern"),
    [
        ("ts", 5, 0, r"'ts'.*trade 5"),
        ("price", 7, np.nan, r"'price'.*trade 7"),
        ("price", 8, -1.0, r"'price'.*trade 8"),
        ("size", 9, 0, r"'size'.*trade 9"),
        ("session", 11, -1, r"'session'.*trade 11"),
    ],
)
@pytest.mark.parametrize("kind", ["volume", "tick_imbalance"])
def test_bad_input_names_column_and_trade(
    kind: str, column: str, index: int, value: float, pattern: str
) -> None:
    tr = {k: v[:50].copy() for k, v in synthetic_trades(seed=9, n_sessions=1, per_session=60).items()}
    tr[column][index] = value
    with pytest.raises(FxDataError, match=pattern):
        _build(tr, _cfg(kind))


def test_config_is_frozen_and_checked() -> None:
    cfg = BarConfig()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type
        cfg.kind = "dollar"  # type: ignore[misc]
    with pytest.raises(ValueError):
        BarConfig(imbalance_ticks_min_factor=5.0, imbalance_ticks_max_factor=4.0)
    with pytest.raises(ValueError):
        BarConfig(volume_bar_size=0)


def test_capacity_retry_on_many_breaks() -> None:
    # Instruments alternating every trade (ill-formed input) break the bar-count bound used to
    # size the outputs; the builder must retry and still produce one forced bar per trade.
    n = 3000
    ts = np.arange(n, dtype=np.int64)
    price = np.full(n, 100.0)
    size = np.full(n, 5, np.uint32)
    sign = np.ones(n, np.int8)
    sess = np.full(n, 19800, np.int32)
    inst = (np.arange(n) % 2 + 1).astype(np.uint32)
    bars = build_bars(ts, price, size, sign, sess, inst, BarConfig(volume_bar_size=100))
    assert len(bars) == n and bars.forced_close.all() and bars.volume.sum() == size.sum()
    np.testing.assert_array_equal(bars.instrument_id, inst)
