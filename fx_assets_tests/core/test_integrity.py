"""Checksummed bodies and safe concurrency (issue 8, Found 6 and 8): a damaged sidecar or stage
table is detected and rebuilt, never reused; two processes building one sidecar decode once;
a reader never sees a sidecar missing during a rebuild; dead writers' temp files are removed."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from fx_assets.core import dbn, sidecar, tables
from fx_assets.core.errors import FxCacheError, FxDataError
from fx_assets.core.locks import build_lock
from fx_assets_tests.core.test_dbn import MBP1_BIG, write_dbn


def _big_source(tmp_path: Path, n: int = 40_000) -> Path:
    recs = dbn.read_records(MBP1_BIG)
    tiled = np.resize(recs, n)
    (tmp_path / "raw").mkdir(exist_ok=True)
    return write_dbn(
        tmp_path / "raw" / "ESU4.dbn.zst", dbn.read_header(MBP1_BIG).header_bytes, tiled, zstd=True
    )


def _column_range(path: Path, name: str) -> tuple[int, int]:
    with pa.memory_map(str(path), "r") as src:
        batch = pa.ipc.open_file(src).get_batch(0)
        places = sidecar._column_places(src, batch)
    return places[batch.schema.names.index(name)]


def test_changed_prices_inside_a_sidecar_are_detected_and_rebuilt(tmp_path: Path) -> None:
    src = _big_source(tmp_path)
    sc = tmp_path / "sc"
    info = sidecar.ensure_sidecar(src, sc)
    sidecar.verify_sidecar(info.path, src)
    off, length = _column_range(info.path, "price")
    # 1,000 prices, at the start of the column (covered by the reuse sample) ...
    with open(info.path, "r+b") as f:
        f.seek(off)
        f.write(np.arange(1000, dtype=np.int64).tobytes())
    with pytest.raises(FxDataError, match=r"checksum mismatch in column price"):
        sidecar.verify_sidecar(info.path, src)
    again = sidecar.ensure_sidecar(src, sc)
    assert again.rebuilt and again.reason == "checksum mismatch"
    sidecar.verify_sidecar(again.path, src)
    # ... and in the middle, between the sampled blocks: the full verification (asset check) sees it
    off, length = _column_range(again.path, "price")
    with open(again.path, "r+b") as f:
        f.seek(off + length // 2 - 4000)
        f.write(np.full(1000, 7, dtype=np.int64).tobytes())
    with pytest.raises(FxDataError, match=r"ESU4.*checksum mismatch in column price"):
        sidecar.verify_sidecar(again.path, src)


def test_damaged_footer_column_name_is_rebuilt_not_reused(tmp_path: Path) -> None:
    src = _big_source(tmp_path, 5000)
    sc = tmp_path / "sc"
    info = sidecar.ensure_sidecar(src, sc)
    data = bytearray(info.path.read_bytes())
    pos = data.rfind(b"bid_px_00")  # the footer's copy of the schema is the last one
    data[pos : pos + 9] = b"bid_qx_00"
    info.path.write_bytes(bytes(data))
    again = sidecar.ensure_sidecar(src, sc)
    assert again.rebuilt and again.reason == "schema mismatch"
    assert "bid_px_00" in sidecar.open_sidecar(again.path).schema.names
    assert sidecar.ensure_sidecar(src, sc).reused


def test_stage_table_checksum(tmp_path: Path) -> None:
    t = pa.table(
        {
            "ts": pa.array(np.arange(10_000, dtype=np.int64)),
            "close": pa.array(np.linspace(1, 2, 10_000)),
            "flag": pa.array(np.arange(10_000) % 3 == 0),
            "sym": pa.array(["ESU4", None] * 5000),
        }
    )
    p = tables.write_table(tmp_path / "bars.arrow", t)
    tables.verify_table(p)
    assert tables.read_table(p).select(["ts", "close", "flag", "sym"]).equals(t)
    # change one close value in place
    data = bytearray(p.read_bytes())
    needle = np.float64(np.linspace(1, 2, 10_000)[5000]).tobytes()
    pos = data.find(needle)
    data[pos : pos + 8] = np.float64(9.5).tobytes()
    p.write_bytes(bytes(data))
    with pytest.raises(FxCacheError, match=r"bars\.arrow: checksum mismatch in column 'close'"):
        tables.verify_table(p)
    # a table written without checksums (older version) is not trusted either
    with pa.OSFile(str(tmp_path / "old.arrow"), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    with pytest.raises(FxCacheError, match=r"no fx\.checksums"):
        tables.verify_table(tmp_path / "old.arrow")


def _ensure(args: tuple[str, str, str]) -> bool:
    src, sc, log = args
    calls = []
    real = sidecar.build_sidecar

    def counting(*a: object, **k: object) -> sidecar.SidecarInfo:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        calls.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    sidecar.build_sidecar = counting  # type: ignore[assignment]
    info = sidecar.ensure_sidecar(Path(src), Path(sc))
    return info.rebuilt


def test_two_processes_decode_once_and_both_succeed(tmp_path: Path) -> None:
    src = _big_source(tmp_path, 200_000)
    log = tmp_path / "builds.log"
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        rebuilt = pool.map(_ensure, [(str(src), str(tmp_path / "sc"), str(log))] * 2)
    assert sorted(rebuilt) == [False, True]  # one decoded, the other waited and reused
    assert len(log.read_text().split()) == 1


def _reader(path: str, ready: object, stop: object, out: object) -> None:
    missing = reads = 0
    sidecar.open_sidecar(path)
    ready.set()  # type: ignore[attr-defined]
    while not stop.is_set():  # type: ignore[attr-defined]
        try:
            sidecar.open_sidecar(path)
            reads += 1
        except FxCacheError as exc:
            if "No such file" in str(exc):
                missing += 1
        except FileNotFoundError:
            missing += 1
    out.put((reads, missing))  # type: ignore[attr-defined]


def test_reader_never_sees_a_missing_sidecar_during_rebuilds(tmp_path: Path) -> None:
    src = _big_source(tmp_path, 50_000)
    sc = tmp_path / "sc"
    info = sidecar.ensure_sidecar(src, sc)
    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_reader, args=(str(info.path), ready, stop, out))
    reader.start()
    assert ready.wait(timeout=120)
    for _ in range(6):
        assert sidecar.ensure_sidecar(src, sc, rebuild=True).rebuilt
    stop.set()
    reads, missing = out.get(timeout=60)
    reader.join(timeout=60)
    assert reads > 0 and missing == 0


def test_dead_writers_temp_files_are_removed_live_ones_kept(tmp_path: Path) -> None:
    final = tmp_path / "x.arrow"
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=time.sleep, args=(0,))
    p.start()
    p.join()
    dead = tmp_path / f".x.arrow.tmp-{p.pid}-0123abcd"
    live = tmp_path / f".x.arrow.tmp-{os.getppid()}-0123abcd"
    other = tmp_path / f".y.arrow.tmp-{p.pid}-0123abcd"
    for f in (dead, live, other):
        f.write_bytes(b"partial")
    with build_lock(final) as removed:
        assert removed == [dead]
    assert not dead.exists() and live.exists() and other.exists()


def test_disk_full_names_the_file_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tables.pa, "OSFile", full)
    with pytest.raises(FxDataError, match=r"bars_x\.arrow: no space left on the device"):
        tables.write_table(tmp_path / "bars_x.arrow", pa.table({"a": [1, 2]}))
    assert list(tmp_path.iterdir()) == []


def test_write_table_alongside_check_gates_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_table(..., alongside=check)``: the check runs on another thread while the table is
    written; the file lands (the same bytes as without a check) only once the check returned, a
    failing check leaves nothing at the path (no temporary file either) and its error wins
    over a write error."""
    import threading

    t = pa.table({"ts": pa.array(np.arange(1000, dtype=np.int64)), "x": pa.array(np.linspace(0, 1, 1000))})
    plain = tables.write_table(tmp_path / "plain.arrow", t)
    ran: list[str] = []

    def ok() -> None:
        ran.append(threading.current_thread().name)

    p = tables.write_table(tmp_path / "gated.arrow", t, alongside=ok)
    assert p.read_bytes() == plain.read_bytes()
    assert ran and ran[0] != threading.current_thread().name

    def bad() -> None:
        raise FxDataError("feature x is NaN at bar 3")

    with pytest.raises(FxDataError, match="NaN at bar 3"):
        tables.write_table(tmp_path / "failed.arrow", t, alongside=bad)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["gated.arrow", "plain.arrow"]

    import errno

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tables.pa, "OSFile", full)
    with pytest.raises(FxDataError, match="NaN at bar 3"):  # the check's error, as if it ran first
        tables.write_table(tmp_path / "both.arrow", t, alongside=bad)
    with pytest.raises(FxDataError, match="no space left"):
        tables.write_table(tmp_path / "full.arrow", t, alongside=ok)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["gated.arrow", "plain.arrow"]


