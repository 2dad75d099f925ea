"""Verification of stored stage outputs: what the asset checks compute (no Dagster).

Each function re-reads what a stage wrote and checks one invariant of it, raising
:class:`FxDataError` with a message that names the partition, the file and the column (and
the session or bar) of the first violation; on success it returns a few figures for the check's
metadata. The causality spot-check lives in :mod:`fx_assets.core.causality`.

Each also verifies the body checksum of the file it checks (:func:`fx_assets.core.tables.verify_table`).

- :func:`verify_bar_volume`: the bars conserve the traded volume of the active contract (total
  and per session; ``n_trades`` likewise).
- :func:`verify_bar_features_file` / :func:`verify_ofi_features_file`: a stored feature table is
  finite outside each feature's documented warm-up (the registries' ``warmup`` /
  ``nan_prefix``), inside its documented bounds, and aligned with its bars.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import ActiveTrades, active_trades, roll_calendar_from_table
from fx_assets.core.bar_features import FeatureTable, build_registry, validate_features
from fx_assets.core.bars import BarTable
from fx_assets.core.calendar import session_label
from fx_assets.core.errors import FxDataError
from fx_assets.core.tables import numpy_of, read_table, verify_table
from fx_assets.core.verified import verify_once


def verify_bar_volume(
    bars_path: Path, trades_sidecar: Path, roll_calendar_path: Path, *, partition: str
) -> dict[str, int]:
    """Sum of bar ``volume`` == volume of the active-contract trades (the trades sidecar filtered
    by the stored roll calendar, as the bars stage filters it), and sum of ``n_trades`` == their
    count, over the quarter and in every session (the first session that differs is named).

    Sizes are whole contracts, so float64 sums are exact (below 2**53) and compared with ``==``.
    """
    _verified(bars_path, partition)
    bars = BarTable.from_arrow(read_table(bars_path), str(bars_path))
    calendar = roll_calendar_from_table(read_table(roll_calendar_path))
    trades = active_trades(trades_sidecar, calendar)
    return bar_volume_figures(bars, trades, partition=partition, bars_path=bars_path)


def bar_volume_figures(
    bars: BarTable, trades: ActiveTrades, *, partition: str, bars_path: Path
) -> dict[str, int]:
    """:func:`verify_bar_volume` on tables in memory (``bars_path``: the file they were written
    to, for the message): the bars stage evaluates it on what it just built and wrote."""
    traded = float(trades.size.sum())
    volume = float(bars.volume.sum())
    n_bar_trades = int(bars.n_trades.sum())
    sessions = np.union1d(np.unique(bars.session_id), np.unique(trades.session))
    if volume != traded or n_bar_trades != len(trades):
        # Name the first session that differs: where the volume went missing.
        b_idx = np.searchsorted(sessions, bars.session_id)
        t_idx = np.searchsorted(sessions, trades.session)
        m = len(sessions)
        bv = np.bincount(b_idx, weights=bars.volume, minlength=m)
        tv = np.bincount(t_idx, weights=trades.size, minlength=m)
        bn = np.bincount(b_idx, weights=bars.n_trades.astype(np.float64), minlength=m)
        tn = np.bincount(t_idx, minlength=m).astype(np.float64)
        bad = np.flatnonzero((bv != tv) | (bn != tn))
        where = ""
        if bad.size:
            k = int(bad[0])
            where = (
                f"; first in session {session_label(int(sessions[k]))}: volume {bv[k]:g} vs {tv[k]:g}, "
                f"n_trades {int(bn[k])} vs {int(tn[k])}"
            )
        column = "volume" if volume != traded else "n_trades"
        raise FxDataError(
            f"{partition}: {bars_path}: column {column!r}: bars hold volume {volume:g} in "
            f"{n_bar_trades} trades, the active contract traded {traded:g} in {len(trades)} trades{where}"
        )
    return {"bars": len(bars), "trades": len(trades), "volume": int(traded), "sessions": len(sessions)}


def bar_volume_totals(
    bars: BarTable,
    n_trades: int,
    volume: float,
    *,
    partition: str,
    bars_path: Path,
    trades: Callable[[], ActiveTrades],
) -> dict[str, int]:
    """:func:`bar_volume_figures` from the active trades' count and volume (as
    ``bar_rows.sidecar_bars`` counts them while building the bars). When they match, the
    sessions are the bars' (a bar holds the trades of one session, and each trade is in a bar);
    otherwise ``trades()`` loads the trades to name the first session that differs."""
    if float(bars.volume.sum()) != volume or int(bars.n_trades.sum()) != n_trades:
        return bar_volume_figures(bars, trades(), partition=partition, bars_path=bars_path)
    sessions = np.unique(bars.session_id)
    return {"bars": len(bars), "trades": n_trades, "volume": int(volume), "sessions": len(sessions)}


def _verified(path: Path, partition: str) -> None:
    """The stored table's body matches the checksum written with it."""
    try:
        verify_once(path, "table", verify_table)  # not again if this process just verified it
    except FxDataError as exc:
        raise FxDataError(f"{partition}: {exc}") from exc


