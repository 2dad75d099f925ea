"""Decode benchmark (issue "Foundation"): DBN -> sidecar (cold) versus sidecar -> arrays (warm).

For the trades and MBP-10 files of one ``--scale 1`` quarter (~20 M trades, ~2 M book
updates) it measures, each in a fresh process (so peak memory is per measurement):

- ``zstd``: plain zstandard stream decompression of the file to nowhere (the floor);
- ``cold``: ``build_sidecar`` (decompress, split into columns, write the Arrow sidecar);
- ``warm``: ``sidecar_columns`` of every column (open + zero-copy numpy views), and separately
  the time to touch the data (summing one column).

A book-heavy quarter (``book_ratio`` 2.5: ~47 M MBP-10 records, ~17 GB decoded) shows that
the decoder's peak memory is set by the chunk size, not the file size; it is skipped when
less than 60 GB of disk is free. Usage: ``python -m benchmarks.bench_decode`` (all) or
``python -m benchmarks.bench_decode {zstd,cold,warm} ARGS`` (one measurement, JSON on stdout).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    HEAVY_MARKET,
    LAST_QUARTER,
    MAIN_MARKET,
    command_line,
    ensure_market,
    free_disk_gb,
    in_subprocess,
    load_average,
    measure,
    raw_file,
    target,
    write_result,
)

MIN_FREE_GB_HEAVY = 60.0
MODULE = "benchmarks.bench_decode"
TOUCH_COLUMN = {"trades": "price", "mbp-10": "bid_px_00"}


def sidecar_dir(root: Path, schema: str) -> Path:
    """Sidecars of a benchmark market (shared with bench_features, which reuses them warm)."""
    return root / "sidecars" / schema / "ES.FUT"


# --- single measurements (run in a fresh process) -------------------------------------------


def _zstd(source: str) -> dict[str, Any]:
    import zstandard

    def run() -> dict[str, Any]:
        n = 0
        with open(source, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
            while chunk := r.read(1 << 20):
                n += len(chunk)
        return {"decompressed_bytes": n}

    return measure(run)


def _cold(source: str, dest: str, chunk_bytes: str) -> dict[str, Any]:
    from fx_assets.core.sidecar import build_sidecar

    def run() -> dict[str, Any]:
        info = build_sidecar(source, dest, chunk_bytes=int(chunk_bytes))
        return {"n_records": info.n_records, "sidecar_bytes": Path(dest).stat().st_size}

    return measure(run)


def _warm(path: str, touch: str) -> dict[str, Any]:
    import numpy as np

    from fx_assets.core.sidecar import sidecar_columns

    cols: dict[str, Any] = {}

    def load() -> dict[str, Any]:
        cols.update(sidecar_columns(path))
        return {"n_columns": len(cols), "n_records": int(next(iter(cols.values())).shape[0])}

    out = measure(load)
    t0 = time.perf_counter()
    again = sidecar_columns(path)
    out["second_open_seconds"] = time.perf_counter() - t0
    del again
    t0 = time.perf_counter()
    total = int(np.sum(cols[touch], dtype=np.int64))  # wraps on overflow: only the read matters
    out["touch_seconds"] = time.perf_counter() - t0
    out["touch_column"] = touch
    out["touch_bytes"] = int(cols[touch].nbytes)
    out["touch_checksum"] = total
    out["open_plus_touch_seconds"] = out["seconds"] + out["touch_seconds"]
    return out


def _profile(source: str, dest: str, chunk_bytes: str) -> dict[str, Any]:
    """Where the cold decode's time goes: ``build_sidecar`` under cProfile, main thread (the
    decompression thread is not profiled; the main thread's wait for it shows as ``queue_wait``)."""
    import cProfile
    import pstats

    from fx_assets.core.sidecar import build_sidecar

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    build_sidecar(source, dest, chunk_bytes=int(chunk_bytes))
    prof.disable()
    total = time.perf_counter() - t0
    Path(dest).unlink()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    wanted = {
        ("sidecar.py", "add"): "split_into_columns_incl_spill_writes",
        ("sidecar.py", "flush"): "spill_writes_pwrite",
        ("queue.py", "get"): "queue_wait_for_decompression_thread",
        ("sidecar.py", "_write_copied"): "kernel_copy_spill_to_sidecar",
        ("sidecar.py", "close"): "close_spill_files",
        ("sidecar.py", "_ipc_image"): "ipc_metadata",
        ("sidecar.py", "_verify"): "verify",
    }
    phases: dict[str, float] = {}
    for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.items():
        key = (Path(file).name, func)
        if key in wanted:
            phases[wanted[key]] = round(phases.get(wanted[key], 0.0) + ct, 3)
    return {"seconds": round(total, 3), "dest_dir": str(Path(dest).parent), "main_thread_phases_s": phases}


