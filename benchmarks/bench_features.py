"""Feature benchmark (issue "Bars, bar features and OFI"): sidecars -> bars, bar_features, ofi.

Runs the per-quarter stage drivers of ``fx_assets.core.bar_rows`` the way the assets do
(roll calendar, active trades, bars, bar features warmed up from the previous quarter's bars,
OFI warmed up from the previous quarter, each output written as an Arrow file), each
measurement in a fresh process so that its peak memory is its own:

- ``pipeline``: the last quarter (2024-Q1, ``--scale 1``) of data roots holding 1, 3 and 9
  quarters, sidecars warm; once more with the quarter's sidecars removed (cold, from
  ``.dbn.zst``). Wall time per stage, total, peak memory.
- ``ofi_heavy``: ``quarter_ofi`` on a book-heavy quarter (``book_ratio`` 2.5, ~47 M MBP-10
  records): book updates/s and peak memory.
- ``bars_core``: ``build_bars`` (volume bars) on ~20 M in-memory trades, pinned to one core.
- ``compile``: numba compile time: the pipeline on a tiny market in a fresh process with
  ``NUMBA_CACHE_DIR`` set to an empty directory, then again in a second process (cache warm).

Usage (``--help`` lists the options): ``python -m benchmarks.bench_features`` runs the 7 warm
stages (``--quick``: 3 rounds, ``--rounds N``, ``--baseline DIR``: another commit's export,
alternating, ``--name NAME``: benchmarks/results/NAME.json, ``--pin CPUS``: every stage process
on those CPUs, e.g. ``--pin 0``); ``--scaling`` the pipeline runs; ``... SUBCOMMAND ARGS`` one
child measurement (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench_decode import MIN_FREE_GB_HEAVY, sidecar_dir
from benchmarks.common import (
    DATA,
    HEAVY_MARKET,
    LAST_QUARTER,
    MAIN_MARKET,
    ROOT,
    TINY_MARKET,
    MemorySampler,
    _status_kib,
    command_line,
    ensure_market,
    free_disk_gb,
    in_subprocess,
    load_average,
    market_config,
    raw_file,
    target,
    write_result,
)

MODULE = "benchmarks.bench_features"
GB_MIB = 1e9 / 2**20  # targets are in GB (1e9 bytes); memory is measured in MiB


def _prev_label(label: str) -> str:
    from fx_assets.core.calendar import parse_quarter, previous_quarter, quarter_label

    return quarter_label(previous_quarter(parse_quarter(label)))


class Layout:
    """A data root (raw files) plus where its sidecars and stage files go."""

    def __init__(self, root: Path, sidecar_root: Path, stage_dir: Path) -> None:
        self.root, self.sidecar_root, self.stage_dir = Path(root), Path(sidecar_root), Path(stage_dir)

    def args(self) -> list[str]:
        return [str(self.root), str(self.sidecar_root), str(self.stage_dir)]

    def raw(self, schema: str, q: str) -> Path:
        return raw_file(self.root, schema, q)

    def has(self, q: str) -> bool:
        return self.raw("trades", q).is_file() and self.raw("mbp-10", q).is_file()

    def sidecar(self, schema: str, q: str) -> Any:
        from fx_assets.core.sidecar import ensure_sidecar

        return ensure_sidecar(self.raw(schema, q), sidecar_dir(self.sidecar_root, schema))

    def stage(self, name: str, q: str) -> Path:
        return self.stage_dir / f"{name}_{q}.arrow"


# --- single measurements (run in a fresh process) -------------------------------------------


def _prepare(root: str, sidecar_root: str, stage_dir: str, quarter: str) -> dict[str, Any]:
    """Untimed set-up: the previous quarter's sidecars, roll calendar and bars files (what the
    assets of that quarter would have left), and the quarter's own sidecars."""
    from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
    from fx_assets.core.bar_features import max_window
    from fx_assets.core.bar_rows import quarter_bars
    from fx_assets.core.bars import BarConfig
    from fx_assets.core.tables import write_table

    lay = Layout(Path(root), Path(sidecar_root), Path(stage_dir))
    lay.stage_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for schema in ("trades", "mbp-10"):
        lay.sidecar(schema, quarter)
    prev = _prev_label(quarter)
    done = []
    if lay.has(prev):
        pp = _prev_label(prev)
        pp_tr = lay.sidecar("trades", pp).path if lay.has(pp) else None
        tr = lay.sidecar("trades", prev).path
        lay.sidecar("mbp-10", prev)
        cal = quarter_roll_calendar(tr, pp_tr)
        write_table(lay.stage("roll_calendar", prev), cal.to_arrow())
        bars = quarter_bars(active_trades(tr, cal), BarConfig())
        if len(bars) < max_window():
            raise RuntimeError(f"{prev}: {len(bars)} bars, fewer than the warm-up needs")
        write_table(lay.stage("bars", prev), bars.to_arrow())
        done.append(prev)
    return {"prepared": done, "seconds": time.perf_counter() - t0}


