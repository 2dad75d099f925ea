"""Snapshot feature scan benchmark (issue 11): MBP-10 updates/s per core through
``snapshot_features`` with its chunking, the decode floor beside it, and peak memory by chunk
size and input size.

Data: the scale-1 ES quarter ``scaleout_scale1`` (2024-Q3, ``book_ratio`` 0.1: 2.57 M MBP-10
records, of which the active contract's two-sided rows are scanned), read from this worktree's
``benchmarks/data/`` or, read only, from ``$FX_BENCH_SNAPSHOT_ROOT`` (default
``/work/main/benchmarks/data/scaleout_scale1``); generated here (``ensure_market``) when neither
exists. Quick mode: the first 300 k active rows of the same quarter.

Rows are selected the way the stages do (roll calendar -> the session's active contract;
rows without a two-sided, uncrossed best level are dropped, as ``snapshot_features`` refuses
them); a break is a new session or a new contract. Each chunk of ``chunk`` rows is gathered
into reused float64 matrices by ``core.book._gather_book_nb`` (int prices / 1e9, the copy
the pipeline makes) and scanned by ``snapshot_features(book, cfg, state)``. Figures:

- ``speed`` (one process pinned to CPU 0, ``NUMBA_NUM_THREADS=1``; rounds over the whole input):
  ``scan`` = the ``snapshot_features`` calls only, ``gather`` = building the chunks,
  ``read_floor`` = one pass summing every sidecar column the scan reads over the selected rows
  (no conversion: what reading the input costs at least); each wall and CPU seconds
  (getrusage user + sys) and updates/s per core from the CPU seconds. With ``--compare`` the
  test suite's copy of the previous kernel (``fx_assets_tests/core/snapshot_reference.py``)
  runs A B A B against the current one in the same process and input. With ``--baseline REF``
  the gather and the scan as they are at git revision REF (``core/book.py`` and
  ``core/snapshot_features.py`` exported by ``git show`` into a temporary directory and
  imported from there; the rest of the package is this tree's) run A B A B beside the current
  ones, and both outputs are checked equal bit for bit (features and gathered matrices).
- ``memory``: fresh processes for chunk sizes x input sizes (the quarter once, and 4 times
  over with time shifted: the same rows again, 4x the updates); peak private memory (RssAnon
  sampled every 5 ms) and VmHWM (which also counts the memory-mapped sidecar pages read).

Usage: ``python -m benchmarks.bench_snapshot [--quick] [--compare] [--baseline REF] [--rounds N]``; the
subcommands ``speed`` and ``memory`` print one JSON object (used by ``run``).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from benchmarks.common import (
    DATA,
    MemorySampler,
    _status_kib,
    alternate,
    command_line,
    cpu_seconds,
    ensure_market,
    in_subprocess,
    market_config,
    source_at,
    target,
    write_result,
)

MODULE = "benchmarks.bench_snapshot"
MARKET = ("scaleout_scale1", market_config(["2024-Q3"], scale=1.0, book_ratio=0.1))
QUARTER = "2024-Q3"
SHARED_ROOT = Path(os.environ.get("FX_BENCH_SNAPSHOT_ROOT", "/work/main/benchmarks/data/scaleout_scale1"))
CHUNKS = (1 << 16, 1 << 20)  # rows per snapshot_features call (memory figures)
SPEED_CHUNK = 1 << 16
PASSES = (1, 4)  # input sizes of the memory figures: the quarter's rows once / 4 times
QUICK_ROWS = 300_000
TARGET_UPDATES_PER_S = 10e6  # issue 11: per core
LEVELS = 10


# ----------------------------------------------------------------------------------------------
# input: sidecar columns, active rows, chunks


def market_root() -> Path:
    own = DATA / MARKET[0]
    if (own / "derived" / "predecoded").is_dir() or not SHARED_ROOT.is_dir():
        return own
    return SHARED_ROOT


def _one(pattern: str) -> Path | None:
    hits = sorted(glob.glob(pattern))
    return Path(hits[-1]) if hits else None


def sidecars(root: Path) -> tuple[Path, Path]:
    """(MBP-10 sidecar, trades sidecar) of the quarter; built here only under our own DATA."""
    mbp = _one(str(root / "derived/predecoded/mbp-10/ES.FUT" / f"ES.FUT_{QUARTER}.*.arrow"))
    trd = _one(str(root / "derived/predecoded/trades/ES.FUT" / f"ES.FUT_{QUARTER}.*.arrow"))
    if mbp is not None and trd is not None:
        return mbp, trd
    if root != DATA / MARKET[0]:
        raise FileNotFoundError(f"{root}: no predecoded sidecars of {QUARTER} (read-only root)")
    from fx_assets.core.sidecar import ensure_sidecar

    ensure_market(*MARKET)
    out = []
    for schema in ("mbp-10", "trades"):
        raw = root / "raw" / schema / "ES.FUT" / f"ES.FUT_{QUARTER}.dbn.zst"
        info = ensure_sidecar(raw, root / "derived/predecoded" / schema / "ES.FUT")
        out.append(Path(info.path))
    return out[0], out[1]


def calendar(root: Path, trades_sidecar: Path) -> Any:
    from fx_assets.core.active_contract import quarter_roll_calendar, roll_calendar_from_table

    arrow = _one(str(root / "derived/roll_calendar/ES.FUT" / f"ES.FUT_{QUARTER}.*.arrow"))
    if arrow is not None:
        import pyarrow as pa

        with pa.memory_map(str(arrow)) as src:
            return roll_calendar_from_table(pa.ipc.open_file(src).read_all())
    return quarter_roll_calendar(trades_sidecar, None)


from fx_assets.core.active_contract import _active_at  # noqa: E402
from fx_assets.core.dbn import UNDEF_PRICE  # noqa: E402


@njit(cache=True, nogil=True)
def _active_rows_nb(ts, iid, bid0, ask0, bounds, act, out_idx, out_brk):
    """Active-contract records with a two-sided uncrossed best level; break count per row."""
    n = 0
    k = 0
    last_k = -1
    last_iid = -1
    brk = -1
    for i in range(ts.shape[0]):
        ok, k = _active_at(bounds, act, ts[i], int(iid[i]), k)
        if not ok:
            continue
        b = bid0[i]
        a = ask0[i]
        if b == UNDEF_PRICE or a == UNDEF_PRICE or b > a:
            continue
        if k != last_k or int(iid[i]) != last_iid:
            brk += 1
            last_k = k
            last_iid = int(iid[i])
        out_idx[n] = i
        out_brk[n] = brk
        n += 1
    return n


@njit(cache=True, nogil=True)
def _gather_trade_nb(idx, action, side, size, o_action, o_side, o_size):
    for r in range(idx.shape[0]):
        i = idx[r]
        o_action[r] = action[i]
        s = side[i]
        o_side[r] = 1 if s == 66 else (-1 if s == 65 else 0)  # 'B' buyer-, 'A' seller-initiated
        o_size[r] = size[i]


@njit(cache=True, nogil=True)
def _touch_nb(idx, cols_i64, cols_u32, cols_u8):
    """Read every value the scan reads, at the selected records (the read floor)."""
    acc = 0
    for c in cols_i64:
        for r in range(idx.shape[0]):
            acc += c[idx[r]]
    for c in cols_u32:
        for r in range(idx.shape[0]):
            acc += c[idx[r]]
    for c in cols_u8:
        for r in range(idx.shape[0]):
            acc += c[idx[r]]
    return acc


_F = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")


class Input:
    """The quarter's sidecar columns (memory-mapped) and the selected rows."""

    def __init__(self, max_rows: int | None = None) -> None:
        from fx_assets.core.active_contract import _active_table
        from fx_assets.core.sidecar import sidecar_columns

        root = market_root()
        mbp, trd = sidecars(root)
        self.root, self.path = root, mbp
        names = ["ts_recv", "instrument_id", "action", "side", "size"]
        names += [f"{f}_{i:02d}" for f in _F for i in range(LEVELS)]
        self.c = sidecar_columns(mbp, names)
        ts = self.c["ts_recv"]
        bounds, act, _ = _active_table(calendar(root, trd), ts)
        idx = np.empty(ts.shape[0], np.int64)
        brk = np.empty(ts.shape[0], np.int64)
        n = _active_rows_nb(
            ts, self.c["instrument_id"], self.c["bid_px_00"], self.c["ask_px_00"], bounds, act, idx, brk
        )
        n = n if max_rows is None else min(n, max_rows)
        self.idx, self.brk = idx[:n].copy(), brk[:n].copy()
        self.records = int(ts.shape[0])
        self.span_ns = int(ts[self.idx[-1]] - ts[self.idx[0]]) + 1
        self.levels = {f: tuple(self.c[f"{f}_{i:02d}"] for i in range(LEVELS)) for f in _F}
        self.bufs: dict[int, list[np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self.idx.shape[0])

    def chunk(self, lo: int, hi: int, shift_ns: int = 0, brk_shift: int = 0, gather: Any = None) -> Any:
        """Rows [lo, hi) as a SnapshotBook in reused buffers (times shifted for a later pass);
        ``gather``: a ``_gather_book_nb`` other than this tree's (the baseline's)."""
        from fx_assets.core.book import _gather_book_nb
        from fx_assets.core.snapshot_features import SnapshotBook

        gather = gather or _gather_book_nb
        n = hi - lo
        cap = max(n, 1)
        b = self.bufs.get(cap)
        if b is None:
            b = [np.empty(cap, np.int64), np.empty(cap, np.uint8), np.empty(cap, np.int8), np.empty(cap)]
            b += [np.empty((cap, LEVELS)) for _ in _F]
            self.bufs = {cap: b}
        ts_o, act_o, side_o, size_o, *mats = b
        idx = self.idx[lo:hi]
        lv = self.levels
        gather(
            idx, self.c["ts_recv"], lv["bid_px"], lv["ask_px"], lv["bid_sz"], lv["ask_sz"], lv["bid_ct"],
            lv["ask_ct"], 0, 0, ts_o, *mats,
        )  # fmt: skip
        _gather_trade_nb(idx, self.c["action"], self.c["side"], self.c["size"], act_o, side_o, size_o)
        ts = ts_o[:n]
        brk = self.brk[lo:hi]
        if shift_ns:
            ts = ts + shift_ns
        if brk_shift:
            brk = brk + brk_shift
        return SnapshotBook(ts, brk, act_o[:n], side_o[:n], size_o[:n], *(m[:n] for m in mats))

    def touch(self) -> int:
        c = self.c
        i64 = tuple(c[n] for n in ["ts_recv"] + [f"{f}_{i:02d}" for f in _F[:2] for i in range(LEVELS)])
        u32 = tuple(c[n] for n in ["size"] + [f"{f}_{i:02d}" for f in _F[2:] for i in range(LEVELS)])
        u8 = (c["action"], c["side"])
        return int(_touch_nb(self.idx, i64, u32, u8))


# ----------------------------------------------------------------------------------------------
# measurements (each in its own process: see run)


_BASELINE: dict[str, Any] = {}  # "book", "scan": the baseline's modules; "ref", "commit"


def load_baseline(ref: str) -> None:
    """Import ``core/book.py`` and ``core/snapshot_features.py`` as they are at git revision
    ``ref`` (from a temporary directory, under their own module names) as the ``baseline``."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_snapshot_baseline_"))
    keys = ("book", "scan")
    commit, srcs = source_at(ref, ["fx_assets/core/book.py", "fx_assets/core/snapshot_features.py"])
    for key, src in zip(keys, srcs, strict=True):
        name = f"_bench_baseline_{key}_{commit[:12]}"
        path = tmp / f"{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _BASELINE[key] = mod
    _BASELINE["ref"], _BASELINE["commit"] = ref, commit


def _scan_fn(impl: str) -> Any:
    import importlib

    if impl == "baseline":
        return _BASELINE["scan"]
    name = (
        "fx_assets_tests.core.snapshot_reference"
        if impl == "reference"
        else "fx_assets.core.snapshot_features"
    )
    return importlib.import_module(name)


def one_pass(
    inp: Input, chunk: int, impl: str = "current", passes: int = 1, digest: Any = None
) -> dict[str, float]:
    """Scan the input ``passes`` times over (time-shifted), chunk by chunk: scan and gather
    seconds, wall and CPU, each summed over the chunks. ``digest``: a hashlib object fed
    every chunk's gathered matrices and features (the bit-for-bit check)."""
    from fx_assets.core.snapshot_features import SnapshotFeatureConfig, feature_names

    mod = _scan_fn(impl)
    gather = _BASELINE["book"]._gather_book_nb if impl == "baseline" else None
    cfg = SnapshotFeatureConfig()
    st = None
    nf = len(feature_names(cfg))
    # reused: [n, F] views of it (the reference kernel allocates its own output)
    out_buf = np.empty(nf * chunk) if impl != "reference" else None
    gw = gc = sw = sc = 0.0
    n = len(inp)
    check = 0.0
    for p in range(passes):
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            c0, t0 = cpu_seconds(), time.perf_counter()
            book = inp.chunk(
                lo, hi, shift_ns=p * inp.span_ns, brk_shift=p * (int(inp.brk[-1]) + 1), gather=gather
            )
            c1, t1 = cpu_seconds(), time.perf_counter()
            if out_buf is not None:
                out, st = mod.snapshot_features(
                    book, cfg, st, out=out_buf[: nf * (hi - lo)].reshape(hi - lo, nf)
                )
            else:
                out, st = mod.snapshot_features(book, cfg, st)
            c2, t2 = cpu_seconds(), time.perf_counter()
            gw += t1 - t0
            gc += c1 - c0
            sw += t2 - t1
            sc += c2 - c1
            check += float(out[-1, 0])  # keep the result alive (and the run honest)
            if digest is not None:
                for a in (book.ts, book.bid_px, book.ask_px, book.bid_sz, book.ask_sz, book.bid_ct):
                    digest.update(np.ascontiguousarray(a).tobytes())
                digest.update(book.ask_ct.tobytes())
                digest.update(np.ascontiguousarray(out).tobytes())
    return {"scan_wall_s": sw, "scan_cpu_s": sc, "gather_wall_s": gw, "gather_cpu_s": gc}


def _pin() -> None:
    os.sched_setaffinity(0, {0})


def speed(rounds: int, compare: bool, max_rows: int | None, baseline: str | None = None) -> dict[str, Any]:
    _pin()
    inp = Input(max_rows)
    n = len(inp)
    same = None
    if baseline:
        load_baseline(baseline)
        digests = {impl: hashlib.sha256() for impl in ("current", "baseline")}
        for impl, h in digests.items():
            one_pass(inp, SPEED_CHUNK, impl, digest=h)
        same = digests["current"].digest() == digests["baseline"].digest()
        if not same:
            raise AssertionError(f"bench_snapshot: outputs differ from the baseline {baseline}")

    def touch() -> dict[str, float]:
        c0, t0 = cpu_seconds(), time.perf_counter()
        inp.touch()
        return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}

    fns = {"current": lambda: one_pass(inp, SPEED_CHUNK, "current"), "read_floor": touch}
    if compare:
        fns["reference"] = lambda: one_pass(inp, SPEED_CHUNK, "reference")
    if baseline:
        fns["baseline"] = lambda: one_pass(inp, SPEED_CHUNK, "baseline")
    res = alternate(fns, rounds=rounds, warmup=1)
    out: dict[str, Any] = {
        "rows": n,
        "sidecar_records": inp.records,
        "data_root": str(inp.root),
        "sidecar": str(inp.path),
        "chunk_rows": SPEED_CHUNK,
        "pinned_cpus": sorted(os.sched_getaffinity(0)),
        "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
    }
    if baseline:
        out["baseline_ref"] = baseline
        out["baseline_commit"] = _BASELINE["commit"]
        out["baseline_bit_identical"] = same
    for name, figs in res.items():
        d: dict[str, Any] = dict(figs)
        for k in ("scan", "gather"):
            if f"{k}_cpu_s" in figs:
                d[f"{k}_updates_per_cpu_s"] = _rate(n, figs[f"{k}_cpu_s"])
                d[f"{k}_updates_per_wall_s"] = _rate(n, figs[f"{k}_wall_s"])
        if "cpu_s" in figs:
            d["updates_per_cpu_s"] = _rate(n, figs["cpu_s"])
            d["updates_per_wall_s"] = _rate(n, figs["wall_s"])
        out[name] = d
    return out


