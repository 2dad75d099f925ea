"""Research assets: ``signal_report`` (per validation quarter × symbol, like the folds) and the
unpartitioned ``signal_report_stitched``.

``signal_report[2024-Q3|ES.FUT]`` reads the fold's fxcache files (the configured row unit) and
its ``fold_ranges``, derives labels per horizon and regime variables, fits the LightGBM baseline
on a sample of the training rows and reports out-of-sample AUC / accuracy of it, of the
level-1-imbalance baseline and of the fold's ``trained_model`` (:mod:`fx_assets.core.signal_inputs`,
:mod:`fx_assets.core.signal_report`); a three-class MLP's class probabilities (``proba`` of its
``val_predictions.npz``) add its three-class metrics (metadata ``three_class_by_horizon``, the
model's zero handling in ``trained_model_labels``). Its files (``fold_signal.npz``, ``signal_report.md/.png/
.json``) lie under a keyed folder: the key covers the fold ranges, the fxcache files (so the row
unit and feature stack), the ``research`` resource and the trained model's key.
``signal_report_stitched`` concatenates every fold's validation rows per row unit, for each row
unit whose per-fold reports exist on the same quarters (each row unit is its own
materialization, under its own key): bar beside snapshot. Markdown and the decay PNG are in the
materialization metadata (asset page in the UI).

The trained model is an edge of the asset graph (``trained_model`` -> ``signal_report``, same
partition; not required: a fold without a model is reported without it) and is found the way
``walk_forward_report`` finds it: the model directory of the current configs (``model_dir``,
keyed by the fxcache files, fold and trainer configs and the device loader's settings), used
when its build is complete and it stored ``val_predictions.npz``. Retraining under another key
(any of those inputs changed) moves the report's key, so the report is rebuilt with the model.
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg

from fx_assets.assets.common import StageIO, load_build_metadata, save_build_metadata
from fx_assets.assets.training import fold_file, model_dir, png_markdown, shown
from fx_assets.core import lineage
from fx_assets.core.atomic import atomic_write_text
from fx_assets.core.errors import FxDataError
from fx_assets.partitions import QuarterSymbol, context_partition, parse_partition_key
from fx_assets.resources.pipeline import FxCacheWriteConfig, PipelineConfig
from fx_assets.resources.research import ResearchConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.resources.training import DeviceFxCacheLoader, TrainingConfig

ROW_UNITS = ("bar", "snapshot")
FOLD_FILE = "fold_signal.npz"


def with_row_unit(pipeline: PipelineConfig, row_unit: str) -> PipelineConfig:
    """The same pipeline parameters with another row unit (its keys: that row unit's files)."""
    return PipelineConfig(
        bars=pipeline.bars,
        bar_features=pipeline.bar_features,
        ofi=pipeline.ofi,
        fxcache=FxCacheWriteConfig(**{**pipeline.fxcache.model_dump(), "row_unit": row_unit}),
        snapshot=pipeline.snapshot,
        bars_target_per_session=pipeline.bars_target_per_session,
    )


class FoldModel:
    """The fold's trained model as the report uses it: key, ``val_predictions.npz``, trainer and
    ``labels``: how its snapshot labels treat a zero move (``zero_handling``, the dead band's
    ``stationary_share``; empty for bar rows), shown beside its three-class metrics."""

    def __init__(
        self, key: str, predictions: Path, trainer: str, labels: dict[str, Any] | None = None
    ) -> None:
        self.key, self.predictions, self.trainer = key, predictions, trainer
        self.labels = labels or {}

    @property
    def name(self) -> str:
        return f"trained_{self.trainer}"


def fold_model(
    storage: FxStorage,
    pipeline: PipelineConfig,
    training: TrainingConfig,
    loader: DeviceFxCacheLoader,
    part: QuarterSymbol,
    n_train: int,
) -> FoldModel | None:
    """The fold's trained model for the current configs (the directory ``trained_model`` writes,
    as ``walk_forward_report`` finds it), or None when it is not built, its build is incomplete
    or it stored no validation predictions (a bar fold trained before they were written)."""
    _, mkey, mdir = model_dir(storage, pipeline, training, loader, part, n_train)
    done, preds = mdir / "checkpoint.json", mdir / "val_predictions.npz"
    if not (done.is_file() and preds.is_file()) or load_build_metadata(done) is None:
        return None
    config = json.loads(done.read_text())["config"]
    labels = (
        {
            "zero_handling": config.get("snapshot_zero"),
            "stationary_share": config.get("snapshot_stationary_share"),
            "train_horizon": config.get("train_horizon"),
        }
        if config.get("row_unit") == "snapshot"
        else {}
    )
    return FoldModel(mkey, preds, str(config["trainer"]), labels)


def three_class_by_horizon(rep: Any) -> dict[str, dict[str, dict[str, float]]]:
    """``{"unit|model": {h: {acc3, auc_stationary, auc_macro, share_stationary}}}`` of the models
    with class probabilities (empty when none has them)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (u, m), cs in rep.curves().items():
        if all(c.three_class for c in cs):
            out[f"{u}|{m}"] = {
                str(c.horizon): {
                    k: round(float(getattr(c, k)), 5)
                    for k in ("acc3", "auc_stationary", "auc_macro", "share_stationary")
                }
                for c in cs
            }
    return out


def report_dir(
    storage: FxStorage,
    pipeline: PipelineConfig,
    training: TrainingConfig,
    research: ResearchConfig,
    part: QuarterSymbol,
    n_train: int,
    model: FoldModel | None,
) -> tuple[list[Path], Path, str, Path]:
    """(fxcache paths, fold ranges file, report key, folder) of one fold's report (with ``model``
    beside the baselines)."""
    parts, keys, fkey, fpath = fold_file(storage, pipeline, training, part, n_train)
    key = lineage.signal_report_key(fkey, keys, research.core_configs(), model.key if model else None)
    paths = [StageIO(storage, pipeline, p).path("fxcache") for p in parts]
    folder = storage.layout.reports_dir() / "signal_report" / part.symbol / f"{part.quarter_label}.{key[:16]}"
    return paths, fpath, key, folder


def make_research_assets(
    training_partitions, fxcache, fold_ranges, trained_model, window_mapping, train_quarters: int
) -> tuple:
    n_train = train_quarters

    @dg.asset(
        partitions_def=training_partitions,
        # trained_model: the same fold (identity mapping); not required, the report shows it
        # when it exists (module docstring)
        deps=[dg.AssetDep(fxcache, partition_mapping=window_mapping), fold_ranges, trained_model],
        group_name="research",
        code_version=lineage.code_version("signal_report"),
        kinds={"lightgbm", "matplotlib"},
        description=(
            "Where the signal lives, per fold: out-of-sample AUC / accuracy by label horizon (decay "
            "curve) and by regime quintile (spread, realised volatility, event rate), LightGBM beside "
            "the level-1-imbalance baseline and the fold's trained model (when materialized), "
            "moving-block-bootstrap error bars, empirical-null band."
        ),
    )
    def signal_report(
        context: dg.AssetExecutionContext,
        storage: FxStorage,
        pipeline: PipelineConfig,
        training: TrainingConfig,
        research: ResearchConfig,
        fxcache_loader: dg.ResourceParam[DeviceFxCacheLoader],
    ) -> dg.MaterializeResult:
        from fx_assets.core.folds import FoldRange
        from fx_assets.core.signal_inputs import (
            fold_signal,
            report_inputs,
            trained_predictions,
            trained_probabilities,
        )
        from fx_assets.core.signal_report import signal_report as build_report

        part = context_partition(context)
        model = fold_model(storage, pipeline, training, fxcache_loader, part, n_train)
        paths, fpath, key, folder = report_dir(storage, pipeline, training, research, part, n_train, model)
        md_path = folder / "signal_report.md"
        built = load_build_metadata(md_path) if (folder / FOLD_FILE).is_file() else None
        if built is not None:
            return dg.MaterializeResult(
                metadata={**built, "action": "reused"}, data_version=dg.DataVersion(key[:24])
            )
        if not fpath.is_file():
            raise dg.Failure(
                f"{part.label}: fold ranges not materialized for the current config ({fpath.name})"
            )
        for p, q in zip(paths, fold_file(storage, pipeline, training, part, n_train)[0], strict=True):
            if not p.is_file():
                raise dg.Failure(f"{q.label}: no fxcache file {p.name}; materialize fxcache[{q.label}] first")
        d = json.loads(fpath.read_text())
        fr = FoldRange(**{k: d[k] for k in FoldRange.__dataclass_fields__})
        labels_cfg, gbt_cfg, report_cfg = research.core_configs()
        try:
            sig = fold_signal(paths, fr, labels_cfg, gbt_cfg, tick=pipeline.snapshot.tick_size)
            if model is not None:
                sig = sig.with_model(
                    model.name,
                    trained_predictions(model.predictions, sig.val_ts, model.trainer),
                    trained_probabilities(model.predictions, sig.val_ts),  # None: a binary model
                )
            sig.save(folder / FOLD_FILE)
            preds, units, proba = report_inputs({sig.row_unit: sig})
            rep = build_report(preds, units, report_cfg, probabilities=proba)
        except FxDataError as exc:
            raise dg.Failure(f"{part.label}: {exc}") from exc
        files = rep.write(folder)
        png = files["png"].read_bytes()
        meta: dict[str, Any] = {
            "fold": shown(part),
            "row_unit": sig.row_unit,
            "action": "built",
            "cache_key": key[:16],
            "path": dg.MetadataValue.path(str(folder)),
            "val_rows": fr.n_val,
            "train_rows": fr.n_train,
            "block_rows": rep.block,
            "trained_model": f"{model.name} {model.key[:16]}" if model else "none",
            "decay": png_markdown(png, f"AUC by horizon {shown(part)} ({sig.row_unit})"),
            "report": dg.MetadataValue.md(files["md"].read_text()),
            "gbt": dg.MetadataValue.json(sig.info["gbt"]),
            "auc_by_horizon": dg.MetadataValue.json(
                {
                    f"{u}|{m}": {str(c.horizon): round(c.auc, 5) for c in cs}
                    for (u, m), cs in rep.curves().items()
                }
            ),
        }
        if model is not None and model.labels:
            meta["trained_model_labels"] = dg.MetadataValue.json(model.labels)
        three = three_class_by_horizon(rep)
        if three:
            meta["three_class_by_horizon"] = dg.MetadataValue.json(three)
        save_build_metadata(md_path, meta)  # written last: its presence marks the report complete
        return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(key[:24]))

    @dg.asset(
        deps=[dg.AssetDep(signal_report, partition_mapping=dg.AllPartitionMapping())],
        group_name="research",
        code_version=lineage.code_version("signal_report_stitched"),
        kinds={"matplotlib"},
        description=(
            "Every fold's signal report stitched in time order, per row unit: each row unit (bar, "
            "snapshot) whose per-fold reports exist on the same quarters, side by side."
        ),
    )
    def signal_report_stitched(
        context: dg.AssetExecutionContext,
        storage: FxStorage,
        pipeline: PipelineConfig,
        training: TrainingConfig,
        research: ResearchConfig,
        fxcache_loader: dg.ResourceParam[DeviceFxCacheLoader],
    ) -> dg.MaterializeResult:
        from fx_assets.core.signal_inputs import FoldSignal, report_inputs, stitch_signals
        from fx_assets.core.signal_report import signal_report as build_report

        found: dict[
            str, dict[str, dict[str, tuple[str, Path]]]
        ] = {}  # symbol -> unit -> quarter -> (key, file)
        for unit in ROW_UNITS:
            pl = with_row_unit(pipeline, unit)
            for pk in training_partitions.get_partition_keys(dynamic_partitions_store=context.instance):
                part = parse_partition_key(pk)
                try:
                    model = fold_model(storage, pl, training, fxcache_loader, part, n_train)
                    _, _, key, folder = report_dir(storage, pl, training, research, part, n_train, model)
                except (FileNotFoundError, dg.Failure):  # an input of the fold is not built
                    continue
                if (folder / FOLD_FILE).is_file() and load_build_metadata(folder / "signal_report.md"):
                    found.setdefault(part.symbol, {}).setdefault(unit, {})[part.quarter_label] = (
                        key,
                        folder / FOLD_FILE,
                    )
        if not found:
            raise dg.Failure("no signal_report folds for the current config: materialize signal_report first")
        _, _, report_cfg = research.core_configs()
        meta: dict[str, Any] = {}
        out_keys: list[str] = []
        sections: list[tuple[str, str, list[str], Any]] = []
        for symbol, units in sorted(found.items()):
            common = sorted(set.intersection(*(set(q) for q in units.values())))
            if not common:
                context.log.warning(f"{symbol}: row units {sorted(units)} have no quarter in common")
                continue
            for unit, qs in sorted(units.items()):
                folds = [FoldSignal.load(qs[q][1]) for q in common]
                # a model is stitched where every fold has it (a fold's trained model may be missing)
                keep = set.intersection(*(set(f.predictions) for f in folds))
                dropped = sorted({m for f in folds for m in f.predictions} - keep)
                if dropped:
                    context.log.warning(f"{symbol} {unit}: {dropped} not in every fold, left out")
                sig = stitch_signals([f.without_models(sorted(keep)) for f in folds])
                preds, units_in, proba = report_inputs({unit: sig})
                rep = build_report(preds, units_in, report_cfg, probabilities=proba)
                out_keys += [qs[q][0] for q in common]
                sections.append((symbol, unit, common, rep))
        if not sections:
            raise dg.Failure("no quarter has signal reports of every row unit found")
        key = lineage.signal_report_stitched_key(out_keys, research.core_configs())
        folder = storage.layout.reports_dir() / "signal_report" / f"stitched.{key[:16]}"
        index = ["# Signal report, stitched folds", ""]
        for symbol, unit, common, rep in sections:
            files = rep.write(folder, stem=f"{symbol}_{unit}")
            png = files["png"].read_bytes()
            name = f"{symbol}_{unit}"
            meta[f"{name}_decay"] = png_markdown(png, f"{symbol} {unit} rows: AUC by horizon")
            meta[f"{name}_report"] = dg.MetadataValue.md(files["md"].read_text())
            three = three_class_by_horizon(rep)
            if three:
                meta[f"{name}_three_class_by_horizon"] = dg.MetadataValue.json(three)
            index.append(f"- {symbol}, {unit} rows: quarters {', '.join(common)} ({files['md'].name})")
        atomic_write_text(folder / "index.md", "\n".join(index) + "\n")
        meta = {
            "row_units": ", ".join(sorted({f"{s} {u}" for s, u, _, _ in sections})),
            "quarters": ", ".join(sorted({q for _, _, c, _ in sections for q in c})),
            "cache_key": key[:16],
            "path": dg.MetadataValue.path(str(folder)),
            **meta,
        }
        return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(key[:24]))

    return signal_report, signal_report_stitched


__all__ = ["make_research_assets"]
