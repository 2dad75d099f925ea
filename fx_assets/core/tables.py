"""Arrow IPC stage tables (roll calendar, bars, bar and OFI features): written atomically with a
checksum of their bodies, verified whenever a later run reuses them.

Each table is one uncompressed record batch. ``fx.checksums`` in the schema metadata maps every
column to the XXH3-128 (:mod:`fx_assets.core.checksum`) of its name, type and logical content
(validity bits, values, string offsets and bytes), taken from the table being written, so the
digest does not depend on buffer capacity or padding. :func:`verify_table` recomputes it in full:
a stage table is at most a few hundred MB, hashed at memory speed (~10-50 ms per scale-1 file;
see ``benchmarks/bench_integrity.py``), so every reuse is fully verified.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from fx_assets.core.atomic import atomic_path
from fx_assets.core.checksum import digest_of, new_hasher, update_array
from fx_assets.core.errors import FxCacheError, FxDataError

__all__ = [
    "array_of",
    "dates_of",
    "empty_array",
    "numpy_of",
    "py_dates",
    "py_strings",
    "read_table",
    "stored_checksums",
    "strings_of",
    "table_checksums",
    "verify_table",
    "write_table",
]

_KEY = b"fx.checksums"
_EPOCH = dt.date(1970, 1, 1)


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")[offset : offset + n].view(
        np.bool_
    )


def _bool_values(arr: pa.Array) -> np.ndarray:
    """A boolean array's values as numpy bools, nulls as False (``fill_null(False)``)."""
    validity, data = arr.buffers()[:2]
    values = _bits(data, arr.offset, len(arr))
    if arr.null_count and validity is not None:
        values = values & _bits(validity, arr.offset, len(arr))
    return values


def array_of(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A null-free Arrow array of a 1-D numpy array of fixed-width numbers or bools (no copy
    for numbers): the same array as ``pa.array(values, type_)``, without the pandas import that
    ``pa.array`` / ``to_numpy`` trigger on their first call in a process (~0.3 s CPU, paid
    again by every run process that writes or reads a stage table)."""
    v = np.asarray(values)
    if v.ndim != 1:
        raise FxDataError(f"array_of: expected a 1-D array, got shape {v.shape}")
    if pa.types.is_boolean(type_):
        if v.dtype != np.bool_:
            raise FxDataError(f"array_of: {type_} needs a bool array, got {v.dtype}")
        data = pa.py_buffer(np.packbits(v, bitorder="little"))
    else:
        dtype = np.dtype(type_.to_pandas_dtype())
        if v.dtype != dtype:
            raise FxDataError(f"array_of: {type_} needs a {dtype} array, got {v.dtype}")
        data = pa.py_buffer(np.ascontiguousarray(v))
    return pa.Array.from_buffers(type_, len(v), [None, data])


def empty_array(type_: pa.DataType) -> pa.Array:
    """``pa.array([], type_)`` (a fixed-width number, bool, string or date32 type) without pandas."""
    if pa.types.is_string(type_):
        return strings_of([])
    if pa.types.is_date32(type_):
        return dates_of([])
    dtype = np.bool_ if pa.types.is_boolean(type_) else np.dtype(type_.to_pandas_dtype())
    return array_of(np.zeros(0, dtype), type_)


def numpy_of(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free fixed-width (or bool) Arrow column as numpy: a read-only view of its data
    buffer (bools unpacked to a new array); ``to_numpy`` without its pandas import."""
    if isinstance(arr, pa.ChunkedArray):
        # (combine_chunks of no chunks imports pandas: a table of no rows is read with none)
        if arr.num_chunks == 0:
            arr = empty_array(arr.type)
        else:
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        raise FxDataError(f"numpy_of: column of type {arr.type} has {arr.null_count} nulls")
    if pa.types.is_boolean(arr.type):
        return _bool_values(arr) if len(arr) else np.zeros(0, np.bool_)
    dtype = np.dtype(arr.type.to_pandas_dtype())
    if len(arr) == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _validity(present: list[bool]) -> tuple[pa.Buffer | None, int]:
    nulls = present.count(False)
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(np.array(present, np.bool_), bitorder="little")), nulls


