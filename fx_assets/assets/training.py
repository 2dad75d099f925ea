"""Training assets: ``fold_ranges``, ``trained_model`` (per validation quarter × symbol) and the
unpartitioned ``walk_forward_report``.

A fold is named by its validation quarter: ``trained_model[2024-Q3|ES.FUT]`` trains on the
``train_quarters`` quarters before 2024-Q3 (purged) and is evaluated on 2024-Q3 only. Its
fxcache input is a time-window mapping over exactly those quarters, so a later quarter can
never reach a fold. ``trained_model`` runs all the folds of a backfill in one run (single-run
backfill policy) and loads its fxcache partitions through the device loader, which uploads
each quarter once per run; labels, targets and per-fold normalisation are derived on the
device from the resident data, never read from disk. A fold that fails does not stop the run's
other folds, but fails the step naming it; the folds that finished are recorded as materialized.
"""

import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

from fx_assets.assets.common import StageIO, load_build_metadata, name_now, save_build_metadata
from fx_assets.automation import EAGER_ALL, REPORT
from fx_assets.core import lineage
from fx_assets.core import metrics as M
from fx_assets.core.atomic import atomic_write_bytes, atomic_write_text
from fx_assets.core.calendar import quarter_label, session_day
from fx_assets.core.errors import FxDataError
from fx_assets.core.folds import (
    FoldRange,
    feature_lookback,
    fold_range,
    fold_table,
    quarter_start_ns,
    snapshot_feature_lookback,
)
from fx_assets.core.fxcache import open_fxcache
from fx_assets.core.report import FoldOOS, equity_png, gross_returns, stitch
from fx_assets.core.trainers.common import FoldData
from fx_assets.partitions import QuarterSymbol, parse_partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.resources.training import DeviceFxCacheLoader, ResidentQuarters, TrainingConfig, quarter_window

GPU_TAGS = {"fx/gpu": "1"}


def fold_parts(part: QuarterSymbol, n_train: int) -> list[QuarterSymbol]:
    return [QuarterSymbol(q, part.symbol) for q in quarter_window(part.quarter, n_train)]


def fxcache_keys(storage: FxStorage, pipeline: PipelineConfig, parts: list[QuarterSymbol]) -> list[str]:
    return [StageIO(storage, pipeline, p).key("fxcache") for p in parts]


def fold_file(
    storage: FxStorage, pipeline: PipelineConfig, training: TrainingConfig, part: QuarterSymbol, n_train: int
) -> tuple:
    parts = fold_parts(part, n_train)
    keys = fxcache_keys(storage, pipeline, parts)
    reach = training.train_config(pipeline.fxcache.row_unit).purge_bars
    key = lineage.fold_ranges_key(keys, training.fold_config(n_train), reach)
    path = storage.layout.stage_file("fold_ranges", part.symbol, part.quarter, key, "json")
    return parts, keys, key, path


def model_dir(
    storage: FxStorage,
    pipeline: PipelineConfig,
    training: TrainingConfig,
    loader: DeviceFxCacheLoader,
    part: QuarterSymbol,
    n_train: int,
) -> tuple:
    """(fxcache keys, model key, directory) of a fold: the key covers the fold's inputs, the
    fold and trainer configs and the device loader's settings (``key_settings``)."""
    parts = fold_parts(part, n_train)
    keys = fxcache_keys(storage, pipeline, parts)
    cfg = training.train_config(pipeline.fxcache.row_unit)
    key = lineage.trained_model_key(
        keys, training.fold_config(n_train), cfg, loader.key_settings(), label_horizon=cfg.purge_bars
    )
    return keys, key, storage.layout.models_dir(part.symbol, part.quarter, key)


def shown(part: QuarterSymbol) -> str:
    """A partition as metadata shows it, ``2024-Q3 ES.FUT``: the key's ``|`` would split a
    markdown table cell."""
    return f"{part.quarter_label} {part.symbol}"


