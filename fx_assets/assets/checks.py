"""Asset checks of the feature stages: shown in the UI beside each asset and run in the same run
after each materialization (every job and materialization that selects an asset selects its
checks; runs that automation requests take them along too, since they carry no automation
condition of their own).

Every check is blocking: a failure stops the downstream steps of the same run. Automation does
not see checks by itself: ``AutomationCondition.eager()`` requests the downstream partitions of a
failed check; the conditions in :mod:`fx_assets.automation` include its ``BLOCKING_CHECKS_PASSED`` to wait for
them (Dagster's ``all_deps_blocking_checks_passed()`` is not enough here, see there). Each check
locates the partition's files by cache key (:class:`fx_assets.assets.common.StageIO`) and calls
one core function; a core error becomes a failed check whose description names the partition,
the file and the column.

| asset | check | core function |
|---|---|---|
| ``predecoded_trades``, ``predecoded_mbp10`` | ``sidecar_matches_source`` | :func:`fx_assets.core.sidecar.verify_sidecar` |
| ``bars`` | ``volume_conserved`` | :func:`fx_assets.core.verify.verify_bar_volume` |
| ``bar_features`` | ``features_valid`` | :func:`fx_assets.core.verify.verify_bar_features_file` |
| ``ofi_features`` | ``features_valid`` | :func:`fx_assets.core.verify.verify_ofi_features_file` |
| ``ofi_features`` | ``causal_spot_check`` | :func:`fx_assets.core.causality.spot_check_causality` |
| ``fxcache`` | ``fxcache_valid`` | :func:`fx_assets.core.fxcache.verify_fxcache` |
"""

import time
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from fx_assets.assets.common import StageIO, recorded_verdict, verdict_record, volume_check_inputs
from fx_assets.assets.features import warmup_bars
from fx_assets.core import verify
from fx_assets.core.active_contract import roll_calendar_from_table
from fx_assets.core.bars import BarTable
from fx_assets.core.causality import CausalityConfig, StoredQuarter, spot_check_causality
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import verify_fxcache
from fx_assets.core.sidecar import sidecar_path, verify_sidecar
from fx_assets.core.tables import read_table
from fx_assets.core.verified import fxcache_identity, table_identity, verify_against_once, verify_once
from fx_assets.partitions import QuarterSymbol, parse_partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage


class CausalSpotCheckConfig(dg.Config, CausalityConfig):
    """Where the causality spot-check cuts the raw data and how much it recomputes."""


def _result(part: QuarterSymbol, fn: Callable[[], Mapping[str, Any]]) -> dg.AssetCheckResult:
    """Run one core verification: its figures as metadata, or a failed check naming the partition."""
    t0 = time.perf_counter()
    try:
        meta = dict(fn())
    except (FxDataError, dg.Failure) as exc:
        text = exc.description if isinstance(exc, dg.Failure) and exc.description else str(exc)
        if part.label not in text:
            text = f"{part.label}: {text}"
        return dg.AssetCheckResult(passed=False, description=text, metadata={"partition": part.label})
    meta = {"partition": part.label, **meta, "seconds": round(time.perf_counter() - t0, 3)}
    return dg.AssetCheckResult(passed=True, metadata=meta)


def _stage_io(
    context: dg.AssetCheckExecutionContext, storage: FxStorage, pipeline: PipelineConfig
) -> StageIO:
    return StageIO(storage, pipeline, parse_partition_key(context.partition_key))


class SidecarCheckConfig(dg.Config):
    """When ``sidecar_matches_source`` hashes the raw file and the sidecar again."""

    rehash: bool = Field(
        False,
        description="Hash the whole raw file and every sidecar column even when a passed full "
        "check of the same two files (stat stamps unchanged, same package source) is recorded: "
        "for a change that keeps size, mtime, ctime and inode (a raw block-device write, media "
        "decay on a filesystem that does not checksum its blocks).",
    )


