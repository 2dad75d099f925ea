"""DBN decoding (fx_assets.core.dbn) against Databento's own decoder and on malformed input."""

from __future__ import annotations

import csv
import hashlib
import itertools
import struct
from pathlib import Path

import databento
import numpy as np
import pytest
import zstandard

from fx_assets.core import dbn
from fx_assets.core.errors import FxDataError
from fx_assets_tests.conftest import fixtures_dir

FIX = fixtures_dir()
ALL_FILES = sorted(p for p in FIX.rglob("*") if p.name.endswith((".dbn", ".dbn.zst")))
DECODABLE = [p for p in ALL_FILES if dbn.read_header(p).schema in dbn.SCHEMAS]
TRADES_V1 = FIX / "dbn" / "test_data.trades.v1.dbn.zst"
MBP1_BIG = (
    FIX / "nautilus_trader/historical_bars_catalog/futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(FIX)) for p in paths]


def expected_csv(path: Path) -> Path:
    rel = path.relative_to(FIX)
    name = rel.name.removesuffix(".zst").removesuffix(".dbn")
    return FIX / "expected" / rel.parent / f"{name}.csv"


def decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:4] == dbn.ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    return data


def write_dbn(path: Path, header: bytes, records: np.ndarray | bytes, *, zstd: bool, frames: int = 1) -> Path:
    """A DBN file from raw header bytes and records; zstd as ``frames`` concatenated frames."""
    body = header + (records if isinstance(records, bytes) else records.tobytes())
    if not zstd:
        path.write_bytes(body)
        return path
    cuts = np.linspace(0, len(body), frames + 1).astype(int)
    cctx = zstandard.ZstdCompressor(level=1)
    path.write_bytes(b"".join(cctx.compress(body[a:b]) for a, b in itertools.pairwise(cuts)))
    return path


def test_fixture_discovery_covers_the_readme() -> None:
    schemas = {dbn.read_header(p).schema for p in DECODABLE}
    versions = {dbn.read_header(p).version for p in DECODABLE}
    assert schemas == {"trades", "tbbo", "mbp-1", "mbp-10"}
    assert versions == {1, 2, 3}
    assert {p.name.endswith(".zst") for p in DECODABLE} == {True, False}
    # every expected CSV belongs to one decodable fixture
    csvs = sorted((FIX / "expected").rglob("*.csv"))
    assert sorted(expected_csv(p) for p in DECODABLE) == csvs


@pytest.mark.parametrize("schema", ["trades", "tbbo", "mbp-1", "mbp-10"])
def test_record_dtype_matches_databento_layout(schema: str) -> None:
    path = next(p for p in DECODABLE if dbn.read_header(p).schema == schema)
    ref = databento.DBNStore.from_file(path).to_ndarray().dtype
    ours = dbn.SCHEMAS[schema].dtype()
    assert ours.itemsize == ref.itemsize == {"trades": 48, "tbbo": 80, "mbp-1": 80, "mbp-10": 368}[schema]
    assert ours.names == ref.names
    ofields, rfields = ours.fields, ref.fields
    assert ofields is not None and rfields is not None
    for name in ofields:
        assert ofields[name][1] == rfields[name][1], name  # same byte offset
        assert ofields[name][0].itemsize == rfields[name][0].itemsize, name


