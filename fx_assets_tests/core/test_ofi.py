"""Tests of fx_assets.core.ofi: plain-Python references, causality, mirror, identities,
sharding, partition continuity and validation."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from fx_assets.core.errors import FxDataError
from fx_assets.core.ofi import (
    BookArrays,
    OfiConfig,
    OfiFeatures,
    TradeArrays,
    UnsignedSizeBook,
    _column_flags_nb,
    _first_ge_nb,
    _scan_column_nb,
    _search_right_nb,
    book_state_row,
    compute_ofi_features,
    ofi_feature_registry,
    ofi_warmup_bars,
    search_right,
    validate_ofi,
)

TICK = 2.0**-13  # binary-exact tick so that p -> 2c - p is exact in float64
LEV = 10


def small_cfg(**kw: object) -> OfiConfig:
    base: dict[str, object] = dict(
        vpin_bucket_volume=30.0,
        vpin_buckets=5,
        kyle_window=10,
        kyle_min_bars=5,
        trade_imbalance_windows=(1, 3, 6),
        hawkes_bars=8,
        hawkes_decay_s=0.5,
        n_shards=1,
        n_workers=1,
    )
    base.update(kw)
    return OfiConfig(**base)


# ------------------------------------------------------------------------------------------
# Synthetic market
# ------------------------------------------------------------------------------------------


def make_market(
    seed: int, n_snap: int = 2000, n_trades: int = 900, n_bars: int = 90, roll_at: int | None = 45
) -> tuple[BookArrays, TradeArrays, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t0 = 1_700_000_000_000_000_000
    b_ts = t0 + np.sort(rng.integers(0, 60_000_000_000, n_snap))
    best = 9000 + np.cumsum(rng.integers(-1, 2, n_snap))  # best bid in ticks
    spread = rng.choice([1, 1, 1, 2, 3], n_snap)
    gaps_b = rng.choice([1, 1, 1, 2], (n_snap, LEV))
    gaps_a = rng.choice([1, 1, 1, 2], (n_snap, LEV))
    gaps_b[:, 0] = 0
    gaps_a[:, 0] = 0
    bid_k = best[:, None] - np.cumsum(gaps_b, axis=1)
    ask_k = (best + spread)[:, None] + np.cumsum(gaps_a, axis=1)
    bid_px = bid_k * TICK
    ask_px = ask_k * TICK
    # Missing deep levels (thin book) on some snapshots.
    for side in (bid_px, ask_px):
        thin = rng.random(n_snap) < 0.15
        depth = rng.integers(2, LEV, n_snap)
        for i in np.flatnonzero(thin):
            side[i, depth[i] :] = np.nan
    bid_sz = rng.integers(1, 60, (n_snap, LEV)).astype(float)
    ask_sz = rng.integers(1, 60, (n_snap, LEV)).astype(float)
    bid_ct = rng.integers(1, 9, (n_snap, LEV)).astype(float)
    ask_ct = rng.integers(1, 9, (n_snap, LEV)).astype(float)
    # A few crossed / one-sided snapshots that must be dropped.
    bad = rng.choice(n_snap, 6, replace=False)
    bid_px[bad[:3], 0] = ask_px[bad[:3], 0] + TICK
    ask_px[bad[3:], 0] = np.nan
    book = BookArrays(b_ts, bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct)

    t_ts = t0 + np.sort(rng.integers(0, 60_000_000_000, n_trades))
    if n_trades > 13:
        t_ts[10:13] = t_ts[10]  # same-ns trades
    size = rng.integers(1, 15, n_trades).astype(float)
    sign = rng.choice(np.array([-1, 1, 1, -1, 0], np.int8), n_trades)
    price = 1.1 + np.zeros(n_trades)
    trades = TradeArrays(t_ts, price, size, sign)

    closes = np.sort(rng.choice(np.arange(min(20, n_trades // 3), n_trades - 1), n_bars - 1, replace=False))
    tau = np.append(t_ts[closes], t_ts[-1])
    tau = np.maximum.accumulate(tau)
    inst = np.ones(n_bars, np.uint32)
    if roll_at is not None:
        inst[roll_at:] = 2
    # A bar with no book event: drop the snapshots of bar 30's window.
    if n_bars > 30:
        keep = ~((b_ts > tau[29]) & (b_ts <= tau[30]))
        book = BookArrays(*(getattr(book, f)[keep] for f in BookArrays.__dataclass_fields__))
    return book, trades, tau, inst


def run(book, trades, tau, inst, cfg=None, **kw):
    return compute_ofi_features(book, trades, tau, inst, cfg or small_cfg(), tick_size=TICK, **kw)


def assert_same(a: OfiFeatures, b: OfiFeatures, tol: float = 0.0, rows: slice = slice(None)) -> None:
    for k in a.columns:
        x, y = a.columns[k][rows], b.columns[k][rows]
        assert np.array_equal(np.isnan(x), np.isnan(y)), k
        m = ~np.isnan(x)
        d = np.max(np.abs(x[m] - y[m]), initial=0.0)
        assert d <= tol, (k, d)


# ------------------------------------------------------------------------------------------
# Plain-Python reference of CKS / MLOFI / imbalances
# ------------------------------------------------------------------------------------------


def ref_ofi(book: BookArrays, tau: np.ndarray, inst: np.ndarray, L: int = LEV) -> dict[str, list[float]]:
    def lvl(px: float, sz: float, bid: bool) -> tuple[float, float]:
        if math.isnan(px):
            return (-math.inf if bid else math.inf), 0.0
        return px, sz

    out: dict[str, list[float]] = {
        k: []
        for k in (
            "ofi_l1",
            "ofi_l1_norm",
            "mlofi_1_5",
            "mlofi_1_10",
            "l1_imbalance",
            "depth_imbalance_5",
            "depth_imbalance_10",
        )
    }
    prev = None
    last = None
    for j in range(len(tau)):
        if j == 0 or inst[j] != inst[j - 1]:
            prev = None
            last = None
        lo = -(2**62) if j == 0 else tau[j - 1]
        ofi = [0.0] * L
        d1 = d5 = dl = 0.0
        ns = 0
        for i in range(len(book.ts)):
            if not (lo < book.ts[i] <= tau[j]):
                continue
            b0, a0 = book.bid_px[i, 0], book.ask_px[i, 0]
            if math.isnan(b0) or math.isnan(a0) or b0 > a0:
                continue
            ns += 1
            for m in range(L):
                pb, qb = lvl(book.bid_px[i, m], book.bid_sz[i, m], True)
                pa, qa = lvl(book.ask_px[i, m], book.ask_sz[i, m], False)
                d1 += (qb + qa) / 2 if m == 0 else 0.0
                d5 += (qb + qa) / 2 if m < 5 else 0.0
                dl += (qb + qa) / 2
                if prev is not None:
                    ppb, pqb = lvl(book.bid_px[prev, m], book.bid_sz[prev, m], True)
                    ppa, pqa = lvl(book.ask_px[prev, m], book.ask_sz[prev, m], False)
                    e = (qb if pb >= ppb else 0) - (pqb if pb <= ppb else 0)
                    e += -(qa if pa <= ppa else 0) + (pqa if pa >= ppa else 0)
                    ofi[m] += e
            prev = i
            last = i
        out["ofi_l1"].append(ofi[0])
        out["ofi_l1_norm"].append(ofi[0] / (d1 / ns) if ns and d1 > 0 else 0.0)
        out["mlofi_1_5"].append(sum(ofi[:5]) / (d5 / (ns * 5)) if ns and d5 > 0 else 0.0)
        out["mlofi_1_10"].append(sum(ofi) / (dl / (ns * L)) if ns and dl > 0 else 0.0)
        if last is None:
            for k in ("l1_imbalance", "depth_imbalance_5", "depth_imbalance_10"):
                out[k].append(math.nan)
            continue
        vb = [0.0 if math.isnan(book.bid_px[last, m]) else book.bid_sz[last, m] for m in range(L)]
        va = [0.0 if math.isnan(book.ask_px[last, m]) else book.ask_sz[last, m] for m in range(L)]
        out["l1_imbalance"].append((vb[0] - va[0]) / (vb[0] + va[0]))
        out["depth_imbalance_5"].append(
            sum(b - a for b, a in zip(vb[:5], va[:5], strict=True))
            / sum(b + a for b, a in zip(vb[:5], va[:5], strict=True))
        )
        out["depth_imbalance_10"].append(
            sum(b - a for b, a in zip(vb, va, strict=True)) / sum(b + a for b, a in zip(vb, va, strict=True))
        )
    return out


def test_reference_equals_kernel_small_handmade_book() -> None:
    book, trades, tau, inst = make_market(1, n_snap=34, n_trades=40, n_bars=5, roll_at=None)
    # make bar windows land on the snapshots: 5 bars over the book's time span
    tau = np.quantile(book.ts, [0.15, 0.4, 0.6, 0.85, 1.0]).astype(np.int64)
    tau[-1] = book.ts[-1]
    f = run(book, trades, tau, inst[:5])
    ref = ref_ofi(book, tau, inst[:5])
    for k, v in ref.items():
        np.testing.assert_array_equal(f.columns[k], np.array(v), err_msg=k)
    assert np.any(f.columns["ofi_l1"] != 0) and np.any(f.columns["mlofi_1_10"] != f.columns["ofi_l1"])


def test_reference_equals_kernel_with_roll_and_empty_bar() -> None:
    book, trades, tau, inst = make_market(2, n_snap=600, n_trades=300, n_bars=30, roll_at=12)
    f = run(book, trades, tau, inst)
    ref = ref_ofi(book, tau, inst)
    for k, v in ref.items():
        np.testing.assert_array_equal(f.columns[k], np.array(v), err_msg=k)


def _two_snapshot_ofi(
    prev: tuple[float, float, float, float], cur: tuple[float, float, float, float]
) -> float:
    """ofi_l1 of one bar holding the snapshots prev → cur, (Pb, Qb, Pa, Qa), tick 1."""
    n = 2
    px = np.full((n, 5), np.nan)
    bid_px, ask_px = px.copy(), px.copy()
    bid_sz, ask_sz = np.zeros((n, 5)), np.zeros((n, 5))
    for i, (pb, qb, pa, qa) in enumerate((prev, cur)):
        bid_px[i, 0], bid_sz[i, 0], ask_px[i, 0], ask_sz[i, 0] = pb, qb, pa, qa
    book = BookArrays(np.array([10, 20]), bid_px, ask_px, bid_sz, ask_sz, np.ones((n, 5)), np.ones((n, 5)))
    trades = TradeArrays(np.array([15]), np.array([100.5]), np.array([1.0]), np.array([1], np.int8))
    cfg = OfiConfig(levels=5, n_shards=1, n_workers=1)
    f = compute_ofi_features(book, trades, np.array([30]), np.array([1], np.uint32), cfg, tick_size=1.0)
    # Levels 2..5 absent in both snapshots: MLOFI sum = level-1 OFI; Q̄^5 = Σ L1 depth / (2·2·5).
    q5 = (prev[1] + prev[3] + cur[1] + cur[3]) / 2 / (2 * 5)
    assert f.columns["mlofi_1_5"][0] == f.columns["ofi_l1"][0] / q5
    return float(f.columns["ofi_l1"][0])


@pytest.mark.parametrize(
    ("cur", "expected"),
    [
        ((101, 7, 102, 20), +7),  # bid up: +Qb_n
        ((100, 15, 102, 20), +5),  # bid unchanged: +ΔQb
        ((99, 30, 102, 20), -10),  # bid down: −Qb_{n−1}
        ((100, 10, 103, 5), +20),  # ask up: +Qa_{n−1}
        ((100, 10, 102, 25), -5),  # ask unchanged: −ΔQa
        ((100, 10, 101, 8), -8),  # ask down: −Qa_n
        ((101, 4, 101.5, 6), +4 - 6),  # both improve: +Qb_n − Qa_n
    ],
)
def test_cks_table_hand_checked(cur: tuple[float, float, float, float], expected: float) -> None:
    assert _two_snapshot_ofi((100, 10, 102, 20), cur) == expected


# ------------------------------------------------------------------------------------------
# Causality
# ------------------------------------------------------------------------------------------


def _cut(book: BookArrays, trades: TradeArrays, t: int) -> tuple[BookArrays, TradeArrays]:
    kb = book.ts <= t
    kt = trades.ts <= t
    return (
        BookArrays(*(getattr(book, f)[kb] for f in BookArrays.__dataclass_fields__)),
        TradeArrays(*(getattr(trades, f)[kt] for f in TradeArrays.__dataclass_fields__)),
    )


def _alter_after(book: BookArrays, trades: TradeArrays, t: int, seed: int) -> tuple[BookArrays, TradeArrays]:
    rng = np.random.default_rng(seed)
    mb = book.ts > t
    bid_sz = book.bid_sz.copy()
    bid_sz[mb] = rng.integers(1, 500, bid_sz[mb].shape)
    bid_px = book.bid_px.copy()
    bid_px[mb] -= 3 * TICK
    size = trades.size.copy()
    sign = trades.sign.copy()
    mt = trades.ts > t
    size[mt] = rng.integers(1, 90, mt.sum())
    sign[mt] = -sign[mt]
    return replace(book, bid_sz=bid_sz, bid_px=bid_px), replace(trades, size=size, sign=sign)


def test_truncation_and_alteration_after_close_change_nothing_before() -> None:
    book, trades, tau, inst = make_market(3)
    full = run(book, trades, tau, inst)
    rng = np.random.default_rng(0)
    for t in rng.choice(np.arange(5, len(tau) - 2), 6, replace=False):
        rows = slice(0, t + 1)
        cb, ct = _cut(book, trades, int(tau[t]))
        assert_same(full, run(cb, ct, tau, inst), rows=rows)
        assert_same(full, run(cb, ct, tau[: t + 1], inst[: t + 1]), rows=rows)
        ab, at = _alter_after(book, trades, int(tau[t]), int(t))
        altered = run(ab, at, tau, inst)
        assert_same(full, altered, rows=rows)
        assert not np.array_equal(full.columns["ofi_l1"][t + 1 :], altered.columns["ofi_l1"][t + 1 :])


def test_event_one_ns_after_close_goes_to_next_bar() -> None:
    book, trades, tau, inst = make_market(4)
    t = int(np.flatnonzero(np.diff(tau) > 10)[20])
    base = run(book, trades, tau, inst)
    i = int(np.searchsorted(book.ts, tau[t], side="right"))
    ins = {f: getattr(book, f) for f in BookArrays.__dataclass_fields__}
    row = {f: ins[f][i - 1].copy() for f in ins if f != "ts"}
    row["bid_sz"][:] = 999.0
    row["ask_px"][:] += TICK  # ask one tick up, bid queue 999: OFI and mid move at τ_t + 1
    new = {f: np.insert(ins[f], i, (tau[t] + 1) if f == "ts" else row[f], axis=0) for f in ins}
    j = int(np.searchsorted(trades.ts, tau[t], side="right"))
    nt = TradeArrays(
        np.insert(trades.ts, j, tau[t] + 1),
        np.insert(trades.price, j, 1.1),
        np.insert(trades.size, j, 500.0),
        np.insert(trades.sign, j, np.int8(1)),
    )
    moved = run(BookArrays(**new), nt, tau, inst)
    assert_same(base, moved, rows=slice(0, t + 1))
    assert moved.columns["n_book_events"][t + 1] == base.columns["n_book_events"][t + 1] + 1
    assert moved.columns["n_trades"][t + 1] == base.columns["n_trades"][t + 1] + 1
    for k in ("ofi_l1", "mid_realized_var"):
        assert moved.columns[k][t + 1] != base.columns[k][t + 1], k
    # ... while an event exactly at τ_t belongs to bar t.
    at = {f: np.insert(ins[f], i, tau[t] if f == "ts" else row[f], axis=0) for f in ins}
    same = run(BookArrays(**at), trades, tau, inst)
    assert same.columns["n_book_events"][t] == base.columns["n_book_events"][t] + 1
    assert_same(base, same, rows=slice(0, t))


# ------------------------------------------------------------------------------------------
# Mirror, bounds, identities
# ------------------------------------------------------------------------------------------


def mirror(book: BookArrays, trades: TradeArrays, c: float) -> tuple[BookArrays, TradeArrays]:
    return (
        BookArrays(
            book.ts,
            2 * c - book.ask_px,
            2 * c - book.bid_px,
            book.ask_sz,
            book.bid_sz,
            book.ask_ct,
            book.bid_ct,
        ),
        TradeArrays(trades.ts, 2 * c - trades.price, trades.size, (-trades.sign).astype(np.int8)),
    )


def test_mirror_flips_signed_features_and_bounds_hold() -> None:
    book, trades, tau, inst = make_market(5)
    cfg = small_cfg()
    f = run(book, trades, tau, inst, cfg)
    c = 9000 * TICK
    mb, mt = mirror(book, trades, c)
    g = run(mb, mt, tau, inst, cfg)
    reg = ofi_feature_registry(cfg)
    for name, spec in reg.items():
        x, y = f.columns[name], g.columns[name]
        if spec.mirror_partner:
            y = g.columns[spec.mirror_partner]
        expect = -x if spec.signed else x
        assert np.array_equal(np.isnan(expect), np.isnan(y)), name
        m = ~np.isnan(x)
        if spec.log_price:
            # ln(2c − m) is not −ln(m): only O(Δp/p) agreement for ln-mid features.
            scale = float(np.max(np.abs(x[m]), initial=0.0))
            np.testing.assert_allclose(y[m], expect[m], rtol=2e-2, atol=2e-2 * scale, err_msg=name)
        else:
            assert np.max(np.abs(y[m] - expect[m]), initial=0.0) <= 1e-12, name
        if np.isfinite(spec.lower) or np.isfinite(spec.upper):
            assert np.all((x[m] >= spec.lower) & (x[m] <= spec.upper)), name
    signed = [k for k, s in reg.items() if s.signed]
    assert {"ofi_l1", "mlofi_1_5", "l1_imbalance", "trade_imbalance_1", "microprice_offset"} <= set(signed)
    v = f.columns["vpin_5"]
    assert np.isfinite(v).sum() > 50 and np.nanmin(v) >= 0 and np.nanmax(v) <= 1
    for k in ("l1_imbalance", "depth_imbalance_5", "depth_imbalance_10", "trade_imbalance_6"):
        assert np.nanmax(np.abs(f.columns[k])) <= 1


def test_identities_com_weighted_mid() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        pb = 9000 * TICK
        pa = pb + rng.integers(1, 4) * TICK
        qb, qa = rng.integers(1, 100, 2).astype(float)
        row = book_state_row(
            np.array([pb]), np.array([pa]), np.array([qb]), np.array([qa]), np.ones(1), np.ones(1), TICK
        )
        m = (pa + pb) / 2
        s = pa - pb
        mw = (qb * pa + qa * pb) / (qb + qa)
        com1 = (qb * pb + qa * pa) / (qb + qa)
        i1 = (qb - qa) / (qb + qa)
        assert row["l1_imbalance"] == i1
        # m_w = m + I_1·s/2, and the feature is (m_w − m)/tick
        assert abs(mw - (m + i1 * s / 2)) <= 1e-15
        assert abs(row["microprice_offset"] * TICK - (mw - m)) <= 1e-15
        assert abs(row["weighted_mid_offset"] * s - (mw - m)) <= 1e-15
        # COM_1 − m = −(m_w − m); book_com_offset = (m − P_com)/tick
        assert abs((com1 - m) + (mw - m)) <= 1e-15
        assert abs(row["book_com_offset"] - row["microprice_offset"]) <= 1e-12


def test_slope_and_com_asymmetry_hand_computed() -> None:
    bpx = np.array([99.0, 98.0, 96.0])
    apx = np.array([101.0, 102.0, np.nan])
    bsz = np.array([2.0, 3.0, 5.0])
    asz = np.array([4.0, 1.0, 7.0])
    row = book_state_row(bpx, apx, bsz, asz, np.array([1.0, 2, 3]), np.array([4.0, 1, 9]), 1.0)
    v1, v2, v3 = math.log(3), math.log(6), math.log(11)
    bid = (v1 / 1 + (v2 / v1 - 1) / 1 + (v3 / v2 - 1) / 2) / 3
    w1, w2 = math.log(5), math.log(6)
    ask = (w1 / 1 + (w2 / w1 - 1) / 1) / 2
    assert row["bid_slope"] == pytest.approx(bid, rel=1e-14)
    assert row["ask_slope"] == pytest.approx(ask, rel=1e-14)
    db = (2 * 1 + 3 * 2 + 5 * 4) / 10
    da = (4 * 1 + 1 * 2) / 5
    assert row["book_com_asymmetry"] == pytest.approx((da - db) / (da + db), rel=1e-14)
    assert row["order_count_imbalance"] == pytest.approx((6 - 5) / 11, rel=1e-14)
    assert row["spread_ticks"] == 2.0
    assert row["depth_imbalance_5"] == pytest.approx((10 - 5) / 15, rel=1e-14)


# ------------------------------------------------------------------------------------------
# Flow features against direct computations
# ------------------------------------------------------------------------------------------


def test_vpin_pro_rata_buckets_hand_case() -> None:
    book, _, _, _ = make_market(8, n_snap=20, n_trades=10, n_bars=3, roll_at=None)
    t = book.ts
    trades = TradeArrays(
        np.array([t[2], t[5]]), np.array([1.1, 1.1]), np.array([15.0, 5.0]), np.array([1, -1], np.int8)
    )
    cfg = small_cfg(vpin_bucket_volume=10.0, vpin_buckets=2)
    tau = np.array([t[3], t[6], t[-1]])
    f = run(book, trades, tau, np.ones(3, np.uint32), cfg)
    # bar 0: 15 contracts < 2·10 → NaN. bar 1: cum 20, buckets [0,10] = +10, [10,20] = +5 −5.
    v = f.columns["vpin_2"]
    assert math.isnan(v[0]) and v[1] == 0.5 and v[2] == 0.5
    assert f.columns["trade_imbalance_1"][0] == 1.0 and f.columns["trade_imbalance_1"][1] == -1.0
    assert f.columns["trade_imbalance_3"][1] == pytest.approx(10 / 20)


def _vpin_ref(size: np.ndarray, sign: np.ndarray, n_buckets: int, v: float) -> float:
    """VPIN from the definition: n buckets of v contracts ending at the last trade, each trade
    split pro-rata over the buckets it overlaps (integer sizes: every overlap is exact)."""
    cum_hi = np.cumsum(size)
    total = float(cum_hi[-1]) if size.size else 0.0
    if size.size == 0 or total - n_buckets * v < -1e-9:
        return math.nan
    acc = 0.0
    for k in range(1, n_buckets + 1):
        lo_c, hi_c = total - k * v, total - (k - 1) * v
        imb = 0.0
        for s, g, ch in zip(size, sign, cum_hi, strict=True):
            ov = max(0.0, min(ch, hi_c) - max(ch - s, lo_c))
            imb += g * ov
        acc += abs(imb)
    return acc / (n_buckets * v)


def test_vpin_against_definition_with_long_boundary_moves_and_shards() -> None:
    # Bars of very different volumes (some without trades), zero-size trades and buckets
    # much smaller than a bar: the boundary search moves by 0 to hundreds of trades per bar.
    rng = np.random.default_rng(21)
    n_tr = 6000
    t0 = 1_700_000_000_000_000_000
    t_ts = t0 + np.sort(rng.integers(0, 10**12, n_tr))
    size = rng.choice(np.array([0.0, 1.0, 1.0, 2.0, 3.0, 7.0]), n_tr)
    sign = rng.choice(np.array([-1, 0, 1, 1], np.int8), n_tr)
    trades = TradeArrays(t_ts, np.full(n_tr, 1.1), size, sign)
    cut = np.sort(rng.choice(np.arange(1, n_tr - 1), 70, replace=False))
    cut = np.concatenate([cut[:30], np.repeat(cut[30], 3), cut[31:]])  # bars without trades
    tau = np.append(t_ts[cut], t_ts[-1])
    inst = np.ones(len(tau), np.uint32)
    inst[50:] = 2
    book, _, _, _ = make_market(21, n_snap=300, n_trades=10, n_bars=3, roll_at=None)
    cfg = small_cfg(vpin_bucket_volume=7.0, vpin_buckets=40, n_shards=1, n_workers=1)
    seq = run(book, trades, tau, inst, cfg)
    v = seq.columns["vpin_40"]
    for j in range(len(tau)):
        s0 = 0 if j < 50 else 50
        lo = tau[s0 - 1] if s0 else -(2**62)
        m = (t_ts > lo) & (t_ts <= tau[j])
        ref = _vpin_ref(size[m], sign[m].astype(float), 40, 7.0)
        assert (math.isnan(ref) and math.isnan(v[j])) or v[j] == pytest.approx(ref, abs=1e-12), j
    assert np.isfinite(v).sum() > 40
    for k in (2, 3, 7, 13, len(tau)):
        par = run(book, trades, tau, inst, small_cfg(**{**cfg.model_dump(), "n_shards": k, "n_workers": 2}))
        assert_same(seq, par, tol=0.0)


def _vpin_by_search(t_ts, size, sign, tau, inst, n_buckets: int, v: float) -> np.ndarray:
    """The bar pass's VPIN as first written, in Python: every boundary's trade found by a
    search (no cache of F values), the same float operations in the same order."""
    cumv, cumd = np.cumsum(size), np.cumsum(size * sign)
    hi = np.searchsorted(t_ts, tau, side="right")
    lo = np.concatenate([[0], hi[:-1]])
    out = np.full(len(tau), np.nan)
    s0 = 0
    for j in range(len(tau)):
        if j and inst[j] != inst[j - 1]:
            s0 = j
        tlo, thi = int(lo[s0]), int(hi[j])
        base = float(cumv[tlo - 1]) if tlo > 0 else 0.0
        cj = float(cumv[thi - 1]) if thi > tlo else base
        if not (thi > tlo and cj - n_buckets * v >= base - 1e-9):
            continue
        acc, fhi = 0.0, float(cumd[thi - 1])
        for k in range(1, n_buckets + 1):
            c = cj - k * v
            i = min(tlo + int(np.searchsorted(cumv[tlo:thi], c, side="left")), thi - 1)
            flo = float(cumd[i]) - float(sign[i]) * (float(cumv[i]) - c)
            acc += abs(fhi - flo)
            fhi = flo
        out[j] = acc / (n_buckets * v)
    return out


@pytest.mark.parametrize("fractional", [False, True])
def test_vpin_ring_of_f_values_equals_the_search_bit_for_bit(fractional: bool) -> None:
    """VPIN reads F at integer boundaries from a ring filled as the bars advance; it must give
    the searched value bit for bit: integer sizes (every boundary from the ring), a bar longer
    than the ring (the fill skips ahead), a roll (the ring restarts), zero sizes, and
    fractional sizes (boundaries off the integers: the search)."""
    rng = np.random.default_rng(26)
    n_tr = 5000
    t0 = 1_700_000_000_000_000_000
    t_ts = t0 + np.sort(rng.integers(0, 10**12, n_tr))
    size = rng.choice(np.array([0.0, 1.0, 1.0, 2.0, 3.0, 7.0]), n_tr)
    size[[900, 901, 3100]] = [9000.0, 12_000.0, 20_000.0]  # bars longer than the 8192 ring
    if fractional:
        size[rng.random(n_tr) < 0.3] += 0.25
    sign = rng.choice(np.array([-1, 0, 1, 1], np.int8), n_tr)
    trades = TradeArrays(t_ts, np.full(n_tr, 1.1), size, sign)
    cut = np.sort(rng.choice(np.arange(1, n_tr - 1), 400, replace=False))
    tau = np.append(t_ts[cut], t_ts[-1])
    inst = np.ones(len(tau), np.uint32)
    inst[250:] = 2
    book, _, _, _ = make_market(26, n_snap=300, n_trades=10, n_bars=3, roll_at=None)
    cfg = small_cfg(vpin_bucket_volume=7.0, vpin_buckets=40, n_shards=1, n_workers=1)
    want = _vpin_by_search(t_ts, size, sign.astype(float), tau, inst, 40, 7.0)
    assert np.isfinite(want).sum() > 300
    for k in (1, 3, 7):
        got = run(book, trades, tau, inst, small_cfg(**{**cfg.model_dump(), "n_shards": k})).columns[
            "vpin_40"
        ]
        np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def test_first_ge_equals_searchsorted_from_any_start() -> None:
    rng = np.random.default_rng(22)
    for trial in range(300):
        n = int(rng.integers(1, 700))
        a = np.cumsum(rng.choice(np.array([0.0, 0.0, 1.0, 2.5, 4.0]), n))
        hi = int(rng.integers(0, n + 1))
        c = float(rng.uniform(-2.0, a[-1] + 2.0)) if trial % 3 else float(rng.choice(a))
        want = int(np.searchsorted(a[:hi], c, side="left"))
        # any start p ≤ the answer satisfies the precondition a[i] < c for i < p
        for p in {0, want, max(0, want - 1), max(0, want - 17), int(rng.integers(0, want + 1))}:
            assert _first_ge_nb(a, p, hi, c) == want, (trial, p, hi, c)


def test_search_right_equals_searchsorted() -> None:
    rng = np.random.default_rng(23)
    for _ in range(50):
        ts = np.sort(rng.integers(0, 200, int(rng.integers(0, 400))))
        q = np.sort(rng.integers(-10, 220, int(rng.integers(0, 100))))
        out = np.empty(q.shape[0], np.int64)
        _search_right_nb(ts, q, out)
        np.testing.assert_array_equal(out, np.searchsorted(ts, q, side="right"))


def test_search_right_wrapper_equals_searchsorted_sorted_or_not() -> None:
    """quarter_ofi's chunk plan: the merge for ascending queries, np.searchsorted otherwise;
    either way the answer of np.searchsorted."""
    rng = np.random.default_rng(24)
    for trial in range(60):
        ts = np.sort(rng.integers(0, 300, int(rng.integers(0, 500)))).astype(np.int64)
        q = rng.integers(-10, 320, int(rng.integers(0, 120))).astype(np.int64)
        if trial % 2:
            q = np.sort(q)
        out = np.full(q.shape[0], -7, np.int64)
        search_right(ts, q, out)
        np.testing.assert_array_equal(out, np.searchsorted(ts, q, side="right"))


def _warmup_bars_whole_column(v: np.ndarray, cfg: OfiConfig) -> int:
    """ofi_warmup_bars as first written: the running sum over every bar, from the last back."""
    csum = np.cumsum(v[::-1])
    k = int(np.searchsorted(csum, cfg.vpin_buckets * cfg.vpin_bucket_volume, side="left")) + 2
    return int(min(v.shape[0], max(cfg.effective_warmup_bars, k)))


def test_warmup_bars_from_the_tail_equal_the_whole_column_sum() -> None:
    """ofi_warmup_bars sums a growing tail of the bars: the same count as summing all of them,
    whether the VPIN volume is reached within the first tail, after it grew, or never."""
    rng = np.random.default_rng(25)
    for n in (0, 1, 5, 1023, 1024, 1025, 3000, 9000):
        for need in (1.0, 500.0, 1e4, 1e5, 1e6, 1e9):
            v = rng.integers(95, 140, n).astype(np.float64)
            v[rng.random(n) < 0.1] = rng.uniform(0.0, 3.5)  # fractional and small volumes too
            cfg = small_cfg(vpin_buckets=10, vpin_bucket_volume=need / 10)
            assert ofi_warmup_bars(v, cfg) == _warmup_bars_whole_column(v, cfg), (n, need)


def test_tick_size_defaults_to_config_and_keyword_overrides() -> None:
    book, trades, tau, inst = make_market(24)
    a = run(book, trades, tau, inst, small_cfg())  # keyword TICK, config default 0.25
    b = compute_ofi_features(book, trades, tau, inst, small_cfg(tick_size=TICK))
    assert b.tick_size == TICK and a.tick_size == TICK
    assert_same(a, b, tol=0.0)
    c = compute_ofi_features(book, trades, tau, inst, small_cfg())
    assert c.tick_size == 0.25
    m = np.isfinite(a.columns["spread_ticks"])
    np.testing.assert_array_equal(c.columns["spread_ticks"][m] * 0.25, a.columns["spread_ticks"][m] * TICK)


def _mid_asof(book: BookArrays, t: int, lo: int) -> float:
    ok = (
        np.isfinite(book.bid_px[:, 0])
        & np.isfinite(book.ask_px[:, 0])
        & (book.bid_px[:, 0] <= book.ask_px[:, 0])
    )
    idx = np.flatnonzero(ok & (book.ts <= t) & (book.ts > lo))
    return math.nan if idx.size == 0 else 0.5 * (book.bid_px[idx[-1], 0] + book.ask_px[idx[-1], 0])


def test_kyle_and_hawkes_against_direct() -> None:
    book, trades, tau, inst = make_market(9)
    cfg = small_cfg()
    f = run(book, trades, tau, inst, cfg)
    seg0 = {1: -(2**62), 2: int(tau[44])}
    for j in (30, 44, 60, 89):
        s0 = 0 if inst[j] == 1 else 45
        lo = seg0[int(inst[j])]
        xs, ys = [], []
        for k in range(max(j - cfg.kyle_window + 1, s0 + 1), j + 1):
            m1, m0 = _mid_asof(book, int(tau[k]), lo), _mid_asof(book, int(tau[k - 1]), lo)
            w = (trades.ts > tau[k - 1]) & (trades.ts <= tau[k])
            xs.append(float(np.sum(trades.size[w] * trades.sign[w])))
            ys.append((math.log(m1) - math.log(m0)) * 1e4)
        lam = np.polyfit(xs, ys, 1)[0]
        assert f.columns["kyle_lambda_10"][j] == pytest.approx(lam, rel=1e-9)
        h = 0.0
        k0 = max(j - cfg.hawkes_bars + 1, s0)
        lo_t = tau[k0 - 1] if k0 > 0 else -(2**62)
        ok = (
            np.isfinite(book.bid_px[:, 0])
            & np.isfinite(book.ask_px[:, 0])
            & (book.bid_px[:, 0] <= book.ask_px[:, 0])
        )
        for ts in np.concatenate([book.ts[ok], trades.ts]):
            if lo_t < ts <= tau[j]:
                h += math.exp(-(tau[j] - ts) / 0.5e9) / 0.5
        assert f.columns["hawkes_intensity"][j] == pytest.approx(h, rel=1e-12)
    assert np.isnan(f.columns["kyle_lambda_10"][45 : 45 + 5]).all()  # reset at the roll


# ------------------------------------------------------------------------------------------
# Sharding and partitions
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_sharded_equals_sequential(k: int) -> None:
    book, trades, tau, inst = make_market(10)
    seq = run(book, trades, tau, inst, small_cfg(n_shards=1, n_workers=1))
    par = run(book, trades, tau, inst, small_cfg(n_shards=k, n_workers=2))
    assert (seq.columns["n_book_events"] == 0).any()  # a bar with no book events
    assert (seq.bars_since_reset == 0).sum() == 2  # start + roll
    assert_same(seq, par, tol=1e-9)
    assert_same(seq, par, tol=0.0)  # in fact bit-identical by construction
    np.testing.assert_array_equal(seq.bars_since_reset, par.bars_since_reset)


@pytest.mark.parametrize("p", [30, 60])
def test_partition_with_warmup_equals_sequential(p: int) -> None:
    book, trades, tau, inst = make_market(11)
    cfg = small_cfg()
    seq = run(book, trades, tau, inst, cfg)
    vol = np.array(
        [
            trades.size[(trades.ts > (tau[j - 1] if j else -(2**62))) & (trades.ts <= tau[j])].sum()
            for j in range(p)
        ]
    )
    w = ofi_warmup_bars(vol, cfg)
    assert w >= cfg.effective_warmup_bars and p - w >= 1
    start = int(tau[p - w - 1])
    cb = BookArrays(*(getattr(book, f)[book.ts > start] for f in BookArrays.__dataclass_fields__))
    ct = TradeArrays(*(getattr(trades, f)[trades.ts > start] for f in TradeArrays.__dataclass_fields__))
    part = run(cb, ct, tau[p - w :], inst[p - w :], cfg, n_warmup=w, ts_window_start=start)
    assert len(part) == len(tau) - p
    rest = OfiFeatures(
        seq.ts_close[p:], seq.bars_since_reset[p:], {k: v[p:] for k, v in seq.columns.items()}, cfg, TICK
    )
    assert_same(rest, part, tol=1e-9)
    np.testing.assert_array_equal(rest.bars_since_reset, part.bars_since_reset)
    # Without warm-up the trailing features differ (the test can fail).
    cold = run(cb, ct, tau[p:], inst[p:], cfg, ts_window_start=int(tau[p - 1]))
    assert not np.array_equal(cold.columns["kyle_lambda_10"], rest.columns["kyle_lambda_10"], equal_nan=True)


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------


def test_validate_accepts_good_table_and_arrow_roundtrip() -> None:
    book, trades, tau, inst = make_market(12)
    f = run(book, trades, tau, inst)
    validate_ofi(f, "2024-Q1")
    validate_ofi(f.to_arrow(), "2024-Q1")


def test_validate_raises_on_all_zero_ofi_from_static_book() -> None:
    book, trades, tau, inst = make_market(13)
    static = BookArrays(
        book.ts,
        np.repeat(book.bid_px[:1], len(book.ts), 0),
        np.repeat(book.ask_px[:1], len(book.ts), 0),
        np.repeat(book.bid_sz[:1], len(book.ts), 0),
        np.repeat(book.ask_sz[:1], len(book.ts), 0),
        book.bid_ct,
        book.ask_ct,
    )
    f = run(static, trades, tau, inst)
    with pytest.raises(FxDataError, match=r"2024-Q2.*ofi_l1.*all zero.*bar 0"):
        validate_ofi(f, "2024-Q2")


def test_validate_raises_on_nan_after_warmup_and_out_of_bounds() -> None:
    book, trades, tau, inst = make_market(14)
    f = run(book, trades, tau, inst)
    g = OfiFeatures(
        f.ts_close, f.bars_since_reset, {k: v.copy() for k, v in f.columns.items()}, f.config, TICK
    )
    g.columns["l1_imbalance"][20] = np.nan
    with pytest.raises(FxDataError, match=r"2024-Q3.*l1_imbalance.*NaN after its warm-up.*bar 20"):
        validate_ofi(g, "2024-Q3")
    g = OfiFeatures(
        f.ts_close, f.bars_since_reset, {k: v.copy() for k, v in f.columns.items()}, f.config, TICK
    )
    g.columns["depth_imbalance_5"][33] = 1.5
    with pytest.raises(FxDataError, match=r"depth_imbalance_5.*outside.*bar 33"):
        validate_ofi(g, "2024-Q3")
    g = OfiFeatures(
        f.ts_close, f.bars_since_reset, {k: v.copy() for k, v in f.columns.items()}, f.config, TICK
    )
    g.columns["ofi_l1"][3] = np.nan
    with pytest.raises(FxDataError, match=r"ofi_l1 is NaN"):
        validate_ofi(g, "2024-Q3")
    g = OfiFeatures(
        f.ts_close, f.bars_since_reset, {k: v.copy() for k, v in f.columns.items()}, f.config, TICK
    )
    g.columns["spread_ticks"][[9, 40]] = [-np.inf, 0.5]  # the first bad bar of a column is named
    g.columns["spread_ticks"][25] = -1.0
    with pytest.raises(FxDataError, match=r"spread_ticks is ±inf at bar 9 "):
        validate_ofi(g, "2024-Q3")
    g.columns["spread_ticks"][9] = 1.0
    with pytest.raises(FxDataError, match=r"spread_ticks = .*-1.0.* outside .* at bar 25 "):
        validate_ofi(g, "2024-Q3")


def test_sizes_known_valid_skip_only_their_check() -> None:
    """An ``UnsignedSizeBook`` (sizes and counts from unsigned integers) skips their per-level
    check and nothing else: the same features bit for bit, the ts order still checked, and a
    plain ``BookArrays`` with a bad size still refused."""
    book, trades, tau, inst = make_market(15)
    unsigned = UnsignedSizeBook(**{f: getattr(book, f) for f in BookArrays.__dataclass_fields__})
    for cfg in (small_cfg(), small_cfg(n_workers=2)):
        a = run(book, trades, tau, inst, cfg)
        b = run(unsigned, trades, tau, inst, cfg)
        for name, col in a.columns.items():
            assert col.tobytes() == b.columns[name].tobytes(), name
    sz = book.ask_sz.copy()
    sz[40, 1] = -2.0
    with pytest.raises(FxDataError, match=r"ask_sz_01.*snapshot 40"):
        run(replace(book, ask_sz=sz), trades, tau, inst)
    bts = book.ts.copy()
    bts[30] = bts[29] - 1  # the ts order is checked either way
    with pytest.raises(FxDataError, match=r"book.ts.*not sorted at row 30"):
        run(replace(unsigned, ts=bts), trades, tau, inst)


def test_input_errors() -> None:
    book, trades, tau, inst = make_market(15)
    bad = replace(book, ts=book.ts[::-1].copy())
    with pytest.raises(FxDataError, match=r"book.ts.*not sorted"):
        run(bad, trades, tau, inst)
    with pytest.raises(FxDataError, match=r"trades.sign"):
        run(book, replace(trades, sign=np.full(len(trades.ts), 3, np.int8)), tau, inst)
    sz = book.bid_sz.copy()
    sz[5, 0] = np.nan
    with pytest.raises(FxDataError, match=r"bid_sz_00.*snapshot 5"):
        run(replace(book, bid_sz=sz), trades, tau, inst)
    # One validation pass per input, sharded over the book: the first bad row is reported,
    # and the errors keep their order (book before trades, sizes before counts).
    par = small_cfg(n_workers=2)
    ct = book.ask_ct.copy()
    ct[[700, 1500], 3] = -1.0
    sz = book.bid_sz.copy()
    sz[1800, 2] = -1.0
    bts = book.ts.copy()
    bts[1200] = bts[1199] - 1
    bad_book = replace(book, ask_ct=ct, bid_sz=sz)
    with pytest.raises(FxDataError, match=r"book.ts.*not sorted at row 1200"):
        run(replace(bad_book, ts=bts), trades, tau, inst, par)
    with pytest.raises(FxDataError, match=r"bid_sz_02.*snapshot 1800"):
        run(bad_book, replace(trades, sign=np.full(len(trades.ts), 3, np.int8)), tau, inst, par)
    with pytest.raises(FxDataError, match=r"ask_ct_03 invalid \(-1.0\).*snapshot 700"):
        run(replace(book, ask_ct=ct), trades, tau, inst, par)
    tts = trades.ts.copy()
    tts[400] = tts[399] - 5
    tsz = trades.size.copy()
    tsz[[300, 600]] = [np.inf, np.nan]
    with pytest.raises(FxDataError, match=r"trades.ts.*not sorted at row 400"):
        run(book, replace(trades, ts=tts, size=tsz), tau, inst, par)
    with pytest.raises(FxDataError, match=r"trades.size invalid \(inf\) at trade 300"):
        run(book, replace(trades, size=tsz), tau, inst, par)
    with pytest.raises(FxDataError, match=r"different lengths"):
        run(book, replace(trades, size=tsz[:-1]), tau, inst, par)


def test_validate_raises_without_book_and_empty_inputs_work() -> None:
    book, trades, tau, inst = make_market(16)
    empty = BookArrays(*(getattr(book, f)[:0] for f in BookArrays.__dataclass_fields__))
    f = run(empty, trades, tau, inst)
    assert np.isnan(f.columns["l1_imbalance"]).all() and (f.columns["ofi_l1"] == 0).all()
    with pytest.raises(FxDataError, match=r"2024-Q4.*n_book_events.*no book data"):
        validate_ofi(f, "2024-Q4")
    none = run(book, trades, tau[:0], inst[:0])
    assert len(none) == 0 and set(none.columns) == set(ofi_feature_registry(small_cfg()))


def test_vpin_comb_default_buckets_equals_the_search_bit_for_bit() -> None:
    """The comb (integer sizes and V: one difference of running sums per bar) at the default
    50 buckets of 1000 contracts: bit for bit the per-boundary search, through a roll, bars
    longer than the ring (2^16 volumes; the chain restarts after the skip), zero sizes, every
    shard count; a single fractional trade anywhere in the call takes the whole call off
    the comb (the search path), which must also match."""
    rng = np.random.default_rng(31)
    n_tr = 9000
    t0 = 1_700_000_000_000_000_000
    t_ts = t0 + np.sort(rng.integers(0, 10**12, n_tr))
    size = rng.integers(0, 40, n_tr).astype(float)
    size[[2000, 6500]] = [70_000.0, 90_000.0]  # longer than the ring
    sign = rng.choice(np.array([-1, 0, 1, 1], np.int8), n_tr)
    cut = np.sort(rng.choice(np.arange(1, n_tr - 1), 500, replace=False))
    tau = np.append(t_ts[cut], t_ts[-1])
    inst = np.ones(len(tau), np.uint32)
    inst[300:] = 2
    book, _, _, _ = make_market(31, n_snap=300, n_trades=10, n_bars=3, roll_at=None)
    cfg = small_cfg(vpin_bucket_volume=1000.0, vpin_buckets=50)
    for frac_at in (None, 7000):
        sz = size.copy()
        if frac_at is not None:
            sz[frac_at] += 0.5
        trades = TradeArrays(t_ts, np.full(n_tr, 1.1), sz, sign)
        want = _vpin_by_search(t_ts, sz, sign.astype(float), tau, inst, 50, 1000.0)
        assert np.isfinite(want).sum() > 250
        for k in (1, 4, 9):
            got = run(book, trades, tau, inst, small_cfg(**{**cfg.model_dump(), "n_shards": k})).columns[
                "vpin_50"
            ]
            np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def _hawkes_by_sum(book, trades, tau, inst, hawkes_bars: int, decay_s: float) -> np.ndarray:
    """hawkes_intensity as the kernels add it, in Python (CPython's math.exp is the same libm
    exp): per bar the sum over its window's valid snapshots then trades, then the sum over
    the last hawkes_bars bars of the segment of sum_k · exp(−(τ_j − τ_k)/δ), every term."""
    decay_ns = decay_s * 1e9
    ok = (
        (np.abs(book.bid_px[:, 0]) < np.inf)
        & (np.abs(book.ask_px[:, 0]) < np.inf)
        & (book.bid_px[:, 0] <= book.ask_px[:, 0])
        & (book.bid_px[:, 0] > 0)
    )
    s_hi = np.searchsorted(book.ts, tau, side="right")
    t_hi = np.searchsorted(trades.ts, tau, side="right")
    loc = []
    for j in range(len(tau)):
        s_lo = s_hi[j - 1] if j else 0
        t_lo = t_hi[j - 1] if j else 0
        h = 0.0
        for i in range(s_lo, s_hi[j]):
            if ok[i]:
                h += math.exp(-int(tau[j] - book.ts[i]) / decay_ns)
        for i in range(t_lo, t_hi[j]):
            h += math.exp(-int(tau[j] - trades.ts[i]) / decay_ns)
        loc.append(h)
    out = np.empty(len(tau))
    s0 = 0
    for j in range(len(tau)):
        if j and inst[j] != inst[j - 1]:
            s0 = j
        h = 0.0
        for k in range(max(j - hawkes_bars + 1, s0), j + 1):
            h += loc[k] * math.exp(-int(tau[j] - tau[k]) / decay_ns)
        out[j] = h / (decay_ns / 1e9)
    return out


def test_hawkes_skipping_underflowed_terms_is_bit_for_bit() -> None:
    """The bar pass starts each Hawkes sum after the leading terms whose exp is exactly 0.0;
    on a market with quiet gaps far longer than 760·δ (bars whose early terms underflow, some
    whose every earlier term does) and busy stretches (none skipped), it equals the full sum
    bit for bit, for every shard count."""
    rng = np.random.default_rng(32)
    book, trades, tau, inst = make_market(32, n_snap=3000, n_trades=1500, n_bars=150, roll_at=90)

    # Stretch time: the events of each of 12 clusters spread over ~2 s, clusters 100..900 s
    # apart (δ = 0.5 s: exp underflows beyond 380 s).
    def stretch(ts: np.ndarray) -> np.ndarray:
        t0 = ts[0]
        rel = (ts - t0) / 60e9  # in [0, 1]
        cl = np.minimum((rel * 12).astype(np.int64), 11)
        gaps = np.cumsum(rng.integers(100, 900, 12)) * 10**9
        return t0 + gaps[cl] + ((rel * 12 - cl) * 2e9).astype(np.int64)

    lo = min(book.ts[0], trades.ts[0])  # one origin for all three (stretch is monotone)
    book = replace(book, ts=stretch(np.concatenate([[lo], book.ts]))[1:])
    trades = replace(trades, ts=stretch(np.concatenate([[lo], trades.ts]))[1:])
    tau_s = stretch(np.concatenate([[lo], tau]))[1:]
    cfg = small_cfg(hawkes_bars=12, hawkes_decay_s=0.5)
    want = _hawkes_by_sum(book, trades, tau_s, inst, 12, 0.5)
    gaps = np.diff(tau_s) / 1e9
    assert (gaps > 380).sum() >= 5 and (gaps < 1).sum() > 50
    for k in (1, 3, 8):
        got = run(book, trades, tau_s, inst, small_cfg(**{**cfg.model_dump(), "n_shards": k, "n_workers": 2}))
        np.testing.assert_array_equal(got.columns["hawkes_intensity"].view(np.int64), want.view(np.int64))


def test_exp_is_zero_below_the_hawkes_cut() -> None:
    """The kernels' exp (numba's) and CPython's give exactly +0.0 at and below
    _EXP_ZERO_BELOW, so the skipped Hawkes terms are exactly +0.0."""
    from numba import njit

    from fx_assets.core.ofi import _EXP_ZERO_BELOW

    @njit
    def exps(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = math.exp(x[i])
        return out

    x = np.concatenate([np.linspace(_EXP_ZERO_BELOW, -2000.0, 5001), _EXP_ZERO_BELOW - np.arange(50) * 1e-12])
    got = exps(x)
    assert np.all(got == 0.0) and not np.signbit(got).any()
    assert all(math.exp(v) == 0.0 for v in x.tolist())


def test_column_flags_count_exactly_what_the_scan_reports() -> None:
    """``validate_ofi`` scans only the columns ``_column_flags_nb`` flags: each of its four
    counts is nonzero exactly where ``_scan_column_nb`` reports a bar of that class (±inf, NaN,
    NaN after a value of its segment, outside the bounds), on columns with NaN runs inside and
    at the start of segments, infinities, out-of-bounds values and infinite bounds."""
    rng = np.random.default_rng(11)
    seen = np.zeros(4, np.int64)
    for case in range(3000):
        n = int(rng.integers(0, 40))
        x = rng.uniform(-1.0, 1.0, n)
        seg_first = rng.random(n) < 0.15
        if n:
            seg_first[0] = True
        starts = np.flatnonzero(seg_first)
        for s in starts:  # warm-up NaN runs at segment starts
            if rng.random() < 0.5:
                x[s : s + int(rng.integers(1, 6))] = np.nan
        for _ in range(int(rng.integers(0, 3))):  # anything anywhere
            if n:
                x[int(rng.integers(0, n))] = rng.choice([np.nan, np.inf, -np.inf, 1.5, -1.5])
        lo, hi = [(-1.2, 1.2), (-np.inf, np.inf), (0.0, np.inf), (-np.inf, 0.5)][case % 4]
        scan = np.array(_scan_column_nb(x, seg_first, lo, hi))
        flags = np.array(_column_flags_nb(x, seg_first, lo, hi))
        assert np.array_equal(flags > 0, scan >= 0), (case, x, seg_first, lo, hi, flags, scan)
        seen += flags > 0
    assert (seen > 100).all(), seen  # every class occurred
