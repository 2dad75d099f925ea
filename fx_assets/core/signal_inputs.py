"""The inputs of one fold's signal report, read from its fxcache files: labels per horizon, regime
variables and the predictions of the report's models, for either row unit.

Owns :class:`SignalLabelConfig` (horizons per row unit), :func:`fold_signal` (one fold ->
:class:`FoldSignal`), :meth:`FoldSignal.save` / :meth:`FoldSignal.load` (one ``.npz``, written
atomically) and :func:`stitch_signals` (folds of one row unit concatenated in time order). The
``signal_report`` asset calls these and :func:`fx_assets.core.signal_report.signal_report`.

Rows: the fold's concatenated fxcache rows (its quarters in order) and the ranges of its
:class:`~fx_assets.core.folds.FoldRange`. Labels are derived **per slice**: the training slice
``[train_start, train_end)`` and the validation slice ``[val_start, val_end)`` each on its own, so
a label is undefined (NaN) where its window leaves its slice; no training label reads a row past
``train_end``, whatever the fold's purge (the purge of ``fold_ranges`` counts bar-unit labels).

- ``snapshot`` rows: :func:`fx_assets.core.snapshot_labels.snapshot_labels` on the exact f64
  ``mid`` of the price block (unsmoothed sign ``h`` updates ahead, no dead band), breaks =
  changes of ``session`` or ``contract``; horizons ``snapshot_horizons`` (rows). Validation
  labels keep a zero move as class 0 (stationary; ``zero="three_class"``): the report leaves
  those rows out of its up-vs-down metrics and scores them in its three-class ones; the
  training labels (the GBT's fit) exclude them (NaN), as before.
- ``bar`` rows: the trainers' label, the sign of ``ln close[j+d+h] - ln close[j+d]``
  (:func:`fx_assets.core.labels.forward_log_return`, entry lag ``d = bar_entry_lag``), NaN when
  the window spans a contract change (the trainers' roll mask) and 0 moves excluded (NaN: no
  bar model has a stationary class); horizons ``bar_horizons`` (bars).
- ``zero_share[h]``: zero moves among the validation rows whose change is defined.

Regime variables (columns of the file, see :data:`REGIME_COLUMNS`): spread (snapshot
``book_spread_ticks``, bar ``spread_ticks``, ticks), realised volatility (snapshot ``bar_rv_20``:
the last closed bar's ``rv_20``, the same quantity as the bar rows' ``rv_20``), event rate
(snapshot ``log_event_rate_hz``: log1p of updates/s over the last ``rate_window`` updates; bar
``event_rate``: book snapshots + trades per second over the bar; quintiles are unchanged by the
monotone log). Training values are those of the rows the GBT sample is drawn from.

Memory: the validation rows are decoded and scored ``chunk_rows`` at a time (default
:data:`PREDICT_CHUNK_ROWS`; ``chunk_rows x width x 8`` bytes), so a real-scale snapshot quarter
never lies decoded whole; what is kept per validation row is a few float64 columns (labels,
regimes, one prediction per model and horizon). The training rows' prices (labels) and the
capped GBT sample are decoded whole.

Models (P(up) per validation row):

- ``gbt``: :func:`fx_assets.core.trainers.gbt.train_gbt`, one LightGBM model per horizon on every
  value column (features and OFI; not the price block). Only the rows the fit can use are
  decoded (memory: a snapshot quarter is millions of rows): every ``GbtConfig.stride``-th
  training row, then a seeded subset of ``sample_rows / (1 - early_stop_share)`` of them; the fit
  runs on those with the early-stopping purge counted in them so that it covers
  ``max(purge_rows, longest label reach)`` rows of the file;
- ``l1_imbalance``: the single-feature baseline ``(1 + I1) / 2`` with ``I1`` the level-1 queue
  imbalance (snapshot ``book_l1_imbalance``, bar ``l1_imbalance`` at the bar's close); no fit;
- ``trained_mlp`` / ``trained_dqn`` (when the fold's ``trained_model`` exists for the same
  fxcache files): :func:`trained_predictions` of its ``val_predictions.npz``, one score for
  every horizon (the model is trained at one horizon): the MLP's P(up) as it is, the DQN's
  ``Q(long) - Q(short)`` from flat through the logistic function (monotone, so the AUC is the
  score's; accuracy counts ``Q(long) > Q(short)`` as "up"). Its rows must be the report's
  validation rows (same count, same timestamps in order), else :class:`FxDataError`. A
  three-class MLP (``snapshot_zero='three_class'``) also stored ``proba`` (``[n, 3]`` P(up),
  P(stationary), P(down)): :func:`trained_probabilities` reads it and
  :attr:`FoldSignal.probabilities` carries it (saved, loaded, stitched) to the report's
  three-class metrics. Its stationary class is its training labels' (``|change| <= alpha``, the
  trainer's dead band; a zero move when ``snapshot_stationary_share`` is None, the default);
  the report's stationary class is the zero move, so with a dead band the two differ (the
  report's metadata names the model's ``zero_handling`` and dead band).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from fx_assets.core.atomic import atomic_path
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.folds import FoldRange
from fx_assets.core.fxcache import FxCache, _decode, open_fxcache
from fx_assets.core.signal_report import RowUnitData
from fx_assets.core.trainers.gbt import GbtConfig, train_gbt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
ZeroHandling = Literal["exclude", "three_class"]

#: regime name -> column, per row unit (module docstring)
REGIME_COLUMNS: dict[str, dict[str, str]] = {
    "snapshot": {
        "spread": "book_spread_ticks",
        "realised_vol": "bar_rv_20",
        "event_rate": "log_event_rate_hz",
    },
    "bar": {"spread": "spread_ticks", "realised_vol": "rv_20", "event_rate": "event_rate"},
}
#: the single-feature baseline's column, per row unit
IMBALANCE_COLUMN = {"snapshot": "book_l1_imbalance", "bar": "l1_imbalance"}
PRICE_COLUMN = {"snapshot": "mid", "bar": "close"}
_DECODE_CHUNK = 1 << 17  # rows decoded at a time
#: validation rows decoded and scored at a time (a snapshot row is ~100 values: ~50 MB as f64)
PREDICT_CHUNK_ROWS = 1 << 16


def _horizons(v: list[int]) -> list[int]:
    if not v or any(h < 1 for h in v) or len(set(v)) != len(v):
        raise ValueError(f"horizons must be distinct positive row counts, got {v}")
    return sorted(v)


class SignalLabelConfig(ConfigModel):
    """Label horizons of the signal report, per row unit (module docstring)."""

    snapshot_horizons: list[int] = Field(
        default_factory=lambda: [10, 20, 50, 100, 500],
        description="Snapshot-row horizons: updates (rows) ahead; distinct, >= 1.",
    )
    bar_horizons: list[int] = Field(
        default_factory=lambda: [1, 2, 5, 10, 30],
        description="Bar-row horizons: bars ahead of the entry bar; distinct, >= 1.",
    )
    bar_entry_lag: int = Field(default=1, ge=0, le=1, description="Bar labels' entry lag d (bars): 0 or 1.")

    @field_validator("snapshot_horizons", "bar_horizons")
    @classmethod
    def _distinct_positive(cls, v: list[int]) -> list[int]:
        return _horizons(v)

    def horizons(self, row_unit: str) -> list[int]:
        return list(self.snapshot_horizons if row_unit == "snapshot" else self.bar_horizons)

    def reach(self, row_unit: str) -> int:
        """Rows a label reads ahead of its row (the longest)."""
        hs = self.horizons(row_unit)
        return max(hs) + (self.bar_entry_lag if row_unit == "bar" else 1)


@dataclass
class FoldSignal:
    """One fold's report inputs for one row unit."""

    row_unit: str
    name: str  # the fold (validation quarter label)
    val_ts: I64
    labels: dict[int, F64]  # validation rows: +1 / -1 / 0 (a snapshot zero move) / NaN undefined
    n_zero: dict[int, int]  # zero moves among the defined validation changes
    n_defined: dict[int, int]
    clock_ns: dict[int, float]
    regimes_valid: dict[str, F64]
    regimes_train: dict[str, F64]
    predictions: dict[str, dict[int, F64]]  # model -> horizon -> P(up)
    info: dict[str, Any] = field(default_factory=dict)  # figures for metadata (JSON-able)
    # model -> [n_val, 3] P(up), P(stationary), P(down) for every horizon (three-class models only)
    probabilities: dict[str, F64] = field(default_factory=dict)

    def unit_data(self) -> RowUnitData:
        return RowUnitData(
            labels=self.labels,
            zero_share={
                h: self.n_zero[h] / self.n_defined[h] if self.n_defined[h] else math.nan for h in self.labels
            },
            regimes_valid=self.regimes_valid,
            regimes_train=self.regimes_train,
            clock_ns=self.clock_ns,
        )

    def with_model(self, name: str, proba: F64, classes: F64 | None = None) -> FoldSignal:
        """This fold with one more model, scoring every horizon with ``proba`` (per validation
        row); ``classes``: its ``[n, 3]`` class probabilities (a three-class model), if any."""
        if proba.shape != self.val_ts.shape:
            raise FxDataError(f"{name}: {proba.shape} predictions for {self.val_ts.size} validation rows")
        probs = {m: p for m, p in self.probabilities.items() if m != name}
        if classes is not None:
            if classes.shape != (self.val_ts.size, 3):
                raise FxDataError(
                    f"{name}: class probabilities of shape {classes.shape} for {self.val_ts.size} validation rows"
                )
            probs[name] = classes
        return replace(
            self, predictions={**self.predictions, name: {h: proba for h in self.labels}}, probabilities=probs
        )

    def without_models(self, keep: Sequence[str]) -> FoldSignal:
        """This fold with only the models in ``keep``."""
        return replace(
            self,
            predictions={m: p for m, p in self.predictions.items() if m in keep},
            probabilities={m: p for m, p in self.probabilities.items() if m in keep},
        )

    def report_predictions(self) -> dict[tuple[str, str], dict[int, F64]]:
        return {(self.row_unit, m): p for m, p in self.predictions.items()}

    def report_probabilities(self) -> dict[tuple[str, str], F64]:
        return {(self.row_unit, m): p for m, p in self.probabilities.items()}

    def save(self, path: Path) -> Path:
        """One ``.npz`` (atomic)."""
        import json

        arrays: dict[str, Any] = {"val_ts": self.val_ts}
        for h, y in self.labels.items():
            arrays[f"label_{h}"] = y
        for k, v in self.regimes_valid.items():
            arrays[f"regv_{k}"] = v
        for k, v in self.regimes_train.items():
            arrays[f"regt_{k}"] = v
        for m, ph in self.predictions.items():
            for h, p in ph.items():
                arrays[f"pred_{m}__{h}"] = p
        for m, pr in self.probabilities.items():
            arrays[f"proba_{m}"] = pr
        head = {
            "row_unit": self.row_unit,
            "name": self.name,
            "n_zero": {str(h): v for h, v in self.n_zero.items()},
            "n_defined": {str(h): v for h, v in self.n_defined.items()},
            "clock_ns": {str(h): v for h, v in self.clock_ns.items()},
            "info": self.info,
        }
        arrays["head"] = np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        return path

    @classmethod
    def load(cls, path: Path) -> FoldSignal:
        import json

        with np.load(path) as z:
            head = json.loads(bytes(z["head"]).decode())
            labels: dict[int, F64] = {}
            rv: dict[str, F64] = {}
            rt: dict[str, F64] = {}
            pred: dict[str, dict[int, F64]] = {}
            proba: dict[str, F64] = {}
            for k in z.files:
                if k.startswith("label_"):
                    labels[int(k[6:])] = z[k]
                elif k.startswith("regv_"):
                    rv[k[5:]] = z[k]
                elif k.startswith("regt_"):
                    rt[k[5:]] = z[k]
                elif k.startswith("pred_"):
                    m, h = k[5:].rsplit("__", 1)
                    pred.setdefault(m, {})[int(h)] = z[k]
                elif k.startswith("proba_"):
                    proba[k[6:]] = z[k]
            val_ts = z["val_ts"]
        return cls(
            row_unit=head["row_unit"],
            name=head["name"],
            val_ts=val_ts,
            labels=dict(sorted(labels.items())),
            n_zero={int(h): v for h, v in head["n_zero"].items()},
            n_defined={int(h): v for h, v in head["n_defined"].items()},
            clock_ns={int(h): v for h, v in head["clock_ns"].items()},
            regimes_valid=rv,
            regimes_train=rt,
            predictions={m: dict(sorted(p.items())) for m, p in sorted(pred.items())},
            info=head["info"],
            probabilities=dict(sorted(proba.items())),
        )


