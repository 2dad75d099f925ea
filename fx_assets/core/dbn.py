"""Low-level reading of Databento DBN files (v1, v2, v3; zstd-compressed or plain).

Owns: compression detection, the metadata header (parsed with ``databento_dbn.Metadata``, hashed
byte for byte), the numpy record dtypes of the fixed-size schemas we decode (trades 48 B,
mbp-1/tbbo 80 B, mbp-10 368 B — identical on disk in v1-v3), a streaming chunk iterator with
bounded memory (zstd frames decoded piecewise, partial records carried across chunk borders,
every record's ``length``/``rtype`` checked), and the two scalar conventions every kernel uses:
``px_to_float`` (1e-9 fixed point, UNDEF_PRICE -> NaN) and ``aggressor_sign`` (B/A/N -> +1/-1/0).

Every malformed input raises ``FxDataError`` naming the file and, where it applies, the byte
offset (compressed for zstd errors, decompressed for record errors) and record index.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from fx_assets.core.errors import FxDataError

Hasher = Any  # a streaming hasher (``update(bytes)``), e.g. fx_assets.core.checksum.new_hasher()

UNDEF_PRICE = 2**63 - 1
PRICE_DIVISOR = 1e9  # 1 unit = 1e-9
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DBN_MAGIC = b"DBN"
SUPPORTED_DBN_VERSIONS = (1, 2, 3)
DEFAULT_CHUNK_BYTES = 1 << 20
_PIECE_TARGET = 1 << 20  # decompressed bytes per piece (see _iter_decompressed)
_ZSTD_WRITE_SIZE = 256 << 10
_PREFIX_LEN = 8  # b"DBN" + version byte + u32 metadata length
_MAX_METADATA_LEN = 64 << 20  # symbology of a few hundred thousand symbols still fits

# The record header and the common body of trades/mbp-1/tbbo/mbp-10 (dbn `TradeMsg`,
# `Mbp1Msg`, `Mbp10Msg`). `action`/`side` are c_char on disk; we read them as uint8 (ASCII
# codes) and the u64 timestamps as int64 (same bytes; UNIX ns fit well below 2**63).
_BASE_FIELDS: list[tuple[str, str]] = [
    ("length", "u1"),
    ("rtype", "u1"),
    ("publisher_id", "<u2"),
    ("instrument_id", "<u4"),
    ("ts_event", "<i8"),
    ("price", "<i8"),
    ("size", "<u4"),
    ("action", "u1"),
    ("side", "u1"),
    ("flags", "u1"),
    ("depth", "u1"),
    ("ts_recv", "<i8"),
    ("ts_in_delta", "<i4"),
    ("sequence", "<u4"),
]
LEVEL_FIELDS: tuple[tuple[str, str], ...] = (
    ("bid_px", "<i8"),
    ("ask_px", "<i8"),
    ("bid_sz", "<u4"),
    ("ask_sz", "<u4"),
    ("bid_ct", "<u4"),
    ("ask_ct", "<u4"),
)


def _record_dtype(n_levels: int, ts_out: bool = False) -> np.dtype[Any]:
    fields = list(_BASE_FIELDS)
    for i in range(n_levels):
        fields += [(f"{name}_{i:02d}", t) for name, t in LEVEL_FIELDS]
    if ts_out:
        fields.append(("ts_out", "<i8"))
    return np.dtype(fields)


TRADES_DTYPE = _record_dtype(0)
MBP1_DTYPE = _record_dtype(1)
MBP10_DTYPE = _record_dtype(10)
assert (TRADES_DTYPE.itemsize, MBP1_DTYPE.itemsize, MBP10_DTYPE.itemsize) == (48, 80, 368)


@dataclass(frozen=True)
class SchemaSpec:
    """How one DBN schema is laid out: record rtype, number of book levels, bytes per record."""

    name: str
    rtype: int
    n_levels: int

    def dtype(self, ts_out: bool = False) -> np.dtype[Any]:
        return _record_dtype(self.n_levels, ts_out)


SCHEMAS: dict[str, SchemaSpec] = {
    "trades": SchemaSpec("trades", 0x00, 0),
    "tbbo": SchemaSpec("tbbo", 0x01, 1),
    "mbp-1": SchemaSpec("mbp-1", 0x01, 1),
    "mbp-10": SchemaSpec("mbp-10", 0x0A, 10),
}


@dataclass(frozen=True)
class SymbolInterval:
    """One DBN symbology mapping: ``raw_symbol`` is ``instrument_id`` on [start_date, end_date)."""

    raw_symbol: str
    instrument_id: int
    start_date: dt.date
    end_date: dt.date

    def to_json(self) -> dict[str, Any]:
        return {
            "raw_symbol": self.raw_symbol,
            "instrument_id": self.instrument_id,
            "start_date": self.start_date.isoformat(),
            "end_date": self.end_date.isoformat(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SymbolInterval:
        return cls(
            str(d["raw_symbol"]),
            int(d["instrument_id"]),
            dt.date.fromisoformat(d["start_date"]),
            dt.date.fromisoformat(d["end_date"]),
        )


@dataclass(frozen=True)
class DbnHeader:
    """The metadata header of a DBN file (``version`` is the on-disk version byte)."""

    path: Path
    compressed: bool
    version: int
    header_bytes: bytes = field(repr=False)
    dataset: str
    schema: str | None
    start: int
    end: int | None
    limit: int | None
    stype_in: str | None
    stype_out: str
    ts_out: bool
    symbols: tuple[str, ...]
    mappings: tuple[SymbolInterval, ...]

    @property
    def header_len(self) -> int:
        """Bytes of the (decompressed) stream before the first record."""
        return len(self.header_bytes)

    @property
    def header_hash(self) -> str:
        return hashlib.sha256(self.header_bytes).hexdigest()

    def spec(self) -> SchemaSpec:
        """The schema's record layout; FxDataError for mixed-schema or unsupported files."""
        if self.schema is None:
            raise FxDataError(
                f"{self.path}: mixed-schema DBN stream (metadata schema is null); "
                f"only single-schema {sorted(SCHEMAS)} files are supported"
            )
        spec = SCHEMAS.get(self.schema)
        if spec is None:
            raise FxDataError(
                f"{self.path}: unsupported DBN schema {self.schema!r}; supported: {sorted(SCHEMAS)}"
            )
        return spec

    def record_dtype(self) -> np.dtype[Any]:
        return self.spec().dtype(self.ts_out)

    def require(self, schema: str | None, dataset: str | None = None) -> None:
        """FxDataError naming the file, the expected and the found schema (and dataset) unless
        this file holds ``schema`` records (of ``dataset``); None accepts any."""
        if schema is not None and self.schema != schema:
            raise FxDataError(
                f"{self.path}: DBN schema is {self.schema!r}, expected {schema!r} "
                f"(the file is in the {schema} folder); nothing was decoded"
            )
        if dataset is not None and self.dataset != dataset:
            raise FxDataError(
                f"{self.path}: DBN dataset is {self.dataset!r}, expected {dataset!r}; nothing was decoded"
            )


