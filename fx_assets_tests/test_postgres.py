"""Production storage: a Dagster instance on PostgreSQL (dagster-postgres, psycopg 3) records the
runs and materializations of the assets. Needs PG* environment variables (.ci/postgres.sh)."""

import datetime as dt
import os
import shutil
import uuid
from pathlib import Path

import dagster as dg
import pytest

from fx_assets.definitions import build_definitions
from fx_assets.partitions import partition_key
from fx_assets.settings import ProjectSettings

pytestmark = pytest.mark.postgres


def test_runs_and_materializations_land_in_postgres(market3: Path, tmp_path: Path) -> None:
    import psycopg2

    for var in ("PGHOST", "PGPORT", "PGUSER"):
        if not os.environ.get(var):
            pytest.fail(f"{var} is not set: run through .ci/postgres.sh")
    db_name = f"dagster_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(dbname=os.environ.get("PGDATABASE", "postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db_name}"')
    conn.close()
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_db:\n"
        f"      hostname: {os.environ['PGHOST']}\n      port: {os.environ['PGPORT']}\n"
        f"      username: {os.environ['PGUSER']}\n      password: {os.environ.get('PGPASSWORD', '')}\n"
        f"      db_name: {db_name}\n      scheme: postgresql+psycopg2\n"
        "telemetry:\n  enabled: false\n"
    )
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = build_definitions(
        ProjectSettings(data_root=root, first_quarter=dt.date(2024, 1, 1), last_quarter=dt.date(2024, 1, 1))
    )
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert "Postgres" in type(inst.run_storage).__name__
        r = dg.materialize(
            list(defs.assets or []),
            selection=["predecoded_trades", "roll_calendar"],
            partition_key=partition_key(dt.date(2024, 1, 1), "ES.FUT"),
            instance=inst,
            resources=dict(defs.resources or {}),
        )
        assert r.success
        assert inst.get_run_by_id(r.run_id) is not None
        ev = inst.get_latest_materialization_event(dg.AssetKey("roll_calendar"))
        assert ev is not None and ev.dagster_event is not None
        assert ev.dagster_event.partition == "2024-01|ES.FUT"