def _pipeline(root: str, sidecar_root: str, stage_dir: str, quarter: str) -> dict[str, Any]:
    """The quarter's stages, timed one by one, in this (fresh) process."""
    t_imp = time.perf_counter()
    from fx_assets.core import ofi as ofi_core
    from fx_assets.core.active_contract import active_trades, quarter_roll_calendar, roll_calendar_from_table
    from fx_assets.core.bar_features import BarFeatureConfig, validate_features
    from fx_assets.core.bar_rows import quarter_bar_features, quarter_bars, quarter_ofi
    from fx_assets.core.bars import BarConfig, BarTable
    from fx_assets.core.book import BookSource
    from fx_assets.core.ofi_warmup import ofi_warmup_start
    from fx_assets.core.tables import read_table, write_table

    import_s = time.perf_counter() - t_imp
    lay = Layout(Path(root), Path(sidecar_root), Path(stage_dir))
    lay.stage_dir.mkdir(parents=True, exist_ok=True)
    prev = _prev_label(quarter)
    has_prev = lay.has(prev)
    stages: dict[str, float] = {}
    counts: dict[str, Any] = {}
    anon_after: dict[str, float] = {}
    peak_by: dict[str, float] = {}
    mem = MemorySampler()

    def lap(name: str, t: float) -> float:
        now = time.perf_counter()
        stages[name] = round(now - t, 4)
        anon_after[name] = round(_status_kib("RssAnon") / 1024, 1)
        peak_by[name] = round(mem.peak_anon_mib, 1)  # running peak (5 ms sampling)
        return now

    with mem:
        t_all = t = time.perf_counter()
        # ingest: sidecars (reused if fresh: header hash + stat; rebuilt from .dbn.zst if absent)
        tr = lay.sidecar("trades", quarter)
        bk = lay.sidecar("mbp-10", quarter)
        prev_tr = lay.sidecar("trades", prev) if has_prev else None
        prev_bk = lay.sidecar("mbp-10", prev) if has_prev else None
        counts["sidecars_rebuilt"] = [i.schema for i in (tr, bk) if i.rebuilt]
        t = lap("sidecars", t)
        cal = quarter_roll_calendar(tr.path, prev_tr.path if prev_tr else None)
        write_table(lay.stage("roll_calendar", quarter), cal.to_arrow())
        t = lap("roll_calendar", t)
        trades = active_trades(tr.path, cal)
        t = lap("active_trades", t)
        bars = quarter_bars(trades, BarConfig())
        t = lap("bars", t)
        write_table(lay.stage("bars", quarter), bars.to_arrow())
        t = lap("bars_write", t)
        previous = []
        prev_bars = None
        if has_prev:
            path = lay.stage("bars", prev)
            prev_bars = BarTable.from_arrow(read_table(path), str(path))
            previous = [prev_bars]
        feats = quarter_bar_features(bars, previous, BarFeatureConfig())
        validate_features(feats, quarter)
        t = lap("bar_features", t)
        write_table(lay.stage("bar_features", quarter), feats.to_arrow())
        t = lap("bar_features_write", t)
        kw: dict[str, Any] = {}
        if has_prev and prev_tr is not None and prev_bk is not None and prev_bars is not None:
            prev_cal = roll_calendar_from_table(read_table(lay.stage("roll_calendar", prev)))
            prev_book = BookSource(prev_bk.path, prev_cal)
            start = ofi_warmup_start(prev_bars, prev_book, ofi_core.OfiConfig())
            kw = {
                "prev_bars": prev_bars,
                "prev_trades": active_trades(prev_tr.path, prev_cal, after_ts=start),
                "prev_book": prev_book,
            }
        t = lap("ofi_prev_quarter_inputs", t)
        ofi = quarter_ofi(
            bars, trades, BookSource(bk.path, cal), ofi_core.OfiConfig(), partition=quarter, **kw
        )
        ofi_core.validate_ofi(ofi, quarter)
        t = lap("ofi", t)
        write_table(lay.stage("ofi_features", quarter), ofi.to_arrow())
        t = lap("ofi_write", t)
        total = t - t_all
    counts.update(
        trades_in_file=trades.n_source,
        active_trades=len(trades),
        bars=len(bars),
        book_records=bk.n_records,
        warmed_up_from=prev if has_prev else None,
        bar_features=len(feats.columns),
        ofi_features=len(ofi.columns),
    )
    return {
        "seconds": round(total, 3),
        "stages": stages,
        "import_seconds": round(import_s, 3),
        "counts": counts,
        "peak_anon_mib": round(mem.peak_anon_mib, 1),
        "peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1),
        "anon_mib_after_stage": anon_after,
        "running_peak_anon_mib_after_stage": peak_by,
    }


def _diagnose(root: str, sidecar_root: str, stage_dir: str, quarter: str) -> dict[str, Any]:
    """Where the feature time goes (1-quarter root, no warm-up, OFI on one worker):
    ``session_day`` on the quarter's trades, and ``quarter_ofi`` with its two numba passes
    timed, under the default config and with each per-bar window of the bar pass shrunk."""
    import numpy as np

    from fx_assets.core import ofi as ofi_core
    from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
    from fx_assets.core.bar_rows import quarter_bars, quarter_ofi
    from fx_assets.core.bars import BarConfig
    from fx_assets.core.book import BookSource
    from fx_assets.core.calendar import session_day
    from fx_assets.core.sidecar import sidecar_columns

    lay = Layout(Path(root), Path(sidecar_root), Path(stage_dir))
    tr = lay.sidecar("trades", quarter)
    bk = lay.sidecar("mbp-10", quarter)
    ts = np.array(sidecar_columns(tr.path, ["ts_recv"])["ts_recv"])
    t0 = time.perf_counter()
    session_day(ts)
    sd = time.perf_counter() - t0
    cal = quarter_roll_calendar(tr.path, None)
    trades = active_trades(tr.path, cal)
    bars = quarter_bars(trades, BarConfig())
    acc: dict[str, float] = {}
    orig = {name: getattr(ofi_core, name) for name in ("_bar_pass_nb", "_event_pass_nb")}

    def timed(name: str) -> Any:
        def call(*a: Any) -> None:
            t = time.perf_counter()
            orig[name](*a)
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t

        return call

    for name in orig:
        setattr(ofi_core, name, timed(name))
    variants: dict[str, dict[str, Any]] = {
        "default": {},
        "vpin_buckets=1": {"vpin_buckets": 1},
        "kyle_window=3": {"kyle_window": 3, "kyle_min_bars": 3},
        "hawkes_bars=1": {"hawkes_bars": 1},
        "trade_imbalance_windows=[1]": {"trade_imbalance_windows": [1]},
        "all_windows_small": {
            "vpin_buckets": 1,
            "kyle_window": 3,
            "kyle_min_bars": 3,
            "hawkes_bars": 1,
            "trade_imbalance_windows": [1],
        },
    }
    book = BookSource(bk.path, cal)
    quarter_ofi(bars, trades, book, ofi_core.OfiConfig(n_workers=1))  # page in the sidecar
    out: dict[str, Any] = {}
    for name, kw in variants.items():
        acc.clear()
        t = time.perf_counter()
        quarter_ofi(bars, trades, book, ofi_core.OfiConfig(n_workers=1, **kw))
        total = time.perf_counter() - t
        out[name] = {
            "quarter_ofi_s": round(total, 3),
            "bar_pass_s": round(acc.get("_bar_pass_nb", 0.0), 3),
            "event_pass_s": round(acc.get("_event_pass_nb", 0.0), 3),
            "outside_kernels_s": round(total - sum(acc.values()), 3),
        }
    for name, fn in orig.items():
        setattr(ofi_core, name, fn)
    return {
        "n_trades_in_file": int(ts.shape[0]),
        "session_day_seconds_on_trades": round(sd, 3),
        "bars": len(bars),
        "book_records": bk.n_records,
        "quarter_ofi_one_worker": out,
    }