def _enum_str(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _parse_mappings(path: Path, meta: Any) -> tuple[SymbolInterval, ...]:
    """Flatten metadata mappings into (raw_symbol, instrument_id, dates) intervals.

    With ``stype_out = instrument_id`` the mapping key is the requested (raw) symbol and each
    interval's symbol the instrument id; with ``stype_in = instrument_id`` it is the reverse.
    Intervals with an empty symbol (not mapped on those dates) are dropped.
    """
    stype_in, stype_out = _enum_str(meta.stype_in), _enum_str(meta.stype_out)
    out: list[SymbolInterval] = []
    for key, intervals in dict(meta.mappings).items():
        for iv in intervals:
            sym = str(iv["symbol"])
            if not sym:
                continue
            if stype_out == "instrument_id":
                raw, iid_text = str(key), sym
            elif stype_in == "instrument_id":
                raw, iid_text = sym, str(key)
            else:
                continue
            try:
                iid = int(iid_text)
            except ValueError as exc:
                raise FxDataError(f"{path}: symbology maps {key!r} to non-integer id {iid_text!r}") from exc
            out.append(SymbolInterval(raw, iid, iv["start_date"], iv["end_date"]))
    out.sort(key=lambda s: (s.instrument_id, s.start_date, s.raw_symbol))
    return tuple(out)


def _is_zstd(path: Path) -> bool:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == ZSTD_MAGIC:
        return True
    if magic[:3] == DBN_MAGIC:
        return False
    raise FxDataError(f"{path}: not a DBN file (first bytes {magic!r} are neither zstd nor DBN magic)")


def _iter_decompressed(
    path: Path, chunk_bytes: int, hasher: Hasher | None = None
) -> Generator[tuple[bytes, int], None, None]:
    """Yield (decompressed piece, source bytes consumed so far); pieces are about
    ``min(chunk_bytes, _PIECE_TARGET)`` bytes. Every source byte read is fed to ``hasher``
    (the file is read from its first byte to its last, so a full pass hashes the whole file).

    zstd: frames are decoded one after another (a file may hold several). The compressed read
    size follows the compression ratio seen so far so that each piece lands near the target
    (~1 MiB pieces keep the decompressor's output in cache: measured as fast as plain
    ``read_to_iter``, while 16 MiB pieces were 2.5x slower). A stream that ends inside a frame
    is reported as truncated — ``stream_reader``/``read_to_iter`` would stop silently.
    """
    target = min(chunk_bytes, _PIECE_TARGET)
    if not _is_zstd(path):
        with open(path, "rb") as f:
            pos = 0
            while piece := f.read(target):
                pos += len(piece)
                if hasher is not None:
                    hasher.update(piece)
                yield piece, pos
        return
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj(write_size=_ZSTD_WRITE_SIZE)
    in_frame = False
    pos = 0
    out_total = 0
    with open(path, "rb") as f:
        while True:
            # start cautiously (DBN compresses ~4-20x), then follow the observed ratio
            ratio = out_total / pos if pos and out_total else 32.0
            data = f.read(int(min(max(target / max(ratio, 1.0), 1024), target)))
            if not data:
                break
            pos += len(data)
            if hasher is not None:
                hasher.update(data)
            while data:
                try:
                    out = dobj.decompress(data)
                except zstandard.ZstdError as exc:
                    raise FxDataError(
                        f"{path}: corrupt zstd data in the compressed bytes [{pos - len(data)}, {pos}): {exc}"
                    ) from exc
                in_frame = True
                if out:
                    out_total += len(out)
                    yield out, pos
                if dobj.eof:
                    in_frame = False
                    data = dobj.unused_data
                    dobj = dctx.decompressobj(write_size=_ZSTD_WRITE_SIZE)
                else:
                    data = b""
    if in_frame:
        raise FxDataError(
            f"{path}: truncated zstd stream (the last frame is incomplete at compressed byte {pos}, "
            f"after {out_total} decompressed bytes)"
        )


def _decode_header(path: Path, prefix: bytes) -> DbnHeader:
    import databento_dbn

    version = prefix[3]
    if version not in SUPPORTED_DBN_VERSIONS:
        raise FxDataError(f"{path}: unsupported DBN version {version} (supported {SUPPORTED_DBN_VERSIONS})")
    try:
        meta = databento_dbn.Metadata.decode(prefix)
    except Exception as exc:  # databento_dbn raises its own error types
        raise FxDataError(f"{path}: cannot decode the DBN metadata header: {exc}") from exc
    limit = meta.limit
    return DbnHeader(
        path=path,
        compressed=_is_zstd(path),
        version=version,
        header_bytes=bytes(prefix),
        dataset=str(meta.dataset),
        schema=_enum_str(meta.schema),
        start=int(meta.start),
        end=None if meta.end is None else int(meta.end),
        limit=None if not limit else int(limit),
        stype_in=_enum_str(meta.stype_in),
        stype_out=str(_enum_str(meta.stype_out)),
        ts_out=bool(meta.ts_out),
        symbols=tuple(str(s) for s in meta.symbols),
        mappings=_parse_mappings(path, meta),
    )


class _Stream:
    """Decompressed byte stream of a DBN file: the header first, then record pieces."""

    def __init__(self, path: Path, chunk_bytes: int, hasher: Hasher | None = None) -> None:
        self.path = path
        self._it = _iter_decompressed(path, chunk_bytes, hasher)
        self.pos = 0  # source bytes consumed
        buf = b""
        while len(buf) < _PREFIX_LEN or len(buf) < _PREFIX_LEN + self._meta_len(buf):
            try:
                piece, self.pos = next(self._it)
            except StopIteration:
                raise FxDataError(
                    f"{path}: truncated DBN metadata header ({len(buf)} bytes of the stream)"
                ) from None
            buf += piece
        n = _PREFIX_LEN + self._meta_len(buf)
        self.header = _decode_header(path, buf[:n])
        self.rest = buf[n:]

    def _meta_len(self, buf: bytes) -> int:
        if len(buf) < _PREFIX_LEN:
            return 0
        if buf[:3] != DBN_MAGIC:
            raise FxDataError(f"{self.path}: decompressed stream does not start with DBN magic ({buf[:4]!r})")
        n = int(struct.unpack_from("<I", buf, 4)[0])
        if n > _MAX_METADATA_LEN:  # a corrupt length would otherwise read the whole file
            raise FxDataError(f"{self.path}: implausible DBN metadata length {n} bytes (corrupt header)")
        return n

    def pieces(self) -> Iterator[tuple[bytes, int]]:
        if self.rest:
            yield self.rest, self.pos
        self.rest = b""
        yield from self._it


def read_header(path: Path | str) -> DbnHeader:
    """Read and decode only the metadata header (decompressing no more than needed)."""
    path = Path(path)
    stream = _Stream(path, 64 << 10)
    stream._it.close()
    return stream.header


def header_hash(path: Path | str) -> str:
    """sha256 (hex) of the DBN metadata header bytes (prefix + metadata, decompressed)."""
    return read_header(path).header_hash


def check_records(path: Path, arr: np.ndarray, first_index: int, header: DbnHeader) -> None:
    """FxDataError naming the file, the record's index and decompressed offset unless every
    record of ``arr`` (records ``first_index``, ``first_index + 1``, ... of the file) has the
    length and rtype of the header's schema."""
    spec = header.spec()
    want_len = arr.dtype.itemsize // 4
    rs = arr.dtype.itemsize
    if sys.byteorder == "little" and rs % 2 == 0 and arr.flags.c_contiguous and len(arr):
        # length and rtype are the first two bytes of a record: one strided 2-byte compare
        head = arr.view(np.uint16)[:: rs // 2]
        if not (head != (want_len | spec.rtype << 8)).any():
            return
    bad = (arr["length"] != want_len) | (arr["rtype"] != spec.rtype)
    if bad.any():
        k = int(np.argmax(bad))
        idx = first_index + k
        off = header.header_len + idx * arr.dtype.itemsize
        raise FxDataError(
            f"{path}: record {idx} at decompressed byte offset {off} has length {int(arr['length'][k]) * 4} B "
            f"and rtype {int(arr['rtype'][k]):#04x}; expected {arr.dtype.itemsize} B and rtype "
            f"{spec.rtype:#04x} for schema {spec.name!r} (mixed-schema or corrupt file)"
        )


def iter_record_chunks(
    path: Path | str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    hasher: Hasher | None = None,
    *,
    validate: bool = True,
) -> Iterator[tuple[DbnHeader, np.ndarray, int]]:
    """Stream the records of a single-schema DBN file as validated numpy record arrays.

    Yields ``(header, records, source_bytes_done)``; each ``records`` array holds at most about
    ``chunk_bytes`` of records (a record straddling two decompressed pieces is yielded on its
    own), so memory is bounded by the chunk size, not the file size. The arrays are read-only
    views of the decompressed bytes. An empty file yields nothing. With ``hasher``, every byte
    of the source file is fed to it as it is read: after the last chunk it holds the hash of
    the whole file (:func:`fx_assets.core.checksum.hash_file` gives the same digest).
    ``validate=False`` leaves the record check to the caller: it must pass every array, with
    the count of records before it, to :func:`check_records` before using it (the sidecar
    decoder does, in its consuming thread, to keep the check off the decompression thread).
    """
    path = Path(path)
    if chunk_bytes < 4096:
        raise FxDataError(f"{path}: chunk_bytes={chunk_bytes} is too small (minimum 4096)")
    stream = _Stream(path, chunk_bytes, hasher)
    header = stream.header
    dtype = header.record_dtype()
    rs = dtype.itemsize
    per_chunk = max(1, chunk_bytes // rs)
    carry = b""
    index = 0
    for piece, done in stream.pieces():
        start = 0
        if carry:
            need = rs - len(carry)
            if len(piece) < need:
                carry += piece
                continue
            one = np.frombuffer(carry + piece[:need], dtype=dtype)
            if validate:
                check_records(path, one, index, header)
            yield header, one, done
            index += 1
            start = need
            carry = b""
        n = (len(piece) - start) // rs
        if n:
            arr = np.frombuffer(piece, dtype=dtype, count=n, offset=start)
            if validate:
                check_records(path, arr, index, header)
            # a piece may overshoot the target when the compression ratio jumps: slice it
            for a in range(0, n, per_chunk):
                yield header, arr[a : a + per_chunk], done
            index += n
        carry = piece[start + n * rs :]
    if carry:
        raise FxDataError(
            f"{path}: truncated record {index} at decompressed byte offset {header.header_len + index * rs}: "
            f"{len(carry)} of {rs} bytes present"
        )


def iter_records(path: Path | str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[np.ndarray]:
    """Like ``iter_record_chunks`` but yields only the record arrays."""
    for _, arr, _ in iter_record_chunks(path, chunk_bytes):
        yield arr


def read_records(path: Path | str) -> np.ndarray:
    """All records of a (small) file as one array — for tests and inspection, not for big files."""
    path = Path(path)
    header = read_header(path)
    parts = [arr for _, arr, _ in iter_record_chunks(path)]
    if not parts:
        return np.zeros(0, dtype=header.record_dtype())
    return np.concatenate(parts)


def px_to_float(px: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """int64 1e-9 fixed-point prices -> float64 in price units; UNDEF_PRICE -> NaN."""
    a = np.asarray(px)
    if a.dtype != np.int64:
        raise FxDataError(f"px_to_float: expected int64 fixed-point prices, got dtype {a.dtype}")
    # divide rather than multiply by 1e-9: the quotient is the correctly rounded price
    # (3720250000000 * 1e-9 == 3720.2500000000005, / 1e9 == 3720.25)
    out = a.astype(np.float64) / PRICE_DIVISOR
    out[a == UNDEF_PRICE] = np.nan
    return out


_SIGN_TABLE = np.zeros(256, dtype=np.int8)
_SIGN_TABLE[ord("B")] = 1
_SIGN_TABLE[ord("A")] = -1


def aggressor_sign(side: npt.ArrayLike) -> npt.NDArray[np.int8]:
    """uint8 ASCII sides -> int8 aggressor sign: B (buy) +1, A (sell) -1, anything else 0."""
    a = np.asarray(side)
    if a.dtype == np.dtype("S1"):
        a = a.view(np.uint8)
    if a.dtype != np.uint8:
        raise FxDataError(f"aggressor_sign: expected uint8 ASCII side codes, got dtype {a.dtype}")
    return _SIGN_TABLE[a]