def trained_predictions(path: Path | str, val_ts: npt.ArrayLike, trainer: str) -> F64:
    """P(up) per validation row of a trained model, from its ``val_predictions.npz`` (``ts``,
    ``score``; a three-class MLP's score is ``(1 + P(up) - P(down)) / 2``, read as it is), checked to be row for row the report's validation rows ``val_ts`` (module
    docstring)."""
    with np.load(Path(path)) as z:
        if "score" not in z.files:
            raise FxDataError(f"{path}: no validation scores (the trainer stored none)")
        ts, score = np.asarray(z["ts"], dtype=np.int64), np.asarray(z["score"], dtype=np.float64)
    want = np.asarray(val_ts, dtype=np.int64)
    if ts.shape != want.shape or score.shape != want.shape or not np.array_equal(ts, want):
        raise FxDataError(
            f"{path}: the model's {score.size} validation rows are not the report's {want.size} "
            "(other fold ranges or fxcache files?)"
        )
    if not np.isfinite(score).all():
        raise FxDataError(f"{path}: non-finite score at row {int(np.flatnonzero(~np.isfinite(score))[0])}")
    if trainer == "dqn":
        return 0.5 * (1.0 + np.tanh(0.5 * score))  # the logistic function, without overflow
    if trainer == "mlp":
        return score
    raise FxDataError(f"{path}: unknown trainer {trainer!r}")