def _ofi_heavy(root: str, sidecar_root: str, stage_dir: str, quarter: str) -> dict[str, Any]:
    """``quarter_ofi`` of a book-heavy quarter (bars and roll calendar from ``_prepare``)."""
    import numpy as np

    from fx_assets.core import ofi as ofi_core
    from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
    from fx_assets.core.bar_rows import quarter_bars, quarter_ofi
    from fx_assets.core.bars import BarConfig
    from fx_assets.core.book import BookSource
    from fx_assets.core.sidecar import sidecar_columns

    lay = Layout(Path(root), Path(sidecar_root), Path(stage_dir))
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        tr = lay.sidecar("trades", quarter)
        bk = lay.sidecar("mbp-10", quarter)
        cal = quarter_roll_calendar(tr.path, None)
        trades = active_trades(tr.path, cal)
        bars = quarter_bars(trades, BarConfig())
        t1 = time.perf_counter()
        anon_before = mem.peak_anon_mib
        ofi = quarter_ofi(bars, trades, BookSource(bk.path, cal), ofi_core.OfiConfig(), partition=quarter)
        t2 = time.perf_counter()
        ofi_core.validate_ofi(ofi, quarter)
    iid = sidecar_columns(bk.path, ["instrument_id"])["instrument_id"]
    active_ids = np.unique(cal.instrument_id)
    n_active = int(np.isin(iid, active_ids).sum())  # upper bound: active in some session
    return {
        "seconds": round(t2 - t1, 3),
        "inputs_seconds": round(t1 - t0, 3),
        "book_records": bk.n_records,
        "book_records_of_active_contracts": n_active,
        "book_updates_per_s": round(bk.n_records / (t2 - t1)),
        "bars": len(bars),
        "peak_anon_mib_before_ofi": round(anon_before, 1),
        "peak_anon_mib": round(mem.peak_anon_mib, 1),
        "peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1),
        "rss_file_mib_at_end": round(_status_kib("RssFile") / 1024, 1),
    }


