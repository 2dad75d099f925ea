"""Predecoded sidecars (fx_assets.core.sidecar): lossless, atomic, self-invalidating, zero-copy."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import databento
import numpy as np
import pyarrow as pa
import pytest

from fx_assets.core import checksum, dbn, sidecar
from fx_assets.core.errors import FxCacheError, FxDataError
from fx_assets_tests.conftest import REPO
from fx_assets_tests.core.test_dbn import (
    DECODABLE,
    FIX,
    MBP1_BIG,
    TRADES_V1,
    _ids,
    decompressed,
    expected_csv,
    write_dbn,
)

ARCH_BASE = [
    ("ts_recv", "int64"),
    ("ts_event", "int64"),
    ("rtype", "uint8"),
    ("publisher_id", "uint16"),
    ("instrument_id", "uint32"),
    ("action", "uint8"),
    ("side", "uint8"),
    ("flags", "uint8"),
    ("depth", "uint8"),
    ("price", "int64"),
    ("size", "uint32"),
    ("ts_in_delta", "int32"),
    ("sequence", "uint32"),
]


def _level_cols(n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        for name, t in (
            ("bid_px", "int64"),
            ("ask_px", "int64"),
            ("bid_sz", "uint32"),
            ("ask_sz", "uint32"),
            ("bid_ct", "uint32"),
            ("ask_ct", "uint32"),
        ):
            out.append((f"{name}_{i:02d}", t))
    return out


def _dir_listing(d: Path) -> list[str]:
    """The folder's files, without the build locks and source-hash records that stay beside them."""
    return sorted(p.name for p in d.iterdir() if not p.name.endswith((".lock", ".source.json")))


def _stamp(p: Path) -> tuple[int, int, str]:
    st = p.stat()
    return st.st_ino, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()


