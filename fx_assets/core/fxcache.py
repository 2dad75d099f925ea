"""The fxcache file: one flat, memory-mappable file of bar values per (quarter, symbol, key).

Owns the binary format of DESIGN.md §4 (byte table in ``docs/fxcache.md``), its writer and
its validating, zero-copy reader.

Layout (little-endian, every block aligned to 64 bytes)::

    header (192 bytes) | ts_close int64[n] | values [n, row_width] row-major | JSON trailer

The value block is ONE row-major array so a trainer can hand it to the GPU in a single copy;
columns are grouped feature | price | ofi, and each row is padded with zeros to a multiple of
8 values (aligned rows for the device kernels). bf16 values are stored as uint16 (the top 16
bits of the float32, rounded to nearest even), so no torch is needed to read or write them.

What is *not* in the file: labels, forward returns, targets, normalisation statistics. They
look ahead or depend on the fold, so they are derived at training time (labels.py, folds.py).

Validation on load (every failure is an ``FxCacheError`` naming the file): magic, format
version, dtype, flags, block offsets and sizes against the file size (truncation, trailing
bytes), the trailer's columns against the header and its schema hash, non-decreasing
timestamps, finite values (chunked scan), and has_ofi honesty: the flag is set if and only if
OFI columns exist and are not all zero (the predecessor's flag once claimed OFI for a file of
zeros).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from fx_assets.core.atomic import atomic_path
from fx_assets.core.errors import FxCacheError, FxDataError

MAGIC = b"FXCACHE\0"
FORMAT_VERSION = 1
HEADER_SIZE = 192
ALIGN = 64
ROW_ALIGN = 8  # row width is padded to a multiple of this many values
KEY_BYTES = 32
FLAG_HAS_OFI = 1
KNOWN_FLAGS = FLAG_HAS_OFI
GROUPS: tuple[str, ...] = ("feature", "price", "ofi")

DType = Literal["f32", "bf16", "f64"]
DTYPE_CODES: dict[str, int] = {"f32": 1, "bf16": 2, "f64": 3}
CODE_DTYPES: dict[int, str] = {v: k for k, v in DTYPE_CODES.items()}
# numpy storage dtype of each value dtype (bf16 is stored as its raw 16 bits)
STORAGE: dict[str, np.dtype[Any]] = {
    "f32": np.dtype("<f4"),
    "bf16": np.dtype("<u2"),
    "f64": np.dtype("<f8"),
}

# magic, version, dtype code, flags, n_feature, n_price, n_ofi, row_width, n_bars,
# cache_key, schema_hash, ts_offset, values_offset, trailer_offset, trailer_length, header_size
_HEADER = struct.Struct("<8sHHIIIII Q 32s32s QQQQ I")
_HEADER_USED = _HEADER.size  # 140; the rest up to HEADER_SIZE is reserved, zero
assert _HEADER_USED <= HEADER_SIZE

DEFAULT_CHUNK_ROWS = 1 << 16

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


# --- bf16 -----------------------------------------------------------------------------------


def f32_to_bf16_bits(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """bf16 bits of ``x`` (converted to float32 first), rounded to nearest, ties to even.

    NaN stays NaN (quiet bit forced so rounding cannot turn it into inf); values that round
    past the largest bf16 become +-inf, which the writer then rejects as non-finite.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
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


def _encode(block: F64, dtype: str) -> npt.NDArray[Any]:
    # Overflow to inf is expected here and caught by the finite check that follows.
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bf16":
            return f32_to_bf16_bits(block)
        return np.asarray(block, dtype=STORAGE[dtype])


