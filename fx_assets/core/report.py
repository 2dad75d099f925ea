"""Walk-forward reporting: per-fold out-of-sample results, stitched in time order, and pictures.

Owns the on-disk form of a fold's validation results (``oos.npz``: bar close times, session
ids, positions, net strategy returns and the same returns gross of cost, of the validation
quarter only) and the stitching of all folds into one out-of-sample record with its equity
curve and summary metrics (gross and net side by side).
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fx_assets.core import metrics as M
from fx_assets.core.atomic import atomic_path
from fx_assets.core.errors import FxDataError


@dataclass(frozen=True)
class FoldOOS:
    """Out-of-sample results of one fold (its validation quarter)."""

    name: str
    ts: npt.NDArray[np.int64]
    sessions: npt.NDArray[np.int32]
    positions: npt.NDArray[np.int8]
    returns: npt.NDArray[np.float64]  # net of cost
    gross_returns: npt.NDArray[np.float64]  # pos * y^(1), before cost

    def save(self, path: Path) -> Path:
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(
                fh,
                name=np.array(self.name),
                ts=self.ts,
                sessions=self.sessions,
                positions=self.positions,
                returns=self.returns,
                gross_returns=self.gross_returns,
            )
        return path

    @classmethod
    def load(cls, path: Path) -> FoldOOS:
        try:
            with np.load(path) as z:
                return cls(
                    str(z["name"]), z["ts"], z["sessions"], z["positions"], z["returns"], z["gross_returns"]
                )
        except (OSError, KeyError, ValueError) as exc:
            raise FxDataError(f"{path}: not a fold result file: {exc}") from exc


@dataclass(frozen=True)
class WalkForward:
    folds: tuple[FoldOOS, ...]
    ts: npt.NDArray[np.int64]
    returns: npt.NDArray[np.float64]
    gross_returns: npt.NDArray[np.float64]
    sessions: npt.NDArray[np.int32]
    fold_of_bar: npt.NDArray[np.int32]

    @property
    def equity(self) -> npt.NDArray[np.float64]:
        return M.equity_curve(self.returns)

    def positions(self) -> npt.NDArray[np.float64]:
        """Positions of every bar in time order (each fold starts flat)."""
        return (
            np.concatenate([f.positions.astype(np.float64) for f in self.folds])
            if self.folds
            else np.zeros(0)
        )

    def summary(self) -> dict[str, float]:
        def sharpe(r: npt.NDArray[np.float64]) -> float:
            return float(M.sharpe_daily(r, self.sessions)) if r.size > 1 else float("nan")

        return {
            "sharpe": sharpe(self.returns),
            "gross_sharpe": sharpe(self.gross_returns),
            "net_sharpe": sharpe(self.returns),
            "gross_total_log_return": float(self.gross_returns.sum()),
            "net_total_log_return": float(self.returns.sum()),
            "turnover": float(np.mean(np.abs(np.diff(self.positions(), prepend=0.0))))
            if self.returns.size
            else float("nan"),
            "max_drawdown": float(M.max_drawdown(self.returns)) if self.returns.size else 0.0,
            # Bar returns are log returns: they add; the compounded return is expm1 of the sum.
            "total_log_return": float(self.returns.sum()),
            "total_return": float(np.expm1(self.returns.sum())),
            "n_bars": float(self.returns.size),
            "n_folds": float(len(self.folds)),
        }


def gross_returns(
    net: npt.NDArray[np.float64], positions: npt.NDArray[np.int8], cost: float
) -> npt.NDArray[np.float64]:
    """Per-bar returns before cost from the net ones: ``net + cost · |Δpos|`` (starting flat)."""
    return net + cost * np.abs(np.diff(positions.astype(np.float64), prepend=0.0))


def stitch(folds: list[FoldOOS]) -> WalkForward:
    """Folds in time order; overlapping validation periods are an error (each bar once)."""
    ordered = sorted(folds, key=lambda f: int(f.ts[0]) if f.ts.size else 0)
    for a, b in itertools.pairwise(ordered):
        if a.ts.size and b.ts.size and a.ts[-1] >= b.ts[0]:
            raise FxDataError(f"walk-forward folds {a.name} and {b.name} overlap in time")
    if not ordered:
        empty_i = np.zeros(0, np.int64)
        return WalkForward(
            (), empty_i, np.zeros(0), np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int32)
        )
    return WalkForward(
        folds=tuple(ordered),
        ts=np.concatenate([f.ts for f in ordered]),
        returns=np.concatenate([f.returns for f in ordered]),
        gross_returns=np.concatenate([f.gross_returns for f in ordered]),
        sessions=np.concatenate([f.sessions for f in ordered]),
        fold_of_bar=np.concatenate([np.full(f.ts.size, i, np.int32) for i, f in enumerate(ordered)]),
    )


def equity_png(
    ts: npt.NDArray[np.int64],
    returns: npt.NDArray[np.float64],
    title: str,
    boundaries: list[tuple[int, str]] | None = None,
) -> bytes:
    """PNG of the equity curve exp(cumsum r) against time (vertical lines at fold boundaries)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3), dpi=90)
    if ts.size:
        t = ts.astype("datetime64[ns]")
        ax.plot(t, np.exp(np.cumsum(returns)), lw=1.0, color="#1f5fa8")
        for when, label in boundaries or []:
            x = float(mdates.date2num(np.datetime64(int(when), "ns")))
            ax.axvline(x, color="#999", lw=0.6, ls="--")
            ax.text(x, ax.get_ylim()[1], f" {label}", va="top", fontsize=7)
    ax.axhline(1.0, color="#444", lw=0.5)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("equity (start = 1)")
    fig.autofmt_xdate()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
