"""What Dagster's event storage costs a full cache hit: the same hit on SQLite and on PostgreSQL
(issue 10, "The path people run"; the instance storage is the supported knob, dagster.yaml).

    .ci/postgres.sh-style server, then:
    PGHOST=... PGPORT=... PGUSER=... python -m benchmarks.bench_hit_storage [--rounds 3] [--raw DIR]

One data root (``benchmarks/bench_dagster_path.copied_root`` over 2024-Q3 of ``--raw``, default
``benchmarks/data/scaleout_scale1``), this checkout, two Dagster homes with the project's
instance settings (``fx_assets_tests.e2e.harness.instance_yaml``): ``sqlite`` (the default
storage) and ``postgres`` (``storage: postgres``, a fresh database on the server of the PG*
variables). Per round, sqlite then postgres (A B A B): ``build_features.execute_in_process`` of
``2024-07|ES.FUT`` in a fresh process with every output present (a full cache hit: refused
otherwise). Figures: Dagster's run duration (RUN_START -> RUN_SUCCESS), the process's wall and
CPU (user + sys of the child), events stored.
"""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path
from typing import Any

from benchmarks.bench_dagster_path import _actions, copied_root, fresh_home, fx_env
from benchmarks.bench_load_path import RAW, _hit_checked, launch_in_process
from benchmarks.common import load_average, rounds_summary, target, write_result

PARTITION = "2024-07|ES.FUT"
QUARTER = "2024-Q3"


def postgres_home(name: str) -> Path:
    """A Dagster home on a fresh database of the PG* server, with the project's instance settings."""
    import psycopg2
    import yaml

    db = f"fx_hit_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(dbname=os.environ.get("PGDATABASE", "postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db}"')
    conn.close()
    home = fresh_home(name)  # the project's settings, SQLite storage: replaced below
    settings = yaml.safe_load((home / "dagster.yaml").read_text())
    settings["storage"] = {
        "postgres": {
            "postgres_db": {
                "hostname": os.environ["PGHOST"],
                "port": int(os.environ["PGPORT"]),
                "username": os.environ["PGUSER"],
                "password": os.environ.get("PGPASSWORD", ""),
                "db_name": db,
                "scheme": "postgresql+psycopg2",
            }
        }
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as inst:  # create the schema once, untimed
        assert "Postgres" in type(inst.run_storage).__name__
        inst.get_runs(limit=1)
    return home


def _events(home: Path, run_id: str) -> int:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as inst:
        return len(inst.all_logs(run_id))


def run(rounds: int, raw: Path) -> dict[str, Any]:
    for var in ("PGHOST", "PGPORT", "PGUSER"):
        if not os.environ.get(var):
            raise SystemExit(f"{var} is not set: start a PostgreSQL server first (.ci/postgres.sh)")
    root = copied_root(raw, QUARTER, "dagster_path_root_q3")
    homes = {"sqlite": fresh_home("hit_storage_sqlite"), "postgres": postgres_home("hit_storage_pg")}
    envs = {k: fx_env(root, h, QUARTER, QUARTER) for k, h in homes.items()}
    prep = {k: launch_in_process(envs[k], h, PARTITION) for k, h in homes.items()}  # builds if needed
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in homes}
    for r in range(rounds):
        for k, home in homes.items():
            m = launch_in_process(envs[k], home, PARTITION)
            m["actions"] = _actions(home, m["run_id"])
            m["events"] = _events(home, m["run_id"])
            m["load_average"] = load_average()
            rows[k].append(_hit_checked(m, f"{k} hit"))
            print(f"round {r + 1} {k}: run {m['run_seconds']} s, wall {m['wall_seconds']} s", flush=True)
    figures = {
        k: {
            key: rounds_summary([m[key] for m in ms], 3)
            for key in ("run_seconds", "wall_seconds", "cpu_seconds")
        }
        for k, ms in rows.items()
    }
    s, p = figures["sqlite"]["run_seconds"]["median"], figures["postgres"]["run_seconds"]["median"]
    figures["postgres_over_sqlite_run"] = round(p / s, 3) if s else None
    return {
        "partition": PARTITION,
        "data": str(raw),
        "events_per_run": rows["sqlite"][0]["events"],
        "prepare_runs": prep,
        "figures": figures,
        "targets": [
            target("sqlite: full cache hit, run duration (median)", s, "<=", 2.0, "s"),
            target("postgres: full cache hit, run duration (median)", p, "<=", 2.0, "s"),
        ],
        "raw": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--raw", type=Path, default=RAW, help="a market holding 2024-Q3 (read only)")
    ap.add_argument("--name", default="bench_hit_storage")
    a = ap.parse_args(argv)
    before = load_average()
    out = run(a.rounds, a.raw.resolve())
    out = {"mode": f"A/B, {a.rounds} rounds", "load_average_before": before, **out}
    out["load_average_after"] = load_average()
    print(write_result(a.name, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
