"""Feature assets: ``bars``, ``bar_features``, ``ofi_features`` and the per-quarter ``fxcache``.

Each asset reads its inputs (sidecars and upstream stage files, located by cache key), calls
one core function, validates, writes its output atomically under a keyed name and reports
metadata. Warm-up: ``bar_features`` and ``ofi_features`` start from the previous quarters' bars
(declared as a previous-quarter dependency), so an interior quarter drops no bar; the quarters
read are the ones :mod:`fx_assets.core.lineage` plans for their keys (``StageIO.bar_features_warmup``,
``StageIO.ofi_warmup_quarter``), so a key lists exactly the files the computation opened.
"""

import time
from collections.abc import Callable

import dagster as dg
import numpy as np

from fx_assets.assets.common import (
    StageIO,
    keyed_result,
    recorded_verdict,
    start_stage,
    summary_table,
    volume_check_inputs,
)
from fx_assets.automation import CHAIN
from fx_assets.core import lineage, verify
from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import (
    active_trades,
    roll_calendar_from_table,
    trade_source,
)
from fx_assets.core.bar_features import FeatureTable, validate_features
from fx_assets.core.bar_rows import (
    SidecarBars,
    assemble_fxcache_columns,
    quarter_bar_features,
    quarter_ofi,
    sidecar_bars,
)
from fx_assets.core.bars import BarTable, bars_per_session, check_bar_density
from fx_assets.core.book import BookSource
from fx_assets.core.calendar import session_label
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import read_header, write_fxcache
from fx_assets.core.ofi_warmup import ofi_warmup_start
from fx_assets.core.snapshot_rows import write_snapshot_fxcache
from fx_assets.core.tables import read_table, write_table
from fx_assets.partitions import QuarterSymbol, previous_quarter_mapping
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage


def _load_bars(io: StageIO, quarter) -> BarTable:
    path = io.require("bars", quarter)
    return BarTable.from_arrow(read_table(path), str(path))


def _book(io: StageIO, quarter) -> BookSource:
    cal = roll_calendar_from_table(read_table(io.require("roll_calendar", quarter)))
    return BookSource(io.sidecar("mbp-10", quarter).path, cal)


def warmup_bars(io: StageIO) -> list[BarTable]:
    """The bars that warm up the partition's bar features: the quarters its key lists, oldest first."""
    return [_load_bars(io, q) for q in io.bar_features_warmup()]


def _guard(part: QuarterSymbol, fn: Callable[[], object]) -> object:
    try:
        return fn()
    except FxDataError as exc:
        raise dg.Failure(f"{part.label}: {exc}") from exc


