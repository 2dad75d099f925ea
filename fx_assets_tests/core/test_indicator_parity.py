"""Indicator kernels (ATR/NATR, +DI/-DI/ADX, RSI, MACD, Bollinger %b) against plain-Python
references of the same roll-adjusted definitions (reference/microstructure.md §5), on series
with rolls (close together, inside the first windows), flat stretches and off-grid prices;
and the wrappers' input validation."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from fx_assets.core import bar_features as bf
from fx_assets.core.bar_features import BarFeatureConfig, compute_bar_features
from fx_assets.core.errors import FxDataError
from fx_assets_tests.core.test_bar_features import _ohlc_bars

TOL = 1e-12


def _roll_and_ratio(o: list[float], c: list[float], inst: list[int]) -> tuple[list[bool], list[float]]:
    """Roll flag (instrument changed, or bar 0) and R_j = O_j / C_{j-1} (1 elsewhere)."""
    roll = [j == 0 or inst[j] != inst[j - 1] for j in range(len(c))]
    ratio = [o[j] / c[j - 1] if (j > 0 and roll[j]) else 1.0 for j in range(len(c))]
    return roll, ratio


def _prev_close(j: int, o: list[float], c: list[float], roll: list[bool]) -> float:
    return o[j] if roll[j] else c[j - 1]


def ref_atr(o, h, lo, c, inst, n):
    roll, ratio = _roll_and_ratio(o, c, inst)
    out = [math.nan] * len(c)
    s, cnt = 0.0, 0
    for j in range(1, len(c)):
        if roll[j]:
            s *= ratio[j]
        pc = _prev_close(j, o, c, roll)
        tr = max(h[j] - lo[j], abs(h[j] - pc), abs(lo[j] - pc))
        if cnt < n:
            s += tr
            cnt += 1
            if cnt == n:
                s = s / n
                out[j] = s
        else:
            s = (s * (n - 1) + tr) / n
            out[j] = s
    return out


def ref_dmi(o, h, lo, c, inst, n):
    roll, ratio = _roll_and_ratio(o, c, inst)
    nb = len(c)
    pdi, mdi, adx = [math.nan] * nb, [math.nan] * nb, [math.nan] * nb
    sp = sm = st = p_v = m_v = adx_s = 0.0
    for k, j in enumerate(range(1, nb), start=1):
        rr = ratio[j] if roll[j] else 1.0
        sp, sm, st = sp * rr, sm * rr, st * rr
        ph, pl = h[j - 1] * rr, lo[j - 1] * rr
        pc = _prev_close(j, o, c, roll)
        up, dn = h[j] - ph, pl - lo[j]
        pdm = up if (up > dn and up > 0.0) else 0.0
        mdm = dn if (dn > up and dn > 0.0) else 0.0
        tr = max(h[j] - lo[j], abs(h[j] - pc), abs(lo[j] - pc))
        if k < n:
            sp, sm, st = sp + pdm, sm + mdm, st + tr
            continue
        sp, sm, st = sp - sp / n + pdm, sm - sm / n + mdm, st - st / n + tr
        valid, dx = False, 0.0
        if st != 0.0:
            p_v, m_v = 100.0 * sp / st, 100.0 * sm / st
            if p_v + m_v != 0.0:
                dx = 100.0 * abs(p_v - m_v) / (p_v + m_v)
                valid = True
        pdi[j], mdi[j] = p_v, m_v
        if k < 2 * n:
            adx_s += dx if valid else 0.0
            if k == 2 * n - 1:
                adx_s /= n
                adx[j] = adx_s
        else:
            if valid:
                adx_s = (adx_s * (n - 1) + dx) / n
            adx[j] = adx_s
    return pdi, mdi, adx


def ref_rsi(o, c, inst, n):
    roll, ratio = _roll_and_ratio(o, c, inst)
    out = [math.nan] * len(c)
    g = lo = 0.0
    for k, j in enumerate(range(1, len(c)), start=1):
        if roll[j]:
            g, lo = g * ratio[j], lo * ratio[j]
        d = c[j] - _prev_close(j, o, c, roll)
        gain, loss = max(d, 0.0), max(-d, 0.0)
        if k <= n:
            g, lo = g + gain, lo + loss
            if k < n:
                continue
            g, lo = g / n, lo / n
        else:
            g, lo = (g * (n - 1) + gain) / n, (lo * (n - 1) + loss) / n
        out[j] = 100.0 * g / (g + lo) if g + lo > 0.0 else 50.0
    return out


def _adjusted_mean(x: list[float], ratio: list[float], j: int, length: int) -> float:
    s, f = 0.0, 1.0
    for m in range(j, j - length, -1):
        s += x[m] * f
        f *= ratio[m]
    return s / length


def ref_macd(o, c, inst, fast, slow, sig):
    """(line, signal, hist) divided by C_j."""
    _, ratio = _roll_and_ratio(o, c, inst)
    nb = len(c)
    line, sgl = [math.nan] * nb, [math.nan] * nb
    kf, ks, kg = 2.0 / (fast + 1.0), 2.0 / (slow + 1.0), 2.0 / (sig + 1.0)
    ef = es = eg = 0.0
    first_sig = slow + sig - 2
    for j in range(nb):
        ef, es, eg = ef * ratio[j], es * ratio[j], eg * ratio[j]
        if j < slow - 1:
            continue
        if j == slow - 1:
            ef, es = _adjusted_mean(c, ratio, j, fast), _adjusted_mean(c, ratio, j, slow)
        else:
            ef += kf * (c[j] - ef)
            es += ks * (c[j] - es)
        line[j] = ef - es
        if j == first_sig:
            eg = _adjusted_mean(line, ratio, j, sig)
        elif j > first_sig:
            eg += kg * (line[j] - eg)
        if j >= first_sig:
            sgl[j] = eg
    return (
        [x / y for x, y in zip(line, c, strict=True)],
        [x / y for x, y in zip(sgl, c, strict=True)],
        [(x - s) / y for x, s, y in zip(line, sgl, c, strict=True)],
    )


def ref_pctb(o, c, inst, w, k):
    _, ratio = _roll_and_ratio(o, c, inst)
    out = [math.nan] * len(c)
    for j in range(w - 1, len(c)):
        f, xs = 1.0, []
        for m in range(w):
            xs.append(c[j - m] * f)
            f *= ratio[j - m]
        mu = sum(xs) / w  # left to right: the same additions as the kernel
        sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / w)
        out[j] = (c[j] - mu + k * sd) / (2.0 * k * sd) if sd > 0.0 else 0.5
    return out


def _series(n: int, seed: int, tick: float | None) -> tuple[np.ndarray, ...]:
    """OHLC with rolls at bars 5, 30, 31, 700, 712 and 1500 (jumps of a few %), a flat
    stretch and, with ``tick``, prices on a tick grid."""
    rng = np.random.default_rng(seed)
    c = 4000.0 * np.exp(np.cumsum(rng.normal(0, 0.001, n)))
    inst = np.ones(n, np.uint32)
    for r in (5, 30, 31, 700, 712, 1500):
        inst[r:] += 1
        c[r:] *= 1.0 + rng.uniform(-0.03, 0.03)
    o = np.r_[c[0], c[:-1]] * np.exp(rng.normal(0, 0.0003, n))
    h = np.maximum(o, c) * np.exp(np.abs(rng.normal(0, 0.0005, n)))
    lo = np.minimum(o, c) * np.exp(-np.abs(rng.normal(0, 0.0005, n)))
    if n > 960:
        o[900:960] = h[900:960] = lo[900:960] = c[900:960] = c[899]
    if tick is not None:
        o, c = np.round(o / tick) * tick, np.round(c / tick) * tick
        h = np.maximum(np.ceil(h / tick) * tick, np.maximum(o, c))
        lo = np.minimum(np.floor(lo / tick) * tick, np.minimum(o, c))
    return o, h, lo, c, inst


def _same(name: str, got: np.ndarray, ref: list[float]) -> None:
    r = np.asarray(ref)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(r), err_msg=name)
    ok = ~np.isnan(r)
    assert ok.sum() > 0.9 * r.size, name
    assert np.max(np.abs(got[ok] - r[ok])) <= TOL, (name, np.max(np.abs(got[ok] - r[ok])))


@pytest.mark.parametrize(("seed", "tick"), [(3, None), (4, 0.25)])
def test_indicators_match_plain_reference_across_rolls(seed: int, tick: float | None) -> None:
    o, h, lo, c, inst = _series(2500, seed, tick)
    ol, hl, ll, cl, il = (a.tolist() for a in (o, h, lo, c, inst))
    n = 14
    ft = compute_bar_features(_ohlc_bars(o, h, lo, c, inst))
    atr = ref_atr(ol, hl, ll, cl, il, n)
    pdi, mdi, adx = ref_dmi(ol, hl, ll, cl, il, n)
    line, sgl, hist = ref_macd(ol, cl, il, 12, 26, 9)
    refs = {
        "atr_14": atr,
        "natr_14": [100.0 * a / x for a, x in zip(atr, cl, strict=True)],
        "plus_di_14": pdi,
        "minus_di_14": mdi,
        "adx_14": adx,
        "rsi_14": ref_rsi(ol, cl, il, n),
        "macd_12_26": line,
        "macd_signal_9": sgl,
        "macd_hist": hist,
        "bb_pctb_20": ref_pctb(ol, cl, il, 20, 2.0),
    }
    for name, ref in refs.items():
        _same(name, ft.columns[name], ref)
    # the single-output wrappers give the same values as the multi-output kernels
    np.testing.assert_array_equal(bf.natr(o, h, lo, c, inst, n), ft.columns["natr_14"])
    np.testing.assert_array_equal(bf.adx(o, h, lo, c, inst, n), ft.columns["adx_14"])
    # flat stretch: the Bollinger band is empty there -> 0.5
    assert np.all(ft.columns["bb_pctb_20"][919:960] == 0.5)


def test_bollinger_short_series_and_other_window() -> None:
    o, h, lo, c, inst = _series(300, 5, None)
    cfg = BarFeatureConfig(bb_window=7, bb_k=1.5)
    for m in (3, 6, 7, 8, 40, 300):  # shorter than / around the window, and a partial block
        ft = compute_bar_features(_ohlc_bars(o[:m], h[:m], lo[:m], c[:m], inst[:m]), cfg)
        ref = np.asarray(ref_pctb(o[:m].tolist(), c[:m].tolist(), inst[:m].tolist(), 7, 1.5))
        got = ft.columns["bb_pctb_7"]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        ok = ~np.isnan(got)
        assert not ok.any() or np.max(np.abs(got[ok] - ref[ok])) <= TOL


def _exact_pctb(window: list[float], k: float) -> float:
    """%b of the last close of one window, population sigma, in exact arithmetic (fractions,
    then a 50-digit square root), rounded once to float."""
    xs = [Fraction(x) for x in window]
    w = len(xs)
    s1 = sum(xs, Fraction(0))
    d = w * sum((x * x for x in xs), Fraction(0)) - s1 * s1
    if d == 0:
        return 0.5
    n = w * xs[-1] - s1
    with localcontext() as ctx:
        ctx.prec = 50
        root = (Decimal(d.numerator) / Decimal(d.denominator)).sqrt()
        return float(Decimal("0.5") + Decimal(n.numerator) / Decimal(n.denominator) / (2 * Decimal(k) * root))


def _grid_series(n: int) -> tuple[np.ndarray, ...]:
    """Closes on the 0.25 grid with rolls (bars 5, 30, 31, 700, 712, 1500) and a flat stretch,
    plus off-grid closes at bars 400 and 1203..1205 (what a non-binary tick would give)."""
    o, _h, _lo, c, inst = _series(n, 8, 0.25)
    c = c.copy()
    c[400] += 0.1
    c[1203:1206] += 0.01
    return o, c, inst


def test_bollinger_on_a_binary_grid_is_exact() -> None:
    """Bars whose window holds no roll and only closes on the grid come from exact integer
    sums: within one ulp-scale step of the exact value (the two-pass float sums were up to
    ~2e-13 off). The other bars keep the two-pass reference's value."""
    o, c, inst = _grid_series(2200)
    w, k = 20, 2.0
    got = bf.bollinger_pctb(o, c, inst, w, k)
    ref = ref_pctb(o.tolist(), c.tolist(), inst.tolist(), w, k)
    off_grid = {400, 1203, 1204, 1205}
    rolls = {5, 30, 31, 700, 712, 1500}
    n_exact = 0
    for j in range(w - 1, c.size):
        window = range(j - w + 1, j + 1)
        if any(m in off_grid for m in window) or any(r in rolls for r in range(j - w + 2, j + 1)):
            assert abs(got[j] - ref[j]) <= TOL, j
            continue
        want = _exact_pctb(c[j - w + 1 : j + 1].tolist(), k)
        assert abs(got[j] - want) <= 4 * np.spacing(max(abs(want), 1.0)), (j, got[j], want)
        n_exact += 1
    assert n_exact > 1800


