"""fx_assets against the libraries a user would otherwise pick, on the same data, A B A B.

Each peer runs in its own virtual environment ``benchmarks/.venvs/<peer>`` (their pins clash:
mlfinpy needs numpy < 2), created here from PyPI at the pinned versions of ``PEERS`` unless it is
already there with that version. A peer runs as one long-lived ``benchmarks/peer_worker.py``
process in its venv; the arrays go to it as ``.npy`` files. Rounds alternate fx_assets (in this
process) and the peer (one request to its worker), after one untimed warm-up each (numba
compiles on both sides). Every figure is {min, median, max, rounds} of wall and CPU seconds
(``getrusage`` user + sys of the process doing the work, all its threads), and each comparison
records the outputs' agreement.

Comparisons (``python -m benchmarks.bench_peers [--quick]``, result ``results/bench_peers.json``
or ``bench_peers_quick.json``):

- volume bars (V = 100 contracts) vs finmlkit: its user path (``TradesData`` +
  ``VolumeBarKit.build_ohlcv``) and its two kernels alone; fx_assets ``build_bars`` with one
  session and one instrument (finmlkit knows neither, so no forced closes on either side);
- CUSUM filter, constant threshold, vs ``finmlkit.sampling.filters.cusum_filter`` on the trade
  prices and on the volume bars' closes (what the bar features run it on); fx_assets: the log
  returns (numpy) + the CUSUM kernel of the bar features asked for its event-flag column only
  (the feature table also asks for the direction of the last event and the bars since it),
  then ``np.flatnonzero``, where finmlkit returns the event indices; on one thread where
  finmlkit's log returns use ``prange``;
- EMA tick / volume imbalance bars vs mlfinpy on the first ``mlfinpy_trades`` trades (mlfinpy is a
  Python loop per trade), extrapolated per trade to the whole quarter; fx_assets with the tick
  rule (sign 0) like mlfinpy. The two differ in details (fx_assets: EWMA of E0[T] with a floor and
  forced closes; mlfinpy: EWMA over the last bars), so agreement is the bar count, not identity;
- decode of the trades ``.dbn.zst`` vs ``databento``'s ``DBNStore.from_file().to_ndarray()`` (to
  memory) and plain zstd (``zstandard`` stream, 1 MiB reads, to nowhere); fx_assets
  ``build_sidecar`` writes a sidecar file (page cache) as the pipeline does;
- warm load of every trades column: ``sidecar_columns`` vs ``np.load(mmap_mode="r")`` of one
  ``.npy`` per column, each with and without touching one column (sum of ``price``).

Data: the trades of one scale-1 ES quarter (``/work/main/benchmarks/data/scaleout_scale1`` when
present, read only, else generated under ``benchmarks/data``); ``--quick``: a scale-0.05 quarter
generated once under ``benchmarks/data/es_quick_1q``. The active-contract trades come from the
fx_assets sidecar (decoded here) and the roll calendar.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    DATA,
    QUICK_MARKET,
    ROOT,
    alternate,
    command_line,
    ensure_market,
    load_average,
    market_config,
    raw_file,
    rounds_summary,
    target,
    timed,
    versions,
    write_result,
)

# Pinned peer versions (PyPI), one venv each; EXTRA: what a peer imports without declaring it
# (mlfinpy imports scikit-learn).
PEERS: dict[str, str] = {"finmlkit": "0.1.11", "mlfinpy": "0.1.2", "databento": "0.88.0"}
EXTRA: dict[str, list[str]] = {"mlfinpy": ["scikit-learn==1.5.2"]}
VENVS = ROOT / ".venvs"
SCALE1_SHARED = Path("/work/main/benchmarks/data/scaleout_scale1")
SCALE1_OWN = ("es_s1_1q", market_config(["2024-Q3"], scale=1.0, book_ratio=0.1))

VOLUME_BAR = 100
CUSUM_THRESHOLD = 0.001  # log-price units: ~ 5 ES ticks at 5000
# Imbalance-bar settings given to both sides (fx_assets BarConfig defaults).
IMB = {
    "exp_num_ticks_init": 50,
    "num_prev_bars": 20,
    "expected_imbalance_window": 500,
    "exp_num_ticks_constraints": [12.5, 200.0],
}

MODES: dict[str, dict[str, Any]] = {
    "full": {"rounds": 5, "mlfinpy_trades": 200_000, "decode_rounds": 5},
    "quick": {"rounds": 3, "mlfinpy_trades": 30_000, "decode_rounds": 3},
}


def _log(msg: str) -> None:
    print(f"[bench_peers] {msg}", file=sys.stderr, flush=True)


# --- peer environments ------------------------------------------------------------------------


def venv_python(peer: str) -> Path:
    return VENVS / peer / "bin" / "python"


def installed_version(peer: str, dist: str | None = None) -> str | None:
    """Version of ``dist`` (default: the peer itself) in the peer's venv, None if absent."""
    py = venv_python(peer)
    if not py.is_file():
        return None
    proc = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({dist or peer!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_peer(peer: str) -> str:
    """The peer's venv with the pinned version installed from PyPI (created if missing)."""
    want = PEERS[peer]
    extra = EXTRA.get(peer, [])
    if installed_version(peer) == want and all(
        installed_version(peer, r.split("==")[0]) == r.split("==")[1] for r in extra
    ):
        return want
    _log(f"installing {peer}=={want} into {VENVS / peer}")
    if not venv_python(peer).is_file():
        subprocess.run([sys.executable, "-m", "venv", str(VENVS / peer)], check=True)
    subprocess.run(
        [str(venv_python(peer)), "-m", "pip", "install", "-q", f"{peer}=={want}", *extra], check=True
    )
    got = installed_version(peer)
    if got != want:
        raise RuntimeError(f"{peer}: wanted {want}, venv has {got}")
    return want


class Peer:
    """One worker process in a peer's venv; ``call`` = one round of one task."""

    def __init__(self, peer: str) -> None:
        self.name = peer
        self.proc = subprocess.Popen(
            [str(venv_python(peer)), str(ROOT / "peer_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def call(self, task: str, args: dict[str, Any], save: Path | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        req = {"task": task, "args": args, "save": str(save) if save else None}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker died during {task}")
        ans: dict[str, Any] = json.loads(line)
        if "error" in ans:
            raise RuntimeError(f"{self.name} {task}: {ans['error']}")
        return ans

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- data -------------------------------------------------------------------------------------


def market_root(mode: str) -> tuple[Path, str]:
    if mode == "quick":
        name, cfg = QUICK_MARKET
        return ensure_market(name, cfg), cfg["quarters"][0]
    manifest = SCALE1_SHARED / "bench_manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text())["config"]["scale"] == 1.0:
        quarter = json.loads(manifest.read_text())["config"]["quarters"][0]
        if raw_file(SCALE1_SHARED, "trades", quarter).is_file():
            return SCALE1_SHARED, quarter
    name, cfg = SCALE1_OWN
    return ensure_market(name, cfg), cfg["quarters"][0]


def write_inputs(sidecar: Path, work: Path, subset: int) -> dict[str, Any]:
    """Active-contract trades of the quarter as .npy files (full set and the mlfinpy subset),
    plus one .npy per sidecar column for the warm-load comparison."""
    from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
    from fx_assets.core.sidecar import sidecar_columns

    cal = quarter_roll_calendar(sidecar, None)
    tr = active_trades(sidecar, cal)
    arrays: dict[str, np.ndarray] = {
        "ts": tr.ts,
        "price": tr.price,
        "size": tr.size.astype(np.float64),
        "sign": tr.sign,
    }
    paths: dict[str, Any] = {"full": {}, "subset": {}, "columns": {}}
    for part, n in (("full", len(tr)), ("subset", min(subset, len(tr)))):
        d = work / f"active_{part}"
        d.mkdir(parents=True, exist_ok=True)
        for k, v in arrays.items():
            p = d / f"{k}.npy"
            np.save(p, np.ascontiguousarray(v[:n]))
            paths[part][k] = str(p)
        paths[part]["n"] = int(n)
    cold = work / "columns_npy"
    cold.mkdir(parents=True, exist_ok=True)
    for k, v in sidecar_columns(sidecar).items():
        p = cold / f"{k}.npy"
        np.save(p, np.ascontiguousarray(v))
        paths["columns"][k] = str(p)
    paths["n_source_trades"] = int(tr.n_source)
    return paths


# --- fx_assets sides --------------------------------------------------------------------------


def _fx_arrays(p: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.load(p[k]) for k in ("ts", "price", "size", "sign")}


def _one_segment(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, np.int32), np.ones(n, np.uint32)


def _timed_round(fn: Any, sink: dict[str, Any]) -> dict[str, float]:
    times, out = timed(fn)
    sink["last"] = out
    return times


def _peer_round(peer: Peer, task: str, args: dict[str, Any], sink: dict[str, Any]) -> dict[str, float]:
    ans = peer.call(task, args)
    sink["last"] = ans["summary"]
    return {"wall_s": ans["wall_s"], "cpu_s": ans["cpu_s"]}


def _ratio(peer: dict[str, Any], fx: dict[str, Any], key: str = "wall_s") -> float:
    """Peer median over fx_assets median (> 1: fx_assets is faster)."""
    return round(peer[key]["median"] / fx[key]["median"], 3)


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def bench_volume_bars(peer: Peer, p: dict[str, Any], rounds: int, work: Path) -> dict[str, Any]:
    from fx_assets.core.bars import BarConfig, build_bars

    a = _fx_arrays(p)
    sess, inst = _one_segment(a["ts"].shape[0])
    cfg = BarConfig(kind="volume", volume_bar_size=VOLUME_BAR)
    args = {"ts": p["ts"], "price": p["price"], "size": p["size"], "volume": VOLUME_BAR}
    fx_out: dict[str, Any] = {}
    api_out: dict[str, Any] = {}
    ker_out: dict[str, Any] = {}
    res = alternate(
        {
            "fx_assets": lambda: _timed_round(
                lambda: build_bars(a["ts"], a["price"], a["size"], a["sign"], sess, inst, cfg), fx_out
            ),
            "finmlkit_api": lambda: _peer_round(peer, "finmlkit_volume_api", args, api_out),
            "finmlkit_kernels": lambda: _peer_round(peer, "finmlkit_volume_kernels", args, ker_out),
        },
        rounds,
    )
    save = work / "out_finmlkit_volume"
    peer.call("finmlkit_volume_api", args, save=save)
    theirs = {k: np.load(save / f"{k}.npy") for k in ("close_idx", "open", "high", "low", "close", "volume")}
    bars = fx_out["last"]
    np.save(work / "bar_close.npy", bars.close)  # the series the CUSUM of the bar features sees
    n = min(len(bars), theirs["close"].shape[0])
    # fx_assets' bar 0 includes trade 0; finmlkit's first bar starts after it (its indexer's
    # bar 0 opens at trade 0). From bar 1 on the bars cover the same trades.
    agree = {
        "n_bars_fx_assets": len(bars),
        "n_bars_finmlkit": int(theirs["close"].shape[0]),
        "compared_bars": max(n - 1, 0),
        "close_index_equal": bool(
            np.array_equal(np.asarray(bars.n_trades[:n]).cumsum() - 1, theirs["close_idx"][:n])
        ),
    }
    for col in ("open", "high", "low", "close", "volume"):
        agree[f"max_abs_diff_{col}_after_bar0"] = _max_abs(getattr(bars, col)[1:n], theirs[col][1:n])
    return {
        "n_trades": p["n"],
        "volume_bar_contracts": VOLUME_BAR,
        "timings": res,
        "ratio_finmlkit_api_over_fx_assets": _ratio(res["finmlkit_api"], res["fx_assets"]),
        "ratio_finmlkit_kernels_over_fx_assets": _ratio(res["finmlkit_kernels"], res["fx_assets"]),
        "ratio_cpu_finmlkit_kernels_over_fx_assets": _ratio(
            res["finmlkit_kernels"], res["fx_assets"], "cpu_s"
        ),
        "agreement": agree,
    }


def bench_cusum(peer: Peer, price_path: str, rounds: int, work: Path) -> dict[str, Any]:
    from fx_assets.core.bar_features import cusum_filter

    price = np.load(price_path)
    n = price.shape[0]
    args = {"price": price_path, "threshold": CUSUM_THRESHOLD}
    fx_out: dict[str, Any] = {}
    peer_out: dict[str, Any] = {}
    res = alternate(
        {
            "fx_assets": lambda: _timed_round(lambda: cusum_filter(price, CUSUM_THRESHOLD), fx_out),
            "finmlkit": lambda: _peer_round(peer, "finmlkit_cusum", args, peer_out),
        },
        rounds,
    )
    save = work / "out_finmlkit_cusum"
    peer.call("finmlkit_cusum", args, save=save)
    theirs = np.load(save / "events.npy")
    ours = fx_out["last"]
    return {
        "n_prices": int(n),
        "threshold_log": CUSUM_THRESHOLD,
        "timings": res,
        "ratio_finmlkit_over_fx_assets": _ratio(res["finmlkit"], res["fx_assets"]),
        "ratio_cpu_finmlkit_over_fx_assets": _ratio(res["finmlkit"], res["fx_assets"], "cpu_s"),
        "agreement": {
            "events_fx_assets": int(ours.shape[0]),
            "events_finmlkit": int(theirs.shape[0]),
            "identical_event_indices": bool(np.array_equal(ours, theirs)),
        },
    }


def _imbalance_kind(
    peer: Peer, kind: str, p_sub: dict[str, Any], p_full: dict[str, Any], rounds: int
) -> dict[str, Any]:
    from fx_assets.core.bars import BarConfig, build_bars

    cfg = BarConfig(kind="tick_imbalance" if kind == "tick" else "volume_imbalance")
    args = {"ts": p_sub["ts"], "price": p_sub["price"], "size": p_sub["size"], **IMB}

    def fx_call(p: dict[str, Any]) -> Any:
        a = _fx_arrays(p)
        n = a["ts"].shape[0]
        sess, inst = _one_segment(n)
        zero_sign = np.zeros(n, np.int8)  # tick rule, as mlfinpy
        return lambda: build_bars(a["ts"], a["price"], a["size"], zero_sign, sess, inst, cfg)

    fx_sub = fx_call(p_sub)
    fx_out: dict[str, Any] = {}
    peer_out: dict[str, Any] = {}
    res = alternate(
        {
            "fx_assets": lambda: _timed_round(fx_sub, fx_out),
            "mlfinpy": lambda: _peer_round(peer, f"mlfinpy_{kind}_imbalance", args, peer_out),
        },
        max(2, rounds - 2),
    )
    # fx_assets on the whole quarter as well (measured, not extrapolated).
    fx_full = fx_call(p_full)
    fx_full()
    full = rounds_summary([timed(fx_full)[0]["wall_s"] for _ in range(rounds)])
    n, nf = int(p_sub["n"]), int(p_full["n"])
    per_trade_peer = res["mlfinpy"]["wall_s"]["median"] / n
    per_trade_fx = res["fx_assets"]["wall_s"]["median"] / n
    return {
        "subset_trades": n,
        "timings_subset": res,
        "ratio_mlfinpy_over_fx_assets_subset": _ratio(res["mlfinpy"], res["fx_assets"]),
        "fx_assets_full_quarter_wall_s": full,
        "full_quarter_trades": nf,
        "mlfinpy_full_quarter_extrapolated_s": round(per_trade_peer * nf, 1),
        "ratio_mlfinpy_extrapolated_over_fx_assets_full": round(per_trade_peer * nf / full["median"], 1),
        "fx_assets_subset_per_trade_ns": round(per_trade_fx * 1e9, 2),
        "mlfinpy_per_trade_ns": round(per_trade_peer * 1e9, 1),
        "agreement": {
            "bars_fx_assets": len(fx_out["last"]),
            "bars_mlfinpy": int(peer_out["last"]["close"]),
            "note": "same settings, different E0[T]/floor/forced-close details: counts, not identity",
        },
    }


def bench_imbalance(peer: Peer, p_sub: dict[str, Any], p_full: dict[str, Any], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        kind: _imbalance_kind(peer, kind, p_sub, p_full, rounds) for kind in ("tick", "volume")
    }
    out["extrapolation"] = (
        "mlfinpy's median seconds per trade on the subset times the quarter's trade count "
        "(it is a Python loop per trade: linear)"
    )
    return out


def _zstd_floor(path: str) -> int:
    import zstandard

    n = 0
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
        while chunk := r.read(1 << 20):
            n += len(chunk)
    return n


def bench_decode(peer: Peer, raw: Path, sidecar: Path, rounds: int) -> dict[str, Any]:
    from fx_assets.core.sidecar import build_sidecar, sidecar_columns

    tmp = sidecar.parent / "decode_round.arrow"
    fx_out: dict[str, Any] = {}
    peer_out: dict[str, Any] = {}

    def fx_round() -> dict[str, float]:
        tmp.unlink(missing_ok=True)
        t = _timed_round(lambda: build_sidecar(raw, tmp), fx_out)
        return t

    res = alternate(
        {
            "fx_assets_build_sidecar": fx_round,
            "databento_to_ndarray": lambda: _peer_round(
                peer, "databento_to_ndarray", {"path": str(raw)}, peer_out
            ),
            "zstd": lambda: _timed_round(lambda: _zstd_floor(str(raw)), {}),
        },
        rounds,
    )
    cols = sidecar_columns(tmp, ["ts_recv", "price", "size"])
    ours = {
        "n": int(cols["ts_recv"].shape[0]),
        "sum_size": int(cols["size"].sum(dtype=np.int64)),
        "sum_price": int(cols["price"].sum(dtype=np.int64)),
        "first_ts_recv": int(cols["ts_recv"][0]),
        "last_ts_recv": int(cols["ts_recv"][-1]),
    }
    del cols
    tmp.unlink(missing_ok=True)
    fx = res["fx_assets_build_sidecar"]
    return {
        "file": str(raw),
        "compressed_bytes": raw.stat().st_size,
        "n_records": ours["n"],
        "timings": res,
        "ratio_databento_over_fx_assets": _ratio(res["databento_to_ndarray"], fx),
        "ratio_fx_assets_over_zstd": round(fx["wall_s"]["median"] / res["zstd"]["wall_s"]["median"], 3),
        "ratio_databento_over_zstd": round(
            res["databento_to_ndarray"]["wall_s"]["median"] / res["zstd"]["wall_s"]["median"], 3
        ),
        "agreement": {
            "fx_assets": ours,
            "databento": peer_out["last"],
            "identical": ours == peer_out["last"],
        },
    }


def bench_warm_load(sidecar: Path, columns: dict[str, str], rounds: int) -> dict[str, Any]:
    from fx_assets.core.sidecar import sidecar_columns

    def fx(touch: bool) -> float:
        cols = sidecar_columns(sidecar)
        return float(cols["price"].sum()) if touch else 0.0

    def npy(touch: bool) -> float:
        cols = {k: np.load(v, mmap_mode="r") for k, v in columns.items()}
        return float(cols["price"].sum()) if touch else 0.0

    sums: dict[str, Any] = {}
    res = alternate(
        {
            "fx_assets_sidecar_columns": lambda: _timed_round(lambda: fx(False), {}),
            "np_load_mmap": lambda: _timed_round(lambda: npy(False), {}),
            "fx_assets_sidecar_columns_touch": lambda: _timed_round(
                lambda: fx(True), sums.setdefault("fx", {})
            ),
            "np_load_mmap_touch": lambda: _timed_round(lambda: npy(True), sums.setdefault("np", {})),
        },
        max(4 * rounds, 12),  # milliseconds each: many rounds are cheap and tame the noise
        warmup=2,
    )
    return {
        "n_columns": len(columns),
        "timings": res,
        "ratio_np_load_over_fx_assets": _ratio(res["np_load_mmap"], res["fx_assets_sidecar_columns"]),
        "ratio_np_load_over_fx_assets_touch": _ratio(
            res["np_load_mmap_touch"], res["fx_assets_sidecar_columns_touch"]
        ),
        "agreement": {"sum_price_equal": sums["fx"]["last"] == sums["np"]["last"]},
    }


# --- driver -----------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    from fx_assets.core.sidecar import build_sidecar

    mode = "quick" if quick else "full"
    cfg = MODES[mode]
    t0 = time.perf_counter()
    load_before = load_average()
    peer_versions = {peer: ensure_peer(peer) for peer in PEERS}
    vers = versions(peer_versions)  # the commit the run starts on (not one made while it runs)
    root, quarter = market_root(mode)
    raw = raw_file(root, "trades", quarter)
    work = DATA / "peers" / mode
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    sidecar = work / "trades.arrow"
    _log(f"{mode}: decoding {raw}")
    build_sidecar(raw, sidecar)
    inputs = write_inputs(sidecar, work, cfg["mlfinpy_trades"])
    _log(f"{inputs['full']['n']:,} active trades; subset {inputs['subset']['n']:,}")
    figures: dict[str, Any] = {}
    with Peer("finmlkit") as fin:
        _log("volume bars vs finmlkit")
        figures["volume_bars"] = bench_volume_bars(fin, inputs["full"], cfg["rounds"], work)
        _log("CUSUM vs finmlkit")
        figures["cusum"] = bench_cusum(fin, inputs["full"]["price"], cfg["rounds"], work)
        figures["cusum_bars"] = bench_cusum(fin, str(work / "bar_close.npy"), 3 * cfg["rounds"], work)
    with Peer("mlfinpy") as mlf:
        _log("imbalance bars vs mlfinpy")
        figures["imbalance_bars"] = bench_imbalance(mlf, inputs["subset"], inputs["full"], cfg["rounds"])
    with Peer("databento") as dbp:
        _log("decode vs databento and zstd")
        figures["decode"] = bench_decode(dbp, raw, sidecar, cfg["decode_rounds"])
    _log("warm load vs np.load")
    figures["warm_load"] = bench_warm_load(sidecar, inputs["columns"], cfg["rounds"])
    shutil.rmtree(work)
    f = figures
    targets = [
        target(
            "volume bars: finmlkit (its kernels) / fx_assets, wall",
            f["volume_bars"]["ratio_finmlkit_kernels_over_fx_assets"],
            ">=",
            1.0,
            "x",
        ),
        target(
            "volume bars: identical OHLCV after bar 0 (max |diff|, all columns)",
            max(v for k, v in f["volume_bars"]["agreement"].items() if k.startswith("max_abs")),
            "<=",
            0.0,
            "",
        ),
        target(
            "CUSUM on trade prices: finmlkit / fx_assets, wall",
            f["cusum"]["ratio_finmlkit_over_fx_assets"],
            ">=",
            1.0,
            "x",
        ),
        target(
            "CUSUM on volume-bar closes: finmlkit / fx_assets, wall",
            f["cusum_bars"]["ratio_finmlkit_over_fx_assets"],
            ">=",
            1.0,
            "x",
        ),
        target(
            "CUSUM: identical events, trades and bars (1 = yes)",
            float(
                f["cusum"]["agreement"]["identical_event_indices"]
                and f["cusum_bars"]["agreement"]["identical_event_indices"]
            ),
            ">=",
            1.0,
            "",
        ),
        target(
            "tick imbalance bars: mlfinpy / fx_assets (subset)",
            f["imbalance_bars"]["tick"]["ratio_mlfinpy_over_fx_assets_subset"],
            ">=",
            1.0,
            "x",
        ),
        target(
            "volume imbalance bars: mlfinpy / fx_assets (subset)",
            f["imbalance_bars"]["volume"]["ratio_mlfinpy_over_fx_assets_subset"],
            ">=",
            1.0,
            "x",
        ),
        target(
            "decode: databento to_ndarray / fx_assets build_sidecar",
            f["decode"]["ratio_databento_over_fx_assets"],
            ">=",
            1.0,
            "x",
        ),
        target("decode: fx_assets / plain zstd", f["decode"]["ratio_fx_assets_over_zstd"], "<=", 1.5, "x"),
        target(
            "decode: same records as databento (1 = yes)",
            float(f["decode"]["agreement"]["identical"]),
            ">=",
            1.0,
            "",
        ),
    ]
    payload = {
        "mode": mode,
        "command": command_line(),
        "config": {
            "market": str(root),
            "quarter": quarter,
            "rounds": cfg["rounds"],
            "decode_rounds": cfg["decode_rounds"],
            "mlfinpy_subset_trades": inputs["subset"]["n"],
            "active_trades": inputs["full"]["n"],
            "source_trades": inputs["n_source_trades"],
            "volume_bar_contracts": VOLUME_BAR,
            "cusum_threshold_log": CUSUM_THRESHOLD,
            "imbalance": IMB,
            "peer_venvs": {p: str(VENVS / p) for p in PEERS},
        },
        "versions": vers,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "figures": figures,
        "targets": targets,
    }
    path = write_result("bench_peers" if mode == "full" else "bench_peers_quick", payload)
    _log(f"wrote {path}")
    return payload


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a scale-0.05 quarter, fewer rounds")
    ap.add_argument("--setup", action="store_true", help="only create the peers' venvs (make bench-setup)")
    args = ap.parse_args(argv)
    if args.setup:
        for peer in PEERS:
            print(f"{peer} {ensure_peer(peer)}: {venv_python(peer)}")
        return 0
    res = run(quick=args.quick)
    for t in res["targets"]:
        verdict = "skip" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        print(f"{verdict:4}  {t['name']}: {t['value']} ({t['target']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
