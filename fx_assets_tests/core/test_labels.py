"""Labels: hand values, the NaN tail, input causality, torch == numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fx_assets.core.errors import FxDataError
from fx_assets.core.labels import (
    blended_target,
    blended_target_torch,
    forward_log_return,
    forward_log_return_torch,
    max_horizon,
    sign_label,
    sign_label_torch,
)


def prices(n: int = 200, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 5000.0 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))


def test_forward_log_return_hand_values() -> None:
    c = np.array([100.0, 101.0, 99.0, 102.0, 104.0])
    y = forward_log_return(c, 1)  # entry at j+1, exit at j+2
    np.testing.assert_allclose(
        y[:3], [math.log(99 / 101), math.log(102 / 99), math.log(104 / 102)], rtol=0, atol=1e-15
    )
    assert np.isnan(y[3:]).all()
    y2 = forward_log_return(c, 2, entry_lag=0)
    np.testing.assert_allclose(
        y2[:3], [math.log(99 / 100), math.log(102 / 101), math.log(104 / 99)], atol=1e-15
    )
    assert np.isnan(y2[3:]).all()


def test_blended_target_hand_values() -> None:
    c = np.exp(np.arange(40, dtype=np.float64) * 0.01)  # log price rises 0.01 a bar
    y, valid = blended_target(c)
    # r_h = 0.01 h, so r_h / sqrt(h) = 0.01 sqrt(h); mean over (1, 5, 30)
    expected = 0.01 * (1 + math.sqrt(5) + math.sqrt(30)) / 3
    np.testing.assert_allclose(y[valid], expected, rtol=1e-12)
    # the seed's SP19 blend, spelled out on a random series
    c = prices(100)
    y, valid = blended_target(c)
    j = 17
    r = {h: math.log(c[j + 1 + h] / c[j + 1]) for h in (1, 5, 30)}
    sp19 = (1 / 3) * r[1] + (1 / 3) * r[5] / math.sqrt(5) + (1 / 3) * r[30] / math.sqrt(30)
    assert y[j] == pytest.approx(sp19, rel=1e-12, abs=1e-16)


def test_nan_tail_is_exactly_max_horizon() -> None:
    assert max_horizon() == 31
    assert max_horizon((1, 2, 4, 8, 16), entry_lag=0) == 16
    c = prices(120)
    for horizons, lag in [((1, 5, 30), 1), ((1, 2, 4, 8, 16), 1), ((3,), 0)]:
        y, valid = blended_target(c, horizons, lag)
        m = max_horizon(horizons, lag)
        assert valid.dtype == bool
        assert valid[: len(c) - m].all() and not valid[len(c) - m :].any()
        assert np.isnan(y[len(c) - m :]).all() and np.isfinite(y[: len(c) - m]).all()
    # never renormalised: a slice shorter than the longest horizon has no label at all
    y, valid = blended_target(prices(20))
    assert not valid.any()


def test_labels_depend_only_on_the_future_window() -> None:
    c = prices(80)
    h_max = max_horizon()
    y0, v0 = blended_target(c)
    for k in range(len(c)):
        c2 = c.copy()
        c2[k] *= 1.01
        y1, v1 = blended_target(c2)
        assert (v1 == v0).all()
        changed = np.flatnonzero(v0 & (y1 != y0))
        # label j reads close[j+1 .. j+1+30]: so only j in [k-31, k-1] may move
        allowed = set(range(max(0, k - h_max), k))
        assert set(changed.tolist()) <= allowed, f"perturbing close[{k}] moved labels {changed}"
        if k >= 1 and v0[k - 1]:
            assert k - 1 in set(changed.tolist())  # the entry price of label k-1 is close[k]
    for h in (1, 5):
        y = forward_log_return(c, h)
        for k in (10, 40):
            c2 = c.copy()
            c2[k] += 3.0
            moved = np.flatnonzero(np.isfinite(y) & (forward_log_return(c2, h) != y))
            assert set(moved.tolist()) == {k - 1 - h, k - 1}


def test_sign_label() -> None:
    y = np.array([0.5, -0.2, 0.0, np.nan, 0.05])
    np.testing.assert_array_equal(sign_label(y), [1, -1, 0, np.nan, 1])
    np.testing.assert_array_equal(sign_label(y, 0.1), [1, -1, 0, np.nan, 0])
    np.testing.assert_array_equal(sign_label(y, np.array([1, 0.1, 0, 0, 0.01])), [0, -1, 0, np.nan, 1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_matches_numpy(dtype: torch.dtype) -> None:
    c = prices(300, seed=3)
    ct = torch.tensor(c, dtype=dtype)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    cn = ct.double().numpy()  # same input precision on both sides
    for h in (1, 5, 30):
        for lag in (0, 1):
            a = forward_log_return(cn, h, lag)
            b = forward_log_return_torch(ct, h, lag)
            assert b.dtype == dtype and b.device == ct.device
            np.testing.assert_allclose(b.double().numpy(), a, atol=tol, rtol=0, equal_nan=True)
    y, v = blended_target(cn)
    yt, vt = blended_target_torch(ct)
    np.testing.assert_array_equal(vt.numpy(), v)
    np.testing.assert_allclose(yt.double().numpy(), y, atol=tol, rtol=0, equal_nan=True)
    yy = np.array([0.5, -0.2, 0.0, np.nan])
    np.testing.assert_array_equal(
        sign_label_torch(torch.tensor(yy, dtype=dtype), 0.1).double().numpy(), sign_label(yy, 0.1)
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_on_cuda() -> None:  # pragma: no cover - runs where a GPU exists
    c = prices(300)
    yt, vt = blended_target_torch(torch.tensor(c, device="cuda"))
    assert yt.device.type == "cuda"
    y, v = blended_target(c)
    np.testing.assert_array_equal(vt.cpu().numpy(), v)
    np.testing.assert_allclose(yt.cpu().numpy(), y, atol=1e-12, equal_nan=True)


def test_bad_close_is_named() -> None:
    c = prices(10)
    c[4] = 0.0
    with pytest.raises(FxDataError, match="bar 4"):
        blended_target(c)
    with pytest.raises(FxDataError, match="bar 4"):
        blended_target_torch(torch.tensor(c))
    with pytest.raises(ValueError):
        max_horizon((1, 1))
