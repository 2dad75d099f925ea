"""The fold transition's kernels one by one on a CUDA machine: where a fold switch's time goes.

On the scale-1 fold shape of ``bench_gpu`` (3 quarters of 660 k bars, 72-wide f32 value block,
2 training quarters), uploaded the way the loader does (one ``add_fxcaches`` call: a zero-copy
view), this measures

- ``fold_transition`` end to end (synchronised), and its host part alone (the same call with
  the device kept busy by a long kernel queued first, so that the launches are all that the
  host waits for before the one sync);
- each Triton kernel's device time (CUDA events over 50 launches) for the launch shapes in
  ``--grid``, against the bytes it moves and the copy ceiling measured here;
- a profiler table of one transition.

It writes one JSON file (``--out``) and the profile beside it. Run on the GPU machine::

    python3 -m benchmarks.bench_gpu_kernels --out $OUT/gpu_h200_kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_gpu import loader_items, make_fold, sync, write_quarters
from fx_assets.core.device_store import DeviceStore
from fx_assets.core.trainers import TrainConfig, fold_transition
from fx_assets.core.trainers import transition as T


def _events_ms(fn: Any, reps: int = 50) -> float:
    """Median device milliseconds of ``fn`` (CUDA events around each launch)."""
    fn()
    sync()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def _copy_ceiling_GBps(nbytes: int) -> float:
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ms = _events_ms(lambda: y.copy_(x), 20)
    return 2 * nbytes / ms / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=660_000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--grid",
        default="stats_rows=8,16,32;stats_progs_per_sm=4,8,16;stats_warps=2,4,8;norm_block=512,1024,2048;final_cols=4,8,16",
        help="launch-shape values to try, ';'-separated name=v1,v2 (each varied alone)",
    )
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    data = Path(tempfile.mkdtemp(prefix="fxkern_"))
    paths, starts = write_quarters(data, 3, a.rows, seed=0)
    store = DeviceStore(device="cuda")
    store.add_fxcaches(loader_items(paths))
    keys = store.keys()
    view, fr = make_fold(store, keys, starts)
    cfg = TrainConfig(trainer="mlp")
    res: dict[str, Any] = {
        "command": " ".join(["python3", "-m", "benchmarks.bench_gpu_kernels", *sys.argv[1:]]),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "shape": {
            "train_rows": fr.train_end - fr.train_start,
            "rows": fr.val_end - fr.train_start,
            "width": int(view.values.shape[1]),
        },
        "warm_up_s": T.warm_up(view, cfg),
        "tuning_default": dict(T.TUNING),
    }
    res["copy_ceiling_GBps"] = _copy_ceiling_GBps(1 << 30)

    def transition_ms(reps: int) -> dict[str, float]:
        ts = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fold_transition(view, fr, cfg)  # ends in its one sync
            ts.append(1e3 * (time.perf_counter() - t0))
        return {"median": statistics.median(ts), "min": min(ts), "max": max(ts)}

    def device_ms() -> float:
        return _events_ms(lambda: fold_transition(view, fr, cfg), 30)

    res["default"] = {"transition_ms": transition_ms(a.reps), "device_ms_incl_sync": device_ms()}
    # host part: a long device job queued first, so the launches overlap it and only the host
    # side of the call shows (the sync then waits for the job): time to the last launch
    big = torch.empty((8192, 8192), device="cuda")
    host = []
    for _ in range(10):
        sync()
        torch.mm(big, big)
        t0 = time.perf_counter()
        fold_transition(view, fr, cfg)
        host.append(1e3 * (time.perf_counter() - t0))
    mm_ms = _events_ms(lambda: torch.mm(big, big), 5)
    res["host_bound_probe"] = {
        "note": "transition issued behind a queued matmul of mm_ms; its wall time is then about "
        "max(mm_ms, host launches) + the kernels themselves",
        "mm_ms": mm_ms,
        "wall_ms_median": statistics.median(host),
    }
    # each launch shape varied alone, the rest at the default
    trials = []
    for part in a.grid.split(";"):
        name, vals = part.split("=")
        for v in vals.split(","):
            T.TUNING.update(res["tuning_default"])
            T.TUNING[name] = int(v)
            T.warm_up(view, cfg)
            trials.append(
                {"set": {name: int(v)}, "device_ms": device_ms(), "transition_ms": transition_ms(10)}
            )
            print(trials[-1], flush=True)
    T.TUNING.update(res["tuning_default"])
    res["trials"] = trials
    from torch.profiler import ProfilerActivity, profile

    fold_transition(view, fr, cfg)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fold_transition(view, fr, cfg)
        sync()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / (out.stem + "_profile.txt")).write_text(table)
    out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(table)
    print(json.dumps({k: v for k, v in res.items() if k != "trials"}, indent=2, default=str))


if __name__ == "__main__":
    main()