# --- orchestration ---------------------------------------------------------------------------


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run's figures, the largest memory peaks of all, and every run's seconds."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    for k in ("peak_anon_mib", "peak_rss_mib"):
        best[k] = max(r[k] for r in runs)
    best["seconds_runs"] = [round(r["seconds"], 3) for r in runs]
    return best


def _record_bytes(schema: str) -> int:
    return {"trades": 48, "mbp-10": 368}[schema]


def _file_set(root: Path, schema: str, chunk_bytes: int, label: str) -> dict[str, Any]:
    """zstd floor, cold decode and warm load of one file; the cold sidecar is left in place."""
    from fx_assets.core.sidecar import sidecar_path

    src = raw_file(root, schema, LAST_QUARTER)
    dest = sidecar_path(src, sidecar_dir(root, schema))
    dest.unlink(missing_ok=True)
    # The shared VM is noisy: small files are measured `repeats` times (fastest reported, all
    # kept); the book-heavy file once (its decode alone takes minutes of disk writes).
    repeats = 1 if label.startswith("book-heavy") else 3
    print(f"[decode] {label}: zstd floor x{repeats}", file=sys.stderr, flush=True)
    z = _best([in_subprocess(MODULE, "zstd", str(src)) for _ in range(repeats)])
    print(f"[decode] {label}: cold decode (chunk {chunk_bytes} B) x{repeats}", file=sys.stderr, flush=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for _ in range(repeats):
        dest.unlink(missing_ok=True)
        runs.append(in_subprocess(MODULE, "cold", str(src), str(dest), str(chunk_bytes)))
    c = _best(runs)
    print(f"[decode] {label}: warm load", file=sys.stderr, flush=True)
    w = in_subprocess(MODULE, "warm", str(dest), TOUCH_COLUMN[schema])
    n = c["n_records"]
    diag = _diagnostics(src, n * _record_bytes(schema), chunk_bytes, label)
    rb = _record_bytes(schema)
    return {
        "file": str(src),
        "schema": schema,
        "compressed_bytes": src.stat().st_size,
        "n_records": n,
        "decoded_bytes": n * rb,
        "chunk_bytes": chunk_bytes,
        "zstd_floor": {
            **z,
            "records_per_s": round(n / z["seconds"]),
            "decompressed_mb_per_s": round(z["decompressed_bytes"] / z["seconds"] / 1e6, 1),
        },
        "cold_decode": {
            **c,
            "records_per_s": round(n / c["seconds"]),
            "decoded_mb_per_s": round(n * rb / c["seconds"] / 1e6, 1),
            "ratio_to_zstd_floor": round(c["seconds"] / z["seconds"], 3),
        },
        "warm_load": {
            **w,
            "records_per_s_open": round(n / w["seconds"]),
            "speedup_vs_cold_open": round(c["seconds"] / w["seconds"], 1),
            "speedup_vs_cold_open_plus_touch": round(c["seconds"] / w["open_plus_touch_seconds"], 1),
        },
        "diagnostics": diag,
    }


SHM = Path("/dev/shm")


def _diagnostics(src: Path, decoded_bytes: int, chunk_bytes: int, label: str) -> dict[str, Any]:
    """Cold decode split by phase (cProfile), on disk and with the sidecar on tmpfs (no disk
    writeback: the CPU cost alone). Skipped where tmpfs lacks room for 2.5x the decoded size."""
    from fx_assets.core.sidecar import sidecar_path

    out: dict[str, Any] = {}
    if decoded_bytes > 4e9:
        return {"skipped": "file too large for a second and third decode (disk space and time)"}
    disk_dir = src.parent.parent.parent.parent / "sidecars" / "profile"
    disk_dir.mkdir(parents=True, exist_ok=True)
    print(f"[decode] {label}: phase profile (disk)", file=sys.stderr, flush=True)
    out["profile_disk"] = in_subprocess(
        MODULE, "profile", str(src), str(sidecar_path(src, disk_dir)), str(chunk_bytes)
    )
    if SHM.is_dir() and free_disk_gb(SHM) * 1e9 > 2.5 * decoded_bytes:
        shm_dir = Path(tempfile.mkdtemp(prefix="fx-bench-", dir=SHM))
        try:
            dest = sidecar_path(src, shm_dir)
            print(f"[decode] {label}: cold decode to tmpfs", file=sys.stderr, flush=True)
            out["cold_decode_tmpfs"] = in_subprocess(MODULE, "cold", str(src), str(dest), str(chunk_bytes))
            dest.unlink()
            out["profile_tmpfs"] = in_subprocess(MODULE, "profile", str(src), str(dest), str(chunk_bytes))
        finally:
            shutil.rmtree(shm_dir, ignore_errors=True)
    else:
        out["tmpfs"] = "skipped: not enough room on /dev/shm"
    return out


def run() -> dict[str, Any]:
    """All decode measurements; writes benchmarks/results/bench_decode.json."""
    from fx_assets.core.sidecar import DEFAULT_CHUNK_BYTES, sidecar_path

    load_before = load_average()
    t_start = time.perf_counter()
    main_root = ensure_market(*MAIN_MARKET)
    chunk = DEFAULT_CHUNK_BYTES
    figures: dict[str, Any] = {
        "trades": _file_set(main_root, "trades", chunk, "trades"),
        "mbp-10": _file_set(main_root, "mbp-10", chunk, "mbp-10"),
    }
    # Same file with an 8x larger chunk: how the decoder's memory follows the chunk size.
    src = raw_file(main_root, "mbp-10", LAST_QUARTER)
    tmp = sidecar_path(src, main_root / "sidecars" / "chunk-test")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    big_chunk = 8 * chunk
    print(f"[decode] mbp-10: cold decode (chunk {big_chunk} B)", file=sys.stderr, flush=True)
    c8 = in_subprocess(MODULE, "cold", str(src), str(tmp), str(big_chunk))
    tmp.unlink(missing_ok=True)
    figures["mbp-10_chunk_8x"] = {"chunk_bytes": big_chunk, "cold_decode": c8}

    heavy_root = ensure_market(*HEAVY_MARKET)
    heavy_dest = sidecar_path(raw_file(heavy_root, "mbp-10", LAST_QUARTER), sidecar_dir(heavy_root, "mbp-10"))
    heavy_dest.unlink(missing_ok=True)  # a previous run's sidecar is rebuilt: free its space first
    free = free_disk_gb(heavy_root)
    heavy_skip = None
    if free < MIN_FREE_GB_HEAVY:
        heavy_skip = f"skipped: {free:.1f} GB free on {heavy_root}, < {MIN_FREE_GB_HEAVY} GB needed"
        print(f"[decode] book-heavy mbp-10 {heavy_skip}", file=sys.stderr, flush=True)
        figures["mbp-10_book_heavy"] = {"skipped": heavy_skip}
    else:
        figures["mbp-10_book_heavy"] = _file_set(heavy_root, "mbp-10", chunk, "book-heavy mbp-10")
        figures["mbp-10_book_heavy"]["free_disk_gb_before"] = round(free, 1)

    tr, mb = figures["trades"], figures["mbp-10"]
    targets = []
    for label, f in (("trades", tr), ("mbp-10", mb)):
        targets.append(
            target(
                f"{label}: warm load (open + views) >= 20x faster than cold decode",
                f["warm_load"]["speedup_vs_cold_open"],
                ">=",
                20,
                "x",
            )
        )
        targets.append(
            target(
                f"{label}: warm load incl. touching one column >= 20x faster than cold decode",
                f["warm_load"]["speedup_vs_cold_open_plus_touch"],
                ">=",
                20,
                "x",
                f"touch = sum of {f['warm_load']['touch_column']}",
            )
        )
        targets.append(
            target(
                f"{label}: cold decode within 1.5x of raw zstd decompression",
                f["cold_decode"]["ratio_to_zstd_floor"],
                "<=",
                1.5,
                "x",
            )
        )
    targets.append(
        target(
            "trades: cold decode ~15 M records/s",
            tr["cold_decode"]["records_per_s"] / 1e6,
            ">=",
            15,
            "M records/s",
            "the issue's estimate of the zstd floor per core; zstd floor measured: "
            f"{tr['zstd_floor']['records_per_s'] / 1e6:.1f} M records/s",
        )
    )
    heavy = figures["mbp-10_book_heavy"]
    if "skipped" in heavy:
        targets.append(
            target("book-heavy mbp-10: peak anon bounded by chunk", None, "<=", 0, "", heavy_skip or "")
        )
    else:
        base = mb["cold_decode"]["peak_anon_mib"]
        bound = 1.25 * base + 32
        targets.append(
            target(
                "book-heavy mbp-10: decoder peak anon memory independent of file size "
                "(<= 1.25x that of the 25x smaller mbp-10 file + 32 MiB)",
                heavy["cold_decode"]["peak_anon_mib"],
                "<=",
                round(bound, 1),
                "MiB",
                f"decoded size {heavy['decoded_bytes'] / 1e9:.1f} GB vs machine "
                f"{_mem_gib():.1f} GiB; VmHWM {heavy['cold_decode']['peak_rss_mib']} MiB",
            )
        )
        targets.append(
            target(
                "book-heavy mbp-10: decoder VmHWM independent of file size "
                "(<= 1.25x that of the 25x smaller mbp-10 file + 32 MiB)",
                heavy["cold_decode"]["peak_rss_mib"],
                "<=",
                round(1.25 * mb["cold_decode"]["peak_rss_mib"] + 32, 1),
                "MiB",
            )
        )
    payload = {
        "command": command_line(),
        "config": {
            "main_market": MAIN_MARKET[1],
            "heavy_market": HEAVY_MARKET[1],
            "quarter": LAST_QUARTER,
            "chunk_bytes": chunk,
            "stage_bytes": "8 x min(chunk_bytes, 1 MiB) (sidecar._STAGE_CHUNKS)",
            "zstd_floor": "zstandard.ZstdDecompressor().stream_reader(file).read(1 MiB) until EOF, one thread",
            "notes": "each measurement in a fresh process; source files are in the page cache "
            "(just generated or read); the cold sidecar is written to benchmarks/data",
        },
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "figures": figures,
        "targets": targets,
    }
    write_result("bench_decode", payload)
    return payload


def _mem_gib() -> float:
    with open("/proc/meminfo") as fh:
        return int(fh.readline().split()[1]) / 2**20


def main(argv: list[str]) -> None:
    if not argv:
        out = run()
        for t in out["targets"]:
            print(
                f"{'PASS' if t['pass'] else 'SKIP' if t['pass'] is None else 'FAIL'}  {t['name']}: {t['value']}"
            )
        return
    cmd, *args = argv
    fns: dict[str, Callable[..., dict[str, Any]]] = {
        "zstd": _zstd,
        "cold": _cold,
        "warm": _warm,
        "profile": _profile,
    }
    fn = fns[cmd]
    print(json.dumps(fn(*args)))


if __name__ == "__main__":
    main(sys.argv[1:])
