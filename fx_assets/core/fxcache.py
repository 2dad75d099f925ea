"""The fxcache file: one flat, memory-mappable file of bar values per (quarter, symbol, key).

Owns the binary format of DESIGN.md §4 (byte table in ``docs/fxcache.md``), its writer and
its validating, zero-copy reader.

Layout (little-endian, every block aligned to 64 bytes)::

    header (256 bytes) | ts_close int64[n] | prices f64 [n, price_width] | values [n, row_width] | JSON trailer

Prices (the ``price`` group: open, high, low, close, vwap, mid at open, contract code, ...) are
always float64, whatever the value dtype: labels are log-returns over a few bars of prices
that move by one tick (~5e-5 of the level), and contract codes (202403, 202406) must stay
distinct, so no value dtype may round them (bf16 keeps 8 significant bits: 130 distinct
closes became 2 values once). The value block holds the feature and OFI columns in the chosen
dtype (f32 | bf16 | f64) as ONE row-major array, so a trainer hands each block to the GPU in a
single copy. Rows of both blocks are padded with zeros to a multiple of 8 values. bf16 values
are stored as uint16 (the top 16 bits of the float32, rounded to nearest even), so no torch is
needed to read or write them.

Every body carries an XXH3-128 checksum (``fx_assets.core.checksum``) written at creation: the
timestamp, price, value and trailer regions (each including its zero padding) and the header
fields themselves (cache key included). ``open_fxcache`` verifies them all by default (a full
read of the file: 42-57 ms for a scale-1 quarter on the H200 host, see docs/fxcache.md), so an
in-place change of any byte is an ``FxCacheError``, never a silent reuse.

What is *not* in the file: labels, forward returns, targets, normalisation statistics. They
look ahead or depend on the fold, so they are derived at training time (labels.py, folds.py).

Validation on load (every failure is an ``FxCacheError`` naming the file): magic, format
version, dtype, flags, block offsets and sizes against the file size (truncation, trailing
bytes), the trailer's columns against the header and its schema hash, the checksums,
non-decreasing timestamps, finite values (chunked scan), and has_ofi honesty: the flag is set
if and only if OFI columns exist and are not all zero (the predecessor's flag once claimed
OFI for a file of zeros).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
from numba import njit

from fx_assets.core import checksum
from fx_assets.core.atomic import atomic_path
from fx_assets.core.errors import FxCacheError, FxDataError
from fx_assets.core.tables import array_of

MAGIC = b"FXCACHE\0"
FORMAT_VERSION = 2
HEADER_SIZE = 256
ALIGN = 64
ROW_ALIGN = 8  # row widths are padded to a multiple of this many values
KEY_BYTES = 32
DIGEST_BYTES = 16  # XXH3-128
FLAG_HAS_OFI = 1
KNOWN_FLAGS = FLAG_HAS_OFI
GROUPS: tuple[str, ...] = ("feature", "price", "ofi")
VALUE_GROUPS: tuple[str, ...] = ("feature", "ofi")  # in the value block, in this order
PRICE_DTYPE = "f64"  # the price block's type, whatever the value dtype

DType = Literal["f32", "bf16", "f64"]
DTYPE_CODES: dict[str, int] = {"f32": 1, "bf16": 2, "f64": 3}
CODE_DTYPES: dict[int, str] = {v: k for k, v in DTYPE_CODES.items()}
# numpy storage dtype of each value dtype (bf16 is stored as its raw 16 bits)
STORAGE: dict[str, np.dtype[Any]] = {
    "f32": np.dtype("<f4"),
    "bf16": np.dtype("<u2"),
    "f64": np.dtype("<f8"),
}
REGIONS: tuple[str, ...] = ("ts", "price", "values", "trailer")

# magic, version, dtype code, flags, n_feature, n_price, n_ofi, row_width, price_width,
# header_size, n_bars, cache_key, schema_hash, ts_offset, price_offset, values_offset,
# trailer_offset, trailer_length, then the checksums of the ts, price, values, trailer regions
_HEADER = struct.Struct("<8sHHI IIIII I Q 32s32s QQQQQ 16s16s16s16s")
_HEADER_USED = _HEADER.size  # 216; then reserved zeros up to the header checksum
_HEADER_SUM_AT = HEADER_SIZE - DIGEST_BYTES  # 240: XXH3-128 of bytes [0, 240)
assert _HEADER_USED <= _HEADER_SUM_AT

DEFAULT_CHUNK_ROWS = 1 << 16
# write_fxcache's chunk: a chunk's value block (4 MiB at 64 f32 columns) stays in cache
# from its fill through its hash and write (half the CPU time of 1 << 16 rows)
WRITE_CHUNK_ROWS = 1 << 14

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


# --- bf16 -----------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _bf16_of(b: np.uint32) -> np.uint16:
    """bf16 bits of one float32's raw bits, rounded to nearest, ties to even (``f32_to_bf16_bits``'s
    integer operations: for a non-NaN, bits + 0x7FFF + lsb stays below 2^32 (only NaN patterns
    are that high), so no wrap-around differs; a NaN keeps its top half with the quiet bit set)."""
    if (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (b & np.uint32(0x007FFFFF)) != 0:
        return np.uint16((b >> np.uint32(16)) | np.uint32(0x0040))
    lsb = (b >> np.uint32(16)) & np.uint32(1)
    return np.uint16(((b + np.uint32(0x7FFF) + lsb) >> np.uint32(16)) & np.uint32(0xFFFF))


@njit(cache=True, nogil=True)
def _bf16_bits_nb(bits: npt.NDArray[np.uint32], out: npt.NDArray[np.uint16]) -> None:
    """``f32_to_bf16_bits`` on raw float32 bits (1-D), one pass (the NumPy form makes five
    temporaries of the block: 0.55 s of the scale-1 snapshot fxcache's bf16 write)."""
    for i in range(bits.shape[0]):
        out[i] = _bf16_of(np.uint32(bits[i]))


@njit(cache=True, nogil=True)
def _bf16_rows_nb(bits: npt.NDArray[np.uint32], out: npt.NDArray[np.uint16], nv: int) -> bool:
    """The bf16 bits of a [m, w] float32 block (raw bits) into ``out``, and whether any of its
    first ``nv`` columns is stored non-finite (exponent bits all ones: rounding can overflow to
    inf): the writer's conversion and finite screen in one pass, without the block-sized
    temporaries of converting and then testing a strided slice."""
    bad = False
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            h = _bf16_of(np.uint32(bits[i, j]))
            out[i, j] = h
            bad |= (j < nv) & ((h & np.uint16(0x7F80)) == np.uint16(0x7F80))
    return bad


@njit(cache=True, nogil=True)
def _first_decrease_nb(t: npt.NDArray[np.int64]) -> int:
    """The first ``i`` with ``t[i] < t[i - 1]``, else -1 (no ``np.diff`` temporary)."""
    for i in range(1, t.shape[0]):
        if t[i] < t[i - 1]:
            return i
    return -1


def f32_to_bf16_bits(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """bf16 bits of ``x`` (converted to float32 first), rounded to nearest, ties to even.

    NaN stays NaN (quiet bit forced so rounding cannot turn it into inf); values that round
    past the largest bf16 become +-inf, which the writer then rejects as non-finite.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    if f.ndim >= 1 and f.size:  # one compiled pass (_bf16_bits_nb); a 0-d scalar below
        out = np.empty(f.shape, dtype=np.uint16)
        _bf16_bits_nb(f.reshape(-1).view(np.uint32), out.reshape(-1))
        return out
    bits = f.view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def bf16_bits_to_f64(bits: npt.ArrayLike) -> F64:
    """float64 values of raw bf16 bits (exact: every bf16 is a float32)."""
    b = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return b.view(np.float32).astype(np.float64)


def _decode(block: npt.NDArray[Any], dtype: str) -> F64:
    if dtype == "bf16":
        return bf16_bits_to_f64(block)
    return np.asarray(block, dtype=np.float64)


# --- header / schema ------------------------------------------------------------------------


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def padded_width(n_columns: int) -> int:
    return max(ROW_ALIGN, (n_columns + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN)


def _tagged(digest: bytes) -> str:
    return f"{checksum.ALGORITHM}:{digest.hex()}"


@dataclass(frozen=True)
class FxCacheHeader:
    format_version: int
    dtype: str
    flags: int
    n_feature: int
    n_price: int
    n_ofi: int
    row_width: int  # values per row of the value block (features + OFI, padded)
    price_width: int  # values per row of the f64 price block (padded)
    header_size: int
    n_bars: int
    cache_key: bytes
    schema_hash: bytes
    ts_offset: int
    price_offset: int
    values_offset: int
    trailer_offset: int
    trailer_length: int
    ts_checksum: bytes
    price_checksum: bytes
    values_checksum: bytes
    trailer_checksum: bytes

    @property
    def has_ofi(self) -> bool:
        return bool(self.flags & FLAG_HAS_OFI)

    @property
    def n_columns(self) -> int:
        return self.n_feature + self.n_price + self.n_ofi

    @property
    def n_values(self) -> int:
        """Real (not padding) columns of the value block."""
        return self.n_feature + self.n_ofi

    @property
    def itemsize(self) -> int:
        return STORAGE[self.dtype].itemsize

    @property
    def file_size(self) -> int:
        return self.trailer_offset + self.trailer_length

    def regions(self) -> dict[str, tuple[int, int]]:
        """Checksummed byte ranges ``[start, end)`` of the file, padding included."""
        return {
            "ts": (self.ts_offset, self.price_offset),
            "price": (self.price_offset, self.values_offset),
            "values": (self.values_offset, self.trailer_offset),
            "trailer": (self.trailer_offset, self.file_size),
        }

    def checksums(self) -> dict[str, bytes]:
        return {
            "ts": self.ts_checksum,
            "price": self.price_checksum,
            "values": self.values_checksum,
            "trailer": self.trailer_checksum,
        }

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cache_key"] = self.cache_key.hex()
        d["schema_hash"] = self.schema_hash.hex()
        for name, digest in self.checksums().items():
            d[f"{name}_checksum"] = _tagged(digest)
        d["has_ofi"] = self.has_ofi
        d["price_dtype"] = PRICE_DTYPE
        return d

    def pack(self) -> bytes:
        """The 256 header bytes, its own checksum (over bytes 0..239) last."""
        raw = _HEADER.pack(
            MAGIC,
            self.format_version,
            DTYPE_CODES[self.dtype],
            self.flags,
            self.n_feature,
            self.n_price,
            self.n_ofi,
            self.row_width,
            self.price_width,
            self.header_size,
            self.n_bars,
            self.cache_key,
            self.schema_hash,
            self.ts_offset,
            self.price_offset,
            self.values_offset,
            self.trailer_offset,
            self.trailer_length,
            self.ts_checksum,
            self.price_checksum,
            self.values_checksum,
            self.trailer_checksum,
        )
        raw += bytes(_HEADER_SUM_AT - len(raw))
        return raw + _digest(raw)


def _digest(data: bytes | memoryview) -> bytes:
    h = checksum.new_hasher()
    h.update(data)
    return h.digest()


@dataclass(frozen=True)
class FxColumn:
    name: str
    group: str  # feature | price | ofi
    index: int  # position in its block's row (value block: features then OFI; price block)

    @property
    def block(self) -> str:
        return "price" if self.group == "price" else "values"


def schema_hash(columns: Sequence[FxColumn], dtype: str, row_width: int, price_width: int) -> bytes:
    """SHA-256 of the ordered column names and groups, the dtypes and the widths."""
    counts = {g: sum(1 for c in columns if c.group == g) for g in GROUPS}
    doc = {
        "columns": [[c.name, c.group] for c in columns],
        "dtype": dtype,
        "price_dtype": PRICE_DTYPE,
        "n_feature": counts["feature"],
        "n_price": counts["price"],
        "n_ofi": counts["ofi"],
        "row_width": row_width,
        "price_width": price_width,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).digest()


def _layout(
    n_bars: int, price_width: int, row_width: int, itemsize: int, trailer_length: int
) -> tuple[int, int, int, int, int]:
    ts_offset = HEADER_SIZE
    price_offset = _align(ts_offset + 8 * n_bars)
    values_offset = _align(price_offset + n_bars * price_width * 8)
    trailer_offset = _align(values_offset + n_bars * row_width * itemsize)
    return ts_offset, price_offset, values_offset, trailer_offset, trailer_offset + trailer_length


# --- writer ---------------------------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"fxcache meta: {type(obj).__name__} is not JSON serialisable")


def _readonly(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only view: every column of a block then has one numba type (mapped table columns
    are read-only already), so the fill kernel takes them as one homogeneous tuple."""
    v = a.view()
    v.flags.writeable = False
    return v


class ColumnBlock:
    """One group's columns as separate 1-D arrays, not stacked, with an optional row selection.

    :func:`write_fxcache` copies them chunk by chunk straight into their place in the file's
    row-major block, so no [n, k] copy of the group (nor of its selected rows) is ever made.
    Reads like the [n, k] float64 array it stands for (``shape``, indexing, ``np.asarray``), which
    stacks it on demand: for callers that inspect an assembly, not for the writer.
    """

    def __init__(self, columns: Sequence[npt.NDArray[Any]], n_rows: int, rows: I64 | None = None) -> None:
        # float64 columns (a view when they already are): values are converted to float64 first,
        # then to the stored dtype, exactly as a stacked float64 block would be.
        self.columns = tuple(_readonly(np.ascontiguousarray(c, dtype=np.float64)) for c in columns)
        for c in self.columns:
            if c.ndim != 1 or c.shape[0] != n_rows:
                raise FxDataError(f"ColumnBlock: column of shape {c.shape}, expected ({n_rows},)")
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self.n_rows = n_rows
        self.dtype = np.dtype(np.float64)

    def select(self, rows: I64 | None) -> ColumnBlock:
        """The same columns (not copied) with the row selection ``rows`` (None: every row)."""
        out = object.__new__(ColumnBlock)
        out.columns, out.n_rows, out.dtype = self.columns, self.n_rows, self.dtype
        out.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        return out

    @property
    def shape(self) -> tuple[int, int]:
        n = self.n_rows if self.rows is None else int(self.rows.shape[0])
        return (n, len(self.columns))

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def column_rows(self, c: int, lo: int, hi: int) -> F64:
        """Rows ``lo:hi`` (of the selection) of column ``c`` as float64."""
        col = self.columns[c]
        part = col[lo:hi] if self.rows is None else col[self.rows[lo:hi]]
        return np.asarray(part, dtype=np.float64)

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        n, k = self.shape
        out = np.empty((n, k), dtype=np.float64)
        for c in range(k):
            out[:, c] = self.column_rows(c, 0, n)
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, item: Any) -> Any:
        return np.asarray(self)[item]

    @property
    def T(self) -> npt.NDArray[Any]:
        return np.asarray(self).T


_FILL_ROWS = 2048  # rows per block: a block of the output stays in cache while each column is written


# Flags returned by the fill kernel about the values as stored (after the cast).
_NONFINITE = 1
_NONZERO = 2


@njit(cache=True, nogil=True)
def _fill_columns_nb(cols, rows, lo, hi, out, c0, nz_from):
    """``out[r - lo, c0 + c] = cols[c][rows[r]]`` (``rows`` empty: ``cols[c][r]``) for
    ``r`` in ``[lo, hi)``, block by block; the float64 value is cast to ``out``'s dtype on
    assignment (round to nearest, as numpy's cast). Returns flags about the stored values,
    found in the same pass so that no second scan of the chunk is needed: ``_NONFINITE`` (one
    is NaN or inf), ``_NONZERO`` (one of the columns ``c >= nz_from`` is not zero)."""
    sel = rows.shape[0] > 0
    nonfinite = False
    nonzero = False
    for b0 in range(lo, hi, _FILL_ROWS):
        b1 = min(hi, b0 + _FILL_ROWS)
        for c in range(len(cols)):
            col = cols[c]
            for r in range(b0, b1):
                out[r - lo, c0 + c] = col[rows[r]] if sel else col[r]
                x = out[r - lo, c0 + c]
                if x - x != 0:  # NaN or inf (x - x is NaN for both)
                    nonfinite = True
                elif x != 0 and c >= nz_from:
                    nonzero = True
    return (_NONFINITE if nonfinite else 0) | (_NONZERO if nonzero else 0)


_NO_ROWS = np.empty(0, dtype=np.int64)


def _same_rows(a: ColumnBlock, b: ColumnBlock) -> bool:
    return a.rows is b.rows or (a.rows is not None and b.rows is not None and np.array_equal(a.rows, b.rows))


def _fill_chunk(
    out: npt.NDArray[Any], parts: Sequence[npt.NDArray[Any] | ColumnBlock], lo: int, hi: int
) -> list[int]:
    """Rows ``lo:hi`` of the groups ``parts`` (side by side) into ``out[: hi - lo, :k]``: each
    value as float64 first, then cast to ``out``'s dtype on assignment (the same rounding as
    converting a stacked float64 block). Returns, per part, flags about its values as stored
    in ``out``: ``_NONFINITE`` (set on every part of a kernel call that met one), and
    ``_NONZERO`` for the last part only (what the OFI honesty check needs).

    Adjacent ColumnBlocks with the same row selection go through ONE kernel call as one tuple
    of columns (features and OFI: one numba specialisation to load per process, not two)."""
    flags: list[int] = [0] * len(parts)
    c0 = 0
    i = 0
    # Overflow to inf (f32) is expected here and caught by the finite check that follows.
    with np.errstate(over="ignore", invalid="ignore"):
        while i < len(parts):
            g = parts[i]
            if isinstance(g, ColumnBlock):
                j = i + 1
                while j < len(parts) and isinstance(parts[j], ColumnBlock) and _same_rows(g, parts[j]):  # type: ignore[arg-type]
                    j += 1
                blocks = [p for p in parts[i:j] if isinstance(p, ColumnBlock)]
                cols = tuple(c for blk in blocks for c in blk.columns)
                k = len(cols)
                if k:
                    rows = _NO_ROWS if g.rows is None else g.rows
                    nz_from = k - len(blocks[-1].columns)
                    f = int(_fill_columns_nb(cols, rows, lo, hi, out, c0, nz_from))
                    for x in range(i, j):
                        flags[x] = f & _NONFINITE
                    flags[j - 1] |= f & _NONZERO
                i, c0 = j, c0 + k
            else:
                k = g.shape[1]
                part = out[: hi - lo, c0 : c0 + k]
                part[...] = np.asarray(g[lo:hi], dtype=np.float64)
                flags[i] = (0 if bool(np.isfinite(part).all()) else _NONFINITE) | (
                    _NONZERO if bool(np.any(part != 0)) else 0
                )
                i, c0 = i + 1, c0 + k
    return flags


def _all_finite(stored: npt.NDArray[Any], dtype: str) -> bool:
    if dtype == "bf16":  # exponent bits all ones: inf or NaN
        return not bool(np.any((stored & np.uint16(0x7F80)) == np.uint16(0x7F80)))
    # A NaN or inf makes the sum NaN or inf: one reduction, no boolean temporary of the block.
    # A sum that overflows only sends the caller to its exact (decoding) check.
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.sum(stored)))


