"""What a feature run pays before its first step, and a full cache hit, with this checkout
against another (issue 10, "The path people run"; the lazy-import change).

    python -m benchmarks.bench_load_path --base DIR [--rounds 3] [--name bench_load_path]

``DIR`` holds the package to compare with (e.g. ``git archive <commit> | tar -x -C DIR``). Each
round runs, for A = ``DIR`` then B = this checkout (A B A B):

- ``import``: ``python -c "import fx_assets.definitions"`` in a fresh process (every run
  process, the webserver and the daemon load the code location this way), wall and CPU
  (user + sys of the child), and which heavy libraries it loaded;
- ``hit``: ``build_features.execute_in_process`` of the partition in a fresh process with every
  output present (a full cache hit of the 7 stages, each output verified, every blocking check
  run): Dagster's run duration, the process's wall and CPU;
- ``cli_hit``: the same hit through ``dagster asset materialize`` (process start, imports,
  the implicit asset job);
- ``warm`` (unless ``--no-warm``): outputs deleted, sidecars and numba caches kept: the 7 stages
  rebuilt.

Data: a data root of links to the one scale-1 ES quarter (2024-Q3, ``book_ratio`` 0.1) built
under ``/work/main/benchmarks/data/scaleout_scale1`` (read only; ``--raw`` to point elsewhere),
built once here first. Both packages derive the same feature code versions (the change moved
imports of the training layer only), so the outputs built by one are hits for the other; the
run refuses to measure if a hit rebuilt anything.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_dagster_path import _actions, _run_stats, delete_outputs, fresh_home, fx_env, launch_cli
from benchmarks.common import DATA, load_average, raw_file, rounds_summary, target, write_result

PY = sys.executable
QUARTER = "2024-Q3"
PARTITION = "2024-07|ES.FUT"
RAW = Path("/work/main/benchmarks/data/scaleout_scale1")
HEAVY = ("torch", "triton", "matplotlib", "lightgbm", "pandas", "scipy", "numba", "pyarrow", "safetensors")
REPO = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def import_once(env: dict[str, str], home: Path) -> dict[str, Any]:
    """The definitions import in a fresh process, run in ``home`` (not in a checkout: ``-c`` and
    ``-m`` put the working directory first on ``sys.path``), and which package it loaded."""
    script = (
        "import json, sys; import fx_assets.definitions; "
        f"print(json.dumps([fx_assets.__file__, sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})]))"
    )
    c0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run([PY, "-c", script], env=env, cwd=home, capture_output=True, text=True, check=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    file, loaded = json.loads(out.stdout.splitlines()[-1])
    if not file.startswith(env["PYTHONPATH"] + "/"):
        raise RuntimeError(f"imported {file}, not the package under {env['PYTHONPATH']}")
    return {"wall_seconds": wall, "cpu_seconds": cpu, "loaded": loaded}


def launch_in_process(env: dict[str, str], home: Path, partition: str) -> dict[str, Any]:
    """``build_features.execute_in_process`` in a fresh process run in ``home`` (see above)."""
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(
        [PY, "-m", "benchmarks.bench_dagster_path", "child", partition],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        check=False,
    )
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise RuntimeError(f"execute_in_process failed:\n{proc.stderr[-4000:]}")
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    return {**_run_stats(home, run_id), "wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)}


def link_root(raw: Path, name: str) -> Path:
    root = DATA / name
    for schema in ("trades", "mbp-10"):
        link = raw_file(root, schema, QUARTER)
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(raw_file(raw, schema, QUARTER).resolve())
    return root


def _hit_checked(m: dict[str, Any], what: str) -> dict[str, Any]:
    built = {k: v for k, v in m["actions"].items() if v != "reused"}
    if m["status"] != "SUCCESS" or built:
        raise RuntimeError(f"{what}: not a full cache hit ({m['status']}, {built})")
    return m


def run(base: Path, rounds: int, warm: bool, raw: Path) -> dict[str, Any]:
    root = link_root(raw, "load_path_root")
    home = fresh_home("load_path_home")
    envs = {
        "A": {**fx_env(root, home, QUARTER, QUARTER), "PYTHONPATH": str(base)},
        "B": fx_env(root, home, QUARTER, QUARTER),
    }
    prep = {k: launch_in_process(e, home, PARTITION) for k, e in envs.items()}  # builds; numba caches
    raw_rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        k: {"import": [], "hit": [], "cli_hit": [], "warm": []} for k in envs
    }
    for r in range(rounds):
        for k, env in envs.items():
            rows = raw_rows[k]
            rows["import"].append(import_once(env, home))
            m = launch_in_process(env, home, PARTITION)
            m["actions"] = _actions(home, m["run_id"])
            rows["hit"].append(_hit_checked(m, f"{k} hit"))
            m = launch_cli(env, home, PARTITION)
            m["actions"] = _actions(home, m["run_id"])
            rows["cli_hit"].append(_hit_checked(m, f"{k} cli hit"))
            if warm:
                delete_outputs(root, QUARTER)
                m = launch_in_process(env, home, PARTITION)
                if m["status"] != "SUCCESS":
                    raise RuntimeError(f"{k} warm: run ended {m['status']}")
                rows["warm"].append(m)
            for ms in rows.values():
                if ms:
                    ms[-1]["load_average"] = load_average()
            print(
                f"round {r + 1} {k}: import {rows['import'][-1]['wall_seconds']:.2f} s, "
                f"hit run {rows['hit'][-1]['run_seconds']} s wall {rows['hit'][-1]['wall_seconds']} s, "
                f"cli hit wall {rows['cli_hit'][-1]['wall_seconds']} s",
                flush=True,
            )
    figures: dict[str, Any] = {}
    for k, rows in raw_rows.items():
        f: dict[str, Any] = {"loaded_by_definitions": rows["import"][0]["loaded"]}
        for what, ms in rows.items():
            if not ms:
                continue
            f[what] = {
                key: rounds_summary([m[key] for m in ms], 3)
                for key in ("run_seconds", "wall_seconds", "cpu_seconds")
                if all(m.get(key) is not None for m in ms)
            }
        figures[k] = f
    hit = figures["B"]["hit"]["run_seconds"]["median"]
    cli = figures["B"]["cli_hit"]["run_seconds"]["median"]
    targets = [
        target("B: full cache hit, execute_in_process run duration (median)", hit, "<=", 2.0, "s"),
        target("B: full cache hit, dagster asset materialize run duration (median)", cli, "<=", 2.0, "s"),
    ]
    return {
        "compared": {"A": str(base), "B": str(REPO)},
        "targets": targets,
        "partition": PARTITION,
        "data": str(raw),
        "prepare_runs": prep,
        "figures": figures,
        "raw": raw_rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="directory holding the package A")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-warm", action="store_true", help="skip the warm rebuilds")
    ap.add_argument("--raw", type=Path, default=RAW, help="data root holding the raw 2024-Q3 files")
    ap.add_argument("--name", default="bench_load_path")
    a = ap.parse_args(argv)
    out = run(a.base.resolve(), a.rounds, not a.no_warm, a.raw)
    out["mode"] = f"A/B, {a.rounds} rounds"
    print(write_result(a.name, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