def _bars_core(root: str, sidecar_root: str, stage_dir: str, quarter: str) -> dict[str, Any]:
    """``build_bars`` (volume bars) on the quarter's active trades, in memory, on one core."""
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    import numpy as np

    from fx_assets.core import bars as bars_mod
    from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
    from fx_assets.core.bars import BarConfig, build_bars

    lay = Layout(Path(root), Path(sidecar_root), Path(stage_dir))
    tr = lay.sidecar("trades", quarter)
    t = active_trades(tr.path, quarter_roll_calendar(tr.path, None))
    cols = [
        np.ascontiguousarray(a).copy() for a in (t.ts, t.price, t.size, t.sign, t.session, t.instrument_id)
    ]
    ts, px, sz, sg, ss, ii = cols
    cfg = BarConfig()
    k = 10_000
    build_bars(ts[:k], px[:k], sz[:k], sg[:k], ss[:k], ii[:k], cfg)  # load the cached kernel untimed
    times = []
    n_bars = 0
    for _ in range(5):
        t0 = time.perf_counter()
        b = build_bars(ts, px, sz, sg, ss, ii, cfg)
        times.append(time.perf_counter() - t0)
        n_bars = len(b)
    # where the time goes: input checks / conversions vs the numba kernel
    t0 = time.perf_counter()
    checked = bars_mod._check_inputs(*cols)
    check_s = time.perf_counter() - t0
    n = len(cols[0])
    return {
        "cpu": cpu,
        "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
        "n_trades": n,
        "n_bars": n_bars,
        "seconds_runs": [round(x, 4) for x in times],
        "seconds": round(min(times), 4),
        "seconds_median": round(sorted(times)[len(times) // 2], 4),
        "trades_per_s": round(n / min(times)),
        "check_inputs_seconds": round(check_s, 4),
        "input_dtypes": [str(c.dtype) for c in cols],
        "checked_dtypes": [str(c.dtype) for c in checked],
    }


# --- the 7 feature stages as the assets run them (issue 10, "Warm, stage functions") ------------

SYMBOL = "ES.FUT"
STAGES_QUARTER = "2024-Q3"  # the quarter of /work/main/benchmarks/data/scaleout_scale1
STAGES_PREV = "2024-Q2"
STAGE_OUTPUTS = ("roll_calendar", "bars", "bar_features", "ofi_features", "fxcache")
# OFI baseline: median of the ofi_features stage on main before this branch's changes
# (benchmarks/results/bench_features.json records where and when it was measured).
OFI_BASELINE: dict[str, Any] = {}


def _cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return r.ru_utime + r.ru_stime


def _asset_stages(root: str, quarter: str) -> dict[str, Any]:
    """The 7 stages of ``definitions.FEATURE_STAGES`` for one partition, in this (fresh)
    process, each through the calls its asset body makes (``fx_assets.assets.ingest`` /
    ``features``): keyed paths from ``StageIO`` (source identities, cache keys), sidecars via
    ``require_sidecar`` (reuse + checksum verification), the one core function, the asset's
    own checks, and ``write_table`` (stage-table checksums) / ``write_fxcache``; the fxcache
    stage also runs its blocking asset check's verifications (``fxcache_identity`` and
    ``verify_once(path, "fxcache", verify_fxcache)``; after the asset's ``write_fxcache(...,
    read_back=True)`` where the checkout has it, they find the file verified). Wall and CPU time per stage;
    the output checksums, so that runs before and after a change can be compared."""
    t_imp = time.perf_counter()
    import numpy as np

    from fx_assets import definitions
    from fx_assets.assets.common import StageIO, require_sidecar
    from fx_assets.assets.features import _book, _load_bars, warmup_bars
    from fx_assets.core import ofi as ofi_core
    from fx_assets.core import roll as roll_core
    from fx_assets.core.active_contract import active_trade_flow
    from fx_assets.core.bar_features import FeatureTable, validate_features
    from fx_assets.core.bar_rows import (
        assemble_fxcache_columns,
        quarter_bar_features,
        quarter_bars,
        quarter_ofi,
    )
    from fx_assets.core.bars import bars_per_session
    from fx_assets.core.calendar import parse_quarter, previous_quarter
    from fx_assets.core.fxcache import read_header, verify_fxcache, write_fxcache
    from fx_assets.core.ofi_warmup import ofi_warmup_start
    from fx_assets.core.tables import read_table, write_table
    from fx_assets.partitions import QuarterSymbol
    from fx_assets.resources.pipeline import PipelineConfig
    from fx_assets.resources.storage import FxStorage

    # the OFI asset's trade loader: the trades left in the sidecar where this checkout has it
    try:
        from fx_assets.core.active_contract import trade_source as flow_fn
    except ImportError:
        flow_fn = active_trade_flow  # type: ignore[assignment]
    try:  # the bars asset's one pass (bar_rows.sidecar_bars), where this checkout has it
        from fx_assets.core import verify
        from fx_assets.core.active_contract import active_trades, roll_calendar_from_table
        from fx_assets.core.bar_rows import sidecar_bars
    except ImportError:
        sidecar_bars = None  # type: ignore[assignment]

    import inspect

    # The fxcache asset's read-back verification where this checkout has it, and the
    # fxcache_valid check's verifications (fxcache_identity: every byte against the checksums;
    # verify_once of verify_fxcache) where it has them (else verify_fxcache alone).
    read_back = "read_back" in inspect.signature(write_fxcache).parameters
    write_alongside = "alongside" in inspect.signature(write_table).parameters
    try:
        from fx_assets.core.verified import fxcache_identity, verify_once
    except ImportError:
        verify_once = None  # type: ignore[assignment]

    def _active(io: Any, quarter: Any) -> Any:
        cal = roll_calendar_from_table(read_table(io.require("roll_calendar", quarter)))
        return active_trades(io.sidecar("trades", quarter).path, cal)

    import_s = time.perf_counter() - t_imp
    storage = FxStorage(root=root)
    part = QuarterSymbol(parse_quarter(quarter), SYMBOL)
    q = part.quarter
    # One StageIO per asset, as each asset builds its own (keys and identities not shared).
    pipeline = PipelineConfig()

    def new_io() -> StageIO:
        return StageIO(storage, pipeline, part)

    def predecoded(schema: str) -> Any:
        info = require_sidecar(storage, schema, part)
        return {"reused": bool(info.reused), "records": int(info.n_records)}

    def roll_calendar() -> Any:
        io = new_io()
        info = io.sidecar("trades")
        prev_q = previous_quarter(q)
        prev = io.sidecar("trades", prev_q) if io.has_raw("trades", prev_q) else None
        cal = roll_core.roll_calendar_from_sidecars(info.path, prev.path if prev else None)
        write_table(io.path("roll_calendar"), cal.to_arrow())
        return {"sessions": len(cal), "rolls": len(cal.events)}

    def bars() -> Any:
        io = new_io()
        if sidecar_bars is None:  # a checkout before bar_rows.sidecar_bars
            trades = _active(io, q)
            table = quarter_bars(trades, io.cfg.bars)
            write_table(io.path("bars"), table.to_arrow())
            bars_per_session(table)
            if float(table.volume.sum()) != float(trades.size.sum()):
                raise RuntimeError("bar volume != traded volume")
            return {"bars": len(table), "trades_used": len(trades), "trades_in_file": trades.n_source}
        cal = roll_calendar_from_table(read_table(io.require("roll_calendar", q)))
        path = io.sidecar("trades", q).path
        built = sidecar_bars(path, cal, io.cfg.bars)
        out = write_table(io.path("bars"), built.bars.to_arrow())
        bars_per_session(built.bars)
        verify.bar_volume_totals(
            built.bars,
            built.n_trades,
            built.volume,
            partition=part.label,
            bars_path=out,
            trades=lambda: active_trades(path, cal),
        )
        return {"bars": len(built.bars), "trades_used": built.n_trades, "trades_in_file": built.n_source}

    def bar_features() -> Any:
        io = new_io()
        cur = _load_bars(io, q)
        table = quarter_bar_features(cur, warmup_bars(io), io.cfg.bar_features)
        validate_features(table, part.label)
        write_table(io.path("bar_features"), table.to_arrow())
        return {"rows": len(table), "warmup_bars": table.n_prior}

    def ofi_features() -> Any:
        io = new_io()
        cur = _load_bars(io, q)
        kw: dict[str, Any] = {}
        pq = io.ofi_warmup_quarter()
        if pq is not None:
            prev_bars, prev_book = _load_bars(io, pq), _book(io, pq)
            start = ofi_warmup_start(prev_bars, prev_book, io.cfg.ofi)
            kw = {
                "prev_bars": prev_bars,
                "prev_trades": flow_fn(io.sidecar("trades", pq).path, prev_book.calendar, after_ts=start),
                "prev_book": prev_book,
            }
        book = _book(io, q)
        trades = flow_fn(io.sidecar("trades", q).path, book.calendar)
        feats = quarter_ofi(cur, trades, book, io.cfg.ofi, partition=part.label, **kw)
        if write_alongside:  # the asset validates while it writes, where this checkout can
            write_table(
                io.path("ofi_features"),
                feats.to_arrow(),
                alongside=lambda: ofi_core.validate_ofi(feats, part.label),
            )
        else:
            ofi_core.validate_ofi(feats, part.label)
            write_table(io.path("ofi_features"), feats.to_arrow())
        return {"rows": len(feats), "warmed_up": bool(kw)}

    def fxcache() -> Any:
        io = new_io()
        cur = _load_bars(io, q)
        feats = FeatureTable.from_arrow(read_table(io.require("bar_features")))
        ofi = ofi_core.OfiFeatures.from_arrow(read_table(io.require("ofi_features")))
        key = io.key("fxcache")
        ts, groups, dropped = assemble_fxcache_columns(cur, feats, ofi, _book(io, q))
        path = io.path("fxcache")
        meta = {"partition": part.label, "dropped_rows": dropped, "cache_key": key}
        t = time.perf_counter()
        if read_back:  # the asset reads the file back and records it verified in full
            write_fxcache(path, ts, groups, io.cfg.fxcache.dtype, bytes.fromhex(key), meta, read_back=True)
        else:
            write_fxcache(path, ts, groups, io.cfg.fxcache.dtype, bytes.fromhex(key), meta)
        t_write = time.perf_counter() - t
        t = time.perf_counter()
        if verify_once is not None:  # what the fxcache_valid check verifies, in its order
            fxcache_identity(path)
            verify_once(path, "fxcache", verify_fxcache)
        else:
            verify_fxcache(path)
        return {
            "rows": len(ts),
            "dropped": dropped["total"],
            "write_s": round(t_write, 4),
            "verify_s": round(time.perf_counter() - t, 4),
        }

    fns = {
        "predecoded_trades": lambda: predecoded("trades"),
        "predecoded_mbp10": lambda: predecoded("mbp-10"),
        "roll_calendar": roll_calendar,
        "bars": bars,
        "bar_features": bar_features,
        "ofi_features": ofi_features,
        "fxcache": fxcache,
    }
    if tuple(fns) != tuple(definitions.FEATURE_STAGES):
        raise RuntimeError(
            f"stage list {tuple(fns)} != definitions.FEATURE_STAGES {definitions.FEATURE_STAGES}"
        )
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    info: dict[str, Any] = {}
    t_all, c_all = time.perf_counter(), _cpu_s()
    for name, fn in fns.items():
        t, c = time.perf_counter(), _cpu_s()
        info[name] = fn()
        wall[name] = round(time.perf_counter() - t, 4)
        cpu[name] = round(_cpu_s() - c, 4)
    total_wall, total_cpu = time.perf_counter() - t_all, _cpu_s() - c_all
    # What was written: every stage table's column checksums and the fxcache body checksums.
    io = new_io()
    outputs: dict[str, Any] = {}
    for stage in STAGE_OUTPUTS:
        path = io.path(stage)
        if stage == "fxcache":
            h = read_header(path)
            outputs[stage] = {k: v.hex() for k, v in h.checksums().items()}
        else:
            md = read_table(path).schema.metadata or {}
            outputs[stage] = json.loads(md[b"fx.checksums"])
    del np
    return {
        "seconds": round(total_wall, 4),
        "cpu_seconds": round(total_cpu, 4),
        "wall": wall,
        "cpu": cpu,
        "import_seconds": round(import_s, 3),
        "info": info,
        "outputs": outputs,
        "peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1),
    }


def _clear_outputs(root: Path, quarter: str) -> None:
    """Remove the quarter's stage files (not its sidecars), so the next run rebuilds them."""
    for stage in STAGE_OUTPUTS:
        d = root / "derived" / stage / SYMBOL
        for p in d.glob(f"{SYMBOL}_{quarter}.*"):
            p.unlink()


def stages_root(src_main: Path | None = None, name: str = "stages_2q") -> Path:
    """A data root of two ``--scale 1`` quarters: 2024-Q3 is main's scale-out quarter (read
    through a symlink), 2024-Q2 is generated here (quarters are independent in the generator:
    the same bytes as generating both together). Sidecars and stage files are this root's."""
    main_q = src_main or Path("/work/main/benchmarks/data/scaleout_scale1")
    q2 = ensure_market("es_s1_2024q2", market_config([STAGES_PREV], scale=1.0, book_ratio=0.1))
    root = DATA / name
    for schema in ("trades", "mbp-10"):
        for q, src in ((STAGES_PREV, q2), (STAGES_QUARTER, main_q)):
            link = raw_file(root, schema, q)
            target_file = raw_file(src, schema, q)
            if not target_file.is_file():
                # no main checkout: generate the quarter here
                gen = ensure_market(f"es_s1_{q.replace('-', '').lower()}", market_config([q], 1.0, 0.1))
                target_file = raw_file(gen, schema, q)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() and link.resolve() != target_file.resolve():
                link.unlink()
            if not link.exists():
                link.symlink_to(target_file)
    return root


# --- orchestration ---------------------------------------------------------------------------


def _view_root(main_root: Path, k: int) -> Path:
    """A data root holding the last ``k`` quarters of the main market (symlinks: quarters are
    generated independently, so this is exactly what generating only those quarters gives)."""
    from benchmarks.common import QUARTERS_9

    root = DATA / "roots" / f"q{k}"
    if root.exists():
        shutil.rmtree(root)
    for q in QUARTERS_9[-k:]:
        for schema in ("trades", "mbp-10"):
            link = raw_file(root, schema, q)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(raw_file(main_root, schema, q))
    return root


def _log(msg: str) -> None:
    print(f"[features] {msg}", file=sys.stderr, flush=True)


def run_scaling() -> dict[str, Any]:
    """The earlier measurements (1/3/9-quarter roots of the 9-quarter market, a book-heavy quarter,
    build_bars on one core, numba compile); writes benchmarks/results/bench_features_scaling.json.
    Needs ~30 GB of benchmark data: ``python -m benchmarks.bench_features --scaling``."""
    from fx_assets.core.sidecar import sidecar_path

    load_before = load_average()
    t_start = time.perf_counter()
    main_root = ensure_market(*MAIN_MARKET)
    q = LAST_QUARTER
    figures: dict[str, Any] = {"pipeline_warm": {}, "pipeline_cold": {}}

    # 1, 3, 9 quarters; sidecars are shared (keyed by the resolved source path)
    layouts = {}
    for k in (1, 3, 9):
        root = _view_root(main_root, k)
        layouts[k] = Layout(root, main_root, root / "stages")
        _log(f"prepare {k}-quarter root")
        in_subprocess(MODULE, "prepare", *layouts[k].args(), q)
    # One untimed pass first: numba recompiles (and rewrites its on-disk cache) for any edited
    # module on first use, which would otherwise be charged to whichever run comes first.
    _log("pipeline, untimed warm-up of the numba cache")
    in_subprocess(MODULE, "pipeline", *layouts[3].args(), q)
    for k in (1, 3, 9, 3):
        _log(f"pipeline, {k}-quarter root, warm sidecars")
        r = in_subprocess(MODULE, "pipeline", *layouts[k].args(), q)
        key = f"{k}_quarters" if f"{k}_quarters" not in figures["pipeline_warm"] else f"{k}_quarters_repeat"
        figures["pipeline_warm"][key] = r
    # cold: this quarter's sidecars removed (the previous quarter's were built when it was processed)
    for schema in ("trades", "mbp-10"):
        sidecar_path(raw_file(main_root, schema, q), sidecar_dir(main_root, schema)).unlink(missing_ok=True)
    _log("pipeline, 3-quarter root, cold (sidecars of the quarter removed)")
    figures["pipeline_cold"]["3_quarters"] = in_subprocess(MODULE, "pipeline", *layouts[3].args(), q)

    _log("diagnostics: session_day and quarter_ofi by kernel (one worker)")
    figures["diagnostics"] = in_subprocess(MODULE, "diagnose", *layouts[1].args(), q)

    _log("build_bars on one core")
    figures["bars_core"] = in_subprocess(
        MODULE, "bars_core", *layouts[1].args(), q, env={"NUMBA_NUM_THREADS": "1"}
    )

    # numba compile: tiny market, empty cache then warm cache
    tiny = ensure_market(*TINY_MARKET)
    tiny_lay = Layout(tiny, tiny, tiny / "stages")
    in_subprocess(MODULE, "prepare", *tiny_lay.args(), q)
    cache = Path(tempfile.mkdtemp(prefix="numba-cache-", dir=DATA))
    try:
        _log(f"numba compile: empty NUMBA_CACHE_DIR {cache}")
        first = in_subprocess(MODULE, "pipeline", *tiny_lay.args(), q, env={"NUMBA_CACHE_DIR": str(cache)})
        _log("numba compile: warm cache")
        second = in_subprocess(MODULE, "pipeline", *tiny_lay.args(), q, env={"NUMBA_CACHE_DIR": str(cache)})
        n_cache_files = sum(1 for _ in cache.rglob("*.nbi"))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    figures["numba_compile"] = {
        "market": TINY_MARKET[1],
        "empty_cache": first,
        "warm_cache": second,
        "compile_seconds": round(first["seconds"] - second["seconds"], 3),
        "compile_seconds_by_stage": {
            s: round(first["stages"][s] - second["stages"][s], 3) for s in first["stages"]
        },
        "cache_index_files": n_cache_files,
    }

    # book-heavy quarter through quarter_ofi
    heavy_root = ensure_market(*HEAVY_MARKET)
    heavy_lay = Layout(heavy_root, heavy_root, heavy_root / "stages")
    heavy_sc = sidecar_path(raw_file(heavy_root, "mbp-10", q), sidecar_dir(heavy_root, "mbp-10"))
    free = free_disk_gb(heavy_root)
    heavy_skip = None
    if not heavy_sc.exists() and free < MIN_FREE_GB_HEAVY:
        heavy_skip = f"skipped: book-heavy sidecar absent and {free:.1f} GB free < {MIN_FREE_GB_HEAVY} GB"
        _log(heavy_skip)
        figures["ofi_book_heavy"] = {"skipped": heavy_skip}
    else:
        _log("book-heavy quarter: sidecars (reused if bench_decode left them)")
        in_subprocess(MODULE, "prepare", *heavy_lay.args(), q)
        _log("book-heavy quarter: quarter_ofi")
        figures["ofi_book_heavy"] = in_subprocess(MODULE, "ofi_heavy", *heavy_lay.args(), q)

    warm = figures["pipeline_warm"]
    targets = []
    for key, r in warm.items():
        targets.append(
            target(f"warm pipeline ({key.replace('_', ' ')} root): total wall", r["seconds"], "<", 3, "s")
        )
    for key, r in warm.items():
        targets.append(
            target(
                f"warm pipeline ({key.replace('_', ' ')} root): peak anon memory",
                r["peak_anon_mib"],
                "<",
                round(3 * GB_MIB),
                "MiB",
                f"VmHWM (incl. mapped sidecar pages) {r['peak_rss_mib']} MiB",
            )
        )
    for key, r in warm.items():
        bf_s = r["stages"]["bar_features"]
        targets.append(
            target(
                f"warm pipeline ({key.replace('_', ' ')} root): quarter_bar_features + validate",
                round(r["counts"]["bars"] / bf_s) if bf_s > 0 else None,
                ">=",
                20_000,
                "bars/s",
                "the speed floor that was a timed assertion in test_bar_features.py",
            )
        )
    targets.append(
        target(
            "warm pipeline: peak anon independent of the number of quarters (9-quarter root <= 3-quarter root + 5%)",
            warm["9_quarters"]["peak_anon_mib"],
            "<=",
            round(1.05 * warm["3_quarters"]["peak_anon_mib"], 1),
            "MiB",
            "1 / 3 / 9 quarters: "
            + " / ".join(str(warm[f"{k}_quarters"]["peak_anon_mib"]) for k in (1, 3, 9))
            + " MiB anon; VmHWM "
            + " / ".join(str(warm[f"{k}_quarters"]["peak_rss_mib"]) for k in (1, 3, 9))
            + " MiB",
        )
    )
    cold = figures["pipeline_cold"]["3_quarters"]
    targets.append(
        target("cold pipeline (sidecars of the quarter rebuilt): total wall", cold["seconds"], "<", 10, "s")
    )
    heavy = figures["ofi_book_heavy"]
    if "skipped" in heavy:
        targets.append(
            target("book-heavy quarter_ofi: book updates/s", None, ">=", 2e6, "/s", heavy_skip or "")
        )
    else:
        targets.append(
            target("book-heavy quarter_ofi: book updates/s", heavy["book_updates_per_s"], ">=", 2e6, "/s")
        )
        targets.append(
            target(
                "book-heavy quarter_ofi: peak anon memory",
                heavy["peak_anon_mib"],
                "<",
                round(4 * GB_MIB),
                "MiB",
                f"VmHWM (incl. mapped sidecar pages) {heavy['peak_rss_mib']} MiB",
            )
        )
        targets.append(
            target("book-heavy quarter_ofi: VmHWM", heavy["peak_rss_mib"], "<", round(4 * GB_MIB), "MiB")
        )
    bc = figures["bars_core"]
    targets.append(target("build_bars (volume) on one core", bc["trades_per_s"], ">=", 150e6, "trades/s"))
    payload = {
        "command": command_line(),
        "config": {
            "main_market": MAIN_MARKET[1],
            "heavy_market": HEAVY_MARKET[1],
            "quarter": q,
            "stage_configs": "BarConfig(), BarFeatureConfig(), OfiConfig() defaults (volume bars of 100 contracts)",
            "book_chunk": "stages.DEFAULT_BOOK_CHUNK (500,000 book events (plus trades / 8))",
            "sidecar_chunk_bytes": "sidecar.DEFAULT_CHUNK_BYTES (1 MiB)",
            "roots": "1, 3, 9 quarter roots are symlinks to the last quarters of the 9-quarter market; "
            "sidecars shared; the previous quarter's roll calendar and bars are written by an untimed "
            "prepare step, as the assets of that quarter would have",
            "pipeline": "one process: ensure_sidecar x4, quarter_roll_calendar + write, active_trades, "
            "quarter_bars + write, quarter_bar_features + validate + write, previous quarter's calendar "
            "and active trades, quarter_ofi + validate + write (the active trades are loaded once, "
            "the ofi_features asset loads them again)",
        },
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "figures": figures,
        "targets": targets,
    }
    write_result("bench_features_scaling", payload)
    return payload


def _summary(values: list[float]) -> dict[str, Any]:
    """{min, median, max, rounds} of one figure over the rounds (as benchmarks.common would)."""
    v = sorted(values)
    return {"min": v[0], "median": float(statistics.median(v)), "max": v[-1], "rounds": len(v)}


def rounds_summary(values: list[float]) -> dict[str, Any]:
    """benchmarks.common.rounds_summary where the branch adding it is merged, else ``_summary``."""
    from benchmarks import common

    fn = getattr(common, "rounds_summary", None)
    return dict(fn(values)) if callable(fn) else _summary(values)


def _stages_in(checkout: Path | None, root: Path, quarter: str) -> dict[str, Any]:
    """``_asset_stages`` in a fresh process, with ``fx_assets`` of this checkout or of
    ``checkout`` (an export of another commit holding this benchmark module)."""
    if checkout is None:
        return in_subprocess(MODULE, "stages", str(root), quarter)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(checkout))
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, "stages", str(root), quarter],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout}: stages {quarter} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _comparable(outputs: dict[str, Any]) -> dict[str, Any]:
    """Output checksums that do not depend on the code version: every stage-table column, and
    the fxcache's ts / price / value blocks (its trailer holds the cache key, which does)."""
    return {
        k: ({r: v[r] for r in ("ts", "price", "values")} if k == "fxcache" else v) for k, v in outputs.items()
    }