def _rate(n: int, secs: dict[str, Any]) -> dict[str, Any]:
    """Updates/s from a seconds summary: min rate from the max time and so on."""
    return {
        "min": round(n / secs["max"]) if secs["max"] > 0 else None,
        "median": round(n / secs["median"]) if secs["median"] > 0 else None,
        "max": round(n / secs["min"]) if secs["min"] > 0 else None,
        "rounds": secs["rounds"],
    }


def memory(chunk: int, passes: int, max_rows: int | None) -> dict[str, Any]:
    _pin()
    inp = Input(max_rows)
    base_anon = _status_kib("RssAnon") / 1024
    with MemorySampler() as mem:
        t0, c0 = time.perf_counter(), cpu_seconds()
        figs = one_pass(inp, chunk, "current", passes)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return {
        "chunk_rows": chunk,
        "passes": passes,
        "rows": len(inp) * passes,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "scan_cpu_s": round(figs["scan_cpu_s"], 3),
        "anon_mib_before_scan": round(base_anon, 1),
        "peak_anon_mib": round(mem.peak_anon_mib, 1),
        "peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1),
    }


# ----------------------------------------------------------------------------------------------


def run(
    quick: bool = False, rounds: int | None = None, compare: bool = False, baseline: str | None = None
) -> dict[str, Any]:
    max_rows = QUICK_ROWS if quick else None
    rows_arg = [str(max_rows)] if max_rows else ["0"]
    r = rounds or (3 if quick else 5)
    env = {"NUMBA_NUM_THREADS": "1"}
    load_before = [round(x, 2) for x in os.getloadavg()]
    sp = in_subprocess(MODULE, "speed", str(r), "1" if compare else "0", *rows_arg, baseline or "", env=env)
    mem = {
        f"chunk_{c}_x{p}": in_subprocess(MODULE, "memory", str(c), str(p), *rows_arg, env=env)
        for c in CHUNKS
        for p in PASSES
    }
    scan_rate = sp["current"]["scan_updates_per_cpu_s"]["median"]
    floor_rate = sp["read_floor"]["updates_per_cpu_s"]["median"]
    spread = {c: [mem[f"chunk_{c}_x{p}"]["peak_anon_mib"] for p in PASSES] for c in CHUNKS}
    payload: dict[str, Any] = {
        "mode": "quick" if quick else "full",
        "command": command_line(),
        "load_average_before": load_before,
        "figures": {"speed": sp, "memory": mem},
        "targets": [
            target(
                "snapshot scan updates/s per core (CPU time, median)",
                scan_rate,
                ">=",
                TARGET_UPDATES_PER_S,
                "updates/s",
                f"{sp['rows']:,} active MBP-10 rows, chunks of {SPEED_CHUNK:,}, pinned to one core",
            ),
            target(
                "read floor updates/s per core (sidecar columns the scan reads)",
                floor_rate,
                ">=",
                TARGET_UPDATES_PER_S,
                "updates/s",
                "one pass reading every value the scan reads; no conversion",
            ),
            *(
                target(
                    f"peak private memory, chunk {c:,}: {PASSES[-1]}x input minus 1x input",
                    round(spread[c][-1] - spread[c][0], 1),
                    "<=",
                    64.0,
                    "MiB",
                    "memory set by the chunk, not by the input",
                )
                for c in CHUNKS
            ),
        ],
    }
    write_result("bench_snapshot_quick" if quick else "bench_snapshot", payload)
    return payload


def main(argv: list[str]) -> None:
    if argv and argv[0] == "speed":
        rows = int(argv[3]) or None
        res: dict[str, Any] = speed(int(argv[1]), argv[2] == "1", rows, (argv[4:] or [""])[0] or None)
    elif argv and argv[0] == "memory":
        res = memory(int(argv[1]), int(argv[2]), int(argv[3]) or None)
    else:
        ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
        ap.add_argument("--quick", action="store_true")
        ap.add_argument("--compare", action="store_true", help="A B A B against the previous kernel")
        ap.add_argument(
            "--baseline",
            default=None,
            metavar="REF",
            help="A B A B against the gather and scan of git revision REF (outputs checked equal)",
        )
        ap.add_argument("--rounds", type=int, default=None)
        a = ap.parse_args(argv)
        res = run(quick=a.quick, rounds=a.rounds, compare=a.compare, baseline=a.baseline)
    import json

    print(json.dumps(res, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