def strings_of(values: Sequence[str | None]) -> pa.Array:
    """``pa.array(values, pa.string())`` of a short list (None: null), without pandas."""
    data = [v.encode() if v is not None else b"" for v in values]
    offsets = np.zeros(len(data) + 1, np.int32)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    validity, nulls = _validity([v is not None for v in values])
    return pa.Array.from_buffers(
        pa.string(), len(data), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))], nulls
    )


def dates_of(values: Sequence[dt.date | None]) -> pa.Array:
    """``pa.array(values, pa.date32())`` of a short list (None: null), without pandas."""
    days = np.array([(v - _EPOCH).days if v is not None else 0 for v in values], np.int32)
    validity, nulls = _validity([v is not None for v in values])
    return pa.Array.from_buffers(pa.date32(), len(days), [validity, pa.py_buffer(days)], nulls)


def _present(arr: pa.Array) -> np.ndarray:
    if not arr.null_count:
        return np.ones(len(arr), np.bool_)
    return _bits(arr.buffers()[0], arr.offset, len(arr))


def py_strings(arr: pa.Array) -> list[str | None]:
    """A string column as Python strings (None: null): ``to_pylist`` without pandas."""
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int32)[arr.offset : arr.offset + len(arr) + 1].tolist()
    raw = bytes(bufs[2]) if bufs[2] is not None else b""
    return [
        raw[offs[i] : offs[i + 1]].decode() if ok else None for i, ok in enumerate(_present(arr).tolist())
    ]


def py_dates(arr: pa.Array) -> list[dt.date | None]:
    """A date32 column as ``datetime.date`` (None: null): ``to_pylist`` without pandas."""
    days = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr)].tolist()
    return [
        _EPOCH + dt.timedelta(days=d) if ok else None
        for d, ok in zip(days, _present(arr).tolist(), strict=True)
    ]


def _column_digest(name: str, col: pa.ChunkedArray) -> str:
    h = new_hasher()
    h.update(f"{name}\x00{col.type}\x00{len(col)}\x00".encode())
    for arr in col.chunks:
        if not len(arr):
            continue
        if arr.null_count:
            update_array(h, np.packbits(~_present(arr)))  # is_null(), without to_numpy's pandas import
        t = arr.type
        if pa.types.is_boolean(t):
            # the values (nulls as False) from the bitmaps with numpy: pyarrow's to_numpy of a
            # bool array costs ~0.25 s on its first call in a process (a cache hit's only one)
            update_array(h, np.packbits(_bool_values(arr)))
        elif pa.types.is_string(t) or pa.types.is_binary(t):
            bufs = arr.buffers()
            offs = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
            update_array(h, offs - offs[0])
            data = bufs[2]
            if data is not None and offs[-1] > offs[0]:
                h.update(memoryview(data)[int(offs[0]) : int(offs[-1])])
        elif t.bit_width and t.bit_width % 8 == 0 and arr.buffers()[1] is not None:
            w = t.bit_width // 8
            h.update(memoryview(arr.buffers()[1])[arr.offset * w : (arr.offset + len(arr)) * w])
        else:
            raise FxDataError(f"stage table column {name!r}: no checksum rule for type {t}")
    return digest_of(h)


def table_checksums(table: pa.Table) -> dict[str, str]:
    """Column name -> digest of the column's content."""
    return {name: _column_digest(name, table.column(name)) for name in table.column_names}


def write_table(path: Path, table: pa.Table, *, alongside: Callable[[], object] | None = None) -> Path:
    """Write an uncompressed Arrow IPC file (one record batch, with ``fx.checksums``) atomically.

    ``alongside``: a check of the table's content (a stage's validator) run on a second thread
    while the table is checksummed and written, instead of before: the write is mostly kernel
    page-cache work (~0.1-0.5 s for a scale-1 OFI table) and the check compiled scans, so on two
    cores the two overlap. The file is moved into place only once the check returned; if it
    raises, nothing is written at ``path`` and its error is raised (also over a write error, as
    if it had run first)."""
    if alongside is None:
        table = _with_checksums(table)
        with atomic_path(path) as tmp:
            _write_ipc(tmp, table)
        return path
    with ThreadPoolExecutor(1, thread_name_prefix="write_table-check") as pool:
        check = pool.submit(alongside)
        try:
            table = _with_checksums(table)
            with atomic_path(path) as tmp:
                _write_ipc(tmp, table)
                check.result()
        except BaseException as exc:
            err = check.exception()  # waits for the check
            if err is None or err is exc:
                raise
            raise err from exc
    return path


