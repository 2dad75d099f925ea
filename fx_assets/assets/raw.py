"""Raw Databento archives as observable source assets (``raw_trades``, ``raw_mbp10``).

Observing reports one data version per (quarter, symbol) partition from the file's identity
(path, size, hash of the whole content: the one the cache keys and the sidecar use), so when a
quarter's file is replaced the UI shows everything downstream of it as unsynced. The content
hash comes from the stat record beside the sidecars and is recomputed only when the stat moved.
"""

import dataclasses
import hashlib
from pathlib import Path

import dagster as dg

from fx_assets.core.cachekey import SourceIdentity, canonical_json
from fx_assets.partitions import parse_partition_key
from fx_assets.resources.storage import FxStorage


def file_identity(path: Path, record_dir: Path | None = None) -> str:
    """A short, stable version string of a file: the hash of the same identity the cache keys
    use (resolved path, size, XXH3-128 of the whole content). With ``record_dir`` (the file's
    sidecar folder) the content hash is recorded there and reused while the stat is unchanged."""
    ident = SourceIdentity.from_path(path, record_dir=record_dir)
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
                record_dir = storage.layout.sidecar_dir(schema, part.symbol)
                versions[str(key)] = dg.DataVersion(file_identity(path, record_dir))
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
