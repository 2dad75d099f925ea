"""Metrics: hand-computed small cases, AUC against a pairwise reference, session Sharpe, MDD."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from fx_assets.core.errors import FxDataError
from fx_assets.core.metrics import (
    auc,
    auc_returns,
    average_ranks,
    daily_returns,
    equity_curve,
    hit_rate,
    max_drawdown,
    sharpe_bar,
    sharpe_daily,
    strategy_returns,
    turnover,
)

try:  # cross-check against sklearn when it is installed
    from sklearn.metrics import roc_auc_score
except ImportError:  # pragma: no cover - depends on the environment
    roc_auc_score = None


def day(iso: str) -> int:
    return (dt.date.fromisoformat(iso) - dt.date(1970, 1, 1)).days


def test_strategy_returns_and_turnover() -> None:
    pos = np.array([0, 1, 1, -1, 0])
    y = np.array([0.01, 0.02, -0.01, -0.03, 0.05])
    r = strategy_returns(pos, y, cost=0.001)
    np.testing.assert_allclose(r, [0.0, 0.02 - 0.001, -0.01, 0.03 - 0.002, -0.001], atol=1e-15)
    assert turnover(pos) == pytest.approx((0 + 1 + 0 + 2 + 1) / 5)
    r2 = strategy_returns(pos, y, cost=np.array([0, 0, 0, 0.01, 0.01]))
    assert r2[3] == pytest.approx(0.03 - 0.02) and r2[4] == pytest.approx(-0.01)
    with pytest.raises(FxDataError):
        strategy_returns(pos, y[:3], 0.0)


def test_equity_curve_and_max_drawdown() -> None:
    r = np.log([1.1, 0.5, 1.2, 1.5, 0.9])
    e = equity_curve(r)
    np.testing.assert_allclose(e, [1, 1.1, 0.55, 0.66, 0.99, 0.891])
    # peak 1.1 then trough 0.55: 50 %; later 0.99 -> 0.891 is only 10 %
    assert max_drawdown(r) == pytest.approx(0.5)
    assert max_drawdown(np.log([0.8, 1.0])) == pytest.approx(0.2)  # from E_0 = 1
    assert max_drawdown(np.array([0.01, 0.02])) == 0.0
    assert max_drawdown(np.array([])) == 0.0


def test_hit_rate_and_coverage() -> None:
    pos = np.array([1, -1, 0, 1, 1, -1, 1])
    y = np.array([0.1, 0.2, 0.3, 0.0, -0.1, -0.4, np.nan])
    h = hit_rate(pos, y)
    # scored: bars 0 (hit), 1 (miss), 4 (miss), 5 (hit) -> 2/4; coverage 6/7
    assert h.rate == 0.5 and h.n_scored == 4 and h.coverage == pytest.approx(6 / 7)
    assert math.isnan(hit_rate(np.zeros(3), np.ones(3)).rate)


def test_sharpe_daily_with_sessions() -> None:
    # three sessions with bars (Tue, Wed, Fri); the Thursday without bars is no session of the data
    s = np.array([day("2024-01-02")] * 3 + [day("2024-01-03")] * 2 + [day("2024-01-05")] * 2)
    r = np.array([0.01, -0.005, 0.002, 0.003, 0.004, -0.01, 0.0])
    days, rd = daily_returns(r, s)
    assert days.tolist() == [day("2024-01-02"), day("2024-01-03"), day("2024-01-05")]
    np.testing.assert_allclose(rd, [0.007, 0.007, -0.01], atol=1e-15)
    mean = (0.007 + 0.007 - 0.01) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in [0.007, 0.007, -0.01]) / 2)  # ddof = 1
    assert sharpe_daily(r, s) == pytest.approx(math.sqrt(252) * mean / sd, rel=1e-12)
    assert sharpe_daily(r, s, periods=365) == pytest.approx(math.sqrt(365) * mean / sd, rel=1e-12)
    # an explicit list of open sessions: an open session without bars counts as 0
    open_days = [day("2024-01-02"), day("2024-01-03"), day("2024-01-04"), day("2024-01-05")]
    rd4 = np.array([0.007, 0.007, 0.0, -0.01])
    sr4 = math.sqrt(252) * rd4.mean() / rd4.std(ddof=1)
    assert sharpe_daily(r, s, all_sessions=open_days) == pytest.approx(sr4, rel=1e-12)
    # the weekend between Friday and Monday is not a session
    s2 = np.array([day("2024-01-05"), day("2024-01-08")])
    assert daily_returns(np.array([0.01, 0.02]), s2)[0].size == 2
    assert math.isnan(sharpe_daily(np.array([0.01, 0.02]), np.array([day("2024-01-02")] * 2)))
    # a flat book earns nothing with no risk: 0, not NaN; a constant non-zero day return is NaN
    assert sharpe_daily(np.zeros(4), np.array([day("2024-01-02"), day("2024-01-03")] * 2)) == 0.0
    assert math.isnan(sharpe_daily(np.full(2, 0.01), np.array([day("2024-01-02"), day("2024-01-03")])))
    with pytest.raises(FxDataError, match="no session"):
        daily_returns(np.array([0.1]), np.array([-1]))


def test_exchange_holidays_are_not_zero_return_days() -> None:
    """Christmas and New Year's Day have no session: with bars on the open days only, the daily
    Sharpe is that of the open days (a holiday counted as a 0 day would shrink the std)."""
    days_open = [day(d) for d in ("2024-12-23", "2024-12-24", "2024-12-26", "2024-12-27", "2024-12-30")]
    days_open += [day(d) for d in ("2024-12-31", "2025-01-02", "2025-01-03")]
    rng = np.random.default_rng(4)
    s = np.repeat(days_open, 5)
    r = rng.normal(0.002, 0.003, s.size)
    days, rd = daily_returns(r, s)
    assert days.tolist() == days_open
    expect = np.array([r[s == d].sum() for d in days_open])
    np.testing.assert_allclose(rd, expect, rtol=0, atol=1e-15)
    assert sharpe_daily(r, s) == pytest.approx(math.sqrt(252) * expect.mean() / expect.std(ddof=1), rel=1e-12)


def test_sharpe_bar_annualised() -> None:
    rng = np.random.default_rng(0)
    r = rng.normal(0.001, 0.01, 501)
    year_ns = int(365.25 * 86400e9)
    ts = np.linspace(0, year_ns // 2, r.size).astype(np.int64)  # half a year
    n_y = (r.size - 1) / 0.5
    expected = r.mean() / r.std(ddof=1) * math.sqrt(n_y)
    assert sharpe_bar(r, ts) == pytest.approx(expected, rel=1e-9)


def brute_auc(s: np.ndarray, z: np.ndarray) -> float:
    pos, neg = s[z == 1], s[z == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (pos.size * neg.size))


def test_auc_hand_cases() -> None:
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auc([1, 2, 3], [0, 1, 1]) == 1.0 and auc([3, 2, 1], [0, 1, 1]) == 0.0
    assert auc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5  # all tied
    assert math.isnan(auc([0.1, 0.2], [1, 1]))  # one class: NaN, not 0.5
    np.testing.assert_array_equal(average_ranks([10, 20, 20, 5]), [2, 3.5, 3.5, 1])
    with pytest.raises(FxDataError):
        auc([0.1, 0.2], [2, 1])


def test_auc_against_reference() -> None:
    rng = np.random.default_rng(7)
    for trial in range(20):
        n = int(rng.integers(5, 300))
        z = rng.integers(0, 2, n)
        s = np.round(rng.normal(size=n) + 0.5 * z, 1 if trial % 2 else 6)  # coarse rounding -> ties
        if z.min() == z.max():
            continue
        a = auc(s, z)
        assert a == pytest.approx(brute_auc(s, z), abs=1e-12)
        if roc_auc_score is not None:
            assert a == pytest.approx(roc_auc_score(z, s), abs=1e-12)


def test_auc_returns_drops_zero_returns() -> None:
    s = np.array([0.9, 0.1, 0.5, 0.7, 0.3])
    y = np.array([0.02, -0.01, 0.0, 0.01, np.nan])
    assert auc_returns(s, y) == pytest.approx(brute_auc(s[[0, 1, 3]], np.array([1, 0, 1])))


def test_auc_block_null_widens_with_label_overlap_and_flags_real_skill() -> None:
    """On a random walk, overlapping 30-bar labels make the AUC of a persistent noise score far
    more variable than 1/sqrt(n) says; the block-permutation null sees it. A real edge is flagged."""
    from fx_assets.core.metrics import auc_block_null

    rng = np.random.default_rng(7)
    n, h = 6000, 30
    eps = rng.standard_normal(n + h + 1)
    logc = np.cumsum(eps)
    y = logc[1 + h : 1 + h + n] - logc[1 : n + 1]  # overlapping h-bar forward returns
    # a slowly varying noise score (AR(1), like a smoothed feature), independent of y
    s = np.zeros(n)
    for t in range(1, n):
        s[t] = 0.97 * s[t - 1] + rng.standard_normal()
    res = auc_block_null(s, y, block=4 * h, n_perm=300, seed=1)
    naive_se = 1 / math.sqrt(3 * n)  # the i.i.d. standard error of an AUC near 0.5
    assert res.null_sd > 3 * naive_se, (res, naive_se)
    assert res.p_value > 0.01 and res.n_perm == 300
    # exact permutation arithmetic: a score equal to the label has AUC 1 and p = 1 / (n_perm + 1)
    sure = auc_block_null(y, y, block=4 * h, n_perm=50)
    assert sure.auc == 1.0 and sure.p_value == pytest.approx(1 / 51)
    # a weak real edge on the 1-bar return
    r1 = eps[1 : n + 1]
    edge = auc_block_null(0.15 * r1 + rng.standard_normal(n), r1, block=64, n_perm=300, seed=2)
    assert edge.p_value < 0.01 and edge.z > 3, edge
    with pytest.raises(FxDataError, match="block"):
        auc_block_null(s, y, block=0)
