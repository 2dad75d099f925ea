"""Raw Databento archives as observable source assets (``raw_trades``, ``raw_mbp10``).

Observing reports one data version per (quarter, symbol) partition from the file's identity
(path, size, mtime_ns), so when a quarter's file is replaced the UI shows everything
downstream of it as unsynced.
"""

import dataclasses
import hashlib
from pathlib import Path

import dagster as dg

from fx_assets.core.cachekey import SourceIdentity, canonical_json
from fx_assets.partitions import parse_partition_key
from fx_assets.resources.storage import FxStorage


def file_identity(path: Path) -> str:
    """A short, stable version string of a file: the hash of the same identity the cache keys
    use (resolved path, size, mtime_ns, hash of the first 64 KiB)."""
    ident = SourceIdentity.from_path(path)
    return hashlib.sha256(canonical_json(dataclasses.asdict(ident)).encode()).hexdigest()[:20]


def _make_raw_asset(name: str, schema: str, description: str, partitions_def: dg.PartitionsDefinition):
    @dg.observable_source_asset(
        name=name,
        partitions_def=partitions_def,
        group_name="raw",
        description=description,
        metadata={"schema": schema, "layout": f"raw/{schema}/SYMBOL/SYMBOL_YYYY-Qn.dbn.zst"},
    )
    def _observe(context: dg.AssetExecutionContext, storage: FxStorage) -> dg.DataVersionsByPartition:
        versions: dict[str, dg.DataVersion] = {}
        missing: list[str] = []
        for key in partitions_def.get_partition_keys(dynamic_partitions_store=context.instance):
            part = parse_partition_key(key)
            path = storage.raw_file(schema, part.symbol, part.quarter)
            if path.is_file():
                versions[str(key)] = dg.DataVersion(file_identity(path))
            else:
                missing.append(part.label)
        if missing:
            context.log.info(
                f"{name}: no file yet for {len(missing)} partition(s): {', '.join(missing[:12])}"
            )
        return dg.DataVersionsByPartition(versions)

    return _observe


def make_raw_assets(partitions_def: dg.PartitionsDefinition) -> tuple:
    raw_trades = _make_raw_asset(
        "raw_trades",
        "trades",
        "Databento trades archive (.dbn.zst), one file per quarter and symbol.",
        partitions_def,
    )
    raw_mbp10 = _make_raw_asset(
        "raw_mbp10",
        "mbp-10",
        "Databento MBP-10 order-book archive (.dbn.zst), one file per quarter and symbol.",
        partitions_def,
    )
    return raw_trades, raw_mbp10