def _with_checksums(table: pa.Table) -> pa.Table:
    table = table.combine_chunks()
    meta = dict(table.schema.metadata or {})
    meta[_KEY] = json.dumps(table_checksums(table), separators=(",", ":")).encode()
    return table.replace_schema_metadata(meta)


# From this file size on, a second thread populates the back half of the new file's page cache
# while the writer fills the front half (see _write_ipc).
SPLIT_WRITE_BYTES = 32 << 20
_PREFAULT_READ = 1 << 20


def _ipc_file(sink: pa.NativeFile, table: pa.Table) -> None:
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


def _ipc_size(table: pa.Table) -> int:
    """Bytes of the IPC file of ``table`` (the writer run against a counting sink: no copy)."""
    mock = pa.MockOutputStream()
    _ipc_file(mock, table)
    return int(mock.size())


def _read_holes(path: Path, lo: int, hi: int) -> None:
    """Read bytes [lo, hi) of the sparse ``path``: the kernel allocates (zeroed) page-cache pages
    for the holes, which the writer then only copies into."""
    with contextlib.suppress(OSError):  # (only a head start: the writer allocates what is left)
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = memoryview(bytearray(_PREFAULT_READ))
            while lo < hi:
                n = os.preadv(fd, [buf[: min(_PREFAULT_READ, hi - lo)]], lo)
                if n <= 0:
                    break
                lo += n
        finally:
            os.close(fd)


def _write_ipc(tmp: Path, table: pa.Table) -> None:
    """The IPC file of ``table`` at ``tmp``, written by pyarrow's writer front to back.

    A new file's page-cache pages cost the writer their allocation (~2-10 µs a page on this VM
    host, 0.3 s for the ~190 MB OFI table against ~0.05 s to copy into pages already there;
    benchmarks/README.md, diag_new_file_write). With more than one CPU a large file is first
    extended to its final size (sparse) and a second thread reads the holes of its back half,
    which allocates those pages while the writer fills the front half. The writer still writes
    every byte, so the file is the same; it is cut back to what was written should the counted
    size ever differ."""
    size = _ipc_size(table) if table.nbytes >= SPLIT_WRITE_BYTES and _cpus() > 1 else 0
    with pa.OSFile(str(tmp), "wb") as sink:
        if size < SPLIT_WRITE_BYTES:
            _ipc_file(sink, table)
            return
        os.truncate(tmp, size)
        with ThreadPoolExecutor(1, thread_name_prefix="write_table-pages") as pool:
            pages = pool.submit(_read_holes, tmp, size // 2, size)
            try:
                _ipc_file(sink, table)
            finally:
                pages.result()
        end = sink.tell()
    if end != size:
        os.truncate(tmp, end)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def read_table(path: Path) -> pa.Table:
    """Memory-map an Arrow IPC file written by :func:`write_table` (not verified: see verify_table)."""
    try:
        with pa.memory_map(str(path), "r") as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise FxDataError(f"{path}: cannot read Arrow table: {exc}") from exc


def stored_checksums(table: pa.Table) -> bytes:
    """The ``fx.checksums`` JSON a table was written with (b"" when it has none); a content
    identity only once :func:`verify_table` passed on the file."""
    return (table.schema.metadata or {}).get(_KEY, b"")


def verify_table(path: Path | str) -> None:
    """FxCacheError naming the file (and the first bad column) unless every column's content
    matches the checksum written with it."""
    path = Path(path)
    table = read_table(path)
    raw = (table.schema.metadata or {}).get(_KEY)
    if raw is None:
        raise FxCacheError(f"{path}: stage table carries no fx.checksums (written by an older version)")
    try:
        want = json.loads(raw)
    except ValueError as exc:
        raise FxCacheError(f"{path}: damaged fx.checksums metadata: {exc}") from exc
    if not isinstance(want, dict) or sorted(want) != sorted(table.column_names):
        raise FxCacheError(f"{path}: columns {table.column_names} do not match the checksummed ones")
    for name, digest in table_checksums(table).items():
        if want[name] != digest:
            raise FxCacheError(f"{path}: checksum mismatch in column {name!r}")
