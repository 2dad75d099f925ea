"""fxcache: round trips in each dtype, zero-copy load, every validation failure, atomic write,
parquet export."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from fx_assets.core import fxcache
from fx_assets.core.errors import FxCacheError, FxDataError
from fx_assets.core.fxcache import (
    HEADER_SIZE,
    DType,
    bf16_bits_to_f64,
    describe_fxcache,
    f32_to_bf16_bits,
    open_fxcache,
    read_header,
    write_fxcache,
)

KEY = bytes(range(32))
N = 1000
FEATURES = ["ret_1", "rsi_14", "vol_20"]
PRICES = ["open", "close", "mid_open", "duration_s"]
OFI = ["ofi_l1", "ofi_l5"]


def make_columns(n: int = N, seed: int = 0, ofi: bool = True) -> dict[str, tuple[list[str], np.ndarray]]:
    rng = np.random.default_rng(seed)
    close = 5000.0 + np.cumsum(rng.normal(0, 0.25, n))
    cols = {
        "feature": (FEATURES, rng.normal(size=(n, 3))),
        "price": (PRICES, np.column_stack([close - 0.25, close, close - 0.125, rng.uniform(1, 60, n)])),
    }
    if ofi:
        cols["ofi"] = (OFI, rng.normal(size=(n, 2)))
    return cols


def make_ts(n: int = N) -> np.ndarray:
    return 1_704_150_000_000_000_000 + np.arange(n, dtype=np.int64) * 1_000_000_000


def write(path: Path, dtype: DType = "f32", n: int = N, ofi: bool = True, **kw: Any) -> Path:
    return write_fxcache(
        path, make_ts(n), make_columns(n, ofi=ofi), dtype, KEY, {"partition": "2024-Q1|ES.FUT"}, **kw
    )


def all_values(cols: dict[str, tuple[list[str], np.ndarray]]) -> np.ndarray:
    return np.concatenate([cols[g][1] for g in ("feature", "price", "ofi") if g in cols], axis=1)


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_round_trip(tmp_path: Path, dtype: DType) -> None:
    cols = make_columns()
    p = write_fxcache(
        tmp_path / "a.fxcache", make_ts(), cols, dtype, KEY, {"partition": "2024-Q1|ES.FUT"}, chunk_rows=77
    )
    expected = all_values(cols)
    with open_fxcache(p) as fc:
        assert fc.n_bars == N and fc.dtype == dtype and fc.has_ofi and fc.cache_key == KEY
        # 3 features + 2 OFI in the value block, 4 prices in the f64 price block, each padded to 8
        assert fc.header.row_width == 8 and fc.values.shape == (N, 8)
        assert fc.header.price_width == 8 and fc.prices.shape == (N, 8) and fc.prices.dtype == np.float64
        np.testing.assert_array_equal(fc.ts, make_ts())
        assert fc.column_names == FEATURES + PRICES + OFI
        assert fc.value_column_names == FEATURES + OFI
        assert fc.group("price") == slice(0, 4) and fc.group("ofi") == slice(3, 5)
        assert fc.group_names("ofi") == OFI
        assert fc.meta == {"partition": "2024-Q1|ES.FUT"}
        got = fc.decoded()
        px = slice(3, 7)  # price columns in column_names order
        np.testing.assert_array_equal(got[:, px], expected[:, px])  # exact at every value dtype
        vals = np.delete(got, px, axis=1)
        want = np.delete(expected, px, axis=1)
        if dtype == "f64":
            np.testing.assert_array_equal(vals, want)
        elif dtype == "f32":
            np.testing.assert_array_equal(vals, want.astype(np.float32).astype(np.float64))
        else:
            # bf16 keeps 8 significant bits: relative error <= 2^-8 after round-to-nearest
            assert fc.values.dtype == np.uint16
            np.testing.assert_array_equal(vals, bf16_bits_to_f64(f32_to_bf16_bits(want)))
            assert np.all(np.abs(vals - want) <= np.abs(want) * 2.0**-8 * (1 + 1e-6))
        for i, name in enumerate(fc.column_names):
            np.testing.assert_array_equal(fc.column(name), got[:, i])
        # padding columns are zero
        assert not np.any(fc.values[:, 5:]) and not np.any(fc.prices[:, 4:])


def test_bf16_round_to_nearest_even_on_hand_values() -> None:
    # 1.0 = 0x3F80_0000. The bf16 spacing at 1.0 is 2^-7; the low 16 bits decide rounding.
    cases = {
        1.0: 0x3F80,
        1.0 + 2.0**-8: 0x3F80,  # exactly half way (0x3F80_8000): tie -> even (0x3F80)
        1.0 + 3 * 2.0**-8: 0x3F82,  # half way between 0x3F81 and 0x3F82: tie -> even (0x3F82)
        1.0 + 2.0**-8 + 2.0**-20: 0x3F81,  # just above half way: up
        1.0 + 2.0**-8 - 2.0**-20: 0x3F80,  # just below: down
        -2.0: 0xC000,
        0.0: 0x0000,
        3.0e38: 0x7F62,  # large but finite
    }
    x = np.array(list(cases), dtype=np.float32)
    got = f32_to_bf16_bits(x)
    assert [hex(v) for v in got] == [hex(v) for v in cases.values()]
    assert bf16_bits_to_f64(np.array([0x3F81], dtype=np.uint16))[0] == 1.0 + 2.0**-7
    # above the largest bf16 rounds to inf; NaN stays NaN
    assert np.isinf(bf16_bits_to_f64(f32_to_bf16_bits(np.float32(3.4e38))))[()]
    assert np.isnan(bf16_bits_to_f64(f32_to_bf16_bits(np.float32(np.nan))))[()]


def test_zero_copy_load(tmp_path: Path) -> None:
    p = write(tmp_path / "z.fxcache", "f64")
    fc = open_fxcache(p)
    h = fc.header
    for arr in (fc.ts, fc.values):
        assert not arr.flags.owndata and not arr.flags.writeable
        assert np.shares_memory(arr, fc._raw)
    # the arrays are the file's pages: a write to the file shows through the open mapping
    with open(p, "r+b") as fh:
        fh.seek(h.values_offset)
        fh.write(struct.pack("<d", 12345.5))
    assert fc.values[0, 0] == 12345.5
    assert fc.values.ctypes.data % 64 == 0 and fc.ts.ctypes.data % 64 == 0  # 64-byte aligned blocks


def test_empty_file_and_no_ofi(tmp_path: Path) -> None:
    p = write(tmp_path / "e.fxcache", "f32", n=0, ofi=False)
    with open_fxcache(p) as fc:
        assert fc.n_bars == 0 and not fc.has_ofi and fc.values.shape == (0, 8)
        assert fc.group("ofi") == slice(3, 3)
    p = write(tmp_path / "n.fxcache", "bf16", n=50, ofi=False)
    with open_fxcache(p) as fc:
        assert not fc.has_ofi and fc.header.n_ofi == 0


# --- validation failures -------------------------------------------------------------------------


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def expect_error(path: Path, match: str, **kw: Any) -> None:
    with pytest.raises(FxCacheError, match=match) as info:
        open_fxcache(path, **kw)
    assert str(path) in str(info.value)


def test_bad_magic(tmp_path: Path) -> None:
    p = write(tmp_path / "m.fxcache")
    patch(p, 0, b"NOTCACHE")
    expect_error(p, "bad magic")


def test_bad_version(tmp_path: Path) -> None:
    p = write(tmp_path / "v.fxcache")
    patch(p, 8, struct.pack("<H", 99))
    expect_error(p, "format version 99")


def test_truncated(tmp_path: Path) -> None:
    p = write(tmp_path / "t.fxcache")
    data = p.read_bytes()
    p.write_bytes(data[:-100])
    expect_error(p, "truncated")
    p.write_bytes(data[:100])  # not even a whole header
    expect_error(p, "truncated")


def test_size_mismatch(tmp_path: Path) -> None:
    p = write(tmp_path / "s.fxcache")
    with open(p, "ab") as fh:
        fh.write(b"\0" * 64)
    expect_error(p, "size mismatch")
    p = write(tmp_path / "s2.fxcache")
    h = read_header(p)
    patch(p, 40, struct.pack("<Q", h.n_bars + 1))  # bar count no longer matches the offsets
    expect_error(p, "size mismatch")


def test_schema_hash_mismatch(tmp_path: Path) -> None:
    p = write(tmp_path / "h.fxcache")
    data = p.read_bytes()
    assert data.count(b'"rsi_14"') == 1
    p.write_bytes(data.replace(b'"rsi_14"', b'"rsi_15"'))  # same length, other column name
    expect_error(p, "schema hash mismatch")


def test_trailer_disagreeing_with_header(tmp_path: Path) -> None:
    p = write(tmp_path / "g.fxcache")
    data = p.read_bytes()
    p.write_bytes(data.replace(b'"group": "price"', b'"group": "ofi__"', 1))
    expect_error(p, "do not match the header")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_non_finite_value(tmp_path: Path, bad: float, dtype: DType) -> None:
    p = write(tmp_path / "f.fxcache", dtype, chunk_rows=100)
    h = read_header(p)
    row, col = 777, 3  # ofi_l1 in the value block
    if dtype == "bf16":
        raw = f32_to_bf16_bits(np.float32(bad)).tobytes()
    else:
        raw = np.array(bad, dtype=fxcache.STORAGE[dtype]).tobytes()
    patch(p, h.values_offset + (row * h.row_width + col) * h.itemsize, raw)
    expect_error(p, "checksum mismatch in the values block")  # changed after writing
    # the finite scan names the column and bar on its own
    expect_error(p, f"column 'ofi_l1' at bar {row}", verify_checksums=False)
    patch(p, h.price_offset + (row * h.price_width + 1) * 8, struct.pack("<d", bad))
    expect_error(p, f"column 'close' at bar {row}", verify_checksums=False)
    with open_fxcache(p, verify_finite=False, verify_checksums=False) as fc:  # the checks can be skipped ...
        assert not np.isfinite(fc.column("close")[row])
    d = describe_fxcache(p)  # ... and inspect still shows the file
    assert d["finite"] is False and d["valid"] is False


def test_has_ofi_set_with_all_zero_ofi(tmp_path: Path) -> None:
    p = write(tmp_path / "o.fxcache", "f32")
    h = read_header(p)
    with open(p, "r+b") as fh:  # zero the OFI columns in place; the flag stays set
        for row in range(h.n_bars):
            fh.seek(h.values_offset + (row * h.row_width + 3) * h.itemsize)
            fh.write(bytes(2 * h.itemsize))
    expect_error(p, "checksum mismatch")
    expect_error(p, "has_ofi flag is set but its 2 OFI columns are all zero", verify_checksums=False)


def test_has_ofi_set_without_ofi_columns(tmp_path: Path) -> None:
    p = write(tmp_path / "o2.fxcache", "f32", ofi=False)
    patch(p, 12, struct.pack("<I", 1))
    expect_error(p, "checksum mismatch in the header")
    expect_error(p, "has_ofi flag is set but has no OFI columns", verify_checksums=False)


def test_has_ofi_clear_with_ofi_present(tmp_path: Path) -> None:
    p = write(tmp_path / "o3.fxcache", "f32")
    patch(p, 12, struct.pack("<I", 0))
    expect_error(p, "checksum mismatch in the header")
    expect_error(p, "has_ofi flag is clear but the file carries 2 OFI columns", verify_checksums=False)


def test_missing_file_is_named(tmp_path: Path) -> None:
    expect_error(tmp_path / "absent.fxcache", "cannot read")


# --- writer ----------------------------------------------------------------------------------------


def test_writer_refuses_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "w.fxcache"
    cols = make_columns()
    cols["feature"][1][5, 1] = np.nan
    with pytest.raises(FxDataError, match="column 'rsi_14' at bar 5"):
        write_fxcache(p, make_ts(), cols, "f32", KEY, {})
    cols = make_columns()
    cols["feature"][1][9, 0] = 1e39  # finite in f64, inf once stored as f32
    with pytest.raises(FxDataError, match="column 'ret_1' at bar 9"):
        write_fxcache(p, make_ts(), cols, "f32", KEY, {})
    cols = make_columns()
    cols["ofi"][1][:] = 0.0
    with pytest.raises(FxDataError, match="all zero"):
        write_fxcache(p, make_ts(), cols, "f32", KEY, {})
    with pytest.raises(FxDataError, match="decreases at bar 3"):
        write_fxcache(p, make_ts()[[0, 1, 2, 1]], make_columns(4), "f32", KEY, {})
    with pytest.raises(FxDataError, match="repeated"):
        write_fxcache(p, make_ts(2), {"feature": (["a", "a"], np.ones((2, 2)))}, "f32", KEY, {})
    with pytest.raises(FxDataError, match="shape"):
        write_fxcache(p, make_ts(3), {"feature": (["a"], np.ones((2, 1)))}, "f32", KEY, {})
    assert not any(tmp_path.iterdir())


def _as_blocks(
    cols: dict[str, tuple[list[str], np.ndarray]], rows: np.ndarray | None
) -> dict[str, tuple[list[str], fxcache.ColumnBlock]]:
    """The groups as ColumnBlocks of separate columns (what the bar assembly hands the writer)."""
    n = next(iter(cols.values()))[1].shape[0]
    return {
        g: (names, fxcache.ColumnBlock([v[:, j].copy() for j in range(v.shape[1])], n, rows))
        for g, (names, v) in cols.items()
    }


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_column_blocks_write_the_bytes_of_stacked_rows_and_are_checked_as_stored(
    tmp_path: Path, dtype: DType
) -> None:
    """Columns and a row selection written by the fill kernel (finite / non-zero found in the same
    pass) give the bytes of the selected rows stacked, and the same refusals."""
    cols = make_columns()
    rows = np.flatnonzero(np.arange(N) % 7 != 3)  # a selection, as the dropped rows leave
    picked = {g: (names, v[rows]) for g, (names, v) in cols.items()}
    a = write_fxcache(tmp_path / "a.fxcache", make_ts()[rows], picked, dtype, KEY, {}, chunk_rows=97)
    b = write_fxcache(
        tmp_path / "b.fxcache", make_ts()[rows], _as_blocks(cols, rows), dtype, KEY, {}, chunk_rows=97
    )
    assert a.read_bytes() == b.read_bytes()
    p = tmp_path / "bad.fxcache"
    bad = make_columns()
    bad["feature"][1][9, 2] = 1e39 if dtype != "f64" else np.inf  # inf once stored as f32 / bf16
    with pytest.raises(FxDataError, match="non-finite value inf in column 'vol_20' at bar 8"):
        write_fxcache(p, make_ts()[rows], _as_blocks(bad, rows), dtype, KEY, {}, chunk_rows=97)
    bad = make_columns()
    bad["price"][1][501, 1] = np.nan
    with pytest.raises(FxDataError, match="non-finite value nan in column 'close' at bar 429"):
        write_fxcache(p, make_ts()[rows], _as_blocks(bad, rows), dtype, KEY, {}, chunk_rows=97)
    bad = make_columns()
    bad["ofi"][1][:] = 0.0
    bad["ofi"][1][3, 0] = 1.0  # the only non-zero OFI value is in a dropped row
    with pytest.raises(FxDataError, match="all zero"):
        write_fxcache(p, make_ts()[rows], _as_blocks(bad, rows), dtype, KEY, {}, chunk_rows=97)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.fxcache", "b.fxcache"]


def test_atomic_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "atomic.fxcache"
    write(p, "f32")
    before = p.read_bytes()
    calls = {"n": 0}
    real = fxcache._fill_chunk

    def failing(*args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk on fire")
        return real(*args, **kw)

    monkeypatch.setattr(fxcache, "_fill_chunk", failing)
    cols = make_columns(seed=1)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_fxcache(p, make_ts(), cols, "f32", KEY, {}, chunk_rows=100)
    assert calls["n"] == 3
    assert [x.name for x in tmp_path.iterdir()] == ["atomic.fxcache"]  # no temp file left behind
    assert p.read_bytes() == before  # the earlier output is intact
    # and a fresh path gets nothing at all
    calls["n"] = 0
    with pytest.raises(RuntimeError):
        write_fxcache(tmp_path / "new.fxcache", make_ts(), cols, "f32", KEY, {}, chunk_rows=100)
    assert [x.name for x in tmp_path.iterdir()] == ["atomic.fxcache"]


def test_streaming_writer_memory_is_one_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = fxcache._fill_chunk

    def spy(block: np.ndarray, *a: Any) -> Any:
        sizes.append(block.shape[0])
        return real(block, *a)

    monkeypatch.setattr(fxcache, "_fill_chunk", spy)
    write(tmp_path / "c.fxcache", "f64", chunk_rows=128)
    assert max(sizes) == 128 and sum(sizes) == 2 * N  # the price block, then the value block


# --- export / describe ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_parquet_export_equals_data(tmp_path: Path, dtype: DType) -> None:
    p = write(tmp_path / "x.fxcache", dtype)
    with open_fxcache(p) as fc:
        out = fc.export_parquet(tmp_path / "x.parquet")
        table = pq.read_table(out)
        assert table.column_names == ["ts_close", *fc.column_names]
        np.testing.assert_array_equal(table.column("ts_close").to_numpy(), fc.ts)
        for name in fc.column_names:
            np.testing.assert_array_equal(table.column(name).to_numpy(), fc.column(name))
        meta = table.schema.metadata
        assert meta[b"fx.cache_key"] == KEY.hex().encode()
        assert json.loads(meta[b"fx.meta"]) == {"partition": "2024-Q1|ES.FUT"}
        assert table.schema.field("ofi_l1").metadata == {b"fx.group": b"ofi"}
    expected = all_values(make_columns())
    if dtype == "f64":
        np.testing.assert_array_equal(table.column("close").to_numpy(), expected[:, 4])


def test_describe(tmp_path: Path) -> None:
    p = write(tmp_path / "d.fxcache", "f64")
    d = describe_fxcache(p)
    vals = all_values(make_columns())
    assert d["header"]["n_bars"] == N and d["header"]["has_ofi"] is True
    assert d["header"]["cache_key"] == KEY.hex() and d["finite"] is True
    assert d["file_bytes"] == p.stat().st_size and d["ts_first"] == make_ts()[0]
    for i, c in enumerate(d["columns"]):
        assert c["min"] == vals[:, i].min() and c["max"] == vals[:, i].max() and c["nan"] == 0
        assert c["mean"] == pytest.approx(vals[:, i].mean(), rel=1e-12)


def test_header_is_fixed_size_and_blocks_aligned(tmp_path: Path) -> None:
    p = write(tmp_path / "l.fxcache", "bf16", n=13)
    h = read_header(p)
    assert h.ts_offset == HEADER_SIZE == 256
    assert h.price_offset % 64 == 0 and h.values_offset % 64 == 0 and h.trailer_offset % 64 == 0
    assert h.price_offset == 256 + 128  # 13 * 8 = 104 bytes of ts, padded to 128
    assert h.values_offset == h.price_offset + 13 * 8 * 8  # 13 rows of 8 f64 (832 = 13 * 64)
    assert h.trailer_offset + h.trailer_length == p.stat().st_size
    assert h.header_size == HEADER_SIZE


# --- exact prices at every value type (issue 9.1) ----------------------------------------------


def _market_columns(n: int = 400) -> dict[str, tuple[list[str], np.ndarray]]:
    """130 distinct closes on the 0.25 tick near 5000, and a roll 202403 -> 202406 half way."""
    steps = np.tile(np.arange(130), n // 130 + 1)[:n]
    close = 5000.0 + 0.25 * steps
    contract = np.where(np.arange(n) < n // 2, 202403.0, 202406.0)
    rng = np.random.default_rng(3)
    return {
        "feature": (["ret_1", "rsi_14"], rng.normal(size=(n, 2))),
        "price": (
            ["open", "close", "mid_open", "contract"],
            np.column_stack([close - 0.25, close, close - 0.125, contract]),
        ),
        "ofi": (["ofi_l1"], rng.normal(size=(n, 1))),
    }


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_prices_are_exact_at_every_value_dtype(tmp_path: Path, dtype: DType) -> None:
    cols = _market_columns()
    p = write_fxcache(tmp_path / "p.fxcache", make_ts(400), cols, dtype, KEY, {})
    with open_fxcache(p) as fc:
        close = fc.column("close")
        assert np.unique(close).size == 130  # bf16 once made these 2 values
        np.testing.assert_array_equal(close, cols["price"][1][:, 1])
        np.testing.assert_array_equal(fc.column("contract"), cols["price"][1][:, 3])  # 202403 / 202406
        assert fc.prices.dtype == np.float64 and fc.price_group_dtype == "f64"
        # the value dtype applies to the features and OFI only
        assert fc.values.dtype == fxcache.STORAGE[dtype]
        assert fc.group_names("price") == ["open", "close", "mid_open", "contract"]


# --- body checksums (issue 8.6) ----------------------------------------------------------------


def _flip_in_place(p: Path, what: str) -> None:
    h = read_header(p)
    if what == "feature":  # a finite feature value, still finite after the change
        off = h.values_offset + (10 * h.row_width + 0) * h.itemsize
        old = np.frombuffer(p.read_bytes()[off : off + h.itemsize], dtype=fxcache.STORAGE[h.dtype])
        new = (
            old.view(np.uint16 if h.itemsize == 2 else np.uint32 if h.itemsize == 4 else np.uint64) ^ 1
        ).tobytes()
        patch(p, off, new)
    elif what == "close":
        off = h.price_offset + (10 * h.price_width + 1) * 8
        patch(p, off, struct.pack("<d", 5000.5))
    elif what == "cache_key":
        patch(p, 48, bytes(reversed(KEY)))
    elif what == "timestamp":  # still non-decreasing
        off = h.ts_offset + 8 * 10
        (t,) = struct.unpack("<q", p.read_bytes()[off : off + 8])
        patch(p, off, struct.pack("<q", t + 1))
    else:  # a trailer byte
        data = p.read_bytes()
        i = data.rindex(b'"partition"')
        patch(p, i + 1, b"P")


@pytest.mark.parametrize("what", ["feature", "close", "cache_key", "timestamp", "trailer"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_in_place_change_is_detected(tmp_path: Path, what: str, dtype: DType) -> None:
    p = write(tmp_path / "c.fxcache", dtype)
    fxcache.verify_fxcache(p)  # a fresh file verifies
    _flip_in_place(p, what)
    with pytest.raises(FxCacheError, match="checksum mismatch") as info:
        fxcache.verify_fxcache(p)
    assert str(p) in str(info.value)
    expect_error(p, "checksum mismatch")  # open_fxcache verifies on every open by default
    d = describe_fxcache(p)  # inspect still shows the file, and says it is invalid
    assert d["valid"] is False and "checksum mismatch" in d["error"]


# --- incremental writer ----------------------------------------------------------------------


def append_in_chunks(
    w: fxcache.FxCacheWriter, cols: dict[str, tuple[list[str], np.ndarray]], sizes: list[int]
) -> None:
    ts, lo = make_ts(), 0
    for k in sizes:
        w.append(ts[lo : lo + k], {g: v[lo : lo + k] for g, (_, v) in cols.items()})
        lo += k


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_incremental_writer_writes_the_bytes_of_write_fxcache(tmp_path: Path, dtype: DType) -> None:
    """Appends of uneven sizes (1 row, chunks larger than chunk_rows, an empty one) give the
    same file, byte for byte, as one write of the whole arrays."""
    cols = make_columns()
    ref = write_fxcache(tmp_path / "ref.fxcache", make_ts(), cols, dtype, KEY, {"partition": "p"})
    names = {g: n for g, (n, _) in cols.items()}
    out = tmp_path / "inc.fxcache"
    with fxcache.FxCacheWriter(out, names, dtype, KEY, N, {"partition": "p"}, chunk_rows=64) as w:
        append_in_chunks(w, cols, [1, 0, 300, 64, 635])
        assert not out.exists()  # nothing under the final name before finish
    assert out.read_bytes() == ref.read_bytes()
    fxcache.verify_fxcache(out)


def test_incremental_writer_memory_is_one_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = fxcache._fill_chunk

    def spy(block: np.ndarray, *a: Any) -> Any:
        sizes.append(block.shape[0])
        return real(block, *a)

    monkeypatch.setattr(fxcache, "_fill_chunk", spy)
    cols = make_columns()
    w = fxcache.FxCacheWriter(
        tmp_path / "m.fxcache", {g: n for g, (n, _) in cols.items()}, "f32", KEY, N, chunk_rows=50
    )
    append_in_chunks(w, cols, [N])  # one append of every row is still written 50 rows at a time
    w.finish()
    assert max(sizes) == 50 and sum(sizes) == 2 * N
    # two buffer sets of one chunk each: the next chunk is filled while this one is written
    assert len(w._bufs) == 2
    assert all(px is not None and px.shape[0] == 50 and val.shape[0] == 50 for px, val in w._bufs)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_chunks_filled_ahead_on_a_thread_write_the_bytes_of_one_chunk(tmp_path: Path, dtype: DType) -> None:
    """write_fxcache fills the next chunk on a second thread while it writes the current one:
    for any chunk size (an odd one, a last chunk shorter than the others) the file is byte for
    byte the one written as a single chunk (no thread), ColumnBlocks with a row selection too."""
    cols = make_columns()
    rows = np.flatnonzero(np.arange(N) % 9 != 4)
    blocks = {
        g: (names, fxcache.ColumnBlock([v[:, c] for c in range(v.shape[1])], N).select(rows))
        for g, (names, v) in cols.items()
    }
    ts = make_ts()[rows]
    ref = fxcache.write_fxcache(tmp_path / "one.fxcache", ts, blocks, dtype, KEY, chunk_rows=N)
    for chunk in (1, 7, 50, len(rows) - 1):
        got = fxcache.write_fxcache(tmp_path / f"c{chunk}.fxcache", ts, blocks, dtype, KEY, chunk_rows=chunk)
        assert got.read_bytes() == ref.read_bytes(), chunk


def test_incremental_writer_names_file_column_and_row_of_a_non_finite_value(tmp_path: Path) -> None:
    cols = make_columns()
    cols["feature"][1][617, 1] = np.inf
    cols["price"][1][905, 2] = np.nan
    names = {g: n for g, (n, _) in cols.items()}
    p = tmp_path / "bad.fxcache"
    w = fxcache.FxCacheWriter(p, names, "bf16", KEY, N, chunk_rows=100)
    with pytest.raises(FxDataError, match=rf"{p}: non-finite value inf in column 'rsi_14' at row 617"):
        append_in_chunks(w, cols, [500, 500])
    assert list(tmp_path.iterdir()) == []  # the failed writer removed its temporary file
    cols["feature"][1][617, 1] = 0.0
    with pytest.raises(FxDataError, match=r"non-finite value nan in column 'mid_open' at row 905"):
        with fxcache.FxCacheWriter(p, names, "f32", KEY, N) as w2:
            append_in_chunks(w2, cols, [400, 600])
    assert list(tmp_path.iterdir()) == []


def test_incremental_writer_refuses_wrong_row_counts_order_and_groups(tmp_path: Path) -> None:
    cols = make_columns()
    names = {g: n for g, (n, _) in cols.items()}
    p = tmp_path / "x.fxcache"
    w = fxcache.FxCacheWriter(p, names, "f32", KEY, N)
    append_in_chunks(w, cols, [N - 1])
    with pytest.raises(FxDataError, match=f"{N - 1} rows appended, {N} declared"):
        w.finish()
    with pytest.raises(FxDataError, match="more than the declared"):
        with fxcache.FxCacheWriter(p, names, "f32", KEY, 10) as w:
            append_in_chunks(w, cols, [11])
    ts = make_ts()
    with pytest.raises(FxDataError, match="ts decreases at row 3"):
        with fxcache.FxCacheWriter(p, names, "f32", KEY, 6) as w:
            w.append(ts[2:5], {g: v[:3] for g, (_, v) in cols.items()})
            w.append(ts[:3], {g: v[:3] for g, (_, v) in cols.items()})
    swapped = ts[:6].copy()
    swapped[4], swapped[3] = swapped[3], swapped[4]  # row 4 before row 3's time, inside a chunk
    with pytest.raises(FxDataError, match="ts decreases at row 4"):
        with fxcache.FxCacheWriter(p, names, "f32", KEY, 6) as w:
            w.append(swapped, {g: v[:6] for g, (_, v) in cols.items()})
    with pytest.raises(FxDataError, match="without group 'ofi'"):
        with fxcache.FxCacheWriter(p, names, "f32", KEY, 2) as w:
            w.append(ts[:2], {"feature": cols["feature"][1][:2], "price": cols["price"][1][:2]})
    with pytest.raises(FxDataError, match="all zero"):
        with fxcache.FxCacheWriter(p, names, "f32", KEY, 2) as w:
            w.append(ts[:2], {**{g: v[:2] for g, (_, v) in cols.items()}, "ofi": np.zeros((2, 2))})
    assert list(tmp_path.iterdir()) == []


_KILLED_WRITER = """
import os, sys
import numpy as np
from fx_assets.core.fxcache import FxCacheWriter
path, n = sys.argv[1], 1000
w = FxCacheWriter(path, {"feature": ["a", "b"], "price": ["mid"]}, "f32", bytes(32), n, chunk_rows=100)
w.append(np.arange(600, dtype=np.int64), {"feature": np.ones((600, 2)), "price": np.full((600, 1), 5000.25)})
os._exit(9)  # killed mid-write: no finally, no cleanup
"""


def test_a_killed_writer_leaves_nothing_a_later_run_trusts(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from fx_assets.core.locks import remove_orphans

    final = tmp_path / "q.fxcache"
    env = {**os.environ, "PYTHONPATH": str(Path(fxcache.__file__).parents[2])}
    r = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(final)], env=env, capture_output=True)
    assert r.returncode == 9, r.stderr
    assert not final.exists()
    (tmp,) = list(tmp_path.iterdir())  # its temporary file, under a temporary name
    assert tmp.name.startswith(f".{final.name}.tmp-")
    with pytest.raises(FxCacheError, match="bad magic"):  # the header is written last
        open_fxcache(tmp)
    assert remove_orphans(final) == [tmp]  # the next build of the file clears it
    cols = make_columns()
    with fxcache.FxCacheWriter(final, {g: n for g, (n, _) in cols.items()}, "f32", KEY, N) as w:
        append_in_chunks(w, cols, [N])
    with open_fxcache(final) as fc:
        assert fc.n_bars == N


def test_body_hash_names_a_file_cut_short_and_a_changed_byte(tmp_path: Path) -> None:
    """The body checksums (hashed from a read-only mapping of the file): a file cut short after
    its header was read is named truncated, a changed byte names its region."""
    p = write(tmp_path / "x.fxcache")
    h = fxcache.read_header(p)
    fxcache._verify_bodies(p, h)
    raw = bytearray(p.read_bytes())
    raw[h.values_offset + 3] ^= 0x10
    bad = tmp_path / "bad.fxcache"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FxCacheError, match="checksum mismatch in the values block"):
        fxcache._verify_bodies(bad, h)
    short = tmp_path / "short.fxcache"
    short.write_bytes(p.read_bytes()[: h.values_offset + 100])
    with pytest.raises(FxCacheError, match="truncated file at byte"):
        fxcache._verify_bodies(short, h)


def test_bf16_kernel_is_the_numpy_rounding() -> None:
    """The compiled bf16 rounding gives the bits of the NumPy formula it replaced, on every
    kind of float32: random bit patterns (NaNs of both signs and payloads, infinities,
    subnormals), values next to the overflow and tie points, zeros; 1-D and 2-D."""

    def numpy_form(f: np.ndarray) -> np.ndarray:
        bits = f.view(np.uint32)
        lsb = (bits >> np.uint32(16)) & np.uint32(1)
        rounded = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
        nan = np.isnan(f)
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
        return rounded

    rng = np.random.default_rng(5)
    pats = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edge = np.array(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7FC00000,
         0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0xFFFF8000, 0x00000001, 0x00008000, 0x00018000, 0x3F808000],
        dtype=np.uint32,
    )  # fmt: skip
    f = np.concatenate([pats, edge]).view(np.float32)
    assert f32_to_bf16_bits(f).tobytes() == numpy_form(f).tobytes()
    g = f[:100_000].reshape(1000, 100)
    assert f32_to_bf16_bits(g).tobytes() == numpy_form(g.copy()).tobytes()
    assert f32_to_bf16_bits(g).shape == (1000, 100)


def test_bf16_rows_kernel_converts_and_screens_the_stored_columns() -> None:
    """The writer's one-pass bf16 conversion gives ``f32_to_bf16_bits``'s bits and flags a
    non-finite stored value exactly when one lies in the first ``nv`` columns (padding
    columns after them are not screened)."""
    from fx_assets.core.fxcache import _bf16_rows_nb

    rng = np.random.default_rng(11)
    clean = rng.normal(0.0, 1e3, size=(500, 24)).astype(np.float32)
    for nv, plant, want in [
        (20, None, False),
        (20, (7, 3), True),
        (20, (7, 21), False),
        (24, (499, 23), True),
    ]:
        f = clean.copy()
        if plant is not None:
            f[plant] = np.float32(3.4e38)  # rounds past the largest bf16: inf as stored
        out = np.empty(f.shape, dtype=np.uint16)
        got = _bf16_rows_nb(f.view(np.uint32), out, nv)
        assert out.tobytes() == f32_to_bf16_bits(f).tobytes()
        assert bool(got) is want
    pats = rng.integers(0, 2**32, (300, 16), dtype=np.uint64).astype(np.uint32)
    out = np.empty(pats.shape, dtype=np.uint16)
    flag = _bf16_rows_nb(pats, out, 16)
    ref = f32_to_bf16_bits(pats.view(np.float32))
    assert out.tobytes() == ref.tobytes()
    assert bool(flag) == bool(np.any((ref & np.uint16(0x7F80)) == np.uint16(0x7F80)))
