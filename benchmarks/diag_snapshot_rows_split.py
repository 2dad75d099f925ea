"""Where the snapshot row unit's fxcache stage spends its time beyond the scan (issue 11).

Builds the scale-1 quarter's bars and bar features (``bar_rows.quarter_bars`` /
``quarter_bar_features`` on ``bench_snapshot``'s sidecars, untimed), then runs
``snapshot_rows.write_snapshot_fxcache`` once per value dtype under ``cProfile`` (main thread;
the writer's fill-ahead thread is not profiled, its CPU is in the process total) and reports
the wall seconds of its parts: the planning pass, the selection and gather, the feature scan,
the bar context and progress join, the price columns, and the fxcache writer (fill into the
stored dtype, bf16 rounding, checks, hashing, writing). Process CPU seconds beside the wall.

    python -m benchmarks.diag_snapshot_rows_split [--dtypes bf16,f32] [--out DIR]

Prints one JSON object (also written to benchmarks/results/diag_snapshot_rows_split.json).
The fxcache files go to ``--out`` (default: a temporary directory, removed after).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_snapshot as bs
from benchmarks.common import command_line, cpu_seconds, load_average, write_result

# part -> the functions (file suffix, name) whose cumulative wall time is the part's
PARTS: dict[str, list[tuple[str, str]]] = {
    "plan (first pass: rows, bar closes)": [("snapshot_rows.py", "plan_snapshot_rows")],
    "select + gather (book into float matrices)": [
        ("snapshot_rows.py", "_select_nb"),
        ("book.py", "_gather_book_nb"),
        ("book.py", "take"),
    ],
    "feature scan (snapshot_features)": [("snapshot_features.py", "snapshot_features")],
    "bar context + progress join": [
        ("snapshot_rows.py", "context"),
        ("snapshot_rows.py", "upto"),
        ("snapshot_features.py", "bar_progress"),
        ("{built-in method numpy.core.multiarray.take}", ""),
    ],
    "fxcache writer (fill, bf16, checks, hash, write)": [("fxcache.py", "append"), ("fxcache.py", "finish")],
}


def _cum(stats: pstats.Stats, file_suffix: str, name: str) -> float:
    total = 0.0
    for (fname, _, fn), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        if name and fn == name and fname.endswith(file_suffix):
            total += ct
        elif not name and fn == file_suffix:
            total += ct
    return total


def run(dtypes: list[str], out_dir: Path) -> dict[str, Any]:
    from fx_assets.core.active_contract import active_trades
    from fx_assets.core.bar_features import BarFeatureConfig
    from fx_assets.core.bar_rows import quarter_bar_features, quarter_bars
    from fx_assets.core.bars import BarConfig
    from fx_assets.core.book import BookSource
    from fx_assets.core.snapshot_features import SnapshotFeatureConfig
    from fx_assets.core.snapshot_rows import write_snapshot_fxcache

    root = bs.market_root()
    mbp, trd = bs.sidecars(root)
    cal = bs.calendar(root, trd)
    t0 = time.perf_counter()
    bars = quarter_bars(active_trades(trd, cal), BarConfig())
    feats = quarter_bar_features(bars, [], BarFeatureConfig())
    prep = time.perf_counter() - t0
    book = BookSource(mbp, cal)
    cfg = SnapshotFeatureConfig()
    res: dict[str, Any] = {"bars": len(bars), "bars_and_features_s": round(prep, 2), "data_root": str(root)}
    for dtype in ["f32", *dtypes]:  # the first, untimed: numba caches and page cache warm
        path = out_dir / f"snap_{dtype}.fxcache"
        prof = cProfile.Profile()
        c0, w0 = cpu_seconds(), time.perf_counter()
        prof.enable()
        counts = write_snapshot_fxcache(
            path,
            book,
            bars,
            feats,
            cfg,
            dtype,
            bytes(32),
            {"partition": bs.QUARTER},
            trades=trd,  # type: ignore[arg-type]
        )
        prof.disable()
        wall, cpu = time.perf_counter() - w0, cpu_seconds() - c0
        size = path.stat().st_size
        path.unlink()
        if dtype == "f32" and "warm" not in res:
            res["warm"] = {"wall_s": round(wall, 2)}
            continue
        st = pstats.Stats(prof)
        parts = {p: round(sum(_cum(st, f, n) for f, n in fns), 3) for p, fns in PARTS.items()}
        res[dtype] = {
            "rows": counts.get("rows") if isinstance(counts.get("rows"), int) else counts,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "file_mb": round(size / 1e6, 1),
            "parts_wall_s": parts,
            "other_wall_s": round(wall - sum(parts.values()), 3),
        }
    return res


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    before = load_average()
    out_dir = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="diag_snaprows_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        res = run([d for d in a.dtypes.split(",") if d], out_dir)
    finally:
        if not a.out:
            shutil.rmtree(out_dir, ignore_errors=True)
    payload = {"command": command_line(), "load_average_before": before, "figures": res}
    write_result("diag_snapshot_rows_split", payload)
    print(json.dumps(payload, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
