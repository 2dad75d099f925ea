"""Where the non-OFI warm stages spend their time (issue 10: roll_calendar, bars, bar_features,
fxcache), as ``bench_features`` runs them.

Each round is a fresh process running ``bench_features._asset_stages`` (the 7 stages through
the calls their asset bodies make) on a data root built by ``bench_features`` (its
``stages_2q``; the quarter's outputs are removed first), with the functions those stages call
wrapped (module globals replaced for the run): per stage and per function, the calls' wall
time, the process CPU time (``getrusage``, every thread) and the minor page faults while they
ran. Parts: reading inputs (``read_table``, ``_load_bars``, ``require_sidecar``), the core
function, the asset checks, writing (``write_table`` and its ``table_checksums``,
``write_fxcache`` and its read-back ``verify_written_fxcache``). Nested calls are counted in
their callers too. ``first_numba_call_s``: CPU and wall of the process's first call of a
cached numba kernel (numba's target context and, through its BLAS probe, ``scipy.linalg`` are
loaded then), measured before the stages in a second process, so that the stage that comes
first (roll_calendar) is seen with and without it.

    python -m benchmarks.diag_stages_split [ROOT] [--rounds N]

Prints one JSON object (also written to benchmarks/results/diag_stages_split.json).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import DATA, load_average, write_result

MODULE = "benchmarks.diag_stages_split"
QUARTER = "2024-Q3"
#: module -> functions wrapped (those missing in a checkout are left out)
WRAPPED: dict[str, tuple[str, ...]] = {
    "fx_assets.core.roll": ("roll_calendar_from_sidecars", "_sidecar_session_volume", "_is_sorted"),
    "fx_assets.core.tables": ("read_table", "write_table", "table_checksums"),
    "fx_assets.core.bar_rows": (
        "sidecar_bars",
        "quarter_bar_features",
        "assemble_fxcache_columns",
        "_all_finite_rows",
        "book_mid_asof",
    ),
    "fx_assets.core.bar_features": ("validate_features",),
    "fx_assets.core.fxcache": ("write_fxcache",),
    "fx_assets.core.verified": ("verify_written_fxcache", "fxcache_identity", "verify_once"),
    "fx_assets.core.verify": ("bar_volume_totals",),
    "fx_assets.assets.common": ("require_sidecar",),
    "fx_assets.assets.features": ("_load_bars", "_book", "warmup_bars"),
}
STAGES = ("roll_calendar", "bars", "bar_features", "fxcache")


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def _round(root: str, first_call: str) -> dict[str, Any]:
    """One round in this (fresh) process: per stage, per wrapped function [calls, wall, cpu, faults]."""
    import numpy as np

    import benchmarks.bench_features as bf

    first: dict[str, float] = {}
    if first_call == "before":
        from fx_assets.core import roll

        t, (c, _) = time.perf_counter(), _usage()
        roll._is_sorted_nb(np.arange(4, dtype=np.int64))
        first = {"wall_s": round(time.perf_counter() - t, 4), "cpu_s": round(_usage()[0] - c, 4)}
    stage = ["setup"]
    acc: dict[str, dict[str, list[float]]] = {}

    def wrap(mod: Any, name: str) -> None:
        fn = getattr(mod, name)
        key = f"{mod.__name__.rsplit('.', 1)[-1]}.{name}"

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            t, (c, f) = time.perf_counter(), _usage()
            try:
                return fn(*a, **k)
            finally:
                c2, f2 = _usage()
                e = acc.setdefault(stage[0], {}).setdefault(key, [0, 0.0, 0.0, 0])
                e[0] += 1
                e[1] += time.perf_counter() - t
                e[2] += c2 - c
                e[3] += f2 - f

        setattr(mod, name, timed)

    for modname, names in WRAPPED.items():
        mod = importlib.import_module(modname)
        for name in names:
            if hasattr(mod, name):
                wrap(mod, name)
    # the stage loop calls _cpu_s before and after each stage, in FEATURE_STAGES order
    from fx_assets import definitions

    order = list(definitions.FEATURE_STAGES)
    marks: list[int] = []
    cpu_s: Callable[[], float] = bf._cpu_s

    def marking_cpu_s() -> float:
        marks.append(_usage()[1])
        n = len(marks)  # 1: before all; then (before, after) per stage
        stage[0] = order[(n - 2) // 2] if n >= 2 and n % 2 == 0 and (n - 2) // 2 < len(order) else "between"
        return cpu_s()

    bf._cpu_s = marking_cpu_s
    res = bf._asset_stages(root, QUARTER)
    faults = {s: marks[2 + 2 * i] - marks[1 + 2 * i] for i, s in enumerate(order)}
    return {
        "wall": res["wall"],
        "cpu": res["cpu"],
        "minflt": faults,
        "first_numba_call": first,
        "split": {
            s: {k: [int(v[0]), round(v[1], 4), round(v[2], 4), int(v[3])] for k, v in d.items()}
            for s, d in acc.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("root", nargs="?", default=str(DATA / "stages_2q"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--round", choices=("plain", "before"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.round:
        print(json.dumps(_round(args.root, args.round)))
        return 0
    from benchmarks.bench_features import _clear_outputs

    load_before = load_average()
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "before": []}
    for _ in range(args.rounds):
        for mode in runs:
            _clear_outputs(Path(args.root), QUARTER)
            proc = subprocess.run(
                [sys.executable, "-m", MODULE, args.root, "--round", mode],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    plain = runs["plain"]

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 4)

    split: dict[str, Any] = {}
    for s in STAGES:
        names = sorted({k for r in plain for k in r["split"].get(s, {})})
        split[s] = {
            "wall_s": med([r["wall"][s] for r in plain]),
            "cpu_s": med([r["cpu"][s] for r in plain]),
            "minflt": med([r["minflt"][s] for r in plain]),
            "calls (median of rounds: calls, wall s, cpu s, minor faults)": {
                k: [med([r["split"][s][k][i] for r in plain if k in r["split"].get(s, {})]) for i in range(4)]
                for k in names
            },
        }
    before = runs["before"]
    payload = {
        "config": {
            "root": args.root,
            "quarter": QUARTER,
            "rounds": args.rounds,
            "what": "bench_features._asset_stages in a fresh process per round, functions wrapped; "
            "medians over rounds; nested calls counted in their callers too",
        },
        "load_average_before": load_before,
        "stages": split,
        "first_numba_call": {
            "cpu_s": med([r["first_numba_call"]["cpu_s"] for r in before]),
            "wall_s": med([r["first_numba_call"]["wall_s"] for r in before]),
            "roll_calendar_cpu_s_with_it": split["roll_calendar"]["cpu_s"],
            "roll_calendar_cpu_s_after_it": med([r["cpu"]["roll_calendar"] for r in before]),
        },
        "rounds": {
            m: [{"wall": r["wall"], "cpu": r["cpu"], "minflt": r["minflt"]} for r in rs]
            for m, rs in runs.items()
        },
    }
    write_result("diag_stages_split", payload)
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