def trained_probabilities(path: Path | str, val_ts: npt.ArrayLike) -> F64 | None:
    """The ``[n, 3]`` class probabilities P(up), P(stationary), P(down) of a three-class model per
    validation row, from its ``val_predictions.npz`` (``proba``; None when the file has none: a
    binary model), checked to be row for row the report's validation rows ``val_ts`` and to be
    probabilities (finite, in [0, 1], each row summing to 1)."""
    from fx_assets.core.signal_report import PROBA_SUM_TOL

    with np.load(Path(path)) as z:
        if "proba" not in z.files:
            return None
        ts, proba = np.asarray(z["ts"], dtype=np.int64), np.asarray(z["proba"], dtype=np.float64)
    want = np.asarray(val_ts, dtype=np.int64)
    if proba.shape != (want.size, 3) or ts.shape != want.shape or not np.array_equal(ts, want):
        raise FxDataError(
            f"{path}: the model's class probabilities {proba.shape} are not the report's {want.size} "
            "validation rows x (up, stationary, down)"
        )
    bad = ~np.isfinite(proba).all(axis=1) | (proba < 0).any(axis=1) | (proba > 1).any(axis=1)
    bad |= np.abs(proba.sum(axis=1) - 1.0) > PROBA_SUM_TOL
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise FxDataError(f"{path}: row {j}'s class probabilities {proba[j].tolist()} do not sum to 1")
    return proba


