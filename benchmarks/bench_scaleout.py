"""When to move beyond one machine: one scale-1 quarter through ``build_features``, the feature
backfill of several quarters on a local Dask cluster with 1 and 2 worker processes, and the
GPU-side needs of training (copied from ``results/gpu_h200.json``, measured on the lent H200).

    python -m benchmarks.bench_scaleout                 # writes benchmarks/results/scaleout.json
    python -m benchmarks.bench_scaleout --skip-scale1   # only the Dask scaling part

Method:

- *Scale-1 quarter*: ``fx-assets synth --quarters 2024-Q3 --scale 1`` (same generator and
  defaults), then one ``build_features`` run of ``2024-07|ES.FUT`` from the ``.dbn.zst`` files
  (no sidecars yet) through ``dg.execute_job`` with the code location's default (in-process)
  executor, in a fresh process; wall time of the run, plus the disk used by raw and derived files.
- *Dask scaling*: 4 quarters at ``--dask-scale``; a backfill of all of them through the
  ``build_features`` job with ``FX_EXECUTOR=dask`` and ``FX_DASK_ADDRESS`` pointing at a
  ``distributed.LocalCluster(processes=True, threads_per_worker=1)`` of 1, then 2 workers. The
  partitions depend on their previous quarter (roll calendar: Q-1's trades; bar and OFI features:
  Q-1's bars), so the backfill goes in three waves, as Dagster's automation groups it: decode; roll
  calendar + bars; bar features + OFI + fxcache. In each wave every quarter is its own run, all
  launched at once (one process each), sharing the cluster. Derived files are removed before each
  worker count.
- The machine's load average is recorded before and after: other work on the same cores slows
  every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DATA, RESULTS, ensure_market, load_average, market_config, write_result

WAVES = (
    ("predecoded_trades", "predecoded_mbp10"),
    ("roll_calendar", "bars"),
    ("bar_features", "ofi_features", "fxcache"),
)
ALL_STAGES = tuple(s for w in WAVES for s in w)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _home(name: str) -> Path:
    home = DATA / f"{name}_dagster_home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # Create the SQLite storage once here: runs started at the same moment would race on it.
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as inst:
        inst.get_runs(limit=1)
    return home


def _env(root: Path, first: str, last: str, home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", DAGSTER_HOME=str(home))
    env.update(FX_DATA_ROOT=str(root), FX_SYMBOLS="ES.FUT", FX_FIRST_QUARTER=first, FX_LAST_QUARTER=last)
    env.pop("FX_EXECUTOR", None)
    env.pop("FX_DASK_ADDRESS", None)
    env.update(extra)
    return env


def _launch(quarter_key: str, stages: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_scaleout",
        "run",
        "--quarter",
        quarter_key,
        "--select",
        ",".join(stages),
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"run failed ({p.args}):\n{stderr[-4000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def run_partition(quarter_key: str, select: list[str]) -> dict[str, Any]:
    """One build_features run of ``quarter_key|ES.FUT`` (this process), restricted to ``select``."""
    import dagster as dg

    from benchmarks import bench_scaleout

    inst = dg.DagsterInstance.get()
    t0 = time.perf_counter()
    with dg.execute_job(
        dg.reconstructable(bench_scaleout.build_features_job),
        instance=inst,
        asset_selection=[dg.AssetKey(s) for s in select],
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
        tags={
            "dagster/partition/quarter": quarter_key,
            "dagster/partition/symbol": "ES.FUT",
            "dagster/partition": f"{quarter_key}|ES.FUT",
        },
    ) as result:
        ok = result.success
        n = len(result.get_asset_materialization_events())
    seconds = time.perf_counter() - t0
    if not ok:
        raise RuntimeError(f"build_features {quarter_key} {select} failed")
    return {"quarter": quarter_key, "stages": select, "materializations": n, "seconds": round(seconds, 2)}


def build_features_job() -> Any:
    from fx_assets.definitions import build_definitions
    from fx_assets.settings import load_settings

    return build_definitions(load_settings()).resolve_job_def("build_features")


def scale1_quarter() -> dict[str, Any]:
    config = market_config(["2024-Q3"], 1.0, 0.1)
    t0 = time.perf_counter()
    root = ensure_market("scaleout_scale1", config)
    synth_s = time.perf_counter() - t0
    shutil.rmtree(root / "derived", ignore_errors=True)
    env = _env(root, "2024-Q3", "2024-Q3", _home("scaleout_scale1"))
    t0 = time.perf_counter()
    (run,) = _wait([_launch("2024-07", ALL_STAGES, env)])
    wall = time.perf_counter() - t0
    manifest = json.loads((root / "bench_manifest.json").read_text())["report"]
    return {
        "market": config,
        "market_report": {k: v for k, v in manifest.items() if k != "files"},
        "synth_or_reuse_seconds": round(synth_s, 1),
        "executor": "in_process (code location default: one process per run)",
        "run_seconds": run["seconds"],
        "process_wall_seconds": round(wall, 2),
        "materializations": run["materializations"],
        "raw_bytes": _du(root / "raw"),
        "derived_bytes": _du(root / "derived"),
    }


def dask_scaling(scale: float, quarters: list[str], workers_list: list[int]) -> dict[str, Any]:
    from distributed import LocalCluster

    from fx_assets.core.calendar import parse_quarter

    config = market_config(quarters, scale, 0.1)
    root = ensure_market(f"scaleout_dask_{len(quarters)}q", config)
    keys = [parse_quarter(q).strftime("%Y-%m") for q in quarters]
    out: dict[str, Any] = {"market": config, "runs": {}}
    for workers in workers_list:
        shutil.rmtree(root / "derived", ignore_errors=True)
        # The workers rebuild the job from *their* environment (fx_assets.settings), so they
        # are started with the same FX_* settings as the runs.
        os.environ.update(
            {k: v for k, v in _env(root, quarters[0], quarters[-1], DATA).items() if k.startswith("FX_")}
        )
        with LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster:
            env = _env(
                root,
                quarters[0],
                quarters[-1],
                _home(f"scaleout_dask{workers}"),
                FX_EXECUTOR="dask",
                FX_DASK_ADDRESS=cluster.scheduler_address,
            )
            waves = []
            t0 = time.perf_counter()
            for stages in WAVES:
                tw = time.perf_counter()
                runs = _wait([_launch(k, stages, env) for k in keys])
                waves.append(
                    {"stages": list(stages), "seconds": round(time.perf_counter() - tw, 2), "runs": runs}
                )
            total = time.perf_counter() - t0
        out["runs"][str(workers)] = {
            "workers": workers,
            "backfill_seconds": round(total, 2),
            "per_quarter_seconds": round(total / len(keys), 2),
            "waves": waves,
            "load_average_after": load_average(),
        }
    one, two = out["runs"].get("1"), out["runs"].get("2")
    if one and two:
        out["speedup_2_vs_1"] = round(one["backfill_seconds"] / two["backfill_seconds"], 2)
    return out


def gpu_side() -> dict[str, Any]:
    """Training needs, from the H200 measurements already recorded (not re-measured here)."""
    path = RESULTS / "gpu_h200.json"
    g = json.loads(path.read_text())
    files = g["load"]["files"]
    return {
        "source": str(path.relative_to(RESULTS.parent.parent)),
        "gpu": g["machine"]["gpu"],
        "fxcache_bytes_per_scale1_quarter": g["load"]["value_bytes"] // files,
        "quarters_loaded": files,
        "load_end_to_end_GBps": round(g["figures"]["load_end_to_end_GBps"], 1),
        "fold_transition_ms": round(g["figures"]["fold_transition_ms"], 2),
        "walk_forward_3_folds_10_epochs_s": {
            "mlp": round(g["walk_forward"]["mlp_total_s"], 1),
            "dqn": round(g["walk_forward"]["dqn_total_s"], 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_scaleout")
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="(internal) one build_features run in this process")
    r.add_argument("--quarter", required=True)
    r.add_argument("--select", required=True)
    p.add_argument("--skip-scale1", action="store_true")
    p.add_argument("--dask-scale", type=float, default=0.25)
    p.add_argument("--dask-quarters", default="2024-Q1,2024-Q2,2024-Q3,2024-Q4")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--name", default="scaleout")
    args = p.parse_args(argv)
    if args.cmd == "run":
        print(json.dumps(run_partition(args.quarter, args.select.split(","))))
        return 0
    result: dict[str, Any] = {
        "command": "python -m benchmarks.bench_scaleout "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "load_average_before": load_average(),
        "uptime_before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    if not args.skip_scale1:
        result["scale1_quarter"] = scale1_quarter()
        print(f"[scaleout] scale-1 quarter: {result['scale1_quarter']['run_seconds']} s", file=sys.stderr)
    result["dask"] = dask_scaling(
        args.dask_scale, args.dask_quarters.split(","), [int(w) for w in args.workers.split(",")]
    )
    result["gpu_side"] = gpu_side()
    result["load_average_after"] = load_average()
    result["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    path = write_result(args.name, result)
    print(json.dumps({"written": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
