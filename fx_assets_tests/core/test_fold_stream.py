"""Streamed folds (core.fold_stream) against the resident path: statistics, labels at block
edges and across rolls, inputs, and MLP / DQN training on the same blocks; the budget decision."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fx_assets.core.device_store import DeviceStore
from fx_assets.core.errors import FxDataError
from fx_assets.core.fold_stream import StreamedRows, fold_device_bytes, plan_fold
from fx_assets.core.fxcache import open_fxcache, write_fxcache
from fx_assets.core.trainers import FoldData, fold_transition, train_dqn, train_mlp
from fx_assets.core.trainers.common import load_state
from fx_assets.core.trainers.rows import FoldRows, Moments, ResidentRows
from fx_assets_tests.core.test_device_store import _reseal
from fx_assets_tests.core.test_trainers import (
    DQN_CFG,
    INPUTS,
    MLP_CFG,
    QUARTER_BARS,
    make_market,
    make_range,
)

N_Q = 3


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_quarters(
    tmp: Path, ts: np.ndarray, values: np.ndarray, contract: np.ndarray | None = None
) -> list[Path]:
    """One fxcache file per quarter of the trainer tests' market (prices in the f64 block)."""
    paths = []
    for q in range(N_Q):
        sl = slice(q * QUARTER_BARS, (q + 1) * QUARTER_BARS)
        price_names, prices = ["open", "close"], values[sl, :2]
        if contract is not None:
            price_names, prices = [*price_names, "contract"], np.column_stack([prices, contract[sl]])
        paths.append(
            write_fxcache(
                tmp / f"q{q}.fxcache",
                ts[sl],
                {
                    "feature": (INPUTS[:-1], values[sl, 2:-1]),
                    "price": (price_names, prices),
                    "ofi": (["ofi_0"], values[sl, -1:]),
                },
                "f32",
                bytes([q]) * 32,
            )
        )
    return paths


def resident(paths: list[Path], fr, cfg) -> FoldData:  # type: ignore[no-untyped-def]
    store = DeviceStore(device="cpu")
    items = [(f"k{i}", p) for i, p in enumerate(paths)]
    store.add_fxcaches(items)
    return fold_transition(store.concat_view([k for k, _ in items]), fr, cfg)


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], object, np.ndarray]:
    ts, values = make_market(N_Q, 0.35, 41)
    tmp = tmp_path_factory.mktemp("stream")
    return write_quarters(tmp, ts, values), make_range(ts, N_Q, 2), values


def _cat(rows: FoldRows, part: str, name: str) -> np.ndarray:
    n = rows.n_train if part == "train" else rows.n_val
    return np.concatenate([np.asarray(getattr(b, name)) for b in rows.block_list(part, 0, n)])


def test_moments_combine_blocks_like_one_reduction() -> None:
    x = torch.randn(10_001, 5, dtype=torch.float64) * 3 + 7
    mom = Moments()
    for a in range(0, 10_001, 977):
        mom.add(x[a : a + 977])
    var, mean = torch.var_mean(x, dim=0, correction=0)
    torch.testing.assert_close(mom.mean, mean, rtol=1e-14, atol=0)
    torch.testing.assert_close(mom.var(), var, rtol=1e-13, atol=0)


