"""Walk-forward ranges: rolling window, purge >= label horizon, embargo, warm-up, timestamps only."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pydantic
import pytest

from fx_assets.core import calendar
from fx_assets.core.errors import FxDataError
from fx_assets.core.folds import FoldConfig, fold_range, fold_table, quarter_start_ns
from fx_assets.core.labels import blended_target, max_horizon

QUARTERS = [dt.date(2024, 1, 1), dt.date(2024, 4, 1), dt.date(2024, 7, 1), dt.date(2024, 10, 1)]
STARTS = [quarter_start_ns(q) for q in QUARTERS]
END = quarter_start_ns(dt.date(2025, 1, 1))
BARS_PER_Q = [300, 250, 400, 350]


def concat_ts(bars_per_q: list[int] = BARS_PER_Q) -> np.ndarray:
    """Bar close times spread over each quarter (uneven counts, like volume bars)."""
    rng = np.random.default_rng(1)
    bounds = [*STARTS, END]
    parts = [np.sort(rng.integers(bounds[i], bounds[i + 1], n)) for i, n in enumerate(bars_per_q)]
    return np.concatenate(parts).astype(np.int64)


def cfg(**kw: int) -> FoldConfig:
    base = {"train_quarters": 2, "purge_bars": max_horizon(), "embargo_bars": 0, "warmup_bars": 0}
    base.update(kw)
    return FoldConfig(**base)


def test_quarter_start_is_first_session_open() -> None:
    # 2024-01-01 is a Monday: its session opened Sunday 2023-12-31 17:00 Chicago = 23:00 UTC
    assert STARTS[0] == int(dt.datetime(2023, 12, 31, 23, tzinfo=dt.UTC).timestamp()) * 10**9
    assert calendar.session_day(np.array([STARTS[0]]))[0] >= 0


def test_rolling_window_and_validation_block() -> None:
    ts = concat_ts()
    r = fold_range(ts, STARTS, 3, cfg(train_quarters=2))
    assert r.name == "2024-Q4"
    q = np.cumsum([0, *BARS_PER_Q])
    assert (r.val_start, r.val_end) == (q[3], q[4])
    assert r.train_start == q[1]  # rolling: Q2 and Q3 only, Q1 is outside the window
    assert r.train_end == q[3] - max_horizon()
    assert r.train_first_ts == ts[r.train_start] and r.train_last_ts == ts[r.train_end - 1]
    assert r.val_first_ts >= STARTS[3] > r.train_last_ts
    assert r.val_last_ts == ts[-1]
    r3 = fold_range(ts, STARTS, 3, cfg(train_quarters=3))
    assert r3.train_start == 0
    # with a closing boundary the validation block stops there
    r2 = fold_range(ts, STARTS, 2, cfg(train_quarters=1))
    assert r2.name == "2024-Q3" and (r2.val_start, r2.val_end) == (q[2], q[3])
    assert r2.train_start == q[1]


def test_purge_keeps_training_labels_out_of_validation() -> None:
    ts = concat_ts()
    close = 5000 * np.exp(np.cumsum(np.random.default_rng(2).normal(0, 1e-3, ts.size)))
    r = fold_range(ts, STARTS, 2, cfg())
    h = max_horizon()
    # label j reads close[j+1 .. j+1+30]: every training label ends before the first validation bar
    assert (r.train_end - 1) + h < r.val_start
    # and the purge is tight: one bar less would let the last label read close[val_start]
    assert (r.train_end - 1) + h + 1 == r.val_start
    # empirically: perturbing every validation close leaves every training label unchanged
    y0, _ = blended_target(close)
    c2 = close.copy()
    c2[r.val_start :] *= 1.05
    y1, _ = blended_target(c2)
    np.testing.assert_array_equal(y1[r.train], y0[r.train])
    assert not np.array_equal(y1[r.train_start : r.train_end + 1], y0[r.train_start : r.train_end + 1])


def test_purge_shorter_than_horizon_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="label horizon"):
        FoldConfig(train_quarters=1, purge_bars=max_horizon() - 1, warmup_bars=0)
    ts = concat_ts()
    with pytest.raises(FxDataError, match=r"2024-Q3.*purge_bars=31 < label horizon 61"):
        fold_range(ts, STARTS, 2, cfg(), label_horizon=max_horizon((1, 5, 60)))
    r = fold_range(ts, STARTS, 2, cfg(purge_bars=61), label_horizon=max_horizon((1, 5, 60)))
    assert r.train_end + 61 == r.val_start


def test_embargo_leaves_a_gap() -> None:
    ts = concat_ts()
    a = fold_range(ts, STARTS, 2, cfg())
    b = fold_range(ts, STARTS, 2, cfg(embargo_bars=20))
    assert b.val_start == a.val_start and b.train_start == a.train_start
    assert b.train_end == a.train_end - 20
    assert b.val_start - b.train_end == max_horizon() + 20


def test_warmup_excluded_at_start_of_concatenation() -> None:
    ts = concat_ts()
    r = fold_range(ts, STARTS, 2, cfg(warmup_bars=40))
    assert r.train_start == 40 and r.warmup_excluded == 40
    # warm-up inside an earlier quarter that the window does not use changes nothing
    r1 = fold_range(ts, STARTS, 3, cfg(train_quarters=2, warmup_bars=40))
    assert r1.train_start == BARS_PER_Q[0] and r1.warmup_excluded == 0


def test_computed_from_timestamps_only() -> None:
    # the same fold on a shifted index base: a leading quarter of unrelated bars moves all
    # indices by its length and changes nothing else
    ts = concat_ts()
    r = fold_range(ts[BARS_PER_Q[0] :], STARTS[1:], 2, cfg(train_quarters=2))
    r_full = fold_range(ts, STARTS, 3, cfg(train_quarters=2))
    off = BARS_PER_Q[0]
    assert (r.train_start + off, r.train_end + off, r.val_start + off, r.val_end + off) == (
        r_full.train_start,
        r_full.train_end,
        r_full.val_start,
        r_full.val_end,
    )
    assert r.val_first_ts == r_full.val_first_ts and r.name == r_full.name


def test_too_little_data_errors_naming_the_fold() -> None:
    ts = concat_ts([300, 20, 400, 350])
    with pytest.raises(FxDataError, match="fold 2024-Q3: empty training slice"):
        fold_range(ts, STARTS, 2, cfg(train_quarters=1))
    with pytest.raises(FxDataError, match="fold 2024-Q2: needs 2 training quarter"):
        fold_range(concat_ts(), STARTS, 1, cfg(train_quarters=2))
    with pytest.raises(FxDataError, match="fold 2024-Q4: the validation quarter has no bars"):
        fold_range(concat_ts()[: sum(BARS_PER_Q[:3])], STARTS, 3, cfg())
    with pytest.raises(FxDataError, match="decreases"):
        fold_range(concat_ts()[::-1], STARTS, 3, cfg())
    with pytest.raises(FxDataError, match="fold 2024-Q2: empty training slice"):
        fold_range(concat_ts(), STARTS, 1, cfg(train_quarters=1, warmup_bars=300 - max_horizon()))


def test_fold_table() -> None:
    ts = concat_ts()
    rows = fold_table([fold_range(ts, STARTS, i, cfg(train_quarters=1, embargo_bars=5)) for i in (1, 2, 3)])
    assert [r["fold"] for r in rows] == ["2024-Q2", "2024-Q3", "2024-Q4"]
    for r, n_prev, n_val in zip(rows, BARS_PER_Q[:3], BARS_PER_Q[1:], strict=True):
        assert r["val_bars"] == n_val and r["train_bars"] == n_prev - max_horizon() - 5
        assert r["train_from"].endswith("Z") and r["val_from"] > r["train_to"]
        assert dt.datetime.fromisoformat(r["val_from"]).year == 2024


def test_fold_config_is_frozen_and_strict() -> None:
    c = cfg()
    with pytest.raises(pydantic.ValidationError):
        c.train_quarters = 3  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        FoldConfig(train_quarters=0, purge_bars=40, warmup_bars=0)
    with pytest.raises(pydantic.ValidationError):
        FoldConfig(train_quarters=1, purge_bars=40, warmup_bars=0, bogus=1)  # type: ignore[call-arg]


def test_default_embargo_is_the_longest_label_or_feature_reach() -> None:
    """reference §7.4: forward-only walk-forward leaves max(label horizon, longest feature
    look-back) bars before validation, on top of the purge; an explicit embargo_bars wins."""
    ts = concat_ts()
    base = FoldConfig(train_quarters=2, purge_bars=max_horizon(), warmup_bars=0)
    assert base.embargo_bars is None
    a = fold_range(ts, STARTS, 2, base, feature_lookback=50)
    assert a.embargo_bars == 50 and a.val_start - a.train_end == max_horizon() + 50
    b = fold_range(ts, STARTS, 2, base, feature_lookback=7)  # the label reach is longer
    assert b.embargo_bars == max_horizon() and b.val_start - b.train_end == 2 * max_horizon()
    c = fold_range(ts, STARTS, 2, base.model_copy(update={"embargo_bars": 0}), feature_lookback=50)
    assert c.embargo_bars == 0 and c.val_start - c.train_end == max_horizon()
    with pytest.raises(FxDataError, match="feature_lookback"):
        fold_range(ts, STARTS, 2, base, feature_lookback=-1)


def test_pipeline_feature_lookback_is_the_longest_feature_window() -> None:
    from fx_assets.core.bar_features import BarFeatureConfig
    from fx_assets.core.folds import feature_lookback
    from fx_assets.core.ofi import OfiConfig

    got = feature_lookback(BarFeatureConfig(), OfiConfig())
    # the EWMA vol (span 100, alpha 2/101): its start weighs < 1% after ln(0.01)/ln(1 - alpha) bars
    alpha = 2 / 101
    assert got == math.ceil(1383 * math.log(0.01) / math.log(BarFeatureConfig().memory_tol))
    assert abs(got - math.log(0.01) / math.log1p(-alpha)) < 2
    longer = feature_lookback(
        BarFeatureConfig(), OfiConfig(warmup_bars=400)
    )  # a rolling window counts in full
    assert longer == 400


@pytest.mark.parametrize("form", ["unsmoothed", "fi", "deeplob", "tlob"])
def test_snapshot_fold_purge_is_derived_from_the_label_config(form: str) -> None:
    """Snapshot rows: the purge is max(purge_bars, label reach) rows, taken from the trainer's
    label config (so a bar-sized purge_bars cannot make it short), and no training label of any
    horizon reads a validation mid: perturbing every validation mid changes none of them."""
    import torch

    from fx_assets.core.snapshot_labels import snapshot_labels
    from fx_assets.core.trainers.common import TrainConfig

    tc = TrainConfig(
        trainer="mlp",
        row_unit="snapshot",
        snapshot_form=form,
        snapshot_horizons=[5, 40, 120],
        train_horizon=40,
    )
    reach = tc.purge_bars
    assert reach == {"unsmoothed": 121, "fi": 121, "deeplob": 240, "tlob": 130}[form]
    ts = concat_ts([3000, 2500, 4000, 3500])
    with pytest.raises(FxDataError, match="label reach"):
        fold_range(ts, STARTS, 2, cfg(), row_unit="snapshot")
    r = fold_range(ts, STARTS, 2, cfg(), label_horizon=reach, row_unit="snapshot")
    assert r.purge_bars == reach and r.train_end + reach == r.val_start  # embargo 0 in cfg()
    no_embargo = FoldConfig(train_quarters=2, purge_bars=max_horizon(), warmup_bars=0)
    r2 = fold_range(ts, STARTS, 2, no_embargo, label_horizon=reach, row_unit="snapshot", feature_lookback=7)
    assert r2.embargo_bars == reach and r2.val_start - r2.train_end == 2 * reach
    rng = np.random.default_rng(4)
    mid = (2 * 5000 / 0.25 + np.cumsum(rng.choice([-1, 0, 1], ts.size))) * 0.125
    lab_cfg = tc.snapshot_labels()
    a = snapshot_labels(torch.from_numpy(mid), 0.25, r.train_end, lab_cfg)
    m2 = mid.copy()
    m2[r.val_start :] += 0.25 * 40
    b = snapshot_labels(torch.from_numpy(m2), 0.25, r.train_end, lab_cfg)
    for la, lb in zip(a, b, strict=True):
        assert torch.equal(la.change[r.train].nan_to_num(9.0), lb.change[r.train].nan_to_num(9.0))
    # AFML purge: no training label window [n-back+1, n+h] meets the first validation label's
    # window
    from fx_assets.core.snapshot_labels import back_rows

    ends = [(r.train_end - 1) + h for h in lab_cfg.horizons]
    first_val = [r.val_start - back_rows(lab_cfg.form, h, lab_cfg.smooth) + 1 for h in lab_cfg.horizons]
    assert max(ends) < min(first_val)