def _sidecar_check(asset: dg.AssetsDefinition, schema: str, partitions_def) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset,
        name="sidecar_matches_source",
        partitions_def=partitions_def,
        blocking=True,
        description=f"The {schema} sidecar was decoded from the raw file as it is now (its whole "
        "content hashed) and every column matches the checksum written with it; hashed again "
        "whenever either file's stat stamp moved since the last full check that passed (or with "
        "config rehash: true).",
    )
    def _check(
        context: dg.AssetCheckExecutionContext, config: SidecarCheckConfig, storage: FxStorage
    ) -> dg.AssetCheckResult:
        part = parse_partition_key(context.partition_key)
        source = storage.raw_file(schema, part.symbol, part.quarter)
        # The sidecar's own path, not ensure_sidecar: a check must not rebuild what it checks.
        path = sidecar_path(source, storage.layout.sidecar_dir(schema, part.symbol))

        def run() -> dict[str, Any]:
            if not (path.is_file() and source.is_file()):
                verify_sidecar(path, source)  # fails, naming the missing file
            # Both files in full (seconds for a scale-1 quarter), once per pair of stat stamps:
            # the trust that stage tables and the raw files' identities already rest on
            # (fx_assets.core.verified); a changed byte moves the stamp and hashes again.
            ran = verify_against_once(
                path,
                source,
                "sidecar_matches_source",
                lambda p: verify_sidecar(p, source),
                force=config.rehash,
            )
            return {
                "path": dg.MetadataValue.path(str(path)),
                "bytes": path.stat().st_size,
                "verdict": "evaluated" if ran else "reused",
            }

        return _result(part, run)

    return _check


