"""DeviceStore: one upload per quarter, fold slices are views into resident data, values exact."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from fx_assets.core import calendar, checksum, fxcache, labels
from fx_assets.core.device_store import DeviceStore
from fx_assets.core.errors import FxCacheError, FxDataError
from fx_assets.core.folds import FoldConfig, fold_range
from fx_assets.core.fxcache import open_fxcache, write_fxcache
from fx_assets.core.trainers import TrainConfig, fold_transition

COLS = ["open", "close", "f0", "f1", "f2", "ofi_0"]
N = 1000  # bars per quarter


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Tiny nets on a shared 2-core box: intra-op threads only contend (epochs vary 0.2 s to 20 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _quarter(i: int, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    ts = (1_700_000_000 + i * 10_000_000 + np.arange(N, dtype=np.int64) * 600) * 1_000_000_000
    close = 5000.0 + 0.25 * np.cumsum(rng.integers(-2, 3, N))
    v = np.column_stack([close + 0.25, close, rng.standard_normal((N, 4)) * 3.0 + 1.0])
    return ts, v.astype(dtype)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bit patterns (uint16), as an fxcache bf16 block."""
    return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _store(
    n_q: int, chunk_rows: int = 128, **kw: object
) -> tuple[DeviceStore, list[np.ndarray], list[np.ndarray]]:
    store = DeviceStore(device="cpu", chunk_rows=chunk_rows, **kw)  # type: ignore[arg-type]
    tss, vals = [], []
    for i in range(n_q):
        ts, v = _quarter(i)
        store.add_quarter(f"Q{i}", ts, v, COLS)
        tss.append(ts)
        vals.append(v)
    return store, tss, vals


def test_values_equal_host_f64_and_f32_sources() -> None:
    store, _, vals = _store(2, chunk_rows=97)  # chunks that do not divide the quarter
    st = store.stats()
    assert st["uploads"] == 2 and st["uploads_by_key"] == {"Q0": 1, "Q1": 1}
    assert st["chunks"] == 2 * int(np.ceil(N / 97))
    assert st["bytes_uploaded"] == 2 * (N * len(COLS) * 4 + N * 2 * 8)  # f32 wire + f64 open, close
    assert st["device"] == "cpu" and not st["pinned_staging"]
    view = store.concat_view(["Q0"])
    np.testing.assert_array_equal(view.values.numpy(), vals[0].astype(np.float32))
    assert view.price_columns == ("open", "close")
    np.testing.assert_array_equal(view.close.numpy(), vals[0][:, 1])  # exact float64
    s32 = DeviceStore(device="cpu", chunk_rows=300)
    ts, v = _quarter(5, np.float32)
    with pytest.raises(FxDataError, match="float32 values cannot carry prices exactly"):
        s32.add_quarter("Q5", ts, v, COLS)  # prices come from an f64 source only
    s32.add_quarter("Q5", ts, v, COLS, prices=v[:, :2].astype(np.float64))
    np.testing.assert_array_equal(s32.concat_view(["Q5"]).values.numpy(), v)


def test_bf16_sources_and_bf16_store() -> None:
    ts, v = _quarter(3)
    bits = _bf16_bits(v)
    prices = v[:, :2].copy()
    with pytest.raises(FxDataError, match="bf16 values cannot carry prices"):
        DeviceStore(device="cpu").add_quarter("Q", ts, bits, COLS)
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    s_f32 = DeviceStore(device="cpu", chunk_rows=64)
    s_f32.add_quarter("Q", ts, bits, COLS, prices=prices)
    np.testing.assert_array_equal(s_f32.concat_view(["Q"]).values.numpy(), widened)
    np.testing.assert_array_equal(s_f32.concat_view(["Q"]).close.numpy(), v[:, 1])
    assert s_f32.stats()["bytes_uploaded"] == N * len(COLS) * 2 + prices.nbytes  # 2-byte words on the bus
    s_bf = DeviceStore(device="cpu", value_dtype="bfloat16", chunk_rows=64)
    s_bf.add_quarter("Q", ts, bits, COLS, prices=prices)
    got = s_bf.concat_view(["Q"]).values
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), bits)
    s_bf2 = DeviceStore(device="cpu", value_dtype="bfloat16", chunk_rows=64)
    s_bf2.add_quarter("Q", ts, v, COLS)  # f64 source, cast on the host into bf16 staging
    np.testing.assert_array_equal(
        s_bf2.concat_view(["Q"]).values.view(torch.int16).numpy().view(np.uint16), bits
    )


