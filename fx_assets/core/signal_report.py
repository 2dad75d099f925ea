"""The research report of where the signal lives: out-of-sample AUC and accuracy of several models
and row units, by label horizon and by regime quintile, with moving-block-bootstrap error bars.

Owns :func:`signal_report` (the one entry point; the ``signal_report`` asset calls it per fold and
on stitched folds), its inputs (:class:`RowUnitData`, predictions keyed ``(row_unit, model)``), its
config (:class:`SignalReportConfig`) and its outputs (:class:`SignalReport`: a table of
:class:`Cell` rows, ``markdown()`` tables, ``decay_png()`` the horizon-decay curve, ``write()``
all three atomically). Pure computation, no Dagster.

Definitions (per row unit, over its validation rows in time order):

- **labels** per horizon h: +1 up / -1 down; 0 or NaN rows (zero moves excluded by
  ``snapshot_labels(zero="exclude")``, undefined at the slice end) are left out of every metric;
  the share of zero moves is reported beside the horizon (``zero_share``, from the caller).
- **AUC** of the predicted P(up) for ``label == +1``; **accuracy** of ``P(up) > 0.5`` for the sign.
- **Regime quintiles**: for each regime variable (e.g. spread, realised volatility, event rate)
  the quintile edges are the 20/40/60/80% quantiles of its values on the **training rows only**
  (``RowUnitData.regimes_train``); validation rows fall into quintile ``q`` when
  ``edge[q-1] <= v < edge[q]`` (non-finite values: no quintile; ties in the training values,
  e.g. a one-tick spread on most rows, give equal edges and so empty bins, reported with n 0).
- **Error bars**: a moving-block bootstrap of the validation rows (Künsch 1989): ``ceil(n/L)``
  blocks of ``L`` consecutive rows with starts drawn uniformly from ``[0, n-L]``, concatenated
  and cut to ``n`` rows; the interval is the percentile interval of ``n_boot`` replicates. The
  block length is ``L = max(block_min, ceil(block_factor * h_max))`` with ``h_max`` the longest
  horizon: overlapping h-row labels are dependent over h rows (snapshot.md §4.2), so ``L`` must be
  at least the longest horizon (``block_factor >= 1``, validated); an iid bootstrap (L = 1) covers
  far too rarely (tested). One set of replicate weights per row unit serves every model, horizon
  and regime, so side-by-side intervals are paired.
- **Empirical null band**: :func:`fx_assets.core.metrics.auc_block_null` (labels permuted in blocks
  of ``L`` rows, ``n_perm`` times): ``0.5 +- null_band_z * null_sd``; ``in_null_band`` says
  whether the AUC lies inside it.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit
from pydantic import Field

from fx_assets.core import metrics as M
from fx_assets.core.atomic import atomic_path, atomic_write_text
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError

F64 = npt.NDArray[np.float64]
Predictions = npt.ArrayLike | Mapping[int, npt.ArrayLike]  # one score for all horizons, or per horizon


class SignalReportConfig(ConfigModel):
    """Signal report settings (see the module docstring)."""

    n_boot: int = Field(default=200, ge=10, description="Moving-block bootstrap replicates.")
    block_factor: float = Field(
        default=2.0,
        ge=1.0,
        description="Block length L = max(block_min, ceil(block_factor x longest horizon)) rows.",
    )
    block_min: int = Field(default=1, ge=1, description="Shortest block length (rows).")
    level: float = Field(default=0.95, gt=0.0, lt=1.0, description="Coverage of the percentile intervals.")
    n_quantiles: int = Field(
        default=5, ge=2, description="Regime bins (5: quintiles), edges from training rows."
    )
    n_perm: int = Field(default=200, ge=10, description="Block permutations of the empirical null.")
    null_band_z: float = Field(default=3.0, gt=0.0, description="Null band half-width in null sds.")
    seed: int = Field(default=0, ge=0, description="Bootstrap and permutation seed.")


@dataclass
class RowUnitData:
    """One row unit's validation labels and regimes (rows in time order).

    ``labels[h]``: +1 / -1 (0 or NaN: left out) per validation row at horizon h (rows of this
    unit ahead). ``zero_share[h]``: share of zero moves excluded (reported only).
    ``regimes_valid[name]`` / ``regimes_train[name]``: a regime variable on the validation rows /
    on the training rows (the quintile edges come from the latter only). ``clock_ns[h]``: the
    horizon's clock-time equivalent (``snapshot_labels.horizon_clock_ns``), optional.
    """

    labels: Mapping[int, npt.ArrayLike]
    zero_share: Mapping[int, float] = field(default_factory=dict)
    regimes_valid: Mapping[str, npt.ArrayLike] = field(default_factory=dict)
    regimes_train: Mapping[str, npt.ArrayLike] = field(default_factory=dict)
    clock_ns: Mapping[int, float] = field(default_factory=dict)


@dataclass
class Cell:
    """One (row unit, model, horizon, regime bin) entry; ``regime`` "all" for the whole set."""

    row_unit: str
    model: str
    horizon: int
    regime: str
    bin: int  # 0 for "all"; quintile 1..n_quantiles otherwise
    lo_edge: float  # regime bin range [lo_edge, hi_edge) (-inf / inf at the ends; nan for "all")
    hi_edge: float
    n: int  # rows with a label (up or down)
    auc: float
    auc_lo: float
    auc_hi: float
    acc: float
    acc_lo: float
    acc_hi: float
    zero_share: float
    clock_ns: float
    null_sd: float = math.nan  # "all" only
    null_p: float = math.nan
    in_null_band: bool | None = None


@dataclass
class SignalReport:
    cells: list[Cell]
    horizons: list[int]
    block: int  # bootstrap / permutation block length (rows)
    config: dict[str, Any]
    regime_edges: dict[str, dict[str, list[float]]]  # row unit -> regime -> training-row edges

    def cell(self, row_unit: str, model: str, horizon: int, regime: str = "all", bin: int = 0) -> Cell:
        for c in self.cells:
            if (c.row_unit, c.model, c.horizon, c.regime, c.bin) == (row_unit, model, horizon, regime, bin):
                return c
        raise KeyError((row_unit, model, horizon, regime, bin))

    def curves(self) -> dict[tuple[str, str], list[Cell]]:
        """The horizon-decay curve of every (row unit, model): its "all" cells by horizon."""
        out: dict[tuple[str, str], list[Cell]] = {}
        for c in self.cells:
            if c.regime == "all":
                out.setdefault((c.row_unit, c.model), []).append(c)
        return {k: sorted(v, key=lambda c: c.horizon) for k, v in out.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "horizons": self.horizons,
            "block": self.block,
            "config": self.config,
            "regime_edges": self.regime_edges,
            "cells": [asdict(c) for c in self.cells],
        }

    def markdown(self) -> str:
        """Tables: AUC / accuracy by horizon (models and row units side by side), then AUC by
        regime bin at every horizon."""
        keys = list(self.curves())
        head = " | ".join(f"{u} · {m}" for u, m in keys)
        lvl = round(self.config["level"] * 100)
        lines = [
            "# Signal report",
            "",
            f"Out-of-sample AUC [{lvl}% moving-block-bootstrap interval, block {self.block} rows], "
            "accuracy, labelled rows n, zero-move share; `*` marks an AUC outside the empirical-null "
            f"band (0.5 ± {self.config['null_band_z']} null sd, block-permuted labels).",
            "",
            "## By horizon",
            "",
            f"| h (rows) | clock | {head} |",
            "|---|---|" + "---|" * len(keys),
        ]
        for h in self.horizons:
            row = []
            clock = "–"
            for u, m in keys:
                c = self.cell(u, m, h)
                if math.isfinite(c.clock_ns):
                    clock = _fmt_ns(c.clock_ns)
                star = "*" if c.in_null_band is False else ""
                row.append(
                    f"{c.auc:.4f}{star} [{c.auc_lo:.4f}, {c.auc_hi:.4f}]; acc {c.acc:.4f}; "
                    f"n {c.n}; zero {c.zero_share:.3f}"
                )
            lines.append(f"| {h} | {clock} | " + " | ".join(row) + " |")
        regimes = sorted({c.regime for c in self.cells if c.regime != "all"})
        for rg in regimes:
            lines += ["", f"## By {rg} bin (edges from training rows)", ""]
            for h in self.horizons:
                lines += [f"h = {h}", "", f"| bin | range | {head} |", "|---|---|" + "---|" * len(keys)]
                bins = sorted({c.bin for c in self.cells if c.regime == rg})
                for b in bins:
                    row, rng_txt = [], ""
                    for u, m in keys:
                        try:
                            c = self.cell(u, m, h, rg, b)
                        except KeyError:
                            row.append("–")
                            continue
                        rng_txt = f"[{c.lo_edge:.4g}, {c.hi_edge:.4g})"
                        row.append(f"{c.auc:.4f} [{c.auc_lo:.4f}, {c.auc_hi:.4f}]; acc {c.acc:.4f}; n {c.n}")
                    lines.append(f"| {b} | {rng_txt} | " + " | ".join(row) + " |")
                lines.append("")
        return "\n".join(lines) + "\n"

    def decay_png(self, title: str = "AUC by horizon") -> bytes:
        """PNG of the horizon-decay curves (AUC with bootstrap bars; grey: the null band)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
        curves = self.curves()
        for i, ((u, m), cs) in enumerate(curves.items()):
            h = np.array([c.horizon for c in cs], dtype=np.float64) * (1.0 + 0.03 * i)  # dodge bars
            a = np.array([c.auc for c in cs])
            err = np.array([[c.auc - c.auc_lo for c in cs], [c.auc_hi - c.auc for c in cs]])
            ax.errorbar(
                h, a, yerr=np.maximum(err, 0.0), marker="o", ms=3, lw=1.0, capsize=2, label=f"{u} · {m}"
            )
            band = np.array([self.config["null_band_z"] * c.null_sd for c in cs])
            if np.isfinite(band).any():
                ax.fill_between(h, 0.5 - band, 0.5 + band, color="#999", alpha=0.15, lw=0)
        ax.axhline(0.5, color="#444", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("horizon (rows ahead)")
        ax.set_ylabel("out-of-sample AUC")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        return buf.getvalue()

    def write(self, out_dir: Path, stem: str = "signal_report") -> dict[str, Path]:
        """Write ``stem.md``, ``stem.png`` and ``stem.json`` under ``out_dir`` (each atomically)."""
        out_dir = Path(out_dir)
        paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("md", "png", "json")}
        atomic_write_text(paths["md"], self.markdown())
        atomic_write_text(paths["json"], json.dumps(self.to_dict(), indent=2, sort_keys=True, default=_json))
        with atomic_path(paths["png"]) as tmp:
            Path(tmp).write_bytes(self.decay_png())
        return paths


