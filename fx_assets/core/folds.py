"""Walk-forward fold ranges: half-open index ranges into a fold's concatenated bars.

Owns the split of reference/microstructure.md §7 in its forward-only, rolling form. A fold is
named by its validation quarter; its data is the time-ordered concatenation of the quarters
it may see (the ``train_quarters`` quarters before the validation quarter, then the
validation quarter). Ranges are computed from the bar timestamps alone (``searchsorted`` on
``ts_close``), so the trainer uploads each quarter once and slices by index.

- Validation: bars with ``ts_close`` in the validation quarter, ``[val_start, val_end)``.
- Training: bars of the N quarters before it, minus the first ``warmup_bars`` of the
  concatenation, minus the last ``purge_bars + embargo`` before ``val_start``.
- Purge: a training bar j carries a label that reaches bar ``j + max_horizon()``; dropping
  the last ``purge_bars >= max_horizon()`` training bars keeps every training label strictly
  before the first validation bar. The embargo adds a further gap: by default (reference §7.4,
  forward-only walk-forward) ``max(label horizon, longest feature look-back)`` bars, so no
  validation feature's window reaches a bar whose label was fitted.
- Normalisation statistics are fitted on ``[train_start, train_end)`` only, by the trainer.

Snapshot rows (``row_unit="snapshot"``: one row per book update; ranges from ``ts_recv``): the
same split counted in rows. The purge is derived, never configured short: ``max(purge_bars,
label reach)`` where the reach is ``snapshot_labels.label_reach`` of the label config (longest
horizon plus the rows a label reads up to n: 501 rows with the default horizons), and the
default embargo is ``max(reach, snapshot_feature_lookback)`` rows.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from fx_assets.core import calendar
from fx_assets.core.bar_features import BarFeatureConfig, build_registry
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.labels import max_horizon
from fx_assets.core.ofi import OfiConfig
from fx_assets.core.snapshot_features import SnapshotFeatureConfig

I64 = npt.NDArray[np.int64]


class FoldConfig(ConfigModel):
    """Walk-forward split parameters (part of the trained model's cache key)."""

    train_quarters: int = Field(
        ge=1, description="Rolling training window: quarters before the validation quarter."
    )
    purge_bars: int = Field(
        ge=0,
        description="Training bars dropped before validation start; must be >= the longest label horizon "
        "(labels.max_horizon(): entry lag + longest horizon) so no training label reaches validation.",
    )
    embargo_bars: int | None = Field(
        default=None,
        ge=0,
        description="Extra gap (bars) between training end (after the purge) and validation. None: "
        "max(label horizon, longest feature look-back of the pipeline's feature configs).",
    )
    warmup_bars: int = Field(
        ge=0, description="Bars excluded at the start of the concatenation (feature warm-up)."
    )

    @model_validator(mode="after")
    def _purge_covers_label_horizon(self) -> FoldConfig:
        need = max_horizon()
        if self.purge_bars < need:
            raise ValueError(
                f"purge_bars={self.purge_bars} is shorter than the label horizon {need} bars "
                "(entry lag + longest horizon of the blended target): training labels would reach validation"
            )
        return self


@dataclass(frozen=True)
class FoldRange:
    """Index ranges (half-open) into the fold's concatenated bars, and the edge timestamps."""

    name: str  # validation quarter label, e.g. 2024-Q3
    train_start: int
    train_end: int
    val_start: int
    val_end: int
    train_first_ts: int  # ts_close of bar train_start
    train_last_ts: int  # ts_close of bar train_end - 1
    val_first_ts: int
    val_last_ts: int
    purge_bars: int
    embargo_bars: int
    warmup_excluded: int  # bars of the training quarters dropped as warm-up

    @property
    def train(self) -> slice:
        return slice(self.train_start, self.train_end)

    @property
    def val(self) -> slice:
        return slice(self.val_start, self.val_end)

    @property
    def n_train(self) -> int:
        return self.train_end - self.train_start

    @property
    def n_val(self) -> int:
        return self.val_end - self.val_start


def quarter_start_ns(first_day: dt.date) -> int:
    """UTC instant (ns) at which the quarter's first session opens: its bars close at or after it."""
    sessions = calendar.quarter_sessions(first_day)
    opens, _ = calendar.session_bounds_utc(sessions[:1])
    return int(opens[0])


def _quarter_name(start_ns: int) -> str:
    # Session opens fall on the previous (UTC) day, so name the quarter by its session day.
    day = int(calendar.session_day(np.array([start_ns], dtype=np.int64))[0])
    if day >= 0:
        return calendar.quarter_label(dt.date(1970, 1, 1) + dt.timedelta(days=day))
    return calendar.quarter_label(dt.datetime.fromtimestamp(start_ns / 1e9, tz=dt.UTC).date())


#: A recursive indicator's look-back: the bars after which its start weighs less than this.
LOOKBACK_WEIGHT = 0.01


def feature_lookback(bar_features: BarFeatureConfig, ofi: OfiConfig) -> int:
    """Longest trailing window (bars) of any model input, for the default embargo.

    Rolling windows count in full (OFI bar-count windows too). A recursive indicator (EWMA,
    Wilder, CUSUM) depends on every past bar; its registry ``window`` is where the start's
    weight falls to ``memory_tol`` (≈1e-12, for exact partition equivalence), so its look-back
    here is where that weight falls to :data:`LOOKBACK_WEIGHT` instead (EWMA span 100: 231 bars).
    """
    scale = math.log(LOOKBACK_WEIGHT) / math.log(bar_features.memory_tol)
    out = int(ofi.effective_warmup_bars)
    for spec in build_registry(bar_features):
        recursive = spec.window > spec.warmup + 2  # a rolling window of w bars has warm-up w - 1 or w - 2
        out = max(out, math.ceil(spec.window * scale) if recursive else spec.window)
    return out


def snapshot_feature_lookback(cfg: SnapshotFeatureConfig) -> int:
    """Longest trailing window of the snapshot stack counted in updates (rows): the default
    embargo of snapshot folds. Windows counted in trades or volume buckets, and the last closed
    bar's context, span an unbounded number of rows and are not covered by a row embargo."""
    return max([*cfg.flow_windows, cfg.mlofi_window, cfg.rate_window, *cfg.drift_windows])


def fold_range(
    ts_concat: npt.ArrayLike,
    quarter_starts_ns: Sequence[int],
    val_quarter_index: int,
    config: FoldConfig,
    *,
    label_horizon: int | None = None,
    feature_lookback: int = 0,
    name: str | None = None,
    row_unit: str = "bar",
) -> FoldRange:
    """Train / validation ranges of one fold from bar close times alone.

    ``ts_concat``: non-decreasing int64 ``ts_close`` of the concatenated bars.
    ``quarter_starts_ns``: first instant of each quarter in the concatenation, ascending (one
    more entry may close the last quarter; otherwise the last quarter runs to the data's end).
    ``val_quarter_index``: which of them is validated; the ``config.train_quarters`` quarters
    before it train. ``label_horizon``: the horizon of the labels actually used (checked
    against ``purge_bars``; defaults to ``labels.max_horizon()``). ``feature_lookback``: the
    longest feature window in bars (:func:`feature_lookback`); with ``config.embargo_bars``
    None the embargo is ``max(label horizon, feature_lookback)``. ``row_unit="snapshot"``: rows
    are book updates and ``label_horizon`` is the snapshot labels' reach in rows (required); the
    purge is ``max(config.purge_bars, label_horizon)``, so no configuration can make it short.
    Raises ``FxDataError`` naming the fold when a slice would be empty or inputs are bad.
    """
    ts = np.asarray(ts_concat, dtype=np.int64)
    qs = [int(q) for q in quarter_starts_ns]
    i = int(val_quarter_index)
    fold = name if name is not None else (_quarter_name(qs[i]) if 0 <= i < len(qs) else f"#{i}")
    if ts.ndim != 1:
        raise FxDataError(f"fold {fold}: ts_concat must be one-dimensional")
    if any(b <= a for a, b in itertools.pairwise(qs)):
        raise FxDataError(f"fold {fold}: quarter starts are not strictly ascending: {qs}")
    if ts.size > 1 and bool(np.any(np.diff(ts) < 0)):
        j = int(np.flatnonzero(np.diff(ts) < 0)[0]) + 1
        raise FxDataError(f"fold {fold}: ts_close decreases at bar {j} of the concatenation")
    if not 0 <= i < len(qs):
        raise FxDataError(f"fold {fold}: validation quarter index {i} outside 0..{len(qs) - 1}")
    n_q = config.train_quarters
    if i < n_q:
        raise FxDataError(
            f"fold {fold}: needs {n_q} training quarter(s) before the validation quarter, "
            f"the concatenation has {i}"
        )
    if row_unit not in ("bar", "snapshot"):
        raise FxDataError(f"fold {fold}: row_unit {row_unit!r} is not bar or snapshot")
    if row_unit == "snapshot" and label_horizon is None:
        raise FxDataError(f"fold {fold}: snapshot rows need the label reach in rows (label_horizon)")
    horizon = max_horizon() if label_horizon is None else int(label_horizon)
    purge = max(config.purge_bars, horizon) if row_unit == "snapshot" else config.purge_bars
    if purge < horizon:
        raise FxDataError(
            f"fold {fold}: purge_bars={config.purge_bars} < label horizon {horizon}; labels would leak"
        )
    if feature_lookback < 0:
        raise FxDataError(f"fold {fold}: feature_lookback={feature_lookback} must be >= 0")
    embargo = max(horizon, int(feature_lookback)) if config.embargo_bars is None else config.embargo_bars

    n = ts.shape[0]
    q_first = int(np.searchsorted(ts, qs[i - n_q], side="left"))
    v0 = int(np.searchsorted(ts, qs[i], side="left"))
    v1 = int(np.searchsorted(ts, qs[i + 1], side="left")) if i + 1 < len(qs) else n
    t0 = max(q_first, config.warmup_bars)
    t1 = v0 - purge - embargo
    if v1 <= v0:
        raise FxDataError(f"fold {fold}: the validation quarter has no bars")
    if t1 <= t0:
        raise FxDataError(
            f"fold {fold}: empty training slice: {v0 - q_first} bars in {n_q} training quarter(s), "
            f"minus warm-up {max(0, config.warmup_bars - q_first)}, purge {purge}, "
            f"embargo {embargo}"
        )
    return FoldRange(
        name=fold,
        train_start=t0,
        train_end=t1,
        val_start=v0,
        val_end=v1,
        train_first_ts=int(ts[t0]),
        train_last_ts=int(ts[t1 - 1]),
        val_first_ts=int(ts[v0]),
        val_last_ts=int(ts[v1 - 1]),
        purge_bars=purge,
        embargo_bars=embargo,
        warmup_excluded=t0 - q_first,
    )


def _iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def fold_table(ranges: Sequence[FoldRange]) -> list[dict[str, Any]]:
    """One row per fold (bar counts, ISO UTC edges) for asset metadata and reports."""
    return [
        {
            "fold": r.name,
            "train_bars": r.n_train,
            "val_bars": r.n_val,
            "train_start": r.train_start,
            "train_end": r.train_end,
            "val_start": r.val_start,
            "val_end": r.val_end,
            "purge_bars": r.purge_bars,
            "embargo_bars": r.embargo_bars,
            "warmup_excluded": r.warmup_excluded,
            "train_from": _iso(r.train_first_ts),
            "train_to": _iso(r.train_last_ts),
            "val_from": _iso(r.val_first_ts),
            "val_to": _iso(r.val_last_ts),
        }
        for r in ranges
    ]