def _git_head() -> str:
    """The commit measured: HEAD, or the CANDIDATE_COMMIT file of an exported checkout."""
    marker = ROOT.parent / "CANDIDATE_COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    proc = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False)
    return proc.stdout.strip()


def run(
    quick: bool = False, rounds: int | None = None, baseline: Path | None = None, name: str | None = None
) -> dict[str, Any]:
    """The 7 feature stages of a ``--scale 1`` quarter, warm, through the assets' calls
    (``_asset_stages``), each round in a fresh process; writes
    benchmarks/results/bench_features.json. ``quick``: 3 rounds, else 5. ``baseline``: an
    export of an earlier commit (``git archive COMMIT | tar -x -C DIR``, this module copied
    into it): its stages run in the same rounds, A B then B A (the order swapped every round),
    and its outputs must equal this checkout's bit for bit. ``name``: the result file's name (``--name=NAME``:
    benchmarks/results/NAME.json; by default bench_features, or bench_features_quick for a quick
    run, so that a quick run never replaces the full figures)."""
    name = name or ("bench_features_quick" if quick else "bench_features")
    n_rounds = rounds or (3 if quick else 5)
    load_before = load_average()
    t_start = time.perf_counter()
    checkouts: list[Path | None] = [None] if baseline is None else [baseline, None]
    # One data root per checkout: a baseline whose decoder code differs would otherwise find
    # this checkout's sidecars stale and rebuild them every round, and so would this checkout
    # (then no round is warm).
    roots = {co: stages_root(name="stages_2q" if co is None else "stages_2q_baseline") for co in checkouts}
    prev_run: dict[str, Any] = {}
    for co in checkouts:
        _log(
            f"stages ({co or 'this checkout'}): previous quarter {STAGES_PREV} (untimed, builds its outputs)"
        )
        root = roots[co]
        prev_run = _stages_in(co, root, STAGES_PREV)
        # Untimed: builds the quarter's sidecars on first use, and numba recompiles (rewriting
        # its on-disk cache) any edited module, which would otherwise be charged to round 1.
        _clear_outputs(root, STAGES_QUARTER)
        _log(f"stages ({co or 'this checkout'}): {STAGES_QUARTER} untimed warm-up round")
        _stages_in(co, root, STAGES_QUARTER)
    runs: list[dict[str, Any]] = []
    base_runs: list[dict[str, Any]] = []
    for r in range(n_rounds):
        # The two checkouts' order is swapped every round (A B, B A, ...), so that an order
        # effect (the side that runs right after the other's writes) falls on both. It is not
        # the only bias: at load 3-5, identical code differed by ~4 % CPU between the sides
        # with the swap too (bench_features_stages5_aa.json).
        for co in checkouts if r % 2 == 0 else checkouts[::-1]:
            root = roots[co]
            _clear_outputs(root, STAGES_QUARTER)
            _log(
                f"stages ({co or 'this checkout'}): {STAGES_QUARTER} round {r + 1}/{n_rounds} (fresh process, warm)"
            )
            (runs if co is None else base_runs).append(_stages_in(co, root, STAGES_QUARTER))
    cold = [
        st
        for x in runs + base_runs
        for st in ("predecoded_trades", "predecoded_mbp10")
        if not x["info"][st]["reused"]
    ]
    if cold:
        raise RuntimeError(
            f"a timed round rebuilt a sidecar ({', '.join(sorted(set(cold)))}): not a warm round"
        )
    outputs = runs[0]["outputs"]
    if any(x["outputs"] != outputs for x in runs):
        raise RuntimeError("stage outputs differ between rounds")
    if base_runs and any(_comparable(x["outputs"]) != _comparable(outputs) for x in base_runs):
        raise RuntimeError(f"stage outputs of {baseline} differ from this checkout's")
    stages = list(runs[0]["wall"])
    wall = {s: rounds_summary([x["wall"][s] for x in runs]) for s in stages}
    cpu = {s: rounds_summary([x["cpu"][s] for x in runs]) for s in stages}
    total = rounds_summary([x["seconds"] for x in runs])
    total_cpu = rounds_summary([x["cpu_seconds"] for x in runs])
    ofi_med = wall["ofi_features"]["median"]
    ab: dict[str, Any] = {}
    if base_runs:
        ab = {
            "checkout": str(baseline),
            "commit": (baseline / "BASELINE_COMMIT").read_text().strip()
            if baseline is not None and (baseline / "BASELINE_COMMIT").is_file()
            else None,
            "outputs_bit_identical": True,  # checked above (else this run fails)
            "total_wall_s": rounds_summary([x["seconds"] for x in base_runs]),
            "total_cpu_s": rounds_summary([x["cpu_seconds"] for x in base_runs]),
            "wall_s": {st: rounds_summary([x["wall"][st] for x in base_runs]) for st in stages},
            "cpu_s": {st: rounds_summary([x["cpu"][st] for x in base_runs]) for st in stages},
        }
    base = dict(OFI_BASELINE)
    if ab:
        base = {
            "wall_median_s": ab["wall_s"]["ofi_features"]["median"],
            "cpu_median_s": ab["cpu_s"]["ofi_features"]["median"],
            "commit": ab["commit"] or "?",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "how": "the baseline commit's stages in the same run, rounds alternating A B, B A",
        }
    targets = [
        target(
            "7 feature stages warm, wall (median)",
            total["median"],
            "<=",
            3,
            "s",
            f"CPU {total_cpu['median']} s; min {total['min']} / max {total['max']} s",
        ),
        target(
            "fxcache stage (assemble + write + verify), wall (median)",
            wall["fxcache"]["median"],
            "<=",
            0.4,
            "s",
        ),
        target(
            "ofi_features stage: speed-up over the baseline (median wall)",
            round(base["wall_median_s"] / ofi_med, 2) if base and ofi_med > 0 else None,
            ">=",
            2,
            "x",
            f"baseline {base.get('wall_median_s')} s on {base.get('commit', '?')[:7]} ({base.get('date')}), "
            f"now {ofi_med} s",
        ),
    ]
    payload = {
        "command": command_line(),
        "commit": _git_head(),
        "config": {
            "data_root": str(root),
            "quarter": STAGES_QUARTER,
            "previous_quarter": STAGES_PREV,
            "market": "ES.FUT --scale 1, seed 0, book_ratio 0.1 (2024-Q3: main's scaleout_scale1 raw files)",
            "stages": stages,
            "what": "each round in a fresh process: the quarter's 7 stage outputs removed, sidecars kept "
            "(reused after their checksum verification), numba caches warm, the previous quarter's "
            "outputs present; each stage through the calls its asset body makes (StageIO keys, "
            "require_sidecar, the core function, the asset's own checks, write_table with checksums, "
            "write_fxcache (with its read-back verification where the checkout has it), then the "
            "fxcache_valid check's verifications: fxcache_identity and verify_once(path, 'fxcache', "
            "verify_fxcache))",
            "pipeline": "PipelineConfig() defaults",
            "rounds": n_rounds,
        },
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "figures": {
            "stages_warm": {
                "total_wall_s": total,
                "total_cpu_s": total_cpu,
                "wall_s": wall,
                "cpu_s": cpu,
                "fxcache_verify_s": rounds_summary([x["info"]["fxcache"]["verify_s"] for x in runs]),
                "import_s": rounds_summary([x["import_seconds"] for x in runs]),
                "peak_rss_mib": rounds_summary([x["peak_rss_mib"] for x in runs]),
                "counts": runs[0]["info"],
                "rounds": [{"wall": x["wall"], "cpu": x["cpu"], "seconds": x["seconds"]} for x in runs],
            },
            "ofi_baseline": base,
            "baseline_same_run": ab,
            "previous_quarter_build": {"seconds": prev_run["seconds"], "wall": prev_run["wall"]},
            "output_checksums": outputs,
        },
        "targets": targets,
    }
    write_result(name, payload)
    return payload


