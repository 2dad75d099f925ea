"""The ``signal_report`` assets through Dagster: per fold for both row units, and stitched side by
side; on a planted event-time signal the snapshot decay curve peaks where the plant does (slow)."""

import datetime as dt
import shutil
from pathlib import Path

import dagster as dg
import pytest

from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.resources.pipeline import FxCacheWriteConfig, PipelineConfig
from fx_assets.resources.research import (
    GbtBaselineConfig,
    ResearchConfig,
    SignalLabelsConfig,
    SignalReportSettings,
)
from fx_assets.settings import ProjectSettings

Q1, Q2 = dt.date(2024, 1, 1), dt.date(2024, 4, 1)
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
# the tiny market has ~800 book updates per session: snapshot horizons up to 50 updates
SMALL = ResearchConfig(
    labels=SignalLabelsConfig(snapshot_horizons=[5, 10, 20, 50]),
    gbt=GbtBaselineConfig(
        sample_rows=3000,
        stride=3,
        n_estimators=30,
        min_data_in_leaf=50,
        early_stopping_rounds=10,
        purge_rows=40,
    ),
    report=SignalReportSettings(n_boot=20, n_perm=20),
)


def _run(
    defs: dg.Definitions, inst: dg.DagsterInstance, resources: dict, selection: list[str], pk: str | None
):
    r = dg.materialize(
        list(defs.assets or []),
        selection=selection,
        partition_key=pk,
        instance=inst,
        resources=resources,
        run_config=QUIET,
    )
    assert r.success
    return r


def _meta(r: dg.ExecuteInProcessResult, asset: str) -> dict:
    for ev in r.get_asset_materialization_events():
        if ev.asset_key.to_user_string() == asset:
            return {k: v.value for k, v in ev.materialization.metadata.items()}
    raise KeyError(asset)


def materialize_reports(root: Path, research: ResearchConfig, units: tuple[str, ...]) -> dict:
    """Features of Q1 and Q2 for each row unit, the Q2 fold (trained on Q1) and its signal report,
    then the stitched report; returns {unit: fold metadata} and the stitched metadata."""
    defs = build_definitions(
        ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=Q2, train_quarters=1)
    )
    base = {**dict(defs.resources or {}), "research": research}
    out: dict = {}
    with dg.instance_for_test() as inst:
        for unit in units:
            res = {**base, "pipeline": PipelineConfig(fxcache=FxCacheWriteConfig(row_unit=unit))}
            for q in (Q1, Q2):
                _run(defs, inst, res, list(FEATURE_STAGES), partition_key(q, "ES.FUT"))
            r = _run(defs, inst, res, ["fold_ranges", "signal_report"], partition_key(Q2, "ES.FUT"))
            out[unit] = _meta(r, "signal_report")
        out["stitched"] = _meta(
            _run(defs, inst, base, ["signal_report_stitched"], None), "signal_report_stitched"
        )
        # a second materialization of the same fold is a cache hit with the build's metadata
        res = {**base, "pipeline": PipelineConfig(fxcache=FxCacheWriteConfig(row_unit=units[-1]))}
        again = _meta(_run(defs, inst, res, ["signal_report"], partition_key(Q2, "ES.FUT")), "signal_report")
        out["again"] = again
    return out