def test_inspect_reports_a_damaged_sidecar_body(tmp_path: Path) -> None:
    src = _big_source(tmp_path, 5000)
    info = sidecar.ensure_sidecar(src, tmp_path / "sc")
    assert sidecar.describe_sidecar(info.path)["body_checksum"] == "ok"
    off, length = _column_range(info.path, "size")
    with open(info.path, "r+b") as f:
        f.seek(off + length // 2)
        f.write(b"\xff\xff\xff\x7f")
    assert sidecar.describe_sidecar(info.path)["body_checksum"] == "FAILED: checksum mismatch in column size"


def test_small_sidecar_is_verified_in_full_on_reuse(tmp_path: Path) -> None:
    src = _big_source(tmp_path, 20_000)
    sc = tmp_path / "sc"
    info = sidecar.ensure_sidecar(src, sc)
    off, length = _column_range(info.path, "ts_recv")
    assert length > sidecar._SAMPLE_BLOCKS * sidecar._SAMPLE_BYTES  # sampling would skip bytes
    with open(info.path, "r+b") as f:  # between two sampled blocks
        f.seek(off + length // 2 - sidecar._SAMPLE_BYTES - 100)
        f.write(b"\x00" * 8)
    again = sidecar.ensure_sidecar(src, sc)
    assert again.rebuilt and again.reason == "checksum mismatch"


def test_boolean_column_digest_reads_the_bitmaps_as_fill_null_false_would() -> None:
    """Stage-table checksums of bool columns come from the bitmaps (no pyarrow to_numpy, whose
    first call costs a cache-hit run ~0.25 s): same values as ``fill_null(False)``, any offset."""
    import numpy as np
    import pyarrow as pa

    from fx_assets.core.tables import _bool_values

    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 100, 1001):
        values, nulls = rng.random(n) < 0.5, rng.random(n) < 0.3
        for arr in (pa.array(values), pa.array(values, mask=nulls)):
            for off in (0, 1, 3):
                part = arr.slice(min(off, n))
                want = part.fill_null(False).to_numpy(zero_copy_only=False)
                assert np.array_equal(_bool_values(part), want)


def _mixed_table(n: int) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(np.arange(n, dtype=np.int64)),
            "x": pa.array(np.sin(np.arange(n, dtype=np.float64))),
            "flag": pa.array(np.arange(n) % 3 == 0),
            "sym": pa.array(["ESU4", None, "ESZ24"] * (n // 3) + ["x"] * (n % 3)),
        }
    ).replace_schema_metadata({b"fx.partition": b"ES.FUT 2024-Q3"})


def _plain_ipc(table: pa.Table) -> bytes:
    """The file pyarrow's writer gives for the checksummed table, written front to back."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=max(table.num_rows, 1))
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("extra", [0, 4096])
def test_split_write_gives_the_plain_writers_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    """A large table's file is written with its back half's pages populated by a second thread
    (the file first extended to its counted size): the same bytes as pyarrow's writer alone,
    also when the counted size is off (the file is cut back to what was written)."""
    t = _mixed_table(30_001)
    reads: list[tuple[int, int]] = []
    real_read, real_size = tables._read_holes, tables._ipc_size

    def spy(path: Path, lo: int, hi: int) -> None:
        reads.append((lo, hi))
        real_read(path, lo, hi)

    monkeypatch.setattr(tables, "SPLIT_WRITE_BYTES", 1)
    monkeypatch.setattr(tables, "_cpus", lambda: 2)
    monkeypatch.setattr(tables, "_read_holes", spy)
    monkeypatch.setattr(tables, "_ipc_size", lambda table: real_size(table) + extra)
    p = tables.write_table(tmp_path / "split.arrow", t)
    assert reads and reads[0][1] == real_size(tables._with_checksums(t)) + extra
    assert p.read_bytes() == _plain_ipc(tables._with_checksums(t))
    tables.verify_table(p)
    # one CPU (or a small table): no second thread, the same bytes
    monkeypatch.setattr(tables, "_cpus", lambda: 1)
    q = tables.write_table(tmp_path / "one.arrow", t)
    assert len(reads) == 1 and q.read_bytes() == p.read_bytes()