def stitch_signals(folds: Sequence[FoldSignal]) -> FoldSignal:
    """Folds of one row unit, validation rows concatenated in time order; regime edges then come
    from the training rows of every fold together; a horizon's clock is the median of the folds'."""
    if not folds:
        raise FxDataError("stitch_signals: no folds")
    fs = sorted(folds, key=lambda f: int(f.val_ts[0]) if f.val_ts.size else 0)
    units = {f.row_unit for f in fs}
    if len(units) != 1:
        raise FxDataError(f"stitch_signals: folds of several row units {sorted(units)}")
    hs = list(fs[0].labels)
    models = list(fs[0].predictions)
    three = sorted(fs[0].probabilities)
    for f in fs:
        if list(f.labels) != hs or list(f.predictions) != models:
            raise FxDataError(f"stitch_signals: fold {f.name} has other horizons or models than {fs[0].name}")
        if sorted(f.probabilities) != three:  # a model is three-class in every fold or in none
            raise FxDataError(
                f"stitch_signals: fold {f.name} has class probabilities of {sorted(f.probabilities)}, "
                f"fold {fs[0].name} of {three}"
            )

    def cat(get: Any) -> F64:
        return np.concatenate([get(f) for f in fs])

    return FoldSignal(
        row_unit=fs[0].row_unit,
        name=", ".join(f.name for f in fs),
        val_ts=np.concatenate([f.val_ts for f in fs]),
        labels={h: cat(lambda f, h=h: f.labels[h]) for h in hs},
        n_zero={h: sum(f.n_zero[h] for f in fs) for h in hs},
        n_defined={h: sum(f.n_defined[h] for f in fs) for h in hs},
        clock_ns={h: float(np.nanmedian([f.clock_ns[h] for f in fs])) for h in hs},
        regimes_valid={k: cat(lambda f, k=k: f.regimes_valid[k]) for k in fs[0].regimes_valid},
        regimes_train={k: cat(lambda f, k=k: f.regimes_train[k]) for k in fs[0].regimes_train},
        predictions={m: {h: cat(lambda f, m=m, h=h: f.predictions[m][h]) for h in hs} for m in models},
        info={"folds": [f.name for f in fs]},
        probabilities={m: np.concatenate([f.probabilities[m] for f in fs]) for m in three},
    )


