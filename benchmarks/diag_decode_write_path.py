"""How the cold decode should put its columns into the page cache (issue 10, cold decode <= 1.5x
zstd): ``pwrite`` of staged columns (what ``sidecar._Columns`` does) against splitting the records
straight into a shared mapping of the sidecar file (``ftruncate`` + ``mmap``), with the pages
faulted in on first touch or pre-faulted per write-out with ``MADV_POPULATE_WRITE`` (Linux 5.14+;
a failed populate returns an error where a touch of an unbacked page would raise SIGBUS).

Every variant does the same work apart from where the bytes go: the mbp-10 sidecar's 73 column
regions (page-aligned, room for 1.25 N, as ``sidecar._Layout`` lays them out) for N records taken
cyclically from the first 64 MiB of records of the scale-1 MBP-10 file (decoded untimed), the
split as ``_Columns._plan`` groups the fields (one strided copy per grid; into the mapping the
grid's regions lie at constant strides), 8 MiB write-outs, and an XXH3-128 per column over the
bytes written. One variant per fresh process pinned to one CPU (``taskset -c 0``), the variants'
order rotated every round; wall, user and system CPU.

    python -m benchmarks.diag_decode_write_path [--rounds N]

Writes benchmarks/results/diag_decode_write_path.json; the output file lies under the checkout's
benchmarks/data (ext4, where the sidecars live) and is removed after each run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import load_average, write_result

MODULE = "benchmarks.diag_decode_write_path"
DATA = Path(__file__).resolve().parent / "data"
SOURCE = DATA / "scaleout_scale1" / "raw" / "mbp-10" / "ES.FUT" / "ES.FUT_2024-Q3.dbn.zst"
VARIANTS = ("pwrite", "mmap_touch", "mmap_populate")
_MADV_POPULATE_WRITE = 23  # linux/mman.h; Python 3.11's mmap module has no name for it
_SAMPLE_BYTES = 64 << 20
_STAGE_BYTES = 8 << 20


def _source() -> Path:
    """The scale-1 MBP-10 file: this checkout's benchmark data, else main's (read only)."""
    if SOURCE.exists():
        return SOURCE
    main = Path("/work/main/benchmarks/data") / SOURCE.relative_to(DATA)
    if main.exists():
        return main
    raise SystemExit(f"{SOURCE} is missing: run benchmarks.bench_scaleout --scale 1 first")


def _run(variant: str, n: int, out_path: str) -> dict[str, Any]:
    from fx_assets.core import dbn, sidecar
    from fx_assets.core.checksum import digest_of, new_hasher

    src = _source()
    header = dbn.read_header(src)
    chunks, size = [], 0
    for _, arr, _ in dbn.iter_record_chunks(src):
        if len(arr) > 1:
            chunks.append(arr)
            size += arr.nbytes
        if size >= _SAMPLE_BYTES:
            break
    records = np.concatenate(chunks)
    cols = sidecar._columns(header.spec())
    widths = [t.bit_width // 8 for _, t in cols]
    with sidecar._Columns(cols, 1 << 20, lambda out: ([], None)) as probe:
        plan = probe._plan(records.dtype)
    assert plan, "no split plan for the mbp-10 records"
    cap = _STAGE_BYTES // records.dtype.itemsize
    bases, pos = [], 4 << 20
    for w in widths:
        bases.append(pos)
        pos = -(-(pos + int(n * 1.25) * w) // 4096) * 4096
    total = pos
    rs = records.dtype.itemsize
    hashers = [new_hasher() for _ in cols]

    def grid(g: Any) -> tuple[int, int, int] | None:
        """(base, row stride, column stride) of the group's regions if they lie on a grid."""
        first = bases[g.columns[0][0]]
        s_r = bases[g.columns[1][0]] - first if len(g.columns) > 1 else 0
        s_c = bases[g.columns[0][1]] - first if len(g.columns[0]) > 1 else 0
        ok = all(
            bases[col] == first + r * s_r + c * s_c
            for r, row in enumerate(g.columns)
            for c, col in enumerate(row)
        )
        return (first, s_r, s_c) if ok else None

    grids = [grid(g) for g in plan]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    fd = os.open(out_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if variant == "pwrite":
            blocks = [
                np.empty((len(g.columns), len(g.columns[0]), cap), np.dtype(f"u{g.width}")) for g in plan
            ]
        else:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total)
            whole = np.frombuffer(mm, np.uint8)
        done = 0
        while done < n:
            k = min(cap, n - done)
            start = done % (len(records) - cap)
            part = records[start : start + k]
            for gi, g in enumerate(plan):
                rows, ncols = len(g.columns), len(g.columns[0])
                src_view = np.ndarray(
                    (k, rows, ncols), np.dtype(f"u{g.width}"), part, g.offset, (rs, g.outer, g.width)
                )
                src_view = src_view.transpose(1, 2, 0)
                if variant == "pwrite":
                    np.copyto(blocks[gi][:, :, :k], src_view, casting="no")
                    continue
                if variant == "mmap_populate":
                    for row in g.columns:
                        for col in row:
                            lo = (bases[col] + done * g.width) // 4096 * 4096
                            hi = bases[col] + (done + k) * g.width
                            mm.madvise(_MADV_POPULATE_WRITE, lo, hi - lo)
                gr = grids[gi]
                if gr is not None:
                    first, s_r, s_c = gr
                    dst = np.ndarray(
                        (rows, ncols, k),
                        np.dtype(f"u{g.width}"),
                        whole,
                        first + done * g.width,
                        (s_r, s_c, g.width),
                    )
                    np.copyto(dst, src_view, casting="no")
                else:
                    for r, row in enumerate(g.columns):
                        for c, col in enumerate(row):
                            off = bases[col] + done * g.width
                            dst = np.ndarray((k,), np.dtype(f"u{g.width}"), whole, off, (g.width,))
                            np.copyto(dst, src_view[r, c], casting="no")
            # write-out: the staged columns go to their regions; every column's new bytes hashed
            for gi, g in enumerate(plan):
                for r, row in enumerate(g.columns):
                    for c, col in enumerate(row):
                        off = bases[col] + done * widths[col]
                        if variant == "pwrite":
                            data = blocks[gi][r, c, :k].data.cast("B")
                            view = memoryview(data)
                            p = off
                            while len(view):
                                m = os.pwrite(fd, view, p)
                                view, p = view[m:], p + m
                        else:
                            data = memoryview(mm)[off : off + k * widths[col]]
                        hashers[col].update(data)
                        del data
            done += k
        if variant != "pwrite":
            del whole, dst, src_view
            mm.close()
    finally:
        os.close(fd)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    # one digest over the 73 column digests: every variant must have written the same bytes
    digest = hashlib.sha256(",".join(digest_of(h) for h in hashers).encode()).hexdigest()[:16]
    os.unlink(out_path)
    return {
        "variant": variant,
        "wall_s": round(wall, 4),
        "user_s": round(r1.ru_utime - r0.ru_utime, 4),
        "sys_s": round(r1.ru_stime - r0.ru_stime, 4),
        "cpu_s": round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 4),
        "bytes": int(n * sum(widths)),
        "column_digests": digest,
        "grids_on_strides": sum(gr is not None for gr in grids),
        "groups": len(plan),
    }


