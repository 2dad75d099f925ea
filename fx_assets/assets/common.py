"""Helpers shared by the asset modules: keyed stage paths, upstream lookups and metadata tables.

A stage's output path carries its cache key (:mod:`fx_assets.core.lineage`), computed from the
pipeline configs and the identities of the raw files it was built from. A downstream asset
computes the key of the upstream file it needs the same way, so it can only ever open the file
built from today's sources and parameters — never a stale one; if that file does not exist it
fails with a message naming the partition and the asset to materialize.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pyarrow as pa

from fx_assets.core import lineage
from fx_assets.core.atomic import atomic_write_text
from fx_assets.core.cachekey import SourceIdentity
from fx_assets.core.calendar import quarter_label
from fx_assets.core.checksum import hash_buffers
from fx_assets.core.codeversion import package_fingerprint
from fx_assets.core.errors import FxDataError
from fx_assets.core.locks import build_lock
from fx_assets.core.page_release import release_free_heap
from fx_assets.core.sidecar import DEFAULT_CHUNK_BYTES, SidecarInfo, ensure_sidecar
from fx_assets.core.verified import table_identity, verify_once
from fx_assets.partitions import QuarterSymbol, context_partition
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage

STAGE_SUFFIX = {
    "roll_calendar": "arrow",
    "bars": "arrow",
    "bar_features": "arrow",
    "ofi_features": "arrow",
    "fxcache": "fxcache",
}


#: build locks this process holds, by output path (flock conflicts even within one process)
_HELD: dict[Path, contextlib.ExitStack] = {}

#: the run whose first partition step released the free heap in this process
_HEAP_RUN: list[str] = [""]


def step_partition(context: dg.AssetExecutionContext) -> QuarterSymbol:
    """The step's partition. The first such step of each run in this process first hands back the
    free heap that earlier runs left (:func:`fx_assets.core.page_release.release_free_heap`):
    several partitions run in one process (an ``execute_in_process`` loop) then each peak as one
    alone. Once per run, before its work, so no step pays for faulting freed pages back in."""
    if context.run_id != _HEAP_RUN[0]:
        _HEAP_RUN[0] = context.run_id
        release_free_heap()
    return context_partition(context)


def name_now(resolve: Callable[[], Path]) -> str:
    """The name of the file ``resolve`` gives for the sources as they are now, or why there is
    none (e.g. the new sources' inputs are not built yet): what a step compares with the file
    it built before recording it (:meth:`StageIO.check_current`, the fold ranges, a fold's
    quarters)."""
    try:
        return resolve().name
    except (dg.Failure, FxDataError) as exc:
        return str(exc)


class StageIO:
    """Paths and keys of one (quarter, symbol) partition's stage files."""

    def __init__(self, storage: FxStorage, pipeline: PipelineConfig, part: QuarterSymbol) -> None:
        self.storage = storage
        self.pipeline = pipeline
        self.layout = storage.layout
        self.cfg = pipeline.stage_configs()
        self.part = part
        self._idents: dict[tuple[str, dt.date], SourceIdentity | None] = {}
        self._bar_counts: dict[dt.date, int] = {}
        self._keys: dict[tuple[str, dt.date], str] = {}
        self.rebuild_reason = ""  # why cached_result refused an existing file
        self._lock: contextlib.ExitStack | None = None

    # build lock ----------------------------------------------------------------------------
    def lock(self, stage: str) -> None:
        """Hold the build lock of this partition's ``stage`` file until :meth:`unlock` or until
        this object is garbage collected (when the asset returns or fails): the kernel drops
        the lock when its file is closed, and at the latest when the process ends."""
        self.unlock()
        path = self.path(stage)
        stale = _HELD.pop(path, None)
        if stale is not None:  # a failed earlier attempt in this process still holds it
            stale.close()
        stack = contextlib.ExitStack()
        stack.enter_context(build_lock(path))
        self._lock = _HELD[path] = stack
        weakref.finalize(self, stack.close)

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # raw sources -------------------------------------------------------------------------
    def raw(self, schema: str, quarter: dt.date | None = None) -> Path:
        return self.layout.raw_file(schema, self.part.symbol, quarter or self.part.quarter)

    def identity(self, schema: str, quarter: dt.date) -> SourceIdentity | None:
        """The raw file's identity (content hash from the record beside its sidecars, hashed
        only when its stat changed), or None when the quarter has no file."""
        k = (schema, quarter)
        if k not in self._idents:
            p = self.raw(schema, quarter)
            record_dir = self.layout.sidecar_dir(schema, self.part.symbol)
            try:
                self._idents[k] = SourceIdentity.from_path(p, record_dir=record_dir) if p.is_file() else None
            except FxDataError as exc:
                raise dg.Failure(f"{quarter_label(quarter)}|{self.part.symbol}: {exc}") from exc
        return self._idents[k]

    def has_raw(self, schema: str, quarter: dt.date) -> bool:
        return self.identity(schema, quarter) is not None

    def sidecar(self, schema: str, quarter: dt.date | None = None) -> SidecarInfo:
        q = quarter or self.part.quarter
        info = require_sidecar(self.storage, schema, QuarterSymbol(q, self.part.symbol))
        ident = self.identity(schema, q)
        if ident is not None and info.source_hash != ident.content_hash:
            # the keys of this run name the content hashed earlier: never build them from other data
            raise dg.Failure(
                f"{quarter_label(q)}|{self.part.symbol}: raw {schema} file {info.source} changed during "
                f"the run (content hash {ident.content_hash} when the keys were computed, "
                f"{info.source_hash} now); run it again"
            )
        return info

    # keyed stage files -------------------------------------------------------------------
    def key(self, stage: str, quarter: dt.date | None = None) -> str:
        q = quarter or self.part.quarter
        # A key is a function of this object's cached source identities, bar counts and config:
        # computed once (a stage asks for its inputs' keys several times, and each chains the
        # keys upstream of it).
        k = (stage, q)
        if k not in self._keys:
            self._keys[k] = self._key(stage, q)
        return self._keys[k]

    def _key(self, stage: str, q: dt.date) -> str:
        lookup = self.identity
        if stage == "roll_calendar":
            return lineage.roll_calendar_key(lookup, q)
        if stage == "bars":
            return lineage.bars_key(self.cfg, lookup, q)
        if stage == "bar_features":
            return lineage.bar_features_key(self.cfg, lookup, q, self.bar_count)
        if stage == "ofi_features":
            return lineage.ofi_features_key(self.cfg, lookup, q)
        if stage == "fxcache":
            return lineage.fxcache_key(self.cfg, lookup, q, self.bar_count)
        raise KeyError(f"unknown stage {stage!r}")

    def bar_count(self, quarter: dt.date) -> int:
        """Bars in the quarter's bars file for the current sources and config (a Failure naming
        the asset to materialize when it is missing): the warm-up plan depends on it."""
        if quarter not in self._bar_counts:
            from fx_assets.core.tables import read_table

            self._bar_counts[quarter] = read_table(self.require("bars", quarter)).num_rows
        return self._bar_counts[quarter]

    def bar_features_warmup(self) -> tuple[dt.date, ...]:
        """The quarters whose bars warm up this partition's bar features (as its key lists)."""
        return lineage.bar_features_warmup(self.cfg, self.identity, self.bar_count, self.part.quarter)

    def ofi_warmup_quarter(self) -> dt.date | None:
        """The quarter whose tail warms up this partition's OFI (as its key lists)."""
        return lineage.ofi_warmup_quarter(self.identity, self.part.quarter)

    def path(self, stage: str, quarter: dt.date | None = None) -> Path:
        q = quarter or self.part.quarter
        return self.layout.stage_file(stage, self.part.symbol, q, self.key(stage, q), STAGE_SUFFIX[stage])

    def current_name(self, stage: str) -> str:
        """The name of this partition's ``stage`` file for the sources as they are now (read
        afresh, not from this object's cache), or why there is none."""
        return name_now(lambda: StageIO(self.storage, self.pipeline, self.part).path(stage))

    def check_current(self, stage: str) -> None:
        """A Failure if this partition's ``stage`` file for the sources as they are now is not
        the one this object resolved (its keys name the raw files' contents hashed when the step
        started): a result of sources that changed while it ran, recorded, would stand as up to
        date for good, because automation's trigger resets on the stage's own materialization."""
        now = self.current_name(stage)
        if now != self.path(stage).name:
            raise dg.Failure(
                f"{self.part.label}: its raw data changed while {stage} was built (the file for the "
                f"sources now: {now}); the result is of the old data and is not recorded; run it again"
            )

    def require(self, stage: str, quarter: dt.date | None = None) -> Path:
        """The stage file built from today's sources and config, or a Failure saying what to run."""
        q = quarter or self.part.quarter
        p = self.path(stage, q)
        if not p.is_file():
            raise dg.Failure(
                f"{quarter_label(q)}|{self.part.symbol}: no {stage} file for the current sources and "
                f"config ({p.name}); materialize {stage}[{quarter_label(q)}|{self.part.symbol}] first"
            )
        return p


def require_sidecar(
    storage: FxStorage,
    schema: str,
    part: QuarterSymbol,
    *,
    rebuild: bool = False,
    chunk_bytes: int | None = None,
) -> SidecarInfo:
    """The fresh sidecar of a partition's raw file, decoded now if missing or stale (a second
    consumer in the same run reuses it). Fails naming the partition and path if the raw file is
    absent."""
    src = storage.raw_file(schema, part.symbol, part.quarter)
    if not src.is_file():
        raise dg.Failure(
            f"{part.label}: raw {schema} file {src} does not exist",
            metadata={"expected_path": dg.MetadataValue.path(str(src))},
        )
    try:
        return ensure_sidecar(
            src,
            storage.layout.sidecar_dir(schema, part.symbol),
            rebuild=rebuild,
            chunk_bytes=DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes,
            expect_schema=schema,  # the folder says what the file must hold
            code_version=lineage.code_version("predecoded"),  # a decoder change rebuilds
        )
    except FxDataError as exc:
        raise dg.Failure(f"{part.label}: {exc}", metadata={"path": dg.MetadataValue.path(str(src))}) from exc


def summary_table(columns: Mapping[str, np.ndarray]) -> dg.MetadataValue:
    """min / mean / max / NaN count per column, as a metadata table."""
    rows = []
    for name, v in columns.items():
        a = np.asarray(v, dtype=np.float64)
        fin = a[np.isfinite(a)]
        rows.append(
            dg.TableRecord(
                {
                    "column": name,
                    "min": float(fin.min()) if fin.size else float("nan"),
                    "mean": float(fin.mean()) if fin.size else float("nan"),
                    "max": float(fin.max()) if fin.size else float("nan"),
                    "nan": int(np.isnan(a).sum()),
                }
            )
        )
    return dg.MetadataValue.table(
        rows,
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("column", "string"),
                dg.TableColumn("min", "float"),
                dg.TableColumn("mean", "float"),
                dg.TableColumn("max", "float"),
                dg.TableColumn("nan", "int"),
            ]
        ),
    )


