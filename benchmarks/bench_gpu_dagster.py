"""The training path as users run it, through Dagster on a GPU: synthesise a market, build the
feature chain of its quarters, then run ``train_models`` and record what the runs' metadata say
(device, uploads per quarter, and per fold the ``fold_transition_ms`` that the
``trained_model`` asset itself measures around its ``fold_transition`` call).

For each fxcache value dtype of ``--dtypes`` (the first builds every stage, the others rebuild
only the fxcache files, the earlier stages being cache hits), ``train_models`` runs once per
seed of ``--seeds``: a new seed is a new model key, so the second run trains the same folds
again in the same process, with the Triton kernels already built (the first fold of a process
pays their build).

Run on the GPU machine (it needs CUDA; Dagster is carried there as wheels)::

    python -m benchmarks.bench_gpu_dagster --out results/gpu_h200_dagster.json \
        --scale 1 --quarters 2024-Q1:2024-Q3 --train-quarters 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
import torch

from fx_assets.core.calendar import quarter_range
from fx_assets.core.synth import SynthConfig, generate_market
from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.resources.pipeline import FxCacheWriteConfig, PipelineConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.resources.training import (
    DeviceFxCacheLoader,
    FoldsConfig,
    TrainerConfig,
    TrainingConfig,
)
from fx_assets.settings import ProjectSettings

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
FEATURES = list(FEATURE_STAGES)


#: what each fold's observation reports, copied into the result file
FOLD_FIELDS = (
    "fold",
    "trainer",
    "auc",
    "auc_null_z",
    "auc_h1_null_z",
    "gross_sharpe",
    "net_sharpe",
    "turnover",
    "n_sessions",
    "fold_transition_ms",
    "fold_view_ms",
    "kernel_warmup_ms",
    "train_seconds",
)


def resources(
    root: Path, dtype: str, n_train: int, seed: int, epochs: int, trainer: str = "mlp"
) -> dict[str, Any]:
    storage = FxStorage(root=str(root))
    pipeline = PipelineConfig(fxcache=FxCacheWriteConfig(dtype=dtype))  # type: ignore[arg-type]
    training = TrainingConfig(  # the folds' defaults (purge, embargo) as users get them
        folds=FoldsConfig(train_quarters=n_train),
        train=TrainerConfig(trainer=trainer, seed=seed, **({"epochs": epochs} if epochs else {})),  # type: ignore[arg-type]
    )
    return {
        "storage": storage,
        "pipeline": pipeline,
        "training": training,
        "fxcache_loader": DeviceFxCacheLoader(storage=storage, pipeline=pipeline),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--quarters", default="2024-Q1:2024-Q3")
    ap.add_argument("--train-quarters", type=int, default=1)
    ap.add_argument("--dtypes", default="f32")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, default=2, help="0: the trainer's default")
    ap.add_argument("--trainers", default="mlp", help="comma list of mlp, dqn")
    ap.add_argument("--market", default="signal", choices=["signal", "null"], help="planted signal or none")
    ap.add_argument("--allow-cpu", action="store_true", help="smoke test of the script without CUDA")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        raise SystemExit("needs CUDA")
    quarters = list(quarter_range(args.quarters))
    root = Path(tempfile.mkdtemp()) / "data"
    t0 = time.perf_counter()
    signal = 1.0 if args.market == "signal" else 0.0
    generate_market(root, SynthConfig(quarters=tuple(quarters), scale=args.scale, seed=7, signal=signal))
    t_synth = time.perf_counter() - t0
    print(f"synth {t_synth:.1f}s", flush=True)
    settings = ProjectSettings(
        data_root=root,
        first_quarter=quarters[0],
        last_quarter=quarters[-1],
        train_quarters=args.train_quarters,
    )
    defs = build_definitions(settings)
    folds = quarters[args.train_quarters :]
    out: dict[str, Any] = {
        "command": " ".join(["python", "-m", "benchmarks.bench_gpu_dagster", *sys.argv[1:]]),
        "scale": args.scale,
        "market": args.market,
        "quarters": args.quarters,
        "train_quarters": args.train_quarters,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (cpu)",
        "torch": torch.__version__,
        "dagster": dg.__version__,
        "synth_seconds": round(t_synth, 2),
        "feature_runs": [],
        "train_runs": [],
    }

    def save() -> None:  # after every run, so a command stopped at its limit keeps what it has
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")

    save()
    with dg.instance_for_test() as inst:
        for dtype in args.dtypes.split(","):
            res = resources(root, dtype, args.train_quarters, 0, args.epochs)
            for q in quarters:
                t0 = time.perf_counter()
                r = dg.materialize(
                    list(defs.assets or []),
                    selection=FEATURES,
                    partition_key=partition_key(q, "ES.FUT"),
                    instance=inst,
                    resources=res,
                    run_config=QUIET,
                )
                ev = next(
                    e
                    for e in r.get_asset_materialization_events()
                    if e.asset_key.to_user_string() == "fxcache"
                )
                md = ev.materialization.metadata
                out["feature_runs"].append(
                    {
                        "quarter": str(q),
                        "dtype": dtype,
                        "ok": r.success,
                        "seconds": round(time.perf_counter() - t0, 2),
                        "fxcache_bars": md["bars"].value if "bars" in md else md["rows"].value,
                    }
                )
                print(out["feature_runs"][-1], flush=True)
                save()
            runs = [(t, int(sd)) for t in args.trainers.split(",") for sd in args.seeds.split(",")]
            for trainer, seed in runs:
                res = resources(root, dtype, args.train_quarters, seed, args.epochs, trainer)
                t0 = time.perf_counter()
                r = defs.resolve_job_def("train_models").execute_in_process(
                    instance=inst,
                    resources=res,
                    run_config=QUIET,
                    tags={
                        "dagster/asset_partition_range_start": partition_key(folds[0], "ES.FUT"),
                        "dagster/asset_partition_range_end": partition_key(folds[-1], "ES.FUT"),
                    },
                )
                run: dict[str, Any] = {
                    "dtype": dtype,
                    "trainer": trainer,
                    "seed": seed,
                    "ok": r.success,
                    "seconds": round(time.perf_counter() - t0, 2),
                    "fold_transition_ms": [],
                }
                for e in r.get_asset_observation_events():
                    md = {k: v.value for k, v in e.asset_observation_data.asset_observation.metadata.items()}
                    if "fold_transition_ms" in md:
                        run["fold_transition_ms"].append(md["fold_transition_ms"])
                        run.setdefault("folds", []).append({k: md.get(k) for k in FOLD_FIELDS if k in md})
                for e in r.get_asset_materialization_events():
                    if e.asset_key.to_user_string() == "trained_model":
                        md = {k: v.value for k, v in e.materialization.metadata.items()}
                        run["trained_model_metadata"] = {
                            k: md.get(k)
                            for k in (
                                "device",
                                "uploads",
                                "uploads_by_quarter",
                                "bytes_uploaded",
                                "upload_seconds",
                                "fold_views_zero_copy",
                                "kernel_warmup_ms",
                            )
                        }
                out["train_runs"].append(run)
                print(run, flush=True)
                save()
    try:
        out["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError as exc:
        out["nvidia_smi"] = f"unavailable: {exc}"
    save()
    print(json.dumps({k: v for k, v in out.items() if k != "feature_runs"}, indent=2, default=str))


if __name__ == "__main__":
    main()
