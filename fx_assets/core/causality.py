"""Causality spot-check of one stored quarter (DESIGN.md §5.1), at the cost of a window of bars.

Nothing after a bar's close may change the bar or its features. The stage-invariant tests prove
that on small markets by rewriting whole DBN files and rerunning every stage; this module is the
bounded version that the ``causal_spot_check`` asset check runs after every materialization:

1. **T.** The close of a bar ``t`` drawn by a generator seeded with the partition label (and
   ``CausalityConfig.seed``), so a partition is always checked at the same bar. T is a bar close
   because that is the sharpest cut: a trade at T + 1 ns already belongs to bar t + 1.
2. **Truncation.** The raw records (the decoded sidecars, in ``ts_recv`` order) with
   ``ts_recv <= T`` are cut out into small sidecar files holding only the span the recomputation
   reads (:func:`truncate_sidecar`): from the earlier of the start of bar t's session and the
   start of the OFI warm-up replay. Nothing after T is there.
3. **Recomputation with the stage code** (:mod:`fx_assets.core.bar_rows`): ``active_trades`` and
   ``quarter_bars`` on the truncated trades give the bars of t's session up to t (bar state
   resets at every session start, so a session's bars are a function of its own trades);
   ``quarter_bar_features`` gives their features, warmed up from the stored bars before the
   session; ``quarter_ofi`` gives the OFI features of the last ``window_bars`` bars up to t,
   warmed up from the bars before them (the replay rule of the chunked OFI pass).
4. **Comparison with the stored files.** Bars: every column, bit for bit. Features: NaN where
   the stored value is NaN and ``|stored - recomputed| <= tolerance * max(1, |stored|)``
   elsewhere: recursive indicators started at another bar agree to ``memory_tol`` only (the
   partition-equivalence tolerance). ``bars_since_reset`` and ``ts_close`` exactly.

Taken as stored (not recomputed): the roll calendar (the active contract of a session is
decided by the sessions before it), the bars of earlier sessions (the bar-feature warm-up) and
of earlier quarters. A quarter too short to hold a window with its OFI warm-up inside it is not
checked (:attr:`CausalityResult.skipped` says why).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import Field

from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import ActiveTrades, active_trades
from fx_assets.core.bar_features import BarFeatureConfig, FeatureTable, max_window
from fx_assets.core.bar_rows import quarter_bar_features, quarter_bars, quarter_ofi
from fx_assets.core.bars import BarConfig, BarTable
from fx_assets.core.book import BookSource
from fx_assets.core.calendar import session_label
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.ofi_warmup import ofi_warmup_start
from fx_assets.core.roll import RollCalendar
from fx_assets.core.sidecar import open_sidecar, sidecar_columns

#: Draws of a bar before the check gives up on a quarter (each draw costs a book scan of a
#: few hundred bars).
MAX_DRAWS = 16


class CausalityConfig(ConfigModel):
    """The causality spot-check: where it cuts and how much it recomputes."""

    window_bars: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Bars up to T whose OFI features are recomputed and compared (bars and bar "
        "features: every bar of T's session up to T). Cost grows with the OFI warm-up, not this.",
    )
    tolerance: float = Field(
        1e-9,
        gt=0,
        lt=1e-3,
        allow_inf_nan=False,
        description="Largest |stored - recomputed| / max(1, |stored|) of a feature value "
        "(dimensionless); bars are compared exactly.",
    )
    seed: int = Field(
        0, ge=0, description="Mixed with the partition label to draw T; change it to check another bar."
    )


@dataclass(frozen=True)
class StoredQuarter:
    """What the stages stored for one partition, and where its raw records are."""

    partition: str
    trades_sidecar: Path
    book_sidecar: Path
    calendar: RollCalendar
    bars: BarTable
    #: The stored ``bar_features`` and ``ofi_features`` tables (memory-mapped: only the compared
    #: rows are read).
    bar_features: pa.Table
    ofi: pa.Table
    bar_config: BarConfig
    bar_feature_config: BarFeatureConfig
    ofi_config: ofi_core.OfiConfig
    #: Stored bars of the earlier quarters, oldest first, at least ``n`` of them where they exist
    #: (the warm-up the ``bar_features`` stage read); only called when bar t's session starts
    #: within ``max_window`` bars of the quarter start.
    previous_bars: Callable[[int], Sequence[BarTable]] = lambda n: ()


@dataclass(frozen=True)
class CausalityResult:
    """Where the quarter was cut and what was compared (``skipped``: why nothing was)."""

    partition: str
    bar: int = -1
    ts_cut: int = 0
    session: str = ""
    bars_compared: int = 0
    bar_feature_rows: int = 0
    ofi_rows: int = 0
    trades_records: int = 0
    book_records: int = 0
    max_rel_diff_bar_features: float = 0.0
    max_rel_diff_ofi: float = 0.0
    seconds: float = 0.0
    skipped: str = ""


# --- truncation -------------------------------------------------------------------------------


def truncate_sidecar(source: Path, dest: Path, *, after_ts: int | None, until_ts: int) -> int:
    """Write the records of sidecar ``source`` with ``after_ts < ts_recv <= until_ts`` (no lower
    bound for None) to ``dest`` as a sidecar (same schema and metadata, one record batch;
    ``fx.n_records`` and ``fx.truncated`` say what it holds). Returns the number of records.
    The sidecar is in ``ts_recv`` order, so the cut is two binary searches and one copy."""
    table = open_sidecar(source)
    ts = sidecar_columns(source, ["ts_recv"])["ts_recv"]
    lo = 0 if after_ts is None else int(np.searchsorted(ts, after_ts, side="right"))
    hi = int(np.searchsorted(ts, until_ts, side="right"))
    hi = max(hi, lo)
    # The body checksums describe the whole file, not this cut: they are not carried over.
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if b"checksum" not in k}
    meta[b"fx.n_records"] = str(hi - lo).encode()
    meta[b"fx.truncated"] = f"{source.name}: ts_recv in ({after_ts}, {until_ts}]".encode()
    part = table.slice(lo, hi - lo).combine_chunks().replace_schema_metadata(meta)
    batches = part.to_batches(max_chunksize=max(hi - lo, 1))
    batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=part.schema)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(dest), "wb") as sink, pa.ipc.new_file(sink, part.schema) as writer:
        writer.write_batch(batch)
    return hi - lo


# --- picking the bar --------------------------------------------------------------------------


def _session_starts(bars: BarTable) -> np.ndarray:
    """Index of the first bar of each bar's session."""
    n = len(bars)
    first = np.zeros(n, dtype=np.int64)
    if n:
        change = np.flatnonzero(np.diff(bars.session_id) != 0) + 1
        starts = np.concatenate([[0], change])
        first = starts[np.searchsorted(starts, np.arange(n), side="right") - 1]
    return first