def png_markdown(png: bytes, alt: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


def _fold_range_to_json(fr: FoldRange, keys: list[str], labels: list[str]) -> str:
    d = {k: getattr(fr, k) for k in FoldRange.__dataclass_fields__}
    d["fxcache_keys"] = keys
    d["quarters"] = labels
    return json.dumps(d, indent=2)


def _fold_range_from_json(text: str) -> FoldRange:
    d = json.loads(text)
    return FoldRange(**{k: d[k] for k in FoldRange.__dataclass_fields__})


def make_training_assets(training_partitions, fxcache, window_mapping, train_quarters: int) -> tuple:
    """``train_quarters``: the project's rolling window, which ``window_mapping`` also encodes."""
    n_train = train_quarters

    @dg.asset(
        partitions_def=training_partitions,
        automation_condition=EAGER_ALL,
        deps=[dg.AssetDep(fxcache, partition_mapping=window_mapping)],
        group_name="training",
        code_version=lineage.code_version("fold_ranges"),
        backfill_policy=dg.BackfillPolicy.single_run(),
        kinds={"json"},
        description=(
            "Index ranges of one walk-forward fold into the time-ordered concatenation of its quarters: "
            "rolling training window, purge ≥ the longest label horizon, embargo (default: max(label horizon, "
            "longest feature look-back)), warm-up excluded; "
            "computed from bar timestamps alone."
        ),
    )
    def fold_ranges(
        context: dg.AssetExecutionContext,
        storage: FxStorage,
        pipeline: PipelineConfig,
        training: TrainingConfig,
    ) -> dg.MaterializeResult:
        table = []
        stage_cfgs = pipeline.stage_configs()
        row_unit = stage_cfgs.fxcache.row_unit
        lookback = (
            snapshot_feature_lookback(stage_cfgs.snapshot)
            if row_unit == "snapshot"
            else feature_lookback(stage_cfgs.bar_features, stage_cfgs.ofi)
        )
        for pk in sorted(context.partition_keys):
            part = parse_partition_key(pk)
            parts, keys, key, out = fold_file(storage, pipeline, training, part, n_train)
            ts = np.concatenate(
                [
                    np.array(
                        open_fxcache(StageIO(storage, pipeline, p).require("fxcache"), verify_finite=False).ts
                    )
                    for p in parts
                ]
            )
            starts = [quarter_start_ns(p.quarter) for p in parts]
            try:
                fr = fold_range(
                    ts,
                    starts,
                    len(parts) - 1,
                    training.fold_config(n_train),
                    label_horizon=training.train_config(row_unit).purge_bars,
                    feature_lookback=lookback,
                    name=quarter_label(part.quarter),
                    row_unit=row_unit,
                )
            except FxDataError as exc:
                raise dg.Failure(f"{part.label}: {exc}") from exc
            labels = [p.quarter_label for p in parts]
            atomic_write_text(out, _fold_range_to_json(fr, keys, labels))

            # as StageIO.check_current: ranges of sources that changed while this step ran,
            # recorded, would stand as up to date (the file stays, named by its own inputs)
            def ranges_now(p: QuarterSymbol = part) -> Path:
                return fold_file(storage, pipeline, training, p, n_train)[3]

            now = name_now(ranges_now)
            if now != out.name:
                raise dg.Failure(
                    f"{part.label}: the raw data of its quarters changed while its fold ranges were "
                    f"computed (the file for the sources now: {now}); not recorded; run it again"
                )
            rows = fold_table([fr])
            context.log_event(
                dg.AssetObservation(
                    asset_key=context.asset_key,
                    partition=pk,
                    metadata={
                        "fold": shown(part),
                        "path": dg.MetadataValue.path(str(out)),
                        "training_quarters": ", ".join(labels[:-1]),
                        "ranges": dg.MetadataValue.md(_rows_markdown(rows)),
                    },
                )
            )
            table.append(
                {
                    "fold": shown(part),
                    "training_quarters": ", ".join(labels[:-1]),
                    "train": f"[{fr.train_start}, {fr.train_end})",
                    "val": f"[{fr.val_start}, {fr.val_end})",
                    "train_bars": fr.n_train,
                    "val_bars": fr.n_val,
                    "purge": fr.purge_bars,
                    "embargo": fr.embargo_bars,
                    "key": key[:16],
                }
            )
        return dg.MaterializeResult(metadata={"folds": dg.MetadataValue.md(_rows_markdown(table))})

    @dg.asset(
        partitions_def=training_partitions,
        automation_condition=EAGER_ALL,
        ins={
            "fxcache": dg.AssetIn(
                key=fxcache.key, partition_mapping=window_mapping, input_manager_key="fxcache_loader"
            )
        },
        deps=[fold_ranges],
        group_name="training",
        code_version=lineage.code_version("trained_model"),
        backfill_policy=dg.BackfillPolicy.single_run(),
        op_tags=GPU_TAGS,
        # Asset-backfill and automation runs carry no job tags: the GPU limit is this pool.
        pool="gpu",
        kinds={"pytorch", "safetensors"},
        description=(
            "One model per fold (MLP baseline or double-DQN agent, by config), trained on the fold's "
            "training slice of the device-resident fxcache and evaluated on its validation quarter only."
        ),
    )
    def trained_model(
        context: dg.AssetExecutionContext,
        fxcache: ResidentQuarters,
        storage: FxStorage,
        pipeline: PipelineConfig,
        training: TrainingConfig,
    ) -> dg.MaterializeResult:
        # torch loads with the step that trains, not with the code location (feature runs, the
        # webserver and the daemon load these definitions too)
        from fx_assets.core.fold_stream import StreamedRows
        from fx_assets.core.trainers.dqn import train_dqn
        from fx_assets.core.trainers.mlp import train_mlp
        from fx_assets.core.trainers.transition import fold_transition, warm_up

        cfg = training.train_config(pipeline.fxcache.row_unit)
        t_run = time.perf_counter()
        warm: dict[str, float] = {}  # the kernel warm-up of this run, once

        def one_fold(pk: str) -> tuple[dict, dict[str, Any], list[QuarterSymbol]]:
            """Train (or reuse) one fold: its table row, its materialization metadata and its
            quarters."""
            part = parse_partition_key(pk)
            parts, _, _, fpath = fold_file(storage, pipeline, training, part, n_train)
            if not fpath.is_file():
                raise dg.Failure(
                    f"{part.label}: fold ranges not materialized for the current config ({fpath.name})"
                )
            fr = _fold_range_from_json(fpath.read_text())
            # The loader that put this run's data on the device: its settings are in the key.
            keys, mkey, out_dir = model_dir(storage, pipeline, training, fxcache.loader, part, n_train)
            done = out_dir / "checkpoint.json"
            built = load_build_metadata(done) if done.is_file() else None
            if built is not None and (out_dir / "oos.npz").is_file() and (out_dir / "equity.png").is_file():
                # Same key = same inputs, config and code: the model on disk is this run's result,
                # reported with the metrics, tables and picture of the run that trained it.
                metrics = {k: float(v) for k, v in json.loads(done.read_text())["metrics"].items()}
                built_meta = {**built, "action": "reused"}
                context.log_event(
                    dg.AssetObservation(asset_key=context.asset_key, partition=pk, metadata=built_meta)
                )
                context.log.info(f"{part.label}: model {mkey[:16]} already trained, reused")
                return _fold_row(shown(part), fr, metrics, float("nan"), mkey, "reused"), built_meta, parts
            plan = fxcache.plan(parts)
            first = not warm and plan.mode == "resident"
            stream_meta: dict[str, Any] = {}
            if plan.mode == "resident":
                if first:
                    # the run's first trained fold: build the transition kernels on a small fold
                    # of its first quarter (same layout, same kernel build) first, so no fold's
                    # switch time includes the one-off build, and the fold's own view is still
                    # built below
                    warm["kernel_warmup_ms"] = round(warm_up(fxcache.view(parts[:1]), cfg) * 1e3, 3)
                # A fold switch, timed whole: its view (a slice of the resident quarters: session
                # ids, ln close and the roll counts come with it, computed at upload) and its
                # inputs and labels.
                t0 = time.perf_counter()
                view = fxcache.view(parts)
                view_ms = (time.perf_counter() - t0) * 1e3
                try:
                    resident = fold_transition(view, fr, cfg)
                except FxDataError as exc:
                    raise dg.Failure(f"{part.label}: {exc}") from exc
                transition_ms = (time.perf_counter() - t0) * 1e3
                val_ts, val_sessions = resident.val_ts, resident.val_sessions
                fold: FoldData | StreamedRows = resident
            else:
                # The fold does not fit the device budget: its rows stream from the fxcache files
                # (statistics in one pass over the training rows, here).
                t0 = time.perf_counter()
                try:
                    streamed = fxcache.streamed(parts, fr, cfg)
                except FxDataError as exc:
                    raise dg.Failure(f"{part.label}: {exc}") from exc
                view_ms = 0.0
                transition_ms = (time.perf_counter() - t0) * 1e3
                val_ts = streamed.val_ts()
                fold = streamed
                val_sessions = session_day(val_ts).astype(np.int32)
            t1 = time.perf_counter()
            trainer = train_mlp if cfg.trainer == "mlp" else train_dqn
            try:
                result = trainer(fold, cfg, out_dir, keys)
                # before a streamed fold closes: its validation labels of every horizon
                snap_meta = (
                    _snapshot_outputs(out_dir, fold, result, val_ts, cfg)
                    if cfg.row_unit == "snapshot"
                    else _bar_outputs(out_dir, result, val_ts)
                )
            finally:
                if isinstance(fold, StreamedRows):
                    stream_meta = {f"stream_{k}": v for k, v in fold.stream_stats.as_dict().items()}
                    fold.close()
            train_s = time.perf_counter() - t1
            oos = FoldOOS(
                quarter_label(part.quarter),
                val_ts,
                val_sessions,
                result.val_positions,
                result.val_returns,
                gross_returns(result.val_returns, result.val_positions, cfg.cost),
            )
            oos.save(out_dir / "oos.npz")
            png = equity_png(oos.ts, oos.returns, f"{part.label} out-of-sample ({cfg.trainer})")
            atomic_write_bytes(out_dir / "equity.png", png)
            metrics = {k: float(v) for k, v in result.metrics.items()}
            fold_meta: dict[str, Any] = {
                "fold": shown(part),
                "action": "trained",
                "trainer": cfg.trainer,
                **{k: round(v, 6) for k, v in metrics.items()},
                "best_epoch": result.best_epoch,
                "row_unit": cfg.row_unit,
                **snap_meta,
                "fold_rows": plan.mode,
                "fold_device_gib": round(plan.need_bytes / 2**30, 4),
                "device_budget_gib": round(plan.budget_bytes / 2**30, 4),
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in stream_meta.items()},
                "fold_transition_ms": round(transition_ms, 3),
                "fold_view_ms": round(view_ms, 3),
                **(warm if first else {}),
                "train_seconds": round(train_s, 3),
                "checkpoint": dg.MetadataValue.path(str(result.best_path)),
                "equity_curve": png_markdown(png, f"equity {shown(part)}"),
            }
            # Last file of the fold: its presence marks the model complete (see the reuse above).
            save_build_metadata(done, fold_meta)
            context.log_event(
                dg.AssetObservation(asset_key=context.asset_key, partition=pk, metadata=fold_meta)
            )
            row = _fold_row(shown(part), fr, metrics, transition_ms, mkey, "trained")
            context.log.info(f"{part.label}: {row}")
            return row, fold_meta, parts

        rows, finished, failed = [], [], []
        for pk in sorted(context.partition_keys):
            # One fold failing does not stop the others (folds are independent), but it fails
            # the step below: a partial success is never reported as success.
            try:
                row, meta, parts = one_fold(pk)
                # The fold's inputs are the fxcache files resolved for it from the sources of
                # the step's start. If a window quarter's raw data changed since (and a user's
                # run rebuilt its fxcache while the fold trained), the model is of data that is
                # no longer current: recorded, it would stand as up to date for good (automation
                # does not retrain a fold whose materialization came after its inputs' change).
                changed = fxcache.changed_since_loaded(parts)
                if changed:
                    raise dg.Failure(
                        f"the raw data of {', '.join(changed)} changed while this fold trained: "
                        "its model is of the old data and is not recorded; run it again"
                    )
            except Exception as exc:
                context.log.error(f"{parse_partition_key(pk).label}: fold failed: {exc}")
                failed.append((pk, exc))
                continue
            rows.append(row)
            finished.append((pk, meta))
        if failed:
            # A failed step records no materialization: record each fold that finished, with its
            # own metadata, so the materialized partitions are exactly the folds that succeeded.
            for pk, meta in finished:
                context.log_event(
                    dg.AssetMaterialization(asset_key=context.asset_key, partition=pk, metadata=meta)
                )
            names = [shown(parse_partition_key(pk)) for pk, _ in failed]
            ok = [shown(parse_partition_key(pk)) for pk, _ in finished]
            raise dg.Failure(
                description=(
                    f"{len(failed)} of {len(failed) + len(finished)} fold(s) failed: "
                    + "; ".join(f"{n}: {exc}" for n, (_, exc) in zip(names, failed, strict=True))
                ),
                metadata={"failed_folds": ", ".join(names), "materialized_folds": ", ".join(ok) or "none"},
            ) from failed[0][1]
        stats = fxcache.store.stats()
        return dg.MaterializeResult(
            metadata={
                "folds": dg.MetadataValue.md(_rows_markdown(rows)),
                "device": str(fxcache.store.device),
                "uploads": int(stats["uploads"]),
                "uploads_by_quarter": dg.MetadataValue.json(
                    {label: stats["uploads_by_key"].get(k, 0) for label, k in sorted(fxcache.keys.items())}
                ),
                "bytes_uploaded": int(stats["bytes_uploaded"]),
                "upload_seconds": round(float(stats["upload_seconds"]), 4),
                "fold_views_zero_copy": int(stats["concat_zero_copy"]),
                **warm,
                "run_seconds": round(time.perf_counter() - t_run, 3),
                "trainer": cfg.trainer,
            }
        )

    @dg.asset(
        deps=[dg.AssetDep(trained_model, partition_mapping=dg.AllPartitionMapping())],
        automation_condition=REPORT,
        group_name="training",
        code_version=lineage.code_version("walk_forward_report"),
        kinds={"matplotlib"},
        description="All folds' out-of-sample results stitched in time order: table, combined equity curve, per-fold Sharpe.",
    )
    def walk_forward_report(
        context: dg.AssetExecutionContext,
        storage: FxStorage,
        pipeline: PipelineConfig,
        training: TrainingConfig,
        fxcache_loader: dg.ResourceParam[DeviceFxCacheLoader],
    ) -> dg.MaterializeResult:
        folds, missing = [], []
        for pk in training_partitions.get_partition_keys(dynamic_partitions_store=context.instance):
            part = parse_partition_key(pk)
            try:
                _, _, out_dir = model_dir(storage, pipeline, training, fxcache_loader, part, n_train)
            except (FileNotFoundError, dg.Failure):  # an input of the fold is not built
                missing.append(shown(part))
                continue
            f = out_dir / "oos.npz"
            if f.is_file():
                folds.append((part, FoldOOS.load(f)))
            else:
                missing.append(shown(part))
        if not folds:
            raise dg.Failure("no trained folds with the current config: materialize trained_model first")
        by_symbol: dict[str, list[FoldOOS]] = {}
        for part, oos in folds:
            by_symbol.setdefault(part.symbol, []).append(oos)
        report_dir = storage.layout.reports_dir()
        meta: dict = {"missing_folds": ", ".join(missing) or "none"}
        table = []
        for symbol, fl in sorted(by_symbol.items()):
            wf = stitch(fl)
            summary = wf.summary()
            bounds = [(int(f.ts[0]), f.name) for f in wf.folds if f.ts.size]
            png = equity_png(wf.ts, wf.returns, f"{symbol} walk-forward out-of-sample", bounds)
            atomic_write_bytes(report_dir / f"{symbol}_walk_forward.png", png)
            for f in wf.folds:
                table.append(
                    {
                        "symbol": symbol,
                        "fold": f.name,
                        "bars": int(f.returns.size),
                        "gross_sharpe": round(float(M.sharpe_daily(f.gross_returns, f.sessions)), 3),
                        "net_sharpe": round(float(M.sharpe_daily(f.returns, f.sessions)), 3),
                        "gross_total_log_return": round(float(f.gross_returns.sum()), 5),
                        "net_total_log_return": round(float(f.returns.sum()), 5),
                        "total_return": round(float(np.expm1(f.returns.sum())), 5),
                        "turnover": round(float(M.turnover(f.positions)), 4),
                        "max_drawdown": round(float(M.max_drawdown(f.returns)), 4),
                    }
                )
            meta[f"{symbol}_equity"] = png_markdown(png, f"{symbol} walk-forward")
            meta[f"{symbol}_sharpe"] = round(summary["sharpe"], 3)
            meta[f"{symbol}_gross_sharpe"] = round(summary["gross_sharpe"], 3)
            meta[f"{symbol}_net_sharpe"] = round(summary["net_sharpe"], 3)
            meta[f"{symbol}_gross_total_log_return"] = round(summary["gross_total_log_return"], 5)
            meta[f"{symbol}_net_total_log_return"] = round(summary["net_total_log_return"], 5)
            meta[f"{symbol}_turnover"] = round(summary["turnover"], 4)
            meta[f"{symbol}_max_drawdown"] = round(summary["max_drawdown"], 4)
            meta[f"{symbol}_total_log_return"] = round(summary["total_log_return"], 5)
            meta[f"{symbol}_total_return"] = round(summary["total_return"], 5)
        atomic_write_text(report_dir / "walk_forward.json", json.dumps({"folds": table}, indent=2))
        meta["folds"] = dg.MetadataValue.md(_rows_markdown(table))
        meta["path"] = dg.MetadataValue.path(str(report_dir))
        context.log.info(f"walk-forward report: {len(table)} fold(s), missing: {meta['missing_folds']}")
        return dg.MaterializeResult(metadata=meta)

    return fold_ranges, trained_model, walk_forward_report