# --- header / schema ------------------------------------------------------------------------


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def padded_width(n_columns: int) -> int:
    return max(ROW_ALIGN, (n_columns + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN)


@dataclass(frozen=True)
class FxCacheHeader:
    format_version: int
    dtype: str
    flags: int
    n_feature: int
    n_price: int
    n_ofi: int
    row_width: int
    n_bars: int
    cache_key: bytes
    schema_hash: bytes
    ts_offset: int
    values_offset: int
    trailer_offset: int
    trailer_length: int
    header_size: int

    @property
    def has_ofi(self) -> bool:
        return bool(self.flags & FLAG_HAS_OFI)

    @property
    def n_columns(self) -> int:
        return self.n_feature + self.n_price + self.n_ofi

    @property
    def itemsize(self) -> int:
        return STORAGE[self.dtype].itemsize

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cache_key"] = self.cache_key.hex()
        d["schema_hash"] = self.schema_hash.hex()
        d["has_ofi"] = self.has_ofi
        return d

    def pack(self) -> bytes:
        raw = _HEADER.pack(
            MAGIC,
            self.format_version,
            DTYPE_CODES[self.dtype],
            self.flags,
            self.n_feature,
            self.n_price,
            self.n_ofi,
            self.row_width,
            self.n_bars,
            self.cache_key,
            self.schema_hash,
            self.ts_offset,
            self.values_offset,
            self.trailer_offset,
            self.trailer_length,
            self.header_size,
        )
        return raw + bytes(HEADER_SIZE - len(raw))


@dataclass(frozen=True)
class FxColumn:
    name: str
    group: str  # feature | price | ofi
    index: int  # position in the row


def schema_hash(columns: Sequence[FxColumn], dtype: str, row_width: int) -> bytes:
    """SHA-256 of the ordered column names and groups, the value dtype and the widths."""
    counts = {g: sum(1 for c in columns if c.group == g) for g in GROUPS}
    doc = {
        "columns": [[c.name, c.group] for c in sorted(columns, key=lambda c: c.index)],
        "dtype": dtype,
        "n_feature": counts["feature"],
        "n_price": counts["price"],
        "n_ofi": counts["ofi"],
        "row_width": row_width,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).digest()


def _layout(n_bars: int, row_width: int, itemsize: int, trailer_length: int) -> tuple[int, int, int, int]:
    ts_offset = HEADER_SIZE
    values_offset = _align(ts_offset + 8 * n_bars)
    trailer_offset = _align(values_offset + n_bars * row_width * itemsize)
    return ts_offset, values_offset, trailer_offset, trailer_offset + trailer_length


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


def _encode_chunk(block: F64, dtype: str, row_width: int) -> npt.NDArray[Any]:
    """Rows of the value block in storage form, padding columns zero."""
    out = np.zeros((block.shape[0], row_width), dtype=STORAGE[dtype])
    out[:, : block.shape[1]] = _encode(block, dtype)
    return out


def write_fxcache(
    path: Path | str,
    ts: npt.ArrayLike,
    columns: Mapping[str, tuple[Sequence[str], npt.ArrayLike]],
    dtype: DType,
    cache_key: bytes,
    meta: Mapping[str, Any] | None = None,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Path:
    """Write an fxcache file atomically and return its path.

    ``ts``: int64 bar close times (ns, non-decreasing). ``columns``: group name (``feature``,
    ``price``, ``ofi``; any may be absent) -> (column names, float array [n, k]). Values are
    converted and written ``chunk_rows`` rows at a time, so memory beyond the inputs is one
    chunk. Raises ``FxDataError`` naming the file, column and bar on non-finite values (also
    after rounding to the stored dtype) and when OFI columns are present but all zero: an
    OFI-less file must say so, not carry zeros.
    """
    path = Path(path)
    if dtype not in DTYPE_CODES:
        raise FxDataError(f"{path}: unknown fxcache dtype {dtype!r} (expected one of {sorted(DTYPE_CODES)})")
    if not isinstance(cache_key, bytes | bytearray) or len(cache_key) != KEY_BYTES:
        raise FxDataError(f"{path}: cache key must be {KEY_BYTES} bytes")
    ts_arr = np.ascontiguousarray(ts, dtype=np.int64)
    if ts_arr.ndim != 1:
        raise FxDataError(f"{path}: ts must be one-dimensional, got shape {ts_arr.shape}")
    n = ts_arr.shape[0]
    if n > 1:
        bad = np.flatnonzero(np.diff(ts_arr) < 0)
        if bad.size:
            raise FxDataError(f"{path}: ts_close decreases at bar {int(bad[0]) + 1}")
    unknown = set(columns) - set(GROUPS)
    if unknown:
        raise FxDataError(f"{path}: unknown column groups {sorted(unknown)} (expected {list(GROUPS)})")

    specs: list[FxColumn] = []
    arrays: list[npt.NDArray[Any]] = []
    seen: set[str] = set()
    for group in GROUPS:
        if group not in columns:
            continue
        names, values = columns[group]
        names = [str(x) for x in names]
        arr = np.asarray(values)
        if arr.ndim == 1 and len(names) == 1:
            arr = arr.reshape(-1, 1)
        if arr.ndim != 2 or arr.shape != (n, len(names)):
            raise FxDataError(
                f"{path}: group {group!r} has shape {arr.shape}, expected ({n}, {len(names)}) for {names}"
            )
        if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
            raise FxDataError(f"{path}: group {group!r} has non-numeric dtype {arr.dtype}")
        for name in names:
            if not name or name in seen:
                raise FxDataError(f"{path}: column name {name!r} is empty or repeated")
            seen.add(name)
            specs.append(FxColumn(name=name, group=group, index=len(specs)))
        arrays.append(arr)

    if not specs:
        raise FxDataError(f"{path}: no columns to write")
    counts = {g: sum(1 for c in specs if c.group == g) for g in GROUPS}
    row_width = padded_width(len(specs))
    has_ofi = False
    if counts["ofi"]:
        ofi = arrays[[g for g in GROUPS if g in columns].index("ofi")]
        has_ofi = bool(np.any(ofi != 0))
        if not has_ofi:
            raise FxDataError(
                f"{path}: OFI columns {[c.name for c in specs if c.group == 'ofi']} are all zero; "
                "refusing to write them as present (missing book data must be an error, not zeros)"
            )

    trailer = {
        "format_version": FORMAT_VERSION,
        "dtype": dtype,
        "row_width": row_width,
        "columns": [{"name": c.name, "group": c.group, "index": c.index} for c in specs],
        "meta": dict(meta or {}),
    }
    trailer_bytes = json.dumps(trailer, sort_keys=True, default=_json_default, allow_nan=False).encode()
    itemsize = STORAGE[dtype].itemsize
    ts_off, val_off, tr_off, total = _layout(n, row_width, itemsize, len(trailer_bytes))
    header = FxCacheHeader(
        format_version=FORMAT_VERSION,
        dtype=dtype,
        flags=FLAG_HAS_OFI if has_ofi else 0,
        n_feature=counts["feature"],
        n_price=counts["price"],
        n_ofi=counts["ofi"],
        row_width=row_width,
        n_bars=n,
        cache_key=bytes(cache_key),
        schema_hash=schema_hash(specs, dtype, row_width),
        ts_offset=ts_off,
        values_offset=val_off,
        trailer_offset=tr_off,
        trailer_length=len(trailer_bytes),
        header_size=HEADER_SIZE,
    )

    chunk_rows = max(1, int(chunk_rows))
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header.pack())
        fh.write(ts_arr.astype("<i8", copy=False).tobytes())
        fh.write(bytes(val_off - (ts_off + 8 * n)))
        for lo in range(0, n, chunk_rows):
            hi = min(n, lo + chunk_rows)
            block = np.concatenate([np.asarray(a[lo:hi], dtype=np.float64) for a in arrays], axis=1)
            stored = _encode_chunk(block, dtype, row_width)
            _check_finite_block(_decode(stored[:, : len(specs)], dtype), specs, lo, path, FxDataError)
            fh.write(stored.tobytes())
        fh.write(bytes(tr_off - (val_off + n * row_width * itemsize)))
        fh.write(trailer_bytes)
        fh.flush()
        if fh.tell() != total:  # pragma: no cover - guards the layout arithmetic
            raise FxDataError(f"{path}: wrote {fh.tell()} bytes, layout says {total}")
    return path


def _check_finite_block(
    block: F64, specs: Sequence[FxColumn], row0: int, path: Path, err: type[FxDataError]
) -> None:
    finite = np.isfinite(block)
    if finite.all():
        return
    r, c = np.argwhere(~finite)[0]
    raise err(f"{path}: non-finite value {block[r, c]!r} in column {specs[c].name!r} at bar {row0 + int(r)}")


# --- reader ---------------------------------------------------------------------------------


class FxCache:
    """A validated, memory-mapped fxcache file (zero copy: ``ts`` and ``values`` are views)."""

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
        return self.header.dtype

    @property
    def has_ofi(self) -> bool:
        return self.header.has_ofi

    @property
    def cache_key(self) -> bytes:
        return self.header.cache_key

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def group(self, name: str) -> slice:
        """Columns of a group as a slice of the row (empty slice when the group is absent)."""
        if name not in GROUPS:
            raise KeyError(f"{self.path}: unknown column group {name!r} (expected one of {list(GROUPS)})")
        h = self.header
        start = {"feature": 0, "price": h.n_feature, "ofi": h.n_feature + h.n_price}[name]
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
        return _decode(self.values[:, col.index], self.dtype)

    def decoded(self, rows: slice = slice(None), cols: slice | None = None) -> F64:
        """A block of values decoded to float64 (a copy); default all rows, all real columns."""
        cols = slice(0, self.header.n_columns) if cols is None else cols
        return _decode(self.values[rows, cols], self.dtype)

    def iter_chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, F64]]:
        """(first row, float64 block of the real columns) chunk by chunk."""
        for lo in range(0, self.n_bars, chunk_rows):
            yield lo, self.decoded(slice(lo, min(self.n_bars, lo + chunk_rows)))

    def to_arrow(self) -> pa.Table:
        """``ts_close`` plus every column as float64 (a copy), column metadata attached."""
        arrays: list[pa.Array] = [pa.array(np.asarray(self.ts), type=pa.int64())]
        fields = [pa.field("ts_close", pa.int64())]
        for c in self.columns:
            arrays.append(pa.array(self.column(c.name), type=pa.float64()))
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
        self.values = np.empty((0, self.header.row_width), dtype=STORAGE[self.dtype])
        self._raw = np.empty(0, dtype=np.uint8)  # type: ignore[assignment]

    def __enter__(self) -> FxCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        h = self.header
        return (
            f"FxCache({self.path.name}: {h.n_bars} bars, {h.dtype}, feature/price/ofi="
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
    if len(raw) < HEADER_SIZE:
        raise FxCacheError(f"{path}: truncated file: {len(raw)} bytes, the header alone is {HEADER_SIZE}")
    (
        _magic,
        version,
        dtype_code,
        flags,
        n_feature,
        n_price,
        n_ofi,
        row_width,
        n_bars,
        key,
        shash,
        ts_off,
        val_off,
        tr_off,
        tr_len,
        header_size,
    ) = _HEADER.unpack(raw[:_HEADER_USED])
    if version != FORMAT_VERSION:
        raise FxCacheError(
            f"{path}: unsupported fxcache format version {version} (this code reads {FORMAT_VERSION}); rebuild it"
        )
    if dtype_code not in CODE_DTYPES:
        raise FxCacheError(f"{path}: unknown value dtype code {dtype_code}")
    if flags & ~KNOWN_FLAGS:
        raise FxCacheError(f"{path}: unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    if header_size != HEADER_SIZE or any(raw[_HEADER_USED:HEADER_SIZE]):
        raise FxCacheError(
            f"{path}: header size {header_size} / reserved bytes not as format {version} defines"
        )
    n_cols = n_feature + n_price + n_ofi
    if row_width != padded_width(n_cols):
        raise FxCacheError(
            f"{path}: row width {row_width} is not {n_cols} columns padded to a multiple of {ROW_ALIGN}"
        )
    return FxCacheHeader(
        format_version=version,
        dtype=CODE_DTYPES[dtype_code],
        flags=flags,
        n_feature=n_feature,
        n_price=n_price,
        n_ofi=n_ofi,
        row_width=row_width,
        n_bars=n_bars,
        cache_key=key,
        schema_hash=shash,
        ts_offset=ts_off,
        values_offset=val_off,
        trailer_offset=tr_off,
        trailer_length=tr_len,
        header_size=header_size,
    )


def _parse_trailer(raw: bytes, h: FxCacheHeader, path: Path) -> tuple[tuple[FxColumn, ...], dict[str, Any]]:
    try:
        doc = json.loads(raw.decode("utf-8"))
        cols = tuple(
            FxColumn(name=str(c["name"]), group=str(c["group"]), index=int(c["index"]))
            for c in doc["columns"]
        )
        meta = dict(doc.get("meta", {}))
        echoed = (int(doc["format_version"]), str(doc["dtype"]), int(doc["row_width"]))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise FxCacheError(f"{path}: unreadable JSON trailer ({exc})") from exc
    if echoed != (h.format_version, h.dtype, h.row_width):
        raise FxCacheError(
            f"{path}: trailer says format/dtype/row width {echoed}, the header "
            f"{(h.format_version, h.dtype, h.row_width)}"
        )
    expected_groups = ["feature"] * h.n_feature + ["price"] * h.n_price + ["ofi"] * h.n_ofi
    if [c.group for c in cols] != expected_groups or [c.index for c in cols] != list(range(len(cols))):
        raise FxCacheError(
            f"{path}: trailer columns (groups {[c.group for c in cols]}) do not match the header's "
            f"feature/price/ofi widths {h.n_feature}/{h.n_price}/{h.n_ofi}"
        )
    if len({c.name for c in cols}) != len(cols):
        raise FxCacheError(f"{path}: trailer repeats a column name")
    if schema_hash(cols, h.dtype, h.row_width) != h.schema_hash:
        raise FxCacheError(
            f"{path}: schema hash mismatch: the trailer's columns/dtype/widths do not hash to the header's "
            f"{h.schema_hash.hex()[:16]}..."
        )
    return cols, meta


def open_fxcache(
    path: Path | str, verify_finite: bool = True, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> FxCache:
    """Memory-map and validate an fxcache file; raise ``FxCacheError`` naming it on any fault."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(HEADER_SIZE)
    except OSError as exc:
        raise FxCacheError(f"{path}: cannot read fxcache file ({exc})") from exc
    h = _parse_header(head, path)
    ts_off, val_off, tr_off, total = _layout(h.n_bars, h.row_width, h.itemsize, h.trailer_length)
    if (h.ts_offset, h.values_offset, h.trailer_offset) != (ts_off, val_off, tr_off):
        raise FxCacheError(
            f"{path}: size mismatch: block offsets {h.ts_offset}/{h.values_offset}/{h.trailer_offset} "
            f"do not follow from {h.n_bars} bars x {h.row_width} values (expected {ts_off}/{val_off}/{tr_off})"
        )
    if size < total:
        raise FxCacheError(f"{path}: truncated file: {size} bytes, the header describes {total}")
    if size > total:
        raise FxCacheError(f"{path}: size mismatch: {size} bytes, the header describes {total}")

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cols, meta = _parse_trailer(bytes(raw[tr_off:total]), h, path)
    fc = FxCache(path, h, cols, meta, raw)
    try:
        _validate_values(fc, verify_finite, chunk_rows)
    except BaseException:
        fc.close()
        raise
    return fc


def _validate_values(fc: FxCache, verify_finite: bool, chunk_rows: int) -> None:
    h, path = fc.header, fc.path
    ts = fc.ts
    for lo in range(0, h.n_bars, chunk_rows):
        seg = ts[max(0, lo - 1) : lo + chunk_rows]
        bad = np.flatnonzero(np.diff(seg) < 0)
        if bad.size:
            raise FxCacheError(f"{path}: ts_close decreases at bar {max(0, lo - 1) + int(bad[0]) + 1}")
    if verify_finite:
        for lo, block in fc.iter_chunks(chunk_rows):
            _check_finite_block(block, fc.columns, lo, path, FxCacheError)
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
    """Header, metadata and per-column min / mean / max / NaN count (for ``fx-assets inspect``).

    Structural validation applies; the finite scan does not, so a file with NaN can still be
    inspected (``finite`` says whether it would load).
    """
    with open_fxcache(path, verify_finite=False, chunk_rows=chunk_rows) as fc:
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
        for c in fc.columns:
            i = c.index
            has = counts[i] > 0
            columns.append(
                {
                    "name": c.name,
                    "group": c.group,
                    "index": i,
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
    "FxCache",
    "FxCacheHeader",
    "FxColumn",
    "bf16_bits_to_f64",
    "describe_fxcache",
    "f32_to_bf16_bits",
    "open_fxcache",
    "padded_width",
    "read_header",
    "schema_hash",
    "write_fxcache",
]