# --- reading a fold ------------------------------------------------------------------------------


class _Rows:
    """The fold's quarters as one row space (files opened and checksum-verified once)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.caches: list[FxCache] = [open_fxcache(p, verify_finite=False) for p in paths]
        self.starts = np.cumsum([0] + [c.n_bars for c in self.caches])
        c0 = self.caches[0]
        self.row_unit = str(c0.meta.get("row_unit", "bar"))
        self.value_names = c0.value_column_names
        for c in self.caches[1:]:
            if (
                str(c.meta.get("row_unit", "bar")) != self.row_unit
                or c.value_column_names != self.value_names
            ):
                raise FxDataError(f"{c.path}: row unit or columns differ from {c0.path}")
        self.all_names = c0.column_names

    def close(self) -> None:
        for c in self.caches:
            c.close()

    def ts(self, lo: int, hi: int) -> I64:
        return np.concatenate([np.asarray(c.ts) for c in self.caches])[lo:hi]

    def take(self, rows: I64, names: Sequence[str]) -> F64:
        """float64 [len(rows), len(names)] of any columns at sorted global ``rows``."""
        missing = [n for n in names if n not in self.all_names]
        if missing:
            raise FxDataError(f"{self.caches[0].path}: no column(s) {missing}; columns are {self.all_names}")
        out = np.empty((rows.size, len(names)), dtype=np.float64)
        for qi, c in enumerate(self.caches):
            # only the asked columns are decoded, each from its block (stored type -> float64,
            # elementwise, so the values are those of FxCache.decoded); memory: the output
            where = {col.name: col for col in c.columns}
            j_px = [j for j, n in enumerate(names) if where[n].block == "price"]
            j_val = [j for j, n in enumerate(names) if where[n].block != "price"]
            i_px = [where[names[j]].index for j in j_px]
            i_val = [where[names[j]].index for j in j_val]
            a, b = np.searchsorted(rows, [self.starts[qi], self.starts[qi + 1]])
            for lo in range(a, b, _DECODE_CHUNK):
                hi = min(b, lo + _DECODE_CHUNK)
                local = rows[lo:hi] - self.starts[qi]
                r0, r1 = int(local[0]), int(local[-1]) + 1
                sel = local - r0
                if j_px:
                    out[lo:hi, j_px] = np.asarray(c.prices[r0:r1][np.ix_(sel, i_px)], dtype=np.float64)
                if j_val:
                    out[lo:hi, j_val] = _decode(c.values[r0:r1][np.ix_(sel, i_val)], c.dtype)
        return out


def _snapshot_labels(
    mid: F64, session: F64, contract: F64, tick: float, horizons: list[int], zero: ZeroHandling
) -> dict[int, tuple[F64, F64]]:
    """(change, class) per horizon; a zero move's class is NaN (``exclude``) or 0 (``three_class``)."""
    import torch

    from fx_assets.core import snapshot_labels as sl

    labs = sl.snapshot_labels(
        torch.from_numpy(np.ascontiguousarray(mid)),
        tick,
        mid.size,
        sl.SnapshotLabelConfig(horizons=horizons, zero=zero),
        sl.running_breaks(session, contract),
    )
    return {lab.horizon: (lab.change.numpy(), lab.classes.numpy()) for lab in labs}


