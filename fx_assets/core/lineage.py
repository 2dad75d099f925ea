"""Cache keys of every derived stage, chained from the stage configs, the raw sources and the code.

Owns *which* configs, sources, upstream files and versions shape each stage (DESIGN.md §5.3).
A stage's key covers exactly what its computation reads: its own config, the identities of the
raw files it opens itself, and the keys of the stage files it opens (each of which covers its
own inputs in turn), plus its format version and its code version (derived from the code by
:mod:`fx_assets.core.codeversion`). So the key of ``fxcache[2024-Q3]`` changes when any field of
the bars, bar-feature, OFI or fxcache config changes, when any raw file reached through the
warm-up is replaced, or when the code of any stage upstream changes.
:mod:`fx_assets.core.cachekey` does the hashing; this module only decides the inputs.

Warm-up reach is planned here, once, for the key and the computation alike:
:func:`bar_features_warmup` walks back over the previous quarters until their bars hold the
``max_window`` bars the features need (further than one quarter when a previous quarter is
short), and :func:`ofi_warmup_quarter` names the previous quarter OFI replays (when it has both
raw files). The assets load exactly the quarters these functions return.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from fx_assets.core import codeversion
from fx_assets.core import fxcache as fxcache_format
from fx_assets.core.bar_features import BarFeatureConfig, max_window
from fx_assets.core.bars import BarConfig
from fx_assets.core.cachekey import SourceIdentity, cache_key, canonical_value, qualified_name
from fx_assets.core.calendar import previous_quarter
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.ofi import OfiConfig
from fx_assets.core.snapshot_features import SnapshotFeatureConfig

#: Arrow table format of roll calendar, bars and feature files (bumped with their layout).
TABLE_FORMAT_VERSION = 1
#: Layout of a fold's JSON index ranges and of a model directory (bumped with their layout).
TRAINING_FORMAT_VERSION = 1


def code_version(stage: str) -> str:
    """The stage's code version, derived from its code (also its Dagster ``code_version``)."""
    return codeversion.stage_version(stage)


RowUnit = Literal["bar", "snapshot"]


class FxCacheConfig(ConfigModel):
    """How the per-quarter fxcache file is written, and what one of its rows is."""

    dtype: Literal["f32", "bf16", "f64"] = Field(
        "f32",
        description="Value type of the cache's feature block: f32, bf16 or f64 (bf16 halves the "
        "upload but keeps only ~3 significant digits; prices are always in the f64 price block).",
    )
    row_unit: RowUnit = Field(
        "bar",
        description="What one row is: 'bar' (one row per bar: bar features, OFI, bar prices; "
        "core.bar_rows) or 'snapshot' (one row per MBP-10 update of the active contract: snapshot "
        "features and the last closed bar's features, exact mid; core.snapshot_rows).",
    )


SourceLookup = Callable[[str, dt.date], SourceIdentity | None]
"""(schema, quarter) -> identity of the raw file, or None when the quarter has no file."""

BarCount = Callable[[dt.date], int]
"""quarter -> number of bars in that quarter's bars file (built with the same configs)."""


@dataclass(frozen=True)
class StageConfigs:
    """The configs of the feature stages (training configs are keyed separately)."""

    bars: BarConfig
    bar_features: BarFeatureConfig
    ofi: OfiConfig
    fxcache: FxCacheConfig
    #: The snapshot feature stack (used when ``fxcache.row_unit`` is ``snapshot``; always in the
    #: fxcache key, so no row unit can reach a file built with other snapshot parameters).
    snapshot: SnapshotFeatureConfig = field(default_factory=SnapshotFeatureConfig)


# --- warm-up plans (shared by the keys and the stages) ----------------------------------------


def bar_features_warmup(
    cfg: StageConfigs, lookup: SourceLookup, bar_count: BarCount, quarter: dt.date
) -> tuple[dt.date, ...]:
    """The earlier quarters whose bars warm up ``quarter``'s bar features, oldest first: walking
    back until they hold ``max_window`` bars or a quarter has no raw trades."""
    need = max_window(cfg.bar_features)
    out: list[dt.date] = []
    have = 0
    q = quarter
    while have < need:
        q = previous_quarter(q)
        if lookup("trades", q) is None:
            break
        out.insert(0, q)
        have += bar_count(q)
    return tuple(out)


def ofi_warmup_quarter(lookup: SourceLookup, quarter: dt.date) -> dt.date | None:
    """The quarter OFI replays the tail of before ``quarter``: the previous one when it has
    both trades and MBP-10 raw files, else none."""
    q = previous_quarter(quarter)
    if lookup("trades", q) is None or lookup("mbp-10", q) is None:
        return None
    return q


# --- keys -------------------------------------------------------------------------------------


def _present(lookup: SourceLookup, pairs: Sequence[tuple[str, dt.date]]) -> list[SourceIdentity]:
    return [i for i in (lookup(schema, q) for schema, q in pairs) if i is not None]


def _key(
    stage: str,
    configs: Sequence[BaseModel],
    sources: list[SourceIdentity],
    inputs: Sequence[str],
    fmt: int,
    extras: Mapping[str, Any] | None = None,
) -> str:
    return cache_key(
        configs=configs,
        sources=sources,
        inputs=inputs,
        extras=extras,
        format_version=fmt,
        code_version=f"{stage}={code_version(stage)}",
    ).hex()


