"""Streamed training of a fold forced out of device memory (issue 11), on the path the asset runs.

Writes ``--quarters`` fxcache files of the scale-1 shape (``bench_gpu.write_quarters``: a value
block of 71 f32 columns padded to 72, the f64 price block of 7 columns padded to 8, one contract
roll per quarter; synthetic values) and builds the fold of the last quarter (all earlier quarters
train). The fold is then trained the way ``trained_model`` does when the loader's budget is below
the fold's size: ``StreamedRows(paths, fold_range, cfg, block_rows=..., device=..., keys=...)``
(what ``ResidentQuarters.streamed`` calls) then ``train_mlp`` / ``train_dqn`` on it. Beside it,
the same trainers on the resident fold cut into the same blocks (``DeviceStore.add_fxcaches`` +
``fold_transition`` + ``ResidentRows``), so the streaming overhead is the difference.

Figures (each a {min, median, max, rounds} over epochs or repeated passes):

- ``stats_pass``: the one streaming pass (training statistics, checks) before training: seconds,
  rows/s, GB/s moved host→device;
- ``read_only``: a bare pass over the training blocks (read, copy, normalise, labels; nothing
  trained): rows/s and the host→device rate (bytes over the copy stream's CUDA-event time);
- per trainer and batch size: training rows/s (fitted rows / the epoch's training seconds),
  streamed and resident, the GPU-wait share = (compute stream's waits on copies, CUDA events) /
  training seconds, and the slowdown share ``1 - resident / streamed`` seconds.

``--row-unit snapshot`` writes snapshot-row files instead (``bench_gpu.write_snapshot_quarters``:
the shape ``snapshot_rows.write_snapshot_fxcache`` writes, 71 feature columns padded to 72 and
the f64 ``mid`` / ``session`` / ``contract`` block padded to 8, ``row_unit`` ``snapshot`` in the
meta) and trains with ``row_unit="snapshot"`` at the default snapshot label config (labels from
``snapshot_labels`` of the exact mid; the purge is their reach).

The result file is rewritten after each phase and each training row, so a run cut off at its
time limit still leaves what it measured.

Run on the H200: ``python3 -m benchmarks.bench_stream --out $OUT/stream_h200.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from benchmarks.bench_gpu import (
    loader_items,
    loader_store,
    machine,
    warm_page_cache,
    write_quarters,
    write_snapshot_quarters,
)
from benchmarks.common import rounds_summary
from fx_assets.core.fold_stream import StreamedRows
from fx_assets.core.folds import FoldConfig, fold_range
from fx_assets.core.fxcache import open_fxcache, read_header
from fx_assets.core.ofi import OfiConfig
from fx_assets.core.trainers import TrainConfig, fold_transition, train_dqn, train_mlp
from fx_assets.core.trainers.rows import ResidentRows


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return "unknown"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def stream_figures(st: StreamedRows, before: dict[str, Any], seconds: float) -> dict[str, Any]:
    after = st.stream_stats.as_dict()
    d = {
        k: after[k] - before.get(k, 0)
        for k in (
            "h2d_bytes",
            "h2d_seconds",
            "gpu_copy_wait_seconds",
            "read_seconds",
            "read_wait_seconds",
            "rows",
            "blocks",
        )
    }
    d["h2d_GBps_copy_engine"] = d["h2d_bytes"] / d["h2d_seconds"] / 1e9 if d["h2d_seconds"] > 0 else None
    d["h2d_GBps_wall"] = d["h2d_bytes"] / seconds / 1e9
    d["gpu_wait_share"] = d["gpu_copy_wait_seconds"] / seconds
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quarters", type=int, default=3)
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows per quarter")
    ap.add_argument("--block-rows", type=int, default=1 << 20)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", default="8192,1024")
    ap.add_argument("--trainers", default="mlp,dqn")
    ap.add_argument("--row-unit", choices=("bar", "snapshot"), default="bar")
    ap.add_argument("--dqn-steps", type=int, default=400)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default="benchmarks/results/stream_h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tmp = Path(args.data or tempfile.mkdtemp(prefix="fxstream_"))
    tmp.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.bench_stream", *sys.argv[1:]]),
        "machine": machine(),
        "device": str(dev),
        "config": vars(args),
        "load_avg_before": os.getloadavg(),
        "commit": _commit(),
    }
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every phase: a run cut off still leaves what it measured
        out_path.write_text(json.dumps(out, indent=2, default=str))

    t0 = time.perf_counter()
    writer = write_quarters if args.row_unit == "bar" else write_snapshot_quarters
    paths, starts = writer(tmp, args.quarters, args.rows, seed=7)
    out["write_fxcache_s"] = time.perf_counter() - t0
    warm_page_cache(paths)  # the files come from the page cache, as after the fxcache stage
    ts = np.concatenate(
        [np.array(open_fxcache(p, verify_finite=False, verify_checksums=False).ts) for p in paths]
    )
    # the trainer config the asset would pass (row unit from the pipeline), blocks as streamed
    base = TrainConfig(trainer="mlp", block_rows=args.block_rows, row_unit=args.row_unit)
    fcfg = FoldConfig(train_quarters=args.quarters - 1, purge_bars=31, warmup_bars=0)
    if args.row_unit == "snapshot":  # the purge is the snapshot labels' reach in rows
        fr = fold_range(
            ts,
            starts,
            args.quarters - 1,
            fcfg,
            label_horizon=base.purge_bars,
            name="bench",
            row_unit="snapshot",
        )
    else:
        fr = fold_range(ts, starts, args.quarters - 1, fcfg, label_horizon=31, name="bench")
    keys = [k for k, _ in loader_items(paths)]
    tick = OfiConfig().tick_size  # what ResidentQuarters.streamed passes (the instrument tick)
    out["fold"] = {"train": [fr.train_start, fr.train_end], "val": [fr.val_start, fr.val_end]}
    h0 = read_header(paths[0])
    bpr = int(h0.row_width) * int(h0.itemsize) + int(h0.price_width) * 8
    out["row_bytes"] = bpr
    out["fold_bytes_on_disk"] = len(ts) * bpr
    save()

    # 1. the statistics pass (what the asset's fold switch does for a streamed fold), repeated
    prep, st = [], None
    for _ in range(3):
        if st is not None:
            st.close()
        _sync()
        t = time.perf_counter()
        st = StreamedRows(paths, fr, base, block_rows=args.block_rows, device=dev, keys=keys, price_tick=tick)
        _sync()
        prep.append(time.perf_counter() - t)
    assert st is not None
    n_pass = (fr.train_end - fr.train_start) + (fr.val_end - fr.val_start)
    out["stats_pass"] = {
        "seconds": rounds_summary(prep),
        "rows_per_s": n_pass / min(prep),
        "verify_checksums_at_open": True,
        "figures_last": st.stream_stats.as_dict(),
    }
    # the same without re-hashing the files at open (the checksum pass is the open's, not streaming)
    t = time.perf_counter()
    st2 = StreamedRows(
        paths, fr, base, block_rows=args.block_rows, device=dev, keys=keys, verify=False, price_tick=tick
    )
    _sync()
    out["stats_pass"]["seconds_without_open_verify"] = time.perf_counter() - t
    out["stats_pass"]["prep_seconds_streaming_only"] = st2.stream_stats.prep_seconds
    st2.close()
    save()

    # 2. a bare pass over the training blocks
    bare = []
    for _ in range(3):
        before = st.stream_stats.as_dict()
        _sync()
        t = time.perf_counter()
        for _b in st.block_list("train", 0, st.n_train):
            pass
        _sync()
        s = time.perf_counter() - t
        bare.append((s, stream_figures(st, before, s)))
    out["read_only"] = {
        "seconds": rounds_summary([s for s, _ in bare]),
        "rows_per_s": st.n_train / min(s for s, _ in bare),
        "figures_best": min(bare, key=lambda x: x[0])[1],
    }
    save()

    # 3. resident reference fold (same files, same blocks)
    store = loader_store(dev)
    store.add_fxcaches(loader_items(paths))
    fold = fold_transition(store.concat_view(keys), fr, base)
    out["stats_vs_resident"] = {
        "mean_max_abs_diff": float((st.mean - fold.mean).abs().max()),
        "std_max_rel_diff": float(((st.std - fold.std).abs() / fold.std).max()),
        "f32_affine_identical": bool(
            torch.equal((1 / st.std).float(), (1 / fold.std).float())
            and torch.equal((-st.mean / st.std).float(), (-fold.mean / fold.std).float())
        ),
    }
    res_rows = ResidentRows(fold, args.block_rows)
    # the streamed blocks against the resident fold's, element by element (on CUDA the resident
    # inputs come from the Triton normalise kernel, the streamed ones from torch.addcmul)
    diff = {"x_mismatch": 0, "x_max_abs": 0.0, "y_mismatch": 0, "r1_mismatch": 0, "elements": 0}
    parts: tuple[tuple[Literal["train", "val"], int], ...] = (("train", st.n_train), ("val", st.n_val))
    for part, n in parts:
        for a, b in zip(st.block_list(part, 0, n), res_rows.block_list(part, 0, n), strict=True):
            assert a.x is not None and b.x is not None
            diff["x_mismatch"] += int((a.x != b.x).sum())
            diff["x_max_abs"] = max(diff["x_max_abs"], float((a.x - b.x).abs().max()))
            diff["elements"] += a.x.numel()
            for k in ("y", "r1"):
                u, v = getattr(a, k), getattr(b, k)
                diff[f"{k}_mismatch"] += int(((u != v) & ~(u.isnan() & v.isnan())).sum())
    out["blocks_vs_resident"] = diff
    save()

    runs: list[dict[str, Any]] = []
    out["training"] = runs
    for trainer in args.trainers.split(","):
        for bs in [int(b) for b in args.batches.split(",")]:
            upd: dict[str, Any] = {
                "trainer": trainer,
                "batch_size": bs,
                "epochs": args.epochs,
                "patience": 99,
            }
            if trainer == "dqn":
                upd.update(max_steps_per_epoch=args.dqn_steps, n_envs=1024, replay_size=100_000)
            cfg = base.model_copy(update=upd)
            row: dict[str, Any] = {"trainer": trainer, "batch_size": bs}
            for name, rows in (("resident", res_rows), ("streamed", st)):
                before = st.stream_stats.as_dict()
                d = tmp / f"m_{trainer}_{bs}_{name}"
                _sync()
                t = time.perf_counter()
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
                r = (train_mlp if trainer == "mlp" else train_dqn)(rows, cfg, d, keys)
                wall = time.perf_counter() - t
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
                tr = [h["train_seconds"] for h in r.history]
                fit = json.loads(r.sidecar_path.read_text())["early_stopping"]["fit_rows"]
                row[name] = {
                    "train_seconds": rounds_summary(tr),
                    "epoch_seconds": rounds_summary([h["epoch_seconds"] for h in r.history]),
                    "wall_seconds": wall,
                    "cpu_seconds_user_sys": cpu,
                    "fit_rows": fit,
                }
                if trainer == "mlp":
                    row[name]["rows_per_s"] = rounds_summary([fit / s for s in tr])
                else:
                    steps = cfg.max_steps_per_epoch or 0
                    row[name]["transitions_per_s"] = rounds_summary([steps * cfg.n_envs / s for s in tr])
                if name == "streamed":
                    row[name]["stream"] = stream_figures(st, before, wall)
                row[name]["auc"] = r.metrics.get("auc")
                shutil.rmtree(d, ignore_errors=True)
            sr, rr = row["streamed"]["train_seconds"]["median"], row["resident"]["train_seconds"]["median"]
            row["slowdown_share"] = 1 - rr / sr if sr > 0 else None
            runs.append(row)
            save()
            print(json.dumps({k: row[k] for k in ("trainer", "batch_size", "slowdown_share")}), flush=True)
    st.close()
    out["load_avg_after"] = os.getloadavg()
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["how"] = (
        "benchmarks/bench_stream.py: the fold of the last of --quarters synthetic scale-1-shape fxcache "
        "files (page cache warm), streamed through StreamedRows (as ResidentQuarters.streamed builds it "
        "when a fold exceeds the loader's device budget) and trained by train_mlp / train_dqn; beside "
        "it the resident fold (DeviceStore + fold_transition) cut into the same blocks. train seconds "
        "per epoch from the trainers' history; host->device rate = bytes / CUDA-event time of the copy "
        "stream; GPU-wait share = CUDA-event time the compute stream waited for block copies / wall."
    )
    if not args.data:
        shutil.rmtree(tmp, ignore_errors=True)
    save()
    print(
        json.dumps(
            {k: out[k] for k in ("stats_pass", "read_only", "stats_vs_resident", "blocks_vs_resident")},
            indent=1,
            default=str,
        )
    )
    for row in runs:
        s = row["streamed"]
        print(
            row["trainer"],
            row["batch_size"],
            "resident",
            row["resident"]["train_seconds"]["median"],
            "streamed",
            s["train_seconds"]["median"],
            "wait",
            round(s["stream"]["gpu_wait_share"], 4),
            "h2d GB/s",
            s["stream"]["h2d_GBps_copy_engine"],
            flush=True,
        )


if __name__ == "__main__":
    main()