def draw_bars(partition: str, n_bars: int, config: CausalityConfig) -> np.ndarray:
    """Candidate bars in the order the check tries them: a permutation of ``0..n_bars-1`` from a
    generator seeded with the partition label and ``config.seed`` (stable across runs)."""
    rng = np.random.default_rng([config.seed, *partition.encode()])
    return rng.permutation(n_bars)


@dataclass(frozen=True)
class _Cut:
    t: int  # the bar whose close is T
    b_s: int  # first bar of t's session
    b0: int  # first bar of the OFI window
    replay_after: int  # ts after which the OFI replay reads events (close of the bar before it)


def _pick(q: StoredQuarter, config: CausalityConfig) -> _Cut | str:
    """The first drawn bar whose window fits in its session and whose OFI warm-up replay lies
    inside the quarter (so the stored quarter's own bars and book are enough); else why not."""
    bars = q.bars
    n = len(bars)
    k = config.window_bars
    first = _session_starts(bars)
    book = BookSource(q.book_sidecar, q.calendar)
    book_ts = sidecar_columns(q.book_sidecar, ["ts_recv"])["ts_recv"]
    # A replay needs at least ofi_warmup_bars bars before the window: cheap pre-filter.
    need = ofi_core.ofi_warmup_bars(bars.volume, q.ofi_config) + 1 if n else 0
    ok = (np.arange(n) - first >= k - 1) & (np.arange(n) - k + 1 >= need)
    order = [int(j) for j in draw_bars(q.partition, n, config) if ok[j]]
    for t in order[:MAX_DRAWS]:
        b0 = t - k + 1
        tc = bars.ts_close
        # quarter_ofi needs book records in the window itself (after the bar before it)
        if np.searchsorted(book_ts, tc[t], side="right") <= np.searchsorted(
            book_ts, tc[b0 - 1], side="right"
        ):
            continue
        start = ofi_warmup_start(bars.slice(0, b0), book, q.ofi_config)
        if start is not None:
            return _Cut(t=t, b_s=int(first[t]), b0=b0, replay_after=start)
    if not order:
        return (
            f"{n} bars: no bar has {k} bars of its session and the OFI warm-up ({need} bars) "
            "before it inside the quarter"
        )
    return f"none of {min(len(order), MAX_DRAWS)} drawn bars has its OFI warm-up replay inside the quarter"


