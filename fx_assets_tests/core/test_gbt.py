"""The LightGBM baseline (core/trainers/gbt.py) on small arrays: it learns a planted signal,
stays at AUC ~0.5 on noise, is deterministic given the seed and honours its row sample."""

from __future__ import annotations

import numpy as np
import pytest

from fx_assets.core.errors import FxDataError
from fx_assets.core.metrics import auc
from fx_assets.core.trainers.gbt import GbtConfig, train_gbt

SMALL = GbtConfig(
    sample_rows=4000, n_estimators=60, min_data_in_leaf=50, early_stopping_rounds=20, purge_rows=10
)


def _data(n: int, signal: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4))
    move = signal * (x[:, 0] - 0.5 * x[:, 1] ** 2 + 0.5) + rng.standard_normal(n)
    y = np.sign(move)
    y[rng.random(n) < 0.1] = np.nan  # zero moves excluded upstream
    return x, y


def test_learns_a_planted_signal() -> None:
    x, y = _data(12_000, 1.0, 0)
    xv, yv = _data(5_000, 1.0, 1)
    res = train_gbt(x, y, xv, SMALL)
    k = np.isfinite(yv)
    a = auc(res.proba[k], yv[k] > 0)
    assert a > 0.75
    assert res.n_fit == 4000 and res.n_stop > 0
    assert max(res.importance_gain, key=lambda f: res.importance_gain[f]) == "f0"
    assert ((res.proba > 0) & (res.proba < 1)).all()


def test_noise_gives_auc_near_half() -> None:
    x, y = _data(12_000, 0.0, 2)
    xv, yv = _data(20_000, 0.0, 3)
    res = train_gbt(x, y, xv, SMALL)
    k = np.isfinite(yv)
    assert abs(auc(res.proba[k], yv[k] > 0) - 0.5) < 0.02  # iid AUC sd ~0.0043 at n = 18 k


def test_deterministic_given_seed_and_seed_matters() -> None:
    x, y = _data(8_000, 0.5, 4)
    xv, _ = _data(1_000, 0.5, 5)
    a = train_gbt(x, y, xv, SMALL).proba
    b = train_gbt(x, y, xv, SMALL).proba
    np.testing.assert_array_equal(a, b)
    c = train_gbt(x, y, xv, SMALL.model_copy(update={"seed": 1})).proba
    assert not np.array_equal(a, c)


def test_stride_and_stopping_block_rows() -> None:
    x, y = _data(10_000, 0.5, 6)
    y[:] = np.where(np.arange(10_000) % 2 == 0, 1.0, -1.0)  # every row usable
    cfg = SMALL.model_copy(
        update={"stride": 5, "sample_rows": 100_000, "early_stop_share": 0.3, "purge_rows": 500}
    )
    res = train_gbt(x, y, x[:10], cfg)
    assert res.n_stop == 3000  # rows [7000, 10000)
    assert res.n_fit == len(range(0, 7000 - 500, 5))
    off = train_gbt(x, y, x[:10], cfg.model_copy(update={"early_stopping_rounds": 0}))
    assert off.n_stop == 0 and off.n_fit == 2000 and off.best_iteration == cfg.n_estimators


def test_bad_inputs_name_the_problem() -> None:
    x, y = _data(1000, 0.5, 7)
    with pytest.raises(FxDataError, match="equal widths"):
        train_gbt(x, y, x[:, :3], SMALL)
    with pytest.raises(FxDataError, match="y_train"):
        train_gbt(x, y[:10], x, SMALL)
    with pytest.raises(FxDataError, match="both classes"):
        train_gbt(x, np.ones(1000), x, SMALL)
    with pytest.raises(ValueError, match="finite"):
        GbtConfig(learning_rate=float("nan"))