def _check_aligned(
    ts_close: np.ndarray, bars_ts_close: np.ndarray | None, partition: str, path: Path
) -> None:
    if bars_ts_close is None:
        return
    if ts_close.shape != bars_ts_close.shape:
        raise FxDataError(
            f"{partition}: {path}: column 'ts_close' has {ts_close.shape[0]} rows, the bars {bars_ts_close.shape[0]}"
        )
    bad = np.flatnonzero(ts_close != bars_ts_close)
    if bad.size:
        j = int(bad[0])
        raise FxDataError(
            f"{partition}: {path}: column 'ts_close' bar {j} is {int(ts_close[j])}, the bar closed at "
            f"{int(bars_ts_close[j])}"
        )


def _bars_ts_close(bars_path: Path | None) -> np.ndarray | None:
    if bars_path is None:
        return None
    return np.asarray(numpy_of(read_table(bars_path).column("ts_close")), dtype=np.int64)


def verify_bar_features_file(path: Path, *, partition: str, bars_path: Path | None = None) -> dict[str, int]:
    """The stored ``bar_features`` table: every registry feature present, finite except during its
    warm-up (``FeatureSpec.warmup`` bars of history), inside its bounds, one row per bar of
    ``bars_path`` (when given)."""
    _verified(path, partition)
    table = FeatureTable.from_arrow(read_table(path), str(path))
    _check_aligned(table.ts_close, _bars_ts_close(bars_path), partition, path)
    try:
        validate_features(table, partition)
    except FxDataError as exc:
        raise FxDataError(f"{path}: {exc}") from exc
    nan = sum(int(np.isnan(v).sum()) for v in table.columns.values())
    longest = max((s.warmup for s in build_registry(table.config)), default=0)
    return {"rows": len(table), "features": len(table.columns), "warmup_nan": nan, "warmup_bars_max": longest}


def verify_ofi_features_file(path: Path, *, partition: str, bars_path: Path | None = None) -> dict[str, int]:
    """The stored ``ofi_features`` table: every registry feature present, no ±inf, NaN only in
    the leading run of a reset segment for features that allow it, inside the bounds, book
    events present and OFI not identically zero (:func:`fx_assets.core.ofi.validate_ofi`)."""
    _verified(path, partition)
    table = ofi_core.OfiFeatures.from_arrow(read_table(path))
    _check_aligned(table.ts_close, _bars_ts_close(bars_path), partition, path)
    try:
        ofi_core.validate_ofi(table, partition)
    except FxDataError as exc:
        raise FxDataError(f"{path}: {exc}") from exc
    nan = sum(int(np.isnan(v).sum()) for v in table.columns.values())
    return {"rows": len(table), "features": len(table.columns), "warmup_nan": nan}


__all__ = [
    "bar_volume_figures",
    "bar_volume_totals",
    "verify_bar_features_file",
    "verify_bar_volume",
    "verify_ofi_features_file",
]
