"""The code location loads, validates from the CLI, and wires partitions, jobs and resources."""

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from fx_assets.definitions import build_definitions
from fx_assets.settings import ProjectSettings

REPO = Path(__file__).resolve().parents[1]

EXPECTED = {
    "raw_trades",
    "raw_mbp10",
    "predecoded_trades",
    "predecoded_mbp10",
    "roll_calendar",
    "bars",
    "bar_features",
    "ofi_features",
    "fxcache",
    "fold_ranges",
    "trained_model",
    "walk_forward_report",
    "signal_report",
    "signal_report_stitched",
}


def settings(tmp_path: Path, **kw) -> ProjectSettings:
    base = {
        "data_root": tmp_path,
        "symbols": ("ES.FUT", "NQ.FUT"),
        "first_quarter": dt.date(2024, 1, 1),
        "last_quarter": dt.date(2024, 10, 1),
        "train_quarters": 2,
    }
    base.update(kw)
    return ProjectSettings(**base)


def test_graph_and_partitions(tmp_path: Path) -> None:
    defs = build_definitions(settings(tmp_path))
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == EXPECTED
    fx = graph.get(dg.AssetKey("fxcache"))
    assert fx.partitions_def is not None
    assert len(fx.partitions_def.get_partition_keys()) == 8  # 4 quarters x 2 symbols
    tm = graph.get(dg.AssetKey("trained_model"))
    # Folds start once train_quarters quarters of data exist: 2024-Q3 and 2024-Q4.
    assert sorted({str(k).split("|")[0] for k in tm.partitions_def.get_partition_keys()}) == [
        "2024-07",
        "2024-10",
    ]
    assert tm.backfill_policy == dg.BackfillPolicy.single_run()
    parents = {k.to_user_string() for k in graph.get(dg.AssetKey("ofi_features")).parent_keys}
    assert parents == {"bars", "predecoded_mbp10"}
    # every derived asset carries a code version
    for key in EXPECTED - {"raw_trades", "raw_mbp10"}:
        assert graph.get(dg.AssetKey(key)).code_version, key


def test_jobs(tmp_path: Path) -> None:
    defs = build_definitions(settings(tmp_path))
    train = defs.resolve_job_def("train_models")
    assert train.executor_def is dg.in_process_executor
    assert train.tags.get("fx/gpu") == "1"
    assert {"observe_raw", "build_features", "walk_forward"} <= {j.name for j in defs.resolve_all_job_defs()}


def test_too_few_quarters_for_a_fold(tmp_path: Path) -> None:
    defs = build_definitions(settings(tmp_path, last_quarter=dt.date(2024, 4, 1)))
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "trained_model" not in keys and "fxcache" in keys


def test_dagster_cli_validates_workspace(tmp_path: Path) -> None:
    env = dict(os.environ, FX_DATA_ROOT=str(tmp_path), FX_LAST_QUARTER="2024-Q4", DAGSTER_HOME=str(REPO))
    exe = Path(sys.executable).with_name("dagster")
    proc = subprocess.run(
        [str(exe), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_automation_is_on_by_default_and_covers_every_derived_asset(tmp_path: Path) -> None:
    defs = build_definitions(settings(tmp_path))
    sensors = {s.name: s for s in defs.sensors or []}
    assert set(sensors) == {"raw_files_sensor", "fx_automation"}
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in sensors.values())
    graph = defs.resolve_asset_graph()
    # the research reports are run on request (a LightGBM fit per fold and horizon), never automated
    research = {"signal_report", "signal_report_stitched"}
    for key in EXPECTED - {"raw_trades", "raw_mbp10"} - research:
        assert graph.get(dg.AssetKey(key)).automation_condition is not None, key
    for key in research:
        assert graph.get(dg.AssetKey(key)).automation_condition is None, key
    # the GPU limit applies to asset-backfill and automation runs too: a pool, not a job tag
    assert graph.get(dg.AssetKey("trained_model")).pools == {"gpu"}
    yaml_text = (REPO / "dagster.yaml").read_text()
    assert "default_limit: 1" in yaml_text and "key: fx/gpu" in yaml_text


def test_quarters_have_no_fixed_end_by_default(tmp_path: Path) -> None:
    defs = build_definitions(settings(tmp_path, last_quarter=None, symbols=("ES.FUT",)))
    graph = defs.resolve_asset_graph()
    parts = graph.get(dg.AssetKey("fxcache")).partitions_def
    assert parts is not None
    keys = [str(k) for k in parts.get_partition_keys()]
    # runs to the last complete quarter as of now (the clock decides, no configuration)
    assert keys[0] == "2024-01|ES.FUT" and len(keys) >= 4