def test_one_upload_per_quarter_across_many_folds() -> None:
    store, tss, vals = _store(4)
    cfg = TrainConfig(trainer="mlp")
    fcfg = FoldConfig(train_quarters=2, purge_bars=labels.max_horizon(), warmup_bars=5)
    keys = ["Q0", "Q1", "Q2", "Q3"]
    before = store.stats()
    folds = []
    for val_q in (2, 3, 2, 3, 3):
        ks = keys[val_q - 2 : val_q + 1]
        view = store.concat_view(ks)
        starts = [int(tss[keys.index(k)][0]) for k in ks]
        fr = fold_range(view.ts, starts, 2, fcfg, name=f"v{val_q}")
        folds.append(fold_transition(view, fr, cfg))
        # the fold's rows are the resident quarters, concatenated once per key set
        np.testing.assert_array_equal(
            view.values[fr.val_start : fr.val_end].numpy(), vals[val_q].astype(np.float32)
        )
    after = store.stats()
    assert after["uploads"] == before["uploads"] == 4
    assert after["bytes_uploaded"] == before["bytes_uploaded"]
    assert after["uploads_by_key"] == {k: 1 for k in keys}
    assert after["concat_builds"] == 2 and after["concat_hits"] == 3  # one build per distinct key set
    assert store.concat_view(keys[1:]) is store.concat_view(keys[1:])
    # a single quarter's view is the resident tensor itself (same storage, no copy)
    one = store.concat_view(["Q1"])
    assert one.values.data_ptr() == store.concat_view(["Q1"]).values.data_ptr()
    sliced = one.values[10:20]
    assert sliced.untyped_storage().data_ptr() == one.values.untyped_storage().data_ptr()
    assert folds[0].x_train.shape[1] == 4 and folds[0].columns == ("f0", "f1", "f2", "ofi_0")


def test_add_quarter_validation() -> None:
    store, tss, vals = _store(2)
    with pytest.raises(FxDataError, match="already resident"):
        store.add_quarter("Q0", tss[0], vals[0], COLS)
    ts, v = _quarter(9)
    bad_ts = ts.copy()
    bad_ts[5] = bad_ts[3]
    with pytest.raises(FxDataError, match="not time-ordered at bar 5"):
        store.add_quarter("Qx", bad_ts, v, COLS)
    with pytest.raises(FxDataError, match="column names"):
        store.add_quarter("Qx", ts, v, [*COLS, "extra"])
    with pytest.raises(FxDataError, match="column names"):
        store.add_quarter("Qx", ts, v, ["f0", "f0", "close"])
    bad_px = v.copy()
    bad_px[7, 1] = np.nan
    with pytest.raises(FxDataError, match=r"'close'.*bar 7"):
        store.add_quarter("Qx", ts, bad_px, COLS)
    with pytest.raises(FxDataError, match="no 'close'"):
        store.add_quarter("Qx", ts, v, ["open", "c", "f0", "f1", "f2", "ofi_0"])
    with pytest.raises(FxDataError, match="time order"):
        store.concat_view(["Q1", "Q0"])
    with pytest.raises(FxDataError, match="not resident"):
        store.concat_view(["Q0", "Q7"])


