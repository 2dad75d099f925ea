"""The 7 feature stages of a quarter through the core functions alone (no Dagster), timed per
stage: what the Dagster benchmarks (``bench_dagster_path``, ``bench_scaling``) compare against.

The calls are the assets' own (``fx_assets/assets/ingest.py``, ``features.py``): sidecars via
``ensure_sidecar`` in the data root's sidecar folders (so a sidecar Dagster decoded is reused
here and vice versa), the roll calendar seeded from the previous quarter's trades, bars of the
active contract, bar features warmed up from the previous quarter's bars, OFI warmed up from the
previous quarter's tail, fxcache assembly and write; each table written with ``write_table``.
Outputs go to ``out_dir`` (never the keyed Dagster files). Quarters run in order in one process;
the previous quarter's bars and roll calendar are read back from ``out_dir`` as the assets read
them, so nothing of an earlier quarter stays in memory.

    python -m benchmarks.stage_fns ROOT OUT_DIR 2023-Q4,2024-Q1 [--time-from 2024-Q1]

prints one JSON object: per quarter, seconds per stage, total, CPU seconds, memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

STAGES = (
    "predecoded_trades",
    "predecoded_mbp10",
    "roll_calendar",
    "bars",
    "bar_features",
    "ofi_features",
    "fxcache",
)
SYMBOL = "ES.FUT"


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class _Laps:
    """Wall and CPU seconds since the previous lap, per stage."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.t, self.c = time.perf_counter(), cpu_seconds()

    def lap(self, stage: str) -> None:
        now, cnow = time.perf_counter(), cpu_seconds()
        self.times[stage], self.cpu[stage] = round(now - self.t, 4), round(cnow - self.c, 4)
        self.t, self.c = now, cnow


def run_quarters(root: Path, out_dir: Path, quarters: list[str]) -> list[dict[str, Any]]:
    """Every stage of each quarter, in order, in this process; per-quarter figures."""
    from benchmarks.common import MemorySampler
    from fx_assets.core import lineage
    from fx_assets.core import ofi as ofi_core
    from fx_assets.core.active_contract import active_trades, roll_calendar_from_table
    from fx_assets.core.bar_features import validate_features
    from fx_assets.core.bar_rows import (
        assemble_fxcache_columns,
        quarter_bar_features,
        quarter_bars,
        quarter_ofi,
    )
    from fx_assets.core.bars import BarTable
    from fx_assets.core.book import BookSource
    from fx_assets.core.calendar import parse_quarter, previous_quarter, quarter_label
    from fx_assets.core.fxcache import write_fxcache
    from fx_assets.core.ofi_warmup import ofi_warmup_start
    from fx_assets.core.page_release import release_free_heap
    from fx_assets.core.paths import DataLayout
    from fx_assets.core.roll import roll_calendar_from_sidecars
    from fx_assets.core.sidecar import ensure_sidecar
    from fx_assets.core.tables import read_table, write_table
    from fx_assets.resources.pipeline import PipelineConfig

    layout = DataLayout(root)
    cfg = PipelineConfig().stage_configs()
    code = lineage.code_version("predecoded")
    out_dir.mkdir(parents=True, exist_ok=True)

    def sidecar(schema: str, q: Any) -> Any:
        src = layout.raw_file(schema, SYMBOL, q)
        if not src.is_file():
            return None
        return ensure_sidecar(
            src, layout.sidecar_dir(schema, SYMBOL), expect_schema=schema, code_version=code
        )

    def out(stage: str, q: Any) -> Path:
        return out_dir / f"{stage}_{quarter_label(q)}.{'fxcache' if stage == 'fxcache' else 'arrow'}"

    results = []
    for label in quarters:
        release_free_heap()  # as a run's first step does (assets.common.step_partition)
        q = parse_quarter(label)
        pq = previous_quarter(q)
        have_prev = out("bars", pq).is_file()
        laps = _Laps()
        with MemorySampler() as mem:
            t_all = time.perf_counter()
            lap = laps.lap
            tr = sidecar("trades", q)
            lap("predecoded_trades")
            bk = sidecar("mbp-10", q)
            lap("predecoded_mbp10")
            prev_tr = sidecar("trades", pq)
            cal = roll_calendar_from_sidecars(tr.path, prev_tr.path if prev_tr else None)
            write_table(out("roll_calendar", q), cal.to_arrow())
            lap("roll_calendar")
            trades = active_trades(tr.path, cal)
            bars = quarter_bars(trades, cfg.bars)
            write_table(out("bars", q), bars.to_arrow())
            lap("bars")
            prev_bars = (
                BarTable.from_arrow(read_table(out("bars", pq)), str(out("bars", pq))) if have_prev else None
            )
            feats = quarter_bar_features(bars, [prev_bars] if prev_bars is not None else [], cfg.bar_features)
            validate_features(feats, label)
            write_table(out("bar_features", q), feats.to_arrow())
            lap("bar_features")
            kw: dict[str, Any] = {}
            prev_bk = sidecar("mbp-10", pq) if have_prev else None
            if prev_bars is not None and prev_tr is not None and prev_bk is not None:
                prev_cal = roll_calendar_from_table(read_table(out("roll_calendar", pq)))
                prev_book = BookSource(prev_bk.path, prev_cal)
                start = ofi_warmup_start(prev_bars, prev_book, cfg.ofi)
                kw = {
                    "prev_bars": prev_bars,
                    "prev_trades": active_trades(prev_tr.path, prev_cal, after_ts=start),
                    "prev_book": prev_book,
                }
            book = BookSource(bk.path, cal)
            ofi = quarter_ofi(bars, trades, book, cfg.ofi, partition=label, **kw)
            ofi_core.validate_ofi(ofi, label)
            write_table(out("ofi_features", q), ofi.to_arrow())
            lap("ofi_features")
            ts, groups, dropped = assemble_fxcache_columns(bars, feats, ofi, book)
            write_fxcache(out("fxcache", q), ts, groups, cfg.fxcache.dtype, bytes(32), {"partition": label})
            lap("fxcache")
            total = time.perf_counter() - t_all
        results.append(
            {
                "quarter": label,
                "seconds": round(total, 3),
                "cpu_seconds": round(sum(laps.cpu.values()), 3),
                "stages": laps.times,
                "stage_cpu_seconds": laps.cpu,
                "bars": len(bars),
                "trades_in_file": trades.n_source,
                "book_records": bk.n_records,
                "warmed_up_from_previous_quarter": bool(kw),
                "dropped_rows": dropped,
                "peak_anon_mib": round(mem.peak_anon_mib, 1),
                "peak_rss_mib_so_far": round(_status_mib("VmHWM"), 1),
            }
        )
        del tr, bk, prev_tr, prev_bk, cal, trades, bars, prev_bars, feats, ofi, book, kw, ts, groups
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.stage_fns")
    p.add_argument("root", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("quarters", help="comma-separated, oldest first")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    import fx_assets.core.bar_rows  # noqa: F401  (imports are not the stages' time)

    import_s = time.perf_counter() - t0
    quarters = run_quarters(args.root, args.out_dir, args.quarters.split(","))
    print(
        json.dumps(
            {
                "import_seconds": round(import_s, 3),
                "quarters": quarters,
                "peak_rss_mib": round(_status_mib("VmHWM"), 1),
                "process_cpu_seconds": round(cpu_seconds(), 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
