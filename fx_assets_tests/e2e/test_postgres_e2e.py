"""The flow through a running Dagster once on PostgreSQL (CI: .ci/postgres.sh starts a throw-away
server and sets PG*): ``dagster dev`` on an instance whose ``storage`` is PostgreSQL, features
per partition, a fold backfill, the report, then a new quarter's raw files dropped with automation
on (observed, built, its fold trained and the report refreshed with no other action), then a
webserver + daemon restart with the run history and materializations intact, nothing launched
again, and a new run recorded after it."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fx_assets.definitions import FEATURE_STAGES
from fx_assets_tests.e2e.harness import (
    DagsterDev,
    drop_quarter,
    synth_market,
    tags_of,
    wait_for_folds_and_report,
)
from fx_assets_tests.e2e.phases import Phases

pytestmark = pytest.mark.postgres

QUARTERS = ("2024-01|ES.FUT", "2024-04|ES.FUT")
FOLD = "2024-04|ES.FUT"
NEW_QUARTER, NEW_KEY = "2024-Q3", "2024-07|ES.FUT"  # its fxcache partition and its fold
FEATURES = list(FEATURE_STAGES)


@pytest.fixture
def pg_database() -> Iterator[dict[str, Any]]:
    """A fresh database on the server named by PG* (dropped afterwards)."""
    import psycopg2

    missing = [v for v in ("PGHOST", "PGPORT", "PGUSER") if not os.environ.get(v)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not set: run through .ci/postgres.sh")
    name = f"fx_e2e_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(dbname=os.environ.get("PGDATABASE", "postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    db = {
        "hostname": os.environ["PGHOST"],
        "port": int(os.environ["PGPORT"]),
        "username": os.environ["PGUSER"],
        "password": os.environ.get("PGPASSWORD", ""),
        "db_name": name,
        # SQLAlchemy 2.1 would pick psycopg 3, whose server-side parameters break Dagster's NOTIFY.
        "scheme": "postgresql+psycopg2",
    }
    yield db
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


def run_ids_in_postgres(db: dict[str, Any]) -> dict[str, str]:
    """run_id -> status, read from the database itself (not through Dagster)."""
    import psycopg2

    with psycopg2.connect(dbname=db["db_name"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, status FROM runs")
        return dict(cur.fetchall())


def wait_run(dev: DagsterDev, run_id: str, timeout: float = 240) -> dict:
    from fx_assets_tests.e2e.harness import FINISHED, wait_until

    def done() -> dict | None:
        rs = dev.runs(runIds=[run_id])
        return rs[0] if rs and rs[0]["status"] in FINISHED else None

    run = wait_until(done, timeout, f"run {run_id}", 1.0, dev.log_tail)
    assert run["status"] == "SUCCESS", (run, dev.log_tail())
    return run


def history(dev: DagsterDev) -> dict[str, tuple[str, str]]:
    return {r["runId"]: (r["jobName"], r["status"]) for r in dev.runs()}


def test_dagster_dev_on_postgres_with_restart(pg_database, dagster_dev_factory, tmp_path: Path) -> None:
    # pg_database first: it is torn down (dropped) after dagster dev has stopped.
    phase = Phases()
    dev: DagsterDev = dagster_dev_factory(
        quarters="2024-Q1:2024-Q2",
        train_quarters=1,
        instance_overrides={"storage": {"postgres": {"postgres_db": pg_database}}},
    )
    assert not (dev.home / "history" / "runs.db").exists()  # no SQLite run storage beside it
    # The backfills below build everything; automation off, as a person does in the UI first.
    dev.stop_sensor("fx_automation")
    phase("start")

    # Feature backfill from the build_features job: one run per partition, in quarter order.
    bid = dev.launch_job_backfill("build_features", QUARTERS)
    features = dev.wait_backfill(bid, timeout=300)
    assert features["status"] == "COMPLETED_SUCCESS", features
    assert sorted(tags_of(r)["dagster/partition"] for r in features["runs"]) == list(QUARTERS)
    assert all(r["status"] == "SUCCESS" for r in features["runs"]), features["runs"]
    phase("feature backfill")
    # The fold: an asset backfill of fold_ranges + trained_model, as the asset page launches it.
    bid = dev.launch_asset_backfill(["fold_ranges", "trained_model"], [FOLD])
    fold_backfill = dev.wait_backfill(bid, timeout=240)
    assert fold_backfill["status"] == "COMPLETED_SUCCESS", fold_backfill
    assert all(r["status"] == "SUCCESS" for r in fold_backfill["runs"]), fold_backfill["runs"]
    phase("fold backfill")
    wait_run(dev, dev.launch_run("walk_forward"))
    phase("report")

    for asset in FEATURES:
        assert set(dev.materialized_partitions(asset)) >= set(QUARTERS), asset
    assert FOLD in dev.materialized_partitions("trained_model")
    assert dev.materialized_partitions("walk_forward_report")
    assert (dev.data_root / "reports" / "ES.FUT_walk_forward.png").is_file()

    # A new quarter lands with automation on: observation -> feature chain -> its fold -> report.
    staging = synth_market(tmp_path / "staging", NEW_QUARTER, env=dev.env)
    dev.wait_runs_idle(120)  # the raw-file sensor's observations of the first quarters
    dev.start_sensor("fx_automation")
    drop_quarter(staging, dev.data_root, NEW_QUARTER)
    wait_for_folds_and_report(dev, [NEW_KEY], 600)
    fx = dev.materialized_partitions("fxcache")
    assert fx == {**{k: 1 for k in QUARTERS}, NEW_KEY: 1}, fx  # the new quarter once, nothing rebuilt
    assert dev.materialized_partitions("trained_model") == {FOLD: 1, NEW_KEY: 1}
    phase("new quarter by automation")

    dev.wait_runs_idle(120)
    before = history(dev)
    assert len(before) >= 7 and all(status == "SUCCESS" for _, status in before.values()), before
    in_pg = run_ids_in_postgres(pg_database)
    assert set(before) <= set(in_pg), "runs are not stored in PostgreSQL"
    mats_before = {
        a: dev.materialized_partitions(a) for a in (*FEATURES, "trained_model", "walk_forward_report")
    }
    assert set(mats_before["fxcache"]) == {*QUARTERS, NEW_KEY}

    # Restart (stop, start) webserver and daemon on the same instance: nothing lost, nothing re-run, and the
    # instance still records new runs.
    phase("checks")
    dev.stop()
    phase("stop")
    dev.start()
    phase("start again")
    assert dev.sensor_state("fx_automation") == "RUNNING"
    time.sleep(15)  # several automation and sensor ticks (3 s intervals): they must launch nothing
    dev.wait_runs_idle(60)
    assert history(dev) == before
    assert {a: dev.materialized_partitions(a) for a in mats_before} == mats_before
    after = wait_run(dev, dev.launch_run("walk_forward"))
    assert "dagster/backfill" not in tags_of(after)
    now = history(dev)
    assert set(now) == set(before) | {after["runId"]}
    assert after["runId"] in run_ids_in_postgres(pg_database)
    phase("report after restart")
    phase.report()
