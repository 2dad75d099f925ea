"""Event-time labels of the snapshot row unit: the mid move K book updates ahead.

Owns the label definitions of reference/snapshot.md §1 for rows that are MBP-10 updates (not
bars). Like the bar labels (``core.labels``) they look ahead, so they are never stored: the
trainer derives them on the device from the fold's exact float64 mid column. Row ``n`` is one
update; a horizon ``h`` counts rows (updates), never seconds.

Forms (``p`` = mid, means over rows; ``back`` = how many rows up to ``n`` the label reads):

- ``unsmoothed`` (default): ``(p[n+h] - p[n]) / p[n]`` (back 1);
- ``fi`` (FI-2010 / LOBCAST): ``(mean p[n+1..n+h] - p[n]) / p[n]`` (back 1);
- ``deeplob`` (its Eq. 4): ``(mean p[n+1..n+h] - mean p[n-h+1..n]) / mean p[n-h+1..n]`` (back h);
- ``tlob``: ``(m(n+h) - m(n)) / m(n)`` with ``m(i) = mean p[i-w+1..i]``, ``w = min(smooth, h)``
  (back w): a fixed smoothing window, so the label's lead is exactly h rows at every horizon.

Exactness: the mid lives on the half-tick grid, so it is taken as int64 half-ticks (checked:
a mid off the grid is an error naming the row), window sums are int64 prefix-sum differences
(exact; float32 prefix sums flip most labels, snapshot.md §4.1), and only the final ratio is
float64. A label is undefined (NaN) where its rows ``[n-back+1, n+h]`` leave the slice or span
a *break*: a change of the running break count (contract rolls and session boundaries).

Classes: up (+1) if the change is > alpha, down (-1) if < -alpha, stationary (0) otherwise.
``alpha`` per horizon is 0 ("any move") or the ``stationary_share`` quantile of |change| over the
defined **training** rows only (fitted per fold, never on validation). Zero moves are handled
explicitly: ``zero="three_class"`` keeps the stationary class; ``zero="exclude"`` leaves those
rows out of training and AUC (class NaN) and reports their share.

The purge between training and validation must cover every label's reach, ``label_reach(cfg)``
= max over horizons of ``h + back`` rows (reference: h + 1 unsmoothed, 2h DeepLOB, h + w TLOB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError

if TYPE_CHECKING:  # torch loads with the functions that run it (the definitions import none)
    import torch

LabelForm = Literal["unsmoothed", "fi", "deeplob", "tlob"]
GRID_TOLERANCE = 1e-6  # |2 p / tick - round(2 p / tick)| allowed, in half-ticks


class SnapshotLabelConfig(ConfigModel):
    """Labels of snapshot rows (see the module docstring)."""

    horizons: list[int] = Field(
        default_factory=lambda: [10, 20, 50, 100, 500],
        description="Horizons in rows (book updates) ahead; distinct, >= 1.",
    )
    form: LabelForm = Field(default="unsmoothed", description="Label form: unsmoothed, fi, deeplob or tlob.")
    smooth: int = Field(default=10, ge=1, description="TLOB smoothing window w in rows (w = min(w, h)).")
    stationary_share: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Dead band: alpha = this quantile of |change| on the training rows (None: alpha 0).",
    )
    zero: Literal["exclude", "three_class"] = Field(
        default="exclude",
        description="Stationary rows (|change| <= alpha): left out (binary up/down) or a third class.",
    )

    @field_validator("horizons")
    @classmethod
    def _distinct_positive(cls, v: list[int]) -> list[int]:
        if not v or any(h < 1 for h in v) or len(set(v)) != len(v):
            raise ValueError(f"horizons must be distinct positive row counts, got {v}")
        return v


def back_rows(form: LabelForm, h: int, smooth: int) -> int:
    """Rows up to and including ``n`` that the label of row ``n`` at horizon ``h`` reads."""
    if form in ("unsmoothed", "fi"):
        return 1
    if form == "deeplob":
        return h
    return min(smooth, h)


def label_reach(cfg: SnapshotLabelConfig) -> int:
    """The purge every fold needs: the most rows any label's window spans (``h + back``)."""
    return max(h + back_rows(cfg.form, h, cfg.smooth) for h in cfg.horizons)