def _snapshot_outputs(out_dir: Any, fold: Any, result: Any, val_ts: np.ndarray, cfg: Any) -> dict[str, Any]:
    """A snapshot fold's label metadata and its validation predictions: ``val_predictions.npz``
    in the model directory (``ts``: ts_recv per validation row; ``score``: the model's score,
    P(up) for the binary MLP, ``(1 + P(up) - P(down)) / 2`` for the three-class MLP
    (``snapshot_zero='three_class'``), which then also stores ``proba``: ``[n, 3]`` P(up),
    P(stationary), P(down); ``classes_h<h>``: the label class +1 / -1 / 0 / NaN of every
    horizon), and the AUC of the score at each of those horizons: up against down, the rows of
    class 0 or NaN left out (as the signal report takes it)."""
    from fx_assets.core.fold_stream import StreamedRows  # torch: with the training step only

    extra = dict(fold.extra)
    if "classes" not in extra and isinstance(fold, StreamedRows):
        extra["classes"] = fold.val_classes()  # validation rows only
    meta: dict[str, Any] = {
        "train_horizon": cfg.train_horizon,
        "label_form": cfg.snapshot_form,
        "zero_handling": cfg.snapshot_zero,
        "zero_move_share": round(float(extra.get("zero_move_share", float("nan"))), 6),
        "val_auc": round(float(result.metrics.get("auc", float("nan"))), 6),
    }
    arrays: dict[str, np.ndarray] = {"ts": np.asarray(val_ts, dtype=np.int64)}
    if result.val_scores is not None:
        arrays["score"] = np.asarray(result.val_scores, dtype=np.float64)
        n_val = arrays["score"].shape[0]
        if getattr(result, "val_proba", None) is not None:
            arrays["proba"] = np.asarray(result.val_proba, dtype=np.float64)
            meta["score"] = "(1 + P(up) - P(down)) / 2 of the 3-class softmax"
        for h, cls in sorted(extra.get("classes", {}).items()):
            c = cls[-n_val:].double().cpu().numpy()  # the fold's rows end with its validation rows
            arrays[f"classes_h{h}"] = c
            meta[f"val_auc_h{h}"] = round(M.auc_returns(arrays["score"], c), 6)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    path = out_dir / "val_predictions.npz"
    atomic_write_bytes(path, buf.getvalue())
    meta["val_predictions"] = dg.MetadataValue.path(str(path))
    return meta


