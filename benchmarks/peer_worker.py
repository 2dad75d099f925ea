"""The peer side of ``bench_peers``: one long-lived process inside a peer's own virtual environment
(``benchmarks/.venvs/<peer>``), driven over stdin/stdout so that ``bench_peers`` can alternate
peer and fx_assets rounds A B A B while both stay warm (numba compiled, inputs loaded).

Standalone on purpose: it imports only the standard library, numpy and the peer (never
fx_assets, which is not installed in a peer's venv). Inputs arrive as ``.npy`` files; each
request is one JSON line ``{"task", "args", "save"}`` and each answer one JSON line
``{"wall_s", "cpu_s", "summary"}`` on the original stdout (the peers' own prints and logging go
to stderr). With ``save`` (a directory) the outputs are written there as ``.npy`` after the
timed call, for the agreement check.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_ARRAYS: dict[str, np.ndarray] = {}


def _load(path: str) -> np.ndarray:
    """Input arrays, loaded once into memory (not timed) and reused by every round."""
    if path not in _ARRAYS:
        _ARRAYS[path] = np.load(path)
    return _ARRAYS[path]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --- finmlkit ------------------------------------------------------------------------------


def finmlkit_volume_api(a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    """The user path: ``TradesData`` (a DataFrame with a datetime index) + ``VolumeBarKit``."""
    from finmlkit.bar.data_model import TradesData
    from finmlkit.bar.kit import VolumeBarKit

    ts, px, qty = _load(a["ts"]), _load(a["price"]), _load(a["size"])

    def run() -> dict[str, np.ndarray]:
        trades = TradesData(ts, px, qty, timestamp_unit="ns")
        kit = VolumeBarKit(trades, float(a["volume"]))
        df = kit.build_ohlcv()
        return {
            "close_idx": np.asarray(kit.bar_close_indices),
            **{c: df[c].to_numpy() for c in ("open", "high", "low", "close", "volume")},
        }

    return run


def finmlkit_volume_kernels(a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    """The two numba kernels alone on arrays (no DataFrame): indexer + ``comp_bar_ohlcv``."""
    from finmlkit.bar.base import comp_bar_ohlcv
    from finmlkit.bar.logic import _volume_bar_indexer

    px, qty = _load(a["price"]), _load(a["size"])

    def run() -> dict[str, np.ndarray]:
        idx = np.array(_volume_bar_indexer(qty, float(a["volume"])), dtype=np.int64)
        o, h, lo, c, v, *_ = comp_bar_ohlcv(px, qty, idx)
        return {"close_idx": idx[1:], "open": o, "high": h, "low": lo, "close": c, "volume": v}

    return run


def finmlkit_cusum(a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    """``finmlkit.sampling.filters.cusum_filter`` on a price series, constant threshold."""
    from finmlkit.sampling.filters import cusum_filter

    px = _load(a["price"])
    thr = np.array([float(a["threshold"])])

    def run() -> dict[str, np.ndarray]:
        return {"events": np.asarray(cusum_filter(px, thr))}

    return run


# --- mlfinpy -------------------------------------------------------------------------------


def _mlfinpy_imbalance(kind: str, a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    import pandas as pd
    from mlfinpy.data_structure import imbalance_bars as ib

    fn = {"tick": ib.get_ema_tick_imbalance_bars, "volume": ib.get_ema_volume_imbalance_bars}[kind]
    ts, px, qty = _load(a["ts"]), _load(a["price"]), _load(a["size"])

    def run() -> dict[str, np.ndarray]:
        # The documented input: a DataFrame of date_time, price, volume (built inside the timing:
        # it is part of what a user of the library does with arrays).
        df = pd.DataFrame({"date_time": pd.to_datetime(ts, unit="ns"), "price": px, "volume": qty})
        bars, _ = fn(
            df,
            num_prev_bars=int(a["num_prev_bars"]),
            expected_imbalance_window=int(a["expected_imbalance_window"]),
            exp_num_ticks_init=int(a["exp_num_ticks_init"]),
            exp_num_ticks_constraints=[float(x) for x in a["exp_num_ticks_constraints"]],
            verbose=False,
        )
        return {
            "close": bars["close"].to_numpy(dtype=np.float64),
            "cum_ticks": bars["cum_ticks"].to_numpy(dtype=np.float64),
        }

    return run


def mlfinpy_tick_imbalance(a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    return _mlfinpy_imbalance("tick", a)


def mlfinpy_volume_imbalance(a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    return _mlfinpy_imbalance("volume", a)


# --- databento -----------------------------------------------------------------------------


def databento_to_ndarray(a: dict[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    """``DBNStore.from_file(path).to_ndarray()``: the whole file as one structured array. The
    agreement digest (count, sums, first/last ``ts_recv``) is computed after the timed call."""
    import databento as db

    def run() -> dict[str, np.ndarray]:
        arr = db.DBNStore.from_file(a["path"]).to_ndarray()
        return {"records": arr}

    return run


def _digest(out: dict[str, np.ndarray]) -> dict[str, Any]:
    arr = out["records"]
    return {
        "n": int(arr.shape[0]),
        "sum_size": int(arr["size"].sum(dtype=np.int64)),
        "sum_price": int(arr["price"].sum(dtype=np.int64)),
        "first_ts_recv": int(arr["ts_recv"][0]),
        "last_ts_recv": int(arr["ts_recv"][-1]),
    }


TASKS: dict[str, Callable[[dict[str, Any]], Callable[[], dict[str, np.ndarray]]]] = {
    "finmlkit_volume_api": finmlkit_volume_api,
    "finmlkit_volume_kernels": finmlkit_volume_kernels,
    "finmlkit_cusum": finmlkit_cusum,
    "mlfinpy_tick_imbalance": mlfinpy_tick_imbalance,
    "mlfinpy_volume_imbalance": mlfinpy_volume_imbalance,
    "databento_to_ndarray": databento_to_ndarray,
}


def main() -> int:
    # Answers go to the real stdout only; anything the peers print lands on stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    runners: dict[str, Callable[[], dict[str, np.ndarray]]] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        out: dict[str, np.ndarray] = {}
        try:
            key = json.dumps([req["task"], req["args"]], sort_keys=True)
            if key not in runners:
                runners[key] = TASKS[req["task"]](req["args"])
            c0 = _cpu()
            t0 = time.perf_counter()
            out = runners[key]()
            wall = time.perf_counter() - t0
            cpu = _cpu() - c0
            if "records" in out:
                summary = _digest(out)
            else:
                summary = {k: int(v.shape[0]) for k, v in out.items()}
            if req.get("save"):
                os.makedirs(req["save"], exist_ok=True)
                for k, v in out.items():
                    np.save(os.path.join(req["save"], f"{k}.npy"), v)
            answers.write(json.dumps({"wall_s": wall, "cpu_s": cpu, "summary": summary}) + "\n")
        except Exception as exc:  # the driver reports it with the task name
            answers.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        del out
    return 0


if __name__ == "__main__":
    sys.exit(main())
