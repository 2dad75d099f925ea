"""The device loader in a real Dagster run on a GPU: synthesise a market, build the features of
three quarters, then train two walk-forward folds in ONE ``train_models`` run and record what
the run's metadata says (device, uploads per quarter, fold metrics, timings).

Run on the GPU machine (it needs CUDA; Dagster is carried there as wheels)::

    python -m benchmarks.bench_gpu_dagster --out results/gpu_h200_dagster.json [--scale 0.05]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import tempfile
import time
from pathlib import Path

import dagster as dg
import torch

from fx_assets.core.calendar import quarter_range
from fx_assets.core.synth import SynthConfig, generate_market
from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.settings import ProjectSettings

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
FEATURES = list(FEATURE_STAGES)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--trainer", default="mlp")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    root = Path(tempfile.mkdtemp()) / "data"
    t0 = time.perf_counter()
    generate_market(
        root,
        SynthConfig(quarters=tuple(quarter_range("2024-Q1:2024-Q3")), scale=args.scale, seed=7, signal=1.0),
    )
    t_synth = time.perf_counter() - t0
    settings = ProjectSettings(
        data_root=root, first_quarter=dt.date(2024, 1, 1), last_quarter=dt.date(2024, 7, 1), train_quarters=1
    )
    defs = build_definitions(settings)
    res = dict(defs.resources or {})
    out: dict = {
        "command": f"python -m benchmarks.bench_gpu_dagster --scale {args.scale}",
        "scale": args.scale,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "dagster": dg.__version__,
        "synth_seconds": round(t_synth, 2),
        "feature_runs": [],
    }
    with dg.instance_for_test() as inst:
        for q in quarter_range("2024-Q1:2024-Q3"):
            t0 = time.perf_counter()
            r = dg.materialize(
                list(defs.assets or []),
                selection=FEATURES,
                partition_key=partition_key(q, "ES.FUT"),
                instance=inst,
                resources=res,
                run_config=QUIET,
            )
            bars = next(
                e for e in r.get_asset_materialization_events() if e.asset_key.to_user_string() == "fxcache"
            )
            out["feature_runs"].append(
                {
                    "quarter": str(q),
                    "ok": r.success,
                    "seconds": round(time.perf_counter() - t0, 2),
                    "fxcache_bars": bars.materialization.metadata["bars"].value,
                }
            )
        t0 = time.perf_counter()
        r = defs.resolve_job_def("train_models").execute_in_process(
            instance=inst,
            resources=res,
            run_config=QUIET,
            tags={
                "dagster/asset_partition_range_start": "2024-04|ES.FUT",
                "dagster/asset_partition_range_end": "2024-07|ES.FUT",
            },
        )
        out["train_run_ok"] = r.success
        out["train_run_seconds"] = round(time.perf_counter() - t0, 2)
        for e in r.get_asset_materialization_events():
            if e.asset_key.to_user_string() == "trained_model":
                md = {k: v.value for k, v in e.materialization.metadata.items()}
                out["trained_model_metadata"] = {
                    k: md[k]
                    for k in (
                        "device",
                        "uploads",
                        "uploads_by_quarter",
                        "bytes_uploaded",
                        "upload_seconds",
                        "run_seconds",
                        "folds",
                    )
                }
                break
    out["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