def keyed_result(io: StageIO, stage: str, path: Path, **metadata: object) -> dg.MaterializeResult:
    """A materialization of the ``stage`` file ``path`` just built, whose data version is its
    cache key (so config changes show as unsynced); a Failure if the sources changed while it
    was built (:meth:`StageIO.check_current`).

    The metadata is also stored beside the output (:func:`save_build_metadata`), so that a later
    cache hit of the same file reports the same tables, counts and pictures."""
    key_hex, part = io.key(stage), io.part
    meta: dict[str, Any] = {
        "quarter": quarter_label(part.quarter),
        "path": dg.MetadataValue.path(str(path)),
        "cache_key": key_hex[:16],
        "action": "built",
        **metadata,
    }
    save_build_metadata(path, meta)  # the file is a complete cache entry of its own key
    io.check_current(stage)
    return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(key_hex[:24]))


def metadata_sidecar(output: Path) -> Path:
    """Where the metadata of the build that wrote ``output`` is kept: ``<output>.meta.json``."""
    return output.with_name(output.name + ".meta.json")


def save_build_metadata(output: Path, metadata: Mapping[str, Any]) -> Path:
    """Store a build's metadata (Dagster metadata values, serialised with Dagster's serdes) beside
    its output, atomically; written after the output, so a sidecar never describes a missing file.
    Stored as [key, value] pairs: serdes sorts dict keys, and the UI shows entries in order."""
    pairs = [[k, v] for k, v in metadata.items()]
    return atomic_write_text(metadata_sidecar(output), dg.serialize_value(pairs))


