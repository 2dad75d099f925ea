"""Genuine DBN encoding for the synthetic market: record dtypes, metadata, streaming writer.

Owns the byte layout of the two record types the generator writes (checked against real
Databento fixtures by the tests):

* trades, ``rtype`` 0, ``TradeMsg``: 48 bytes (``length`` 12 words);
* MBP-10, ``rtype`` 10, ``Mbp10Msg``: 368 bytes (``length`` 92 words).

The metadata header is encoded by ``databento_dbn.Metadata(...).encode()`` (DBN version 3, the
version that library writes), the records are little-endian numpy structured arrays appended
after it, and the whole stream is one zstd frame written incrementally
(``zstandard.ZstdCompressor.stream_writer``) so that a quarter never has to sit in memory.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, cast

import databento_dbn
import numpy as np
import zstandard

DATASET = "GLBX.MDP3"
PUBLISHER_ID_GLBX = 1
RTYPE_TRADES = 0
RTYPE_MBP10 = 10
F_LAST = 128
UNDEF_PRICE = 2**63 - 1

_HEADER_FIELDS: list[tuple[str, str]] = [
    ("length", "u1"),
    ("rtype", "u1"),
    ("publisher_id", "<u2"),
    ("instrument_id", "<u4"),
    ("ts_event", "<u8"),
    ("price", "<i8"),
    ("size", "<u4"),
    ("action", "S1"),
    ("side", "S1"),
    ("flags", "u1"),
    ("depth", "u1"),
    ("ts_recv", "<u8"),
    ("ts_in_delta", "<i4"),
    ("sequence", "<u4"),
]

TRADE_DTYPE = np.dtype(_HEADER_FIELDS)
MBP10_DTYPE = np.dtype(
    _HEADER_FIELDS
    + [
        item
        for i in range(10)
        for item in (
            (f"bid_px_{i:02d}", "<i8"),
            (f"ask_px_{i:02d}", "<i8"),
            (f"bid_sz_{i:02d}", "<u4"),
            (f"ask_sz_{i:02d}", "<u4"),
            (f"bid_ct_{i:02d}", "<u4"),
            (f"ask_ct_{i:02d}", "<u4"),
        )
    ]
)
assert TRADE_DTYPE.itemsize == 48 and MBP10_DTYPE.itemsize == 368


@dataclass(frozen=True)
class MappingInterval:
    """One ``raw_symbol -> instrument_id`` interval (UTC dates, end exclusive)."""

    start_date: dt.date
    end_date: dt.date
    symbol: str  # the instrument id, as text (Databento's convention for stype_out instrument_id)


@dataclass(frozen=True)
class SymbolMapping:
    raw_symbol: str
    intervals: tuple[MappingInterval, ...]


def encode_metadata(
    *,
    schema: str,
    symbols: Sequence[str],
    start_ns: int,
    end_ns: int,
    mappings: Sequence[SymbolMapping],
) -> bytes:
    """DBN metadata header for a GLBX.MDP3 parent-symbology file (``stype_in`` parent,
    ``stype_out`` instrument_id), as Databento writes for a request like ``ES.FUT``."""
    if schema not in ("trades", "mbp-10"):
        raise ValueError(f"unsupported schema {schema!r}")
    md = databento_dbn.Metadata(
        dataset=DATASET,
        start=int(start_ns),
        stype_in=databento_dbn.SType("parent"),
        stype_out=databento_dbn.SType("instrument_id"),
        schema=databento_dbn.Schema(schema),
        symbols=list(symbols),
        partial=[],
        not_found=[],
        # Our frozen dataclasses satisfy databento_dbn's (mutable-attribute) protocols at run time.
        mappings=cast("list[Any]", list(mappings)),
        end=int(end_ns),
    )
    return bytes(md.encode())


class DbnStreamWriter:
    """Write a zstd-compressed DBN file: header first, then record chunks as they come.

    Records must be numpy arrays of exactly ``dtype`` (checked) and are appended in call
    order; the caller keeps them sorted by ``ts_recv``.
    """

    def __init__(self, path: Path, header: bytes, dtype: np.dtype, level: int = 1) -> None:
        self.path = Path(path)
        self.dtype = dtype
        self.n_records = 0
        self._fh: BinaryIO = open(self.path, "wb")  # closed in close() / __exit__
        # Single-threaded, fixed level, no content-size: byte-identical output for equal input.
        cctx = zstandard.ZstdCompressor(level=level, write_checksum=False, threads=0)
        self._zw = cctx.stream_writer(self._fh, closefd=False)
        self._zw.write(header)

    def write(self, records: np.ndarray) -> None:
        if records.dtype != self.dtype:
            raise ValueError(f"{self.path}: record dtype {records.dtype} != {self.dtype}")
        if records.size:
            self._zw.write(np.ascontiguousarray(records).data)
            self.n_records += int(records.size)

    def close(self) -> None:
        self._zw.close()  # ends the zstd frame
        self._fh.close()

    def __enter__(self) -> DbnStreamWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._zw.close()
            self._fh.close()
