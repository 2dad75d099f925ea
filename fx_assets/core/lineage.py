"""Cache keys of every derived stage, chained from the stage configs and the raw sources.

Owns *which* configs, sources and versions shape each stage, so that the key of a stage
covers everything upstream of it (DESIGN.md §5.3): the key of ``fxcache[2024-Q3]`` changes when
any field of the bars, bar-feature, OFI or fxcache config changes, when any raw file it was
built from (including the warm-up quarters) is replaced, or when a format or code version
is bumped. :mod:`fx_assets.core.cachekey` does the hashing; this module only decides the
inputs.

Warm-up reach: a quarter's bar features and OFI start from the previous quarter's bars, which
in turn depend on that quarter's roll calendar (which looks one more quarter back), so the
feature stages list the raw files of the current and the two previous quarters.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import fx_assets
from fx_assets.core import fxcache as fxcache_format
from fx_assets.core.bar_features import BarFeatureConfig
from fx_assets.core.bars import BarConfig
from fx_assets.core.cachekey import SourceIdentity, cache_key
from fx_assets.core.calendar import previous_quarter
from fx_assets.core.ofi import OfiConfig

#: Bump a stage's code version when its output changes for the same inputs and config.
CODE_VERSIONS: dict[str, str] = {
    "roll_calendar": "1",
    "bars": "1",
    "bar_features": "1",
    "ofi_features": "1",
    "fxcache": "1",
    "fold_ranges": "1",
    "trained_model": "2",  # 2: MLP no-trade band after costs, gross/net metrics, leak detector
}

#: Arrow table format of roll calendar, bars and feature files (bumped with their layout).
TABLE_FORMAT_VERSION = 1


class FxCacheConfig(BaseModel):
    """How the per-quarter fxcache file is written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["f32", "bf16", "f64"] = Field(
        "f32",
        description="Value type of the cache: f32, bf16 or f64 (bf16 halves the upload but keeps "
        "only ~3 significant digits, so prices come from f32/f64 caches).",
    )


SourceLookup = Callable[[str, dt.date], SourceIdentity | None]
"""(schema, quarter) -> identity of the raw file, or None when the quarter has no file."""


@dataclass(frozen=True)
class StageConfigs:
    """The configs of the feature stages (training configs are keyed separately)."""

    bars: BarConfig
    bar_features: BarFeatureConfig
    ofi: OfiConfig
    fxcache: FxCacheConfig


def _code(*stages: str) -> str:
    return f"fx_assets-{fx_assets.__version__}|" + "|".join(f"{s}={CODE_VERSIONS[s]}" for s in stages)


def _sources(lookup: SourceLookup, schema: str, quarter: dt.date, back: int) -> list[SourceIdentity]:
    """Identities of ``schema`` files of ``quarter`` and ``back`` quarters before it (present ones)."""
    out: list[SourceIdentity] = []
    q = quarter
    quarters = [q]
    for _ in range(back):
        q = previous_quarter(q)
        quarters.append(q)
    for q in reversed(quarters):
        ident = lookup(schema, q)
        if ident is not None:
            out.append(ident)
    return out


def _key(configs: Sequence[BaseModel], sources: list[SourceIdentity], fmt: int, *stages: str) -> str:
    return cache_key(configs=configs, sources=sources, format_version=fmt, code_version=_code(*stages)).hex()


def roll_calendar_key(lookup: SourceLookup, quarter: dt.date) -> str:
    return _key([], _sources(lookup, "trades", quarter, 1), TABLE_FORMAT_VERSION, "roll_calendar")


def bars_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date) -> str:
    return _key(
        [cfg.bars], _sources(lookup, "trades", quarter, 1), TABLE_FORMAT_VERSION, "roll_calendar", "bars"
    )


def bar_features_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date) -> str:
    return _key(
        [cfg.bars, cfg.bar_features],
        _sources(lookup, "trades", quarter, 2),
        TABLE_FORMAT_VERSION,
        "roll_calendar",
        "bars",
        "bar_features",
    )


def ofi_features_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date) -> str:
    return _key(
        [cfg.bars, cfg.ofi],
        _sources(lookup, "trades", quarter, 2) + _sources(lookup, "mbp-10", quarter, 1),
        TABLE_FORMAT_VERSION,
        "roll_calendar",
        "bars",
        "ofi_features",
    )


def fxcache_key(cfg: StageConfigs, lookup: SourceLookup, quarter: dt.date) -> str:
    return _key(
        [cfg.bars, cfg.bar_features, cfg.ofi, cfg.fxcache],
        _sources(lookup, "trades", quarter, 2) + _sources(lookup, "mbp-10", quarter, 1),
        fxcache_format.FORMAT_VERSION,
        "roll_calendar",
        "bars",
        "bar_features",
        "ofi_features",
        "fxcache",
    )


def fold_ranges_key(fxcache_keys: Sequence[str], folds_cfg: BaseModel) -> str:
    """Key of a fold's index ranges: the fxcache files of its quarters (in order) and the fold config."""
    return cache_key(
        configs=[folds_cfg],
        sources=[],
        format_version=TABLE_FORMAT_VERSION,
        code_version=_code("fold_ranges") + "|" + ",".join(fxcache_keys),
    ).hex()


def trained_model_key(fxcache_keys: Sequence[str], folds_cfg: BaseModel, train_cfg: BaseModel) -> str:
    """Key of a trained fold model: its inputs' keys and every fold and trainer parameter."""
    return cache_key(
        configs=[folds_cfg, train_cfg],
        sources=[],
        format_version=TABLE_FORMAT_VERSION,
        code_version=_code("fold_ranges", "trained_model") + "|" + ",".join(fxcache_keys),
    ).hex()