#: child measurements, each run in a fresh process by the parent (JSON on stdout)
CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "prepare": _prepare,
    "pipeline": _pipeline,
    "ofi_heavy": _ofi_heavy,
    "bars_core": _bars_core,
    "diagnose": _diagnose,
    "stages": _asset_stages,
}


def main(argv: list[str]) -> None:
    if argv and argv[0] in CHILDREN:
        cmd, *args = argv
        print(json.dumps(CHILDREN[cmd](*args)))
        return
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_features",
        description="The 7 warm feature stages of a --scale 1 quarter through the assets' calls "
        "(benchmarks/results/NAME.json); the child measurements are subcommands: " + ", ".join(CHILDREN),
    )
    ap.add_argument("--quick", action="store_true", help="3 rounds instead of 5")
    ap.add_argument(
        "--rounds", type=int, default=None, help="rounds (each a fresh process); overrides --quick"
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="an export of another commit (git archive COMMIT | tar -x -C DIR): its stages in the same "
        "rounds, alternating, outputs compared bit for bit",
    )
    ap.add_argument(
        "--name",
        default=None,
        help="result file name (benchmarks/results/NAME.json; default bench_features, bench_features_quick with --quick)",
    )
    ap.add_argument("--scaling", action="store_true", help="the 1 / 3 / 9-quarter pipeline runs instead")
    ap.add_argument(
        "--pin",
        default=None,
        help="CPUs (e.g. 0 or 0,1): this process and every stage process it starts run on them only, "
        "both sides of an A/B alike",
    )
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.pin is not None:
        # inherited affinity; on a shared machine one CPU's figures (CPU time ~ wall) vary less
        # than two cores' walls
        os.sched_setaffinity(0, {int(c) for c in args.pin.split(",")})
    if args.scaling:
        out = run_scaling()
    else:
        out = run(quick=args.quick, rounds=args.rounds, baseline=args.baseline, name=args.name)
    for t in out["targets"]:
        print(
            f"{'PASS' if t['pass'] else 'SKIP' if t['pass'] is None else 'FAIL'}  {t['name']}: {t['value']}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