def _bar_labels(close: F64, contract: F64, horizons: list[int], lag: int) -> dict[int, tuple[F64, F64]]:
    from fx_assets.core.labels import forward_log_return, sign_label
    from fx_assets.core.snapshot_labels import running_breaks

    br = running_breaks(contract)
    out = {}
    n = close.size
    for h in horizons:
        ch = forward_log_return(close, h, entry_lag=lag)
        m = n - lag - h
        if m > 0:  # the trainers' roll mask: no label across a contract change
            ch[:m] = np.where(br[lag + h :] == br[:m], ch[:m], np.nan)
        cls = sign_label(ch)
        out[h] = (ch, np.where(cls == 0.0, np.nan, cls))
    return out


def _training_rows(fr: FoldRange, cfg: GbtConfig) -> I64:
    """The training rows decoded for the GBT: every ``stride``-th, then, when more than the fit
    can use (``sample_rows`` plus the stopping block), a seeded sorted subset of that many."""
    idx = np.arange(fr.train_start, fr.train_end, cfg.stride, dtype=np.int64)
    cap = (
        math.ceil(cfg.sample_rows / (1.0 - cfg.early_stop_share))
        if cfg.early_stopping_rounds
        else cfg.sample_rows
    )
    if idx.size > cap:
        rng = np.random.default_rng(cfg.seed)
        idx = np.sort(rng.choice(idx, size=cap, replace=False))
    return idx


