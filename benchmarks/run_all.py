"""Run every benchmark (``make bench``): decode, then features; print a summary table.

Each measurement runs in its own process (see ``benchmarks.common.in_subprocess``) so peak
memory is per measurement. Results: ``benchmarks/results/bench_decode.json``,
``bench_features.json`` and ``bench_integrity.json``. The benchmark data (synthetic markets, sidecars) is generated under
``benchmarks/data/`` on the first run and reused afterwards. Not part of the test suite.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from benchmarks import bench_decode, bench_features, bench_integrity
from benchmarks.common import load_average


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def summary(results: dict[str, dict[str, Any]]) -> str:
    rows = [("benchmark", "target", "value", "bound", "result")]
    for name, res in results.items():
        for t in res["targets"]:
            verdict = "skip" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
            rows.append((name, t["name"], _fmt(t["value"]), t["target"], verdict))
    widths = [min(max(len(r[i]) for r in rows), 100) for i in range(5)]
    lines = ["  ".join(c[:100].ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    t0 = time.perf_counter()
    print(f"load average at start: {load_average()}", file=sys.stderr, flush=True)
    results = {"bench_decode": bench_decode.run()}
    # The decode benchmark writes ~20 GB (the book-heavy sidecar); flush it before timing the
    # feature stages, whose own file writes would otherwise wait behind that writeback.
    os.sync()
    results["bench_features"] = bench_features.run()
    results["bench_integrity"] = bench_integrity.run(None)
    print(summary(results))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; load average at end: {load_average()}")
    print("results: benchmarks/results/bench_{decode,features,integrity}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
