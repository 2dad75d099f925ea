"""Diagnostic for issue 10 ("Scaling", memory flat): what anonymous memory a process keeps
between quarters when the feature stages of several quarters run in it, and what each stage's
own peak is.

    python -m benchmarks.diag_scaling_memory ROOT OUT_DIR 2023-Q3,2023-Q4,2024-Q1

Runs :func:`benchmarks.stage_fns.run_quarters` one quarter at a time (in order, each warming up
from the previous one's outputs in ``OUT_DIR``, as ``bench_scaling`` does) and, after each
quarter (``gc.collect()`` first): RssAnon, the Arrow memory pool (bytes allocated, backend),
glibc's ``mallinfo2`` (in-use and free-but-held arena bytes), the memory maps still open on
sidecar files; then RssAnon again after ``malloc_trim(0)`` (what glibc held but no one used).
Per stage: the peak RssAnon of the stage (sampled every 5 ms). Prints one JSON object.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import stage_fns
from benchmarks.common import MemorySampler, _status_kib


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def snapshot() -> dict[str, Any]:
    import pyarrow as pa

    gc.collect()
    mi = _LIBC.mallinfo2()
    with open("/proc/self/maps") as fh:
        maps = [ln.split()[-1] for ln in fh if "sidecars" in ln]
    out = {
        "rss_anon_mib": _mib(_status_kib("RssAnon")),
        "rss_file_mib": _mib(_status_kib("RssFile")),
        "arrow_pool": pa.default_memory_pool().backend_name,
        "arrow_allocated_mib": round(pa.total_allocated_bytes() / 2**20, 1),
        "malloc_in_use_mib": round((mi.uordblks + mi.hblkhd) / 2**20, 1),
        "malloc_free_held_mib": round(mi.fordblks / 2**20, 1),
        "sidecar_maps": sorted(set(maps)),
    }
    _LIBC.malloc_trim(0)
    out["rss_anon_after_trim_mib"] = _mib(_status_kib("RssAnon"))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    root, out_dir, quarters = Path(argv[0]), Path(argv[1]), argv[2].split(",")
    import fx_assets.core.bar_rows  # noqa: F401  (imports before the first snapshot)

    sampler = MemorySampler()
    stage_peaks: dict[str, float] = {}
    orig_lap = stage_fns._Laps.lap

    def lap(self: Any, stage: str) -> None:
        stage_peaks[stage] = _mib(max(sampler.peak_kib, _status_kib("RssAnon")))
        sampler.peak_kib = 0
        orig_lap(self, stage)

    stage_fns._Laps.lap = lap  # type: ignore[method-assign]
    rows: list[dict[str, Any]] = [{"after": "imports", **snapshot()}]
    with sampler:
        for q in quarters:
            sampler.peak_kib = 0
            res = stage_fns.run_quarters(root, out_dir, [q])[0]
            rows.append(
                {
                    "after": q,
                    "trades_in_file": res["trades_in_file"],
                    "book_records": res["book_records"],
                    "bars": res["bars"],
                    "seconds": res["seconds"],
                    "quarter_peak_anon_mib": res["peak_anon_mib"],
                    "stage_peak_anon_mib": dict(stage_peaks),
                    **snapshot(),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