def tiled(src: Path, n: int) -> np.ndarray:
    """n records made by tiling a fixture's records with increasing timestamps / sequence."""
    rec = dbn.read_records(src)
    big = np.tile(rec, -(-n // len(rec)))[:n].copy()
    step = np.arange(n, dtype=np.int64) // len(rec) * (int(rec["ts_recv"][-1] - rec["ts_recv"][0]) + 1)
    big["ts_recv"] += step
    big["ts_event"] += step
    big["sequence"] = np.arange(n, dtype=np.uint32)
    big["price"] += (np.arange(n) % 17).astype(np.int64) * 250_000_000
    return big


@pytest.mark.parametrize("path", DECODABLE, ids=_ids(DECODABLE))
def test_lossless_against_databento_and_csv(path: Path, tmp_path: Path) -> None:
    info = sidecar.build_sidecar(path, tmp_path / "s.arrow")
    h = dbn.read_header(path)
    ref = databento.DBNStore.from_file(path).to_ndarray()
    table = sidecar.open_sidecar(info.path)
    want_cols = ARCH_BASE + _level_cols(h.spec().n_levels)
    assert [(f.name, str(f.type)) for f in table.schema] == want_cols
    assert table.num_rows == info.n_records == len(ref)
    with pa.memory_map(str(info.path)) as src:
        assert pa.ipc.open_file(src).num_record_batches == 1
    cols = sidecar.sidecar_columns(info.path)
    for name, _ in want_cols:
        r = ref[name].view(np.uint8) if ref[name].dtype.kind == "S" else ref[name]
        np.testing.assert_array_equal(cols[name], r.astype(cols[name].dtype), name)
        assert np.array_equal(cols[name].astype(object), r.astype(object)), name  # no wraparound
    with open(expected_csv(path), newline="") as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) == set(cols)
    for name in rows[0]:
        col = [r[name] for r in rows]
        want = [ord(v) for v in col] if name in ("action", "side") else [int(v) for v in col]
        assert cols[name].tolist() == want, name
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["fx.format_version"] == str(sidecar.SIDECAR_FORMAT_VERSION)
    assert meta["fx.schema"] == h.schema and meta["fx.dataset"] == h.dataset
    assert meta["fx.source_path"] == str(path.resolve())
    assert int(meta["fx.source_size"]) == path.stat().st_size
    assert int(meta["fx.source_mtime_ns"]) == path.stat().st_mtime_ns
    assert meta["fx.source_hash"] == checksum.hash_file(path)
    assert int(meta["fx.n_records"]) == len(ref)
    assert sidecar.read_symbol_map(info.path) == list(h.mappings) == sidecar.read_symbol_map(table)
    sm = json.loads(meta["fx.symbol_map"])
    assert sm and set(sm[0]) == {"raw_symbol", "instrument_id", "start_date", "end_date"}


@pytest.mark.parametrize(
    ("src", "n", "zstd"),
    [
        (MBP1_BIG, 100_003, True),
        (TRADES_V1, 4_097, False),
        (FIX / "dbn" / "test_data.mbp-10.v3.dbn.zst", 9_001, True),
    ],
)
def test_multi_chunk_build_equals_records(src: Path, n: int, zstd: bool, tmp_path: Path) -> None:
    """Many chunks, records split across chunk borders, odd N (padding of 1-byte columns)."""
    big = tiled(src, n)
    p = write_dbn(
        tmp_path / f"big.dbn{'.zst' if zstd else ''}",
        dbn.read_header(src).header_bytes,
        big,
        zstd=zstd,
        frames=3,
    )
    seen: list[tuple[int, int]] = []
    info = sidecar.build_sidecar(
        p, tmp_path / "out" / "big.arrow", chunk_bytes=8192 + 5, progress=lambda d, t: seen.append((d, t))
    )
    cols = sidecar.sidecar_columns(info.path)
    assert info.n_records == n
    for name in cols:
        np.testing.assert_array_equal(cols[name], big[name], name)
    assert len(seen) > 3 and seen[-1] == (p.stat().st_size, p.stat().st_size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert _dir_listing(tmp_path / "out") == ["big.arrow"]


@pytest.mark.parametrize("zstd", [True, False])
def test_empty_trades_file_gives_empty_table_with_schema(zstd: bool, tmp_path: Path) -> None:
    p = write_dbn(
        tmp_path / f"empty.dbn{'.zst' if zstd else ''}",
        dbn.read_header(TRADES_V1).header_bytes,
        b"",
        zstd=zstd,
    )
    info = sidecar.ensure_sidecar(p, tmp_path / "sc")
    table = sidecar.open_sidecar(info.path)
    assert info.n_records == 0 and table.num_rows == 0
    assert table.schema.equals(sidecar.sidecar_schema("trades"))
    assert [(f.name, str(f.type)) for f in table.schema] == ARCH_BASE
    assert table.schema.metadata[b"fx.n_records"] == b"0"
    cols = sidecar.sidecar_columns(info.path, ["ts_recv", "price"])
    assert cols["ts_recv"].dtype == np.int64 and len(cols["price"]) == 0
    assert sidecar.ensure_sidecar(p, tmp_path / "sc").rebuilt is False


def _copy_fixture(tmp_path: Path) -> Path:
    """A plain (uncompressed) copy of the ESU4 mbp-1 fixture that the test may modify."""
    src = tmp_path / "data" / "ESU4.dbn"
    src.parent.mkdir()
    src.write_bytes(decompressed(MBP1_BIG))
    return src


def test_reuse_and_invalidation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _copy_fixture(tmp_path)
    sc = tmp_path / "sc"
    first = sidecar.ensure_sidecar(src, sc)
    assert first.rebuilt and first.path == sidecar.sidecar_path(src, sc)
    assert first.path.name.startswith("ESU4.") and first.path.name.endswith(
        f".{sidecar.SIDECAR_FORMAT_VERSION}.arrow"
    )
    stamp = _stamp(first.path)
    time.sleep(0.01)

    # unchanged -> reused, file not rewritten
    again = sidecar.ensure_sidecar(src, sc)
    assert not again.rebuilt and again.reused and again.n_records == first.n_records == 2288
    assert again.identity_hash == first.identity_hash and again.symbol_map == first.symbol_map
    assert _stamp(first.path) == stamp

    # touch (mtime only) -> same content, re-hashed and reused
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = sidecar.ensure_sidecar(src, sc)
    assert touched.reused and touched.identity_hash == first.identity_hash
    assert _stamp(first.path) == stamp

    # same size, other records, mtime moves on (a re-download) -> rebuilt
    raw = bytearray(src.read_bytes())
    h = dbn.read_header(src)
    raw[h.header_len + 8 : h.header_len + 16] = (123).to_bytes(8, "little")  # ts_event of record 0
    src.write_bytes(bytes(raw))
    assert sidecar.ensure_sidecar(src, sc).rebuilt
    assert sidecar.sidecar_columns(first.path, ["ts_event"])["ts_event"][0] == 123

    # same size, other header, mtime restored -> only the header hash differs -> rebuilt
    st = src.stat()
    raw[: h.header_len] = bytes(raw[: h.header_len]).replace(b"ESU4", b"ESZ4")
    src.write_bytes(bytes(raw))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_size == st.st_size and src.stat().st_mtime_ns == st.st_mtime_ns
    rebuilt = sidecar.ensure_sidecar(src, sc)
    assert rebuilt.rebuilt and {m.raw_symbol for m in rebuilt.symbol_map} == {"ESZ4"}
    stamp = _stamp(first.path)

    # rebuild=True -> rebuilt even though fresh
    time.sleep(0.02)  # let the coarse (jiffy) mtime clock move
    forced = sidecar.ensure_sidecar(src, sc, rebuild=True)
    assert forced.rebuilt and _stamp(forced.path)[:2] != stamp[:2]  # new file (inode may be reused)

    # format version bump -> rebuilt under the new name, old version removed
    monkeypatch.setattr(sidecar, "SIDECAR_FORMAT_VERSION", sidecar.SIDECAR_FORMAT_VERSION + 1)
    bumped = sidecar.ensure_sidecar(src, sc)
    assert bumped.rebuilt and bumped.format_version == sidecar.SIDECAR_FORMAT_VERSION
    assert _dir_listing(sc) == [bumped.path.name]
    assert not sidecar.ensure_sidecar(src, sc).rebuilt


def test_stale_metadata_in_file_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar whose recorded format version differs (same file name) is rebuilt."""
    src = _copy_fixture(tmp_path)
    sc = tmp_path / "sc"
    info = sidecar.ensure_sidecar(src, sc)
    real = sidecar._metadata

    def old_version(*a: object, **k: object) -> dict[bytes, bytes]:
        m = real(*a, **k)  # type: ignore[arg-type]
        m[b"fx.format_version"] = b"0"
        return m

    monkeypatch.setattr(sidecar, "_metadata", old_version)
    sidecar.build_sidecar(src, info.path)
    monkeypatch.setattr(sidecar, "_metadata", real)
    assert sidecar.ensure_sidecar(src, sc).rebuilt
    # a truncated sidecar is rebuilt, not trusted
    data = info.path.read_bytes()
    info.path.write_bytes(data[: len(data) // 2])
    assert sidecar.ensure_sidecar(src, sc).rebuilt
    with pytest.raises(FxCacheError):
        sidecar.open_sidecar(tmp_path / "data" / "ESU4.dbn")


def _corrupt_inputs(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "bad"
    d.mkdir()
    good = MBP1_BIG.read_bytes()
    plain = dbn.read_header(FIX / "dbn" / "test_data.mbp-10.dbn")
    raw = (FIX / "dbn" / "test_data.mbp-10.dbn").read_bytes()
    files = {
        "garbage": b"\x00garbage" * 100,
        "zstd_cut": good[: len(good) // 2],
        "plain_cut": raw[: plain.header_len + 368 + 200],
    }
    out = {k: d / f"{k}.dbn{'.zst' if k.startswith('z') else ''}" for k in files}
    for k, v in files.items():
        out[k].write_bytes(v)
    out["ohlcv"] = FIX / "dbn" / "test_data.ohlcv-1m.v3.dbn.zst"
    out["live"] = FIX / "databento-python" / "LIVE" / "test_data.live.dbn.zst"
    return out


@pytest.mark.parametrize("kind", ["garbage", "zstd_cut", "plain_cut", "ohlcv", "live"])
def test_corrupt_input_leaves_nothing(kind: str, tmp_path: Path) -> None:
    sc = tmp_path / "sc"
    keep = sidecar.ensure_sidecar(TRADES_V1, sc)
    stamp = _stamp(keep.path)
    bad = _corrupt_inputs(tmp_path)[kind]
    with pytest.raises(FxDataError, match=bad.name.replace(".", r"\.")):
        sidecar.ensure_sidecar(bad, sc, chunk_bytes=4096)
    with pytest.raises(FxDataError, match=bad.name.replace(".", r"\.")):
        sidecar.build_sidecar(bad, sc / "explicit.arrow", chunk_bytes=4096)
    assert _dir_listing(sc) == [keep.path.name]
    assert _stamp(keep.path) == stamp


@pytest.mark.parametrize("zstd", [True, False])
def test_bad_record_deep_in_the_file_is_named_and_leaves_nothing(zstd: bool, tmp_path: Path) -> None:
    """The record check runs in the decoder's consuming thread (dbn.iter_record_chunks with
    validate=False): a record of another length or rtype in a late chunk fails the build with
    the message dbn gives (file, record index, decompressed offset), and no sidecar is left."""
    h = dbn.read_header(MBP1_BIG)
    recs = tiled(MBP1_BIG, 20_003)
    recs["rtype"][15_001] = 0x0A
    recs["length"][19_999] = 12
    name = f"bad.dbn{'.zst' if zstd else ''}"
    p = write_dbn(tmp_path / name, h.header_bytes, recs, zstd=zstd)
    sc = tmp_path / "sc"
    esc = name.replace(".", r"\.")
    want = rf"{esc}: record 15001 at decompressed byte offset {h.header_len + 15_001 * 80}"
    with pytest.raises(FxDataError, match=want):
        sidecar.build_sidecar(p, sc / "x.arrow", chunk_bytes=8192 + 5)
    with pytest.raises(FxDataError, match=want):
        sidecar.ensure_sidecar(p, sc, chunk_bytes=8192 + 5)
    assert _dir_listing(sc) == []
    recs["rtype"][15_001] = 1
    p = write_dbn(tmp_path / name, h.header_bytes, recs, zstd=zstd)
    with pytest.raises(FxDataError, match=r"record 19999 .* length 48 B"):
        sidecar.build_sidecar(p, sc / "x.arrow", chunk_bytes=8192 + 5)
    assert _dir_listing(sc) == []


def test_stale_sidecar_removed_when_rebuild_fails(tmp_path: Path) -> None:
    src = _copy_fixture(tmp_path)
    sc = tmp_path / "sc"
    sidecar.ensure_sidecar(src, sc)
    src.write_bytes(src.read_bytes()[:-100])  # now truncated
    with pytest.raises(FxDataError, match="truncated"):
        sidecar.ensure_sidecar(src, sc)
    assert _dir_listing(sc) == []


def _mapping_of(addr: int) -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5] if len(parts) == 6 else ""
    return ""


def test_zero_copy_views(tmp_path: Path) -> None:
    p = write_dbn(
        tmp_path / "z.dbn.zst", dbn.read_header(MBP1_BIG).header_bytes, tiled(MBP1_BIG, 50_000), zstd=True
    )
    info = sidecar.build_sidecar(p, tmp_path / "z.arrow")
    cols = sidecar.sidecar_columns(info.path, ["ts_recv", "price", "side", "bid_px_00"])
    table = sidecar.open_sidecar(info.path)
    for name, arr in cols.items():
        assert not arr.flags.writeable and arr.flags.c_contiguous
        # the view's memory is the file's own mapping, not a heap copy
        assert _mapping_of(arr.__array_interface__["data"][0]) == str(info.path.resolve()), name
        buf = table.column(name).chunks[0].buffers()[1]
        assert _mapping_of(buf.address) == str(info.path.resolve())
        assert buf.address % 8 == 0
    assert table.column("price").num_chunks == 1


def test_describe(tmp_path: Path) -> None:
    info = sidecar.build_sidecar(MBP1_BIG, tmp_path / "m.arrow")
    ds = sidecar.describe_sidecar(info.path)
    dd = sidecar.describe_dbn(MBP1_BIG)
    ref = dbn.read_records(MBP1_BIG)
    for d in (ds, dd):
        assert d["n_records"] == 2288
        assert d["ts_recv_range"]["min"] == int(ref["ts_recv"].min())
        assert d["ts_recv_range"]["max"] == int(ref["ts_recv"].max())
        assert d["instruments"] == [{"instrument_id": 118, "raw_symbols": ["ESU4"], "n_records": 2288}]
        assert d["columns"]["price"] == {"min": int(ref["price"].min()), "max": int(ref["price"].max())}
        assert d["columns"]["bid_sz_00"]["max"] == int(ref["bid_sz_00"].max())
    assert dd["dbn_version"] == 1 and dd["schema"] == "mbp-1" and dd["compressed"]
    assert ds["fx.schema"] == "mbp-1" and ds["column_types"]["price"] == "int64"
    live = sidecar.describe_dbn(FIX / "databento-python" / "LIVE" / "test_data.live.dbn.zst")
    assert live["schema"] is None and live["decodable"] is False


def test_sidecar_path_keeps_sources_apart(tmp_path: Path) -> None:
    a = sidecar.sidecar_path(tmp_path / "x" / "ES_2024-Q1.dbn.zst", tmp_path)
    b = sidecar.sidecar_path(tmp_path / "x" / "ES_2024-Q1.dbn", tmp_path)
    assert a.name.startswith("ES_2024-Q1.") and b.name.startswith("ES_2024-Q1.") and a != b


# Peak RSS from /proc/self/status VmHWM, reset after the warm-up through clear_refs ("5").
# (resource.getrusage's ru_maxrss survives execve, so a child of a big pytest process would
# start with the parent's peak and see no growth at all.)
_MEM_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from fx_assets.core import sidecar

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    src, dest, small, control = (Path(a) for a in sys.argv[1:5])
    sidecar.build_sidecar(small, control)  # warm-up: every import is in place
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = rss()
    info = sidecar.build_sidecar(src, dest, chunk_bytes=256 << 10)
    peak = hwm()
    # control: holding the decoded size in memory does show up in the measurement
    blob = np.ones(info.n_records * 368 // 8)
    print(info.n_records, peak - base, hwm() - peak, blob[-1])
    """
)


