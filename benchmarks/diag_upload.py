"""Where the fxcache upload's host→device leg loses its rate (issue 10, upload bandwidth).

Takes fxcache files already written (``--data``: a ``bench_gpu --data`` folder) and loads them
through ``DeviceStore.add_fxcaches`` in variants: staging chunk size, reader threads, and the
in-stream XXH3 hashing replaced by a no-op (diagnostic only: nothing is verified then), each
repeated; beside it the pieces alone on the same machine: ``os.preadv`` out of the page cache
into pinned buffers (threads, no copy), XXH3-128 over pinned buffers (threads), and the pinned
chunk copies alone and while hashing threads run. Writes one JSON file; prints a table.

``python3 -m benchmarks.diag_upload --data /tmp/fxq --out $OUT/diag_upload.json``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.bench_gpu import loader_items, machine, warm_page_cache
from fx_assets.core import checksum
from fx_assets.core import device_store as ds
from fx_assets.core.ofi import OfiConfig


class _NoHash:
    """A hasher that hashes nothing and matches any digest (diagnostic variant only)."""

    def update(self, _b: Any) -> None:
        return None

    def digest(self) -> Any:
        return _AnyDigest()


class _AnyDigest:
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def load_once(items: list[tuple[str, Path]], paths: list[Path], **kw: Any) -> dict[str, Any]:
    warm_page_cache(paths)
    store = ds.DeviceStore(
        device="cuda",
        value_dtype="float32",
        chunk_rows=65536,
        max_views=4,
        price_tick=OfiConfig().tick_size,
        **kw,
    )
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    store.add_fxcaches(items)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    st = store.stats()
    del store
    return {
        "seconds": dt,
        "stream_s": st["stream_seconds"],
        "open_s": st["open_seconds"],
        "finish_s": st["finish_seconds"],
        "h2d_leg_GBps": st["h2d_bytes"] / st["h2d_seconds"] / 1e9,
        "h2d_busy_s": st["h2d_seconds"],
        "h2d_bytes": st["h2d_bytes"],
        "chunks": st["chunks"],
    }


def variant(
    items: list[tuple[str, Path]], paths: list[Path], reps: int, nohash: bool, old: Any = None, **kw: Any
) -> dict[str, Any]:
    orig, orig_stream = checksum.new_hasher, ds.DeviceStore._stream_specs
    if nohash:
        ds.checksum.new_hasher = _NoHash  # type: ignore[assignment]
    if old is not None:  # another version's read/hash/copy pipeline, for an A/B in one process
        ds.DeviceStore._stream_specs = old  # type: ignore[method-assign]
    try:
        load_once(items, paths, **kw)  # warm (pinned pool, kernels)
        runs = [load_once(items, paths, **kw) for _ in range(reps)]
    finally:
        ds.checksum.new_hasher = orig
        ds.DeviceStore._stream_specs = orig_stream  # type: ignore[method-assign]
    nbytes = runs[0]["h2d_bytes"]
    return {
        "kw": kw,
        "nohash": nohash,
        "pipeline": "old" if old is not None else "this tree",
        "stream_GBps_median": nbytes / statistics.median(r["stream_s"] for r in runs) / 1e9,
        "end_to_end_GBps_median": nbytes / statistics.median(r["seconds"] for r in runs) / 1e9,
        "h2d_leg_GBps_median": statistics.median(r["h2d_leg_GBps"] for r in runs),
        "runs": runs,
    }


def pieces(paths: list[Path], chunk: int, threads: int) -> dict[str, Any]:
    """preadv alone, XXH3 alone, pinned copies alone and under hashing load."""
    warm_page_cache(paths)
    sizes = [p.stat().st_size for p in paths]
    jobs = [
        (p, off, min(chunk, sz - off))
        for p, sz in zip(paths, sizes, strict=True)
        for off in range(0, sz, chunk)
    ]
    total = sum(n for _, _, n in jobs)
    bufs = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(threads)]
    views = [b.numpy() for b in bufs]
    fds = {p: os.open(p, os.O_RDONLY) for p in paths}
    local = threading.local()
    counter = iter(range(10**9))
    lock = threading.Lock()

    def buf_index() -> int:
        if not hasattr(local, "i"):
            with lock:
                local.i = next(counter)
        return int(local.i)

    def rd(job: tuple[Path, int, int]) -> int:
        p, off, n = job
        return os.preadv(fds[p], [views[buf_index()].data[:n]], off)

    out: dict[str, Any] = {"bytes": total, "threads": threads, "chunk": chunk}
    for name, fn in (("preadv_GBps", rd),):
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(fn, jobs[: threads * 2]))
            t0 = time.perf_counter()
            list(ex.map(fn, jobs))
            out[name] = total / (time.perf_counter() - t0) / 1e9
    counter = iter(range(10**9))
    local = threading.local()

    def hs(job: tuple[Path, int, int]) -> None:
        h = checksum.new_hasher()
        h.update(views[buf_index()].data[: job[2]])

    with ThreadPoolExecutor(threads) as ex:
        t0 = time.perf_counter()
        list(ex.map(hs, jobs))
        out["xxh3_GBps"] = total / (time.perf_counter() - t0) / 1e9
    for fd in fds.values():
        os.close(fd)
    # pinned chunk copies alone, then while `threads` threads hash other pinned buffers
    src = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True).fill_(i) for i in range(4)]
    n = total // chunk
    dst = torch.empty((n, chunk), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()

    def copies() -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            e0.record(s)
            for i in range(n):
                dst[i].copy_(src[i % 4], non_blocking=True)
            e1.record(s)
        s.synchronize()
        return n * chunk / (e0.elapsed_time(e1) / 1e3) / 1e9

    copies()
    out["copy_alone_GBps"] = copies()
    stop = threading.Event()
    hb = [np.random.default_rng(i).integers(0, 255, 64 << 20, dtype=np.uint8) for i in range(threads)]

    def spin(i: int) -> None:
        while not stop.is_set():
            checksum.new_hasher().update(hb[i].data)

    ts = [threading.Thread(target=spin, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    time.sleep(0.05)
    out["copy_while_hashing_GBps"] = copies()
    stop.set()
    for t in ts:
        t.join()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="diag_upload.json")
    ap.add_argument("--old", default=None, help="another device_store.py: its _stream_specs runs as 'old'")
    ap.add_argument("--pieces", action="store_true", help="also time preadv, XXH3 and copies alone")
    ap.add_argument(
        "--staging-mib",
        default=None,
        help="comma list of staging chunk sizes (MiB): only these variants, the list run twice in turn",
    )
    a = ap.parse_args()
    paths = sorted(Path(a.data).glob("*.fxcache"))
    items = loader_items(paths)
    res: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.diag_upload", *sys.argv[1:]]),
        "when": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "machine": machine(),
        "files": [p.name for p in paths],
        "variants": [],
    }
    old = None
    if a.old:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_old_device_store", a.old)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        old = mod.DeviceStore._stream_specs
    grid: list[dict[str, Any]] = [
        dict(nohash=False, old=True),
        dict(nohash=False),
        dict(nohash=False, old=True),
        dict(nohash=False),
        dict(nohash=True, old=True),
        dict(nohash=True),
        dict(nohash=False, io_threads=12),
        dict(nohash=False, io_threads=14),
        dict(nohash=False, io_threads=14, staging_bytes=16 << 20),
        dict(nohash=False, staging_bytes=32 << 20),
        dict(nohash=False, old=True, staging_bytes=32 << 20),
    ]
    if a.staging_mib:
        sizes = [int(m) for m in a.staging_mib.split(",")]
        grid = [dict(nohash=False, staging_bytes=m << 20) for _ in range(2) for m in sizes]
    for g in grid:
        g = {**g}
        nh = bool(g.pop("nohash"))
        use_old = bool(g.pop("old", False))
        if use_old and old is None:
            continue
        v = variant(items, paths, a.reps, nh, old if use_old else None, **g)
        res["variants"].append(v)
        print(
            f"{v['pipeline']:9} nohash={nh!s:5} {g!s:45} stream {v['stream_GBps_median']:6.1f} GB/s  e2e "
            f"{v['end_to_end_GBps_median']:6.1f}  h2d leg {v['h2d_leg_GBps_median']:6.1f}",
            flush=True,
        )
        Path(a.out).write_text(json.dumps(res, indent=2, default=str))
    if not a.pieces:
        return
    for thr in (8, 14):
        res.setdefault("pieces", []).append(pieces(paths, 8 << 20, thr))
        print("pieces", res["pieces"][-1], flush=True)
        Path(a.out).write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