def _check_groups(path: Path, names: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The groups' column names (empty groups left out); FxDataError on an unknown group, an
    empty or repeated name, or no columns at all."""
    unknown = set(names) - set(GROUPS)
    if unknown:
        raise FxDataError(f"{path}: unknown column groups {sorted(unknown)} (expected {list(GROUPS)})")
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for group in GROUPS:
        cols = [str(x) for x in names.get(group, ())]
        for name in cols:
            if not name or name in seen:
                raise FxDataError(f"{path}: column name {name!r} is empty or repeated")
            seen.add(name)
        if cols:
            out[group] = cols
    if not out:
        raise FxDataError(f"{path}: no columns to write")
    return out


def _as_block(
    path: Path, group: str, names: Sequence[str], values: Any, n: int
) -> npt.NDArray[Any] | ColumnBlock:
    """``values`` as an [n, len(names)] array (or the ColumnBlock itself), shape and type checked."""
    arr: npt.NDArray[Any] | ColumnBlock = values if isinstance(values, ColumnBlock) else np.asarray(values)
    if arr.ndim == 1 and len(names) == 1 and isinstance(arr, np.ndarray):
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2 or arr.shape != (n, len(names)):
        raise FxDataError(
            f"{path}: group {group!r} has shape {arr.shape}, expected ({n}, {len(names)}) for {list(names)}"
        )
    if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
        raise FxDataError(f"{path}: group {group!r} has non-numeric dtype {arr.dtype}")
    return arr


class FxCacheWriter:
    """Writes an fxcache file incrementally: row chunks appended in order, then finalised.

    The row count is declared up front (``n_rows``), so every block's place in the file is known
    from the start: each appended chunk is converted to its stored form, checked (finite, ts
    order), hashed into its region's running XXH3-128 and written at its offset of a temporary
    file beside ``path`` (``atomic.atomic_path``). :meth:`finish` checks that exactly
    ``n_rows`` rows came, writes the JSON trailer and then the header with the checksums, and
    renames the file into place. Memory is two chunks (``chunk_rows`` rows of each block: the
    next one is filled on a second thread while the current one is hashed and written) whatever
    the file size; the bytes are those :func:`write_fxcache` writes for the same rows.

    A writer that fails (an exception, :meth:`abort`) removes its temporary file; one that is
    killed leaves a temporary name whose header is still zeros (bad magic: never opened as an
    fxcache; ``locks.remove_orphans`` removes it at the next build). Nothing a later run
    trusts exists before :meth:`finish` returns. Use it as a context manager: leaving the block
    normally finishes the file, an exception aborts it.

    ``row_label`` names a row in error messages (``bar`` for bar rows, ``row`` for snapshots).
    """

    def __init__(
        self,
        path: Path | str,
        names: Mapping[str, Sequence[str]],
        dtype: DType,
        cache_key: bytes,
        n_rows: int,
        meta: Mapping[str, Any] | None = None,
        *,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        row_label: str = "row",
    ) -> None:
        self.path = path = Path(path)
        if dtype not in DTYPE_CODES:
            raise FxDataError(
                f"{path}: unknown fxcache dtype {dtype!r} (expected one of {sorted(DTYPE_CODES)})"
            )
        if not isinstance(cache_key, bytes | bytearray) or len(cache_key) != KEY_BYTES:
            raise FxDataError(f"{path}: cache key must be {KEY_BYTES} bytes")
        if int(n_rows) < 0:
            raise FxDataError(f"{path}: n_rows must be >= 0, got {n_rows}")
        self.names = _check_groups(path, names)
        self.dtype: DType = dtype
        self.cache_key = bytes(cache_key)
        self.n_rows = n = int(n_rows)
        self.meta = dict(meta or {})
        self.chunk_rows = max(1, int(chunk_rows))
        self.row_label = row_label
        nf, npx, no = (len(self.names.get(g, [])) for g in GROUPS)
        self._nf, self._npx, self._no = nf, npx, no
        self.specs = (
            [FxColumn(c, "feature", i) for i, c in enumerate(self.names.get("feature", []))]
            + [FxColumn(c, "price", i) for i, c in enumerate(self.names.get("price", []))]
            + [FxColumn(c, "ofi", nf + i) for i, c in enumerate(self.names.get("ofi", []))]
        )
        self._value_specs = [c for c in self.specs if c.block == "values"]
        self._price_specs = [c for c in self.specs if c.block == "price"]
        self.row_width, self.price_width = padded_width(nf + no), padded_width(npx)
        self._itemsize = STORAGE[dtype].itemsize
        self._ts_off, self._px_off, self._val_off, self._tr_off, _ = _layout(
            n, self.price_width, self.row_width, self._itemsize, 0
        )
        self.rows = 0
        self._last_ts: int | None = None
        self._ofi_nonzero = False
        self._hash = {r: checksum.new_hasher() for r in ("ts", "price", "values")}
        # price / value chunk buffers, one set per fill slot (two when chunks are filled ahead)
        self._bufs: list[tuple[F64 | None, npt.NDArray[Any]]] = []
        self._bf16_buf = np.empty((0, 0), dtype=np.uint16)  # bf16 bits of the chunk being written
        self._done = False
        #: the header written by :meth:`finish` (its region checksums are those of the bytes
        #: that were checked in memory), None before
        self.header: FxCacheHeader | None = None
        self._fd = -1
        self._stack = contextlib.ExitStack()
        try:
            self._tmp = self._stack.enter_context(atomic_path(path))
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            # Zeros up to the trailer (sparse): the header stays zero until finish, and every
            # padding byte is already what the format says.
            os.ftruncate(self._fd, self._tr_off)
        except BaseException as exc:
            self._stack.__exit__(type(exc), exc, exc.__traceback__)
            raise

    # -- appending ----------------------------------------------------------------------------
    def append(self, ts: npt.ArrayLike, groups: Mapping[str, Any]) -> None:
        """Append rows: ``ts`` int64 [m] (non-decreasing, also across appends) and, for every
        group of the writer, its values [m, k] (array or :class:`ColumnBlock`)."""
        if self._done:
            raise FxDataError(f"{self.path}: append after the writer was finished or aborted")
        ts_arr = np.ascontiguousarray(ts, dtype=np.int64)
        if ts_arr.ndim != 1:
            raise FxDataError(f"{self.path}: ts must be one-dimensional, got shape {ts_arr.shape}")
        m = int(ts_arr.shape[0])
        extra = set(groups) - set(self.names)
        if extra:
            raise FxDataError(f"{self.path}: groups {sorted(extra)} were not declared ({list(self.names)})")
        arrays = {}
        for g, names in self.names.items():
            if g not in groups:
                raise FxDataError(f"{self.path}: append without group {g!r}")
            arrays[g] = _as_block(self.path, g, names, groups[g], m)
        self._append(ts_arr, arrays, 0, m)

    def _append(
        self, ts: I64, arrays: Mapping[str, npt.NDArray[Any] | ColumnBlock], lo: int, hi: int
    ) -> None:
        """Rows ``lo:hi`` of ``ts`` and of the (checked) group arrays, ``chunk_rows`` at a time.

        With more than one chunk, the next chunk is filled on a second thread (the fill kernel
        is nogil) while this one checks, hashes and writes the current one: two buffer sets in
        turn, the same bytes in the same order, errors raised for the first bad chunk."""
        if self.rows + (hi - lo) > self.n_rows:
            self.abort()
            raise FxDataError(f"{self.path}: more than the declared {self.n_rows} rows appended")
        starts = list(range(lo, hi, self.chunk_rows))
        try:
            if len(starts) < 2:
                for a in starts:
                    b = min(hi, a + self.chunk_rows)
                    self._commit_chunk(ts, a, b, self._fill_chunk_rows(arrays, a, b, 0))
                return
            with ThreadPoolExecutor(1) as pool:
                ahead = pool.submit(self._fill_chunk_rows, arrays, starts[0], min(hi, starts[1]), 0)
                for i, a in enumerate(starts):
                    b = min(hi, a + self.chunk_rows)
                    filled = ahead.result()
                    if i + 1 < len(starts):
                        c = starts[i + 1]
                        ahead = pool.submit(
                            self._fill_chunk_rows, arrays, c, min(hi, c + self.chunk_rows), (i + 1) % 2
                        )
                    self._commit_chunk(ts, a, b, filled)
        except BaseException:
            self.abort()
            raise

    def _append_chunk(
        self, ts: I64, arrays: Mapping[str, npt.NDArray[Any] | ColumnBlock], lo: int, hi: int
    ) -> None:
        self._commit_chunk(ts, lo, hi, self._fill_chunk_rows(arrays, lo, hi, 0))

    def _fill_chunk_rows(
        self, arrays: Mapping[str, npt.NDArray[Any] | ColumnBlock], lo: int, hi: int, slot: int
    ) -> tuple[F64 | None, int, npt.NDArray[Any], list[int]]:
        """Rows ``lo:hi`` of the price and value groups in buffer set ``slot``, as stored (before
        any bf16 rounding), with :func:`_fill_chunk`'s flags; no check, hash or write yet."""
        m = hi - lo
        cap = min(self.chunk_rows, max(self.n_rows, 1))
        while len(self._bufs) <= slot:
            # bf16 is rounded from float32 (as f32_to_bf16_bits does from float64 via float32)
            fill = STORAGE["f32"] if self.dtype == "bf16" else STORAGE[self.dtype]
            px = np.zeros((cap, self.price_width), dtype=np.float64) if self._npx else None
            self._bufs.append((px, np.zeros((cap, self.row_width), dtype=fill)))
        px_buf, val_buf = self._bufs[slot]
        stored: F64 | None = None
        px_flags = 0
        if px_buf is not None:
            stored = px_buf[:m]
            (px_flags,) = _fill_chunk(stored, [arrays["price"]], lo, hi)
        filled = val_buf[:m]
        flags = _fill_chunk(filled, [arrays[g] for g in VALUE_GROUPS if g in arrays], lo, hi)
        return stored, px_flags, filled, flags

    def _commit_chunk(
        self, ts: I64, lo: int, hi: int, chunk: tuple[F64 | None, int, npt.NDArray[Any], list[int]]
    ) -> None:
        """Check, hash and write rows ``lo:hi`` filled by :meth:`_fill_chunk_rows`."""
        stored, px_flags, filled, flags = chunk
        m, r0 = hi - lo, self.rows
        t = ts[lo:hi]
        if m:
            prev = self._last_ts
            if prev is not None and t[0] < prev:
                raise FxDataError(f"{self.path}: ts decreases at {self.row_label} {r0}")
            bad = _first_decrease_nb(t)
            if bad >= 0:
                raise FxDataError(f"{self.path}: ts decreases at {self.row_label} {r0 + bad}")
            self._last_ts = int(t[-1])
        self._write("ts", self._ts_off + 8 * r0, t.astype("<i8", copy=False).data.cast("B"))
        if stored is not None:
            if px_flags & _NONFINITE:
                _check_finite_block(
                    stored[:, : self._npx], self._price_specs, r0, self.path, FxDataError, self.row_label
                )
        else:
            stored = np.zeros((m, self.price_width), dtype=np.float64)
        self._write("price", self._px_off + r0 * self.price_width * 8, stored.data.cast("B"))
        nv = self._nf + self._no
        if self.dtype == "bf16":
            # rounding to bf16 can overflow to inf and flush to zero: check the bits as stored
            # (one buffer, reused: the chunk is written before the next one is converted)
            if self._bf16_buf.shape[0] < m or self._bf16_buf.shape[1] != filled.shape[1]:
                self._bf16_buf = np.empty((max(m, self.chunk_rows), filled.shape[1]), dtype=np.uint16)
            vals = self._bf16_buf[:m]
            nonfinite = bool(_bf16_rows_nb(filled.view(np.uint32), vals, nv))
            ofi_nonzero = bool(self._no) and bool(np.any((vals[:, self._nf : nv] & np.uint16(0x7FFF)) != 0))
        else:
            # the fill kernel saw every value as stored (cast to the block's dtype)
            vals = filled
            nonfinite = any(f & _NONFINITE for f in flags)
            ofi_nonzero = bool(self._no) and bool(flags[-1] & _NONZERO)
        if nonfinite:
            _check_finite_block(
                _decode(vals[:, :nv], self.dtype),
                self._value_specs,
                r0,
                self.path,
                FxDataError,
                self.row_label,
            )
        self._ofi_nonzero = self._ofi_nonzero or ofi_nonzero
        self._write("values", self._val_off + r0 * self.row_width * self._itemsize, vals.data.cast("B"))
        self.rows = r0 + m

    def _write(self, region: str, offset: int, data: memoryview) -> None:
        self._hash[region].update(data)
        view, pos = memoryview(data), 0
        while pos < len(view):
            pos += os.pwrite(self._fd, view[pos:], offset + pos)

    # -- finishing ----------------------------------------------------------------------------
    def finish(self, meta: Mapping[str, Any] | None = None) -> Path:
        """Write trailer and header and move the file into place (``meta`` is merged into the
        trailer's meta: figures known only at the end, such as dropped-row counts)."""
        if self._done:
            raise FxDataError(f"{self.path}: the writer was already finished or aborted")
        try:
            if self.rows != self.n_rows:
                raise FxDataError(f"{self.path}: {self.rows} rows appended, {self.n_rows} declared")
            if self._no and not self._ofi_nonzero:
                raise FxDataError(
                    f"{self.path}: OFI columns {self.names['ofi']} are all zero; "
                    "refusing to write them as present (missing book data must be an error, not zeros)"
                )
            n = self.n_rows
            trailer = {
                "format_version": FORMAT_VERSION,
                "dtype": self.dtype,
                "price_dtype": PRICE_DTYPE,
                "row_width": self.row_width,
                "price_width": self.price_width,
                "columns": [{"name": c.name, "group": c.group, "index": c.index} for c in self.specs],
                "meta": {**self.meta, **dict(meta or {})},
            }
            trailer_bytes = json.dumps(
                trailer, sort_keys=True, default=_json_default, allow_nan=False
            ).encode()
            # the zero padding at the end of each region (already zero in the file) is hashed too
            self._hash["ts"].update(bytes(self._px_off - (self._ts_off + 8 * n)))
            self._hash["price"].update(bytes(self._val_off - (self._px_off + n * self.price_width * 8)))
            self._hash["values"].update(
                bytes(self._tr_off - (self._val_off + n * self.row_width * self._itemsize))
            )
            tr = checksum.new_hasher()
            tr.update(trailer_bytes)
            os.pwrite(self._fd, trailer_bytes, self._tr_off)
            header = FxCacheHeader(
                format_version=FORMAT_VERSION,
                dtype=self.dtype,
                flags=FLAG_HAS_OFI if self._no else 0,
                n_feature=self._nf,
                n_price=self._npx,
                n_ofi=self._no,
                row_width=self.row_width,
                price_width=self.price_width,
                header_size=HEADER_SIZE,
                n_bars=n,
                cache_key=self.cache_key,
                schema_hash=schema_hash(self.specs, self.dtype, self.row_width, self.price_width),
                ts_offset=self._ts_off,
                price_offset=self._px_off,
                values_offset=self._val_off,
                trailer_offset=self._tr_off,
                trailer_length=len(trailer_bytes),
                ts_checksum=self._hash["ts"].digest(),
                price_checksum=self._hash["price"].digest(),
                values_checksum=self._hash["values"].digest(),
                trailer_checksum=tr.digest(),
            )
            size = os.fstat(self._fd).st_size
            if size != self._tr_off + len(trailer_bytes):  # pragma: no cover - guards the layout arithmetic
                raise FxDataError(
                    f"{self.path}: wrote {size} bytes, layout says {self._tr_off + len(trailer_bytes)}"
                )
            os.pwrite(self._fd, header.pack(), 0)  # last: until now the file has no magic
            os.close(self._fd)
            self._fd = -1
        except BaseException:
            self.abort()
            raise
        self._done = True
        self._stack.close()  # os.replace into place
        self.header = header
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (nothing is left; an earlier file stays intact)."""
        if self._done:
            return
        self._done = True
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        exc = FxDataError(f"{self.path}: write aborted")
        with contextlib.suppress(FxDataError):
            self._stack.__exit__(FxDataError, exc, None)

    def __enter__(self) -> FxCacheWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finish()


def write_fxcache(
    path: Path | str,
    ts: npt.ArrayLike,
    columns: Mapping[str, tuple[Sequence[str], npt.ArrayLike]],
    dtype: DType,
    cache_key: bytes,
    meta: Mapping[str, Any] | None = None,
    *,
    chunk_rows: int = WRITE_CHUNK_ROWS,
    read_back: bool = False,
) -> Path:
    """Write an fxcache file of bar rows from whole arrays, atomically, and return its path.

    ``ts``: int64 bar close times (ns, non-decreasing). ``columns``: group name (``feature``,
    ``price``, ``ofi``; any may be absent) -> (column names, float array [n, k]). ``price``
    columns are stored as float64 whatever ``dtype``; ``dtype`` is the type of the feature and
    OFI value block. The rows go through :class:`FxCacheWriter` ``chunk_rows`` at a time, so
    memory beyond the inputs is two chunks. Raises ``FxDataError`` naming the file, column and
    bar on non-finite values (also after rounding to the stored dtype) and when OFI columns are
    present but all zero: an OFI-less file must say so, not carry zeros.

    ``read_back``: then read the file back and verify it in full at the cost of its checksums
    (:func:`fx_assets.core.verified.verify_written_fxcache`), which records it as verified: the
    ``fxcache_valid`` check and a reuse of this file do not verify it again.
    """
    path = Path(path)
    ts_arr = np.ascontiguousarray(ts, dtype=np.int64)
    if ts_arr.ndim != 1:
        raise FxDataError(f"{path}: ts must be one-dimensional, got shape {ts_arr.shape}")
    n = ts_arr.shape[0]
    if n > 1:
        bad = np.flatnonzero(np.diff(ts_arr) < 0)
        if bad.size:
            raise FxDataError(f"{path}: ts_close decreases at bar {int(bad[0]) + 1}")
    names = _check_groups(path, {g: v[0] for g, v in columns.items()})
    arrays = {g: _as_block(path, g, names[g], columns[g][1], n) for g in names}
    w = FxCacheWriter(path, names, dtype, cache_key, n, meta, chunk_rows=chunk_rows, row_label="bar")
    w._append(ts_arr, arrays, 0, n)
    out = w.finish()
    if read_back:
        from fx_assets.core.verified import verify_written_fxcache

        assert w.header is not None
        verify_written_fxcache(out, w.header)
    return out


def _check_finite_block(
    block: F64, specs: Sequence[FxColumn], row0: int, path: Path, err: type[FxDataError], label: str = "bar"
) -> None:
    finite = np.isfinite(block)
    if finite.all():
        return
    r, c = np.argwhere(~finite)[0]
    raise err(
        f"{path}: non-finite value {float(block[r, c])!r} in column {specs[c].name!r} at {label} {row0 + int(r)}"
    )


# --- reader ---------------------------------------------------------------------------------


class FxCache:
    """A validated, memory-mapped fxcache file (zero copy: ``ts``, ``prices``, ``values`` are views)."""

    def __init__(
        self,
        path: Path,
        header: FxCacheHeader,
        columns: tuple[FxColumn, ...],
        meta: dict[str, Any],
        raw: np.memmap[Any, np.dtype[np.uint8]],
    ) -> None:
        self.path = path
        self.header = header
        self.columns = columns
        self.meta = meta
        self._raw = raw
        h = header
        self.ts: I64 = raw[h.ts_offset : h.ts_offset + 8 * h.n_bars].view("<i8")
        self.prices: F64 = (
            raw[h.price_offset : h.price_offset + h.n_bars * h.price_width * 8]
            .view("<f8")
            .reshape(h.n_bars, h.price_width)
        )
        nbytes = h.n_bars * h.row_width * h.itemsize
        self.values: npt.NDArray[Any] = (
            raw[h.values_offset : h.values_offset + nbytes]
            .view(STORAGE[h.dtype])
            .reshape(h.n_bars, h.row_width)
        )
        self._index = {c.name: c for c in columns}

    # -- shape ------------------------------------------------------------------------------
    @property
    def n_bars(self) -> int:
        return self.header.n_bars

    @property
    def dtype(self) -> str:
        """The value block's dtype (features and OFI)."""
        return self.header.dtype

    @property
    def price_group_dtype(self) -> str:
        """The price block's dtype: always f64."""
        return PRICE_DTYPE

    @property
    def has_ofi(self) -> bool:
        return self.header.has_ofi

    @property
    def cache_key(self) -> bytes:
        return self.header.cache_key

    @property
    def column_names(self) -> list[str]:
        """Every column: features, prices, OFI."""
        return [c.name for c in self.columns]

    @property
    def value_column_names(self) -> list[str]:
        """The value block's real columns in row order (features, then OFI)."""
        return [c.name for c in sorted(self.columns, key=lambda c: c.index) if c.block == "values"]

    def group(self, name: str) -> slice:
        """Columns of a group as a slice of its block's row (``prices`` for ``price``, else
        ``values``); an empty slice when the group is absent."""
        if name not in GROUPS:
            raise KeyError(f"{self.path}: unknown column group {name!r} (expected one of {list(GROUPS)})")
        h = self.header
        start = {"feature": 0, "price": 0, "ofi": h.n_feature}[name]
        width = {"feature": h.n_feature, "price": h.n_price, "ofi": h.n_ofi}[name]
        return slice(start, start + width)

    def group_names(self, name: str) -> list[str]:
        return [c.name for c in self.columns if c.group == name]

    # -- values -----------------------------------------------------------------------------
    def column(self, name: str) -> F64:
        """One column decoded to float64 (a copy)."""
        try:
            col = self._index[name]
        except KeyError:
            raise KeyError(f"{self.path}: no column {name!r}; columns are {self.column_names}") from None
        if col.block == "price":
            return np.array(self.prices[:, col.index], dtype=np.float64)
        return _decode(self.values[:, col.index], self.dtype)

    def decoded(self, rows: slice = slice(None)) -> F64:
        """Every real column of ``rows`` decoded to float64, in :attr:`column_names` order (a copy)."""
        h = self.header
        return np.concatenate(
            [
                _decode(self.values[rows, : h.n_feature], self.dtype),
                np.asarray(self.prices[rows, : h.n_price], dtype=np.float64),
                _decode(self.values[rows, h.n_feature : h.n_values], self.dtype),
            ],
            axis=1,
        )

    def iter_chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, F64]]:
        """(first row, float64 block of every real column) chunk by chunk."""
        for lo in range(0, self.n_bars, chunk_rows):
            yield lo, self.decoded(slice(lo, min(self.n_bars, lo + chunk_rows)))

    def to_arrow(self) -> pa.Table:
        """``ts_close`` plus every column as float64 (a copy), column metadata attached."""
        # tables.array_of: pa.array without its pandas import
        arrays: list[pa.Array] = [array_of(np.asarray(self.ts, dtype=np.int64), pa.int64())]
        fields = [pa.field("ts_close", pa.int64())]
        for c in self.columns:
            arrays.append(array_of(np.asarray(self.column(c.name), dtype=np.float64), pa.float64()))
            fields.append(pa.field(c.name, pa.float64(), metadata={b"fx.group": c.group.encode()}))
        schema = pa.schema(
            fields,
            metadata={
                b"fx.cache_key": self.cache_key.hex().encode(),
                b"fx.dtype": self.dtype.encode(),
                b"fx.meta": json.dumps(self.meta, sort_keys=True).encode(),
            },
        )
        return pa.Table.from_arrays(arrays, schema=schema)

    def export_parquet(self, path: Path | str) -> Path:
        path = Path(path)
        with atomic_path(path) as tmp:
            pq.write_table(self.to_arrow(), tmp)
        return path

    def close(self) -> None:
        """Drop this object's views; the mapping goes once no caller holds a view into it.

        (``mmap.close`` would fail, or invalidate arrays a caller still holds.)
        """
        self.ts = np.empty(0, dtype=np.int64)
        self.prices = np.empty((0, self.header.price_width), dtype=np.float64)
        self.values = np.empty((0, self.header.row_width), dtype=STORAGE[self.dtype])
        self._raw = np.empty(0, dtype=np.uint8)  # type: ignore[assignment]

    def __enter__(self) -> FxCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        h = self.header
        return (
            f"FxCache({self.path.name}: {h.n_bars} bars, values {h.dtype}, prices f64, feature/price/ofi="
            f"{h.n_feature}/{h.n_price}/{h.n_ofi}, row_width={h.row_width}, has_ofi={h.has_ofi})"
        )