def make_feature_assets(partitions_def, roll_calendar, predecoded_trades, predecoded_mbp10) -> tuple:
    prev = previous_quarter_mapping()

    @dg.asset(
        partitions_def=partitions_def,
        automation_condition=CHAIN,
        deps=[roll_calendar, predecoded_trades],
        group_name="features",
        code_version=lineage.code_version("bars"),
        kinds={"numba", "arrow"},
        description="Volume / dollar / imbalance bars of the active contract (never across a session or roll).",
    )
    def bars(
        context: dg.AssetExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.MaterializeResult:
        part, io, hit = start_stage(context, storage, pipeline, "bars")
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        cal = roll_calendar_from_table(read_table(io.require("roll_calendar", part.quarter)))
        trades_path = io.sidecar("trades", part.quarter).path
        built = _guard(part, lambda: sidecar_bars(trades_path, cal, io.cfg.bars))
        assert isinstance(built, SidecarBars)
        table = built.bars
        out = write_table(io.path("bars"), table.to_arrow())
        seconds = time.perf_counter() - t0
        sessions, counts = bars_per_session(table)
        # The volume_conserved check's own evaluation, on the trade totals of the pass that
        # built the bars (the check would rebuild the trades from the sidecar): recorded for
        # these bytes, so the check reuses it.
        figures = _guard(
            part,
            lambda: verify.bar_volume_totals(
                table,
                built.n_trades,
                built.volume,
                partition=part.label,
                bars_path=out,
                trades=lambda: active_trades(trades_path, cal),
            ),
        )
        assert isinstance(figures, dict)
        recorded_verdict(out, "volume_conserved", volume_check_inputs(io), lambda: figures)
        target = pipeline.bars_target_per_session
        if target is None and io.cfg.bars.kind in ("tick_imbalance", "volume_imbalance") and len(sessions):
            # Imbalance bars aim at about T_init ticks per bar: warn when the density drifts far.
            target = max(int(built.n_trades / len(sessions) / io.cfg.bars.imbalance_expected_ticks_init), 1)
        warning = check_bar_density(table, target) if target else None
        if warning:
            context.log.warning(f"{part.label}: {warning}")
        rolls = sorted(
            {
                session_label(int(s))
                for s, f in zip(
                    table.session_id[1:], np.diff(table.instrument_id.astype(np.int64)) != 0, strict=True
                )
                if f
            }
        )
        return keyed_result(
            io,
            "bars",
            out,
            bars=len(table),
            trades_used=built.n_trades,
            trades_in_file=built.n_source,
            sessions=len(sessions),
            bars_per_session_mean=round(float(counts.mean()), 1) if counts.size else 0.0,
            bars_per_session_min=int(counts.min()) if counts.size else 0,
            bars_per_session_max=int(counts.max()) if counts.size else 0,
            bars_per_session=dg.MetadataValue.table(
                [
                    dg.TableRecord({"session": session_label(int(s)), "bars": int(c)})
                    for s, c in zip(sessions, counts, strict=True)
                ],
                schema=dg.TableSchema(
                    columns=[dg.TableColumn("session", "string"), dg.TableColumn("bars", "int")]
                ),
            ),
            forced_closes=int(table.forced_close.sum()),
            rolls_respected=", ".join(rolls) or "none",
            volume_conserved=True,  # bar_volume_figures raised otherwise
            density_warning=warning or "",
            target_bars_per_session=target or 0,
            seconds=round(seconds, 3),
            kind=io.cfg.bars.kind,
        )

    @dg.asset(
        partitions_def=partitions_def,
        automation_condition=CHAIN,
        deps=[dg.AssetDep(bars, partition_mapping=prev)],
        group_name="features",
        code_version=lineage.code_version("bar_features"),
        kinds={"numba", "arrow"},
        description="Bar-level technical features (registry in fx_assets.core.bar_features), warmed up from the previous quarter.",
    )
    def bar_features(
        context: dg.AssetExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.MaterializeResult:
        part, io, hit = start_stage(context, storage, pipeline, "bar_features")
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        cur = _load_bars(io, part.quarter)
        previous = warmup_bars(io)
        table = _guard(part, lambda: quarter_bar_features(cur, previous, io.cfg.bar_features))
        assert isinstance(table, FeatureTable)
        _guard(part, lambda: validate_features(table, part.label))
        out = write_table(io.path("bar_features"), table.to_arrow())
        return keyed_result(
            io,
            "bar_features",
            out,
            bars=len(table),
            warmup_bars=table.n_prior,
            features=len(table.columns),
            summary=summary_table(table.columns),
            seconds=round(time.perf_counter() - t0, 3),
        )

    @dg.asset(
        partitions_def=partitions_def,
        automation_condition=CHAIN,
        deps=[dg.AssetDep(bars, partition_mapping=prev), predecoded_mbp10],
        group_name="features",
        code_version=lineage.code_version("ofi_features"),
        kinds={"numba", "arrow"},
        description="Order-flow imbalance and book features per bar over its own formation window (registry in fx_assets.core.ofi).",
    )
    def ofi_features(
        context: dg.AssetExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.MaterializeResult:
        part, io, hit = start_stage(context, storage, pipeline, "ofi_features")
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        cur = _load_bars(io, part.quarter)
        kw: dict = {}
        pq = io.ofi_warmup_quarter()
        if pq is not None:
            prev_bars, prev_book = _load_bars(io, pq), _book(io, pq)
            # Only the previous quarter's tail is replayed: load its trades from the warm-up start.
            start = ofi_warmup_start(prev_bars, prev_book, io.cfg.ofi)
            kw = {
                "prev_bars": prev_bars,
                "prev_trades": trade_source(
                    io.sidecar("trades", pq).path, prev_book.calendar, after_ts=start
                ),
                "prev_book": prev_book,
            }
        book = _book(io, part.quarter)
        # OFI reads the trades' time, size and sign only, chunk by chunk from the sidecar (or
        # the flow, for a sidecar out of ts_recv order): not the full active trades.
        flow = trade_source(io.sidecar("trades", part.quarter).path, book.calendar)
        feats = _guard(
            part,
            lambda: quarter_ofi(
                cur,
                flow,
                book,
                io.cfg.ofi,
                partition=part.label,
                **kw,
            ),
        )
        assert isinstance(feats, ofi_core.OfiFeatures)
        # Validated while the table is written (the file lands only once the check passed).
        out = write_table(
            io.path("ofi_features"),
            feats.to_arrow(),
            alongside=lambda: _guard(part, lambda: ofi_core.validate_ofi(feats, part.label)),
        )
        return keyed_result(
            io,
            "ofi_features",
            out,
            bars=len(feats),
            warmed_up_from_previous_quarter=bool(kw),
            features=len(feats.columns),
            summary=summary_table(feats.columns),
            seconds=round(time.perf_counter() - t0, 3),
        )

    @dg.asset(
        partitions_def=partitions_def,
        automation_condition=CHAIN,
        deps=[bars, bar_features, ofi_features],
        group_name="features",
        code_version=lineage.code_version("fxcache"),
        kinds={"fxcache"},
        description=(
            "One flat file per quarter and symbol (docs/fxcache.md): row timestamps, an f64 price block, "
            "then features (and OFI) as one row-major block the GPU loads in a single copy. A row is a bar "
            "or, with pipeline fxcache.row_unit: snapshot, one MBP-10 update. Nothing forward-looking."
        ),
    )
    def fxcache(
        context: dg.AssetExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.MaterializeResult:
        part, io, hit = start_stage(context, storage, pipeline, "fxcache")
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        cur = _load_bars(io, part.quarter)
        feats = FeatureTable.from_arrow(read_table(io.require("bar_features")))
        key = io.key("fxcache")
        path = io.path("fxcache")
        meta = {"partition": part.label, "cache_key": key, "row_unit": io.cfg.fxcache.row_unit}
        if io.cfg.fxcache.row_unit == "snapshot":
            # One row per MBP-10 update (core.snapshot_rows), bar context from this quarter's bars.
            counts = _guard(
                part,
                lambda: write_snapshot_fxcache(
                    path,
                    _book(io, part.quarter),
                    cur,
                    feats,
                    io.cfg.snapshot,
                    io.cfg.fxcache.dtype,
                    bytes.fromhex(key),
                    meta,
                    trades=io.sidecar("trades", part.quarter).path,  # the bars' trades: bar progress
                    partition=part.label,
                ),
            )
            assert isinstance(counts, dict)
            head = read_header(path)
            return keyed_result(
                io,
                "fxcache",
                path,
                row_unit="snapshot",
                rows=counts["rows"],
                row_counts=dg.MetadataValue.json(counts),
                bytes=path.stat().st_size,
                dtype=io.cfg.fxcache.dtype,
                columns={"feature": head.n_feature, "price": head.n_price},
                seconds=round(time.perf_counter() - t0, 3),
            )
        ofi = ofi_core.OfiFeatures.from_arrow(read_table(io.require("ofi_features")))
        assembled = _guard(part, lambda: assemble_fxcache_columns(cur, feats, ofi, _book(io, part.quarter)))
        assert isinstance(assembled, tuple)
        ts, groups, dropped = assembled
        _guard(
            part,
            lambda: write_fxcache(
                path,
                ts,
                groups,
                io.cfg.fxcache.dtype,
                bytes.fromhex(key),
                {**meta, "dropped_rows": dropped},
                # read back and verified in full here, at the cost of its checksums (the values
                # were checked as written): the fxcache_valid check then finds it verified
                read_back=True,
            ),
        )
        return keyed_result(
            io,
            "fxcache",
            path,
            row_unit="bar",
            bars=len(ts),
            dropped_rows=dg.MetadataValue.json(dropped),
            bytes=path.stat().st_size,
            dtype=io.cfg.fxcache.dtype,
            columns={g: len(names) for g, (names, _) in groups.items()},
            seconds=round(time.perf_counter() - t0, 3),
        )

    return bars, bar_features, ofi_features, fxcache


__all__ = ["make_feature_assets"]