def roll_calendar_key(lookup: SourceLookup, quarter: dt.date) -> str:
    """Reads the trades of the quarter and of the previous one (its last session seeds it)."""
    pq = previous_quarter(quarter)
    return _key(
        "roll_calendar", [], _present(lookup, [("trades", pq), ("trades", quarter)]), [], TABLE_FORMAT_VERSION
    )


def bars_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date) -> str:
    """Reads the quarter's roll calendar and trades."""
    return _key(
        "bars",
        [cfg.bars],
        _present(lookup, [("trades", quarter)]),
        [roll_calendar_key(lookup, quarter)],
        TABLE_FORMAT_VERSION,
    )


def bar_features_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date, bar_count: BarCount) -> str:
    """Reads the quarter's bars and those of its warm-up quarters (:func:`bar_features_warmup`)."""
    warm = bar_features_warmup(cfg, lookup, bar_count, quarter)
    return _key(
        "bar_features",
        [cfg.bar_features],
        [],
        [bars_key(cfg, lookup, q) for q in (*warm, quarter)],
        TABLE_FORMAT_VERSION,
    )


def ofi_features_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date) -> str:
    """Reads the quarter's bars, roll calendar, trades and book, and the same of the quarter
    :func:`ofi_warmup_quarter` names."""
    prev = ofi_warmup_quarter(lookup, quarter)
    quarters = (quarter,) if prev is None else (prev, quarter)
    return _key(
        "ofi_features",
        [cfg.ofi],
        _present(lookup, [(schema, q) for q in quarters for schema in ("trades", "mbp-10")]),
        [k for q in quarters for k in (roll_calendar_key(lookup, q), bars_key(cfg, lookup, q))],
        TABLE_FORMAT_VERSION,
    )


def fxcache_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date, bar_count: BarCount) -> str:
    """Reads the quarter's bars, bar features, OFI features (bar rows), roll calendar and book.
    The row unit is a field of ``cfg.fxcache`` and the snapshot stack's config is always keyed,
    so every downstream key (folds, models: they chain this key) covers both by construction."""
    return _key(
        "fxcache",
        [cfg.fxcache, cfg.snapshot],
        _present(lookup, [("mbp-10", quarter)]),
        [
            roll_calendar_key(lookup, quarter),
            bars_key(cfg, lookup, quarter),
            bar_features_key(cfg, lookup, quarter, bar_count),
            ofi_features_key(cfg, lookup, quarter),
        ],
        fxcache_format.FORMAT_VERSION,
    )


def fold_ranges_key(fxcache_keys: Sequence[str], folds_cfg: BaseModel, label_horizon: int) -> str:
    """Key of a fold's index ranges: the fxcache files of its quarters (in order), the fold
    config and the purge the trainer's labels need (``TrainConfig.purge_bars``)."""
    return _key(
        "fold_ranges",
        [folds_cfg],
        [],
        list(fxcache_keys),
        TRAINING_FORMAT_VERSION,
        {"label_horizon": int(label_horizon)},
    )


def resource_settings(resource: BaseModel, exclude: Collection[str] = ()) -> dict[str, Any]:
    """Every field of a resource / loader model except ``exclude`` (which must name fields), in
    canonical form: what a key records of the resource."""
    fields = type(resource).model_fields
    unknown = sorted(set(exclude) - set(fields))
    if unknown:
        raise ValueError(f"{qualified_name(type(resource))}: excluded fields {unknown} do not exist")
    return {
        "resource": qualified_name(type(resource)),
        "fields": {n: canonical_value(getattr(resource, n)) for n in fields if n not in exclude},
    }


def trained_model_key(
    fxcache_keys: Sequence[str],
    folds_cfg: BaseModel,
    train_cfg: BaseModel,
    loader: Mapping[str, Any],
    label_horizon: int,
) -> str:
    """Key of a trained fold model: its inputs' keys, every fold and trainer parameter and the
    settings of the loader that put the data on the device (``loader``: see
    ``resources.training.DeviceFxCacheLoader.key_settings``); ``label_horizon`` as for
    :func:`fold_ranges_key`."""
    return _key(
        "trained_model",
        [folds_cfg, train_cfg],
        [],
        [fold_ranges_key(fxcache_keys, folds_cfg, label_horizon), *fxcache_keys],
        TRAINING_FORMAT_VERSION,
        {"loader": dict(loader)},
    )


def signal_report_key(
    fold_key: str, fxcache_keys: Sequence[str], configs: Sequence[BaseModel], model_key: str | None = None
) -> str:
    """Key of one fold's signal report: the fold's ranges (``fold_ranges_key``), its fxcache
    files (their row unit and stack are in their keys), the report's configs (labels, GBT,
    bootstrap) and the key of the fold's trained model shown beside them (``trained_model_key``;
    None: no trained model, the key of a report without one)."""
    inputs = [fold_key, *fxcache_keys] + ([f"trained_model={model_key}"] if model_key else [])
    return _key("signal_report", list(configs), [], inputs, TRAINING_FORMAT_VERSION)


def signal_report_stitched_key(fold_report_keys: Sequence[str], configs: Sequence[BaseModel]) -> str:
    """Key of the stitched report: the per-fold report keys it concatenates, in order."""
    return _key("signal_report_stitched", list(configs), [], list(fold_report_keys), TRAINING_FORMAT_VERSION)