def running_breaks(*ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Running count of breaks (a change of any of ``ids``, e.g. session day and contract) per
    row, 0 at row 0: a window ``[a, b]`` spans a break iff the counts at a and b differ."""
    cols = [np.asarray(x) for x in ids]
    if not cols:
        raise FxDataError("running_breaks: no id columns")
    n = cols[0].shape[0]
    if any(c.ndim != 1 or c.shape[0] != n for c in cols):
        raise FxDataError(f"running_breaks: id columns of shapes {[c.shape for c in cols]}")
    change = np.zeros(n, dtype=bool)
    for c in cols:
        change[1:] |= c[1:] != c[:-1]
    return np.cumsum(change, dtype=np.int64)


def half_ticks(mid: torch.Tensor, tick: float) -> torch.Tensor:
    """The mid as exact int64 half-ticks; FxDataError naming the first row off the grid."""
    import torch

    if mid.dtype != torch.float64:
        raise FxDataError(f"mid must be float64 (the exact price block), got {mid.dtype}")
    if not (np.isfinite(tick) and tick > 0):
        raise FxDataError(f"tick must be finite and > 0, got {tick!r}")
    r = mid * (2.0 / tick)
    u = torch.round(r)
    bad = ~torch.isfinite(r) | (torch.abs(r - u) > GRID_TOLERANCE) | (u <= 0)
    if bool(bad.any()):
        j = int(torch.nonzero(bad)[0, 0])
        raise FxDataError(
            f"mid at row {j} is {float(mid[j])!r}: not a positive price on the {tick / 2} half-tick grid"
        )
    return u.to(torch.int64)


def relative_change(
    u: torch.Tensor, breaks: torch.Tensor | None, h: int, form: LabelForm, smooth: int
) -> torch.Tensor:
    """The float64 label value of every row at horizon ``h`` from int64 half-ticks ``u``; NaN
    where the window leaves the slice or spans a break."""
    import torch

    n = int(u.shape[0])
    back = back_rows(form, h, smooth)
    out = torch.full((n,), float("nan"), dtype=torch.float64, device=u.device)
    lo0 = back - 1  # first row whose window starts inside the slice
    hi0 = n - h  # rows [lo0, hi0) have every row of their window
    if hi0 <= lo0:
        return out
    # Rows [lo0, hi0) shifted by a constant are slices (views), not gathers: on the device a
    # fold transition is a handful of elementwise passes per horizon.
    if breaks is not None and breaks.shape != u.shape:
        raise FxDataError(f"breaks shape {tuple(breaks.shape)} differs from mid {tuple(u.shape)}")

    def at(k: int) -> slice:  # rows [lo0, hi0) shifted by k
        return slice(lo0 + k, hi0 + k)

    if form == "unsmoothed":
        now = u[at(0)].to(torch.float64)
        val = (u[at(h)].to(torch.float64) - now) / now
    else:
        s = torch.zeros(n + 1, dtype=torch.int64, device=u.device)
        s[1:] = torch.cumsum(u, 0)

        def mean(k: int, w: int) -> torch.Tensor:  # mean of u[a-w+1 .. a], a = row + k: exact sum
            return (s[at(k + 1)] - s[at(k + 1 - w)]).to(torch.float64) / w

        if form == "fi":
            now = u[at(0)].to(torch.float64)
            val = (mean(h, h) - now) / now
        else:
            w = h if form == "deeplob" else back
            past = mean(0, w)
            val = (mean(h, w) - past) / past
    if breaks is not None:
        val = torch.where(breaks[at(h)] == breaks[at(1 - back)], val, torch.nan)
    out[lo0:hi0] = val
    return out


@dataclass
class HorizonLabels:
    """One horizon's labels of a fold's rows."""

    horizon: int
    change: torch.Tensor  # [n] float64, NaN where undefined
    classes: torch.Tensor  # [n] float64: +1 / -1 / 0 (three_class) / NaN (undefined or excluded)
    alpha: float  # the dead band, fitted on the training rows
    shares: dict[str, float] = field(default_factory=dict)  # over the defined training rows
    train_defined: int = 0  # training rows whose label is defined (before any exclusion)


QUANTILE_MAX = 1 << 24  # the most values torch.quantile takes (a fold of 300 M updates has more)


def fit_alpha(change_train: torch.Tensor, share: float | None) -> float:
    """The dead band: 0, or the ``share`` quantile of |change| over the defined training rows."""
    import torch

    if share is None:
        return 0.0
    a = torch.abs(change_train[torch.isfinite(change_train)])
    if a.numel() == 0:
        raise FxDataError("no defined training label to fit the dead band on")
    if a.numel() > QUANTILE_MAX:  # torch.quantile refuses larger inputs; the same number, exactly
        fit = AbsChangeQuantile(share)
        fit.add(a)
        return fit.alpha()
    return float(torch.quantile(a, share))  # ties at 0 (zero moves) floor the band at 0


class AbsChangeQuantile:
    """The dead band of :func:`fit_alpha` fitted in one streaming pass: the training rows' label
    changes arrive block by block (:meth:`add`), :meth:`alpha` is then the same number, exactly.

    Exact, not a sketch: every finite |change| is kept on the host as distinct values with their
    counts (a block's values merged by ``np.unique``; mids on the half-tick grid repeat the same
    few ratios, so the distinct values are far fewer than the rows), and :meth:`alpha` reads the
    two order statistics around rank ``share * (n - 1)`` from the cumulative counts and
    interpolates them as ``torch.quantile`` does (linear; its ``lerp``: ``a + w (b - a)`` for
    ``w < 0.5``, else ``b - (b - a)(1 - w)``, each a fused multiply-add, rounded once), so the
    result is that of :func:`fit_alpha` over all the values at once (tested bit for bit against
    torch.quantile on the CPU; the same rule matched it on CUDA, torch 2.11 on an H200, 3000
    random cases). Host memory: 16 bytes per distinct value and horizon; the unsmoothed and fi
    ratios repeat heavily, the smoothed forms (ratios of window sums) can be nearly all
    distinct, at worst 16 bytes per training row and horizon. Unlike ``torch.quantile`` it has no input-size limit (2**24 values).
    """

    COMPACT_AT = 1 << 22  # pending distinct values merged into the table beyond this many

    def __init__(self, share: float) -> None:
        if not 0.0 < share < 1.0:
            raise FxDataError(f"dead band share must lie in (0, 1), got {share!r}")
        self.share = float(share)
        self._vals = np.empty(0, dtype=np.float64)
        self._counts = np.empty(0, dtype=np.int64)
        self._pending: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]] = []
        self._n_pending = 0

    def add(self, change: torch.Tensor | npt.ArrayLike) -> None:
        """Add a block of label changes (NaN where undefined: skipped)."""
        c = change.detach().cpu().numpy() if hasattr(change, "detach") else np.asarray(change)
        a = np.abs(np.asarray(c, dtype=np.float64))
        a = a[np.isfinite(a)]
        if a.size == 0:
            return
        v, k = np.unique(a, return_counts=True)
        self._pending.append((v, k.astype(np.int64)))
        self._n_pending += v.size
        if self._n_pending > self.COMPACT_AT:
            self._compact()

    def _compact(self) -> None:
        if not self._pending:
            return
        v = np.concatenate([self._vals, *(p[0] for p in self._pending)])
        k = np.concatenate([self._counts, *(p[1] for p in self._pending)])
        u, inv = np.unique(v, return_inverse=True)
        # float64 sums of int64 counts: exact below 2**53 rows
        self._vals, self._counts = u, np.bincount(inv.ravel(), weights=k, minlength=u.size).astype(np.int64)
        self._pending, self._n_pending = [], 0

    @property
    def n(self) -> int:
        """Finite values added."""
        self._compact()
        return int(self._counts.sum())

    def alpha(self) -> float:
        """The ``share`` quantile of every |change| added (torch.quantile's linear rule)."""
        self._compact()
        n = int(self._counts.sum())
        if n == 0:
            raise FxDataError("no defined training label to fit the dead band on")
        rank = np.float64(self.share) * np.float64(n - 1)
        lo_r, hi_r = int(np.floor(rank)), int(np.ceil(rank))
        w = rank - np.float64(lo_r)
        cum = np.cumsum(self._counts)  # value j covers sorted ranks [cum[j] - count[j], cum[j])
        a = self._vals[int(np.searchsorted(cum, lo_r, side="right"))]
        b = self._vals[int(np.searchsorted(cum, hi_r, side="right"))]
        d = b - a
        return _fma(w, d, a) if w < 0.5 else _fma(-(np.float64(1.0) - w), d, b)


def _fma(x: float | np.floating, y: float | np.floating, z: float | np.floating) -> float:
    """``x * y + z`` rounded once (a fused multiply-add, as torch's vectorised CPU ``lerp``
    computes it; Python 3.11 has no ``math.fma``): exact rational arithmetic, then one rounding."""
    return float(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))


def classify(change: torch.Tensor, alpha: float, zero: Literal["exclude", "three_class"]) -> torch.Tensor:
    """Classes of label changes with the dead band ``alpha``: +1 / -1 / 0 (stationary, NaN when
    ``zero == "exclude"``), NaN where the change is undefined."""
    import torch

    cls = torch.where(change > alpha, 1.0, torch.where(change < -alpha, -1.0, 0.0)).to(torch.float64)
    cls = torch.where(torch.isfinite(change), cls, torch.nan)
    if zero == "exclude":
        cls = torch.where(cls == 0.0, torch.nan, cls)
    return cls


def snapshot_labels(
    mid: torch.Tensor,
    tick: float,
    n_train: int,
    cfg: SnapshotLabelConfig,
    breaks: torch.Tensor | npt.ArrayLike | None = None,
) -> list[HorizonLabels]:
    """Labels of a fold's rows (training rows first: ``[0, n_train)``), one per horizon.

    ``mid`` is the fold's float64 mid column (exact: half-tick grid), ``breaks`` the running
    break count of the same rows (:func:`running_breaks` of session ids and contracts). The
    dead band of each horizon is fitted on the training rows only.
    """
    import torch

    u = half_ticks(mid, tick)
    br = None
    if breaks is not None:
        br = (
            breaks
            if isinstance(breaks, torch.Tensor)
            else torch.from_numpy(np.asarray(breaks, dtype=np.int64))
        )
        br = br.to(mid.device)
    return labels_of_ticks(u, n_train, cfg, br)


def labels_of_ticks(
    u: torch.Tensor, n_train: int, cfg: SnapshotLabelConfig, breaks: torch.Tensor | None
) -> list[HorizonLabels]:
    """:func:`snapshot_labels` of a mid already in int64 half-ticks (:func:`half_ticks`), with
    the break counts on the same device. The class shares of every horizon are counted on the
    device and read back in one transfer."""
    import torch

    n = int(u.shape[0])
    if not 0 < n_train <= n:
        raise FxDataError(f"n_train {n_train} outside (0, {n}]")
    nan = float("nan")
    changes, classes, alphas, counts = [], [], [], []
    for h in cfg.horizons:
        ch = relative_change(u, breaks, h, cfg.form, cfg.smooth)
        alpha = fit_alpha(ch[:n_train], cfg.stationary_share)
        cls = classify(ch, alpha, "three_class")  # the stationary rows are counted first
        tr = cls[:n_train]
        counts.append(
            torch.stack([torch.isfinite(tr).sum(), (tr == 1.0).sum(), (tr == -1.0).sum(), (tr == 0.0).sum()])
        )
        changes.append(ch)
        classes.append(cls)
        alphas.append(alpha)
    table = torch.stack(counts).tolist()  # the one host sync of the shares
    out = []
    for h, ch, cls, alpha, (defined, up, down, flat) in zip(
        cfg.horizons, changes, classes, alphas, table, strict=True
    ):
        if cfg.zero == "exclude":
            cls = cls.masked_fill_(cls == 0.0, nan)
        shares = class_shares(defined, up, down, flat, n_train, cfg.zero)
        out.append(HorizonLabels(h, ch, cls, alpha, shares, int(defined)))
    return out


def class_shares(defined: int, up: int, down: int, flat: int, n_train: int, zero: str) -> dict[str, float]:
    """The shares a fold reports from its training-row class counts: ``defined`` over the
    training rows, up / down / stationary over the defined ones (NaN when none is), and with
    ``zero == "exclude"`` the ``excluded`` share (the stationary rows left out)."""
    shares = {
        "defined": defined / n_train,
        **{
            name: (c / defined if defined else float("nan"))
            for name, c in (("up", up), ("down", down), ("stationary", flat))
        },
    }
    if zero == "exclude":
        shares["excluded"] = shares["stationary"]
    return shares


def breaks_of(*ids: torch.Tensor) -> torch.Tensor:
    """:func:`running_breaks` on the device: the running count of changes of any of ``ids``
    (e.g. the ``session`` and ``contract`` price columns of snapshot rows), int64, 0 at row 0."""
    import torch

    if not ids:
        raise FxDataError("breaks_of: no id columns")
    n = int(ids[0].shape[0])
    if any(c.ndim != 1 or int(c.shape[0]) != n for c in ids):
        raise FxDataError(f"breaks_of: id columns of shapes {[tuple(c.shape) for c in ids]}")
    out = torch.zeros(n, dtype=torch.int64, device=ids[0].device)
    if n > 1:
        change = torch.zeros(n - 1, dtype=torch.bool, device=ids[0].device)
        for c in ids:
            change |= c[1:] != c[:-1]
        out[1:] = torch.cumsum(change, 0)
    return out


def horizon_clock_ns(
    ts: npt.ArrayLike, breaks: npt.ArrayLike | None, horizons: Sequence[int]
) -> dict[int, float]:
    """Each horizon's clock-time equivalent: the median ``ts[n+h] - ts[n]`` (ns) over rows whose
    window spans no break (reported beside the horizon, snapshot.md §1)."""
    t = np.asarray(ts, dtype=np.int64)
    b = None if breaks is None else np.asarray(breaks)
    out = {}
    for h in horizons:
        if t.shape[0] <= h:
            out[int(h)] = float("nan")
            continue
        d = t[h:] - t[:-h]
        if b is not None:
            d = d[b[h:] == b[:-h]]
        out[int(h)] = float(np.median(d)) if d.size else float("nan")
    return out