# --- comparison -------------------------------------------------------------------------------


def _first_mismatch_exact(a: np.ndarray, b: np.ndarray) -> int | None:
    if a.shape != b.shape:
        return 0
    eq = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b
    bad = np.flatnonzero(~eq)
    return int(bad[0]) if bad.size else None


def _compare_features(
    where: str,
    table: str,
    stored: dict[str, np.ndarray],
    recomputed: dict[str, np.ndarray],
    row0: int,
    tol: float,
) -> float:
    """Largest relative difference of two feature tables' columns; FxDataError naming the table,
    column and bar (``row0`` + row) when the column sets differ or a value is off by more than
    ``tol``."""
    if set(stored) != set(recomputed):
        raise FxDataError(
            f"{where}: {table} columns {sorted(set(stored) ^ set(recomputed))} are in only one of "
            "the stored table and the registry"
        )
    worst, bad = _compare_close(stored, recomputed, tol)
    if bad is not None:
        name, j, s, r = bad
        raise FxDataError(
            f"{where}: {table} column {name!r} bar {row0 + j}: stored {s!r}, from the truncated "
            f"data {r!r} (tolerance {tol:g})"
        )
    return worst


def _compare_close(
    stored: dict[str, np.ndarray], recomputed: dict[str, np.ndarray], tol: float
) -> tuple[float, tuple[str, int, float, float] | None]:
    """(max relative diff, first violation as (column, row, stored, recomputed) or None)."""
    worst = 0.0
    for name, s in stored.items():
        r = recomputed[name]
        s_nan, r_nan = np.isnan(s), np.isnan(r)
        nan_bad = np.flatnonzero(s_nan != r_nan)
        both = ~s_nan & ~r_nan
        rel = np.zeros(s.shape, dtype=np.float64)
        rel[both] = np.abs(s[both] - r[both]) / np.maximum(1.0, np.abs(s[both]))
        far = np.flatnonzero(rel > tol)
        bad = np.union1d(nan_bad, far)
        if bad.size:
            j = int(bad[0])
            return float("inf"), (name, j, float(s[j]), float(r[j]))
        worst = max(worst, float(rel.max(initial=0.0)))
    return worst, None


def _slice_trades(tr: ActiveTrades, lo: int, hi: int) -> ActiveTrades:
    return dataclasses.replace(
        tr,
        ts=tr.ts[lo:hi],
        price=tr.price[lo:hi],
        size=tr.size[lo:hi],
        sign=tr.sign[lo:hi],
        session=tr.session[lo:hi],
        instrument_id=tr.instrument_id[lo:hi],
    )


# --- the check --------------------------------------------------------------------------------


