"""The three ways people use the code location, through a running ``dagster dev`` and GraphQL.

One instance for the module, tests in file order (each builds on the previous): the raw
folders start with 2024-Q1..Q4 of a tiny ES market; declarative automation is switched off (as
a person would, in the UI) while the backfills run and switched on for the new-data tests.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fx_assets_tests.e2e.harness import (
    DagsterDev,
    drop_quarter,
    synth_market,
    tags_of,
    wait_for_folds_and_report,
    wait_until,
)

QUARTERS = ["2024-01", "2024-04", "2024-07", "2024-10"]
KEYS = [f"{q}|ES.FUT" for q in QUARTERS]
FOLDS = ["2024-07|ES.FUT", "2024-10|ES.FUT"]
AUTOMATION = "fx_automation"


@pytest.fixture(scope="module")
def dev(e2e_dagster: DagsterDev) -> DagsterDev:
    e2e_dagster.stop_sensor(AUTOMATION)
    return e2e_dagster


@pytest.fixture(scope="module")
def staging(tmp_path_factory: pytest.TempPathFactory, e2e_dagster: DagsterDev) -> Path:
    """2025-Q1..Q3 of the same market, written aside, to be dropped into the raw folders."""
    root = tmp_path_factory.mktemp("staging")
    return synth_market(root, "2025-Q1:2025-Q3", env=e2e_dagster.env)


def no_failed_runs(dev: DagsterDev) -> list[dict]:
    runs = dev.runs()
    failed = [(r["runId"], r["jobName"]) for r in runs if r["status"] != "SUCCESS"]
    assert not failed, f"runs not successful: {failed}\n{dev.log_tail()}"
    return runs


def test_raw_files_are_observed_without_any_action(dev: DagsterDev) -> None:
    for asset in ("raw_trades", "raw_mbp10"):
        wait_until(lambda a=asset: set(KEYS) <= dev.observed_partitions(a), 90, f"{asset} observed")
    runs = dev.wait_runs_idle(60)
    assert {r["jobName"] for r in runs} == {"observe_raw"}


def test_feature_backfill_runs_one_run_per_partition(dev: DagsterDev) -> None:
    bid = dev.launch_job_backfill("build_features", KEYS)
    b = dev.wait_backfill(bid, 600)
    assert b["status"] == "COMPLETED_SUCCESS", b
    assert len(b["runs"]) == len(KEYS)
    assert sorted(tags_of(r)["dagster/partition"] for r in b["runs"]) == KEYS
    assert all(r["status"] == "SUCCESS" for r in b["runs"])
    for asset in ("predecoded_trades", "predecoded_mbp10", "bars", "fxcache"):
        assert set(KEYS) <= set(dev.materialized_partitions(asset)), asset
    no_failed_runs(dev)


def test_materializing_a_partitions_stages_from_the_asset_page_is_one_run_in_one_process(
    dev: DagsterDev,
) -> None:
    """The asset page's Materialize of the 7 stages of one partition (the implicit asset job,
    as the UI launches it): one run, every step in the same process, checks included."""
    import dagster as dg

    from fx_assets.definitions import FEATURE_STAGES

    before = {r["runId"] for r in dev.runs()}
    run_id = dev.launch_run(
        "__ASSET_JOB",
        asset_selection=FEATURE_STAGES,
        tags={
            "dagster/partition": KEYS[1],
            "dagster/partition/quarter": QUARTERS[1],
            "dagster/partition/symbol": "ES.FUT",
        },
    )
    runs = dev.wait_runs_idle(300)
    # the one run holds all of it (observe_raw runs of the raw sensor may come and go)
    assert {r["runId"] for r in runs if r["jobName"] != "observe_raw"} - before == {run_id}
    (run,) = [r for r in runs if r["runId"] == run_id]
    assert run["status"] == "SUCCESS", dev.log_tail()
    with dg.DagsterInstance.from_config(str(dev.home)) as inst:
        starts = [
            e
            for e in inst.all_logs(run_id)
            if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_START"
        ]
    keys = {e.step_key for e in starts}
    assert set(FEATURE_STAGES) <= keys and "bars_volume_conserved" in keys
    assert len({e.dagster_event.pid for e in starts if e.dagster_event is not None}) == 1


def test_fold_backfill_from_the_jobs_page_trains_every_fold_in_one_run(dev: DagsterDev) -> None:
    before = dev.materialized_partitions("trained_model")
    bid = dev.launch_job_backfill("train_models", FOLDS)
    b = dev.wait_backfill(bid, 600)
    assert b["status"] == "COMPLETED_SUCCESS", b
    assert len(b["runs"]) == 1, b["runs"]
    tags = tags_of(b["runs"][0])
    assert tags["fx/gpu"] == "1"
    assert (tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]) == (
        FOLDS[0],
        FOLDS[-1],
    )
    after = dev.materialized_partitions("trained_model")
    assert all(after.get(k, 0) == before.get(k, 0) + 1 for k in FOLDS), (before, after)
    meta = dev.latest_metadata("trained_model", FOLDS[-1])
    # 2 folds over 2024-Q1..Q4 (train_quarters=2): each quarter uploaded once in the run.
    assert meta["uploads"] == 4, meta
    no_failed_runs(dev)


def test_fold_backfill_from_the_asset_page_trains_every_fold_in_one_run(dev: DagsterDev) -> None:
    before = dev.materialized_partitions("trained_model")
    bid = dev.launch_asset_backfill(["trained_model"], FOLDS)
    b = dev.wait_backfill(bid, 600)
    assert b["status"] == "COMPLETED_SUCCESS", b
    assert len(b["runs"]) == 1, b["runs"]
    after = dev.materialized_partitions("trained_model")
    assert all(after.get(k, 0) == before.get(k, 0) + 1 for k in FOLDS), (before, after)
    assert dev.latest_metadata("trained_model", FOLDS[-1])["uploads"] == 4
    no_failed_runs(dev)


def test_a_new_quarter_is_built_trained_and_reported_by_itself(dev: DagsterDev, staging: Path) -> None:
    dev.start_sensor(AUTOMATION)
    n_before = len(dev.runs())
    fx_before = dev.materialized_partitions("fxcache")  # earlier tests may have rebuilt some
    drop_quarter(staging, dev.data_root, "2025-Q1")
    wait_for_folds_and_report(dev, ["2025-01|ES.FUT"], 600)
    fx = dev.materialized_partitions("fxcache")
    assert fx["2025-01|ES.FUT"] == 1
    assert all(fx[k] == fx_before[k] for k in KEYS), (fx_before, fx)  # old quarters were not rebuilt
    runs = no_failed_runs(dev)
    assert len(runs) > n_before


def test_two_quarters_landing_together_are_built_in_order(dev: DagsterDev, staging: Path) -> None:
    drop_quarter(staging, dev.data_root, "2025-Q2")
    drop_quarter(staging, dev.data_root, "2025-Q3")
    wait_for_folds_and_report(dev, ["2025-04|ES.FUT", "2025-07|ES.FUT"], 900)
    fx = dev.materialized_partitions("fxcache")
    assert fx["2025-04|ES.FUT"] == 1 and fx["2025-07|ES.FUT"] == 1, fx
    # in order: the later quarter's features were computed after the earlier quarter's bars
    bars = dev.materialization_times("bars")
    feats = dev.materialization_times("bar_features")
    assert feats["2025-07|ES.FUT"][0] > bars["2025-04|ES.FUT"][0]
    assert dev.materialization_times("trained_model")["2025-07|ES.FUT"][0] > max(
        dev.materialization_times("fxcache")["2025-04|ES.FUT"]
    )
    no_failed_runs(dev)


def test_a_restart_launches_nothing_twice(dev: DagsterDev) -> None:
    before = {r["runId"] for r in dev.runs()}
    mats = {a: dev.materialized_partitions(a) for a in ("fxcache", "trained_model")}
    dev.restart()
    # Several ticks of every sensor (3 s intervals, 5 s daemon loops in the e2e instance).
    assert dev.sensor_state(AUTOMATION) == "RUNNING"
    time.sleep(15)
    runs = dev.wait_runs_idle(60)
    new = [(r["jobName"], r["status"]) for r in runs if r["runId"] not in before]
    assert new == [], new
    assert {a: dev.materialized_partitions(a) for a in mats} == mats
    no_failed_runs(dev)


BACKFILL_COUNTS = """
query Counts($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill {
  assetBackfillData { assetBackfillStatuses { ... on AssetPartitionsStatusCounts {
    assetKey { path } numPartitionsTargeted numPartitionsMaterialized numPartitionsFailed } } } } } }"""


def ensure_folds_can_train(dev: DagsterDev) -> None:
    """fxcache of every quarter and the folds' ranges exist (built here when this test runs alone)."""
    missing = [k for k in KEYS if k not in dev.materialized_partitions("fxcache")]
    if missing:
        b = dev.wait_backfill(dev.launch_job_backfill("build_features", missing), 600)
        assert b["status"] == "COMPLETED_SUCCESS", b
    if not set(FOLDS) <= set(dev.materialized_partitions("fold_ranges")):
        b = dev.wait_backfill(dev.launch_asset_backfill(["fold_ranges"], FOLDS), 300)
        assert b["status"] == "COMPLETED_SUCCESS", b


