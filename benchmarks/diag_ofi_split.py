"""Where the ``ofi_features`` stage spends its wall and CPU time (issue 10, OFI >= 2x).

Runs the stage the way its asset body does (``fx_assets/assets/features.py``: bars, the
previous quarter's warm-up start and trade source, the quarter's trade source, ``quarter_ofi``,
``validate_ofi``, ``write_table``) on a data root built by ``bench_features`` (its
``stages_2q``), ``--rounds`` times in this process (numba caches warm), and splits each round
by part. Inside ``quarter_ofi`` the kernels and helpers it calls are wrapped (module globals
replaced for the run) to sum, per part, the thread CPU time of every call (the chunks run on
several threads: their thread times add up to the process CPU they used) and the calls' wall
time on the thread that made them.

    python -m benchmarks.diag_ofi_split [ROOT] [--rounds N]

Prints one JSON object (also written to benchmarks/results/diag_ofi_split.json).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import load_average, write_result

QUARTER = "2024-Q3"
SYMBOL = "ES.FUT"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Acc:
    """Per-part sums of thread CPU and wall seconds, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dc, dt = time.thread_time() - c0, time.perf_counter() - t0
                with self.lock:
                    self.cpu[name] += dc
                    self.wall[name] += dt
                    self.calls[name] += 1

        return timed


def _patch(acc: _Acc) -> list[tuple[Any, str, Any]]:
    """Replace the module globals the OFI stage calls with timed wrappers; the originals."""
    from fx_assets.core import bar_rows, ofi, ofi_warmup

    targets = [
        (ofi, "_book_prep_nb", "prep: book validation (per chunk)"),
        (ofi, "_trade_prep_nb", "prep: trades validation + cum volume (per chunk)"),
        (ofi, "_search_right_nb", "bar windows search"),
        (ofi, "_event_pass_nb", "event pass (OFI/MLOFI/depth/RV/Hawkes sums + book state)"),
        (ofi, "_bar_pass_nb", "bar pass (VPIN, Kyle, Hawkes, trade imbalance)"),
        (ofi, "_empty_2d", "alloc"),
        (ofi, "compute_ofi_features", "compute_ofi_features (per chunk, all of it)"),
        (ofi, "ofi_warmup_bars", "quarter_ofi: ofi_warmup_bars per chunk plan"),
        (bar_rows._OfiOutput, "put", "chunk output copy (put)"),
        (bar_rows.PageReleaser, "release_before", "page release"),
        (bar_rows, "_book_rows", "book select + gather (per chunk)"),
        (bar_rows, "_replay_start_scanned", "quarter_ofi: chunk replay starts (book around each)"),
        (bar_rows, "_warmup_first_bar", "quarter_ofi: warmup_first_bar (prev book rescan)"),
        (bar_rows, "_trade_slices", "trade slices (from the sidecar: select + write)"),
        (bar_rows, "sidecar_columns", "quarter_ofi: sidecar_columns"),
        (bar_rows, "_active_table", "quarter_ofi: active tables"),
        (ofi_warmup, "_has_valid_snapshot", "ofi_warmup: has_valid_snapshot"),
    ]
    saved = []
    for mod, name, label in targets:
        orig = getattr(mod, name)
        saved.append((mod, name, orig))
        setattr(mod, name, acc.wrap(label, orig))
    return saved


def one_round(root: Path) -> dict[str, Any]:
    from fx_assets.assets.common import StageIO
    from fx_assets.assets.features import _book, _load_bars
    from fx_assets.core import bar_rows
    from fx_assets.core import ofi as ofi_core
    from fx_assets.core.active_contract import trade_source
    from fx_assets.core.calendar import parse_quarter
    from fx_assets.core.ofi_warmup import ofi_warmup_start
    from fx_assets.core.tables import write_table
    from fx_assets.partitions import QuarterSymbol
    from fx_assets.resources.pipeline import PipelineConfig
    from fx_assets.resources.storage import FxStorage

    storage = FxStorage(root=str(root))
    part = QuarterSymbol(parse_quarter(QUARTER), SYMBOL)
    io = StageIO(storage, PipelineConfig(), part)
    q = part.quarter
    parts: dict[str, tuple[float, float]] = {}
    t, c = time.perf_counter(), _cpu()

    def lap(name: str) -> None:
        nonlocal t, c
        t1, c1 = time.perf_counter(), _cpu()
        parts[name] = (round(t1 - t, 4), round(c1 - c, 4))
        t, c = t1, c1

    acc = _Acc()
    saved = _patch(acc)
    try:
        cur = _load_bars(io, q)
        pq = io.ofi_warmup_quarter()
        prev_bars, prev_book = _load_bars(io, pq), _book(io, pq)
        lap("load bars, calendars")
        start = ofi_warmup_start(prev_bars, prev_book, io.cfg.ofi)
        lap("ofi_warmup_start (prev book scan)")
        prev_flow = trade_source(io.sidecar("trades", pq).path, prev_book.calendar, after_ts=start)
        lap("prev quarter trade source (after_ts)")
        book = _book(io, q)
        flow = trade_source(io.sidecar("trades", q).path, book.calendar)
        lap("quarter trade source (order + action pass)")
        feats = bar_rows.quarter_ofi(
            cur, flow, book, io.cfg.ofi, partition=part.label,
            prev_bars=prev_bars, prev_trades=prev_flow, prev_book=prev_book,
        )  # fmt: skip
        lap("quarter_ofi")
        ofi_core.validate_ofi(feats, part.label)
        lap("validate_ofi")
        tbl = feats.to_arrow()
        lap("to_arrow")
        out = root / "diag_ofi_split.arrow"
        write_table(out, tbl)
        lap("write_table (checksums + write)")
        out.unlink()
    finally:
        for mod, name, orig in saved:
            setattr(mod, name, orig)
    inner = {
        k: {"thread_cpu_s": round(acc.cpu[k], 4), "wall_s": round(acc.wall[k], 4), "calls": acc.calls[k]}
        for k in sorted(acc.cpu, key=lambda k: -acc.cpu[k])
    }
    return {
        "parts": {k: {"wall_s": w, "cpu_s": cc} for k, (w, cc) in parts.items()},
        "quarter_ofi_inner": inner,
        "bars": len(cur),
        "trades": {"kind": type(flow).__name__, "source_records": flow.n_source},
        "prev_trades": {"kind": type(prev_flow).__name__, "source_records": prev_flow.n_source},
    }


def _head() -> str:
    """The commit measured: HEAD of this checkout, or an export's BASELINE_COMMIT file."""
    root = Path(__file__).resolve().parent.parent
    marker = root / "BASELINE_COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    proc = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root, check=False)
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.diag_ofi_split")
    p.add_argument("root", type=Path, nargs="?", default=None)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.root is None:
        from benchmarks.common import DATA

        args.root = DATA / "stages_2q"
    import fx_assets.core.bar_rows  # noqa: F401

    load0 = load_average()
    rounds = [one_round(args.root) for _ in range(args.rounds)]
    payload = {
        "command": " ".join(["python -m benchmarks.diag_ofi_split", *(argv or sys.argv[1:])]),
        "commit": _head(),
        "load_average_before": load0,
        "load_average_after": load_average(),
        "rounds": rounds,
    }
    write_result("diag_ofi_split", payload)
    print(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
