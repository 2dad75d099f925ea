"""Run the CPU benchmarks (``make bench``; ``make bench-quick`` = ``--quick``) and print a summary
table; ``make`` then regenerates the README tables (``python -m benchmarks.report``).

``MODULES`` lists the benchmark modules in the order they run (a module that is not there is
skipped with a note, so the list can name modules still being written). Full mode calls each
module's ``run()``; quick mode calls ``run(quick=True)`` of the modules whose ``run`` takes
``quick`` (they write ``<name>_quick.json`` on a small market, so a quick run never replaces
the full figures) and skips the others. Each measurement inside a module runs where that
module says (its own processes for peak memory, A B A B alternation for comparisons). The
benchmark data (synthetic markets, sidecars) is generated under ``benchmarks/data/`` on the
first run and reused afterwards. GPU benchmarks (``bench_gpu*``) run on the lent GPU host,
not here. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import load_average

RESULTS = Path(__file__).parent / "results"

MODULES = [
    "bench_decode",
    "bench_features",
    "bench_snapshot",
    "bench_snapshot_quarter",
    "bench_integrity",
    "bench_indicators",
    "bench_peers",
    "bench_dagster_path",
    "bench_scaling",
]
# Modules run through their command line (``main(argv)`` writes ``results/<name>.json``): the
# full-mode arguments; they have no quick mode.
BY_MAIN: dict[str, list[str]] = {
    "bench_decode": [],
    "bench_indicators": [],
    "bench_dagster_path": [],
    "bench_snapshot_quarter": [],  # ~40 GB of data while it runs (deleted after each case)
    "bench_scaling": ["--quarters", "1,3,9", "--market9", "--heavy"],
}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    t = res.get("targets", [])
    if isinstance(t, dict):
        return [{"name": k, **v} for k, v in t.items()]
    return list(t)


def summary(results: dict[str, dict[str, Any]]) -> str:
    rows = [("benchmark", "target", "value", "bound", "result")]
    for name, res in results.items():
        for t in _targets(res):
            verdict = "skip" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
            rows.append((name, t["name"], _fmt(t["value"]), t["target"], verdict))
    widths = [min(max(len(r[i]) for r in rows), 100) for i in range(5)]
    lines = ["  ".join(c[:100].ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def call_run(mod: Any, quick: bool) -> dict[str, Any] | None:
    """``mod.run`` the way it accepts: ``quick`` where it takes one (None: no quick mode),
    required positional parameters (e.g. ``bench_integrity.run(root)``) as None = defaults."""
    params = inspect.signature(mod.run).parameters
    if quick and "quick" not in params:
        return None
    kwargs: dict[str, Any] = {"quick": quick} if "quick" in params else {}
    for name, p in params.items():
        if name != "quick" and p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD:
            kwargs[name] = None
    out: dict[str, Any] = mod.run(**kwargs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the CPU benchmarks.")
    ap.add_argument("--quick", action="store_true", help="the modules with a quick mode, small market")
    ap.add_argument("--only", default="", help="comma list of modules (default: all of MODULES)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(f"load average at start: {load_average()}", file=sys.stderr, flush=True)
    results: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for name in [m for m in args.only.split(",") if m] or MODULES:
        try:
            mod = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"benchmarks.{name}":
                raise
            skipped.append(f"{name} (not present)")
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        if name in BY_MAIN:
            if args.quick:
                skipped.append(f"{name} (no quick mode)")
                continue
            mod.main(list(BY_MAIN[name]))
            res = json.loads((RESULTS / f"{name}.json").read_text())
        else:
            res = call_run(mod, args.quick)
        if res is None:
            skipped.append(f"{name} (no quick mode)")
            continue
        results[name] = res
        if name == "bench_decode":
            # The decode benchmark writes GBs of sidecars; flush them before the
            # next benchmark's file writes would wait behind that writeback.
            os.sync()
    print(summary(results))
    if skipped:
        print("\nskipped: " + ", ".join(skipped))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; load average at end: {load_average()}")
    print("results: benchmarks/results/*.json; tables: python -m benchmarks.report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