def make_asset_checks(
    partitions_def: dg.PartitionsDefinition,
    predecoded_trades: dg.AssetsDefinition,
    predecoded_mbp10: dg.AssetsDefinition,
    bars: dg.AssetsDefinition,
    bar_features: dg.AssetsDefinition,
    ofi_features: dg.AssetsDefinition,
    fxcache: dg.AssetsDefinition,
) -> list[dg.AssetChecksDefinition]:
    """The blocking checks of the per-partition stages (one list for ``dg.Definitions``)."""

    @dg.asset_check(
        asset=bars,
        name="volume_conserved",
        partitions_def=partitions_def,
        blocking=True,
        description="Sum of bar volume (and of n_trades) equals the volume (count) of the "
        "active-contract trades of the quarter, in every session.",
    )
    def bars_volume_conserved(
        context: dg.AssetCheckExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.AssetCheckResult:
        io = _stage_io(context, storage, pipeline)

        def run() -> Mapping[str, Any]:
            bars, cal, trades = io.require("bars"), io.require("roll_calendar"), io.sidecar("trades")
            return recorded_verdict(
                bars,
                "volume_conserved",
                volume_check_inputs(io),
                lambda: verify.verify_bar_volume(bars, trades.path, cal, partition=io.part.label),
            )

        return _result(io.part, run)

    @dg.asset_check(
        asset=bar_features,
        name="features_valid",
        partitions_def=partitions_def,
        blocking=True,
        description="Every registry feature finite outside its documented warm-up, inside its "
        "bounds, one row per bar (registry: fx_assets.core.bar_features).",
    )
    def bar_features_valid(
        context: dg.AssetCheckExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.AssetCheckResult:
        io = _stage_io(context, storage, pipeline)

        def run() -> Mapping[str, Any]:
            path, bars = io.require("bar_features"), io.require("bars")
            return recorded_verdict(
                path,
                "features_valid",
                [table_identity(path), table_identity(bars)],
                lambda: verify.verify_bar_features_file(path, partition=io.part.label, bars_path=bars),
            )

        return _result(io.part, run)

    @dg.asset_check(
        asset=ofi_features,
        name="features_valid",
        partitions_def=partitions_def,
        blocking=True,
        description="No ±inf, NaN only in a reset segment's leading warm-up, inside the bounds, "
        "book events present, OFI not all zero, one row per bar (registry: fx_assets.core.ofi).",
    )
    def ofi_features_valid(
        context: dg.AssetCheckExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.AssetCheckResult:
        io = _stage_io(context, storage, pipeline)

        def run() -> Mapping[str, Any]:
            path, bars = io.require("ofi_features"), io.require("bars")
            return recorded_verdict(
                path,
                "features_valid",
                [table_identity(path), table_identity(bars)],
                lambda: verify.verify_ofi_features_file(path, partition=io.part.label, bars_path=bars),
            )

        return _result(io.part, run)

    @dg.asset_check(
        asset=ofi_features,
        name="causal_spot_check",
        partitions_def=partitions_def,
        blocking=True,
        additional_deps=[bars, bar_features],
        description="Cut the partition's raw data at a bar close T (drawn per partition), rebuild "
        "the bars, bar features and OFI features just before T from what is left and compare "
        "with the stored values: nothing after T may change them.",
    )
    def causal_spot_check(
        context: dg.AssetCheckExecutionContext,
        config: CausalSpotCheckConfig,
        storage: FxStorage,
        pipeline: PipelineConfig,
    ) -> dg.AssetCheckResult:
        io = _stage_io(context, storage, pipeline)

        cfg = CausalityConfig.model_validate(config.model_dump())

        def spot_check() -> dict[str, Any]:
            bars_path = io.require("bars")
            stored = StoredQuarter(
                partition=io.part.label,
                trades_sidecar=io.sidecar("trades").path,
                book_sidecar=io.sidecar("mbp-10").path,
                calendar=roll_calendar_from_table(read_table(io.require("roll_calendar"))),
                bars=BarTable.from_arrow(read_table(bars_path), str(bars_path)),
                bar_features=read_table(io.require("bar_features")),
                ofi=read_table(io.require("ofi_features")),
                bar_config=io.cfg.bars,
                bar_feature_config=io.cfg.bar_features,
                ofi_config=io.cfg.ofi,
                previous_bars=lambda _n: warmup_bars(io),
            )
            r = spot_check_causality(stored, cfg)
            if r.skipped:
                raise _Skipped(r.skipped)
            return {
                "bar": r.bar,
                "cut_ts_recv": r.ts_cut,
                "session": r.session,
                "bars_compared": r.bars_compared,
                "ofi_bars_compared": r.ofi_rows,
                "trades_records_read": r.trades_records,
                "book_records_read": r.book_records,
                "max_rel_diff_bar_features": r.max_rel_diff_bar_features,
                "max_rel_diff_ofi": r.max_rel_diff_ofi,
            }

        def run() -> Mapping[str, Any]:
            ofi = io.require("ofi_features")
            inputs = [
                cfg.model_dump_json(),
                io.sidecar("trades").identity_hash,
                io.sidecar("mbp-10").identity_hash,
                *(table_identity(io.require(s)) for s in ("roll_calendar", "bars", "bar_features")),
                table_identity(ofi),
                # the bars before the quarter that warm its features up (as the key lists them)
                *(table_identity(io.require("bars", q)) for q in io.bar_features_warmup()),
            ]
            return recorded_verdict(ofi, "causal_spot_check", inputs, spot_check)

        try:
            return _result(io.part, run)
        except _Skipped as why:
            # Not checkable (a quarter shorter than the OFI warm-up): a warning, not a block.
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                description=f"{io.part.label}: not checked: {why}",
                metadata={"partition": io.part.label},
            )

    @dg.asset_check(
        asset=fxcache,
        name="fxcache_valid",
        partitions_def=partitions_def,
        blocking=True,
        description="Header, schema hash, body checksums, ordered timestamps, finite values, OFI "
        "present and not all zero (docs/fxcache.md).",
    )
    def fxcache_valid(
        context: dg.AssetCheckExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.AssetCheckResult:
        io = _stage_io(context, storage, pipeline)

        def run() -> Mapping[str, Any]:
            path = io.require("fxcache")

            def evaluate() -> dict[str, Any]:
                verify_once(path, "fxcache", verify_fxcache)  # bytes, order, finite values, OFI
                return {"path": dg.MetadataValue.path(str(path)), "bytes": path.stat().st_size}

            return recorded_verdict(path, "fxcache_valid", [fxcache_identity(path)], evaluate)

        return _result(io.part, run)

    return [
        _sidecar_check(predecoded_trades, "trades", partitions_def),
        _sidecar_check(predecoded_mbp10, "mbp-10", partitions_def),
        bars_volume_conserved,
        bar_features_valid,
        ofi_features_valid,
        causal_spot_check,
        fxcache_valid,
    ]


class _Skipped(Exception):
    """The causality spot-check found no bar it can check in this partition."""


__all__ = [
    "CausalSpotCheckConfig",
    "SidecarCheckConfig",
    "make_asset_checks",
    "recorded_verdict",
    "verdict_record",
]
