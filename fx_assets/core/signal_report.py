"""The research report of where the signal lives: out-of-sample AUC and accuracy of several models
and row units, by label horizon and by regime quintile, with moving-block-bootstrap error bars.

Owns :func:`signal_report` (the one entry point; the ``signal_report`` asset calls it per fold and
on stitched folds), its inputs (:class:`RowUnitData`, predictions keyed ``(row_unit, model)``), its
config (:class:`SignalReportConfig`) and its outputs (:class:`SignalReport`: a table of
:class:`Cell` rows, ``markdown()`` tables, ``decay_png()`` the horizon-decay curve, ``write()``
all three atomically). Pure computation, no Dagster.

Definitions (per row unit, over its validation rows in time order):

- **labels** per horizon h: +1 up / -1 down / 0 stationary (a zero move) / NaN undefined
  (the window leaves the slice or spans a break; or a zero move the caller excluded). The
  share of zero moves is reported beside the horizon (``zero_share``, from the caller).
- **AUC** (binary, every model) of the predicted score P(up) for ``label == +1`` over the rows
  labelled +1 or -1 (0 and NaN rows left out); **accuracy** of ``P(up) > 0.5`` for the sign,
  over the same rows; ``n`` counts them.
- **Three-class metrics** (only for a ``(row_unit, model)`` given ``probabilities``: P(up),
  P(stationary), P(down) per row, in the order of :data:`CLASSES`; every other model has them
  None, never a number). Over the rows with a defined label (+1, 0 or -1; NaN rows left out),
  ``n3`` of them, true class k(row) = up / stationary / down for label +1 / 0 / -1:

  - ``acc3``: share of rows whose argmax probability is the true class (ties go to the first of
    up, stationary, down);
  - ``auc_stationary``: the one-vs-rest AUC of P(stationary) for ``label == 0`` against
    ``label == +1 or -1`` (ties: half credit; NaN when either side is empty);
  - ``auc_macro``: the mean of the three one-vs-rest AUCs (P(up) for up against the rest,
    P(stationary) for stationary, P(down) for down); NaN when a class is absent from the rows;
  - ``share_up`` / ``share_stationary`` / ``share_down``: the class shares of the true labels
    over those rows (a property of the labels, the same for every model of the unit; on "all"
    ``share_stationary`` is ``zero_share`` when the caller labels zero moves 0).

  The binary columns of such a model stay as above (its score against up / down), so a binary
  and a three-class model sit side by side.
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
  The three-class metrics use the same replicate row weights (weighted AUCs, weighted shares,
  weighted accuracy; a replicate's ``auc_macro`` is the mean of its three AUCs), so they are
  paired with the binary ones too; intervals (``_lo`` / ``_hi``) are given for ``acc3``,
  ``auc_stationary``, ``auc_macro`` and ``share_stationary``.
- **Empirical null band**: :func:`fx_assets.core.metrics.auc_block_null` (labels permuted in blocks
  of ``L`` rows, ``n_perm`` times): ``0.5 +- null_band_z * null_sd``; ``in_null_band`` says
  whether the AUC lies inside it. The stationary AUC gets its own band the same way
  (``stationary_null_sd``, ``stationary_null_p``, ``stationary_in_null_band``): the stationary
  indicator ``label == 0`` (against ``label == +1 or -1``) is block-permuted against P(stationary);
  it costs one more rank-sum pass per permutation and horizon, as the binary band does. The
  stationary class clusters in time (quiet stretches of the book), so ``1/sqrt(n)`` would
  understate its null spread as it does for up / down. ``auc_macro`` has no band (its three
  one-vs-rest AUCs share the rows, so their nulls are not independent); read the stationary
  and the binary bands.
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
#: [n, 3] class probabilities for all horizons, or per horizon
Probabilities = npt.ArrayLike | Mapping[int, npt.ArrayLike]
#: the column order of three-class probabilities and the label of each class
CLASSES = ("up", "stationary", "down")
CLASS_LABELS = (1.0, 0.0, -1.0)
PROBA_SUM_TOL = 1e-4  # |sum of a row's three probabilities - 1| allowed (float32 softmax)
# memory of one group of bootstrap replicates' row counts (int32 [n, G]): G = this / (4 n)
BOOT_GROUP_BYTES = 1 << 28


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
    # three-class metrics (module docstring): None for a model without class probabilities
    n3: int | None = None  # rows with a defined label (up, stationary or down)
    acc3: float | None = None
    acc3_lo: float | None = None
    acc3_hi: float | None = None
    auc_stationary: float | None = None
    auc_stationary_lo: float | None = None
    auc_stationary_hi: float | None = None
    auc_macro: float | None = None
    auc_macro_lo: float | None = None
    auc_macro_hi: float | None = None
    share_up: float | None = None
    share_stationary: float | None = None
    share_stationary_lo: float | None = None
    share_stationary_hi: float | None = None
    share_down: float | None = None
    stationary_null_sd: float | None = None  # "all" only
    stationary_null_p: float | None = None
    stationary_in_null_band: bool | None = None

    @property
    def three_class(self) -> bool:
        """Whether this cell's model gave class probabilities (its three-class fields are set)."""
        return self.n3 is not None


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
        regime bin at every horizon; when a model gave class probabilities, a three-class table
        follows each of these (binary models: "n/a")."""
        keys = list(self.curves())
        head = " | ".join(f"{u} · {m}" for u, m in keys)
        three = any(c.three_class for c in self.cells)
        lvl = round(self.config["level"] * 100)
        lines = [
            "# Signal report",
            "",
            f"Out-of-sample AUC [{lvl}% moving-block-bootstrap interval, block {self.block} rows], "
            "accuracy, labelled rows n, zero-move share; `*` marks an AUC outside the empirical-null "
            f"band (0.5 ± {self.config['null_band_z']} null sd, block-permuted labels).",
        ]
        if three:
            lines += [
                "",
                "Three-class tables (models with P(up), P(stationary), P(down); binary models n/a), "
                "over the rows labelled up, stationary (zero move) or down (n3): acc3 = share whose "
                "most probable class is the true one; stat AUC = P(stationary) for the zero moves "
                "against the moves (`*`: outside its own null band); macro AUC = mean of the three "
                "one-vs-rest AUCs; up / stat / down = class shares of the true labels "
                f"(intervals: the same {lvl}% bootstrap).",
            ]
        lines += [
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
        if three:
            lines += [
                "",
                "## Three-class by horizon",
                "",
                f"| h (rows) | {head} |",
                "|---|" + "---|" * len(keys),
            ]
            for h in self.horizons:
                lines.append(f"| {h} | " + " | ".join(_three_txt(self.cell(u, m, h)) for u, m in keys) + " |")
        regimes = sorted({c.regime for c in self.cells if c.regime != "all"})
        for rg in regimes:
            lines += ["", f"## By {rg} bin (edges from training rows)", ""]
            for h in self.horizons:
                bins = sorted({c.bin for c in self.cells if c.regime == rg})
                tables = [("", False)] + ([(", three-class", True)] if three else [])
                for suffix, tc in tables:
                    lines += [
                        f"h = {h}{suffix}",
                        "",
                        f"| bin | range | {head} |",
                        "|---|---|" + "---|" * len(keys),
                    ]
                    for b in bins:
                        row, rng_txt = [], ""
                        for u, m in keys:
                            try:
                                c = self.cell(u, m, h, rg, b)
                            except KeyError:
                                row.append("–")
                                continue
                            rng_txt = f"[{c.lo_edge:.4g}, {c.hi_edge:.4g})"
                            if tc:
                                row.append(_three_txt(c))
                            else:
                                row.append(
                                    f"{c.auc:.4f} [{c.auc_lo:.4f}, {c.auc_hi:.4f}]; acc {c.acc:.4f}; n {c.n}"
                                )
                        lines.append(f"| {b} | {rng_txt} | " + " | ".join(row) + " |")
                    lines.append("")
        return "\n".join(lines) + "\n"

    def decay_png(self, title: str = "AUC by horizon") -> bytes:
        """PNG of the horizon-decay curves (AUC with bootstrap bars; grey: the null band; dashed:
        a three-class model's stationary AUC)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
        curves = self.curves()
        for i, ((u, m), cs) in enumerate(curves.items()):
            h = np.array([c.horizon for c in cs], dtype=np.float64) * (1.0 + 0.03 * i)  # dodge bars
            a = np.array([c.auc for c in cs])
            err = np.array([[c.auc - c.auc_lo for c in cs], [c.auc_hi - c.auc for c in cs]])
            eb = ax.errorbar(
                h, a, yerr=np.maximum(err, 0.0), marker="o", ms=3, lw=1.0, capsize=2, label=f"{u} · {m}"
            )
            if all(c.three_class for c in cs):  # the stationary AUC beside it, dashed
                st = np.array([c.auc_stationary for c in cs], dtype=np.float64)
                ax.plot(
                    h, st, ls="--", marker="s", ms=3, lw=1.0, color=eb.lines[0].get_color(),
                    label=f"{u} · {m}: stationary AUC",
                )  # fmt: skip
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


def _three_txt(c: Cell) -> str:
    """One three-class table entry (module docstring); "n/a" for a binary model."""
    if not c.three_class:
        return "n/a (binary)"
    star = "*" if c.stationary_in_null_band is False else ""
    return (
        f"acc3 {c.acc3:.4f} [{c.acc3_lo:.4f}, {c.acc3_hi:.4f}]; "
        f"stat AUC {c.auc_stationary:.4f}{star} [{c.auc_stationary_lo:.4f}, {c.auc_stationary_hi:.4f}]; "
        f"macro AUC {c.auc_macro:.4f} [{c.auc_macro_lo:.4f}, {c.auc_macro_hi:.4f}]; n3 {c.n3}; "
        f"up / stat / down {c.share_up:.3f} / {c.share_stationary:.3f} "
        f"[{c.share_stationary_lo:.3f}, {c.share_stationary_hi:.3f}] / {c.share_down:.3f}"
    )


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
    """A cell's rows sorted by score, with tie groups: the AUC of the score for ``pos`` and the
    mean of a per-row ``value`` under any row weights, in O(n)."""

    rows: npt.NDArray[np.int64]  # validation rows of the cell, in score order
    grp: npt.NDArray[np.int64]  # tie group of each
    n_grp: int
    pos: npt.NDArray[np.float64]  # 1.0 where the label is the positive class (up)
    value: npt.NDArray[np.float64]  # averaged: by default 1.0 where (P(up) > 0.5) == up

    @classmethod
    def of(
        cls,
        score: F64,
        up: npt.NDArray[np.bool_],
        rows: npt.NDArray[np.int64],
        value: npt.NDArray[np.float64] | None = None,
    ) -> _Prepared:
        """``value`` per row (in the rows' order; default: the binary accuracy's hit)."""
        order = np.argsort(score, kind="stable")
        return cls.sorted(score[order], up[order], rows[order], None if value is None else value[order])

    @classmethod
    def sorted(
        cls,
        s: F64,
        u: npt.NDArray[np.bool_],
        rows: npt.NDArray[np.int64],
        value: npt.NDArray[np.float64] | None = None,
    ) -> _Prepared:
        """:meth:`of` of rows already in score order (ties in row order, as a stable sort
        leaves them): a regime bin's rows are its cell's "all" rows filtered, no sort again."""
        grp = np.concatenate(([0], np.cumsum(s[1:] != s[:-1]))).astype(np.int64) if s.size else rows
        return cls(
            rows=rows,
            grp=grp,
            n_grp=int(grp[-1]) + 1 if s.size else 0,
            pos=u.astype(np.float64),
            value=((s > 0.5) == u).astype(np.float64) if value is None else value.astype(np.float64),
        )

    def auc_acc(self, counts: npt.NDArray[np.int64]) -> tuple[float, float]:
        """Weighted AUC (ties: half credit) and mean ``value`` (by default the accuracy) with
        row weights ``counts[rows]``."""
        a, acc = self.auc_acc_many(np.asarray(counts).reshape(-1, 1))
        return float(a[0]), float(acc[0])

    def auc_acc_many(self, counts: npt.NDArray[np.integer]) -> tuple[F64, F64]:
        """:meth:`auc_acc` of ``G`` replicates at once: ``counts`` [n, G] (one column of row
        weights per replicate) gives two arrays [G]; each column's figures are bit for bit those
        of :meth:`auc_acc` of that column (same sums in the same order)."""
        return _auc_acc_nb(self.rows, self.grp, self.pos, self.value, counts)


@dataclass
class _ThreeClass:
    """A cell's three-class rows: one :class:`_Prepared` per class, sorted by that class's
    probability (its one-vs-rest AUC), whose averaged ``value`` carries the other figures, so a
    replicate costs three passes and no other gather: up's the argmax hit (mean: ``acc3``),
    stationary's its indicator (``share_stationary``), down's the up indicator (``share_up``;
    ``share_down`` is the rest)."""

    per_class: list[_Prepared]  # in CLASSES order

    @classmethod
    def of(cls, proba: F64, k: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]) -> _ThreeClass:
        """``proba`` [m, 3] and true class index ``k`` (0 up, 1 stationary, 2 down) of ``rows``."""
        hit = (np.argmax(proba, axis=1) == k).astype(np.float64)
        # :meth:`sorted` over positions 0..m-1, then positions mapped to the cell's rows: one
        # place builds the per-class values
        tc = cls.sorted(proba, k, hit, [np.argsort(proba[:, j], kind="stable") for j in range(3)])
        for pr in tc.per_class:
            pr.rows = rows[pr.rows]
        return tc

    @classmethod
    def sorted(
        cls,
        proba: F64,
        k: npt.NDArray[np.int64],
        hit: npt.NDArray[np.float64],
        rows_by_class: list[npt.NDArray[np.int64]],
    ) -> _ThreeClass:
        """:meth:`of` from the unit's full ``proba`` [n, 3], true class ``k`` [n] and argmax
        ``hit`` [n], with the cell's rows already in the order of each class's probability
        (``rows_by_class[j]``; ties in row order)."""
        per = []
        for j, r in enumerate(rows_by_class):
            kr = k[r]
            value = (hit[r], (kr == 1).astype(np.float64), (kr == 0).astype(np.float64))[j]
            per.append(_Prepared.sorted(proba[r, j], kr == j, r, value))
        return cls(per_class=per)

    def metrics(self, counts: npt.NDArray[np.int64]) -> tuple[float, ...]:
        """(acc3, auc_stationary, auc_macro, share_up, share_stationary, share_down) with row
        weights ``counts[rows]``."""
        return tuple(float(x[0]) for x in self.metrics_many(np.asarray(counts).reshape(-1, 1)))

    def metrics_many(self, counts: npt.NDArray[np.integer]) -> tuple[F64, ...]:
        """:meth:`metrics` of ``G`` replicates at once (``counts`` [n, G]): six arrays [G]."""
        (a_up, acc3), (a_st, sh_st), (a_dn, sh_up) = (pr.auc_acc_many(counts) for pr in self.per_class)
        aucs = np.stack([a_up, a_st, a_dn])
        # the same sum and division per replicate as np.mean over three floats
        macro = np.where(np.isfinite(aucs).all(axis=0), (aucs[0] + aucs[1] + aucs[2]) / 3.0, np.nan)
        return (acc3, a_st, macro, sh_up, sh_st, 1.0 - sh_up - sh_st)