def test_view_cache_is_bounded_and_drop_frees() -> None:
    store, _, _ = _store(4)
    for ks in (["Q0", "Q1"], ["Q1", "Q2"], ["Q2", "Q3"]):
        store.concat_view(ks)
    assert store.stats()["cached_views"] == 2  # max_views default
    store.drop_quarter("Q3")
    assert "Q3" not in store and store.stats()["cached_views"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_pinned_staging_one_upload_per_quarter() -> None:
    store = DeviceStore(chunk_rows=256)
    assert store.device.type == "cuda"
    tss, vals = [], []
    for i in range(3):
        ts, v = _quarter(i)
        store.add_quarter(f"Q{i}", ts, v, COLS)
        tss.append(ts)
        vals.append(v)
    ts, v = _quarter(7)
    bits = _bf16_bits(v)
    store.add_quarter("B", ts + 10**18, bits, COLS, prices=v[:, :2].copy())
    st = store.stats()
    assert st["pinned_staging"] and st["uploads"] == 4 and st["device"].startswith("cuda")
    view = store.concat_view(["Q0", "Q1", "Q2"])
    assert view.values.is_cuda and view.prices.dtype == torch.float64
    np.testing.assert_array_equal(view.values.cpu().numpy(), np.concatenate(vals).astype(np.float32))
    np.testing.assert_array_equal(
        store.concat_view(["B"]).values.cpu().numpy(), (bits.astype(np.uint32) << 16).view(np.float32)
    )
    fcfg = FoldConfig(train_quarters=2, purge_bars=labels.max_horizon(), warmup_bars=0)
    fr = fold_range(view.ts, [int(t[0]) for t in tss], 2, fcfg, name="v")
    fold = fold_transition(view, fr, TrainConfig(trainer="mlp"), sessions=np.zeros(view.n_rows, np.int32))
    assert fold.x_train.is_cuda and fold.y_train.is_cuda
    train = np.concatenate(vals)[fr.train_start : fr.train_end, 2:].astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(fold.mean.cpu().numpy(), train.mean(0), atol=1e-9)
    assert store.stats()["uploads"] == 4  # the fold copied nothing from the host


def test_padded_fxcache_file_uploads_in_one_block(tmp_path: Path) -> None:
    """A real fxcache file (rows padded to 8 values, memory-mapped read-only) goes in as is."""
    ts, v = _quarter(4)
    path = write_fxcache(
        tmp_path / "q.fxcache",
        ts,
        {
            "feature": (["f0", "f1", "f2"], v[:, 2:5]),
            "price": (["open", "close"], v[:, :2]),
            "ofi": (["ofi_0"], v[:, 5:]),
        },
        "f32",
        b"k" * 32,
    )
    fc = open_fxcache(path)
    assert fc.values.shape == (N, 8) and not fc.values.flags.writeable
    store = DeviceStore(device="cpu", chunk_rows=333)
    store.add_quarter(
        "Q",
        fc.ts,
        fc.values,
        fc.value_column_names,
        price_columns=fc.group_names("price"),
        prices=np.array(fc.prices[:, :2]),
    )
    view = store.concat_view(["Q"])
    assert view.columns == ("f0", "f1", "f2", "ofi_0") and view.values.shape == (N, 8)
    np.testing.assert_array_equal(view.values.numpy(), np.asarray(fc.values))
    np.testing.assert_array_equal(view.close.numpy(), fc.column("close"))
    fr = SimpleNamespace(train_start=0, train_end=600, val_start=700, val_end=N)
    fold = fold_transition(view, fr, TrainConfig(trainer="mlp"), sessions=np.zeros(N, np.int32))
    assert fold.columns == ("f0", "f1", "f2", "ofi_0")  # no price, no padding


def _write_cache(path: Path, ts: np.ndarray, v: np.ndarray, dtype: Any) -> Path:
    return write_fxcache(
        path,
        ts,
        {
            "feature": (["f0", "f1", "f2"], v[:, 2:5]),
            "price": (["open", "close"], v[:, :2]),
            "ofi": (["ofi_0"], v[:, 5:6]),
        },
        dtype,
        b"k" * 32,
    )


def _reseal(path: Path) -> None:
    """Recompute an fxcache file's checksums after an in-place edit: a file that a buggy tool
    wrote with valid checksums, so that the device-side value checks are what stands."""
    h = fxcache.read_header(path)
    data = bytearray(path.read_bytes())
    digests = []
    for lo, hi in h.regions().values():
        hh = checksum.new_hasher()
        hh.update(bytes(data[lo:hi]))
        digests.append(hh.digest())
    data[152:216] = b"".join(digests)
    hh = checksum.new_hasher()
    hh.update(bytes(data[:240]))
    data[240:256] = hh.digest()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("store_dtype", ["float32", "bfloat16"])
def test_add_fxcaches_equals_add_quarter(tmp_path: Path, dtype: str, store_dtype: str) -> None:
    """The threaded fxcache fast path stores exactly what add_quarter stores from the memmaps,
    and the prices are the file's exact f64 prices at every value dtype."""
    items, ref = [], DeviceStore(device="cpu", value_dtype=store_dtype, chunk_rows=333)  # type: ignore[arg-type]
    closes = []
    for i in range(3):
        ts, v = _quarter(i)
        p = _write_cache(tmp_path / f"q{i}.fxcache", ts, v, dtype)
        fc = open_fxcache(p)
        ref.add_quarter(
            f"Q{i}",
            fc.ts,
            fc.values,
            fc.value_column_names,
            price_columns=fc.group_names("price"),
            prices=np.array(fc.prices[:, :2]),
        )
        items.append((f"Q{i}", p))
        closes.append(v[:, 1])
    # tiny chunks and 3 threads: many chunks per file, buffers reused out of order
    fast = DeviceStore(
        device="cpu",
        value_dtype=store_dtype,  # type: ignore[arg-type]
        staging_bytes=1000,
        io_threads=3,
        price_tick=0.25,
    )
    fast.add_fxcaches(items)
    keys = [k for k, _ in items]
    a, b = ref.concat_view(keys), fast.concat_view(keys)
    assert a.columns == b.columns == ("f0", "f1", "f2", "ofi_0")
    assert a.price_columns == b.price_columns == ("open", "close")
    assert torch.equal(a.values, b.values) and torch.equal(a.prices, b.prices)
    np.testing.assert_array_equal(b.close.numpy(), np.concatenate(closes))  # exact, even from bf16
    np.testing.assert_array_equal(a.ts, b.ts)
    np.testing.assert_array_equal(b.sessions, calendar.session_day(b.ts))  # computed at upload
    st = fast.stats()
    assert st["uploads"] == 3 and st["chunks"] > 30 and st["staging_pool_bytes"] <= 6 * 1000
    with pytest.raises(FxDataError, match="already resident"):
        fast.add_fxcache("Q0", items[0][1])


def test_add_fxcache_checks_values_and_prices(tmp_path: Path) -> None:
    ts, v = _quarter(1)
    path = _write_cache(tmp_path / "q.fxcache", ts, v, "f32")
    h = fxcache.read_header(path)
    raw = bytearray(path.read_bytes())
    off = h.values_offset + (17 * h.row_width + 0) * 4
    raw[off : off + 4] = np.float32(np.nan).tobytes()  # f0, bar 17
    bad = tmp_path / "nan.fxcache"
    bad.write_bytes(bytes(raw))
    store = DeviceStore(device="cpu")
    with pytest.raises(FxCacheError, match="checksum mismatch in the values block"):
        store.add_fxcaches([("Q", path), ("N", bad)])  # an in-place change never reaches the device
    _reseal(bad)
    with pytest.raises(FxDataError, match=r"'f0' is NaN/Inf at bar 17"):
        store.add_fxcaches([("Q", path), ("N", bad)])
    assert store.keys() == []  # nothing registered when one file fails
    raw = bytearray(path.read_bytes())
    off = h.price_offset + (5 * h.price_width + 1) * 8
    raw[off : off + 8] = np.float64(-1.0).tobytes()  # close, bar 5
    bad.write_bytes(bytes(raw))
    with pytest.raises(FxCacheError, match="checksum mismatch in the price block"):
        store.add_fxcache("N", bad)  # hashed as it streams to the device
    ts_raw = bytearray(path.read_bytes())
    ts_raw[h.ts_offset + 8 * 3] ^= 1  # a timestamp (still in order)
    bad_ts = tmp_path / "ts.fxcache"
    bad_ts.write_bytes(bytes(ts_raw))
    with pytest.raises(FxCacheError, match="checksum mismatch in the ts block"):
        store.add_fxcache("T", bad_ts)
    _reseal(bad)
    with pytest.raises(FxDataError, match=r"'close' not finite/positive at bar 5"):
        store.add_fxcache("N", bad)
    store.add_fxcache("Q", path)
    assert store.keys() == ["Q"]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ],
)
def test_a_changed_byte_in_any_chunk_fails_the_threaded_upload(tmp_path: Path, device: str) -> None:
    """Chunks are copied before their hash completes (the hash overlaps the copy): a changed
    byte in any chunk of any file, first, middle or last, still fails the call, and nothing
    is registered."""
    paths = [_write_cache(tmp_path / f"q{i}.fxcache", *_quarter(i), "f32") for i in range(3)]
    h = fxcache.read_header(paths[1])
    row = h.row_width * 4
    for bar in (0, N // 2, N - 1):
        raw = bytearray(paths[1].read_bytes())
        raw[h.values_offset + bar * row + 5] ^= 0x10
        bad = tmp_path / "bad.fxcache"
        bad.write_bytes(bytes(raw))
        store = DeviceStore(device=device, staging_bytes=3 * row, io_threads=4, price_tick=0.25)
        items = [("Q0", paths[0]), ("B", bad), ("Q2", paths[2])]
        with pytest.raises(FxCacheError, match="checksum mismatch in the values block"):
            store.add_fxcaches(items)
        assert store.keys() == [] and store.stats()["chunks"] == 0
    store.add_fxcaches([(f"Q{i}", p) for i, p in enumerate(paths)])  # the pool is reusable after
    assert store.keys() == ["Q0", "Q1", "Q2"] and store.stats()["chunks"] > 3 * N // 3


def test_prices_coarser_than_the_tick_are_refused() -> None:
    """The pattern the bf16 loader once built: bf16-decoded prices handed over as exact ones."""
    ts, v = _quarter(2)
    bits = _bf16_bits(v)
    decoded = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.unique(decoded[:, 1]).size < np.unique(v[:, 1]).size / 4  # bf16 merged the closes
    store = DeviceStore(device="cpu", price_tick=0.25)
    with pytest.raises(
        FxDataError, match=r"'open' moves only in multiples of \d+ ticks.*coarser than the 0.25"
    ):
        store.add_quarter("Q", ts, bits, COLS, prices=decoded[:, :2].copy())
    off_grid = v[:, :2].copy()
    off_grid[9, 1] += 0.1
    with pytest.raises(FxDataError, match=r"'close' has 1 values off the 0.25 tick grid"):
        store.add_quarter("Q", ts, bits, COLS, prices=off_grid)
    with pytest.raises(FxDataError, match="prices must be a float64 array"):
        store.add_quarter("Q", ts, bits, COLS, prices=v[:, :2].astype(np.float32))
    store.add_quarter("Q", ts, bits, COLS, prices=v[:, :2].copy())  # the exact prices pass
    assert store.keys() == ["Q"]
    with pytest.raises(FxDataError, match="price_tick"):
        DeviceStore(device="cpu", price_tick=float("nan"))


def _market_caches(tmp_path: Path, dtype: str) -> tuple[list[tuple[str, Path]], list[int]]:
    """3 quarters of bars (5-minute closes inside Globex sessions), closes on the 0.25 tick, a
    roll 202403 -> 202406 in the second quarter and 202406 -> 202409 in the third, features
    and OFI of ordinary magnitudes; the same market written at ``dtype``."""
    rng = np.random.default_rng(21)
    n = 3 * N
    t0 = 1_704_153_600 * 10**9  # 2024-01-02 00:00 UTC
    grid = t0 + np.arange(3 * n, dtype=np.int64) * 300 * 10**9
    ts = grid[calendar.session_day(grid) >= 0][:n]
    close = 4800.0 + 0.25 * np.cumsum(rng.integers(-3, 4, n))
    contract = np.select([np.arange(n) < 1500, np.arange(n) < 2600], [202403.0, 202406.0], 202409.0)
    prices = np.column_stack([np.concatenate([[close[0]], close[:-1]]), close, contract])
    feats = rng.standard_normal((n, 3)) * [1.0, 40.0, 1e-3] + [0.0, 50.0, 0.0]
    ofi = rng.standard_normal((n, 2)) * 250.0
    items, starts = [], []
    for q in range(3):
        sl = slice(q * N, (q + 1) * N)
        p = write_fxcache(
            tmp_path / f"{dtype}_{q}.fxcache",
            ts[sl],
            {
                "feature": (["f0", "f1", "f2"], feats[sl]),
                "price": (["open", "close", "contract"], prices[sl]),
                "ofi": (["ofi_0", "ofi_1"], ofi[sl]),
            },
            dtype,  # type: ignore[arg-type]
            bytes([q]) * 32,
        )
        items.append((f"{dtype}{q}", p))
        starts.append(int(ts[sl][0]))
    return items, starts


def test_same_fold_from_f32_bf16_f64_caches_has_identical_labels(tmp_path: Path) -> None:
    """Labels, the forward returns behind them and the roll mask do not depend on the value
    dtype of the cache (prices live in its f64 block); only the model inputs differ."""
    from fx_assets.core.trainers import train_mlp

    cfg = TrainConfig(trainer="mlp", epochs=1, batch_size=256, hidden=[8], max_steps_per_epoch=3)
    folds = {}
    for dtype in ("f32", "bf16", "f64"):
        items, starts = _market_caches(tmp_path, dtype)
        store = DeviceStore(device="cpu", price_tick=0.25)
        store.add_fxcaches(items)
        view = store.concat_view([k for k, _ in items])
        fcfg = FoldConfig(train_quarters=2, purge_bars=cfg.purge_bars, warmup_bars=0)
        fr = fold_range(view.ts, starts, 2, fcfg, name="q3")
        fold = fold_transition(view, fr, cfg)  # the asset's call: sessions and rolls from the view
        res = train_mlp(fold, cfg, tmp_path / f"model_{dtype}", [k for k, _ in items])
        assert np.isfinite(res.metrics["turnover"])
        folds[dtype] = fold
    ref = folds["f64"]
    # the roll mask: labels whose window spans 1500 or 2600 are undefined, in the training
    # rows and in the validation rows
    n_tr = ref.bounds[1] - ref.bounds[0]
    assert 0 < int(torch.isnan(ref.r1_train).sum()) < n_tr
    assert int(torch.isnan(ref.y_train).sum()) >= 30
    assert ref.extra["train_labels_undefined"] > 0
    for dtype in ("f32", "bf16"):
        f = folds[dtype]
        assert f.bounds == ref.bounds
        for name in ("y_train", "r1_train", "y_val", "r1_val"):
            a, b = getattr(f, name), getattr(ref, name)
            assert a.dtype == torch.float64
            assert torch.equal(torch.isnan(a), torch.isnan(b)), (dtype, name)  # the same roll mask
            assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)), (dtype, name)  # bit-identical
        np.testing.assert_array_equal(f.val_sessions, ref.val_sessions)
        np.testing.assert_array_equal(f.train_sessions, ref.train_sessions)
        assert f.columns == ref.columns == ("f0", "f1", "f2", "ofi_0", "ofi_1")
    # ... and only the model inputs differ (bf16 rounds them)
    assert not torch.equal(folds["bf16"].x_train, ref.x_train)
    assert not torch.equal(folds["bf16"].mean, ref.mean)