def load_build_metadata(output: Path) -> dict[str, Any] | None:
    """The metadata stored by the build of ``output``; None if there is none or it is unreadable
    (the caller then treats the output as not cached and rebuilds it, with its metadata)."""
    side = metadata_sidecar(output)
    try:
        pairs: Any = dg.deserialize_value(side.read_text())
        return {str(k): v for k, v in pairs}
    except FileNotFoundError:
        return None
    except Exception as exc:  # a torn or foreign file: rebuilding is always correct
        dg.get_dagster_logger().warning(f"{side}: unreadable build metadata, rebuilding ({exc})")
        return None


def reused_result(key_hex: str, metadata: Mapping[str, Any]) -> dg.MaterializeResult:
    """The materialization of a cache hit: the build's own metadata, marked ``action: reused``."""
    return dg.MaterializeResult(
        metadata={**metadata, "action": "reused"}, data_version=dg.DataVersion(key_hex[:24])
    )


def cached_result(io: StageIO, stage: str) -> dg.MaterializeResult | None:
    """A materialization of the existing keyed file, if it is there and valid (a cache hit).

    The key covers every input and parameter, so an existing file is exactly what this run
    would write; it is verified against the checksum written with it (stage tables in full:
    :func:`fx_assets.core.tables.verify_table`; fxcache by its own validation) before it is
    trusted, unless a passed verification of the file with the same stat stamp (size, mtime,
    ctime, inode) is recorded beside it (:mod:`fx_assets.core.verified`: any write or
    replacement moves the stamp). A file that fails is rebuilt (``io.rebuild_reason`` says why) and replaced in
    place by the new one; it is never deleted first, so a concurrent reader never sees it
    missing.
    """
    path = io.path(stage)
    if not path.is_file():
        return None
    try:
        # In full, remembered with the file's stat stamp (in this process and beside the file):
        # the stage's asset check in the same run, and later runs, read the unchanged file
        # without verifying it again (fx_assets.core.verified).
        if stage == "fxcache":
            from fx_assets.core.verified import verify_fxcache_bytes

            # every byte against its checksum; the values were checked finite when written,
            # and fxcache_valid checks them (a verdict on these very bytes)
            verify_once(path, "fxcache-bytes", verify_fxcache_bytes)
        else:
            from fx_assets.core.tables import verify_table

            verify_once(path, "table", verify_table)
    except (FxDataError, OSError, pa.ArrowInvalid) as exc:
        # Not a valid cache entry (damaged, written by a crashed tool, or a format bump): rebuild.
        io.rebuild_reason = "checksum mismatch" if "checksum" in str(exc) else "invalid file"
        dg.get_dagster_logger().warning(f"{path}: {io.rebuild_reason}, rebuilding ({exc})")
        return None
    built = load_build_metadata(path)
    if built is None:
        return None  # no record of the build that wrote it: rebuild, which records one
    # no log line: the materialization says it (action: reused), and each is one more stored event
    io.check_current(stage)
    return reused_result(io.key(stage), built)


