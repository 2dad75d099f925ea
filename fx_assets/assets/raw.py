"""Raw Databento archives as observable source assets (``raw_trades``, ``raw_mbp10``).

Observing reports one data version per (quarter, symbol) partition from :func:`file_identity`
(path, size, XXH3-128 of the whole content: the identity the cache keys and the sidecar use; the
hash is recorded beside the sidecars and recomputed only when the stat moved), so when a quarter's file is replaced the UI shows everything downstream of it as unsynced and
declarative automation rebuilds exactly that partition's chain (only a *changed* data version
counts as an update).

A partition is reported only when **both** of its files (trades and MBP-10) exist and are
**stable**: their size, mtime, ctime and inode equal what the previous observation of the same asset saw.
A file still being written therefore changes between observations and is not picked up; it
is reported at the first observation after it stopped changing. Each asset keeps what it saw
(and the identity it computed, so unchanged files are not hashed again) in its own small JSON
file under ``derived/observed/``; ``raw_files_sensor`` observes again after every change of
the raw folders, and once more to confirm, so a dropped quarter needs no other action.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import dagster as dg

from fx_assets.core.atomic import atomic_write_text
from fx_assets.core.cachekey import SourceIdentity, canonical_json
from fx_assets.core.source_hash import stat_stamp
from fx_assets.partitions import parse_partition_key
from fx_assets.resources.storage import FxStorage

SCHEMAS = ("trades", "mbp-10")


def file_identity(path: Path, record_dir: Path | None = None) -> str:
    """A short, stable version string of a file: the hash of the same identity the cache keys
    use (resolved path, size, XXH3-128 of the whole content). With ``record_dir`` (the file's
    sidecar folder) the content hash is recorded there and reused while the stat is unchanged."""
    ident = SourceIdentity.from_path(path, record_dir=record_dir)
    return hashlib.sha256(canonical_json(dataclasses.asdict(ident)).encode()).hexdigest()[:20]


def _stat(path: Path) -> dict[str, int] | None:
    """The stat fields that move when a file is written or replaced (size, mtime, ctime, inode:
    a same-size, same-mtime re-download still moves ctime and inode), or None when absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return stat_stamp(st)


def observation_state_file(storage: FxStorage, asset_name: str) -> Path:
    return storage.layout.root / "derived" / "observed" / f"{asset_name}.json"


@dataclasses.dataclass(frozen=True)
class RawObservation:
    """What one observation of a raw asset found."""

    versions: dict[str, str]  # partition key -> data version (stable partitions only)
    pending: list[str]  # labels: a file appeared or changed since the last observation
    incomplete: list[str]  # labels: only one of the two schemas is there
    state: dict[str, dict]  # what to remember for the next observation


def observe_raw_files(
    storage: FxStorage, schema: str, keys: list, previous: dict[str, dict]
) -> RawObservation:
    """Versions of ``schema``'s files for the partitions ``keys`` (pure apart from file stats
    and hashing; ``previous`` is the state the last observation returned)."""
    versions: dict[str, str] = {}
    pending: list[str] = []
    incomplete: list[str] = []
    state: dict[str, dict] = {}
    for key in keys:
        part = parse_partition_key(key)
        stats = {s: _stat(storage.raw_file(s, part.symbol, part.quarter)) for s in SCHEMAS}
        if all(v is None for v in stats.values()):
            continue
        if any(v is None for v in stats.values()):
            incomplete.append(part.label)
        k = str(key)
        before = previous.get(k, {})
        entry: dict = {"stats": stats}
        if all(v is not None for v in stats.values()) and before.get("stats") == stats:
            same = before.get("version") and before.get("version_of") == stats[schema]
            version = (
                before["version"]
                if same
                else file_identity(
                    storage.raw_file(schema, part.symbol, part.quarter),
                    storage.layout.sidecar_dir(schema, part.symbol),  # hash recorded per stat
                )
            )
            versions[k] = version
            entry.update(version=version, version_of=stats[schema])
        elif all(v is not None for v in stats.values()):
            pending.append(part.label)
        state[k] = entry
    return RawObservation(versions, pending, incomplete, state)


def _make_raw_asset(name: str, schema: str, description: str, partitions_def: dg.PartitionsDefinition):
    @dg.observable_source_asset(
        name=name,
        partitions_def=partitions_def,
        group_name="raw",
        description=description,
        metadata={"schema": schema, "layout": f"raw/{schema}/SYMBOL/SYMBOL_YYYY-Qn.dbn.zst"},
    )
    def _observe(context: dg.AssetExecutionContext, storage: FxStorage) -> dg.DataVersionsByPartition:
        state_file = observation_state_file(storage, name)
        try:
            previous = json.loads(state_file.read_text())
        except FileNotFoundError:
            previous = {}
        except ValueError:
            context.log.warning(f"{state_file}: unreadable observation state, starting afresh")
            previous = {}
        keys = partitions_def.get_partition_keys(dynamic_partitions_store=context.instance)
        obs = observe_raw_files(storage, schema, list(keys), previous)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(state_file, json.dumps(obs.state, sort_keys=True))
        if obs.pending:
            context.log.info(
                f"{name}: new or changing files for {', '.join(obs.pending)}: reported once they "
                "are unchanged at the next observation"
            )
        if obs.incomplete:
            context.log.info(
                f"{name}: only one schema present for {', '.join(obs.incomplete)}: not reported yet"
            )
        context.log.info(f"{name}: {len(obs.versions)} partition(s) with stable trades and MBP-10 files")
        return dg.DataVersionsByPartition({k: dg.DataVersion(v) for k, v in obs.versions.items()})

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
