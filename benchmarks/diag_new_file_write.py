"""What writing a new file of fxcache size costs the writing process, by write method (issue 10:
the fxcache and stage-table writes of ``bench_features``).

Each measurement is a fresh process that writes ``--mib`` MiB (default 223, a scale-1 bar
fxcache) from a buffer already in memory into a new file, in one of these ways, and reports its
wall time, CPU time (user + system, ``getrusage``) and minor faults for the write alone:

- ``trunc_pwrite``: ``ftruncate`` to the full size (a sparse file), then 4 MiB ``pwrite`` calls
  in file order (what :class:`fx_assets.core.fxcache.FxCacheWriter` does),
- ``pwrite``: the same ``pwrite`` calls into an empty file,
- ``fallocate_pwrite``: ``posix_fallocate`` of the full size first, then the same calls,
- ``one_pwrite``: one ``pwrite`` of the whole buffer (looped on short writes),
- ``mmap``: ``ftruncate``, then a copy into a shared writable mapping of the file.

The methods take turns (the order rotated every round); the parent removes each file after its
process exited, as ``bench_features`` removes the quarter's outputs between rounds.

    python -m benchmarks.diag_new_file_write [--rounds N] [--mib M] [--dir DIR]

Writes ``benchmarks/results/diag_new_file_write.json``.
"""

from __future__ import annotations

import argparse
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

from benchmarks.common import DATA, load_average, write_result

MODULE = "benchmarks.diag_new_file_write"
METHODS = ("trunc_pwrite", "pwrite", "fallocate_pwrite", "one_pwrite", "mmap")
STEP = 4 << 20


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt


def _write(method: str, path: str, mib: int) -> dict[str, Any]:
    """One write of ``mib`` MiB into the new file ``path`` by ``method`` (in this process)."""
    n = mib << 20
    buf = bytearray(os.urandom(1 << 20)) * mib  # in memory (touched) before the clock starts
    view = memoryview(buf)
    t, (c, s, f) = time.perf_counter(), _usage()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if method in ("trunc_pwrite", "mmap"):
            os.ftruncate(fd, n)
        elif method == "fallocate_pwrite":
            os.posix_fallocate(fd, 0, n)
        if method == "mmap":
            with mmap.mmap(fd, n) as m:
                m[:] = view
        elif method == "one_pwrite":
            pos = 0
            while pos < n:
                pos += os.pwrite(fd, view[pos:], pos)
        else:
            for off in range(0, n, STEP):
                chunk = view[off : off + STEP]
                pos = 0
                while pos < len(chunk):
                    pos += os.pwrite(fd, chunk[pos:], off + pos)
    finally:
        os.close(fd)
    c2, s2, f2 = _usage()
    return {
        "wall_s": round(time.perf_counter() - t, 4),
        "cpu_s": round(c2 - c, 4),
        "sys_s": round(s2 - s, 4),
        "minflt": f2 - f,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--mib", type=int, default=223)
    p.add_argument("--dir", type=Path, default=DATA / "diag_new_file_write")
    p.add_argument("--one", nargs=2, metavar=("METHOD", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_write(args.one[0], args.one[1], args.mib)))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    load_before = load_average()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    for r in range(args.rounds):
        order = METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]
        for method in order:
            path = args.dir / f"{method}.bin"
            path.unlink(missing_ok=True)
            proc = subprocess.run(
                [sys.executable, "-m", MODULE, "--mib", str(args.mib), "--one", method, str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[method].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            path.unlink()

    def summary(xs: list[float]) -> dict[str, float]:
        return {"min": min(xs), "median": round(statistics.median(xs), 4), "max": max(xs)}

    figures = {
        m: {k: summary([x[k] for x in rs]) for k in ("wall_s", "cpu_s", "sys_s")} for m, rs in runs.items()
    }
    payload = {
        "config": {
            "mib": args.mib,
            "rounds": args.rounds,
            "dir": str(args.dir),
            "what": "a fresh process per write; methods in turn, order rotated each round; "
            "the file removed by the parent after each",
        },
        "load_average_before": load_before,
        "figures": figures,
        "rounds": runs,
    }
    write_result("diag_new_file_write", payload)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
