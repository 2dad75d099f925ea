"""Memory of one fold's signal-report inputs (``core.signal_inputs.fold_signal``) by the chunk of
validation rows decoded and scored at a time (issue 11: "a real-scale quarter needs chunking").

Data: the scale-1 ES 2024-Q3 bar fxcache (``benchmarks/data/scaleout_scale1``, 679 k bars, 61
value columns), one file as a fold: training rows the first half, validation rows the second
(339,589 rows); bar horizons 1 and 5; a small LightGBM (50 k sampled rows, 50 trees) so the run
takes seconds. Each chunk size runs in a fresh process (``python -m`` this module ``--one``),
alternating, ``--rounds`` times; per run: traced peak (``tracemalloc``: numpy buffers), peak
anonymous RSS, seconds, and whether every prediction (both models, both horizons) equals those
of the first configuration (whole validation slice at once, the behaviour before chunking).

Run: ``python -m benchmarks.bench_signal_chunks [--rounds 2]`` -> ``results/signal_chunks.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import in_subprocess, measure, write_result

DATA = Path(__file__).resolve().parent / "data" / "scaleout_scale1"
MAIN_DATA = Path("/work/main/benchmarks/data/scaleout_scale1")


def fxcache_file() -> Path:
    for root in (DATA, MAIN_DATA):
        found = sorted((root / "derived" / "fxcache" / "ES.FUT").glob("ES.FUT_2024-Q3.*.fxcache"))
        if found:
            return found[0]
    raise FileNotFoundError("no scale-1 ES 2024-Q3 fxcache (run benchmarks.bench_scaleout first)")


def one(chunk: int, save: str) -> dict[str, Any]:
    from fx_assets.core.folds import FoldRange
    from fx_assets.core.fxcache import open_fxcache
    from fx_assets.core.signal_inputs import SignalLabelConfig, fold_signal
    from fx_assets.core.trainers.gbt import GbtConfig

    path = fxcache_file()
    n = open_fxcache(path, verify_finite=False).n_bars
    fr = FoldRange("2024-Q3", 0, n // 2 - 100, n // 2, n, 100, 0, 0, 0, 0, 0, 0)
    lab = SignalLabelConfig(bar_horizons=[1, 5])
    gbt = GbtConfig(sample_rows=50_000, n_estimators=50, early_stopping_rounds=10, purge_rows=40)

    def run() -> dict[str, Any]:
        tracemalloc.start()
        t0 = time.perf_counter()
        s = fold_signal([path], fr, lab, gbt, tick=0.25, chunk_rows=chunk or fr.n_val)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        np.save(
            save,
            np.concatenate([s.predictions[m][h] for m in sorted(s.predictions) for h in lab.bar_horizons]),
        )
        return {"seconds": seconds, "traced_peak_mib": round(peak / 2**20, 1), "n_val": fr.n_val}

    return measure(run)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.one, a.save)))
        return
    from fx_assets.core.signal_inputs import PREDICT_CHUNK_ROWS

    chunks = {"whole": 0, "default": PREDICT_CHUNK_ROWS, "16384": 16384}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "ref.npy"
        for r in range(a.rounds):
            for name, c in chunks.items():
                out = Path(tmp) / f"{name}.npy"
                res = in_subprocess("benchmarks.bench_signal_chunks", "--one", str(c), "--save", str(out))
                if not ref.exists():
                    out.rename(ref)
                    same = True
                else:
                    same = bool(np.array_equal(np.load(ref), np.load(out)))
                runs.append(
                    {"round": r, "chunk": name, "chunk_rows": c or res["n_val"], **res, "identical": same}
                )
                print(runs[-1], file=sys.stderr)
    summary = {
        name: {
            "chunk_rows": runs[i]["chunk_rows"],
            "traced_peak_mib": max(x["traced_peak_mib"] for x in runs if x["chunk"] == name),
            "peak_anon_mib": max(x["peak_anon_mib"] for x in runs if x["chunk"] == name),
            "seconds_median": float(np.median([x["seconds"] for x in runs if x["chunk"] == name])),
            "identical": all(x["identical"] for x in runs if x["chunk"] == name),
        }
        for i, name in enumerate(chunks)
    }
    print(write_result("signal_chunks", {"fxcache": str(fxcache_file()), "runs": runs, "summary": summary}))


if __name__ == "__main__":
    main()
