"""Gradient-boosted-tree baseline (LightGBM, CPU): the corroborating model of the signal report.

Owns :class:`GbtConfig` and :func:`train_gbt`: fit a binary LightGBM classifier (up vs down,
zero moves left out) on a row sample of a fold's training rows and predict P(up) for its
validation rows (given at once, or later in chunks with :meth:`GbtResult.predict`). Reference: ../shared/reference/snapshot.md §5.

Rows (oldest first) and why they are chosen this way:

- training rows ``[0, n_train)`` whose label is NaN (undefined, or a zero move excluded by
  ``snapshot_labels(zero="exclude")``) or 0 are dropped;
- with early stopping (``early_stopping_rounds > 0``) the last ``early_stop_share`` of the
  training rows is the stopping block and the ``purge_rows`` rows before it are dropped, so the
  fitted rows' labels never overlap the block's (a random split would, neighbouring snapshot
  rows being near-duplicates with overlapping labels);
- the rows fitted on are thinned by ``stride`` (every stride-th row; ~h for labels h rows
  ahead, so neighbours are ~independent) and then at most ``sample_rows`` of them are drawn
  without replacement with ``seed`` (kept in time order).

Determinism: LightGBM runs with ``deterministic=True``, ``force_row_wise=True``, a fixed
``num_threads`` and every seed derived from ``seed``; same inputs and config give bit-identical
predictions (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field

from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError

F64 = npt.NDArray[np.float64]


class GbtConfig(ConfigModel):
    """LightGBM baseline settings (defaults: snapshot.md §5 starting point, not a tuned result)."""

    sample_rows: int = Field(
        default=200_000, ge=100, description="Most training rows fitted on (after stride)."
    )
    stride: int = Field(default=1, ge=1, description="Thin the training rows to every stride-th row (rows).")
    seed: int = Field(default=0, ge=0, lt=2**31, description="Row-sample and LightGBM seed.")
    n_estimators: int = Field(default=500, ge=1, description="Most boosting rounds (trees).")
    learning_rate: float = Field(default=0.05, gt=0.0, le=1.0, description="Shrinkage per tree.")
    num_leaves: int = Field(default=63, ge=2, description="Leaves per tree.")
    min_data_in_leaf: int = Field(default=1000, ge=1, description="Fewest training rows in a leaf.")
    feature_fraction: float = Field(default=0.8, gt=0.0, le=1.0, description="Share of features per tree.")
    bagging_fraction: float = Field(
        default=0.5, gt=0.0, le=1.0, description="Share of rows per bagging round (with bagging_freq > 0)."
    )
    bagging_freq: int = Field(default=1, ge=0, description="Re-draw the bag every k rounds (0: off).")
    lambda_l2: float = Field(default=10.0, ge=0.0, description="L2 penalty on leaf values.")
    max_bin: int = Field(default=255, ge=2, description="Histogram bins per feature.")
    early_stopping_rounds: int = Field(
        default=200,
        ge=0,
        description="Stop after this many rounds without a better stopping-block loss (0: off).",
    )
    early_stop_share: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="Share of the training rows (the latest) that is the stopping block.",
    )
    purge_rows: int = Field(
        default=501,
        ge=0,
        description="Rows dropped before the stopping block: >= the longest label reach (rows).",
    )
    num_threads: int = Field(default=1, ge=1, description="LightGBM threads (fixed, for determinism).")


@dataclass
class GbtResult:
    """P(up) per validation row and what was fitted."""

    proba: F64  # [n_valid] in (0, 1)
    best_iteration: int  # trees used for the predictions
    n_fit: int  # training rows fitted on
    n_stop: int  # rows of the early-stopping block (0 without early stopping)
    importance_gain: dict[str, float] = field(default_factory=dict)  # total split gain per feature
    params: dict[str, Any] = field(default_factory=dict)  # the LightGBM parameters used
    booster: Any = None  # the fitted lightgbm.Booster

    def predict(self, x: npt.ArrayLike) -> F64:
        """P(up) of rows ``x`` [rows, features] with the trees the result used: row by row, so
        any split of the rows into chunks gives the same numbers (tested)."""
        xv = np.asarray(x, dtype=np.float64)
        if xv.ndim != 2 or xv.shape[1] != self.booster.num_feature():
            raise FxDataError(
                f"GbtResult.predict: x {xv.shape}, expected [rows, {self.booster.num_feature()}]"
            )
        if xv.shape[0] == 0:
            return np.empty(0, dtype=np.float64)
        return np.asarray(self.booster.predict(xv, num_iteration=self.best_iteration), dtype=np.float64)


def _params(cfg: GbtConfig) -> dict[str, Any]:
    return {
        "objective": "binary",
        "learning_rate": cfg.learning_rate,
        "num_leaves": cfg.num_leaves,
        "min_data_in_leaf": cfg.min_data_in_leaf,
        "feature_fraction": cfg.feature_fraction,
        "bagging_fraction": cfg.bagging_fraction,
        "bagging_freq": cfg.bagging_freq,
        "lambda_l2": cfg.lambda_l2,
        "max_bin": cfg.max_bin,
        "num_threads": cfg.num_threads,
        "seed": cfg.seed,
        "deterministic": True,
        "force_row_wise": True,
        "verbosity": -1,
    }


def _binary(y: F64) -> npt.NDArray[np.bool_]:
    return np.isfinite(y) & (y != 0)


def train_gbt(
    x_train: npt.ArrayLike,
    y_train: npt.ArrayLike,
    x_valid: npt.ArrayLike | None,
    cfg: GbtConfig | None = None,
    feature_names: list[str] | None = None,
) -> GbtResult:
    """Fit on a row sample of ``(x_train, y_train)`` and return P(up) for every row of ``x_valid``.

    ``x_*``: [rows, features] (NaN allowed: LightGBM's missing value), training rows oldest
    first. ``y_train``: label per training row, up > 0, down < 0, 0 / NaN left out (the
    ``classes`` of :func:`fx_assets.core.snapshot_labels.snapshot_labels`, or signed moves).
    ``x_valid`` None: no rows predicted here (``proba`` empty; :meth:`GbtResult.predict` later).
    """
    import lightgbm as lgb

    cfg = cfg or GbtConfig()
    xt = np.asarray(x_train, dtype=np.float64)
    yt = np.asarray(y_train, dtype=np.float64)
    xv = np.asarray(x_valid if x_valid is not None else np.empty((0, np.shape(xt)[-1])), dtype=np.float64)
    if xt.ndim != 2 or xv.ndim != 2 or xt.shape[1] != xv.shape[1]:
        raise FxDataError(
            f"train_gbt: x_train {xt.shape} and x_valid {xv.shape} must be 2-D with equal widths"
        )
    if yt.shape != (xt.shape[0],):
        raise FxDataError(f"train_gbt: y_train {yt.shape} does not match x_train rows {xt.shape[0]}")
    names = feature_names or [f"f{j}" for j in range(xt.shape[1])]
    if len(names) != xt.shape[1]:
        raise FxDataError(f"train_gbt: {len(names)} feature names for {xt.shape[1]} columns")
    n = xt.shape[0]
    stop = np.zeros(0, dtype=np.int64)
    fit_end = n
    if cfg.early_stopping_rounds > 0:
        s0 = int(n * (1.0 - cfg.early_stop_share))
        fit_end = max(0, s0 - cfg.purge_rows)
        stop = np.arange(s0, n)
        stop = stop[_binary(yt[stop])]
    fit = np.arange(0, fit_end, cfg.stride)
    fit = fit[_binary(yt[fit])]
    if fit.size > cfg.sample_rows:
        rng = np.random.default_rng(cfg.seed)
        fit = np.sort(rng.choice(fit, size=cfg.sample_rows, replace=False))
    if fit.size < 2 or np.unique(yt[fit] > 0).size < 2:
        raise FxDataError(f"train_gbt: {fit.size} usable training rows, need both classes")
    if cfg.early_stopping_rounds > 0 and (stop.size < 2 or np.unique(yt[stop] > 0).size < 2):
        raise FxDataError(f"train_gbt: early-stopping block has {stop.size} usable rows, need both classes")
    params = _params(cfg)
    dfit = lgb.Dataset(
        xt[fit], label=(yt[fit] > 0).astype(np.float64), feature_name=names, free_raw_data=True
    )
    valid_sets: list[Any] = []
    callbacks: list[Callable[..., Any]] = []
    if cfg.early_stopping_rounds > 0:
        dstop = lgb.Dataset(xt[stop], label=(yt[stop] > 0).astype(np.float64), reference=dfit)
        valid_sets = [dstop]
        callbacks = [lgb.early_stopping(cfg.early_stopping_rounds, verbose=False)]
    booster = lgb.train(
        params, dfit, num_boost_round=cfg.n_estimators, valid_sets=valid_sets, callbacks=callbacks
    )
    best = (
        int(booster.best_iteration)
        if cfg.early_stopping_rounds > 0 and booster.best_iteration > 0
        else (booster.current_iteration())
    )
    proba = (
        np.asarray(booster.predict(xv, num_iteration=best), dtype=np.float64)
        if xv.shape[0]
        else np.empty(0, dtype=np.float64)
    )
    gain = booster.feature_importance(importance_type="gain", iteration=best)
    return GbtResult(
        proba=proba,
        best_iteration=best,
        n_fit=int(fit.size),
        n_stop=int(stop.size),
        importance_gain={nm: float(g) for nm, g in zip(names, gain, strict=True)},
        params=params,
        booster=booster,
    )
