"""Snapshot rows through the asset path: ``fxcache`` (``row_unit: snapshot``) → ``fold_ranges``
→ ``trained_model`` for one fold with the MLP, on a small synthetic market with a planted
event-time signal (``SynthConfig(snap_signal=...)``) and on its null twin."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pytest

from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.settings import ProjectSettings

Q1, Q2 = dt.date(2024, 1, 1), dt.date(2024, 4, 1)
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def _market(root: Path, snap_signal: float) -> Path:
    from fx_assets.core.calendar import quarter_range
    from fx_assets.core.synth import SynthConfig, generate_market

    cfg = SynthConfig(
        quarters=tuple(quarter_range("2024-Q1:2024-Q2")),
        scale=0.0005,
        seed=3,
        signal=0.0,
        snap_signal=snap_signal,
        book_ratio=40.0,
    )
    generate_market(root, cfg)
    return root


def _meta(result: dg.ExecuteInProcessResult, asset: str, partition: str | None = None) -> dict:
    for ev in result.get_asset_materialization_events():
        if ev.asset_key.to_user_string() == asset:
            return {k: v.value for k, v in ev.materialization.metadata.items()}
    raise KeyError(asset)


@pytest.mark.slow
@pytest.mark.parametrize("snap_signal", [2.0, 0.0])
def test_mlp_trains_on_snapshot_rows_through_the_assets(tmp_path: Path, snap_signal: float) -> None:
    from fx_assets.core.signal_inputs import FoldSignal
    from fx_assets.resources.pipeline import FxCacheWriteConfig, PipelineConfig
    from fx_assets.resources.research import (
        GbtBaselineConfig,
        ResearchConfig,
        SignalLabelsConfig,
        SignalReportSettings,
    )
    from fx_assets.resources.training import DeviceFxCacheLoader, TrainerConfig, default_training

    root = _market(tmp_path / "m", snap_signal)
    defs = build_definitions(
        ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=Q2, train_quarters=1)
    )
    res = dict(defs.resources or {})
    pipeline = PipelineConfig(fxcache=FxCacheWriteConfig(row_unit="snapshot"))
    training = default_training(1).model_copy(
        update={"train": TrainerConfig(trainer="mlp", epochs=3, hidden=[32], batch_size=2048)}
    )
    res.update(
        pipeline=pipeline,
        training=training,
        fxcache_loader=DeviceFxCacheLoader(storage=res["storage"], pipeline=pipeline),
    )
    assets = list(defs.assets or [])
    with dg.instance_for_test() as inst:
        for q in (Q1, Q2):
            r = dg.materialize(
                assets, selection=list(FEATURE_STAGES), partition_key=partition_key(q, "ES.FUT"),
                instance=inst, resources=res, run_config=QUIET,
            )  # fmt: skip
            assert r.success and _meta(r, "fxcache")["row_unit"] == "snapshot"
        r = dg.materialize(
            assets, selection=["fold_ranges", "trained_model"], partition_key="2024-04|ES.FUT",
            instance=inst, resources=res, run_config=QUIET,
        )  # fmt: skip
        assert r.success
        obs = inst.fetch_observations(dg.AssetKey("trained_model"), limit=1).records
        md: dict[str, Any] = {
            k: v.value for k, v in obs[0].event_log_entry.asset_observation.metadata.items()
        }
        fr = inst.fetch_observations(dg.AssetKey("fold_ranges"), limit=1).records
        ranges: dict[str, Any] = {
            k: v.value for k, v in fr[0].event_log_entry.asset_observation.metadata.items()
        }
        # the signal report of the fold shows the model, row for row on the report's rows
        res["research"] = ResearchConfig(
            labels=SignalLabelsConfig(snapshot_horizons=[10, 50]),
            gbt=GbtBaselineConfig(
                sample_rows=5000, stride=5, n_estimators=20, min_data_in_leaf=50, early_stopping_rounds=5
            ),
            report=SignalReportSettings(n_boot=20, n_perm=20),
        )
        r = dg.materialize(
            assets, selection=["signal_report"], partition_key="2024-04|ES.FUT",
            instance=inst, resources=res, run_config=QUIET,
        )  # fmt: skip
        assert r.success
        report = _meta(r, "signal_report")
    assert md["row_unit"] == "snapshot" and md["train_horizon"] == 50
    assert 0 < md["zero_move_share"] < 1
    assert "| 501 |" in ranges["ranges"]  # the purge: the label reach of the default horizons
    pred = np.load(md["val_predictions"])
    assert pred["score"].shape == pred["ts"].shape == pred["classes_h50"].shape
    assert report["trained_model"].startswith("trained_mlp ")
    assert "snapshot|trained_mlp" in report["auc_by_horizon"]
    sig = FoldSignal.load(Path(report["path"]) / "fold_signal.npz")
    np.testing.assert_array_equal(sig.val_ts, pred["ts"])
    np.testing.assert_array_equal(sig.predictions["trained_mlp"][50], pred["score"])
    # the trainer's h = 50 labels and the report's are the same rows' labels
    both = np.isfinite(sig.labels[50]) & np.isfinite(pred["classes_h50"]) & (pred["classes_h50"] != 0)
    assert both.mean() > 0.5
    np.testing.assert_array_equal(sig.labels[50][both], pred["classes_h50"][both])
    print(snap_signal, {k: v for k, v in md.items() if "auc" in k or k == "fold_rows"})
    if snap_signal:
        assert md["val_auc"] > 0.53 and md["auc_null_z"] > 4, md
    else:
        assert abs(md["auc_null_z"]) < 4, md


@pytest.mark.parametrize("three", [False, True])
def test_snapshot_outputs_store_the_three_class_probabilities(tmp_path: Path, three: bool) -> None:
    """``val_predictions.npz`` of a three-class MLP holds its score and ``proba`` (up,
    stationary, down); the per-horizon AUC is the score's, up against down (class 0 left out).
    A binary model's file is as before (no ``proba``)."""
    from types import SimpleNamespace

    import torch

    from fx_assets.assets.training import _snapshot_outputs
    from fx_assets.core import metrics as M
    from fx_assets.core.trainers.common import TrainConfig

    rng = np.random.default_rng(0)
    n = 500
    proba = rng.dirichlet([1.0, 2.0, 1.0], n)
    score = 0.5 * (1.0 + proba[:, 0] - proba[:, 2])
    cls = rng.choice([1.0, 0.0, -1.0, np.nan], n)
    cfg = TrainConfig(trainer="mlp", row_unit="snapshot", snapshot_zero="three_class" if three else "exclude")
    fold = SimpleNamespace(extra={"classes": {50: torch.from_numpy(np.concatenate([np.zeros(7), cls]))}})
    result = SimpleNamespace(metrics={"auc": 0.5}, val_scores=score, val_proba=proba if three else None)
    meta = _snapshot_outputs(tmp_path, fold, result, np.arange(n, dtype=np.int64), cfg)
    with np.load(tmp_path / "val_predictions.npz") as z:
        assert ("proba" in z.files) == three
        np.testing.assert_array_equal(z["score"], score)
        np.testing.assert_array_equal(z["classes_h50"], cls)
        if three:
            np.testing.assert_array_equal(z["proba"], proba)
    assert meta["val_auc_h50"] == round(M.auc_returns(score, cls), 6)
    assert meta["zero_handling"] == cfg.snapshot_zero
