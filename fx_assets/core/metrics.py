"""Evaluation metrics of reference/microstructure.md §8 (numpy, float64).

Owns: per-bar strategy returns, the session-aggregated (daily) Sharpe ratio and the bar-level
annualised one, maximum drawdown, equity curve, hit rate with coverage, turnover and the
rank-based ROC AUC. Returns are log returns throughout, so they add over bars and sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fx_assets.core.errors import FxDataError

F64 = npt.NDArray[np.float64]
NS_PER_YEAR = 365.25 * 86_400 * 1_000_000_000


def _vec(x: npt.ArrayLike, name: str) -> F64:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise FxDataError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a


def strategy_returns(pos: npt.ArrayLike, fwd_ret: npt.ArrayLike, cost: float | npt.ArrayLike) -> F64:
    """``R_j = pos_j * y_j - |pos_j - pos_{j-1}| * cost`` with ``pos_{-1} = 0`` (start flat).

    ``fwd_ret``: the 1-bar forward log return the position earns (labels.forward_log_return
    with h=1). ``cost``: half-spread + fee in log-return units, scalar or per bar.
    """
    p = _vec(pos, "pos")
    y = _vec(fwd_ret, "fwd_ret")
    if p.shape != y.shape:
        raise FxDataError(f"pos {p.shape} and fwd_ret {y.shape} differ in length")
    dpos = np.abs(np.diff(p, prepend=0.0))
    return p * y - dpos * np.asarray(cost, dtype=np.float64)


def turnover(pos: npt.ArrayLike) -> float:
    """Mean ``|pos_j - pos_{j-1}|`` per bar, starting flat (units of position per bar)."""
    p = _vec(pos, "pos")
    return float(np.abs(np.diff(p, prepend=0.0)).mean()) if p.size else math.nan


def equity_curve(returns: npt.ArrayLike) -> F64:
    """``E_0 = 1``, ``E_j = exp(sum_{k<=j} R_k)``: length n + 1."""
    r = _vec(returns, "returns")
    return np.exp(np.concatenate([[0.0], np.cumsum(r)]))


def max_drawdown(returns: npt.ArrayLike) -> float:
    """``max_j (1 - E_j / max_{k<=j} E_k)`` on the curve with ``E_0 = 1``; a positive fraction."""
    e = equity_curve(returns)
    return float(np.max(1.0 - e / np.maximum.accumulate(e)))


def daily_returns(
    returns: npt.ArrayLike,
    session_ids: npt.ArrayLike,
    all_sessions: npt.ArrayLike | None = None,
) -> tuple[npt.NDArray[np.int64], F64]:
    """Session sums of bar log returns: (session days, R_D).

    ``session_ids``: per bar, ``calendar.session_day`` (days since epoch). By default the
    sessions are those present in the data: a weekday without bars is an exchange holiday (or
    no data), not a flat trading day, so it adds no zero-return day. ``all_sessions`` lists the
    open sessions explicitly; an open session without bars then counts as 0.
    """
    r = _vec(returns, "returns")
    s = np.asarray(session_ids, dtype=np.int64)
    if s.shape != r.shape:
        raise FxDataError(f"session_ids {s.shape} and returns {r.shape} differ in length")
    if (s < 0).any():
        raise FxDataError(f"bar {int(np.flatnonzero(s < 0)[0])} has no session (id < 0)")
    if r.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if all_sessions is None:
        days = np.unique(s)
    else:
        days = np.unique(np.asarray(all_sessions, dtype=np.int64))
        missing = np.setdiff1d(s, days)
        if missing.size:
            raise FxDataError(f"session {int(missing[0])} of the bars is not in all_sessions")
    idx = np.searchsorted(days, s)
    out = np.zeros(days.size)
    np.add.at(out, idx, r)
    return days, out


def _sharpe(x: F64, periods: float) -> float:
    if x.size < 2:
        return math.nan
    if not np.any(x):  # a flat book: no return, no risk -> 0 (a model that stays out earns nothing)
        return 0.0
    sd = float(np.std(x, ddof=1))
    if not sd > 0:
        return math.nan
    return float(math.sqrt(periods) * np.mean(x) / sd)


def sharpe_daily(
    returns: npt.ArrayLike,
    session_ids: npt.ArrayLike,
    periods: int = 252,
    all_sessions: npt.ArrayLike | None = None,
) -> float:
    """Primary Sharpe: ``sqrt(periods) * mean(R_D) / std(R_D, ddof=1)`` over sessions.

    NaN with fewer than two sessions or zero variance, except 0 for all-zero returns (flat).
    """
    _, rd = daily_returns(returns, session_ids, all_sessions)
    return _sharpe(rd, periods)


def sharpe_bar(returns: npt.ArrayLike, ts_ns: npt.ArrayLike) -> float:
    """Secondary Sharpe: ``SR_bar * sqrt(N_y)`` with ``N_y = (n - 1) / years spanned``."""
    r = _vec(returns, "returns")
    ts = np.asarray(ts_ns, dtype=np.int64)
    if ts.shape != r.shape:
        raise FxDataError(f"ts {ts.shape} and returns {r.shape} differ in length")
    if r.size < 2:
        return math.nan
    years = float(ts[-1] - ts[0]) / NS_PER_YEAR
    if not years > 0:
        return math.nan
    return _sharpe(r, (r.size - 1) / years)


@dataclass(frozen=True)
class HitRate:
    rate: float  # share of bars with pos != 0 and y != 0 where sign(pos) == sign(y)
    coverage: float  # share of bars with pos != 0
    n_scored: int  # bars in the rate's denominator


def hit_rate(pos: npt.ArrayLike, y: npt.ArrayLike) -> HitRate:
    """Per-bar hit rate and coverage (bars with NaN y are not scored)."""
    p = _vec(pos, "pos")
    yy = _vec(y, "y")
    if p.shape != yy.shape:
        raise FxDataError(f"pos {p.shape} and y {yy.shape} differ in length")
    scored = (p != 0) & (yy != 0) & np.isfinite(yy)
    n = int(scored.sum())
    rate = float(np.mean(np.sign(p[scored]) == np.sign(yy[scored]))) if n else math.nan
    coverage = float(np.mean(p != 0)) if p.size else math.nan
    return HitRate(rate=rate, coverage=coverage, n_scored=n)


def average_ranks(x: npt.ArrayLike) -> F64:
    """1-based ranks, ties sharing their average rank."""
    a = _vec(x, "x")
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts).astype(np.float64)
    return (ends - (counts - 1) / 2.0)[inv]


def auc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """ROC AUC from ranks: ``(sum of positive ranks - n1(n1+1)/2) / (n1 n0)``.

    ``labels``: binary (bool, or 0/1). Ties in ``scores`` take average ranks. NaN when only
    one class is present (not 0.5).
    """
    s = _vec(scores, "scores")
    z = np.asarray(labels)
    if z.shape != s.shape:
        raise FxDataError(f"scores {s.shape} and labels {z.shape} differ in length")
    if not np.isfinite(s).all():
        raise FxDataError(f"scores: non-finite value at {int(np.flatnonzero(~np.isfinite(s))[0])}")
    zf = z.astype(np.float64)
    if not np.isin(zf, (0.0, 1.0)).all():
        raise FxDataError("labels must be binary (bool or 0/1); use auc_returns for signed returns")
    pos = zf == 1.0
    n1 = int(pos.sum())
    n0 = int(s.size - n1)
    if n1 == 0 or n0 == 0:
        return math.nan
    ranks = average_ranks(s)
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def auc_returns(scores: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """AUC of ``scores`` for ``z = 1{y > 0}``, dropping bars with ``y == 0`` or NaN."""
    s = _vec(scores, "scores")
    yy = _vec(y, "y")
    if s.shape != yy.shape:
        raise FxDataError(f"scores {s.shape} and y {yy.shape} differ in length")
    keep = (yy != 0) & np.isfinite(yy)
    return auc(s[keep], yy[keep] > 0)


@dataclass(frozen=True)
class AucNull:
    """An AUC against its empirical null from block-permuted labels."""

    auc: float
    null_sd: float  # sd of the permuted AUCs around 0.5
    z: float  # (auc - 0.5) / null_sd
    p_value: float  # two-sided: share of permuted |AUC - 0.5| >= the observed one, (k + 1) / (n + 1)
    n_perm: int
    block: int


def auc_block_null(
    scores: npt.ArrayLike, y: npt.ArrayLike, block: int, n_perm: int = 200, seed: int = 0
) -> AucNull:
    """AUC of ``scores`` for ``1{y > 0}`` with a null distribution from block-permuted labels.

    Overlapping multi-horizon labels are autocorrelated up to their longest horizon, so
    ``1/sqrt(n)`` understates the AUC's spread under the null. Permuting the labels in blocks of
    ``block`` consecutive bars (``block`` longer than the longest label horizon) keeps that
    dependence and breaks only the alignment of scores and labels: the permuted AUCs are the
    null. Bars with ``y == 0`` or NaN are dropped first (as in :func:`auc_returns`).
    """
    s = _vec(scores, "scores")
    yy = _vec(y, "y")
    if s.shape != yy.shape:
        raise FxDataError(f"scores {s.shape} and y {yy.shape} differ in length")
    if block < 1 or n_perm < 1:
        raise FxDataError(f"auc_block_null: block {block} and n_perm {n_perm} must be >= 1")
    keep = (yy != 0) & np.isfinite(yy)
    s, z = s[keep], yy[keep] > 0
    a = auc(s, z)
    n, n1 = z.size, int(z.sum())
    n_blocks = -(-n // block) if n else 0
    if math.isnan(a) or n_blocks < 2:
        return AucNull(a, math.nan, math.nan, math.nan, 0, block)
    ranks = average_ranks(s)
    starts = np.arange(n_blocks) * block
    lens = np.minimum(starts + block, n) - starts
    rng = np.random.default_rng(seed)
    null = np.empty(n_perm)
    base = n1 * (n1 + 1) / 2.0
    for k in range(n_perm):
        order = rng.permutation(n_blocks)
        ln = lens[order]
        # concatenated blocks in permuted order: start of each block + offset within it
        idx = np.repeat(starts[order] - np.cumsum(ln) + ln, ln) + np.arange(n)
        null[k] = (ranks[z[idx]].sum() - base) / (n1 * (n - n1))
    dev = np.abs(null - 0.5)
    sd = float(np.sqrt(np.mean((null - 0.5) ** 2)))
    p = float((1 + np.sum(dev >= abs(a - 0.5) - 1e-15)) / (n_perm + 1))
    return AucNull(a, sd, (a - 0.5) / sd if sd > 0 else math.nan, p, n_perm, block)
