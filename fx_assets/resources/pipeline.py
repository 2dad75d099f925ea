"""``PipelineConfig``: the parameters of every derived stage, as one Dagster resource.

Each stage's parameters are a core pydantic model (documented fields with units) made into a
Dagster ``Config`` by inheritance, so the launchpad shows and validates them. They live in one
resource rather than in per-asset op config because a stage's output path (its cache key)
depends on the configs of every stage upstream of it: ``ofi_features`` must know the bar
parameters its bars were built with. Override any field at launch::

    resources:
      pipeline:
        config:
          bars: {volume_bar_size: 200}
          fxcache: {row_unit: snapshot}   # one row per MBP-10 update instead of per bar
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from fx_assets.core.bar_features import BarFeatureConfig
from fx_assets.core.bars import BarConfig
from fx_assets.core.configmodel import ValidatedCopy
from fx_assets.core.lineage import FxCacheConfig, StageConfigs
from fx_assets.core.ofi import OfiConfig
from fx_assets.core.snapshot_features import SnapshotFeatureConfig


class BarsConfig(dg.Config, BarConfig):
    """Bar formation (volume, dollar or imbalance bars of the active contract)."""


class BarFeaturesConfig(dg.Config, BarFeatureConfig):
    """Bar-level technical features (windows in bars)."""


class OfiFeaturesConfig(dg.Config, OfiConfig):
    """Order-flow and book features per bar."""


class FxCacheWriteConfig(dg.Config, FxCacheConfig):
    """fxcache file layout and row unit (``row_unit``: bar or snapshot)."""


class SnapshotFeaturesConfig(dg.Config, SnapshotFeatureConfig):
    """Snapshot feature stack (windows in updates / trades), for ``fxcache.row_unit: snapshot``."""


#: Fields that change no output, so no key holds them (the key completeness test checks that
#: every other field reaches the fxcache key): the bar-density warning's target.
PIPELINE_KEY_EXCLUDED = frozenset({"bars_target_per_session"})


class PipelineConfig(ValidatedCopy, dg.ConfigurableResource):
    """Parameters of the feature stages; every field is part of the downstream cache keys."""

    bars: BarsConfig = Field(default_factory=BarsConfig, description="Bar formation.")
    bar_features: BarFeaturesConfig = Field(default_factory=BarFeaturesConfig, description="Bar features.")
    ofi: OfiFeaturesConfig = Field(default_factory=OfiFeaturesConfig, description="OFI / book features.")
    fxcache: FxCacheWriteConfig = Field(
        default_factory=FxCacheWriteConfig, description="fxcache layout and row unit (bar | snapshot)."
    )
    snapshot: SnapshotFeaturesConfig = Field(
        default_factory=SnapshotFeaturesConfig,
        description="Snapshot features (one row per MBP-10 update), used when fxcache.row_unit is snapshot.",
    )
    bars_target_per_session: int | None = Field(
        default=None,
        description="Expected bars per session; a warning is logged when a quarter drifts more "
        "than ±50% from it (useful with imbalance bars). Does not change any output.",
    )

    def stage_configs(self) -> StageConfigs:
        """The core models (not the Dagster subclasses, whose class names would otherwise enter
        the cache keys and make the CLI and Dagster disagree)."""
        return StageConfigs(
            bars=BarConfig.model_validate(self.bars.model_dump()),
            bar_features=BarFeatureConfig.model_validate(self.bar_features.model_dump()),
            ofi=OfiConfig.model_validate(self.ofi.model_dump()),
            fxcache=FxCacheConfig.model_validate(self.fxcache.model_dump()),
            snapshot=SnapshotFeatureConfig.model_validate(self.snapshot.model_dump()),
        )
