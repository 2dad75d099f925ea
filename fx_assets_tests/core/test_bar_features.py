"""Bar features: TA-Lib cross-checks, plain-Python references (CUSUM, trend t-value), causality
(truncation/perturbation), partition equivalence with warm-up, rolls, mirror symmetry,
validation and the registry."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re

import numpy as np
import pytest
import talib

from fx_assets.core import calendar
from fx_assets.core.bar_features import (
    FEATURES,
    BarFeatureConfig,
    FeatureTable,
    build_registry,
    compute_bar_features,
    feature_names,
    max_window,
    validate_features,
)
from fx_assets.core.bars import BarConfig, BarTable, build_bars
from fx_assets.core.errors import FxDataError
from fx_assets_tests.core.test_bars import synthetic_trades


def _bar_clock(n: int, per_session: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """ts_close (evenly inside CME sessions) and session ids for n bars."""
    n_sess = -(-n // per_session)
    days = calendar.sessions_between(dt.date(2024, 1, 2), dt.date(2025, 12, 31))[:n_sess]
    opens, closes = calendar.session_bounds_utc(days)
    ts, sess = [], []
    for d, o, c in zip(days, opens, closes, strict=True):
        step = (int(c) - int(o)) // (per_session + 1)
        ts.append(int(o) + step * np.arange(1, per_session + 1, dtype=np.int64))
        sess.append(np.full(per_session, d, np.int32))
    return np.concatenate(ts)[:n], np.concatenate(sess)[:n]


def _ohlc_bars(
    o: np.ndarray,
    h: np.ndarray,
    lo: np.ndarray,
    c: np.ndarray,
    inst: np.ndarray | None = None,
    seed: int = 0,
) -> BarTable:
    n = c.size
    rng = np.random.default_rng(seed)
    ts, sess = _bar_clock(n)
    vol = rng.integers(100, 160, n).astype(np.float64)
    dur = rng.integers(1_000_000, 60_000_000_000, n).astype(np.int64)
    return BarTable(
        ts_open=ts - dur,
        ts_close=ts,
        open=o,
        high=h,
        low=lo,
        close=c,
        volume=vol,
        buy_volume=np.floor(vol * rng.random(n)),
        vwap=(h + lo) / 2,
        n_trades=rng.integers(5, 40, n).astype(np.int64),
        duration_ns=dur,
        instrument_id=np.ones(n, np.uint32) if inst is None else inst.astype(np.uint32),
        session_id=sess,
        forced_close=np.zeros(n, np.bool_),
    )


def _gbm_bars(n: int, seed: int = 1, flat_start: int = 0, level: float = 100.0) -> BarTable:
    rng = np.random.default_rng(seed)
    c = level * np.exp(np.cumsum(rng.normal(0, 0.002, n)))
    o = np.r_[c[0], c[:-1]] * np.exp(rng.normal(0, 0.0005, n))
    h = np.maximum(o, c) * np.exp(np.abs(rng.normal(0, 0.001, n)))
    lo = np.minimum(o, c) * np.exp(-np.abs(rng.normal(0, 0.001, n)))
    if flat_start:
        o[:flat_start] = h[:flat_start] = lo[:flat_start] = c[:flat_start] = level
    return _ohlc_bars(o, h, lo, c, seed=seed)


def _trade_bars(seed: int = 11, n_sessions: int = 16, roll_after: int | None = 8) -> BarTable:
    tr = synthetic_trades(seed=seed, n_sessions=n_sessions, per_session=3000, roll_after=roll_after)
    return build_bars(
        tr["ts"],
        tr["price"],
        tr["size"],
        tr["sign"],
        tr["session"],
        tr["instrument_id"],
        BarConfig(volume_bar_size=100),
    )


def _assert_tables_close(a: FeatureTable, b: FeatureTable, atol: float = 1e-9) -> None:
    assert list(a.columns) == list(b.columns)
    np.testing.assert_array_equal(a.ts_close, b.ts_close)
    for k in a.columns:
        x, y = a.columns[k], b.columns[k]
        np.testing.assert_array_equal(np.isnan(x), np.isnan(y), err_msg=k)
        ok = ~np.isnan(x)
        if ok.any():
            assert np.max(np.abs(x[ok] - y[ok])) <= atol, k


# --- cross-checks -------------------------------------------------------------------------------


def test_talib_crosscheck() -> None:
    bars = _gbm_bars(3000, flat_start=20)
    ft = compute_bar_features(bars)
    h, lo, c = bars.high, bars.low, bars.close

    def check(name: str, ref: np.ndarray, mask: np.ndarray | None = None) -> None:
        got = ft.columns[name]
        ok = np.isfinite(ref) if mask is None else np.isfinite(ref) & ~mask
        assert ok.sum() > 2500
        # NaN exactly during TA-Lib's lookback, values everywhere after it
        assert np.isfinite(got[ok]).all(), name
        rel = np.abs(got[ok] - ref[ok]) / np.maximum(1.0, np.abs(ref[ok]))
        assert rel.max() <= 1e-9, (name, rel.max())

    for name, ref in [
        ("atr_14", talib.ATR(h, lo, c, 14)),
        ("natr_14", talib.NATR(h, lo, c, 14)),
        ("plus_di_14", talib.PLUS_DI(h, lo, c, 14)),
        ("minus_di_14", talib.MINUS_DI(h, lo, c, 14)),
        ("adx_14", talib.ADX(h, lo, c, 14)),
    ]:
        check(name, ref)
        assert np.isnan(ft.columns[name][~np.isfinite(ref)]).all(), name
    rsi = talib.RSI(c, 14)
    flat = (rsi == 0.0) & (ft.columns["rsi_14"] == 50.0)  # TA-Lib: 0 on a flat window, we: 50
    assert flat[14:20].all()
    check("rsi_14", rsi, flat)
    macd, sig, hist = talib.MACD(c, 12, 26, 9)
    check("macd_12_26", macd / c)
    check("macd_signal_9", sig / c)
    check("macd_hist", hist / c)
    assert np.isfinite(ft.columns["macd_12_26"][25:]).all()  # line is known from bar 25 on
    up, _mid, dn = talib.BBANDS(c, 20, 2.0, 2.0, talib.MA_Type.SMA)
    with np.errstate(invalid="ignore", divide="ignore"):
        pctb = (c - dn) / (up - dn)
    check("bb_pctb_20", pctb, (up - dn) <= 1e-9)
    assert ft.columns["bb_pctb_20"][19] == 0.5  # flat window (bars 0..19) -> 0.5


def _ref_cusum(lnc: list[float], session: list[int], k: float, span: int) -> tuple[list, list, list]:
    a = 2 / (span + 1)
    ev, dirn, since = [], [], []
    m = sig_prev = 0.0
    sp = sm = 0.0
    last, ref = 0, 0
    for j in range(len(lnc)):
        r = 0.0 if j == 0 else lnc[j] - lnc[j - 1]
        m = r * r if j == 0 else m + a * (r * r - m)
        if j == 0 or session[j] != session[j - 1]:
            sp = sm = 0.0
            last, ref = 0, j
        sp, sm = max(0.0, sp + r), min(0.0, sm + r)
        e = 0
        if j > 0:
            h = k * sig_prev
            if sm < -h:
                sm, e, last, ref = 0.0, 1, -1, j
            elif sp > h:
                sp, e, last, ref = 0.0, 1, 1, j
        ev.append(e)
        dirn.append(last)
        since.append(j - ref)
        sig_prev = math.sqrt(m)
    return ev, dirn, since


def _ref_trend(lnc: list[float], lmin: int, lmax: int, clip: float) -> list[float]:
    out = []
    for j in range(len(lnc)):
        if j < lmax - 1:
            out.append(math.nan)
            continue
        best = 0.0
        for L in range(lmin, lmax + 1):
            ys = lnc[j - L + 1 : j + 1]
            xs = list(range(L))
            xm, ym = sum(xs) / L, sum(ys) / L
            sxx = sum((x - xm) ** 2 for x in xs)
            b = sum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sxx
            s2 = sum((y - ym - b * (x - xm)) ** 2 for x, y in zip(xs, ys, strict=True)) / (L - 2)
            t = b / math.sqrt(s2 / sxx) if s2 > 0 else (0.0 if b == 0 else math.copysign(clip, b))
            t = max(-clip, min(clip, t))
            if abs(t) > abs(best):
                best = t
        out.append(best)
    return out


def test_cusum_and_trend_match_python_reference() -> None:
    bars = _gbm_bars(700, seed=3)
    # bar 0 is a roll bar (no previous close): its return is ln(C_0/O_0); the reference takes
    # r_0 = 0 on ln C, so set O_0 = C_0 to make the two agree
    bars = BarTable(**{**bars.columns(), "open": np.r_[bars.close[0], bars.open[1:]]})
    ft = compute_bar_features(bars)
    lnc = np.log(bars.close).tolist()
    cfg = BarFeatureConfig()
    ev, dirn, since = _ref_cusum(lnc, bars.session_id.tolist(), cfg.cusum_k, cfg.ewma_vol_span)
    np.testing.assert_array_equal(ft.columns["cusum_event"], ev)
    np.testing.assert_array_equal(ft.columns["cusum_direction"], dirn)
    np.testing.assert_array_equal(ft.columns["cusum_bars_since"], since)
    assert 20 < sum(ev) < 400 and -1 in dirn and 1 in dirn
    assert bars.session_id[0] != bars.session_id[-1]  # spans a session restart
    ref_t = _ref_trend(lnc, 5, 20, 50.0)
    np.testing.assert_allclose(ft.columns["trend_tvalue_5_20"], ref_t, rtol=1e-7, atol=1e-9)
    # a perfectly linear log price gives the clipped t; a constant one gives 0
    lin = np.exp(0.001 * np.arange(40.0)) * 100
    flat = np.full(40, 100.0)
    for series, want in ((lin, 50.0), (1 / lin, -50.0), (flat, 0.0)):
        t = compute_bar_features(_ohlc_bars(series, series, series, series)).columns["trend_tvalue_5_20"]
        assert (t[19:] == want).all()


@pytest.mark.parametrize(("lmin", "lmax"), [(5, 20), (3, 3), (4, 9)])
def test_trend_tvalue_block_kernel_is_the_one_bar_kernel_bit_for_bit(lmin: int, lmax: int) -> None:
    """The block trend kernel (what the feature uses: bars of a block in the vectorised inner
    loops, branch-free pick) against the one-bar kernel: every row bit for bit, for ranges of
    whole blocks, a partial last block, one row and none, on returns with runs of zeros
    (s^2 = 0: +-clip or 0), tiny and huge values and a NaN."""
    from fx_assets.core.bar_features import _TREND_BLOCK, _trend_tvalue_block_nb, _trend_tvalue_rows_nb

    rng = np.random.default_rng(11)
    r = rng.normal(0.0, 1e-4, 3000)
    r[100:140] = 0.0  # flat stretch: s^2 = 0, slope 0
    r[200:230] = 1e-4  # a perfectly linear stretch
    r[300] = 1e3
    r[400] = 1e-300
    r[500] = np.nan
    r[600:602] = -1e-4  # a short linear stretch: the pick of a shorter length
    # a steep fall, then a slow linear rise: with a small clip, +clip at the short lengths and
    # -clip at the long ones (a tie of |t| between different values: the shorter L is kept)
    r[700:715] = -1.0
    r[715:720] = 1e-3
    b = _TREND_BLOCK
    ranges = (
        (0, 3000),
        (0, 2999),
        (7, 2998),
        (lmax + 3, lmax + 8),
        (1000, 1001),
        (5, 5),
        (lmax - 1, lmax - 1 + b),  # exactly one block
        (lmax - 1, lmax - 1 + 2 * b + 1),  # two blocks and one row
    )
    for clip in (50.0, 2.0):
        for lo, hi in ranges:
            want = np.full(3000, np.nan)
            got = np.full(3000, np.nan)
            _trend_tvalue_rows_nb(r, lmin, lmax, clip, lo, hi, want)
            _trend_tvalue_block_nb(r, lmin, lmax, clip, lo, hi, got)
            assert got.tobytes() == want.tobytes(), (clip, lo, hi)
            if (lo, hi) == (0, 3000):
                assert np.isfinite(want).sum() > 2000 and (np.abs(want) == clip).any() and (want == 0.0).any()
    # the quarter-sized path (threads over contiguous cuts) against one call of the one-bar kernel
    from fx_assets.core.bar_features import _trend_tvalue

    big = rng.normal(0.0, 1e-4, 120_001)
    big[5000:5100] = 0.0
    want = np.full(big.shape[0], np.nan)
    _trend_tvalue_rows_nb(big, lmin, lmax, 50.0, 0, big.shape[0], want)
    assert _trend_tvalue(big, lmin, lmax, 50.0).tobytes() == want.tobytes()


@pytest.mark.parametrize("w", [2, 5, 50])
def test_rolling_z_and_rv_block_kernels_are_the_one_bar_kernels_bit_for_bit(w: int) -> None:
    """The block z-score and realized-vol kernels (what the features use: a block's bars in the
    vectorised inner loops) against the one-bar kernels: every bar bit for bit, for lengths of
    whole blocks, partial last blocks and shorter than the window, with a NaN, constant
    stretches (std 0 -> z 0) and large values."""
    from fx_assets.core.bar_features import (
        _WINDOW_BLOCK,
        _rolling_z_block_nb,
        _rolling_z_nb,
        _rv_block_nb,
        _rv_nb,
    )

    rng = np.random.default_rng(17)
    x = rng.normal(3.0, 1.5, 2000)
    x[300:400] = 2.5  # constant: std 0
    x[700] = 1e12
    x[900] = np.nan
    b = _WINDOW_BLOCK
    for n in (2000, 1999, 1998, 1997, w + 2, w, w - 1, 1, w - 1 + b, w + b, w - 2 + 2 * b):
        for fast, slow in ((_rolling_z_block_nb, _rolling_z_nb), (_rv_block_nb, _rv_nb)):
            want, got = slow(x[:n], w), fast(x[:n], w)
            assert got.tobytes() == want.tobytes(), (fast.__name__, n)
    z = _rolling_z_nb(x, w)
    assert (z[300 + w : 400] == 0.0).all() and np.isfinite(z[w:300]).all()


def test_cusum_kernel_writes_only_the_outputs_asked_for() -> None:
    """An empty output array is skipped; the others are the same as with all three asked for
    (the CUSUM filter of bench_peers asks for the event flags alone)."""
    from fx_assets.core.bar_features import _cusum_into_nb, _cusum_nb

    rng = np.random.default_rng(5)
    n = 5_000
    r = rng.normal(0.0, 1e-3, n)
    sigma = np.full(n, 1e-3)
    session = np.repeat(np.arange(5, dtype=np.int32), n // 5)
    ev, dirn, since = _cusum_nb(r, sigma, session, 2.0)
    assert 50 < ev.sum() < n // 2
    empty = np.empty(0, np.float64)
    for want in itertools.product((False, True), repeat=3):
        outs = [np.full(n, 7.0) if w else empty for w in want]
        _cusum_into_nb(r, sigma, session, 2.0, *outs)
        for w, got, ref in zip(want, outs, (ev, dirn, since), strict=True):
            if w:
                np.testing.assert_array_equal(got, ref)
            else:
                assert got.shape == (0,)


# --- causality and partitions -------------------------------------------------------------------


def test_truncation_and_perturbation_causality() -> None:
    bars = _trade_bars(n_sessions=6, roll_after=3)
    full = compute_bar_features(bars)
    rng = np.random.default_rng(0)
    for t in rng.choice(len(bars) - 1, 6, replace=False):
        cut = compute_bar_features(bars.slice(0, t + 1))
        head = FeatureTable(
            full.ts_close[: t + 1], {k: v[: t + 1] for k, v in full.columns.items()}, 0, full.config
        )
        _assert_tables_close(cut, head, atol=0.0)
        cols = {k: v.copy() for k, v in bars.columns().items()}
        f = np.r_[np.ones(t + 1), rng.uniform(0.9, 1.1, len(bars) - t - 1)]
        for k in ("open", "high", "low", "close", "vwap", "volume"):
            cols[k] = cols[k] * f
        cols["duration_ns"] = cols["duration_ns"].copy()
        cols["duration_ns"][t + 1 :] += 12345
        alt = compute_bar_features(BarTable(**cols))
        alt_head = FeatureTable(
            alt.ts_close[: t + 1], {k: v[: t + 1] for k, v in alt.columns.items()}, 0, alt.config
        )
        _assert_tables_close(alt_head, head, atol=0.0)


def test_partition_equivalence_with_warmup() -> None:
    bars = _trade_bars()
    w = max_window()
    starts = np.flatnonzero(np.r_[True, np.diff(bars.session_id) != 0])
    cuts = [0, int(starts[6]), int(starts[11]), len(bars)]
    assert min(b - a for a, b in itertools.pairwise(cuts)) >= w  # each part >= window
    whole = compute_bar_features(bars)
    parts = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        warm = None if k == 0 else bars.slice(max(0, a - w), a)
        ft = compute_bar_features(bars.slice(a, b), warmup=warm)
        assert len(ft) == b - a
        validate_features(ft, f"2024-Q{k + 1}|ES.FUT")
        if k > 0:
            assert all(np.isfinite(v).all() for v in ft.columns.values())  # no NaN inside
        parts.append(ft)
    joined = FeatureTable(
        np.concatenate([p.ts_close for p in parts]),
        {n: np.concatenate([p.columns[n] for p in parts]) for n in feature_names()},
        0,
        whole.config,
    )
    _assert_tables_close(joined, whole, atol=1e-9)


def test_roll_has_no_fake_jump() -> None:
    base = _gbm_bars(1500, seed=5)
    inst = np.r_[np.ones(700), np.full(800, 2)].astype(np.uint32)
    cols = {**base.columns(), "instrument_id": inst}
    nogap = BarTable(**cols)
    g = np.r_[np.ones(700), np.full(800, 1.3)]  # the new contract trades 30% higher
    gap = BarTable(**{**cols, **{k: cols[k] * g for k in ("open", "high", "low", "close", "vwap")}})
    a, b = compute_bar_features(nogap), compute_bar_features(gap)
    r = b.columns["log_return"]
    assert r[700] == pytest.approx(math.log(gap.close[700] / gap.open[700]), abs=1e-15)
    assert np.abs(r).max() < 0.02 and b.columns["log_return_clamped"].sum() == 0
    for name in feature_names():
        x, y = a.columns[name], b.columns[name]
        if name == "atr_14":
            y = y / g  # ATR is in price units: the back-adjusted state follows the new contract
        np.testing.assert_allclose(y, x, rtol=1e-9, atol=1e-11, equal_nan=True, err_msg=name)


def test_mirror_symmetry() -> None:
    bars = _gbm_bars(2000, seed=6)
    cols = bars.columns()
    mirror = BarTable(
        **{
            **cols,
            "open": 1 / cols["open"],
            "high": 1 / cols["low"],
            "low": 1 / cols["high"],
            "close": 1 / cols["close"],
            "vwap": 1 / cols["vwap"],
        }
    )
    a, b = compute_bar_features(bars), compute_bar_features(mirror)
    np.testing.assert_allclose(b.columns["log_return"], -a.columns["log_return"], atol=1e-15)
    np.testing.assert_allclose(
        b.columns["trend_tvalue_5_20"], -a.columns["trend_tvalue_5_20"], rtol=1e-7, atol=1e-7
    )
    same = a.columns["cusum_event"] == b.columns["cusum_event"]
    assert same.mean() > 0.99 and a.columns["cusum_event"].sum() > 50
    d_a, d_b = a.columns["cusum_direction"], b.columns["cusum_direction"]
    # before the first disagreement the directions are exact mirrors
    first = int(np.argmin(same)) if not same.all() else len(same)
    np.testing.assert_array_equal(d_b[:first], -d_a[:first])
    np.testing.assert_allclose(b.columns["ewma_vol_100"], a.columns["ewma_vol_100"], rtol=1e-9)


# --- validation, registry, tables ---------------------------------------------------------------


def test_validate_features_names_feature_and_bar() -> None:
    bars = _gbm_bars(800, seed=7)
    ft = compute_bar_features(bars)
    validate_features(ft, "2024-Q1|ES.FUT")  # NaN only inside warm-up: fine
    assert np.isnan(ft.columns["adx_14"][:27]).all() and np.isfinite(ft.columns["adx_14"][27:]).all()

    def broken(name: str, j: int, value: float) -> FeatureTable:
        cols = {k: v.copy() for k, v in ft.columns.items()}
        cols[name][j] = value
        return FeatureTable(ft.ts_close, cols, ft.n_prior, ft.config)

    with pytest.raises(FxDataError, match=r"2024-Q2\|ES.FUT.*'rsi_14' bar 500 is .*nan"):
        validate_features(broken("rsi_14", 500, math.nan), "2024-Q2|ES.FUT")
    with pytest.raises(FxDataError, match=r"'adx_14' bar 300 .*outside its bounds"):
        validate_features(broken("adx_14", 300, 150.0), "p")
    with pytest.raises(FxDataError, match=r"'log_volume' bar 3 is .*inf"):
        validate_features(broken("log_volume", 3, math.inf), "p")
    with pytest.raises(FxDataError, match=r"'log_return' bar 9 .*outside its bounds"):
        validate_features(broken("log_return", 9, 0.2), "p")
    # with warm-up bars before it, the same leading NaN is a violation
    shifted = FeatureTable(ft.ts_close, ft.columns, 100, ft.config)
    with pytest.raises(FxDataError, match="rv_20"):
        validate_features(shifted, "p")


def _validate_features_numpy(table: FeatureTable, partition: str) -> None:
    """``validate_features`` as it was before its one-pass kernel (the reference)."""
    rows = np.arange(len(table)) + table.n_prior
    for spec in build_registry(table.config):
        v = table.columns.get(spec.name)
        if v is None:
            raise FxDataError(f"{partition}: feature {spec.name!r} missing")
        if v.shape != (len(table),):
            raise FxDataError(f"{partition}: feature {spec.name!r} has shape {v.shape}")
        finite = np.isfinite(v)
        bad = np.flatnonzero(~finite & ~(np.isnan(v) & (rows < spec.warmup)))
        if bad.size:
            j = int(bad[0])
            raise FxDataError(
                f"{partition}: feature {spec.name!r} bar {j} is {v[j]!r} outside its warm-up "
                f"({spec.warmup} bars; {table.n_prior} warm-up bars preceded)"
            )
        if spec.bounds is not None:
            lo, hi = spec.bounds
            out = np.flatnonzero(finite & ((v < lo) | (v > hi)))
            if out.size:
                j = int(out[0])
                raise FxDataError(
                    f"{partition}: feature {spec.name!r} bar {j} is {v[j]!r}, outside its bounds [{lo}, {hi}]"
                )


def _verdict(fn, table: FeatureTable) -> str:
    try:
        fn(table, "p")
    except FxDataError as exc:
        return str(exc)
    return "ok"


def test_validate_features_matches_numpy_reference() -> None:
    """The one-pass validation raises exactly what the NumPy form raised (same feature, bar,
    value and message), or passes where it passed: planted NaN, +-inf and out-of-bounds values
    (alone and together, inside and outside the warm-up, at bounds exactly), with 0 and with
    some warm-up bars before the table; 2,500 bars: the kernel screens blocks of 1,024, so a
    violation can sit in a later block than an earlier, weaker one."""
    ft = compute_bar_features(_gbm_bars(2500, seed=3))
    specs = {s.name: s for s in build_registry(ft.config)}
    bounded = [n for n, s in specs.items() if s.bounds is not None]
    rng = np.random.default_rng(5)
    cases = 0
    for trial in range(300):
        cols = {k: v.copy() for k, v in ft.columns.items()}
        picked = str(rng.choice(bounded))  # several values planted in one feature: they interact
        for _ in range(int(rng.integers(0, 5))):
            name = picked if rng.random() < 0.7 else str(rng.choice(list(cols)))
            j = int(rng.integers(0, 60)) if rng.random() < 0.4 else int(rng.integers(0, 2500))
            kind = int(rng.integers(0, 5))
            if kind == 0:
                cols[name][j] = math.nan
            elif kind == 1:
                cols[name][j] = math.inf * (1 if rng.random() < 0.5 else -1)
            elif name in bounded:
                lo, hi = specs[name].bounds  # type: ignore[misc]
                cols[name][j] = [lo - 1e-9, hi + 1e-9, lo, hi][kind - 2 + int(rng.integers(0, 2))]
        n_prior = int(rng.choice([0, 5, 30, 100]))
        table = FeatureTable(ft.ts_close, cols, n_prior, ft.config)
        want = _verdict(_validate_features_numpy, table)
        assert _verdict(validate_features, table) == want, (trial, want)
        cases += want != "ok"
    assert 100 < cases < 300  # both verdicts met
    # a weaker violation (out of bounds) in an earlier block than a stronger one (inf / NaN)
    name = bounded[0]
    for late in (math.inf, math.nan):
        cols = {k: v.copy() for k, v in ft.columns.items()}
        cols[name][100] = specs[name].bounds[1] + 1.0  # type: ignore[index]
        cols[name][2200] = late
        table = FeatureTable(ft.ts_close, cols, 0, ft.config)
        want = _verdict(_validate_features_numpy, table)
        assert "bar 2200" in want and _verdict(validate_features, table) == want


def test_registry_contract() -> None:
    names = feature_names()
    assert len(set(names)) == len(names) == len(FEATURES)
    for required in (
        "log_return", "log_return_clamped", "rv_20", "rv_50", "ewma_vol_100", "atr_14", "natr_14",
        "plus_di_14", "minus_di_14", "adx_14", "rsi_14", "macd_12_26", "macd_signal_9",
        "macd_hist", "bb_pctb_20", "cusum_event", "cusum_direction", "cusum_bars_since",
        "trend_tvalue_5_20", "log_volume", "volume_z_50", "buy_volume_frac", "log_duration",
        "duration_z_50", "time_of_day_sin", "time_of_day_cos", "session_progress",
        "bars_since_session_open",
    ):  # fmt: skip
        assert required in names
    for s in FEATURES:
        assert s.description and s.window >= 1 and 0 <= s.warmup < s.window + 1
        assert s.bounds is None or s.bounds[0] < s.bounds[1]
    assert max_window() == max(s.window for s in FEATURES)
    assert 1000 < max_window() < 3000  # EWMA-100 forgets its start to 1e-12 after ~1.4k bars
    other = BarFeatureConfig(rv_windows=(10,), z_window=30, wilder_period=7)
    assert {"rv_10", "volume_z_30", "adx_7"} <= set(feature_names(other))
    assert len(build_registry(other)) == len(FEATURES) - 1
    with pytest.raises(ValueError):
        BarFeatureConfig(macd_fast=30)


def test_arrow_roundtrip_time_features_and_bad_input() -> None:
    bars = _trade_bars(n_sessions=2, roll_after=None)
    ft = compute_bar_features(bars)
    back = FeatureTable.from_arrow(ft.to_arrow())
    _assert_tables_close(back, ft, atol=0.0)
    assert back.n_prior == 0 and back.config == ft.config
    # clock features against the calendar, computed independently
    tod = calendar.local_time_of_day_ns(bars.ts_close) / calendar.NS_PER_DAY
    np.testing.assert_allclose(ft.columns["time_of_day_sin"], np.sin(2 * np.pi * tod), atol=1e-12)
    p = ft.columns["session_progress"]
    assert (p >= 0).all() and (p <= 1).all() and np.all(np.diff(p)[np.diff(bars.session_id) == 0] >= 0)
    since = ft.columns["bars_since_session_open"]
    assert since[0] == 0 and (since[np.r_[False, np.diff(bars.session_id) != 0]] == 0).all()
    validate_features(ft, "x")
    with pytest.raises(FxDataError, match="warmup"):
        compute_bar_features(bars.slice(0, 100), warmup=bars.slice(100, 200))
    bad = BarTable(**{**bars.columns(), "close": np.r_[bars.close[:5], -1.0, bars.close[6:]]})
    with pytest.raises(FxDataError, match="'close' bar 5"):
        compute_bar_features(bad)


def test_cusum_filter_matches_the_bar_feature_kernel_on_math_log_returns() -> None:
    """``cusum_filter`` (log increments inline, repeated prices skipped) gives the events of
    ``_cusum_into_nb`` with one session and sigma 1 on the returns ``math.log`` gives."""
    from fx_assets.core.bar_features import _EMPTY, _cusum_into_nb, cusum_filter

    rng = np.random.default_rng(7)
    # trade prices on a tick grid (runs of repeats), and a continuous walk (both sums live)
    grid = 4000.0 + np.cumsum(rng.choice([-2, -1, 0, 0, 0, 1, 2], size=20_000) * 0.25)
    walk = 4000.0 * np.exp(np.cumsum(rng.normal(0.0, 3e-4, size=20_000)))
    for price, h in itertools.product((grid, walk), (0.0001, 0.0005, 0.002)):
        r = np.array([0.0] + [math.log(price[j] / price[j - 1]) for j in range(1, price.size)])
        ev = np.empty_like(r)
        _cusum_into_nb(r, np.ones(r.size), np.zeros(r.size, np.int32), h, ev, _EMPTY, _EMPTY)
        want = np.flatnonzero(ev)
        got = cusum_filter(price, h)
        assert want.size > 20
        np.testing.assert_array_equal(got, want)
    assert cusum_filter(np.array([]), 0.1).size == 0
    assert cusum_filter(np.array([5.0]), 0.1).size == 0


@pytest.mark.parametrize(
    ("price", "where"),
    [
        ([1.0, 2.0, float("nan")], "price[2] = nan"),
        ([0.0, 1.0], "price[0] = 0.0"),
        ([1.0, -1.0], "price[1] = -1.0"),
    ],
)
def test_cusum_filter_refuses_a_bad_price_naming_it(price: list[float], where: str) -> None:
    from fx_assets.core.bar_features import cusum_filter

    with pytest.raises(FxDataError, match=re.escape(where)):
        cusum_filter(np.array(price), 0.01)
    with pytest.raises(FxDataError, match="threshold"):
        cusum_filter(np.array([1.0, 2.0]), float("inf"))