@pytest.mark.parametrize("block_rows", [7, 700, 4096])
def test_streamed_rows_equal_the_resident_fold(market, block_rows: int) -> None:  # type: ignore[no-untyped-def]
    """Statistics to rounding; inputs (same f32 affine), labels and sessions bit for bit, at every
    block edge (7 rows < the 31-row label reach: every label needs the next block's prices)."""
    paths, fr, _ = market
    ref = resident(paths, fr, MLP_CFG)
    st = StreamedRows(paths, fr, MLP_CFG, block_rows=block_rows, device="cpu")
    assert st.columns == ref.columns and st.bounds == ref.bounds
    torch.testing.assert_close(st.mean, ref.mean, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(st.std, ref.std, rtol=1e-12, atol=0)
    # the float32 affine the inputs see is the same, so the inputs are the same bits
    assert torch.equal((1 / st.std).float(), (1 / ref.std).float())
    assert torch.equal((-st.mean / st.std).float(), (-ref.mean / ref.std).float())
    res = ResidentRows(ref, block_rows)
    for part in ("train", "val"):
        for name in ("x", "y", "r1", "sessions"):
            np.testing.assert_array_equal(
                _cat(st, part, name), _cat(res, part, name), err_msg=f"{part}.{name}"
            )
    np.testing.assert_array_equal(st.val_ts(), ref.val_ts)
    assert st.stream_stats.blocks > 0 and st.stream_stats.h2d_bytes > 0
    st.close()


def test_labels_at_block_edges_need_the_look_ahead(market) -> None:  # type: ignore[no-untyped-def]
    """A block whose labels were computed from its own rows alone would end in NaN (or, with
    prices from outside the fold, differ): each streamed block's last rows carry full labels."""
    paths, fr, values = market
    st = StreamedRows(paths, fr, MLP_CFG, block_rows=500, device="cpu")
    close = values[fr.train_start : fr.val_end, 1]
    for b in st.block_list("train", 0, st.n_train):
        j = b.start + b.n - 1  # the block's last row
        expect = np.log(close[j + 2]) - np.log(close[j + 1])  # entry lag 1
        assert np.isfinite(b.r1[-1].item()) and np.isclose(b.r1[-1].item(), expect, rtol=0, atol=1e-15)
        assert np.isfinite(b.y[-30:].numpy()).all()
    # validation labels stop at val_end exactly as the resident path's
    last = list(st.block_list("val", 0, st.n_val))[-1]
    assert np.isnan(last.r1[-2:].numpy()).all() and np.isnan(last.y[-31:].numpy()).all()
    st.close()


def test_labels_across_a_roll_are_masked_as_resident(tmp_path: Path) -> None:
    ts, values = make_market(N_Q, 0.35, 42)
    fr = make_range(ts, N_Q, 2)
    contract = np.full(len(ts), 101.0)
    contract[2500:] = 202.0  # a roll inside the training rows, away from the block grid
    contract[fr.val_start + 1000 :] = 303.0  # and one inside validation
    paths = write_quarters(tmp_path, ts, values, contract)
    ref = resident(paths, fr, MLP_CFG)
    st = StreamedRows(paths, fr, MLP_CFG, block_rows=333, device="cpu")
    assert st.extra["train_labels_undefined"] == ref.extra["train_labels_undefined"] == 30
    res = ResidentRows(ref, 333)
    for part in ("train", "val"):
        for name in ("y", "r1"):
            np.testing.assert_array_equal(_cat(st, part, name), _cat(res, part, name))
    st.close()


def test_streamed_fold_refuses_what_the_resident_refuses(tmp_path: Path) -> None:
    ts, values = make_market(N_Q, 0.35, 43)
    fr = make_range(ts, N_Q, 2)
    paths = write_quarters(tmp_path, ts, values)
    short = dataclasses.replace(fr, train_end=fr.val_start - 30)
    with pytest.raises(FxDataError, match="label reach"):
        StreamedRows(paths, short, MLP_CFG, device="cpu")
    row = fr.train_start + 1717  # in quarter 0; column n1 is value column 2
    fc = open_fxcache(paths[0])
    at = fc.header.values_offset + (row * fc.header.row_width + 2) * 4
    fc.close()
    data = bytearray(paths[0].read_bytes())
    data[at : at + 4] = np.float32(np.nan).tobytes()
    paths[0].write_bytes(bytes(data))
    _reseal(paths[0])  # a file with valid checksums and a NaN: the value check is what stands
    with pytest.raises(FxDataError, match=r"'n1'.*bar " + str(row)):  # refused at upload
        resident(paths, fr, MLP_CFG)
    with pytest.raises(FxDataError, match=r"'n1'.*row " + str(row)):
        StreamedRows(paths, fr, MLP_CFG, block_rows=400, device="cpu")


def _same_training(a, b) -> None:  # type: ignore[no-untyped-def]
    timing = {"epoch_seconds", "train_seconds"}
    assert {k: v for k, v in a.metrics.items() if k not in timing} == {
        k: v for k, v in b.metrics.items() if k not in timing
    }
    wa, wb = load_state(a.best_path), load_state(b.best_path)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    np.testing.assert_array_equal(a.val_positions, b.val_positions)


def test_mlp_and_dqn_train_the_same_on_streamed_and_resident_blocks(market, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Same blocks (block_rows), same seed: the same epochs, weights and validation path, the
    streamed fold computing its own statistics in its streaming pass."""
    paths, fr, _ = market
    ref = resident(paths, fr, MLP_CFG)
    for cfg, train in (
        (MLP_CFG.model_copy(update={"epochs": 2, "block_rows": 1024}), train_mlp),
        (DQN_CFG.model_copy(update={"epochs": 2, "block_rows": 1024, "max_steps_per_epoch": 40}), train_dqn),
    ):
        st = StreamedRows(paths, fr, cfg, block_rows=1024, device="cpu")
        a = train(ResidentRows(ref, 1024), cfg, tmp_path / f"r_{cfg.trainer}", ["k"])
        b = train(st, cfg, tmp_path / f"s_{cfg.trainer}", ["k"])
        _same_training(a, b)
        assert a.metrics["auc"] > 0.55  # it learnt the planted signal through blocks
        st.close()


def test_budget_decides_resident_or_stream() -> None:
    need = fold_device_bytes(1000, 8, 4, 8, 16)
    assert need == 1000 * (32 + 64 + 12) + 1000 * (64 + 24) + 1000 * 24
    assert plan_fold(need, need) == "resident" and plan_fold(need, need - 1) == "stream"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_streamed_rows_equal_the_resident_fold(tmp_path: Path) -> None:
    """On CUDA (pinned buffers, the copy stream, the resident path's Triton kernels on both
    sides): statistics to rounding, inputs and labels bit for bit, and the same MLP training."""
    ts, values = make_market(N_Q, 0.35, 44)
    fr = make_range(ts, N_Q, 2)
    contract = np.full(len(ts), 101.0)
    contract[2500:] = 202.0
    paths = write_quarters(tmp_path, ts, values, contract)
    store = DeviceStore(device="cuda")
    items = [(f"k{i}", p) for i, p in enumerate(paths)]
    store.add_fxcaches(items)
    ref = fold_transition(store.concat_view([k for k, _ in items]), fr, MLP_CFG)
    st = StreamedRows(paths, fr, MLP_CFG, block_rows=700, device="cuda")
    torch.testing.assert_close(st.mean, ref.mean, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(st.std, ref.std, rtol=1e-12, atol=0)
    res = ResidentRows(ref, 700)
    for part in ("train", "val"):
        for name in ("x", "y", "r1"):
            a = np.concatenate(
                [getattr(b, name).cpu().numpy() for b in st.block_list(part, 0, res.part_rows(part))]
            )
            b = np.concatenate(
                [getattr(b, name).cpu().numpy() for b in res.block_list(part, 0, res.part_rows(part))]
            )
            np.testing.assert_array_equal(a, b, err_msg=f"{part}.{name}")
    cfg = MLP_CFG.model_copy(update={"epochs": 2, "block_rows": 700})
    _same_training(train_mlp(res, cfg, tmp_path / "r", ["k"]), train_mlp(st, cfg, tmp_path / "s", ["k"]))
    figures = st.stream_stats.as_dict()
    assert figures["h2d_bytes"] > 0 and figures["h2d_seconds"] > 0
    st.close()


def test_the_host_budget_counts_reclaimable_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU the budget is MemAvailable, not MemFree: after a feature build the page cache
    holds the memory-mapped sidecars and MemFree is near zero, so a small fold streamed (seen in
    the e2e backfill test: 0 uploads) although it fits many times over."""
    from fx_assets.core import fold_stream

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       24000000 kB\nMemFree:          300000 kB\nMemAvailable:   20000000 kB\nCached:         19000000 kB\n"
    )
    assert fold_stream.available_host_bytes(str(meminfo)) == 20_000_000 * 1024
    # Without MemAvailable (another OS): the free physical pages.
    assert fold_stream.available_host_bytes(str(tmp_path / "none")) > 0
    monkeypatch.setattr(fold_stream, "available_host_bytes", lambda: 20_000_000 * 1024)
    budget = fold_stream.default_budget_bytes(torch.device("cpu"))
    free = 20_000_000 * 1024
    assert budget == int(free - max(fold_stream.BUDGET_MARGIN_MIN, fold_stream.BUDGET_MARGIN_FRACTION * free))
    assert plan_fold(fold_device_bytes(100_000, 72, 4, 8, 71), budget) == "resident"