def _bar_outputs(out_dir: Any, result: Any, val_ts: np.ndarray) -> dict[str, Any]:
    """A bar fold's validation predictions, ``val_predictions.npz`` in the model directory (``ts``:
    the bar's timestamp per validation row; ``score``: the model's score, P(up) for the MLP,
    Q(long) - Q(short) for the DQN), which ``signal_report`` shows beside its baselines."""
    if result.val_scores is None:
        return {}
    arrays = {
        "ts": np.asarray(val_ts, dtype=np.int64),
        "score": np.asarray(result.val_scores, dtype=np.float64),
    }
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    path = out_dir / "val_predictions.npz"
    atomic_write_bytes(path, buf.getvalue())
    return {"val_predictions": dg.MetadataValue.path(str(path))}


def _fold_row(label: str, fr: FoldRange, metrics: dict, transition_ms: float, mkey: str, action: str) -> dict:
    return {
        "fold": label,
        "action": action,
        "train_bars": fr.n_train,
        "val_bars": fr.n_val,
        "sharpe": round(metrics.get("sharpe", float("nan")), 3),
        "gross_sharpe": round(metrics.get("gross_sharpe", float("nan")), 3),
        "net_sharpe": round(metrics.get("net_sharpe", float("nan")), 3),
        "max_drawdown": round(metrics.get("max_drawdown", float("nan")), 4),
        "hit_rate": round(metrics.get("hit_rate", float("nan")), 4),
        "turnover": round(metrics.get("turnover", float("nan")), 4),
        "auc": round(metrics.get("auc", float("nan")), 4),
        "auc_null_z": round(metrics.get("auc_null_z", float("nan")), 2),
        "transition_ms": round(transition_ms, 2),
        "model_key": mkey[:16],
    }


def _rows_markdown(rows: list[dict]) -> str:
    """A markdown table; a ``|`` inside a cell is escaped so that it cannot shift the columns."""
    if not rows:
        return "(none)"
    cols = list(rows[0].keys())

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


__all__ = ["GPU_TAGS", "make_training_assets"]