def test_fold_transition_does_no_calendar_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session ids are computed once per quarter at upload; a fold's transition (the asset's
    call) computes none, so its cost does not include host calendar work (issue 9.3)."""
    items, starts = _market_caches(tmp_path, "f32")
    store = DeviceStore(device="cpu", price_tick=0.25)
    store.add_fxcaches(items)
    view = store.concat_view([k for k, _ in items])
    want = calendar.session_day(view.ts)
    cfg = TrainConfig(trainer="mlp")
    fr = fold_range(
        view.ts, starts, 2, FoldConfig(train_quarters=2, purge_bars=cfg.purge_bars, warmup_bars=0), name="q3"
    )

    def no_calendar(*a: object, **k: object) -> None:
        raise AssertionError("calendar.session_day called during a fold transition")

    monkeypatch.setattr(calendar, "session_day", no_calendar)
    fold = fold_transition(view, fr, cfg)
    np.testing.assert_array_equal(fold.val_sessions, want[fr.val_start : fr.val_end])
    np.testing.assert_array_equal(fold.train_sessions, want[fr.train_start : fr.train_end])


def test_consecutive_quarters_of_one_upload_are_a_view_not_a_copy(tmp_path: Path) -> None:
    """Quarters uploaded together lie back to back: the view of consecutive ones shares their
    storage (no device or host copy, whatever the fold), and its fold equals the fold built
    from quarters uploaded one by one (concatenated by copy), roll mask included."""
    items, starts = _market_caches(tmp_path, "f32")
    keys = [k for k, _ in items]
    together = DeviceStore(device="cpu", price_tick=0.25)
    together.add_fxcaches(items)
    apart = DeviceStore(device="cpu", price_tick=0.25, max_views=4)
    for k, p in items:
        apart.add_fxcache(k, p)
    cfg = TrainConfig(trainer="mlp")
    fcfg = FoldConfig(train_quarters=2, purge_bars=cfg.purge_bars, warmup_bars=0)
    for ks in (keys, keys[1:], keys[:2]):
        v, c = together.concat_view(ks), apart.concat_view(ks)
        first = together.concat_view(ks[:1])
        assert v.values.untyped_storage().data_ptr() == first.values.untyped_storage().data_ptr()
        assert v.values.data_ptr() == first.values.data_ptr()
        assert np.shares_memory(v.ts, first.ts) and np.shares_memory(v.sessions, first.sessions)
        assert torch.equal(v.values, c.values) and torch.equal(v.prices, c.prices)
        np.testing.assert_array_equal(v.ts, c.ts)
        assert v.log_close is not None and torch.equal(v.log_close, torch.log(v.close))
        # the roll counts may start anywhere; where they change is what matters
        assert v.segment_changes is not None and c.segment_changes is not None
        assert torch.equal(torch.diff(v.segment_changes), torch.diff(c.segment_changes))
        if len(ks) == 3:
            fr = fold_range(v.ts, starts, 2, fcfg, name="q3")
            a, b = fold_transition(v, fr, cfg), fold_transition(c, fr, cfg)
            for name in ("x_train", "x_val", "mean", "std"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
            for name in ("y_train", "r1_train", "y_val", "r1_val"):
                x, y = getattr(a, name), getattr(b, name)
                assert torch.equal(torch.isnan(x), torch.isnan(y)) and torch.equal(
                    torch.nan_to_num(x), torch.nan_to_num(y)
                ), name
    st_t, st_a = together.stats(), apart.stats()
    assert st_t["device_copy_bytes"] == 0 and st_t["concat_zero_copy"] == 3
    assert st_a["device_copy_bytes"] > 0 and st_a["concat_zero_copy"] == 0
    # a view that skips a quarter is not contiguous: built by copy, the roll between its
    # quarters still counted
    gap = together.concat_view([keys[0], keys[2]])
    assert together.stats()["device_copy_bytes"] > 0
    contract = gap.price("contract")
    want = torch.cumsum(torch.cat([torch.zeros(1), (contract[1:] != contract[:-1]).double()]), 0)
    assert gap.segment_changes is not None and int(want[-1]) == 2  # the boundary and Q2's roll
    assert torch.equal(gap.segment_changes.double(), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fused_transition_on_a_zero_copy_view_with_rolls(tmp_path: Path) -> None:
    """On CUDA, the fold of a zero-copy view of three fxcache quarters with two rolls: the fused
    kernels give the torch path's labels (the same roll mask, values within an ulp) and inputs; a
    NaN training input is named; the warm-up leaves the kernels enabled."""
    from fx_assets.core.trainers import transition

    items, starts = _market_caches(tmp_path, "f32")
    store = DeviceStore(device="cuda", price_tick=0.25)
    store.add_fxcaches(items)
    view = store.concat_view([k for k, _ in items])
    assert store.stats()["concat_zero_copy"] == 1
    cfg = TrainConfig(trainer="mlp")
    fr = fold_range(
        view.ts, starts, 2, FoldConfig(train_quarters=2, purge_bars=cfg.purge_bars, warmup_bars=0), name="q3"
    )
    assert transition.warm_up(view, cfg) >= 0 and transition._FUSED_STATE["enabled"]
    fused = fold_transition(view, fr, cfg)
    assert fused.extra["fused_kernels"], transition._FUSED_STATE
    transition._FUSED_STATE["enabled"] = False
    try:
        ref = fold_transition(view, fr, cfg)
    finally:
        transition._FUSED_STATE["enabled"] = True
    assert fused.extra["train_labels_undefined"] == ref.extra["train_labels_undefined"] > 0
    for name in ("y_train", "r1_train", "y_val", "r1_val"):
        a, b = getattr(fused, name), getattr(ref, name)
        assert torch.equal(torch.isnan(a), torch.isnan(b)), name
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15, equal_nan=True)
    torch.testing.assert_close(fused.mean, ref.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.std, ref.std, rtol=1e-10, atol=0)
    torch.testing.assert_close(fused.x_train, ref.x_train, rtol=0, atol=1e-5)
    torch.testing.assert_close(fused.x_val, ref.x_val, rtol=0, atol=1e-5)
    bad = view.values.clone()
    bad[fr.train_start + 7, view.column_index("f1")] = float("nan")
    with pytest.raises(FxDataError, match=rf"'f1'.*row {fr.train_start + 7}"):
        fold_transition(dataclasses.replace(view, values=bad), fr, cfg)


def _write_snapshot_cache(path: Path, ts: np.ndarray, mid: np.ndarray, contract: float, meta: Any) -> Path:
    n = ts.shape[0]
    feats = np.random.default_rng(int(ts[0]) % 97).normal(size=(n, 3))
    prices = np.stack([mid, np.full(n, 19000.0), np.full(n, contract)], axis=1)
    return write_fxcache(
        path,
        ts,
        {"feature": (["s0", "s1", "s2"], feats), "price": (["mid", "session", "contract"], prices)},
        "f32",
        b"s" * 32,
        meta,
    )


def test_snapshot_row_files_upload_with_their_row_unit_from_the_meta(tmp_path: Path) -> None:
    """A snapshot-row fxcache (price block mid/session/contract, no close) uploads on both paths;
    the row unit comes from the file's meta, never from the columns: a file that declares bar
    rows without a close column, or snapshot rows without a mid, is refused by name."""
    rng = np.random.default_rng(3)
    items, mids = [], []
    for i in range(2):
        ts = np.int64(1_700_000_000_000_000_000 + i * 10**12) + np.arange(500, dtype=np.int64) * 1000
        mid = 5000.0 + 0.125 * np.cumsum(rng.integers(-1, 2, 500))
        p = _write_snapshot_cache(tmp_path / f"s{i}.fxcache", ts, mid, 1.0 + i, {"row_unit": "snapshot"})
        items.append((f"S{i}", p))
        mids.append(mid)
    st = DeviceStore(device="cpu", price_tick=0.25)
    st.add_fxcaches(items)
    v = st.concat_view(["S0", "S1"])
    assert v.row_unit == "snapshot" and v.log_close is None
    np.testing.assert_array_equal(v.price("mid").numpy(), np.concatenate(mids))  # exact f64
    assert v.segment_changes is not None and int(v.segment_changes[-1]) == 1  # the contract change
    ref = DeviceStore(device="cpu")
    fc = open_fxcache(items[0][1])
    ref.add_quarter(
        "S0",
        fc.ts,
        fc.values,
        fc.value_column_names,
        price_columns=fc.group_names("price"),
        prices=np.array(fc.prices[:, :3]),
        row_unit="snapshot",
    )
    assert torch.equal(ref.concat_view(["S0"]).prices, st.concat_view(["S0"]).prices)
    with pytest.raises(FxDataError, match="no 'close' price column for row_unit 'bar'"):
        ref.add_quarter(
            "X",
            fc.ts,
            fc.values,
            fc.value_column_names,
            price_columns=fc.group_names("price"),
            prices=np.array(fc.prices[:, :3]),
        )
    # a file without row_unit meta is a bar file: its missing close is an error naming it
    ts = np.int64(1_700_000_000_000_000_000) + np.arange(100, dtype=np.int64)
    legacy = _write_snapshot_cache(tmp_path / "legacy.fxcache", ts, np.full(100, 5000.0), 1.0, None)
    with pytest.raises(FxDataError, match=r"legacy\.fxcache.*no 'close' price column for row_unit 'bar'"):
        DeviceStore(device="cpu").add_fxcache("L", legacy)
    odd = _write_snapshot_cache(tmp_path / "odd.fxcache", ts, np.full(100, 5000.0), 1.0, {"row_unit": "tick"})
    with pytest.raises(FxDataError, match="row_unit 'tick' is not one of"):
        DeviceStore(device="cpu").add_fxcache("O", odd)
    # bar and snapshot quarters never concatenate into one fold
    ts_b, vb = _quarter(0)
    mixed = DeviceStore(device="cpu")
    mixed.add_quarter("B", ts_b, vb, COLS)
    mixed.add_fxcache("S9", items[1][1])
    with pytest.raises(FxDataError, match="row unit"):
        mixed.concat_view(["B", "S9"])
