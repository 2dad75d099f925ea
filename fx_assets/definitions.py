"""The fx_assets code location: the whole asset graph, its resources, jobs and sensors.

::

    raw_trades ─┐  raw_mbp10 ─┐                      observable sources (.dbn.zst files)
                ▼             ▼
    predecoded_trades    predecoded_mbp10            decode once -> Arrow IPC sidecar
                │             │
                ▼             │
           roll_calendar      │                      active contract per session
                │             │
                ▼             │
              bars ───────────┤                      volume / imbalance bars (active contract)
                │             │
        bar_features     ofi_features                warm-up from the previous quarter
                └──────┬──────┘
                       ▼
                    fxcache                          one flat file per (quarter, symbol)
                       │  (device loader: upload once per run, slice by index per fold)
                       ▼
    fold_ranges ──► trained_model ──► walk_forward_report
         │               ┆ (when built: its validation predictions)
         └──────► signal_report ──► signal_report_stitched   (research: where the signal lives)

Settings (data root, symbols, quarters) come from ``FX_*`` environment variables or the TOML
file ``FX_CONFIG`` points to (see :mod:`fx_assets.settings`). The quarter dimension has no fixed
end: it runs to the last complete quarter, and a quarter becomes buildable once its raw files
are observed (:mod:`fx_assets.sensors`, :mod:`fx_assets.automation`).
"""

from __future__ import annotations

import warnings

import dagster as dg

from fx_assets.assets.checks import make_asset_checks
from fx_assets.assets.download import download_definitions
from fx_assets.assets.features import make_feature_assets
from fx_assets.assets.ingest import make_ingest_assets
from fx_assets.assets.raw import make_raw_assets
from fx_assets.assets.research import make_research_assets
from fx_assets.assets.training import GPU_TAGS, make_training_assets
from fx_assets.automation import automation_sensor, guard_readers
from fx_assets.executors import feature_executor, training_tags
from fx_assets.partitions import (
    fold_window_mapping,
    parse_partition_key,
    quarter_symbol_partitions,
    training_partitions,
)
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.research import ResearchConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.resources.training import DeviceFxCacheLoader, default_training
from fx_assets.sensors import make_sensors
from fx_assets.settings import ProjectSettings, load_settings

# Partition mappings, backfill policies and observable sources are beta in Dagster 1.13; the
# project pins its Dagster version, so the warnings only add noise to every CLI call.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)


#: Tag of build_features runs (dagster.yaml limits them to one per symbol at a time).
FEATURE_SYMBOL_TAG = "fx/features_symbol"

#: The per-partition stages from raw file to fxcache, in order (the ``build_features`` job).
FEATURE_STAGES = (
    "predecoded_trades",
    "predecoded_mbp10",
    "roll_calendar",
    "bars",
    "bar_features",
    "ofi_features",
    "fxcache",
)


def build_definitions(settings: ProjectSettings) -> dg.Definitions:
    partitions = quarter_symbol_partitions(settings)
    raw_trades, raw_mbp10 = make_raw_assets(partitions)
    predecoded_trades, predecoded_mbp10, roll_calendar = make_ingest_assets(partitions, raw_trades, raw_mbp10)
    bars, bar_features, ofi_features, fxcache = make_feature_assets(
        partitions, roll_calendar, predecoded_trades, predecoded_mbp10
    )
    feature_assets = [
        predecoded_trades,
        predecoded_mbp10,
        roll_calendar,
        bars,
        bar_features,
        ofi_features,
        fxcache,
    ]
    assert tuple(a.key.to_user_string() for a in feature_assets) == FEATURE_STAGES
    # Blocking checks of the stage outputs; every job selecting an asset runs its checks too.
    asset_checks = make_asset_checks(
        partitions, predecoded_trades, predecoded_mbp10, bars, bar_features, ofi_features, fxcache
    )

    observe_raw = dg.define_asset_job(
        "observe_raw",
        selection=dg.AssetSelection.assets(raw_trades.key, raw_mbp10.key),
    )
    build_features = dg.define_asset_job(
        "build_features",
        selection=dg.AssetSelection.assets(*feature_assets),
        # Each run is tagged with its symbol, so that dagster.yaml can run one symbol's quarters
        # of a job backfill one at a time, in order (a quarter warms up from the previous one).
        config=dg.PartitionedConfig(
            partitions_def=partitions,
            run_config_for_partition_key_fn=lambda _key: {},
            tags_for_partition_key_fn=lambda key: {FEATURE_SYMBOL_TAG: parse_partition_key(key).symbol},
        ),
        executor_def=feature_executor(),  # FX_EXECUTOR: in_process | multiprocess | dask | k8s
        description="Sidecars -> roll calendar -> bars -> bar and OFI features -> fxcache, per partition.",
    )
    storage = FxStorage(root=str(settings.data_root))
    pipeline = PipelineConfig()
    resources: dict = {
        "storage": storage,
        "pipeline": pipeline,
        "training": default_training(settings.train_quarters),
        "fxcache_loader": DeviceFxCacheLoader(storage=storage, pipeline=pipeline),
        "research": ResearchConfig(),
    }
    assets: list = [raw_trades, raw_mbp10, *feature_assets]
    jobs = [observe_raw, build_features]
    train_parts = training_partitions(settings)
    if train_parts is not None:
        fold_ranges, trained_model, walk_forward_report = make_training_assets(
            train_parts, fxcache, fold_window_mapping(settings.train_quarters), settings.train_quarters
        )
        assets += [fold_ranges, trained_model, walk_forward_report]
        signal_report, signal_report_stitched = make_research_assets(
            train_parts,
            fxcache,
            fold_ranges,
            trained_model,
            fold_window_mapping(settings.train_quarters),
            settings.train_quarters,
        )
        assets += [signal_report, signal_report_stitched]
        # One run trains every selected fold with the in-process executor, so the device loader
        # (and the quarters it uploaded) serve all of them; the tag limits GPU runs to one.
        jobs.append(
            dg.define_asset_job(
                "train_models",
                selection=dg.AssetSelection.assets(fold_ranges, trained_model),
                executor_def=dg.in_process_executor,
                tags=training_tags(GPU_TAGS),
                description="Fold ranges and trained models for the selected validation quarters, in one run.",
            )
        )
        jobs.append(
            dg.define_asset_job(
                "walk_forward",
                selection=dg.AssetSelection.assets(walk_forward_report),
                description="Stitch every trained fold's out-of-sample results.",
            )
        )
        jobs.append(
            dg.define_asset_job(
                "signal_reports",
                selection=dg.AssetSelection.assets(signal_report, signal_report_stitched),
                description="Per-fold signal reports (the configured row unit) and their stitched report.",
            )
        )
    assets = guard_readers(assets)  # no asset is rebuilt while an asset reading it runs
    sensors = [*make_sensors(partitions, settings.symbols, storage), automation_sensor()]
    # Every run executes in one process unless its job says otherwise: a fold backfill (job or
    # asset page) then trains every fold with one device loader, and a partition's stages skip a
    # process start each (seconds per step, more than a stage takes). Partitions run in parallel
    # as separate runs, within dagster.yaml's limits.
    defs = dg.Definitions(
        assets=assets,
        asset_checks=asset_checks,
        jobs=jobs,
        resources=resources,
        sensors=sensors,
        executor=dg.in_process_executor,
    )
    return dg.Definitions.merge(defs, download_definitions())


defs = build_definitions(load_settings())