def test_bollinger_bars_do_not_depend_on_the_start_or_on_later_closes() -> None:
    """Each bar's value is a function of its own window: the same bits for a series cut
    anywhere before the window, and unchanged when every later close moves (off the grid,
    which sends the later bars to the two-pass kernel)."""
    o, c, inst = _grid_series(2200)
    w, k = 20, 2.0
    full = bf.bollinger_pctb(o, c, inst, w, k)
    for s in (1, 37, 390, 1190):
        cut = bf.bollinger_pctb(o[s:], c[s:], inst[s:], w, k)
        np.testing.assert_array_equal(cut[w - 1 :], full[s + w - 1 :], err_msg=f"start {s}")
    for t in (395, 1000, 1201):
        moved = c.copy()
        moved[t + 1 :] += 0.01
        head = bf.bollinger_pctb(o, moved, inst, w, k)[: t + 1]
        np.testing.assert_array_equal(head, full[: t + 1], err_msg=f"closes after {t} moved")


def test_indicator_wrappers_reject_bad_input() -> None:
    o, h, lo, c, inst = _series(100, 6, None)
    with pytest.raises(FxDataError, match="'h' has 99 bars"):
        bf.dmi(o, h[:-1], lo, c, inst, 14)
    with pytest.raises(FxDataError, match="'inst' has dtype float64"):
        bf.rsi(o, c, inst.astype(np.float64), 14)
    with pytest.raises(FxDataError, match="'c' has shape"):
        bf.bollinger_pctb(o, np.c_[c, c], inst, 20, 2.0)
    with pytest.raises(FxDataError, match="period 0"):
        bf.atr_natr(o, h, lo, c, inst, 0)
    with pytest.raises(FxDataError, match="fast span 26"):
        bf.macd(o, c, inst, 26, 12, 9)
    with pytest.raises(FxDataError, match="k = nan"):
        bf.bollinger_pctb(o, c, inst, 20, math.nan)