def read_header(path: Path | str) -> FxCacheHeader:
    """Parse and check the fixed header only (magic, version, dtype, flags, widths)."""
    path = Path(path)
    with open(path, "rb") as fh:
        raw = fh.read(HEADER_SIZE)
    return _parse_header(raw, path)


def _parse_header(raw: bytes, path: Path) -> FxCacheHeader:
    if len(raw) < 8 or raw[:8] != MAGIC:
        raise FxCacheError(f"{path}: bad magic {raw[:8]!r} (expected {MAGIC!r}); not an fxcache file")
    if len(raw) >= 10:
        (version,) = struct.unpack_from("<H", raw, 8)
        if version != FORMAT_VERSION:
            raise FxCacheError(
                f"{path}: unsupported fxcache format version {version} (this code reads {FORMAT_VERSION}); "
                "rebuild it"
            )
    if len(raw) < HEADER_SIZE:
        raise FxCacheError(f"{path}: truncated file: {len(raw)} bytes, the header alone is {HEADER_SIZE}")
    f = _HEADER.unpack(raw[:_HEADER_USED])
    version, dtype_code, flags = f[1], f[2], f[3]
    n_feature, n_price, n_ofi, row_width, price_width, header_size = f[4:10]
    if dtype_code not in CODE_DTYPES:
        raise FxCacheError(f"{path}: unknown value dtype code {dtype_code}")
    if flags & ~KNOWN_FLAGS:
        raise FxCacheError(f"{path}: unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    if header_size != HEADER_SIZE or any(raw[_HEADER_USED:_HEADER_SUM_AT]):
        raise FxCacheError(
            f"{path}: header size {header_size} / reserved bytes not as format {version} defines"
        )
    if row_width != padded_width(n_feature + n_ofi) or price_width != padded_width(n_price):
        raise FxCacheError(
            f"{path}: row widths {row_width}/{price_width} are not {n_feature + n_ofi} value / {n_price} "
            f"price columns padded to a multiple of {ROW_ALIGN}"
        )
    return FxCacheHeader(
        format_version=version,
        dtype=CODE_DTYPES[dtype_code],
        flags=flags,
        n_feature=n_feature,
        n_price=n_price,
        n_ofi=n_ofi,
        row_width=row_width,
        price_width=price_width,
        header_size=header_size,
        n_bars=f[10],
        cache_key=f[11],
        schema_hash=f[12],
        ts_offset=f[13],
        price_offset=f[14],
        values_offset=f[15],
        trailer_offset=f[16],
        trailer_length=f[17],
        ts_checksum=f[18],
        price_checksum=f[19],
        values_checksum=f[20],
        trailer_checksum=f[21],
    )


def _parse_trailer(raw: bytes, h: FxCacheHeader, path: Path) -> tuple[tuple[FxColumn, ...], dict[str, Any]]:
    try:
        doc = json.loads(raw.decode("utf-8"))
        cols = tuple(
            FxColumn(name=str(c["name"]), group=str(c["group"]), index=int(c["index"]))
            for c in doc["columns"]
        )
        meta = dict(doc.get("meta", {}))
        echoed = (
            int(doc["format_version"]),
            str(doc["dtype"]),
            str(doc["price_dtype"]),
            int(doc["row_width"]),
            int(doc["price_width"]),
        )
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise FxCacheError(f"{path}: unreadable JSON trailer ({exc})") from exc
    expected = (h.format_version, h.dtype, PRICE_DTYPE, h.row_width, h.price_width)
    if echoed != expected:
        raise FxCacheError(
            f"{path}: trailer says format/dtype/price dtype/row widths {echoed}, the header {expected}"
        )
    expected_groups = ["feature"] * h.n_feature + ["price"] * h.n_price + ["ofi"] * h.n_ofi
    expected_index = [*range(h.n_feature), *range(h.n_price), *range(h.n_feature, h.n_values)]
    if [c.group for c in cols] != expected_groups or [c.index for c in cols] != expected_index:
        raise FxCacheError(
            f"{path}: trailer columns (groups {[c.group for c in cols]}) do not match the header's "
            f"feature/price/ofi widths {h.n_feature}/{h.n_price}/{h.n_ofi}"
        )
    if len({c.name for c in cols}) != len(cols):
        raise FxCacheError(f"{path}: trailer repeats a column name")
    if schema_hash(cols, h.dtype, h.row_width, h.price_width) != h.schema_hash:
        raise FxCacheError(
            f"{path}: schema hash mismatch: the trailer's columns/dtype/widths do not hash to the header's "
            f"{h.schema_hash.hex()[:16]}..."
        )
    return cols, meta


def checksum_mismatch(path: Path | str, region: str, lo: int, hi: int) -> FxCacheError:
    """The error of a region whose bytes no longer hash to the checksum written at creation."""
    return FxCacheError(
        f"{path}: checksum mismatch in the {region} block (bytes {lo}..{hi}): the file changed "
        "since it was written; rebuild it"
    )


def _verify_bodies(
    path: Path | str,
    header: FxCacheHeader | None = None,
    head: bytes | None = None,
    regions: Sequence[str] = REGIONS,
) -> None:
    """Re-hash the header fields and the named regions of the file (default: all of them);
    ``FxCacheError`` naming the file and the first region whose XXH3-128 differs from the one
    written at creation."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise FxCacheError(f"{path}: cannot read fxcache file ({exc})") from exc
    try:
        if head is None:
            head = os.pread(fd, HEADER_SIZE, 0)
        h = header if header is not None else _parse_header(head, path)
        if _digest(head[:_HEADER_SUM_AT]) != head[_HEADER_SUM_AT:HEADER_SIZE]:
            raise FxCacheError(
                f"{path}: checksum mismatch in the header fields (cache key, widths, offsets or "
                "checksums changed since the file was written); rebuild it"
            )
        size = os.fstat(fd).st_size
        wanted = [(name, lo, hi) for name, (lo, hi) in h.regions().items() if name in regions]
        for _, _, hi in wanted:
            if hi > size:
                raise FxCacheError(f"{path}: truncated file at byte {size}")
        # Hashed in place from a read-only mapping of the page cache: no copy into a buffer
        # (half the time of reading it: 22 against 46 ms for a 223 MB scale-1 file).
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else contextlib.nullcontext(b"") as m:
            whole = memoryview(m)
            try:
                for name, lo, hi in wanted:
                    hasher = checksum.new_hasher()
                    hasher.update(whole[lo:hi])
                    if hasher.digest() != h.checksums()[name]:
                        raise checksum_mismatch(path, name, lo, hi)
            finally:
                whole.release()
    finally:
        os.close(fd)


def open_fxcache(
    path: Path | str,
    verify_finite: bool = True,
    *,
    verify_checksums: bool | Sequence[str] = True,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> FxCache:
    """Memory-map and validate an fxcache file; raise ``FxCacheError`` naming it on any fault.

    ``verify_checksums`` (default on) re-hashes the header fields and every byte of the file
    against the checksums written at creation; a sequence of region names (``ts``, ``price``,
    ``values``, ``trailer``) re-hashes the header and those regions only (the device loader
    hashes the price and value blocks itself, as it streams them). ``verify_finite`` scans the
    decoded values (the device loader checks them on the device instead).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(HEADER_SIZE)
    except OSError as exc:
        raise FxCacheError(f"{path}: cannot read fxcache file ({exc})") from exc
    h = _parse_header(head, path)
    ts_off, px_off, val_off, tr_off, total = _layout(
        h.n_bars, h.price_width, h.row_width, h.itemsize, h.trailer_length
    )
    if (h.ts_offset, h.price_offset, h.values_offset, h.trailer_offset) != (ts_off, px_off, val_off, tr_off):
        raise FxCacheError(
            f"{path}: size mismatch: block offsets {h.ts_offset}/{h.price_offset}/{h.values_offset}/"
            f"{h.trailer_offset} do not follow from {h.n_bars} bars x {h.price_width} + {h.row_width} values "
            f"(expected {ts_off}/{px_off}/{val_off}/{tr_off})"
        )
    if size < total:
        raise FxCacheError(f"{path}: truncated file: {size} bytes, the header describes {total}")
    if size > total:
        raise FxCacheError(f"{path}: size mismatch: {size} bytes, the header describes {total}")

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cols, meta = _parse_trailer(bytes(raw[tr_off:total]), h, path)
    if verify_checksums is True:
        _verify_bodies(path, h, head)
    elif verify_checksums:
        _verify_bodies(path, h, head, tuple(verify_checksums))
    fc = FxCache(path, h, cols, meta, raw)
    try:
        _validate_values(fc, verify_finite, chunk_rows)
    except BaseException:
        fc.close()
        raise
    return fc


def verify_fxcache(path: Path | str) -> None:
    """Full validation of an fxcache file (structure, checksums, order, finite values, has_ofi);
    ``FxCacheError`` naming the file on any fault. What asset checks and reuse call."""
    open_fxcache(path, verify_finite=True, verify_checksums=True).close()


def _validate_values(fc: FxCache, verify_finite: bool, chunk_rows: int) -> None:
    h, path = fc.header, fc.path
    ts = fc.ts
    for lo in range(0, h.n_bars, chunk_rows):
        seg = ts[max(0, lo - 1) : lo + chunk_rows]
        bad = np.flatnonzero(np.diff(seg) < 0)
        if bad.size:
            raise FxCacheError(f"{path}: ts_close decreases at bar {max(0, lo - 1) + int(bad[0]) + 1}")
    if verify_finite:
        # Scan the stored blocks as they are (a NaN or inf survives every storage dtype); only
        # a chunk holding one is decoded, to name its first bad column and bar.
        for lo in range(0, h.n_bars, chunk_rows):
            hi = min(h.n_bars, lo + chunk_rows)
            if _all_finite(fc.values[lo:hi, : h.n_values], h.dtype) and _all_finite(
                fc.prices[lo:hi, : h.n_price], PRICE_DTYPE
            ):
                continue
            _check_finite_block(fc.decoded(slice(lo, hi)), fc.columns, lo, path, FxCacheError)
    # has_ofi honesty: flag set <=> OFI columns exist and are not all zero.
    ofi_nonzero = False
    if h.n_ofi:
        sl = fc.group("ofi")
        for lo in range(0, h.n_bars, chunk_rows):
            if np.any(fc.values[lo : lo + chunk_rows, sl] != 0):
                ofi_nonzero = True
                break
    if h.has_ofi and not ofi_nonzero:
        what = "has no OFI columns" if not h.n_ofi else f"its {h.n_ofi} OFI columns are all zero"
        raise FxCacheError(f"{path}: has_ofi flag is set but {what}")
    if not h.has_ofi and h.n_ofi:
        raise FxCacheError(f"{path}: has_ofi flag is clear but the file carries {h.n_ofi} OFI columns")


def describe_fxcache(path: Path | str, *, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> dict[str, Any]:
    """Header, metadata, per-column min / mean / max / NaN count, and whether the file is valid
    (for ``fx-assets inspect``).

    Structural validation applies (a file whose layout cannot be read raises); checksums and
    the finite scan do not stop the description: ``valid`` says whether :func:`verify_fxcache`
    passes (``error`` says why not), ``finite`` whether every value is finite.
    """
    try:
        verify_fxcache(path)
        valid, error = True, None
    except FxCacheError as exc:
        valid, error = False, str(exc)
    with open_fxcache(path, verify_finite=False, verify_checksums=False, chunk_rows=chunk_rows) as fc:
        k = fc.header.n_columns
        mins = np.full(k, np.inf)
        maxs = np.full(k, -np.inf)
        sums = np.zeros(k)
        counts = np.zeros(k, dtype=np.int64)
        nans = np.zeros(k, dtype=np.int64)
        infs = np.zeros(k, dtype=np.int64)
        for _, block in fc.iter_chunks(chunk_rows):
            fin = np.isfinite(block)
            nans += np.isnan(block).sum(axis=0)
            infs += np.isinf(block).sum(axis=0)
            masked = np.where(fin, block, 0.0)
            sums += masked.sum(axis=0)
            counts += fin.sum(axis=0)
            mins = np.minimum(mins, np.where(fin, block, np.inf).min(axis=0, initial=np.inf))
            maxs = np.maximum(maxs, np.where(fin, block, -np.inf).max(axis=0, initial=-np.inf))
        columns = []
        for i, c in enumerate(fc.columns):
            has = counts[i] > 0
            columns.append(
                {
                    "name": c.name,
                    "group": c.group,
                    "block": c.block,
                    "index": c.index,
                    "min": float(mins[i]) if has else math.nan,
                    "mean": float(sums[i] / counts[i]) if has else math.nan,
                    "max": float(maxs[i]) if has else math.nan,
                    "nan": int(nans[i]),
                    "inf": int(infs[i]),
                }
            )
        ts = fc.ts
        return {
            "path": str(fc.path),
            "file_bytes": int(fc.path.stat().st_size),
            "valid": valid,
            "error": error,
            "row_unit": str(fc.meta.get("row_unit", "bar")),
            "rows": fc.n_bars,
            "feature_width": fc.header.n_feature,
            "value_width": fc.header.n_values,
            "price_width": fc.header.n_price,
            "feature_names": fc.group_names("feature"),
            "price_names": fc.group_names("price"),
            "header": fc.header.as_dict(),
            "meta": fc.meta,
            "ts_first": int(ts[0]) if fc.n_bars else None,
            "ts_last": int(ts[-1]) if fc.n_bars else None,
            "finite": bool(int(nans.sum()) == 0 and int(infs.sum()) == 0),
            "columns": columns,
        }


__all__ = [
    "FORMAT_VERSION",
    "GROUPS",
    "MAGIC",
    "PRICE_DTYPE",
    "FxCache",
    "FxCacheHeader",
    "FxCacheWriter",
    "FxColumn",
    "bf16_bits_to_f64",
    "checksum_mismatch",
    "describe_fxcache",
    "f32_to_bf16_bits",
    "open_fxcache",
    "padded_width",
    "read_header",
    "schema_hash",
    "verify_fxcache",
    "write_fxcache",
]