def _summary(vals: list[float]) -> dict[str, float]:
    return {"min": min(vals), "median": round(statistics.median(vals), 4), "max": max(vals)}


def main(argv: list[str]) -> None:
    if argv and argv[0] == "one":
        print(json.dumps(_run(argv[1], int(argv[2]), argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=2_570_000, help="N (default: ~the scale-1 MBP-10 quarter)")
    args = ap.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    out = str(DATA / ".diag_decode_write_path.bin")
    load_before = load_average()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for v in order:
            cmd = ["taskset", "-c", "0", sys.executable, "-m", MODULE, "one", v, str(args.records), out]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[v].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"[diag_decode_write_path] round {r + 1}: {runs[v][-1]}", file=sys.stderr, flush=True)
    digests = {run["column_digests"] for v in VARIANTS for run in runs[v]}
    if len(digests) != 1:
        raise SystemExit(f"the variants wrote different bytes: {digests}")
    figures: dict[str, dict[str, Any]] = {
        v: {key: _summary([run[key] for run in runs[v]]) for key in ("wall_s", "user_s", "sys_s", "cpu_s")}
        for v in VARIANTS
    }
    base = figures["pwrite"]["cpu_s"]["median"]
    for v in VARIANTS:
        figures[v]["cpu_over_pwrite_median"] = round(figures[v]["cpu_s"]["median"] / base, 3)
    payload = {
        "command": " ".join(["python", "-m", MODULE, *argv]),
        "config": {
            "records": args.records,
            "rounds": args.rounds,
            "stage_bytes": _STAGE_BYTES,
            "taskset": "0",
        },
        "bytes_written": runs["pwrite"][0]["bytes"],
        "figures": figures,
        "rounds": runs,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    path = write_result("diag_decode_write_path", payload)
    print(json.dumps(figures, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
