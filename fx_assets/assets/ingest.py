"""Ingest assets: predecoded sidecars (``predecoded_trades``, ``predecoded_mbp10``) and the
``roll_calendar``.

Sidecars are files, not IO-manager outputs: each asset calls
:func:`fx_assets.core.sidecar.ensure_sidecar`, which reuses a sidecar only while its recorded
source content hash, format version and sampled body checksum still match, and downstream
assets call it again, so a stale or damaged sidecar is never read and a fresh one is never
decoded twice (a concurrent run waits on the sidecar's build lock and reuses it). A raw file
whose DBN schema is not its folder's fails here, naming the file and both schemas.
"""

import time
from typing import Any

import dagster as dg
from pydantic import Field

from fx_assets.assets.common import keyed_result, require_sidecar, start_stage, step_partition
from fx_assets.automation import CHAIN
from fx_assets.core import lineage
from fx_assets.core import roll as roll_core
from fx_assets.core import sidecar as sidecar_core
from fx_assets.core.calendar import previous_quarter, quarter_label, session_label
from fx_assets.core.tables import write_table
from fx_assets.partitions import previous_quarter_mapping
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage

#: The decoder's code version (derived from its code) with the sidecar layout it writes.
SIDECAR_CODE_VERSION = f"sidecar-v{sidecar_core.SIDECAR_FORMAT_VERSION}-{lineage.code_version('predecoded')}"


class DecodeConfig(dg.Config):
    """Decoding a raw DBN archive into its predecoded sidecar."""

    rebuild: bool = Field(False, description="Decode again even if a fresh sidecar exists.")
    chunk_mib: int = Field(
        8, ge=1, le=4096, description="Decompressed bytes per decoding chunk (MiB); bounds peak memory."
    )


def _make_predecoded_asset(name: str, schema: str, raw_asset, partitions_def) -> dg.AssetsDefinition:
    @dg.asset(
        name=name,
        partitions_def=partitions_def,
        automation_condition=CHAIN,
        deps=[raw_asset.key],
        group_name="ingest",
        code_version=SIDECAR_CODE_VERSION,
        kinds={"arrow"},
        description=(
            f"The raw {schema} archive decoded once into an uncompressed Arrow IPC sidecar "
            "(one record batch, memory-mapped with zero copies); rebuilt whenever the source "
            "file or the sidecar format changes."
        ),
    )
    def _asset(
        context: dg.AssetExecutionContext, config: DecodeConfig, storage: FxStorage
    ) -> dg.MaterializeResult:
        part = step_partition(context)
        t0 = time.perf_counter()
        info = require_sidecar(
            storage, schema, part, rebuild=config.rebuild, chunk_bytes=config.chunk_mib << 20
        )
        seconds = time.perf_counter() - t0
        if info.reused:
            action = "reused"
        elif info.reason == "missing":
            action = "decoded"
        else:  # e.g. "rebuilt (checksum mismatch)", "rebuilt (source changed)"
            action = f"rebuilt ({info.reason})"
        if not info.reused:  # a reuse is in the metadata; each log line is one more stored event
            context.log.info(f"{part.label}: {action} {info.n_records:,} {schema} records in {seconds:.2f}s")
        meta: dict[str, Any] = {
            "quarter": quarter_label(part.quarter),
            "path": dg.MetadataValue.path(str(info.path)),
            "records": info.n_records,
            "sidecar_bytes": info.path.stat().st_size,
            "action": action,
            "seconds": round(seconds, 3),
            "source": dg.MetadataValue.path(str(info.source)),
            "source_hash": info.source_hash,
        }
        if not info.reused and seconds > 0:
            meta["records_per_second"] = round(info.n_records / seconds)
        return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(info.identity_hash))

    return _asset


def make_ingest_assets(partitions_def, raw_trades, raw_mbp10) -> tuple:
    predecoded_trades = _make_predecoded_asset("predecoded_trades", "trades", raw_trades, partitions_def)
    predecoded_mbp10 = _make_predecoded_asset("predecoded_mbp10", "mbp-10", raw_mbp10, partitions_def)

    @dg.asset(
        partitions_def=partitions_def,
        automation_condition=CHAIN,
        deps=[dg.AssetDep(predecoded_trades, partition_mapping=previous_quarter_mapping())],
        group_name="ingest",
        code_version=lineage.code_version("roll_calendar"),
        kinds={"arrow"},
        description=(
            "Active outright contract per session (most volume in the previous session, never "
            "back to an earlier expiry; calendar spreads excluded) and the roll dates."
        ),
    )
    def roll_calendar(
        context: dg.AssetExecutionContext, storage: FxStorage, pipeline: PipelineConfig
    ) -> dg.MaterializeResult:
        part, io, hit = start_stage(context, storage, pipeline, "roll_calendar")
        if hit is not None:
            return hit
        info = io.sidecar("trades")
        prev_q = previous_quarter(part.quarter)
        prev = io.sidecar("trades", prev_q) if io.has_raw("trades", prev_q) else None
        cal = roll_core.roll_calendar_from_sidecars(info.path, prev.path if prev else None)
        out = write_table(io.path("roll_calendar"), cal.to_arrow())
        rows = [
            dg.TableRecord(
                {
                    "session": session_label(ev.session_day),
                    "from": ev.from_symbol or "",
                    "to": ev.to_symbol or "",
                }
            )
            for ev in cal.events
        ]
        symbols = sorted({s for s in cal.raw_symbol if s})
        context.log.info(f"{part.label}: {len(cal)} sessions, {len(cal.events)} roll(s)")
        return keyed_result(
            io,
            "roll_calendar",
            out,
            sessions=len(cal),
            rolls=dg.MetadataValue.table(
                rows,
                schema=dg.TableSchema(
                    columns=[
                        dg.TableColumn("session", "string"),
                        dg.TableColumn("from", "string"),
                        dg.TableColumn("to", "string"),
                    ]
                ),
            ),
            contracts=", ".join(symbols),
            seeded_from_previous_quarter=prev is not None,
        )

    return predecoded_trades, predecoded_mbp10, roll_calendar


__all__ = ["DecodeConfig", "make_ingest_assets"]
