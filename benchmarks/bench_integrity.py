"""Integrity benchmark (issue 8): cost of the whole-file source hash and of the body checksums.

On the trades and MBP-10 files of one ``--scale 1`` quarter it measures, in this process, with
the source files in the page cache (each figure the best of ``REPEATS`` runs):

- ``hash_file``: XXH3-128 of the whole raw file (what a stat change costs: a re-hash);
- ``decode``: ``build_sidecar`` as the pipeline runs it (the decoder hashes the source bytes it
  reads and every column it writes), and ``decode_unhashed`` with both hashes replaced by a
  no-op, so the difference is what the checksums add to a decode;
- ``verify_full``: ``verify_sidecar`` (source re-hashed + every column hashed: the asset check);
- ``reuse_check``: ``ensure_sidecar`` of the fresh sidecar (stat record, sampled body blocks).

Stage tables: ``write_table`` with and without checksums and ``verify_table`` for a bars-shaped
(488 k rows, 14 columns) and a bar-features-shaped (488 k x 29 float64) table.

Target: hashing the raw file < 10 % of its decode time. Usage:
``python -m benchmarks.bench_integrity [--root DIR]`` (DIR: a ``fx-assets synth`` output with
one quarter; default: the last quarter of the benchmarks' scale-1 market, benchmarks/data).
``--quick`` (``make bench-quick``): the small quick market, result ``bench_integrity_quick``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import (
    DATA,
    LAST_QUARTER,
    MAIN_MARKET,
    QUICK_MARKET,
    command_line,
    ensure_market,
    load_average,
    raw_file,
    target,
    write_result,
)

REPEATS = 3


def best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(min(times), 4)


class _NoHash:
    def update(self, _data: object) -> None:
        pass

    def hexdigest(self) -> str:
        return "0" * 32


def _sidecar_figures(source: Path, work: Path) -> dict[str, Any]:
    from fx_assets.core import sidecar
    from fx_assets.core.checksum import hash_file

    dest = work / f"{source.parent.parent.name}.arrow"
    hash_s = best(lambda: hash_file(source))
    decode_s = best(lambda: sidecar.build_sidecar(source, dest), 2)
    real = sidecar.new_hasher
    sidecar.new_hasher = _NoHash  # type: ignore[assignment,misc]
    try:
        unhashed_s = best(lambda: sidecar.build_sidecar(source, work / "unhashed.arrow"), 2)
    finally:
        sidecar.new_hasher = real  # type: ignore[assignment]
        (work / "unhashed.arrow").unlink(missing_ok=True)
    sc = work / "sc"
    info = sidecar.ensure_sidecar(source, sc)
    verify_s = best(lambda: sidecar.verify_sidecar(info.path, source), 2)
    reuse_s = best(lambda: sidecar.ensure_sidecar(source, sc), 5)
    out = {
        "source_bytes": source.stat().st_size,
        "sidecar_bytes": info.path.stat().st_size,
        "n_records": info.n_records,
        "hash_file_s": hash_s,
        "hash_file_gb_per_s": round(source.stat().st_size / hash_s / 1e9, 2),
        "decode_s": decode_s,
        "decode_unhashed_s": unhashed_s,
        "checksums_add_s": round(decode_s - unhashed_s, 4),
        "hash_over_decode": round(hash_s / decode_s, 4),
        "verify_full_s": verify_s,
        "reuse_check_s": reuse_s,
    }
    shutil.rmtree(sc)
    dest.unlink(missing_ok=True)
    return out


def _table_figures(work: Path) -> dict[str, Any]:
    from fx_assets.core import tables

    rng = np.random.default_rng(0)
    n = 488_000
    bars = pa.table(
        {
            **{
                c: pa.array(np.sort(rng.integers(0, 2**62, n)))
                for c in ("ts_open", "ts_close", "duration_ns", "n_trades")
            },
            **{
                c: pa.array(rng.random(n))
                for c in ("open", "high", "low", "close", "volume", "buy_volume", "vwap")
            },
            "instrument_id": pa.array(rng.integers(0, 9, n).astype(np.uint32)),
            "session_id": pa.array(rng.integers(0, 90, n).astype(np.int32)),
            "forced_close": pa.array(rng.random(n) < 0.01),
        }
    )
    feats = pa.table({f"f{i:02d}": pa.array(rng.random(n)) for i in range(29)})
    out: dict[str, Any] = {}
    for name, t in (("bars", bars), ("bar_features", feats)):
        p = work / f"{name}.arrow"
        write_s = best(lambda t=t, p=p: tables.write_table(p, t))

        def plain(t: pa.Table = t, p: Path = p) -> None:
            with pa.OSFile(str(p) + ".plain", "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
                w.write_table(t.combine_chunks(), max_chunksize=n)

        plain_s = best(plain)
        verify_s = best(lambda p=p: tables.verify_table(p))
        out[name] = {
            "bytes": p.stat().st_size,
            "write_with_checksum_s": write_s,
            "write_plain_s": plain_s,
            "checksum_hash_s": best(lambda t=t: tables.table_checksums(t)),
            "verify_table_s": verify_s,
        }
    return out


def run(root: Path | None = None, quick: bool = False) -> dict[str, Any]:
    t_start = time.perf_counter()
    load_before = load_average()
    if root is None and quick:
        root = ensure_market(*QUICK_MARKET)
        sources = {s: raw_file(root, s, QUICK_MARKET[1]["quarters"][0]) for s in ("trades", "mbp-10")}
    elif root is None:
        base = ensure_market(*MAIN_MARKET)
        sources = {s: raw_file(base, s, LAST_QUARTER) for s in ("trades", "mbp-10")}
        root = base
    else:
        sources = {s: next((root / "raw" / s).rglob("*.dbn.zst")) for s in ("trades", "mbp-10")}
    figures: dict[str, Any] = {}
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        work = Path(tmp)
        for schema, src in sources.items():
            figures[schema] = _sidecar_figures(src, work)
        figures["tables"] = _table_figures(work)
    targets = [
        target(
            f"{schema}: whole-file hash < 10% of decode",
            figures[schema]["hash_over_decode"],
            "<",
            0.10,
            "",
            f"hash {figures[schema]['hash_file_s']} s vs decode {figures[schema]['decode_s']} s",
        )
        for schema in sources
    ]
    payload = {
        "mode": "quick" if quick else "full",
        "command": command_line(),
        "config": {
            "root": str(root),
            "sources": {k: str(v) for k, v in sources.items()},
            "repeats": REPEATS,
            "notes": "one process, page cache warm (files just read); best of the repeats; "
            "checksums_add_s = decode with hashing - decode with no-op hashers (noisy on a shared VM)",
        },
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "figures": figures,
        "targets": targets,
    }
    write_result("bench_integrity_quick" if quick else "bench_integrity", payload)
    return payload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="the small quick market (make bench-quick)")
    args = ap.parse_args()
    out = run(args.root, quick=args.quick)
    for t in out["targets"]:
        print(f"{'PASS' if t['pass'] else 'FAIL'}  {t['name']}: {t['value']}  ({t['note']})")


if __name__ == "__main__":
    main()