def start_stage(
    context: dg.AssetExecutionContext, storage: FxStorage, pipeline: PipelineConfig, stage: str
) -> tuple[QuarterSymbol, StageIO, dg.MaterializeResult | None]:
    """The partition, its stage paths, and the materialization of a cache hit (None: build it)."""
    part = step_partition(context)
    io = StageIO(storage, pipeline, part)
    io.lock(stage)  # a concurrent run of the same stage file waits here, then reuses it
    hit = cached_result(io, stage)
    if hit is not None:
        io.unlock()
    elif io.rebuild_reason:
        context.add_asset_metadata({"action": f"rebuilt ({io.rebuild_reason})"})
    return part, io, hit


def verdict_record(output: Path, check: str) -> Path:
    """Where the last passed evaluation of ``check`` on ``output`` is recorded."""
    return output.with_name(f"{output.name}.check.{check}.json")


def recorded_verdict(
    output: Path, check: str, inputs: Sequence[str], evaluate: Callable[[], Mapping[str, Any]]
) -> Mapping[str, Any]:
    """``evaluate()`` (a check that raises on failure), unless a passed evaluation of the same
    check on inputs with the same content identities, by the same package source, is recorded
    beside ``output``: then its figures, marked ``verdict: reused``.

    ``inputs`` are content identities taken in this process: stage tables verified in full
    (:func:`fx_assets.core.verified.table_identity`), sidecars as their reuse check admits them
    (source content hash and decoder identity; the sidecar's own blocking check hashes every
    column again whenever the sidecar's or the raw file's stat stamp moved). The checks are deterministic functions of those bytes,
    the package source and the inputs' configs (in the file names' cache keys), so the same
    identities give the same verdict; any code change anywhere in the package re-evaluates. A
    failed evaluation records nothing.
    """
    fingerprint = hash_buffers([json.dumps([check, package_fingerprint(), *inputs]).encode()])
    record = verdict_record(output, check)
    try:
        doc = json.loads(record.read_text())
        if doc.get("fingerprint") == fingerprint:
            pairs: Any = dg.deserialize_value(doc["metadata"])
            return {**{str(k): v for k, v in pairs}, "verdict": "reused"}
    except FileNotFoundError:
        pass
    except Exception as exc:  # a torn or foreign record: evaluating again is always correct
        dg.get_dagster_logger().warning(f"{record}: unreadable check record, evaluating ({exc})")
    figures = dict(evaluate())
    text = dg.serialize_value([[k, v] for k, v in figures.items()])
    atomic_write_text(record, json.dumps({"check": check, "fingerprint": fingerprint, "metadata": text}))
    return {**figures, "verdict": "evaluated"}


def volume_check_inputs(io: StageIO) -> list[str]:
    """What the ``volume_conserved`` verdict depends on: the bars and roll calendar tables (verified
    in full here) and the trades sidecar (as its reuse check admits it)."""
    return [
        table_identity(io.require("bars")),
        table_identity(io.require("roll_calendar")),
        io.sidecar("trades").identity_hash,
    ]
