"""Where the snapshot row unit's fxcache stage spends its time beyond the scan (issue 11).

Builds the scale-1 quarter's bars and bar features (``bar_rows.quarter_bars`` /
``quarter_bar_features`` on ``bench_snapshot``'s sidecars, untimed), then runs
``snapshot_rows.write_snapshot_fxcache`` once per value dtype under ``cProfile`` (main thread;
the writer's fill-ahead thread is not profiled, its CPU is in the process total) and reports
the wall seconds of its parts: the planning pass, the selection and gather, the feature scan,
the bar context and progress join, the price columns, and the fxcache writer (fill into the
stored dtype, bf16 rounding, checks, hashing, writing). Process CPU seconds beside the wall.

    python -m benchmarks.diag_snapshot_rows_split [--dtypes bf16,f32] [--chunks N,M] [--rounds R] [--out DIR]

With several ``--chunks`` (MBP-10 records per ``iter_snapshot_rows`` chunk; default the
stage's), each dtype runs once per chunk size per round, alternating; figures per chunk size
are the medians over the rounds.

Each written file's sha256 is recorded (the same input and code give the same bytes: compare
runs of two revisions). Prints one JSON object (also written to benchmarks/results/diag_snapshot_rows_split.json).
The fxcache files go to ``--out`` (default: a temporary directory, removed after).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_snapshot as bs
from benchmarks.common import command_line, cpu_seconds, load_average, write_result
from fx_assets.core.snapshot_rows import DEFAULT_SNAPSHOT_CHUNK

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
        ("fromnumeric.py", "take"),
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


def run(dtypes: list[str], out_dir: Path, chunks: list[int], rounds: int) -> dict[str, Any]:
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

    def once(dtype: str, chunk: int) -> dict[str, Any]:
        path = out_dir / f"snap_{dtype}_{chunk}.fxcache"
        prof = cProfile.Profile()
        c0, w0 = cpu_seconds(), time.perf_counter()
        prof.enable()
        counts = write_snapshot_fxcache(
            path,
            book,
            bars,
            feats,
            cfg,
            dtype,  # type: ignore[arg-type]
            bytes(32),
            {"partition": bs.QUARTER},
            trades=trd,
            chunk=chunk,
        )
        prof.disable()
        wall, cpu = time.perf_counter() - w0, cpu_seconds() - c0
        size = path.stat().st_size
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while blk := fh.read(1 << 24):
                h.update(blk)
        path.unlink()
        st = pstats.Stats(prof)
        parts = {p: sum(_cum(st, f, n) for f, n in fns) for p, fns in PARTS.items()}
        return {
            "rows": counts.get("rows"),
            "wall_s": wall,
            "cpu_s": cpu,
            "file_mb": round(size / 1e6, 1),
            "file_sha256": h.hexdigest(),
            "parts_wall_s": parts,
            "other_wall_s": wall - sum(parts.values()),
        }

    t0 = time.perf_counter()
    once("f32", chunks[0])  # untimed: numba caches and page cache warm
    res["warm_s"] = round(time.perf_counter() - t0, 2)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(d, c): [] for d in dtypes for c in chunks}
    for _ in range(rounds):
        for key in runs:
            runs[key].append(once(*key))

    def med(xs: list[float]) -> float:
        return round(float(np.median(xs)), 3)

    for (dtype, chunk), rs in runs.items():
        label = dtype if len(chunks) == 1 else f"{dtype}_chunk_{chunk}"
        res[label] = {
            "chunk_records": chunk,
            "rows": rs[0]["rows"],
            "rounds": len(rs),
            "wall_s": med([r["wall_s"] for r in rs]),
            "cpu_s": med([r["cpu_s"] for r in rs]),
            "file_mb": rs[0]["file_mb"],
            "file_sha256": sorted({r["file_sha256"] for r in rs}),
            "parts_wall_s": {p: med([r["parts_wall_s"][p] for r in rs]) for p in PARTS},
            "other_wall_s": med([r["other_wall_s"] for r in rs]),
        }
    return res


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--chunks", default=str(DEFAULT_SNAPSHOT_CHUNK))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--name", default="diag_snapshot_rows_split")
    a = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    before = load_average()
    out_dir = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="diag_snaprows_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        chunks = [int(c) for c in a.chunks.split(",") if c]
        res = run([d for d in a.dtypes.split(",") if d], out_dir, chunks, a.rounds)
    finally:
        if not a.out:
            shutil.rmtree(out_dir, ignore_errors=True)
    payload = {"command": command_line(), "load_average_before": before, "figures": res}
    write_result(a.name, payload)
    print(json.dumps(payload, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
