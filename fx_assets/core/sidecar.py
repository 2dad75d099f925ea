"""Predecoded sidecars: a DBN file decoded once into an Arrow IPC file that memory-maps.

Owns the sidecar contract of docs/ARCHITECTURE.md: an uncompressed Arrow IPC *file* with
exactly one record batch (so every column is one contiguous, zero-copy numpy view), the
column set per schema, the ``fx.*`` schema metadata that identifies the source, the body
checksums, and the self-invalidation rule: a sidecar is reused only if the format version,
the source path and size, the XXH3-128 hash of the source's whole content
(:mod:`fx_assets.core.source_hash`), the schema (names and types, so a damaged footer is
caught) and the sampled body checksum all still match — otherwise it is rebuilt, never
trusted. The full body checksum (one XXH3-128 per column, hashed while the columns are
written) is verified by :func:`verify_sidecar` (the asset check) and on every reuse of a
sidecar with at most ``_FULL_REUSE_BYTES`` of column data; a reuse of a larger one checks
``_SAMPLE_BLOCKS`` blocks of ``_SAMPLE_BYTES`` per column, which keeps a warm load of a 17 GB
sidecar in milliseconds. The build of one sidecar is serialised
by a lock (:mod:`fx_assets.core.locks`): a second run waits and reuses the first's output.

How a sidecar is built — each column written once, straight into its place in the file, with
memory bounded by the chunk size, not the file size:

1. A decompression thread streams record chunks (``dbn.iter_record_chunks``; zstd releases
   the GIL) into a small queue; the calling thread checks the records and splits them into
   columns in staging arrays (one strided copy per grid of like fields, ``_Columns._plan``)
   and a writer thread ``pwrite``s full staging sets, so up to three things overlap.
2. At the first write-out N is estimated (uncompressed source: exact from its size; zstd: the
   records per compressed byte so far times the file size, times ``_ESTIMATE_SLACK``) and each
   column gets a page-aligned region with room for that many rows in the sidecar temp file,
   after a reserved header region. Unwritten room stays a hole (never written, no disk space).
3. With N known, pyarrow serialises the IPC file for an N-row batch whose buffers point into a
   read-only anonymous zero mmap (never touched); a sink keeps the few KB of metadata
   (``_ipc_image``). The record batch message's Buffer offsets and the body lengths (message
   and footer Block) are rewritten in place to point at the regions (``_direct_image``; only
   fixed-size flatbuffer fields change), the prefix goes to offset 0, EOS + footer right after
   the last column. Gaps between buffers are unused body bytes: legal Arrow IPC, and the file
   stays a valid IPC stream after the magic. The apparent file size therefore includes the
   unused room of every region but the last (about ``_ESTIMATE_SLACK - 1`` of the data for a
   zstd source; none for an uncompressed one); the allocated size does not.
4. If the rows outgrow the estimate, the decode starts over on the spill path: one anonymous
   spill file per column, then ``os.copy_file_range`` into pyarrow's own contiguous layout.
5. Either way the file is re-opened with pyarrow and checked (one batch, N rows, schema,
   alignment, sampled records in every column) before it is moved into place atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import glob
import hashlib
import json
import mmap
import os
import queue
import struct
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fx_assets.core import dbn
from fx_assets.core.atomic import atomic_path
from fx_assets.core.checksum import ALGORITHM, digest_of, hash_file, new_hasher
from fx_assets.core.dbn import SCHEMAS, SchemaSpec, SymbolInterval
from fx_assets.core.errors import FxCacheError, FxDataError
from fx_assets.core.locks import build_lock
from fx_assets.core.source_hash import content_hash, path_tag, record_hash, recorded_hash, stat_stamp
from fx_assets.core.tables import empty_array

SIDECAR_FORMAT_VERSION = 2  # 2: whole-content source hash and body checksums
DEFAULT_CHUNK_BYTES = dbn.DEFAULT_CHUNK_BYTES
ProgressFn = Callable[[int, int], None]

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "SIDECAR_FORMAT_VERSION",
    "SidecarInfo",
    "SymbolInterval",
    "build_sidecar",
    "describe_dbn",
    "describe_sidecar",
    "ensure_sidecar",
    "open_sidecar",
    "read_symbol_map",
    "sidecar_columns",
    "sidecar_path",
    "sidecar_schema",
    "verify_sidecar",
]

_BASE_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("ts_recv", pa.int64()),
    ("ts_event", pa.int64()),
    ("rtype", pa.uint8()),
    ("publisher_id", pa.uint16()),
    ("instrument_id", pa.uint32()),
    ("action", pa.uint8()),
    ("side", pa.uint8()),
    ("flags", pa.uint8()),
    ("depth", pa.uint8()),
    ("price", pa.int64()),
    ("size", pa.uint32()),
    ("ts_in_delta", pa.int32()),
    ("sequence", pa.uint32()),
)
_LEVEL_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("bid_px", pa.int64()),
    ("ask_px", pa.int64()),
    ("bid_sz", pa.uint32()),
    ("ask_sz", pa.uint32()),
    ("bid_ct", pa.uint32()),
    ("ask_ct", pa.uint32()),
)
_META_KEYS = (
    "fx.format_version",
    "fx.schema",
    "fx.dataset",
    "fx.source_path",
    "fx.source_size",
    "fx.source_mtime_ns",
    "fx.source_hash",
    "fx.checksums",
    "fx.sample_checksum",
    "fx.symbol_map",
    "fx.n_records",
)
# a digest's length is fixed, so the header reserve can be sized before the digests are known
_DIGEST_PLACEHOLDER = f"{ALGORITHM}:{'0' * 32}"
_SAMPLE_BLOCKS = 16  # blocks per column checked on every reuse of a large sidecar
_SAMPLE_BYTES = 4096
_FULL_REUSE_BYTES = 64 << 20  # sidecars with at most this much column data: every reuse checks all


def _columns(spec: SchemaSpec) -> list[tuple[str, pa.DataType]]:
    cols = list(_BASE_COLUMNS)
    for i in range(spec.n_levels):
        cols += [(f"{name}_{i:02d}", t) for name, t in _LEVEL_COLUMNS]
    return cols


def sidecar_schema(schema: str, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    """Arrow schema of the sidecar for a DBN schema name (``trades``, ``tbbo``, ``mbp-1``, ``mbp-10``)."""
    if schema not in SCHEMAS:
        raise FxDataError(f"no sidecar layout for DBN schema {schema!r}; supported: {sorted(SCHEMAS)}")
    return pa.schema([pa.field(n, t) for n, t in _columns(SCHEMAS[schema])], metadata=metadata)


@dataclass(frozen=True)
class SidecarInfo:
    """A sidecar on disk and the source it was decoded from."""

    path: Path
    source: Path
    schema: str
    dataset: str
    n_records: int
    source_hash: str
    source_size: int
    source_mtime_ns: int
    format_version: int
    symbol_map: tuple[SymbolInterval, ...]
    rebuilt: bool
    #: why ``ensure_sidecar`` decoded: "missing", "forced", "source changed", "checksum
    #: mismatch", "schema mismatch", "unreadable", "format version" ("" when reused)
    reason: str = ""

    @property
    def reused(self) -> bool:
        """True when ``ensure_sidecar`` found a fresh sidecar and decoded nothing."""
        return not self.rebuilt

    @property
    def identity_hash(self) -> str:
        """sha256 of what the sidecar's content depends on: format version, source identity
        (path, size, content hash) and record count — a data version for callers."""
        key = json.dumps(
            [
                self.format_version,
                str(self.source.resolve()),
                self.source_size,
                self.source_hash,
                self.n_records,
            ]
        )
        return hashlib.sha256(key.encode()).hexdigest()


def _source_stem(source: Path) -> str:
    name = source.name
    for suffix in (".dbn.zst", ".dbn"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return source.stem


def sidecar_path(source: Path | str, sidecar_dir: Path | str) -> Path:
    """``{stem}.{8-hex hash of the absolute source path}.{SIDECAR_FORMAT_VERSION}.arrow``.

    The path hash keeps ``x.dbn`` and ``x.dbn.zst`` (or two folders' ``x``) apart in one dir.
    """
    source = Path(source)
    return Path(sidecar_dir) / f"{_source_stem(source)}.{path_tag(source)}.{SIDECAR_FORMAT_VERSION}.arrow"


# ----------------------------------------------------------------------------------------------
# build
#
# Tried and dropped: removing the unused room between the column regions with
# fallocate(COLLAPSE_RANGE). On ext4 the collapse first writes the dirty range back to disk
# and drops it from the page cache, so it cost as much as copying the data (~0.08 s per
# 190 MB) and left a cold cache for the first load; the room is left as holes instead.


class _ImageSink:
    """File-like sink for pyarrow's IPC writer that keeps the small writes and skips the bodies.

    pyarrow hands body buffers to ``write`` as ``pa.Buffer`` objects; a buffer whose address
    lies inside our zero mmap is a column body: we record (file offset, mmap offset, length)
    and move on without touching it. Everything else (flatbuffer metadata, padding, footer —
    a few KB) is kept as (offset, bytes).
    """

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self.pos = 0
        self.holes: list[tuple[int, int, int]] = []
        self.writes: list[tuple[int, bytes]] = []
        self.closed = False

    def write(self, data: Any) -> int:
        if isinstance(data, pa.Buffer) and self.base <= data.address < self.base + self.size:
            n = data.size
            self.holes.append((self.pos, data.address - self.base, n))
        else:
            b = bytes(memoryview(data).cast("B"))
            n = len(b)
            self.writes.append((self.pos, b))
        self.pos += n
        return n

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


@dataclass
class _Image:
    """pyarrow's serialisation of an N-row batch, minus the column bodies."""

    size: int  # total file size
    writes: list[tuple[int, bytes]]
    holes: list[tuple[int, int, int]]  # (file offset, column index, length), in column order


_IPC_OPTIONS = pa.ipc.IpcWriteOptions(allow_64bit=True)


def _ipc_image(cols: list[tuple[str, pa.DataType]], n: int, schema: pa.Schema) -> _Image:
    """Serialise an n-row batch (n > 0) whose buffers sit in a read-only zero mmap (never read)."""
    sizes = [n * t.bit_width // 8 for _, t in cols]
    offsets = np.concatenate([[0], np.cumsum([(s + 4095) // 4096 * 4096 for s in sizes])]).tolist()
    zero = mmap.mmap(-1, offsets[-1], prot=mmap.PROT_READ)  # virtual only
    try:
        zbuf = pa.py_buffer(zero)
        arrays = [
            pa.Array.from_buffers(t, n, [None, zbuf.slice(off, size)], null_count=0)
            for (_, t), off, size in zip(cols, offsets, sizes, strict=False)
        ]
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        sink = _ImageSink(zbuf.address, offsets[-1])
        with pa.ipc.new_file(sink, schema, options=_IPC_OPTIONS) as w:
            w.write_batch(batch)
        del batch, arrays, zbuf
    finally:
        with contextlib.suppress(BufferError):
            zero.close()
    # Every column body must have come through exactly once, whole, in column order.
    index = {off: i for i, off in enumerate(offsets[:-1])}
    holes = [(pos, index.get(moff, -1), length) for pos, moff, length in sink.holes]
    if [(i, length) for _, i, length in holes] != list(enumerate(sizes)):
        raise FxCacheError(f"pyarrow serialised the column bodies unexpectedly: {sink.holes}")
    return _Image(sink.pos, sink.writes, holes)


def _copy_range(src_fd: int, dst_fd: int, src_off: int, dst_off: int, count: int) -> None:
    """Copy ``count`` bytes between files in the kernel; pread/pwrite where that is unsupported."""
    while count > 0:
        try:
            k = os.copy_file_range(src_fd, dst_fd, min(count, 1 << 30), src_off, dst_off)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM):
                raise
            k = 0
            block = os.pread(src_fd, min(count, 8 << 20), src_off)
            if block:
                k = os.pwrite(dst_fd, block, dst_off)
        if k <= 0:
            raise FxCacheError(
                f"column data ended early while copying ({count} bytes left at offset {src_off})"
            )
        src_off += k
        dst_off += k
        count -= k


def _pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    mv = memoryview(data)
    while len(mv):
        k = os.pwrite(fd, mv, pos)
        mv = mv[k:]
        pos += k


def _write_copied(path: Path, image: _Image, sources: list[tuple[int, int]]) -> None:
    """Write ``image`` to ``path``, each column body copied in the kernel from (fd, offset)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for pos, b in image.writes:
            _pwrite_all(fd, b, pos)
        for pos, i, length in image.holes:
            src_fd, src_off = sources[i]
            _copy_range(src_fd, fd, src_off, pos, length)
        os.ftruncate(fd, image.size)
    finally:
        os.close(fd)


# ---- Arrow IPC flatbuffer patching (direct layout) --------------------------------------------
#
# Only fixed-size fields are rewritten (struct vectors and scalar fields that are present),
# so the flatbuffers keep their size and everything else pyarrow wrote stays byte-identical.
# Message.fbs: Message{version, header_type, header, bodyLength, custom_metadata};
# RecordBatch{length, nodes, buffers: [Buffer{offset: i64, length: i64}], compression, ...};
# File.fbs: Footer{version, schema, dictionaries, recordBatches: [Block{offset: i64,
# metaDataLength: i32, (pad), bodyLength: i64}], custom_metadata}.

_RECORD_BATCH_HEADER = 3  # MessageHeader union tag of RecordBatch
_CONTINUATION = 0xFFFFFFFF


def _fb_field(b: bytes | bytearray | memoryview, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the flatbuffer table at ``table`` (None if absent)."""
    vtable = table - struct.unpack_from("<i", b, table)[0]
    vsize = struct.unpack_from("<H", b, vtable)[0]
    if 4 + 2 * index >= vsize:
        return None
    off = struct.unpack_from("<H", b, vtable + 4 + 2 * index)[0]
    return table + off if off else None


def _fb_ref(b: bytes | bytearray | memoryview, pos: int) -> int:
    """Follow the uoffset stored at ``pos``."""
    return pos + struct.unpack_from("<I", b, pos)[0]


def _fb_required(b: bytes | bytearray | memoryview, table: int, index: int, what: str) -> int:
    pos = _fb_field(b, table, index)
    if pos is None:
        raise FxCacheError(f"pyarrow's IPC metadata has no {what}")
    return pos


class _Overflow(Exception):
    """The decoded records do not fit the direct layout's estimated capacity."""


@dataclass
class _Direct:
    """The IPC file for the final N with the bodies relocated: ``prefix`` at 0 (magic, schema
    message, record batch message), the column regions where the decoder wrote them, ``tail``
    (EOS + footer) right after the last region."""

    prefix: bytes
    tail: bytes
    tail_pos: int
    size: int


def _image_bytes(image: _Image, lo: int, hi: int) -> bytearray:
    """Bytes [lo, hi) of pyarrow's image; they must all be among the kept (non-body) writes."""
    out = bytearray(hi - lo)
    covered = 0
    for pos, data in image.writes:
        a, z = max(pos, lo), min(pos + len(data), hi)
        if a < z:
            out[a - lo : z - lo] = data[a - pos : z - pos]
            covered += z - a
    if covered != hi - lo:
        raise FxCacheError(f"pyarrow's IPC image does not cover bytes [{lo}, {hi}) with metadata")
    return out


def _direct_image(
    cols: list[tuple[str, pa.DataType]], n: int, schema: pa.Schema, bases: list[int]
) -> _Direct:
    """pyarrow's IPC file for N rows with each column's buffer moved to ``bases[i]``.

    The prefix keeps pyarrow's positions, so the record batch body still starts where pyarrow
    put it; the regions lie inside the (longer) body, and the bytes between them are unused
    body space — legal in Arrow IPC (buffers are located by offset and length only).
    """
    image = _ipc_image(cols, n, schema)
    sizes = [n * t.bit_width // 8 for _, t in cols]
    flen = struct.unpack_from("<i", _image_bytes(image, image.size - 10, image.size - 6))[0]
    footer = _image_bytes(image, image.size - 10 - flen, image.size - 10)
    batches = _fb_ref(footer, _fb_required(footer, _fb_ref(footer, 0), 3, "Footer.recordBatches"))
    if struct.unpack_from("<I", footer, batches)[0] != 1:
        raise FxCacheError("pyarrow's IPC footer does not list exactly one record batch")
    block = batches + 4
    rb_off, meta_len, _, body_len = struct.unpack_from("<qiiq", footer, block)
    body_start = rb_off + meta_len
    if body_start > min(bases):  # cannot happen with _header_reserve's margin; the spill path copes
        raise _Overflow(f"IPC metadata ({body_start} B) does not fit the reserved header region")
    prefix = _image_bytes(image, 0, body_start)
    cont, fb_len = struct.unpack_from("<Ii", prefix, rb_off)
    if cont != _CONTINUATION or 8 + fb_len != meta_len:
        raise FxCacheError("pyarrow's record batch message has an unexpected framing")
    msg = memoryview(prefix)[rb_off + 8 : rb_off + 8 + fb_len]
    root = _fb_ref(msg, 0)
    header_type = _fb_required(msg, root, 1, "Message.header_type")
    if msg[header_type] != _RECORD_BATCH_HEADER:
        raise FxCacheError("pyarrow's second IPC message is not a record batch")
    rb = _fb_ref(msg, _fb_required(msg, root, 2, "Message.header"))
    if _fb_field(msg, rb, 3) is not None:
        raise FxCacheError("pyarrow compressed the record batch body")
    bufs = _fb_ref(msg, _fb_required(msg, rb, 2, "RecordBatch.buffers"))
    n_bufs = struct.unpack_from("<I", msg, bufs)[0]
    if n_bufs != 2 * len(cols):
        raise FxCacheError(f"pyarrow wrote {n_bufs} buffers for {len(cols)} columns")
    end = max(b + s for b, s in zip(bases, sizes, strict=True))
    new_body_len = (end + 7) // 8 * 8 - body_start
    for i, (base, size) in enumerate(zip(bases, sizes, strict=True)):
        validity, data = bufs + 4 + 32 * i, bufs + 4 + 32 * i + 16
        if (
            struct.unpack_from("<q", msg, validity + 8)[0] != 0
            or struct.unpack_from("<q", msg, data + 8)[0] != size
        ):
            raise FxCacheError(f"pyarrow's buffer list does not match column {cols[i][0]}")
        struct.pack_into("<qq", msg, validity, base - body_start, 0)
        struct.pack_into("<qq", msg, data, base - body_start, size)
    struct.pack_into("<q", msg, _fb_required(msg, root, 3, "Message.bodyLength"), new_body_len)
    del msg
    tail = _image_bytes(image, body_start + body_len, image.size)
    # the footer is the tail's end: patch its Block.bodyLength in place
    struct.pack_into("<q", tail, len(tail) - 10 - flen + block + 16, new_body_len)
    tail_pos = body_start + new_body_len
    return _Direct(bytes(prefix), bytes(tail), tail_pos, tail_pos + len(tail))


# ---- decoding into columns --------------------------------------------------------------------

_STAGE_CHUNKS = 8  # staging arrays hold this many chunks' worth of records
_FAST_SPLIT = True  # _Columns._plan; False: one strided copy per field (the reference, tests)
_REGION_ALIGN = 4096  # column regions start on page boundaries (mmap views stay aligned)
# Capacity of the direct layout: the records decoded per compressed byte so far times the
# compressed size, times this slack (+ _ESTIMATE_EXTRA rows). A file whose later part packs
# more records per compressed byte than that overflows and is rebuilt through the spill path.
_ESTIMATE_SLACK = 1.25
_ESTIMATE_EXTRA = 65536


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align


@dataclass(frozen=True)
class _Group:
    """Columns whose fields lie on a grid in the record: ``columns[r][c]`` (column indexes) is
    the field at byte ``offset + r * outer + c * width``, each ``width`` bytes wide."""

    columns: tuple[tuple[int, ...], ...]
    width: int
    offset: int
    outer: int


class _Columns:
    """Splits record chunks into columns and writes each column to its own place: (fd, offset).

    Records are gathered into fixed staging arrays (``stage_bytes`` per set) that are written
    out when full: one strided copy per group of like fields (``_plan``) and few, large writes
    (mbp-10 has 73 columns; writing each 1 MiB chunk's columns separately was syscall-bound). There are two
    staging sets: a writer thread ``pwrite``s one (releasing the GIL) while this thread fills
    the other. Where the columns go is decided at the first write-out by ``place(self)`` —
    after a few chunks, so that it can estimate N — which returns one (fd, offset) per column
    and the row capacity (None: unbounded). Use as a context manager (stops the writer).
    """

    def __init__(
        self,
        cols: list[tuple[str, pa.DataType]],
        stage_bytes: int,
        place: Callable[[_Columns], tuple[list[tuple[int, int]], int | None]],
    ) -> None:
        self.names = [name for name, _ in cols]
        self.dtypes = [np.dtype(t.to_pandas_dtype()) for _, t in cols]
        self.capacity = max(1024, stage_bytes // sum(d.itemsize for d in self.dtypes))
        # the staging sets are allocated by the first add (their layout follows the records')
        self.sets: list[list[np.ndarray]] = []
        self.pending: list[Future[None] | None] = [None, None]
        self.current = 0
        self.stage: list[np.ndarray] = []
        self.fill = 0
        self.rows = 0  # rows handed to the writer
        self.written = [0] * len(cols)
        # one XXH3-128 per column, fed in the writer thread with exactly the bytes it writes
        self.hashers = [new_hasher() for _ in cols]
        self.place = place
        self.targets: list[tuple[int, int]] | None = None
        self.max_rows: int | None = None
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sidecar-write")
        # for the estimate: records seen, and (records, compressed bytes) at the last moment the
        # source position moved on — those records came from at most that many source bytes
        self.n_in = 0
        self.done = 0
        self.sample = (0, 0)
        self.final = False  # set before the last write-out: n_in is then the exact N
        self.plan: list[_Group] | None = None  # see _plan; [] = one copy per field
        self.blocks: list[list[np.ndarray]] = []  # per set, per group: its staging block

    def __enter__(self) -> _Columns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.shutdown(wait=True, cancel_futures=True)

    def _plan(self, dtype: np.dtype[Any]) -> list[_Group] | None:
        """How to split records of ``dtype`` in few numpy calls: the columns are grouped into
        grids of equal-width fields — a run of fields adjacent in the record (``ts_event,
        price``; ``action, side, flags, depth``), and for the book levels the same run at every
        level (``bid_px, ask_px`` x 10 levels: 20 columns) — and each grid is gathered by one
        strided copy into a staging block whose rows are its columns. mbp-10's 73 columns take
        10 copies per chunk instead of 73: at ~1,300 records per chunk numpy's per-call cost,
        not the copying, was most of the split. Each column is a raw copy of its bytes, so the
        field's dtype must equal the column's. None where that fails (then one copy per field).
        """
        n_base = len(_BASE_COLUMNS)
        n_level = len(_LEVEL_COLUMNS)
        n_levels = (len(self.names) - n_base) // n_level
        if len(self.names) != n_base + n_levels * n_level or dtype.fields is None:
            return None
        fields = dtype.fields

        def runs(first: int, count: int) -> list[list[int]]:
            """Columns among [first, first + count), in record order, in runs of adjacent
            fields of one width."""
            out: list[list[int]] = []
            for i in sorted(range(first, first + count), key=lambda i: fields[self.names[i]][1]):
                sub, off = fields[self.names[i]][:2]
                if out:
                    prev = out[-1][-1]
                    psub, poff = fields[self.names[prev]][:2]
                    if psub.itemsize == sub.itemsize and off == poff + psub.itemsize:
                        out[-1].append(i)
                        continue
                out.append([i])
            return out

        grids = [[run] for run in runs(0, n_base)]
        if n_levels:
            level_stride = (
                fields[self.names[n_base + n_level]][1] - fields[self.names[n_base]][1] if n_levels > 1 else 0
            )
            grids += [
                [[i + lvl * n_level for i in run] for lvl in range(n_levels)] for run in runs(n_base, n_level)
            ]
        plan = []
        for grid in grids:
            first = grid[0][0]
            width = self.dtypes[first].itemsize
            offset = fields[self.names[first]][1]
            outer = level_stride if len(grid) > 1 else 0
            for r, row in enumerate(grid):
                for c, col in enumerate(row):
                    sub, off = fields[self.names[col]][:2]
                    if sub != self.dtypes[col] or off != offset + r * outer + c * width:
                        return None
            plan.append(_Group(tuple(tuple(row) for row in grid), width, offset, outer))
        return plan

    def _allocate(self, dtype: np.dtype[Any]) -> None:
        """The plan for records of ``dtype`` and the two staging sets (one array per column;
        with a plan, rows of the groups' blocks)."""
        self.plan = (self._plan(dtype) if _FAST_SPLIT else None) or []
        for _ in range(2):
            if not self.plan:
                self.sets.append([np.empty(self.capacity, dtype=d) for d in self.dtypes])
                continue
            stage: list[np.ndarray] = [np.empty(0)] * len(self.names)
            blocks = []
            for g in self.plan:
                block = np.empty((len(g.columns), len(g.columns[0]), self.capacity), np.dtype(f"u{g.width}"))
                for r, row in enumerate(g.columns):
                    for c, col in enumerate(row):
                        stage[col] = block[r, c].view(self.dtypes[col])
                blocks.append(block)
            self.sets.append(stage)
            self.blocks.append(blocks)
        self.stage = self.sets[self.current]

    def add(self, records: np.ndarray, done: int) -> None:
        if done != self.done:
            self.sample = (self.n_in, self.done)
            self.done = done
        self.n_in += len(records)
        if not self.sets:
            self._allocate(records.dtype)
        plan = self.plan
        rs = records.dtype.itemsize
        pos = 0
        while pos < len(records):
            k = min(self.capacity - self.fill, len(records) - pos)
            part = records[pos : pos + k]
            lo, hi = self.fill, self.fill + k
            if plan and part.flags.c_contiguous:
                for g, block in zip(plan, self.blocks[self.current], strict=True):
                    rows, cols = block.shape[:2]
                    # (record, row, column) view of the group's bytes, read as (row, column, record)
                    src = np.ndarray(
                        (k, rows, cols), block.dtype, part, g.offset, (rs, g.outer, g.width)
                    ).transpose(1, 2, 0)
                    np.copyto(block[:, :, lo:hi], src, casting="no")
            else:
                for name, buf in zip(self.names, self.stage, strict=True):
                    np.copyto(buf[lo:hi], part[name], casting="no")
            self.fill += k
            pos += k
            if self.fill == self.capacity:
                self.flush()

    def _write(self, stage: list[np.ndarray], fill: int, where: list[tuple[int, int]]) -> None:
        for buf, (fd, pos), h in zip(stage, where, self.hashers, strict=True):
            data = buf[:fill].data.cast("B")
            _pwrite_all(fd, data, pos)
            h.update(data)

    def checksums(self) -> dict[str, str]:
        """Column name -> digest of the bytes written (call after ``finish``)."""
        return {name: digest_of(h) for name, h in zip(self.names, self.hashers, strict=True)}

    def flush(self) -> None:
        """Hand the current staging set to the writer and switch to the other one."""
        if not self.fill:
            return
        if self.targets is None:
            self.targets, self.max_rows = self.place(self)
        if self.max_rows is not None and self.rows + self.fill > self.max_rows:
            raise _Overflow(f"{self.rows + self.fill} rows exceed the estimated {self.max_rows}")
        where = []
        for i, (buf, (fd, base)) in enumerate(zip(self.stage, self.targets, strict=True)):
            where.append((fd, base + self.written[i]))
            self.written[i] += self.fill * buf.itemsize
        self.pending[self.current] = self.writer.submit(self._write, self.stage, self.fill, where)
        self.rows += self.fill
        self.fill = 0
        self.current ^= 1
        self.stage = self.sets[self.current]
        self._wait(self.current)

    def _wait(self, k: int) -> None:
        job = self.pending[k]
        self.pending[k] = None
        if job is not None:
            job.result()  # re-raises the writer's error (e.g. disk full)

    def finish(self) -> None:
        """Write out what is staged and wait until every write is done."""
        self.final = True
        self.flush()
        self._wait(0)
        self._wait(1)


class _Spill:
    """Placement of the spill path: one anonymous temp file per column (O_TMPFILE / unlinked at
    once, so nothing to clean up even after a crash), on the destination's filesystem for
    ``copy_file_range``."""

    def __init__(self, n_cols: int, directory: Path) -> None:
        self.n_cols = n_cols
        self.directory = directory
        self.files: list[Any] = []

    def __call__(self, out: _Columns) -> tuple[list[tuple[int, int]], int | None]:
        self.files = [tempfile.TemporaryFile(dir=self.directory) for _ in range(self.n_cols)]
        return [(f.fileno(), 0) for f in self.files], None

    def close(self) -> None:
        for f in self.files:
            f.close()


class _Layout:
    """Placement of the direct path: column regions in the sidecar file itself, after a
    reserved header region, each with room for the estimated N (unwritten room stays a hole)."""

    def __init__(
        self,
        fd: int,
        cols: list[tuple[str, pa.DataType]],
        header: dbn.DbnHeader,
        source_size: int,
        header_reserve: int,
    ) -> None:
        self.fd = fd
        self.itemsizes = [t.bit_width // 8 for _, t in cols]
        self.header = header
        self.source_size = source_size
        self.header_reserve = header_reserve
        self.bases: list[int] = []
        self.n_est = 0

    def estimate(self, out: _Columns) -> int:
        if out.final:
            return out.n_in
        if not self.header.compressed:
            rs = self.header.record_dtype().itemsize
            return max(out.n_in, -(-(self.source_size - self.header.header_len) // rs))
        n_s, d_s = out.sample if out.sample[1] else (out.n_in, out.done)
        per_byte = n_s / max(d_s, 1)
        rest = max(self.source_size - d_s, 0) * per_byte * _ESTIMATE_SLACK
        return max(out.n_in, n_s + int(rest) + _ESTIMATE_EXTRA)

    def __call__(self, out: _Columns) -> tuple[list[tuple[int, int]], int | None]:
        self.n_est = self.estimate(out)
        pos = self.header_reserve
        for size in self.itemsizes:
            self.bases.append(pos)
            pos = _round_up(pos + self.n_est * size, _REGION_ALIGN)
        return [(self.fd, b) for b in self.bases], self.n_est


def _header_reserve(cols: list[tuple[str, pa.DataType]], schema: pa.Schema) -> int:
    """Room for the IPC prefix (magic, schema message, record batch message) of any N: pyarrow's
    prefix with a 20-digit fx.n_records, plus a page, rounded up to a page."""
    meta = dict(schema.metadata or {})
    meta[b"fx.n_records"] = b"9" * 20
    image = _ipc_image(cols, 1, schema.with_metadata(meta))
    return _round_up(image.holes[0][0] + _REGION_ALIGN, _REGION_ALIGN)


_END = object()
_MAX_SAMPLES = 64  # rows kept to check the written file against


@dataclass
class _Decoded:
    n: int
    samples: list[tuple[int, np.ndarray]]  # (row index, the record), first and last included


def _decode_columns(
    source: Path,
    out: _Columns,
    chunk_bytes: int,
    progress: ProgressFn | None,
    total_bytes: int,
    hasher: Any = None,
) -> _Decoded:
    """Decode ``source`` column by column into ``out``; return N and a few sampled records.

    A decompression thread feeds a small queue (zstd releases the GIL); this thread checks the
    records (length and rtype; off the decompression thread, which is the longer of the two on
    two cores) and splits the chunks into columns and writes them, so two cores work at once.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=8)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for header, arr, done in dbn.iter_record_chunks(source, chunk_bytes, hasher, validate=False):
                if not put((header, arr, done)):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put(exc)

    thread = threading.Thread(target=produce, name=f"dbn-decode:{source.name}", daemon=True)
    thread.start()
    n = 0
    k = 0
    samples: list[tuple[int, np.ndarray]] = []
    last: tuple[int, np.ndarray] | None = None
    try:
        while True:
            item = q.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            header, arr, done = item
            dbn.check_records(source, arr, n, header)
            out.add(arr, done)
            if len(arr):
                # the first record of chunks 0, 1, 2, 4, 8, ... and of the last chunk
                if k & (k - 1) == 0 and len(samples) < _MAX_SAMPLES:
                    samples.append((n, arr[:1].copy()))
                last = (n + len(arr) - 1, arr[-1:].copy())
                k += 1
            n += len(arr)
            if progress is not None:
                progress(done, total_bytes)
    finally:
        stop.set()
        thread.join()
    out.finish()
    if last is not None:
        samples.append(last)
    return _Decoded(n, samples)


@dataclass(frozen=True)
class _Sums:
    """What the metadata records about the content: the source's hash and the body checksums."""

    source_hash: str
    columns: dict[str, str]
    sample: str

    @staticmethod
    def placeholder(cols: list[tuple[str, pa.DataType]]) -> _Sums:
        return _Sums(_DIGEST_PLACEHOLDER, {n: _DIGEST_PLACEHOLDER for n, _ in cols}, _DIGEST_PLACEHOLDER)


def _sample_ranges(length: int) -> list[tuple[int, int]]:
    """(offset, size) of the blocks of a ``length``-byte column checked on every reuse."""
    if length <= _SAMPLE_BLOCKS * _SAMPLE_BYTES:
        return [(0, length)] if length else []
    last = length - _SAMPLE_BYTES
    return [(j * last // (_SAMPLE_BLOCKS - 1), _SAMPLE_BYTES) for j in range(_SAMPLE_BLOCKS)]


def _sample_digest(places: list[tuple[int, int, int]]) -> str:
    """Digest of the sampled blocks of each column, read with pread from (fd, offset, length)."""
    h = new_hasher()
    for fd, base, length in places:
        for off, size in _sample_ranges(length):
            block = os.pread(fd, size, base + off)
            if len(block) != size:
                raise FxCacheError(f"column data ends early at byte {base + off + len(block)}")
            h.update(block)
    return digest_of(h)


def _metadata(
    header: dbn.DbnHeader, source: Path, size: int, mtime_ns: int, n: int, sums: _Sums, code_version: str
) -> dict[bytes, bytes]:
    meta = {
        "fx.format_version": str(SIDECAR_FORMAT_VERSION),
        "fx.code_version": code_version,
        "fx.schema": str(header.schema),
        "fx.dataset": header.dataset,
        "fx.source_path": str(source.resolve()),
        "fx.source_size": str(size),
        "fx.source_mtime_ns": str(mtime_ns),
        "fx.source_hash": sums.source_hash,
        "fx.checksums": json.dumps(sums.columns, separators=(",", ":")),
        "fx.sample_checksum": sums.sample,
        "fx.symbol_map": json.dumps([m.to_json() for m in header.mappings]),
        "fx.n_records": str(n),
        "fx.dbn_version": str(header.version),
    }
    return {k.encode(): v.encode() for k, v in meta.items()}


def _verify(path: Path, schema: pa.Schema, decoded: _Decoded) -> None:
    """Re-open the written file with pyarrow: one batch, N rows, the schema, aligned columns, and
    the sampled records (first, last and some between) equal in every column.

    The sampled values are read with ``pread`` at the places pyarrow located the buffers, not
    through the mapping: a page fault there maps its whole fault-around window (~64 KiB per
    column and sample), which would show up as resident memory.
    """
    n = decoded.n
    with pa.memory_map(str(path), "r") as src:
        reader = pa.ipc.open_file(src)
        if reader.num_record_batches != 1:
            raise FxCacheError(f"{path}: {reader.num_record_batches} record batches written, expected 1")
        batch = reader.get_batch(0)
        if batch.num_rows != n or not batch.schema.equals(schema, check_metadata=True):
            raise FxCacheError(
                f"{path}: written batch has {batch.num_rows} rows / another schema, expected {n}"
            )
        src.seek(0)
        base = src.read_buffer(1).address  # the mapping's start: file offset 0
        with open(path, "rb") as f:
            for name in schema.names:
                col = batch.column(name)
                if not n:
                    continue
                address = col.buffers()[1].address
                if address % 8:
                    raise FxCacheError(f"{path}: column {name} is not 8-byte aligned")
                dtype = np.dtype(col.type.to_pandas_dtype())
                for i, rec in decoded.samples:
                    pos = address - base + (col.offset + i) * dtype.itemsize
                    value = np.frombuffer(os.pread(f.fileno(), dtype.itemsize, pos), dtype=dtype)
                    if len(value) != 1 or value[0] != rec[name][0]:
                        raise FxCacheError(f"{path}: column {name} row {i} does not match the decoded record")
    # the checksums recorded must verify on the file as written (else every reuse would rebuild)
    try:
        _check(path, None, None, None, full=False, current_format=False)
    except _Stale as exc:
        raise FxCacheError(f"{path}: the written sidecar fails its own check: {exc.args[0]}") from None


def _check_source(source: Path, st0: os.stat_result) -> None:
    """The decoded bytes are the file as it is now: its stat did not move while it was read.

    The digest of the bytes decoded is recorded whatever an earlier record said for the same
    stat (that record is then the stale one); a run whose keys used the earlier hash fails in
    the asset layer instead of building keyed files from other data."""
    if stat_stamp(os.stat(source)) != stat_stamp(st0):
        raise FxDataError(f"{source}: the file changed while it was being decoded")


def _write_empty(path: Path, cols: list[tuple[str, pa.DataType]], schema: pa.Schema) -> None:
    # one (empty) batch, as for any other sidecar; write_table would write none
    empty = pa.record_batch([empty_array(t) for _, t in cols], schema=schema)  # (no pandas import)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, schema, options=_IPC_OPTIONS) as w:
        w.write_batch(empty)


def _build_direct(
    source: Path,
    dest: Path,
    header: dbn.DbnHeader,
    st0: os.stat_result,
    chunk_bytes: int,
    progress: ProgressFn | None,
    code_version: str,
) -> tuple[int, str]:
    """Decode each column once, straight into its region of the sidecar; return N and the
    source's content hash.

    Raises _Overflow (having removed its temp file) when the estimate of N was too small.
    """
    spec = header.spec()
    cols = _columns(spec)
    meta0 = _metadata(header, source, st0.st_size, st0.st_mtime_ns, 0, _Sums.placeholder(cols), code_version)
    reserve = _header_reserve(cols, sidecar_schema(spec.name, meta0))
    hasher = new_hasher()
    with atomic_path(dest) as tmp:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            layout = _Layout(fd, cols, header, st0.st_size, reserve)
            with _Columns(cols, _STAGE_CHUNKS * min(chunk_bytes, DEFAULT_CHUNK_BYTES), layout) as out:
                decoded = _decode_columns(source, out, chunk_bytes, progress, st0.st_size, hasher)
            digest = digest_of(hasher)
            _check_source(source, st0)
            n = decoded.n
            sizes = [n * t.bit_width // 8 for _, t in cols]
            places = [(fd, b, size) for b, size in zip(layout.bases, sizes, strict=False)] if n else []
            sums = _Sums(digest, out.checksums(), _sample_digest(places))
            schema = sidecar_schema(
                spec.name, _metadata(header, source, st0.st_size, st0.st_mtime_ns, n, sums, code_version)
            )
            if n:
                if out.written != sizes:
                    raise FxCacheError(f"{source}: decoded column sizes {out.written} do not match N={n}")
                image = _direct_image(cols, n, schema, layout.bases)
                _pwrite_all(fd, image.prefix, 0)
                _pwrite_all(fd, image.tail, image.tail_pos)
                os.ftruncate(fd, image.size)
        finally:
            os.close(fd)
        if not n:
            _write_empty(tmp, cols, schema)
        _verify(tmp, schema, decoded)
    return n, digest


def _build_spilled(
    source: Path,
    dest: Path,
    header: dbn.DbnHeader,
    st0: os.stat_result,
    chunk_bytes: int,
    progress: ProgressFn | None,
    code_version: str,
) -> tuple[int, str]:
    """Decode into per-column spill files, then copy them into pyarrow's layout; return N and
    the source's content hash."""
    spec = header.spec()
    cols = _columns(spec)
    spill = _Spill(len(cols), dest.parent)
    hasher = new_hasher()
    try:
        with _Columns(cols, _STAGE_CHUNKS * min(chunk_bytes, DEFAULT_CHUNK_BYTES), spill) as out:
            decoded = _decode_columns(source, out, chunk_bytes, progress, st0.st_size, hasher)
        digest = digest_of(hasher)
        _check_source(source, st0)
        n = decoded.n
        places = [(fd, off, size) for (fd, off), size in zip(out.targets or [], out.written, strict=False)]
        sums = _Sums(digest, out.checksums(), _sample_digest(places if n else []))
        schema = sidecar_schema(
            spec.name, _metadata(header, source, st0.st_size, st0.st_mtime_ns, n, sums, code_version)
        )
        with atomic_path(dest) as tmp:
            if n == 0:
                _write_empty(tmp, cols, schema)
            else:
                image = _ipc_image(cols, n, schema)
                if [length for _, _, length in image.holes] != out.written:
                    raise FxCacheError(f"{source}: decoded column sizes {out.written} do not match N={n}")
                assert out.targets is not None  # n > 0: the columns were written out
                _write_copied(tmp, image, out.targets)
            _verify(tmp, schema, decoded)
    finally:
        spill.close()
    return n, digest


def build_sidecar(
    source: Path | str,
    dest: Path | str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: ProgressFn | None = None,
    *,
    expect_schema: str | None = None,
    expect_dataset: str | None = None,
    record_dir: Path | str | None = None,
    code_version: str = "",
) -> SidecarInfo:
    """Decode ``source`` (DBN trades / tbbo / mbp-1 / mbp-10) into the sidecar ``dest``.

    Peak memory is a few ``chunk_bytes`` whatever the file size. ``progress(bytes_done,
    bytes_total)`` is called after each chunk with source (compressed) bytes (it starts over if
    the direct layout overflows and the file is decoded again). Written atomically; on any
    error no sidecar and no temp file is left behind (FxDataError for bad input, naming the
    file and offset). A file whose DBN schema (dataset) is not ``expect_schema``
    (``expect_dataset``) fails before anything is created. The source's content hash is taken
    from the bytes decoded (recorded in ``record_dir`` for the stat they were read at).
    """
    source, dest = Path(source), Path(dest)
    try:
        st0 = os.stat(source)
    except OSError as exc:
        raise FxDataError(f"{source}: cannot stat the DBN source: {exc}") from exc
    header = dbn.read_header(source)
    header.require(expect_schema, expect_dataset)
    spec = header.spec()  # unsupported / mixed schema: fail before creating anything
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        n, digest = _build_direct(source, dest, header, st0, chunk_bytes, progress, code_version)
    except _Overflow:
        n, digest = _build_spilled(source, dest, header, st0, chunk_bytes, progress, code_version)
    if record_dir is not None:
        record_hash(source, record_dir, st0, digest)
    if progress is not None:
        progress(st0.st_size, st0.st_size)
    return SidecarInfo(
        path=dest,
        source=source,
        schema=spec.name,
        dataset=header.dataset,
        n_records=n,
        source_hash=digest,
        source_size=st0.st_size,
        source_mtime_ns=st0.st_mtime_ns,
        format_version=SIDECAR_FORMAT_VERSION,
        symbol_map=header.mappings,
        rebuilt=True,
    )


# ----------------------------------------------------------------------------------------------
# reuse / invalidation / verification


def _meta(schema: pa.Schema) -> dict[str, str]:
    raw = schema.metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items()}


class _Stale(Exception):
    """The sidecar is not a valid, current decode of its source; ``args[0]`` says why."""


def _column_places(src: pa.MemoryMappedFile, batch: pa.RecordBatch) -> list[tuple[int, int]]:
    """(file offset, byte length) of each column's data buffer."""
    src.seek(0)
    base = src.read_buffer(1).address  # the mapping's start: file offset 0
    out = []
    for col in batch.columns:
        buf = col.buffers()[1]
        width = col.type.bit_width // 8
        out.append((buf.address - base + col.offset * width, len(col) * width))
    return out


def _check(
    path: Path,
    source: Path | None,
    current_hash: str | None,
    expect_schema: str | None,
    full: bool,
    current_format: bool = True,
    code: str | None = None,
) -> dict[str, str]:
    """The sidecar's metadata if it is intact and (with ``current_hash``) a decode of the
    source as it is now; _Stale saying why not. ``full`` hashes every column; otherwise the
    sampled blocks."""
    try:
        with pa.memory_map(str(path), "r") as src:
            reader = pa.ipc.open_file(src)
            meta = _meta(reader.schema)
            if any(k not in meta for k in _META_KEYS):
                raise _Stale("format version")
            if current_format and meta["fx.format_version"] != str(SIDECAR_FORMAT_VERSION):
                raise _Stale("format version")
            if code is not None and meta.get("fx.code_version", "") != code:
                raise _Stale("decoder code changed")
            if reader.num_record_batches != 1:
                raise _Stale("unreadable")
            if meta["fx.schema"] not in SCHEMAS or not reader.schema.equals(
                sidecar_schema(meta["fx.schema"]), check_metadata=False
            ):
                raise _Stale("schema mismatch")
            if expect_schema is not None and meta["fx.schema"] != expect_schema:
                raise _Stale("schema mismatch")
            batch = reader.get_batch(0)
            if batch.num_rows != int(meta["fx.n_records"]):
                raise _Stale("unreadable")
            if source is not None:
                st = os.stat(source)
                if meta["fx.source_path"] != str(source.resolve()) or meta["fx.source_size"] != str(
                    st.st_size
                ):
                    raise _Stale("source changed")
            if current_hash is not None and meta["fx.source_hash"] != current_hash:
                raise _Stale("source changed")
            places = _column_places(src, batch) if batch.num_rows else [(0, 0)] * batch.num_columns
            full = full or sum(length for _, length in places) <= _FULL_REUSE_BYTES
            if full:
                # Hashed in place from the mapping (no copy: ~3x faster than reading into
                # buffers); every column must lie inside the file, or it is truncated.
                sums = json.loads(meta["fx.checksums"])
                size = src.size()
                if any(off + length > size for off, length in places):
                    raise _Stale("unreadable")
                src.seek(0)
                whole = memoryview(src.read_buffer(size))
                for name, (off, length) in zip(batch.schema.names, places, strict=True):
                    h = new_hasher()
                    h.update(whole[off : off + length])
                    if digest_of(h) != sums.get(name):
                        raise _Stale("checksum mismatch", f"in column {name}")
            else:
                with open(path, "rb") as f:
                    sampled = _sample_digest([(f.fileno(), off, length) for off, length in places])
                if sampled != meta["fx.sample_checksum"]:
                    raise _Stale("checksum mismatch")
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError) as exc:
        raise _Stale("unreadable") from exc
    return meta


def _info(source: Path, path: Path, meta: dict[str, str]) -> SidecarInfo:
    return SidecarInfo(
        path=path,
        source=source,
        schema=meta["fx.schema"],
        dataset=meta["fx.dataset"],
        n_records=int(meta["fx.n_records"]),
        source_hash=meta["fx.source_hash"],
        source_size=int(meta["fx.source_size"]),
        source_mtime_ns=int(meta["fx.source_mtime_ns"]),
        format_version=int(meta["fx.format_version"]),
        symbol_map=tuple(_parse_symbol_map(path, meta["fx.symbol_map"])),
        rebuilt=False,
    )


def verify_sidecar(sidecar_path: Path | str, source_path: Path | str) -> None:
    """Full check of a sidecar against its source: the source is hashed again (whole file, the
    stat record ignored) and every column's checksum, the schema and the format are verified.
    FxDataError naming the sidecar (and what failed) otherwise."""
    sidecar_path, source_path = Path(sidecar_path), Path(source_path)
    if not sidecar_path.is_file():
        raise FxDataError(f"{sidecar_path}: sidecar does not exist")
    try:
        current = hash_file(source_path)
    except OSError as exc:
        raise FxDataError(f"{source_path}: cannot read the source of {sidecar_path.name}: {exc}") from exc
    try:
        _check(sidecar_path, source_path, current, None, full=True)
    except _Stale as exc:
        raise FxDataError(
            f"{sidecar_path}: sidecar failed verification against {source_path}: {' '.join(exc.args)}"
        ) from None


def ensure_sidecar(
    source: Path | str,
    sidecar_dir: Path | str,
    rebuild: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: ProgressFn | None = None,
    *,
    expect_schema: str | None = None,
    expect_dataset: str | None = None,
    code_version: str = "",
) -> SidecarInfo:
    """Return a sidecar of ``source`` in ``sidecar_dir``, reusing a fresh one, rebuilding a stale one.

    Fresh means: format version, decoder ``code_version`` (the caller's version of the decoding
    code; recorded in the sidecar), source path and size and the source's content hash (the one
    recorded for the current stat, else hashed now) match, the schema is intact (and is
    ``expect_schema``), and the sampled body checksum verifies. Under the build lock of the
    sidecar, so a concurrent second caller waits and then reuses. A stale sidecar stays in
    place (readable) until its replacement is renamed over it; if the rebuild fails it is
    removed, so nothing that could be trusted is left. ``SidecarInfo.reason`` says why it was
    decoded.
    """
    source, sidecar_dir = Path(source), Path(sidecar_dir)
    dest = sidecar_path(source, sidecar_dir)
    with build_lock(dest):
        try:
            st = os.stat(source)
        except OSError as exc:
            raise FxDataError(f"{source}: cannot stat the DBN source: {exc}") from exc
        known = recorded_hash(source, sidecar_dir, st)
        reason = "forced" if rebuild else "missing"
        if not rebuild and dest.exists():
            if known is None:
                known = content_hash(source, sidecar_dir)
            try:
                return _info(
                    source, dest, _check(dest, source, known, expect_schema, full=False, code=code_version)
                )
            except _Stale as exc:
                reason = exc.args[0]
        try:
            info = build_sidecar(
                source,
                dest,
                chunk_bytes=chunk_bytes,
                progress=progress,
                expect_schema=expect_schema,
                expect_dataset=expect_dataset,
                record_dir=sidecar_dir,
                code_version=code_version,
            )
        except BaseException:
            if reason not in ("missing", "forced"):
                dest.unlink(missing_ok=True)  # stale: never left behind to be trusted
            raise
        # sidecars of this source with another format version are obsolete now
        prefix = dest.name[: -len(f"{SIDECAR_FORMAT_VERSION}.arrow")]
        for old in sidecar_dir.glob(f"{glob.escape(prefix)}*.arrow"):
            if old != dest and old.name[len(prefix) : -len(".arrow")].isdigit():
                old.unlink(missing_ok=True)
        return dataclasses.replace(info, reason=reason)


# ----------------------------------------------------------------------------------------------
# reading


def _open_batch(path: Path) -> pa.RecordBatch:
    try:
        src = pa.memory_map(str(path), "r")
        reader = pa.ipc.open_file(src)
    except (OSError, pa.ArrowException) as exc:
        raise FxCacheError(f"{path}: not a readable Arrow IPC sidecar: {exc}") from exc
    if reader.num_record_batches != 1:
        raise FxCacheError(f"{path}: sidecar has {reader.num_record_batches} record batches, expected 1")
    if "fx.format_version" not in _meta(reader.schema):
        raise FxCacheError(f"{path}: Arrow file has no fx.format_version metadata (not a sidecar)")
    return reader.get_batch(0)


def open_sidecar(path: Path | str) -> pa.Table:
    """The sidecar as a memory-mapped, zero-copy ``pa.Table`` (one chunk per column)."""
    return pa.Table.from_batches([_open_batch(Path(path))])


def sidecar_columns(path: Path | str, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Zero-copy read-only numpy views of the named columns (all columns if ``names`` is None)."""
    path = Path(path)
    batch = _open_batch(path)
    wanted = list(batch.schema.names if names is None else names)
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        if name not in batch.schema.names:
            raise FxDataError(f"{path}: sidecar has no column {name!r} (has {batch.schema.names})")
        out[name] = _view(batch.column(name))
    return out


def _view(col: pa.Array) -> np.ndarray:
    """Read-only numpy view of a null-free fixed-width column's data buffer (no copy).

    ``np.frombuffer`` on the Arrow buffer rather than ``to_numpy``: same view, but without
    pyarrow's first-call import of its pandas shim (~0.2 s), which would dominate a warm load.
    """
    if col.null_count:
        raise FxCacheError(f"sidecar column of type {col.type} has {col.null_count} nulls")
    dtype = np.dtype(col.type.to_pandas_dtype())
    return np.frombuffer(col.buffers()[1], dtype=dtype, count=len(col), offset=col.offset * dtype.itemsize)


def _parse_symbol_map(where: Any, text: str) -> list[SymbolInterval]:
    try:
        return [SymbolInterval.from_json(d) for d in json.loads(text)]
    except (ValueError, KeyError, TypeError) as exc:
        raise FxCacheError(f"{where}: malformed fx.symbol_map metadata: {exc}") from exc


def read_symbol_map(
    table_or_path: pa.Table | pa.RecordBatch | pa.Schema | Path | str,
) -> list[SymbolInterval]:
    """The DBN symbology (raw symbol <-> instrument id per date interval) recorded in a sidecar."""
    if isinstance(table_or_path, (str, Path)):
        with pa.memory_map(str(table_or_path), "r") as src:
            schema = pa.ipc.open_file(src).schema
    elif isinstance(table_or_path, pa.Schema):
        schema = table_or_path
    else:
        schema = table_or_path.schema
    meta = _meta(schema)
    if "fx.symbol_map" not in meta:
        raise FxCacheError(f"{table_or_path!r}: no fx.symbol_map metadata")
    return _parse_symbol_map(table_or_path, meta["fx.symbol_map"])


# ----------------------------------------------------------------------------------------------
# inspection


def _iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat()


class _Stats:
    """Running count / time range / per-instrument counts / per-column min & max."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.n = 0
        self.minmax: dict[str, list[int]] = {}
        self.per_instrument: dict[int, int] = {}

    def add(self, cols: dict[str, np.ndarray]) -> None:
        if not len(cols["ts_recv"]):
            return
        self.n += len(cols["ts_recv"])
        for name in self.names:
            a = cols[name]
            lo, hi = int(a.min()), int(a.max())
            if name in self.minmax:
                self.minmax[name] = [min(lo, self.minmax[name][0]), max(hi, self.minmax[name][1])]
            else:
                self.minmax[name] = [lo, hi]
        ids, counts = np.unique(cols["instrument_id"], return_counts=True)
        for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
            self.per_instrument[i] = self.per_instrument.get(i, 0) + c

    def result(self, mappings: Iterable[SymbolInterval]) -> dict[str, Any]:
        symbols: dict[int, set[str]] = {}
        for m in mappings:
            symbols.setdefault(m.instrument_id, set()).add(m.raw_symbol)
        ts = self.minmax.get("ts_recv")
        return {
            "n_records": self.n,
            "ts_recv_range": None
            if ts is None
            else {"min": ts[0], "max": ts[1], "min_utc": _iso(ts[0]), "max_utc": _iso(ts[1])},
            "instruments": [
                {"instrument_id": i, "raw_symbols": sorted(symbols.get(i, ())), "n_records": c}
                for i, c in sorted(self.per_instrument.items())
            ],
            "columns": {name: {"min": mm[0], "max": mm[1]} for name, mm in self.minmax.items()},
        }


def describe_dbn(path: Path | str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict[str, Any]:
    """Header info of a DBN file; for supported schemas also counts, time range, instruments, min/max."""
    path = Path(path)
    h = dbn.read_header(path)
    out: dict[str, Any] = {
        "path": str(path),
        "size": path.stat().st_size,
        "compressed": h.compressed,
        "dbn_version": h.version,
        "dataset": h.dataset,
        "schema": h.schema,
        "start": h.start,
        "end": h.end,
        "limit": h.limit,
        "stype_in": h.stype_in,
        "stype_out": h.stype_out,
        "ts_out": h.ts_out,
        "symbols": list(h.symbols),
        "symbol_map": [m.to_json() for m in h.mappings],
        "header_hash": h.header_hash,
        "content_hash": hash_file(path),
        "decodable": h.schema in SCHEMAS,
    }
    if h.schema in SCHEMAS:
        names = [n for n, _ in _columns(SCHEMAS[h.schema])]
        stats = _Stats(names)
        for arr in dbn.iter_records(path, chunk_bytes):
            stats.add({n: arr[n] for n in names})
        out.update(stats.result(h.mappings))
    return out


def describe_sidecar(path: Path | str) -> dict[str, Any]:
    """Metadata, record count, time range, instruments and per-column min/max of a sidecar."""
    path = Path(path)
    batch = _open_batch(path)
    meta = _meta(batch.schema)
    symbol_map = _parse_symbol_map(path, meta["fx.symbol_map"])
    out: dict[str, Any] = {"path": str(path), "size": path.stat().st_size}
    out.update({k: v for k, v in meta.items() if k not in ("fx.symbol_map", "fx.checksums")})
    try:  # every column against its checksum (the source is not compared: verify_sidecar does)
        _check(path, None, None, None, full=True)
        out["body_checksum"] = "ok"
    except _Stale as exc:
        out["body_checksum"] = f"FAILED: {' '.join(exc.args)}"
    out["symbol_map"] = [m.to_json() for m in symbol_map]
    out["column_types"] = {f.name: str(f.type) for f in batch.schema}
    stats = _Stats(list(batch.schema.names))
    stats.add({n: _view(batch.column(n)) for n in batch.schema.names})
    out.update(stats.result(symbol_map))
    return out