def test_bounded_memory(tmp_path: Path) -> None:
    """Decoding ~110 MB of mbp-10 records with 256 KiB chunks grows peak RSS by a few MB."""
    n = 300_000
    big = tiled(FIX / "dbn" / "test_data.mbp-10.dbn", n)
    p = write_dbn(
        tmp_path / "big.dbn.zst",
        dbn.read_header(FIX / "dbn" / "test_data.mbp-10.dbn").header_bytes,
        big,
        zstd=True,
    )
    decoded = big.nbytes
    del big
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEM_SCRIPT,
            str(p),
            str(tmp_path / "out.arrow"),
            str(TRADES_V1),
            str(tmp_path / "c.arrow"),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    ).stdout.split()
    n_out, growth, control = int(out[0]), int(out[1]), int(out[2])
    assert n_out == n
    assert control > decoded * 0.9  # the measurement can see a full-size allocation
    assert growth < decoded / 8, f"peak RSS grew {growth / 1e6:.1f} MB for {decoded / 1e6:.1f} MB decoded"
    cols = sidecar.sidecar_columns(tmp_path / "out.arrow", ["sequence"])
    assert np.array_equal(cols["sequence"], np.arange(n, dtype=np.uint32))


# ---- the direct layout (columns decoded straight into their regions) and its fallback ----------