@njit(cache=True)
def _auc_acc_nb(
    rows: np.ndarray, grp: np.ndarray, pos: np.ndarray, correct: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One pass over rows sorted by score, for every replicate column ``b`` of ``counts`` [n, G]:
    sum over tie groups of w_up (w_down below + w_down/2). A row's G weights sit side by side,
    so the random access into ``counts`` is one cache line per row for all G replicates, not G
    (it dominated the bootstrap with one pass per replicate)."""
    m = rows.shape[0]
    nb = counts.shape[1]
    below = np.zeros(nb)
    num = np.zeros(nb)
    n1 = np.zeros(nb)
    cor = np.zeros(nb)
    wp = np.empty(nb)
    wn = np.empty(nb)
    i = 0
    while i < m:
        g = grp[i]
        wp[:] = 0.0
        wn[:] = 0.0
        j = i
        while j < m and grp[j] == g:
            r = rows[j]
            c = correct[j]
            if pos[j] > 0.5:
                for b in range(nb):
                    w = float(counts[r, b])
                    wp[b] += w
                    cor[b] += w * c
            else:
                for b in range(nb):
                    w = float(counts[r, b])
                    wn[b] += w
                    cor[b] += w * c
            j += 1
        for b in range(nb):
            num[b] += wp[b] * (below[b] + 0.5 * wn[b])
            below[b] += wn[b]
            n1[b] += wp[b]
        i = j
    a = np.empty(nb)
    acc = np.empty(nb)
    for b in range(nb):
        n0 = below[b]
        a[b] = num[b] / (n1[b] * n0) if n1[b] > 0 and n0 > 0 else np.nan
        acc[b] = cor[b] / (n1[b] + n0) if n1[b] + n0 > 0 else np.nan
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


def _proba_for(prob: Probabilities, h: int, n: int, where: str) -> F64:
    p = prob[h] if isinstance(prob, Mapping) else prob
    a = np.asarray(p, dtype=np.float64)
    if a.shape != (n, 3):
        raise FxDataError(
            f"signal_report: class probabilities of {where} at h={h} have shape {a.shape}, "
            f"expected ({n}, 3) ({', '.join(CLASSES)})"
        )
    bad = ~np.isfinite(a).all(axis=1) | (a < 0.0).any(axis=1) | (a > 1.0).any(axis=1)
    bad |= np.abs(a.sum(axis=1) - 1.0) > PROBA_SUM_TOL
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise FxDataError(
            f"signal_report: class probabilities of {where} at h={h}, row {j}: {a[j].tolist()} "
            "are not three probabilities summing to 1"
        )
    return a


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
    probabilities: Mapping[tuple[str, str], Probabilities] | None = None,
) -> SignalReport:
    """The report of every ``(row_unit, model)`` in ``predictions``.

    ``predictions[(row_unit, model)]``: P(up) per validation row of that row unit (one array for
    every horizon, or a mapping horizon -> array for per-horizon models). ``units[row_unit]``:
    that unit's labels per horizon, zero-move shares and regime variables (:class:`RowUnitData`).
    Every unit must label the same horizons. ``probabilities[(row_unit, model)]`` (optional, for
    models that also appear in ``predictions``): ``[n, 3]`` P(up), P(stationary), P(down) per
    validation row (:data:`CLASSES`; one array for every horizon or per horizon); those models get
    the three-class metrics too (module docstring). Returns a :class:`SignalReport` (cells,
    markdown, decay PNG, ``write``).
    """
    cfg = cfg or SignalReportConfig()
    probabilities = probabilities or {}
    if not predictions:
        raise FxDataError("signal_report: no predictions")
    extra = sorted(set(probabilities) - set(predictions))
    if extra:
        raise FxDataError(f"signal_report: class probabilities of {extra} but no scores for them")
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
        threes: list[tuple[int, _ThreeClass]] = []  # (index in unit_cells, its rows)
        for (u, model), pred in sorted(predictions.items()):
            if u != unit:
                continue
            prob = probabilities.get((u, model))
            for h in horizons:
                score = _scores_for(pred, h, n, f"({u}, {model})")
                proba = _proba_for(prob, h, n, f"({u}, {model})") if prob is not None else None
                y = labels[h]
                defined = np.isfinite(y)
                lab = defined & (y != 0)
                # true class index per row (0 up, 1 stationary, 2 down; CLASSES order)
                k3 = np.where(y > 0, 0, np.where(y < 0, 2, 1)).astype(np.int64)
                groups: list[tuple[str, int, float, float, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]] = [
                    ("all", 0, math.nan, math.nan, lab, defined)
                ]
                for rg, (e, b) in bins.items():
                    ext = np.concatenate(([-np.inf], e, [np.inf]))
                    for q in range(1, cfg.n_quantiles + 1):
                        inb = b == q
                        groups.append((rg, q, float(ext[q - 1]), float(ext[q]), lab & inb, defined & inb))
                # One stable sort per (model, horizon); a bin's rows in score order are these
                # filtered (ties stay in row order), so every cell's figures are as if sorted alone.
                lab_rows = np.flatnonzero(lab)
                by_score = lab_rows[np.argsort(score[lab_rows], kind="stable")]
                if proba is not None:
                    def_rows = np.flatnonzero(defined)
                    by_class = [def_rows[np.argsort(proba[def_rows, j], kind="stable")] for j in range(3)]
                    hit3 = (np.argmax(proba, axis=1) == k3).astype(np.float64)
                for rg, q, lo_e, hi_e, m, m3 in groups:
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
                    if proba is not None:
                        _three_class_cell(c, proba, k3, m3, rg, y, block, cfg)
                        cell_rows = [r[m3[r]] for r in by_class]
                        threes.append((len(unit_cells), _ThreeClass.sorted(proba, k3, hit3, cell_rows)))
                    unit_cells.append(c)
                    r = by_score[m[by_score]]
                    preps.append(_Prepared.sorted(score[r], y[r] > 0, r))
        # One replicate's row counts serve every cell of the unit (paired intervals).
        boot = np.empty((2, len(preps), cfg.n_boot))
        boot3 = np.empty((len(threes), 4, cfg.n_boot))  # acc3, auc_stationary, auc_macro, share_stationary
        # Replicates in groups of G: a [n, G] count matrix is one pass per cell for G of them.
        group = max(1, min(cfg.n_boot, BOOT_GROUP_BYTES // (4 * max(n, 1))))
        for b0 in range(0, cfg.n_boot, group):
            bs = range(b0, min(b0 + group, cfg.n_boot))
            counts = np.empty((n, len(bs)), dtype=np.int32)
            for j, bi in enumerate(bs):
                counts[:, j] = replicate_counts(starts[bi], n, block)
            for ci, pr in enumerate(preps):
                boot[0, ci, bs.start : bs.stop], boot[1, ci, bs.start : bs.stop] = pr.auc_acc_many(counts)
            for ti, (_, tc) in enumerate(threes):
                acc3, a_st, a_mac, _, sh_st, _ = tc.metrics_many(counts)
                boot3[ti, :, bs.start : bs.stop] = acc3, a_st, a_mac, sh_st
        for ci, c in enumerate(unit_cells):
            c.auc_lo, c.auc_hi = _interval(boot[0, ci], cfg.level)
            c.acc_lo, c.acc_hi = _interval(boot[1, ci], cfg.level)
        for ti, (ci, _) in enumerate(threes):
            c = unit_cells[ci]
            c.acc3_lo, c.acc3_hi = _interval(boot3[ti, 0], cfg.level)
            c.auc_stationary_lo, c.auc_stationary_hi = _interval(boot3[ti, 1], cfg.level)
            c.auc_macro_lo, c.auc_macro_hi = _interval(boot3[ti, 2], cfg.level)
            c.share_stationary_lo, c.share_stationary_hi = _interval(boot3[ti, 3], cfg.level)
        cells += unit_cells
    return SignalReport(
        cells=cells, horizons=list(horizons), block=block, config=cfg.model_dump(), regime_edges=edges_out
    )


def _three_class_cell(
    c: Cell,
    proba: F64,
    k3: npt.NDArray[np.int64],
    m3: npt.NDArray[np.bool_],
    regime: str,
    y: F64,
    block: int,
    cfg: SignalReportConfig,
) -> None:
    """Set the three-class point values of cell ``c`` (rows ``m3`` of the unit: defined labels
    in the cell's bin; ``k3`` the true class index of every row) and, on the "all" cell, the
    stationary AUC's null band."""
    rows = np.flatnonzero(m3)
    p, k = proba[rows], k3[rows]
    aucs = [M.auc(p[:, j], k == j) if rows.size else math.nan for j in range(3)]
    c.n3 = int(rows.size)
    c.acc3 = float((np.argmax(p, axis=1) == k).mean()) if rows.size else math.nan
    c.auc_stationary = aucs[1]
    c.auc_macro = float(np.mean(aucs)) if all(math.isfinite(a) for a in aucs) else math.nan
    c.share_up, c.share_stationary, c.share_down = (
        (float((k == j).mean()) if rows.size else math.nan) for j in range(3)
    )
    if regime == "all":
        # the stationary indicator as +1 (stationary) / -1 (moved), NaN where undefined
        ys = np.where(np.isfinite(y), np.where(y == 0, 1.0, -1.0), np.nan)
        nul = M.auc_block_null(proba[:, 1], ys, block, cfg.n_perm, cfg.seed)
        c.stationary_null_sd, c.stationary_null_p = nul.null_sd, nul.p_value
        if math.isfinite(nul.null_sd) and math.isfinite(c.auc_stationary):
            c.stationary_in_null_band = bool(abs(c.auc_stationary - 0.5) <= cfg.null_band_z * nul.null_sd)