@pytest.mark.parametrize("path", DECODABLE, ids=_ids(DECODABLE))
def test_records_equal_databento_and_expected_csv(path: Path) -> None:
    ours = dbn.read_records(path)
    ref = databento.DBNStore.from_file(path).to_ndarray()
    assert len(ours) == len(ref) > 0
    for name in ref.dtype.names or ():
        r = ref[name].view(np.uint8) if ref[name].dtype.kind == "S" else ref[name]
        np.testing.assert_array_equal(
            ours[name].astype(r.dtype) if name.startswith("ts_") else ours[name], r, name
        )
    with open(expected_csv(path), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(ours)
    assert set(rows[0]) == set(ours.dtype.names or ()) - {"length"}
    for name in rows[0]:
        col = [r[name] for r in rows]
        want = [ord(v) for v in col] if name in ("action", "side") else [int(v) for v in col]
        assert ours[name].tolist() == want, name


@pytest.mark.parametrize("path", ALL_FILES, ids=_ids(ALL_FILES))
def test_header_version_and_hash(path: Path) -> None:
    h = dbn.read_header(path)
    raw = decompressed(path)
    assert raw[:3] == b"DBN" and h.version == raw[3]
    n = 8 + struct.unpack_from("<I", raw, 4)[0]
    assert h.header_bytes == raw[:n]
    assert dbn.header_hash(path) == hashlib.sha256(raw[:n]).hexdigest()
    assert h.compressed == path.name.endswith(".zst")


def test_header_fields_and_mappings() -> None:
    h = dbn.read_header(TRADES_V1)
    assert (h.version, h.dataset, h.schema, h.stype_in, h.stype_out) == (
        1,
        "GLBX.MDP3",
        "trades",
        "raw_symbol",
        "instrument_id",
    )
    assert [(m.raw_symbol, m.instrument_id, str(m.start_date), str(m.end_date)) for m in h.mappings] == [
        ("ESH1", 5482, "2020-12-28", "2020-12-29")
    ]


def test_chunked_iteration_equals_whole_and_is_bounded(tmp_path: Path) -> None:
    whole = dbn.read_records(MBP1_BIG)
    chunks = list(dbn.iter_records(MBP1_BIG, chunk_bytes=4096))
    assert len(chunks) > 10
    assert max(c.nbytes for c in chunks) <= 4096
    np.testing.assert_array_equal(np.concatenate(chunks), whole)
    # several zstd frames, plain, and tiny chunks that split records across borders
    header = dbn.read_header(MBP1_BIG).header_bytes
    for zstd, frames in ((True, 7), (False, 1)):
        p = write_dbn(
            tmp_path / f"multi{frames}.dbn{'.zst' if zstd else ''}", header, whole, zstd=zstd, frames=frames
        )
        got = list(dbn.iter_records(p, chunk_bytes=4096 + 7))
        np.testing.assert_array_equal(np.concatenate(got), whole)


def test_px_to_float_and_aggressor_sign() -> None:
    px = np.array([3720250000000, dbn.UNDEF_PRICE, -5, 0], dtype=np.int64)
    out = dbn.px_to_float(px)
    assert out[0] == 3720.25 and np.isnan(out[1]) and out[2] == -5e-9 and out[3] == 0.0
    side = np.frombuffer(b"BANx", dtype=np.uint8)
    assert dbn.aggressor_sign(side).tolist() == [1, -1, 0, 0]
    assert dbn.aggressor_sign(side).dtype == np.int8
    with pytest.raises(FxDataError):
        dbn.px_to_float(px.astype(np.float64))
    with pytest.raises(FxDataError):
        dbn.aggressor_sign(np.array([1, 2], dtype=np.int64))


def test_garbage_file(tmp_path: Path) -> None:
    p = tmp_path / "garbage.dbn.zst"
    p.write_bytes(b"this is not a DBN file at all" * 10)
    with pytest.raises(FxDataError, match=r"garbage\.dbn\.zst"):
        dbn.read_header(p)


def test_corrupt_zstd_payload(tmp_path: Path) -> None:
    data = bytearray(MBP1_BIG.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    p = tmp_path / "corrupt.dbn.zst"
    p.write_bytes(bytes(data))
    with pytest.raises(FxDataError, match=r"corrupt\.dbn\.zst.*(corrupt|truncated)"):
        list(dbn.iter_records(p))


def test_truncated_zstd(tmp_path: Path) -> None:
    data = MBP1_BIG.read_bytes()
    p = tmp_path / "cut.dbn.zst"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(FxDataError, match=r"cut\.dbn\.zst: truncated zstd stream"):
        list(dbn.iter_records(p, chunk_bytes=4096))


def test_plain_cut_mid_record(tmp_path: Path) -> None:
    raw = decompressed(FIX / "dbn" / "test_data.mbp-10.dbn")
    h = dbn.read_header(FIX / "dbn" / "test_data.mbp-10.dbn")
    p = tmp_path / "cut.dbn"
    p.write_bytes(raw[: h.header_len + 368 + 100])
    with pytest.raises(
        FxDataError, match=rf"cut\.dbn: truncated record 1 at decompressed byte offset {h.header_len + 368}"
    ):
        list(dbn.iter_records(p))


def test_truncated_header(tmp_path: Path) -> None:
    p = tmp_path / "hdr.dbn"
    p.write_bytes(decompressed(TRADES_V1)[:50])
    with pytest.raises(FxDataError, match=r"hdr\.dbn: truncated DBN metadata header"):
        dbn.read_header(p)


def test_corrupt_metadata_length(tmp_path: Path) -> None:
    p = tmp_path / "len.dbn"
    p.write_bytes(b"DBN\x02" + (2**31).to_bytes(4, "little") + b"\0" * 100)
    with pytest.raises(FxDataError, match=r"len\.dbn: implausible DBN metadata length"):
        dbn.read_header(p)


def test_wrong_rtype_record_names_index_and_offset(tmp_path: Path) -> None:
    recs = dbn.read_records(MBP1_BIG)[:50].copy()
    recs["rtype"][17] = 0x0A
    h = dbn.read_header(MBP1_BIG)
    p = write_dbn(tmp_path / "bad.dbn.zst", h.header_bytes, recs, zstd=True)
    with pytest.raises(
        FxDataError, match=rf"bad\.dbn\.zst: record 17 at decompressed byte offset {h.header_len + 17 * 80}"
    ):
        list(dbn.iter_records(p))
    recs["rtype"][17] = 1
    recs["length"][3] = 12
    p = write_dbn(tmp_path / "bad2.dbn", h.header_bytes, recs, zstd=False)
    with pytest.raises(FxDataError, match=r"bad2\.dbn: record 3 .* length 48 B"):
        list(dbn.iter_records(p))


def test_mixed_schema_and_unsupported_schema() -> None:
    live = FIX / "databento-python" / "LIVE" / "test_data.live.dbn.zst"
    with pytest.raises(FxDataError, match=r"test_data\.live\.dbn\.zst: mixed-schema"):
        list(dbn.iter_records(live))
    ohlcv = FIX / "dbn" / "test_data.ohlcv-1m.v3.dbn.zst"
    with pytest.raises(
        FxDataError, match=r"test_data\.ohlcv-1m\.v3\.dbn\.zst: unsupported DBN schema 'ohlcv-1m'"
    ):
        list(dbn.iter_records(ohlcv))


def test_empty_file_yields_nothing(tmp_path: Path) -> None:
    h = dbn.read_header(TRADES_V1)
    p = write_dbn(tmp_path / "empty.dbn.zst", h.header_bytes, b"", zstd=True)
    assert list(dbn.iter_records(p)) == []
    assert len(dbn.read_records(p)) == 0
    assert dbn.read_records(p).dtype == dbn.TRADES_DTYPE