def test_a_partial_fold_backfill_is_reported_as_failed(dev: DagsterDev, tmp_path: Path) -> None:
    """Last in the module: it leaves a failed run. Two folds in one run; the last fold's ranges
    file is gone from disk (the only input of that fold alone), so that fold raises inside the run
    while the first one succeeds."""
    if dev.sensor_state(AUTOMATION) == "RUNNING":
        dev.stop_sensor(AUTOMATION)  # nothing may rebuild the file or react to the failure
    dev.wait_runs_idle(300)
    ensure_folds_can_train(dev)
    ranges_dir = dev.data_root / "derived" / "fold_ranges" / "ES.FUT"
    gone = sorted(ranges_dir.glob("ES.FUT_2024-Q4.*"))
    assert gone, f"no fold ranges of 2024-Q4 under {ranges_dir}"
    before = dev.materialized_partitions("trained_model")
    for f in gone:
        f.rename(tmp_path / f.name)
    try:
        bid = dev.launch_asset_backfill(["trained_model"], FOLDS)
        b = dev.wait_backfill(bid, 600)
    finally:
        for f in gone:
            (tmp_path / f.name).rename(f)
    assert b["status"] != "COMPLETED_SUCCESS" and b["status"] in ("COMPLETED_FAILED", "FAILED"), b
    assert [r["status"] for r in b["runs"]] == ["FAILURE"], b["runs"]
    after = dev.materialized_partitions("trained_model")
    grew = {k for k in after if after[k] > before.get(k, 0)}
    assert grew == {FOLDS[0]}, (before, after)
    counts = dev.gql(BACKFILL_COUNTS, {"id": bid})["partitionBackfillOrError"]["assetBackfillData"]
    (tm,) = [c for c in counts["assetBackfillStatuses"] if c["assetKey"]["path"] == ["trained_model"]]
    assert (tm["numPartitionsTargeted"], tm["numPartitionsMaterialized"], tm["numPartitionsFailed"]) == (
        2,
        1,
        1,
    ), tm