def spot_check_causality(
    q: StoredQuarter, config: CausalityConfig | None = None, workdir: Path | None = None
) -> CausalityResult:
    """Cut the quarter's raw data at a drawn bar close T, recompute the bars and features up to
    T from what is left, compare with the stored values (see the module docstring).

    Raises FxDataError naming the partition, T, the stage, the column and the bar of the first
    difference. ``workdir``: where the truncated sidecars go (a temporary directory if None).
    """
    cfg = config or CausalityConfig()
    t_start = time.perf_counter()
    part = q.partition
    cut = _pick(q, cfg)
    if isinstance(cut, str):
        return CausalityResult(partition=part, skipped=cut)
    bars = q.bars
    t, b_s, b0 = cut.t, cut.b_s, cut.b0
    tc = bars.ts_close
    cut_ts = int(tc[t])
    session = int(bars.session_id[t])
    where = f"{part}: causality (raw data cut at ts_recv {cut_ts}, the close of bar {t}, session {session_label(session)})"
    # Trades from the start of t's session (or of the OFI replay, if earlier) to T.
    after_trades = min(cut.replay_after, int(tc[b_s - 1])) if b_s > 0 else None
    with tempfile.TemporaryDirectory(prefix="fx-causal-", dir=workdir) as tmp:
        d = Path(tmp)
        n_tr = truncate_sidecar(q.trades_sidecar, d / "trades.arrow", after_ts=after_trades, until_ts=cut_ts)
        n_bk_prev = truncate_sidecar(
            q.book_sidecar, d / "book_replay.arrow", after_ts=cut.replay_after, until_ts=int(tc[b0 - 1])
        )
        n_bk = truncate_sidecar(
            q.book_sidecar, d / "book_window.arrow", after_ts=int(tc[b0 - 1]), until_ts=cut_ts
        )
        trades = active_trades(d / "trades.arrow", q.calendar)

        # Bars of t's session, rebuilt from the truncated trades: equal bit for bit.
        rebuilt = quarter_bars(trades, q.bar_config)
        mine = np.flatnonzero(rebuilt.session_id == session)
        n_cmp = t - b_s + 1
        if mine.size < n_cmp:
            raise FxDataError(
                f"{where}: bars: the truncated data gives {mine.size} bars of the session up to T, "
                f"the stored bars {n_cmp}"
            )
        sess_bars = rebuilt.slice(int(mine[0]), int(mine[0]) + n_cmp)
        stored_sess = bars.slice(b_s, t + 1)
        for name, col in stored_sess.columns().items():
            j = _first_mismatch_exact(col, sess_bars.columns()[name])
            if j is not None:
                raise FxDataError(
                    f"{where}: bars column {name!r} bar {b_s + j}: stored {col[j]!r}, from the "
                    f"truncated data {sess_bars.columns()[name][j]!r}"
                )

        # Bar features of those bars, warmed up from the stored bars before the session.
        fcfg = q.bar_feature_config
        earlier: list[BarTable] = []
        stored_ft = FeatureTable.from_arrow(q.bar_features.slice(b_s, n_cmp), "bar_features")
        if b_s < max_window(fcfg) and stored_ft.n_prior > 0:
            earlier = list(q.previous_bars(max_window(fcfg) - b_s))
        feats = quarter_bar_features(sess_bars, [*earlier, bars.slice(0, b_s)], fcfg)
        worst_f = _compare_features(
            where, "bar_features", stored_ft.columns, feats.columns, b_s, cfg.tolerance
        )

        # OFI features of the window, warmed up from the bars before it (the chunk replay rule).
        split = int(np.searchsorted(trades.ts, tc[b0 - 1], side="right"))
        prev_bars = BarTable.concat([bars.slice(0, b_s), sess_bars.slice(0, b0 - b_s)])
        ofi = quarter_ofi(
            sess_bars.slice(b0 - b_s, n_cmp),
            _slice_trades(trades, split, len(trades)),
            BookSource(d / "book_window.arrow", q.calendar),
            q.ofi_config,
            prev_bars=prev_bars,
            prev_trades=_slice_trades(trades, 0, split),
            prev_book=BookSource(d / "book_replay.arrow", q.calendar),
            partition=part,
        )
    so = ofi_core.OfiFeatures.from_arrow(q.ofi.slice(b0, t + 1 - b0))
    for name, s_col, r_col in (
        ("ts_close", so.ts_close, ofi.ts_close),
        ("bars_since_reset", so.bars_since_reset, ofi.bars_since_reset),
    ):
        j = _first_mismatch_exact(s_col, r_col)
        if j is not None:
            raise FxDataError(
                f"{where}: ofi_features column {name!r} bar {b0 + j}: stored {s_col[j]!r}, from the "
                f"truncated data {r_col[j] if j < len(r_col) else None!r}"
            )
    worst_o = _compare_features(where, "ofi_features", so.columns, ofi.columns, b0, cfg.tolerance)
    return CausalityResult(
        partition=part,
        bar=t,
        ts_cut=cut_ts,
        session=session_label(session),
        bars_compared=n_cmp,
        bar_feature_rows=n_cmp,
        ofi_rows=t + 1 - b0,
        trades_records=n_tr,
        book_records=n_bk_prev + n_bk,
        max_rel_diff_bar_features=worst_f,
        max_rel_diff_ofi=worst_o,
        seconds=time.perf_counter() - t_start,
    )


__all__ = [
    "CausalityConfig",
    "CausalityResult",
    "StoredQuarter",
    "draw_bars",
    "spot_check_causality",
    "truncate_sidecar",
]
