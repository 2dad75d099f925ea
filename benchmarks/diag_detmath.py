"""Do float64 log / log1p / sin / cos give the same bits on this machine as the C library?

NumPy dispatches these to kernels chosen by the CPU's SIMD level; ``fx_assets.core.detmath``
(what the feature and label modules use) calls the C library's scalar functions. On random
inputs this counts the elements where each differs from Python's ``math`` (the C library,
element by element). Prints one JSON object; ``--out`` also writes it.

    python -m benchmarks.diag_detmath [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from fx_assets.core import detmath


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    out: dict[str, object] = {"avx512f": "avx512f" in flags, "numpy": np.__version__}
    rng = np.random.default_rng(0)
    for name, lo, hi in [("log", 1e-3, 1e9), ("log1p", 0.0, 1e9), ("sin", -20, 20), ("cos", -20, 20)]:
        x = np.concatenate([rng.uniform(lo, hi, 200_000), np.exp(rng.uniform(-6, 20, 200_000))])
        x = x[(x >= lo) & (x <= hi)]
        ref = np.array([getattr(math, name)(float(v)) for v in x])
        d = getattr(detmath, name)(x)
        n = getattr(np, name)(x)
        out[name] = {
            "detmath_vs_math_mismatch": int((d.view(np.int64) != ref.view(np.int64)).sum()),
            "numpy_vs_math_mismatch": int((n.view(np.int64) != ref.view(np.int64)).sum()),
            "n": int(x.size),
        }
    text = json.dumps(out)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