def _big_zstd(tmp_path: Path, n: int = 60_000) -> tuple[Path, np.ndarray]:
    big = tiled(MBP1_BIG, n)
    p = write_dbn(tmp_path / "big.dbn.zst", dbn.read_header(MBP1_BIG).header_bytes, big, zstd=True, frames=2)
    return p, big


def _buffer_offsets(path: Path) -> list[int]:
    """File offsets of the column data buffers, as pyarrow locates them."""
    with pa.memory_map(str(path), "r") as src:
        batch = pa.ipc.open_file(src).get_batch(0)
        src.seek(0)
        base = src.read_buffer(1).address
        return [batch.column(i).buffers()[1].address - base for i in range(batch.num_columns)]


def _spy_spilled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = sidecar._build_spilled

    def spy(*a: object, **k: object) -> int:
        calls.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(sidecar, "_build_spilled", spy)
    return calls


def test_direct_layout_writes_columns_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regions sized by the estimate (slack left as holes), readable as IPC file and as IPC stream."""
    p, big = _big_zstd(tmp_path)
    spilled = _spy_spilled(monkeypatch)
    monkeypatch.setattr(sidecar, "_ESTIMATE_SLACK", 3.0)  # plenty of room: visible holes
    info = sidecar.build_sidecar(p, tmp_path / "out" / "d.arrow", chunk_bytes=16384)
    assert spilled == [] and info.n_records == len(big)
    cols = sidecar.sidecar_columns(info.path)
    for name in cols:
        np.testing.assert_array_equal(cols[name], big[name], name)
    offsets = _buffer_offsets(info.path)
    assert all(o % 4096 == 0 for o in offsets) and offsets == sorted(offsets)
    sizes = [cols[f.name].nbytes for f in sidecar.sidecar_schema("mbp-1")]
    gaps = [b - (a + s) for a, b, s in zip(offsets, offsets[1:], sizes, strict=False)]
    assert min(gaps) > 0.5 * len(big) * 1  # each region has room for more rows than were written
    st = info.path.stat()
    assert st.st_size - (offsets[-1] + sizes[-1]) < 64 << 10  # no slack after the last region
    if st.st_blocks:  # sparse: the unwritten room takes no disk space
        assert st.st_blocks * 512 < offsets[-1]
    # the file stays a valid IPC stream after the magic (the gaps are unused body bytes)
    data = info.path.read_bytes()
    batch = pa.ipc.open_stream(pa.py_buffer(data[8:])).read_next_batch()
    assert batch.num_rows == len(big)
    np.testing.assert_array_equal(batch.column("bid_px_00").to_numpy(), big["bid_px_00"])
    assert _dir_listing(tmp_path / "out") == ["d.arrow"]


def test_plain_dbn_is_laid_out_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncompressed: N is known from the file size, so the regions have no slack."""
    big = tiled(MBP1_BIG, 30_001)
    p = write_dbn(tmp_path / "plain.dbn", dbn.read_header(MBP1_BIG).header_bytes, big, zstd=False)
    spilled = _spy_spilled(monkeypatch)
    info = sidecar.build_sidecar(p, tmp_path / "p.arrow", chunk_bytes=8192)
    assert spilled == []
    offsets = _buffer_offsets(info.path)
    cols = sidecar.sidecar_columns(info.path)
    sizes = [cols[f.name].nbytes for f in sidecar.sidecar_schema("mbp-1")]
    for a, b, s in zip(offsets, offsets[1:], sizes, strict=False):
        assert b == -(-(a + s) // 4096) * 4096
    for name in cols:
        np.testing.assert_array_equal(cols[name], big[name], name)


def test_estimate_too_small_falls_back_to_spill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, big = _big_zstd(tmp_path)
    spilled = _spy_spilled(monkeypatch)
    monkeypatch.setattr(sidecar, "_ESTIMATE_SLACK", 0.1)
    monkeypatch.setattr(sidecar, "_ESTIMATE_EXTRA", 0)
    seen: list[int] = []
    info = sidecar.build_sidecar(
        p, tmp_path / "out" / "f.arrow", chunk_bytes=16384, progress=lambda d, t: seen.append(d)
    )
    assert spilled == [1] and info.n_records == len(big)
    cols = sidecar.sidecar_columns(info.path)
    for name in cols:
        np.testing.assert_array_equal(cols[name], big[name], name)
    assert _buffer_offsets(info.path)[0] < 64 << 10  # pyarrow's own contiguous layout
    assert seen[-1] == p.stat().st_size
    assert _dir_listing(tmp_path / "out") == ["f.arrow"]


@pytest.mark.parametrize("slack", [1.25, 0.1])  # direct path, and spill fallback
def test_interrupted_decode_leaves_previous_sidecar(
    slack: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, _ = _big_zstd(tmp_path)
    monkeypatch.setattr(sidecar, "_ESTIMATE_SLACK", slack)
    monkeypatch.setattr(sidecar, "_ESTIMATE_EXTRA", 0)
    out = tmp_path / "out"
    old = sidecar.build_sidecar(TRADES_V1, out / "s.arrow")
    stamp = _stamp(old.path)
    calls = 0

    def interrupt(done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 40:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sidecar.build_sidecar(p, out / "s.arrow", chunk_bytes=16384, progress=interrupt)
    assert _dir_listing(out) == ["s.arrow"] and _stamp(old.path) == stamp


def test_write_error_in_writer_thread_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, _ = _big_zstd(tmp_path)
    real = sidecar._pwrite_all
    calls = 0

    def failing(fd: int, data: bytes | memoryview, pos: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 30:
            raise OSError(28, "No space left on device")
        real(fd, data, pos)

    monkeypatch.setattr(sidecar, "_pwrite_all", failing)
    with pytest.raises(FxDataError, match=r"e\.arrow: no space left"):
        sidecar.build_sidecar(p, tmp_path / "out" / "e.arrow", chunk_bytes=16384)
    assert _dir_listing(tmp_path / "out") == []


def test_unreadable_file_is_never_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the relocated metadata were wrong, verification fails and nothing is moved into place."""
    p, _ = _big_zstd(tmp_path)
    real = sidecar._direct_image

    def shifted(cols: object, n: int, schema: pa.Schema, bases: list[int]) -> object:
        # metadata that points 8 bytes past where each column was written
        return real(cols, n, schema, [b + 8 for b in bases])  # type: ignore[arg-type]

    monkeypatch.setattr(sidecar, "_direct_image", shifted)
    with pytest.raises(FxCacheError, match="does not match the decoded record"):
        sidecar.build_sidecar(p, tmp_path / "out" / "u.arrow", chunk_bytes=16384)
    assert _dir_listing(tmp_path / "out") == []


def test_decoder_code_change_rebuilds_the_sidecar(tmp_path: Path) -> None:
    """A sidecar records the decoder's code version; another version rebuilds it (same source)."""
    src = _copy_fixture(tmp_path)
    sc = tmp_path / "sc"
    first = sidecar.ensure_sidecar(src, sc, code_version="decoder-a")
    assert first.rebuilt
    assert not sidecar.ensure_sidecar(src, sc, code_version="decoder-a").rebuilt
    changed = sidecar.ensure_sidecar(src, sc, code_version="decoder-b")
    assert changed.rebuilt and changed.reason == "decoder code changed"
    assert not sidecar.ensure_sidecar(src, sc, code_version="decoder-b").rebuilt


def test_assets_pass_the_derived_decoder_version(tmp_path: Path) -> None:
    """The asset layer keys sidecars by the code version derived from the decoder's source."""
    import datetime as dt

    from fx_assets.assets.common import require_sidecar
    from fx_assets.core import lineage
    from fx_assets.partitions import QuarterSymbol
    from fx_assets.resources.storage import FxStorage

    storage = FxStorage(root=str(tmp_path / "root"))
    part = QuarterSymbol(dt.date(2024, 7, 1), "ES.FUT")
    raw = storage.raw_file("trades", part.symbol, part.quarter)
    raw.parent.mkdir(parents=True)
    raw.write_bytes(TRADES_V1.read_bytes())
    info = require_sidecar(storage, "trades", part)
    meta = pa.ipc.open_file(pa.memory_map(str(info.path))).schema.metadata
    assert meta[b"fx.code_version"].decode() == lineage.code_version("predecoded") != ""


@pytest.mark.parametrize("schema", ["trades", "tbbo", "mbp-1", "mbp-10"])
@pytest.mark.parametrize("ts_out", [False, True])
def test_grouped_split_plan_covers_every_column(schema: str, ts_out: bool) -> None:
    """The split plan exists for every supported layout (else the byte comparison above would
    compare the reference with itself), takes every column exactly once at its field's offset,
    and needs far fewer copies than columns where there are book levels."""
    cols = sidecar._columns(dbn.SCHEMAS[schema])
    dtype = dbn.SCHEMAS[schema].dtype(ts_out)
    with sidecar._Columns(cols, 1 << 20, lambda out: ([], None)) as out:
        plan = out._plan(dtype)
    assert plan
    taken = sorted(c for g in plan for row in g.columns for c in row)
    assert taken == list(range(len(cols)))
    for g in plan:
        for r, row in enumerate(g.columns):
            for c, col in enumerate(row):
                sub, off = dtype.fields[cols[col][0]][:2]
                assert (off, sub.itemsize) == (g.offset + r * g.outer + c * g.width, g.width)
    if schema == "mbp-10":
        assert len(plan) == 10  # 8 for the 13 base columns, 2 for the 60 level columns


@pytest.mark.parametrize("src", [TRADES_V1, FIX / "dbn" / "test_data.mbp-10.v3.dbn.zst"])
def test_grouped_split_equals_per_field_copies_for_any_chunks(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_Columns with the grouped split writes the same column bytes and checksums as with one
    copy per field, for chunks that straddle the staging sets and for chunks that are not
    contiguous (those take the per-field copies into the grouped staging)."""
    records = tiled(src, 5_003)
    wide = np.zeros(2 * len(records), records.dtype)
    wide[::2] = records
    strided = wide[::2]  # the same records, not contiguous
    cuts = [0, 1, 700, 1_500, 1_501, 3_000, 4_100, len(records)]
    cols = sidecar._columns(dbn.SCHEMAS[dbn.read_header(src).schema])
    written = {}
    for fast in (True, False):
        monkeypatch.setattr(sidecar, "_FAST_SPLIT", fast)
        spill = sidecar._Spill(len(cols), tmp_path)
        try:
            with sidecar._Columns(cols, 1, spill) as out:  # 1024-row staging sets
                for j, (a, b) in enumerate(itertools.pairwise(cuts)):
                    out.add((strided if j % 2 else records)[a:b], b)
                out.finish()
                assert bool(out.plan) is fast
            data = []
            for f in spill.files:
                f.seek(0)
                data.append(f.read())
            written[fast] = (data, out.checksums())
        finally:
            spill.close()
    assert written[True] == written[False]
    for (name, _), column in zip(cols, written[True][0], strict=True):
        assert column == np.ascontiguousarray(records[name]).tobytes(), name


@pytest.mark.parametrize(
    ("src", "n", "zstd"),
    [
        (TRADES_V1, 30_011, True),
        (MBP1_BIG, 20_003, False),
        (FIX / "dbn" / "test_data.mbp-10.v3.dbn.zst", 9_001, True),
    ],
)
def test_grouped_split_writes_the_same_file(
    src: Path, n: int, zstd: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grouped split (sidecar._Columns._plan: one strided copy per grid of fields) writes a
    file byte for byte equal to one written with a strided copy per field: same layout,
    columns, checksums and metadata."""
    big = tiled(src, n)
    p = write_dbn(
        tmp_path / f"big.dbn{'.zst' if zstd else ''}", dbn.read_header(src).header_bytes, big, zstd=zstd
    )
    fast = sidecar.build_sidecar(p, tmp_path / "fast" / "x.arrow", chunk_bytes=8192 + 5)
    monkeypatch.setattr(sidecar, "_FAST_SPLIT", False)
    ref = sidecar.build_sidecar(p, tmp_path / "ref" / "x.arrow", chunk_bytes=8192 + 5)
    assert fast.path.read_bytes() == ref.path.read_bytes()
    cols = sidecar.sidecar_columns(fast.path)
    for name in ("rtype", "publisher_id", "action", "side", "flags", "depth"):
        np.testing.assert_array_equal(cols[name], big[name], name)
    sidecar.verify_sidecar(fast.path, p)