def _json(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


def _fmt_ns(ns: float) -> str:
    for unit, div in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= div:
            return f"{ns / div:.3g} {unit}"
    return f"{ns:.3g} ns"


# --- statistics ----------------------------------------------------------------------------------


def block_starts(n: int, block: int, n_boot: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """[n_boot, ceil(n/L)] block starts of a moving-block bootstrap of n rows (L = min(block, n))."""
    L = min(block, n)
    return rng.integers(0, n - L + 1, size=(n_boot, -(-n // L)))


def replicate_counts(starts: npt.NDArray[np.int64], n: int, block: int) -> npt.NDArray[np.int64]:
    """How often each of the n rows appears in the replicate with these block ``starts``."""
    L = min(block, n)
    idx = (starts[:, None] + np.arange(L)[None, :]).ravel()[:n]
    return np.bincount(idx, minlength=n)


@dataclass
class _Prepared:
    """A cell's rows sorted by score, with tie groups: AUC / accuracy of any row weights in O(n)."""

    rows: npt.NDArray[np.int64]  # validation rows of the cell, in score order
    grp: npt.NDArray[np.int64]  # tie group of each
    n_grp: int
    pos: npt.NDArray[np.float64]  # 1.0 where the label is up
    correct: npt.NDArray[np.float64]  # 1.0 where (P(up) > 0.5) == up

    @classmethod
    def of(cls, score: F64, up: npt.NDArray[np.bool_], rows: npt.NDArray[np.int64]) -> _Prepared:
        order = np.argsort(score, kind="stable")
        s = score[order]
        grp = np.concatenate(([0], np.cumsum(s[1:] != s[:-1]))).astype(np.int64) if s.size else order
        u = up[order]
        return cls(
            rows=rows[order],
            grp=grp,
            n_grp=int(grp[-1]) + 1 if s.size else 0,
            pos=u.astype(np.float64),
            correct=((s > 0.5) == u).astype(np.float64),
        )

    def auc_acc(self, counts: npt.NDArray[np.int64]) -> tuple[float, float]:
        """Weighted AUC (ties: half credit) and accuracy with row weights ``counts[rows]``."""
        a, acc = _auc_acc_nb(self.rows, self.grp, self.pos, self.correct, counts)
        return float(a), float(acc)


@njit(cache=True)
def _auc_acc_nb(
    rows: np.ndarray, grp: np.ndarray, pos: np.ndarray, correct: np.ndarray, counts: np.ndarray
) -> tuple[float, float]:
    """One pass over rows sorted by score: sum over tie groups of w_up (w_down below + w_down/2)."""
    m = rows.shape[0]
    below = 0.0
    num = 0.0
    n1 = 0.0
    cor = 0.0
    i = 0
    while i < m:
        g = grp[i]
        wp = 0.0
        wn = 0.0
        j = i
        while j < m and grp[j] == g:
            w = float(counts[rows[j]])
            if pos[j] > 0.5:
                wp += w
            else:
                wn += w
            cor += w * correct[j]
            j += 1
        num += wp * (below + 0.5 * wn)
        below += wn
        n1 += wp
        i = j
    n0 = below
    a = num / (n1 * n0) if n1 > 0 and n0 > 0 else np.nan
    acc = cor / (n1 + n0) if n1 + n0 > 0 else np.nan
    return a, acc


def _interval(x: F64, level: float) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(x, [a, 1.0 - a])
    return float(lo), float(hi)


def regime_edges(train_values: npt.ArrayLike, n_bins: int) -> F64:
    """The ``n_bins - 1`` inner quantile edges of a regime variable over the training rows."""
    v = np.asarray(train_values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise FxDataError("regime_edges: no finite training value to take quantiles of")
    return np.asarray(np.quantile(v, np.arange(1, n_bins) / n_bins), dtype=np.float64)


def regime_bins(values: npt.ArrayLike, edges: F64) -> npt.NDArray[np.int64]:
    """Bin 1..len(edges)+1 of each value (``edge[q-2] <= v < edge[q-1]``); 0 for non-finite."""
    v = np.asarray(values, dtype=np.float64)
    b = np.searchsorted(edges, v, side="right").astype(np.int64) + 1
    return np.where(np.isfinite(v), b, 0)


def _scores_for(pred: Predictions, h: int, n: int, where: str) -> F64:
    p = pred[h] if isinstance(pred, Mapping) else pred
    a = np.asarray(p, dtype=np.float64)
    if a.shape != (n,):
        raise FxDataError(
            f"signal_report: predictions of {where} at h={h} have shape {a.shape}, expected ({n},)"
        )
    if not np.isfinite(a).all():
        raise FxDataError(
            f"signal_report: predictions of {where} at h={h}: non-finite value at row {int(np.flatnonzero(~np.isfinite(a))[0])}"
        )
    return a


# --- the entry point -----------------------------------------------------------------------------


def signal_report(
    predictions: Mapping[tuple[str, str], Predictions],
    units: Mapping[str, RowUnitData],
    cfg: SignalReportConfig | None = None,
) -> SignalReport:
    """The report of every ``(row_unit, model)`` in ``predictions``.

    ``predictions[(row_unit, model)]``: P(up) per validation row of that row unit (one array for
    every horizon, or a mapping horizon -> array for per-horizon models). ``units[row_unit]``:
    that unit's labels per horizon, zero-move shares and regime variables (:class:`RowUnitData`).
    Every unit must label the same horizons. Returns a :class:`SignalReport` (cells, markdown,
    decay PNG, ``write``).
    """
    cfg = cfg or SignalReportConfig()
    if not predictions:
        raise FxDataError("signal_report: no predictions")
    horizon_sets = {u: sorted(int(h) for h in d.labels) for u, d in units.items()}
    if not horizon_sets or any(not hs for hs in horizon_sets.values()):
        raise FxDataError("signal_report: every row unit needs labels for at least one horizon")
    horizons = next(iter(horizon_sets.values()))
    if any(hs != horizons for hs in horizon_sets.values()):
        raise FxDataError(f"signal_report: row units label different horizons: {horizon_sets}")
    block = max(cfg.block_min, math.ceil(cfg.block_factor * max(horizons)))
    rng = np.random.default_rng(cfg.seed)
    cells: list[Cell] = []
    edges_out: dict[str, dict[str, list[float]]] = {}
    for unit in sorted({u for u, _ in predictions}):
        if unit not in units:
            raise FxDataError(f"signal_report: predictions for row unit {unit!r} but no labels for it")
        data = units[unit]
        labels = {h: np.asarray(data.labels[h], dtype=np.float64) for h in horizons}
        n = next(iter(labels.values())).shape[0]
        for h, y in labels.items():
            if y.shape != (n,):
                raise FxDataError(
                    f"signal_report: {unit} labels at h={h} have shape {y.shape}, expected ({n},)"
                )
        bins: dict[str, tuple[F64, npt.NDArray[np.int64]]] = {}
        for rg, v in data.regimes_valid.items():
            vv = np.asarray(v, dtype=np.float64)
            if vv.shape != (n,):
                raise FxDataError(
                    f"signal_report: {unit} regime {rg!r} has shape {vv.shape}, expected ({n},)"
                )
            if rg not in data.regimes_train:
                raise FxDataError(f"signal_report: {unit} regime {rg!r} has no training values for its edges")
            e = regime_edges(data.regimes_train[rg], cfg.n_quantiles)
            bins[rg] = (e, regime_bins(vv, e))
        edges_out[unit] = {rg: [float(x) for x in e] for rg, (e, _) in bins.items()}
        starts = block_starts(n, block, cfg.n_boot, rng)
        unit_cells: list[Cell] = []
        preps: list[_Prepared] = []
        for (u, model), pred in sorted(predictions.items()):
            if u != unit:
                continue
            for h in horizons:
                score = _scores_for(pred, h, n, f"({u}, {model})")
                y = labels[h]
                lab = np.isfinite(y) & (y != 0)
                groups: list[tuple[str, int, float, float, npt.NDArray[np.bool_]]] = [
                    ("all", 0, math.nan, math.nan, lab)
                ]
                for rg, (e, b) in bins.items():
                    ext = np.concatenate(([-np.inf], e, [np.inf]))
                    for q in range(1, cfg.n_quantiles + 1):
                        groups.append((rg, q, float(ext[q - 1]), float(ext[q]), lab & (b == q)))
                for rg, q, lo_e, hi_e, m in groups:
                    s, up = score[m], y[m] > 0
                    c = Cell(
                        row_unit=u,
                        model=model,
                        horizon=h,
                        regime=rg,
                        bin=q,
                        lo_edge=lo_e,
                        hi_edge=hi_e,
                        n=int(m.sum()),
                        auc=M.auc(s, up) if s.size else math.nan,
                        auc_lo=math.nan,
                        auc_hi=math.nan,
                        acc=float(((s > 0.5) == up).mean()) if s.size else math.nan,
                        acc_lo=math.nan,
                        acc_hi=math.nan,
                        zero_share=float(data.zero_share.get(h, math.nan)),
                        clock_ns=float(data.clock_ns.get(h, math.nan)),
                    )
                    if rg == "all":
                        nul = M.auc_block_null(score, np.where(lab, y, 0.0), block, cfg.n_perm, cfg.seed)
                        c.null_sd, c.null_p = nul.null_sd, nul.p_value
                        if math.isfinite(nul.null_sd) and math.isfinite(c.auc):
                            c.in_null_band = bool(abs(c.auc - 0.5) <= cfg.null_band_z * nul.null_sd)
                    unit_cells.append(c)
                    preps.append(_Prepared.of(s, up, np.flatnonzero(m)))
        # One replicate's row counts serve every cell of the unit (paired intervals).
        boot = np.empty((2, len(preps), cfg.n_boot))
        for bi in range(cfg.n_boot):
            counts = replicate_counts(starts[bi], n, block)
            for ci, pr in enumerate(preps):
                boot[0, ci, bi], boot[1, ci, bi] = pr.auc_acc(counts)
        for ci, c in enumerate(unit_cells):
            c.auc_lo, c.auc_hi = _interval(boot[0, ci], cfg.level)
            c.acc_lo, c.acc_hi = _interval(boot[1, ci], cfg.level)
        cells += unit_cells
    return SignalReport(
        cells=cells, horizons=list(horizons), block=block, config=cfg.model_dump(), regime_edges=edges_out
    )