def fold_signal(
    paths: Sequence[Path | str],
    fr: FoldRange,
    labels_cfg: SignalLabelConfig,
    gbt_cfg: GbtConfig,
    *,
    tick: float,
    chunk_rows: int = PREDICT_CHUNK_ROWS,
) -> FoldSignal:
    """Labels, regimes and predictions of one fold (module docstring); ``paths``: the fold's
    fxcache files in quarter order (their row unit is read from the files); ``tick``: the price
    tick (snapshot mids are checked on its half-tick grid); ``chunk_rows``: validation rows
    decoded and scored at a time (no number depends on it)."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    rows = _Rows([Path(p) for p in paths])
    try:
        return _fold_signal(rows, fr, labels_cfg, gbt_cfg, tick, chunk_rows)
    finally:
        rows.close()


def _fold_signal(
    rows: _Rows,
    fr: FoldRange,
    labels_cfg: SignalLabelConfig,
    gbt_cfg: GbtConfig,
    tick: float,
    chunk_rows: int,
) -> FoldSignal:
    from fx_assets.core.snapshot_labels import horizon_clock_ns, running_breaks

    unit = rows.row_unit
    if unit not in REGIME_COLUMNS:
        raise FxDataError(f"{rows.caches[0].path}: unknown row unit {unit!r}")
    if fr.val_end > rows.starts[-1]:
        raise FxDataError(
            f"fold {fr.name}: validation ends at row {fr.val_end}, the files hold {rows.starts[-1]}"
        )
    hs = labels_cfg.horizons(unit)
    price_cols = [PRICE_COLUMN[unit], "contract"] + (["session"] if unit == "snapshot" else [])
    reg_names = list(REGIME_COLUMNS[unit])
    reg_cols = [REGIME_COLUMNS[unit][k] for k in reg_names]

    def slice_labels(lo: int, hi: int, zero: ZeroHandling) -> tuple[dict[int, tuple[F64, F64]], F64]:
        px = rows.take(np.arange(lo, hi), price_cols)
        if unit == "snapshot":
            return _snapshot_labels(px[:, 0], px[:, 2], px[:, 1], tick, hs, zero), px
        return _bar_labels(px[:, 0], px[:, 1], hs, labels_cfg.bar_entry_lag), px

    if fr.n_train <= 0 or fr.n_val <= 0:
        raise FxDataError(f"fold {fr.name}: empty training or validation slice")
    # the GBT fits up against down (zero moves out); the validation labels keep them as class 0
    train_labels, _ = slice_labels(fr.train_start, fr.train_end, "exclude")
    val_labels, val_px = slice_labels(fr.val_start, fr.val_end, "three_class")
    tr_idx = _training_rows(fr, gbt_cfg)
    feats = rows.value_names
    x_tr = rows.take(tr_idx, feats)
    fi = {n: j for j, n in enumerate(feats)}
    for c in [*reg_cols, IMBALANCE_COLUMN[unit]]:
        if c not in fi:
            raise FxDataError(f"{rows.caches[0].path}: no column {c!r} for the signal report ({unit} rows)")
    # the fit runs on the decoded rows: the early-stopping purge counted in them, covering
    # max(purge_rows, label reach) rows of the file before the stopping block
    purge = max(gbt_cfg.purge_rows, labels_cfg.reach(unit))
    s0 = int(tr_idx.size * (1.0 - gbt_cfg.early_stop_share))
    drop = s0 - int(np.searchsorted(tr_idx, tr_idx[min(s0, tr_idx.size - 1)] - purge, side="left"))
    fit_cfg = gbt_cfg.model_copy(update={"stride": 1, "purge_rows": drop + 1})
    fits = {}
    info: dict[str, Any] = {"row_unit": unit, "n_train_rows": fr.n_train, "n_val_rows": fr.n_val, "gbt": {}}
    for h in hs:
        y_tr = train_labels[h][1][tr_idx - fr.train_start]
        try:
            fits[h] = res = train_gbt(x_tr, y_tr, None, fit_cfg, feature_names=feats)
        except FxDataError as exc:
            raise FxDataError(f"fold {fr.name}, {unit} rows, horizon {h}: {exc}") from exc
        top = sorted(res.importance_gain.items(), key=lambda kv: -kv[1])[:5]
        info["gbt"][str(h)] = {
            "best_iteration": res.best_iteration,
            "n_fit": res.n_fit,
            "top_gain": [k for k, _ in top],
        }
    # Validation rows are decoded and scored chunk by chunk: memory is chunk x width x 8 bytes
    # plus the per-row outputs, whatever the quarter's size.
    n_val = fr.n_val
    gbt = {h: np.empty(n_val, dtype=np.float64) for h in hs}
    imb = np.empty(n_val, dtype=np.float64)
    reg_valid = {k: np.empty(n_val, dtype=np.float64) for k in reg_names}
    for lo in range(0, n_val, chunk_rows):
        hi = min(n_val, lo + chunk_rows)
        x = rows.take(np.arange(fr.val_start + lo, fr.val_start + hi), feats)
        for h in hs:
            gbt[h][lo:hi] = fits[h].predict(x)
        imb[lo:hi] = x[:, fi[IMBALANCE_COLUMN[unit]]]
        for k, c in zip(reg_names, reg_cols, strict=True):
            reg_valid[k][lo:hi] = x[:, fi[c]]
        del x
    base = np.clip((1.0 + np.nan_to_num(imb, nan=0.0)) / 2.0, 0.0, 1.0)
    if unit == "snapshot":
        breaks = running_breaks(val_px[:, 2], val_px[:, 1])
    else:
        breaks = running_breaks(val_px[:, 1])
    val_ts = rows.ts(fr.val_start, fr.val_end)
    n_zero, n_def = {}, {}
    for h in hs:
        ch = val_labels[h][0]
        d = np.isfinite(ch)
        n_def[h] = int(d.sum())
        n_zero[h] = int((ch[d] == 0).sum())
    return FoldSignal(
        row_unit=unit,
        name=fr.name,
        val_ts=np.asarray(val_ts, dtype=np.int64),
        labels={h: val_labels[h][1] for h in hs},
        n_zero=n_zero,
        n_defined=n_def,
        clock_ns=horizon_clock_ns(val_ts, breaks, hs),
        regimes_valid=reg_valid,
        regimes_train={k: x_tr[:, fi[c]].copy() for k, c in zip(reg_names, reg_cols, strict=True)},
        predictions={"gbt": gbt, "l1_imbalance": {h: base for h in hs}},
        info=info,
    )


def report_inputs(
    signals: Mapping[str, FoldSignal],
) -> tuple[dict[tuple[str, str], dict[int, F64]], dict[str, RowUnitData], dict[tuple[str, str], F64]]:
    """``signal_report``'s inputs from one :class:`FoldSignal` per row unit: predictions, units
    and class probabilities (``signal_report(preds, units, cfg, probabilities=proba)``)."""
    preds: dict[tuple[str, str], dict[int, F64]] = {}
    units: dict[str, RowUnitData] = {}
    proba: dict[tuple[str, str], F64] = {}
    for u, s in signals.items():
        preds.update(s.report_predictions())
        proba.update(s.report_probabilities())
        units[u] = s.unit_data()
    return preds, units, proba
