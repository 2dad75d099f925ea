"""Cost of verifying an fxcache file's checksums (issue "nothing corrupt is ever read").

Writes one fxcache of the ``--scale 1`` shape (660 k bars; 35 features + 36 OFI values in the
value block, 7 f64 prices; synthetic values) per value dtype, reads it once so it sits in the
page cache (the state a reuse finds it in), then times (median of ``--reps``):

- ``verify_bodies_s``: re-hashing every byte of the file against its XXH3-128 checksums (what
  ``open_fxcache`` adds by default, and what the device loader does for each file it uploads);
- ``open_default_s``: ``open_fxcache(path)`` = structure + checksums + finite scan (what a
  stage's reuse and the asset check do);
- ``open_no_checksums_s``: the same without the checksums (the cost before they existed).

Run: ``python -m benchmarks.bench_fxcache_verify [--out benchmarks/results/fxcache_verify.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fx_assets.core import fxcache
from fx_assets.core.fxcache import open_fxcache, write_fxcache

N_FEATURE, N_OFI = 35, 36
PRICE_COLS = ["open", "high", "low", "close", "vwap", "mid_open", "contract"]


def write_scale1(path: Path, dtype: str, n: int = 660_000, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    close = 5000.0 + 0.25 * np.cumsum(rng.integers(-2, 3, n))
    prices = np.column_stack(
        [close, close + 0.25, close - 0.25, close, close + 0.1, close - 0.125, np.full(n, 202403.0)]
    )
    return write_fxcache(
        path,
        1_704_200_000 * 10**9 + np.arange(n, dtype=np.int64) * 10**10,
        {
            "feature": ([f"f{i}" for i in range(N_FEATURE)], rng.standard_normal((n, N_FEATURE))),
            "price": (PRICE_COLS, prices),
            "ofi": ([f"ofi_{i}" for i in range(N_OFI)], rng.standard_normal((n, N_OFI))),
        },
        dtype,  # type: ignore[arg-type]
        bytes(32),
    )


def _median_s(fn: Any, reps: int) -> float:
    fn()  # warm (page cache, first-call costs)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(path: Path, reps: int = 5) -> dict[str, Any]:
    size = path.stat().st_size
    t_verify = _median_s(lambda: fxcache._verify_bodies(path), reps)
    t_default = _median_s(lambda: open_fxcache(path).close(), reps)
    t_plain = _median_s(lambda: open_fxcache(path, verify_checksums=False).close(), reps)
    return {
        "file_bytes": size,
        "dtype": fxcache.read_header(path).dtype,
        "verify_bodies_s": t_verify,
        "verify_GBps": size / t_verify / 1e9,
        "open_default_s": t_default,
        "open_no_checksums_s": t_plain,
        "checksum_share_of_default_open": t_verify / t_default,
        "reps": reps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/fxcache_verify.json")
    ap.add_argument("--rows", type=int, default=660_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    a = ap.parse_args()
    d = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="fxverify_"))
    res: dict[str, Any] = {
        "command": " ".join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "node": platform.node()},
        "load_avg_before": os.getloadavg(),
        "config": {"rows": a.rows, "columns": f"{N_FEATURE} features + {N_OFI} OFI values, 7 f64 prices"},
        "runs": [],
    }
    for dtype in ("f32", "bf16"):
        p = write_scale1(d / f"s1_{dtype}.fxcache", dtype, a.rows)
        res["runs"].append(measure(p, a.reps))
        p.unlink()
        print(json.dumps(res["runs"][-1]), flush=True)
    res["load_avg_after"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
