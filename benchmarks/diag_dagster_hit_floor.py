"""Where a full cache hit through Dagster spends its time, and the floor of each way to shape the
feature partition's steps (issue 10: "a full cache hit of all 7 stages ≤ 2 s end to end").

    python -m benchmarks.diag_dagster_hit_floor [--rounds 5] [--profile]
    # writes results/diag_dagster_hit_floor.json

``floor``: the same 7 partitioned assets and 7 blocking checks (the feature graph's edges, each
body returning a fixed ``MaterializeResult`` / ``AssetCheckResult``: no work of ours), run with
``execute_in_process`` on an instance with the project's dagster.yaml settings (SQLite storage in
a fresh home), in three shapes, alternating A B C in every round:

- ``14_steps``: 7 ``@asset`` and 7 ``@asset_check`` (today's graph: a step each);
- ``7_steps``: the checks in their asset's ``check_specs`` (one step per asset);
- ``1_step``: one ``@multi_asset(specs=7, check_specs=7, can_subset=True)``.

Per shape: run duration (RUN_START → RUN_SUCCESS), CPU seconds of ``execute_in_process`` in this
process, wall seconds, events stored. Then one check of the ``1_step`` shape run alone (what it
materializes and its events). Whatever our asset bodies do comes on top of these figures.

``--profile``: one real full-cache-hit run of ``build_features`` on the data root and Dagster
home that ``benchmarks.bench_dagster_path --states hit --raw DIR`` left (``--root``/``--home``),
in a fresh process, under ``cProfile`` with a CPU timer: CPU seconds in event storage, in
Dagster's per-step input data-version lookups, in resource initialisation, in ``create_run``
(the planned events, before RUN_START) and in our own code (every ``fx_assets`` function called
from outside the package: the asset and check bodies), and per step from the stored events the
step's duration. cProfile inflates CPU (about 1.5x here): compare the shares, not the seconds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg

from benchmarks.common import DATA, load_average, write_result
from fx_assets.definitions import FEATURE_STAGES

PARTITIONS = ("2024-07|ES.FUT", "2024-04|ES.FUT")
NAMES = FEATURE_STAGES
DEPS = {
    "predecoded_trades": ["raw_trades"],
    "predecoded_mbp10": ["raw_mbp10"],
    "roll_calendar": ["predecoded_trades"],
    "bars": ["roll_calendar", "predecoded_trades"],
    "bar_features": ["bars"],
    "ofi_features": ["bars", "predecoded_mbp10"],
    "fxcache": ["bars", "bar_features", "ofi_features"],
}
SHAPES = ("14_steps", "7_steps", "1_step")


def _defs(shape: str):
    """The 7 stages and their 7 checks in ``shape``; bodies return fixed results."""
    parts = dg.StaticPartitionsDefinition(list(PARTITIONS))
    raw = [dg.AssetSpec(k, partitions_def=parts) for k in ("raw_trades", "raw_mbp10")]
    meta = {"action": "reused", "path": dg.MetadataValue.path("/x"), "bars": 123, "cache_key": "ab" * 8}

    def mat(name: str) -> dg.MaterializeResult:
        return dg.MaterializeResult(asset_key=name, metadata=meta, data_version=dg.DataVersion(f"v-{name}"))

    def chk(name: str) -> dg.AssetCheckResult:
        return dg.AssetCheckResult(
            asset_key=name, check_name="ok", passed=True, metadata={"verdict": "reused"}
        )

    assets: list = []
    checks: list = []
    if shape == "1_step":
        specs = [
            dg.AssetSpec(n, deps=DEPS[n], code_version="c1", partitions_def=parts, skippable=True)
            for n in NAMES
        ]

        @dg.multi_asset(
            specs=specs,
            check_specs=[dg.AssetCheckSpec("ok", asset=n, blocking=True) for n in NAMES],
            can_subset=True,
            partitions_def=parts,
            name="stages",
        )
        def stages(context: dg.AssetExecutionContext):
            for n in NAMES:
                if dg.AssetKey(n) in context.selected_asset_keys:
                    yield mat(n)
                if dg.AssetCheckKey(dg.AssetKey(n), "ok") in context.selected_asset_check_keys:
                    yield chk(n)

        assets = [stages]
    else:
        for n in NAMES:
            own = [dg.AssetCheckSpec("ok", asset=n, blocking=True)] if shape == "7_steps" else None
            assets.append(_asset(n, parts, own, mat, chk))
            if shape == "14_steps":
                checks.append(_check(n, parts, chk))
    return dg.Definitions(
        assets=[*raw, *assets],
        asset_checks=checks,
        jobs=[dg.define_asset_job("j", selection=list(NAMES))],
        executor=dg.in_process_executor,
    )


def _asset(name, parts, own_checks, mat, chk):
    @dg.asset(name=name, partitions_def=parts, deps=DEPS[name], code_version="c1", check_specs=own_checks)
    def body(context: dg.AssetExecutionContext):
        yield mat(name)
        if own_checks:
            yield chk(name)

    return body


def _check(name, parts, chk):
    @dg.asset_check(asset=name, name="ok", blocking=True, partitions_def=parts)
    def body(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        return chk(name)

    return body


def _run(job, inst) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    r = job.execute_in_process(
        instance=inst,
        partition_key=PARTITIONS[0],
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = inst.get_run_stats(r.run_id)
    logs = inst.all_logs(r.run_id)
    in_run = [e for e in logs if st.start_time <= e.timestamp <= st.end_time]
    return {
        "run_seconds": round(st.end_time - st.start_time, 3),
        "wall_seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "events": len(logs),
        "events_in_run": len(in_run),
        "steps": st.steps_succeeded,
        "materializations": st.materializations,
        "check_evaluations": sum(1 for e in logs if e.dagster_event_type.value == "ASSET_CHECK_EVALUATION"),
        "load_average": load_average()[0],
    }


def floor(rounds: int) -> dict[str, Any]:
    from fx_assets_tests.e2e.harness import instance_yaml

    home = Path(tempfile.mkdtemp(prefix="hit_floor_home_", dir=DATA))
    (home / "dagster.yaml").write_text(instance_yaml())
    defs = {s: _defs(s) for s in SHAPES}
    jobs = {s: d.resolve_job_def("j") for s, d in defs.items()}
    raw: dict[str, list[dict[str, Any]]] = {s: [] for s in SHAPES}
    with dg.DagsterInstance.from_config(str(home)) as inst:
        _run(jobs["14_steps"], inst)  # warm-up: imports, the storage's tables
        for r in range(rounds):
            for s in SHAPES:
                m = _run(jobs[s], inst)
                raw[s].append(m)
                print(
                    f"round {r + 1} {s}: run {m['run_seconds']} s, cpu {m['cpu_seconds']} s, "
                    f"{m['events']} events, load {m['load_average']}",
                    flush=True,
                )
        alone = jobs["1_step"].get_subset(
            asset_selection=set(), asset_check_selection={dg.AssetCheckKey(dg.AssetKey("bars"), "ok")}
        )
        check_alone = _run(alone, inst)
    out: dict[str, Any] = {}
    for s, ms in raw.items():
        out[s] = {
            k: _summary([m[k] for m in ms])
            for k in ("run_seconds", "cpu_seconds", "wall_seconds", "events", "events_in_run", "steps")
        }
        out[s]["seconds_per_event_in_run"] = round(
            statistics.median(m["run_seconds"] / m["events_in_run"] for m in ms), 4
        )
    med = {s: out[s]["run_seconds"]["median"] for s in SHAPES}
    return {
        "home": str(home),
        "figures": out,
        "ratios": {
            "14_steps_over_1_step_run": round(med["14_steps"] / med["1_step"], 3),
            "14_steps_over_7_steps_run": round(med["14_steps"] / med["7_steps"], 3),
        },
        "one_check_alone_1_step": check_alone,
        "raw": raw,
    }


def _summary(vals: list[float]) -> dict[str, Any]:
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "rounds": len(vals)}


# --- profile of a real hit ---------------------------------------------------------------------


def profile_child(out: str) -> None:
    """(child) one hit of build_features under cProfile (CPU timer); writes the stats to ``out``."""
    import cProfile

    from fx_assets.definitions import defs

    job = defs.resolve_job_def("build_features")
    inst = dg.DagsterInstance.get()
    prof = cProfile.Profile(time.process_time)
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    r = job.execute_in_process(
        instance=inst,
        partition_key="2024-07|ES.FUT",
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
        raise_on_error=True,
    )
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    prof.dump_stats(out)
    print(json.dumps({"run_id": r.run_id, "wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)}))


def _ours(stats) -> tuple[float, dict[str, float]]:
    """CPU seconds in fx_assets functions entered from outside the package, by function."""
    by: dict[str, float] = {}
    for func, (_cc, _nc, _tt, _ct, callers) in stats.stats.items():
        if "/fx_assets/" not in func[0]:
            continue
        for caller, edge in callers.items():
            if "/fx_assets/" not in caller[0]:
                name = f"{Path(func[0]).parent.name}/{Path(func[0]).name}:{func[2]}"
                by[name] = by.get(name, 0.0) + edge[3]
    return sum(by.values()), dict(sorted(((k, round(v, 3)) for k, v in by.items()), key=lambda kv: -kv[1]))


def _cum(stats, file_part: str, name: str) -> float:
    return sum(v[3] for f, v in stats.stats.items() if file_part in f[0] and f[2] == name)


def profile(root: Path, home: Path) -> dict[str, Any]:
    import pstats

    from benchmarks.bench_dagster_path import SYMBOL, _run_split, fx_env

    env = fx_env(root, home, "2024-Q3", "2024-Q3")
    with tempfile.NamedTemporaryFile(suffix=".prof", delete=False) as f:
        out = f.name
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.diag_dagster_hit_floor", "profile-child", out],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-4000:])
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = pstats.Stats(out)
    os.unlink(out)
    ours, by = _ours(stats)
    total = child["cpu_seconds"]
    parts = {
        "create_run (planned events, before RUN_START)": _cum(stats, "runs/run_domain.py", "create_run"),
        "event storage (store_event, every event)": _cum(stats, "sqlite_event_log.py", "store_event"),
        "input data versions (per asset step)": _cum(
            stats, "data_version_cache.py", "fetch_external_input_asset_version_info"
        ),
        "resource initialisation": _cum(
            stats, "resources_init.py", "resource_initialization_event_generator"
        ),
        "ours (asset and check bodies)": ours,
    }
    with dg.DagsterInstance.from_config(str(home)) as inst:
        logs = inst.all_logs(child["run_id"])
    steps: dict[str, dict[str, float]] = {}
    first: dict[str, float] = {}
    for e in logs:
        t, k = e.dagster_event_type.value, e.step_key
        if t == "STEP_START":
            first[k] = e.timestamp
        elif t == "STEP_OUTPUT" and k in first and k not in steps:
            steps[k] = {"start_to_output": round(e.timestamp - first[k], 3)}
        elif t == "STEP_SUCCESS" and k in first:
            steps.setdefault(k, {})["step_seconds"] = round(e.timestamp - first[k], 3)
    return {
        "partition": f"2024-07|{SYMBOL}",
        "data_root": str(root),
        "execute_in_process": child,
        "split": _run_split(home, child["run_id"]),
        "cpu_seconds_profiled": {k: round(v, 3) for k, v in parts.items()},
        "cpu_share": {k: round(v / total, 3) for k, v in parts.items()},
        "ours_by_entry": dict(list(by.items())[:25]),
        "steps": steps,
        "note": "cumulative CPU under cProfile (inflated ~1.5x); event storage overlaps resource "
        "initialisation (its two events) and create_run (the 14 planned events)",
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["profile-child"]:
        profile_child(argv[1])
        return 0
    p = argparse.ArgumentParser(prog="benchmarks.diag_dagster_hit_floor")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="also profile a real hit (needs --root/--home)")
    p.add_argument("--root", type=Path, default=DATA / "dagster_path_root_q3")
    p.add_argument("--home", type=Path, default=DATA / "dagster_path_home")
    p.add_argument("--name", default="diag_dagster_hit_floor")
    args = p.parse_args(argv)
    before = load_average()
    result: dict[str, Any] = {
        "command": "python -m benchmarks.diag_dagster_hit_floor " + " ".join(argv),
        "load_average_before": before,
        "floor": floor(args.rounds),
    }
    if args.profile:
        result["profile"] = profile(args.root.resolve(), args.home.resolve())
    result["load_average_after"] = load_average()
    path = write_result(args.name, result)
    print(json.dumps({"written": str(path), "ratios": result["floor"]["ratios"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