def test_signal_report_both_row_units_and_stitched(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    m = materialize_reports(root, SMALL, ("bar", "snapshot"))
    bar, snap, st = m["bar"], m["snapshot"], m["stitched"]
    assert bar["row_unit"] == "bar" and snap["row_unit"] == "snapshot"
    assert bar["cache_key"] != snap["cache_key"] and Path(bar["path"]) != Path(snap["path"])
    for fm, hs in ((bar, [1, 2, 5, 10, 30]), (snap, [5, 10, 20, 50])):
        folder = Path(fm["path"])
        for f in ("signal_report.md", "signal_report.png", "signal_report.json", "fold_signal.npz"):
            assert (folder / f).is_file(), f
        assert fm["decay"].startswith("![AUC by horizon") and "data:image/png;base64," in fm["decay"]
        md = fm["report"]
        assert "## By horizon" in md and "## By spread bin" in md and "## By realised_vol bin" in md
        assert "## By event_rate bin" in md
        curves = fm["auc_by_horizon"]
        unit = fm["row_unit"]
        assert set(curves) == {f"{unit}|gbt", f"{unit}|l1_imbalance"}
        assert sorted(int(h) for h in curves[f"{unit}|gbt"]) == hs
        assert all(0.0 <= a <= 1.0 for c in curves.values() for a in c.values())
    assert m["again"]["action"] == "reused" and m["again"]["cache_key"] == snap["cache_key"]
    # stitched: both row units on the same quarter, each with its own report and picture
    assert st["row_units"] == "ES.FUT bar, ES.FUT snapshot" and st["quarters"] == "2024-Q2"
    for unit in ("bar", "snapshot"):
        assert "data:image/png;base64," in st[f"ES.FUT_{unit}_decay"]
        assert f"{unit} · gbt" in st[f"ES.FUT_{unit}_report"]
    assert (Path(st["path"]) / "index.md").is_file()


def test_stitched_shows_only_row_units_that_exist(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    m = materialize_reports(root, SMALL, ("bar",))
    assert m["stitched"]["row_units"] == "ES.FUT bar"
    assert not any(k.startswith("ES.FUT_snapshot") for k in m["stitched"])


# --- the planted event-time signal (docs/synthetic-market.md: response peaks ~42 updates ahead) ---

DENSE = {"scale": 0.002, "seed": 3, "book_ratio": 50.0}  # ~23 k book updates per session
PLANT = ResearchConfig(
    gbt=GbtBaselineConfig(sample_rows=40_000, stride=10, n_estimators=150, early_stopping_rounds=30),
    report=SignalReportSettings(n_boot=40, n_perm=40),
)


def _dense_report(tmp_path: Path, snap_signal: float) -> tuple[dict, dict]:
    import json

    from fx_assets.core.synth import SynthConfig, generate_market

    root = tmp_path / "data"
    generate_market(root, SynthConfig(quarters=(Q1, Q2), snap_signal=snap_signal, **DENSE))  # type: ignore[arg-type]
    m = materialize_reports(root, PLANT, ("snapshot",))
    doc = json.loads((Path(m["snapshot"]["path"]) / "signal_report.json").read_text())
    return m, doc


def _all_cells(doc: dict, model: str) -> dict[int, dict]:
    return {c["horizon"]: c for c in doc["cells"] if c["regime"] == "all" and c["model"] == model}


@pytest.mark.slow
def test_snapshot_decay_curve_peaks_at_the_planted_horizon(tmp_path: Path) -> None:
    m, doc = _dense_report(tmp_path, 2.0)
    for model in ("l1_imbalance", "gbt"):
        cells = _all_cells(doc, model)
        auc = {h: c["auc"] for h, c in cells.items()}
        peak = max(auc, key=lambda h: auc[h])
        assert peak in (20, 50), (model, auc)
        assert cells[peak]["in_null_band"] is False and cells[peak]["auc_lo"] > 0.55, (model, cells[peak])
        assert auc[10] < auc[peak] and auc[500] < auc[100] < auc[peak], (model, auc)
    assert st_has_snapshot(m["stitched"])


@pytest.mark.slow
def test_null_market_every_horizon_inside_the_null_band(tmp_path: Path) -> None:
    m, doc = _dense_report(tmp_path, 0.0)
    outside = []
    for model in ("l1_imbalance", "gbt"):
        for h, c in _all_cells(doc, model).items():
            # h = 10: the default book's own mechanics (docs/synthetic-market.md: a touch move
            # leaves a fresh level-1 queue against the move) give the imbalance AUC ~0.503 over a
            # whole quarter, outside a band that narrow; no plant, so it stays within 0.01
            if h == 10:
                assert abs(c["auc"] - 0.5) < 0.01, (model, h, c)
            elif not c["in_null_band"]:
                outside.append((model, h, c["auc"], c["null_sd"]))
    assert not outside, outside
    assert st_has_snapshot(m["stitched"])


def st_has_snapshot(stitched: dict) -> bool:
    return stitched["row_units"] == "ES.FUT snapshot" and "ES.FUT_snapshot_decay" in stitched


def test_research_doc_lists_every_config_field() -> None:
    from fx_assets.core.signal_inputs import SignalLabelConfig
    from fx_assets.core.signal_report import SignalReportConfig
    from fx_assets.core.trainers.gbt import GbtConfig

    doc = (Path(__file__).resolve().parents[1] / "docs" / "research.md").read_text()
    for section, model in (("labels", SignalLabelConfig), ("gbt", GbtConfig), ("report", SignalReportConfig)):
        part = doc.split(f"### `research.{section}`")[1].split("###")[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in part, (section, name)


def test_every_research_field_and_input_moves_the_report_key() -> None:
    from fx_assets.core import lineage
    from fx_assets_tests.test_lineage import mutations

    configs = list(ResearchConfig().core_configs())
    base = lineage.signal_report_key("f" * 64, ["a" * 64, "b" * 64], configs)
    seen = {base}
    for i, model in enumerate(configs):
        for path, changed in mutations(model):
            k = lineage.signal_report_key(
                "f" * 64, ["a" * 64, "b" * 64], [*configs[:i], changed, *configs[i + 1 :]]
            )
            assert k not in seen, (type(model).__name__, path)
            seen.add(k)
    assert lineage.signal_report_key("e" * 64, ["a" * 64, "b" * 64], configs) != base  # fold ranges
    assert lineage.signal_report_key("f" * 64, ["a" * 64, "c" * 64], configs) != base  # an fxcache file
    assert lineage.signal_report_stitched_key([base], configs) != lineage.signal_report_stitched_key(
        [base, base], configs
    )


# --- the fold's trained model beside the baselines ---------------------------------------------


def test_report_shows_the_trained_model_and_its_key_moves_with_it(market3: Path, tmp_path: Path) -> None:
    """Bar rows, Q2 fold: the report before the model exists has the two baselines; after
    ``trained_model`` it has the model too, its per-row predictions exactly the model's
    ``val_predictions.npz`` row for row (same timestamps as the report's rows); a model trained
    with another config is another model key, so another report key (and a rebuilt report)."""
    import numpy as np

    from fx_assets.core.signal_inputs import FoldSignal
    from fx_assets.resources.training import FoldsConfig, TrainerConfig, TrainingConfig

    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = build_definitions(
        ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=Q2, train_quarters=1)
    )
    pk = partition_key(Q2, "ES.FUT")

    def training(seed: int) -> TrainingConfig:
        # constructed, not model_copy(update=...): Dagster rebuilds a resource from its config
        return TrainingConfig(
            folds=FoldsConfig(train_quarters=1),
            train=TrainerConfig.model_validate({"trainer": "mlp", "epochs": 2, "hidden": [8], "seed": seed}),
        )

    res = {**dict(defs.resources or {}), "research": SMALL, "training": training(0)}
    with dg.instance_for_test() as inst:
        for q in (Q1, Q2):
            _run(defs, inst, res, list(FEATURE_STAGES), partition_key(q, "ES.FUT"))
        before = _meta(_run(defs, inst, res, ["fold_ranges", "signal_report"], pk), "signal_report")
        assert before["trained_model"] == "none"
        assert set(before["auc_by_horizon"]) == {"bar|gbt", "bar|l1_imbalance"}
        keys = [before["cache_key"]]
        for seed in (0, 1):
            res["training"] = training(seed)
            _run(defs, inst, res, ["trained_model"], pk)
            obs = inst.fetch_observations(dg.AssetKey("trained_model"), limit=1).records[0]
            model_meta = obs.event_log_entry.asset_observation.metadata  # type: ignore[union-attr]
            pred = np.load(str(model_meta["val_predictions"].value))
            m = _meta(_run(defs, inst, res, ["signal_report"], pk), "signal_report")
            assert m["action"] == "built" and m["trained_model"].startswith("trained_mlp ")
            curves = m["auc_by_horizon"]
            assert set(curves) == {"bar|gbt", "bar|l1_imbalance", "bar|trained_mlp"}
            assert sorted(int(h) for h in curves["bar|trained_mlp"]) == [1, 2, 5, 10, 30]
            assert "bar · trained_mlp" in m["report"]
            sig = FoldSignal.load(Path(m["path"]) / "fold_signal.npz")
            np.testing.assert_array_equal(pred["ts"], sig.val_ts)  # row for row the report's rows
            for h in sig.labels:
                np.testing.assert_array_equal(sig.predictions["trained_mlp"][h], pred["score"])
            keys.append(m["cache_key"])
        assert len(set(keys)) == 3, keys  # no model, model of seed 0, model of seed 1
        # the same model again: the report is a cache hit
        again = _meta(_run(defs, inst, res, ["signal_report"], pk), "signal_report")
        assert again["action"] == "reused" and again["cache_key"] == keys[-1]


def test_report_depends_on_the_trained_model_in_the_asset_graph(tmp_path: Path) -> None:
    defs = build_definitions(
        ProjectSettings(data_root=tmp_path, first_quarter=Q1, last_quarter=Q2, train_quarters=1)
    )
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("trained_model") in graph.get(dg.AssetKey("signal_report")).parent_keys


@pytest.mark.slow
def test_report_shows_a_three_class_mlp_on_snapshot_rows(market3: Path, tmp_path: Path) -> None:
    """Snapshot rows, Q2 fold, an MLP with ``snapshot_zero: three_class`` (2 epochs): the report
    reads its class probabilities from ``val_predictions.npz`` and shows its three-class metrics
    (stationary AUC, 3-class accuracy, macro AUC, class shares) beside the binary baselines, whose
    three-class columns say n/a; the fold file and the stitched report carry them too. Slow: the
    snapshot feature stages of two quarters come first (minutes on a loaded 2-core machine)."""
    import json

    import numpy as np

    from fx_assets.core.signal_inputs import FoldSignal
    from fx_assets.resources.training import DeviceFxCacheLoader, FoldsConfig, TrainerConfig, TrainingConfig

    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = build_definitions(
        ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=Q2, train_quarters=1)
    )
    pk = partition_key(Q2, "ES.FUT")
    pipeline = PipelineConfig(fxcache=FxCacheWriteConfig(row_unit="snapshot"))
    training = TrainingConfig(
        folds=FoldsConfig(train_quarters=1),
        train=TrainerConfig.model_validate(
            {
                "trainer": "mlp",
                "epochs": 2,
                "hidden": [8],
                "snapshot_horizons": [5, 10, 20],
                "train_horizon": 10,
                "snapshot_zero": "three_class",
            }
        ),
    )
    res = {**dict(defs.resources or {}), "research": SMALL, "training": training, "pipeline": pipeline}
    res["fxcache_loader"] = DeviceFxCacheLoader(storage=res["storage"], pipeline=pipeline)
    with dg.instance_for_test() as inst:
        for q in (Q1, Q2):
            _run(defs, inst, res, list(FEATURE_STAGES), partition_key(q, "ES.FUT"))
        _run(defs, inst, res, ["fold_ranges", "trained_model"], pk)
        obs = inst.fetch_observations(dg.AssetKey("trained_model"), limit=1).records[0]
        model_meta = obs.event_log_entry.asset_observation.metadata  # type: ignore[union-attr]
        pred = np.load(str(model_meta["val_predictions"].value))
        assert pred["proba"].shape == (pred["ts"].size, 3)
        m = _meta(_run(defs, inst, res, ["signal_report"], pk), "signal_report")
        st = _meta(_run(defs, inst, res, ["signal_report_stitched"], None), "signal_report_stitched")
    assert m["trained_model"].startswith("trained_mlp ")
    assert m["trained_model_labels"] == {
        "zero_handling": "three_class",
        "stationary_share": None,
        "train_horizon": 10,
    }
    three = m["three_class_by_horizon"]
    assert set(three) == {"snapshot|trained_mlp"}  # the baselines are binary
    assert sorted(int(h) for h in three["snapshot|trained_mlp"]) == [5, 10, 20, 50]
    for v in three["snapshot|trained_mlp"].values():
        assert (
            0.0 <= v["acc3"] <= 1.0
            and 0.0 <= v["auc_stationary"] <= 1.0
            and 0.0 < v["share_stationary"] < 1.0
        )
    assert "## Three-class by horizon" in m["report"] and "n/a (binary)" in m["report"]
    assert "stat AUC" in m["report"]
    sig = FoldSignal.load(Path(m["path"]) / "fold_signal.npz")
    np.testing.assert_array_equal(sig.probabilities["trained_mlp"], pred["proba"])
    assert set(sig.probabilities) == {"trained_mlp"}
    assert all((sig.labels[h] == 0).any() for h in sig.labels)  # zero moves are class 0 now
    doc = json.loads((Path(m["path"]) / "signal_report.json").read_text())
    c10 = next(
        c for c in doc["cells"] if (c["model"], c["horizon"], c["regime"]) == ("trained_mlp", 10, "all")
    )
    y = sig.labels[10]
    d = np.isfinite(y)
    k = np.where(y[d] > 0, 0, np.where(y[d] < 0, 2, 1))
    assert c10["n3"] == int(d.sum())
    assert c10["acc3"] == pytest.approx(float((np.argmax(pred["proba"][d], axis=1) == k).mean()))
    assert c10["share_stationary"] == pytest.approx(float((k == 1).mean()))
    gbt = [c for c in doc["cells"] if c["model"] == "gbt"]
    assert all(c["acc3"] is None and c["auc_stationary"] is None for c in gbt)
    assert "ES.FUT_snapshot_three_class_by_horizon" in st
    assert "## Three-class by horizon" in st["ES.FUT_snapshot_report"]
