"""``ResearchConfig``: the parameters of the ``signal_report`` assets, as one Dagster resource.

Each field is a core pydantic model made into a Dagster ``Config`` by inheritance (as in
``resources.pipeline``), so the launchpad shows and validates them; every field enters the
report's cache key (``lineage.signal_report_key``). Override at launch::

    resources:
      research:
        config:
          labels: {snapshot_horizons: [10, 20, 50, 100, 500], bar_horizons: [1, 2, 5, 10, 30]}
          gbt: {sample_rows: 100000, stride: 20}
          report: {n_boot: 200}
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from fx_assets.core.configmodel import ValidatedCopy
from fx_assets.core.signal_inputs import SignalLabelConfig
from fx_assets.core.signal_report import SignalReportConfig
from fx_assets.core.trainers.gbt import GbtConfig


class SignalLabelsConfig(dg.Config, SignalLabelConfig):
    """Label horizons per row unit (snapshot: updates ahead; bar: bars ahead, entry lag)."""


class GbtBaselineConfig(dg.Config, GbtConfig):
    """LightGBM baseline (one model per horizon, trained on a strided sample of the training rows)."""


class SignalReportSettings(dg.Config, SignalReportConfig):
    """Bootstrap, regime bins and empirical-null band of the report."""


class ResearchConfig(ValidatedCopy, dg.ConfigurableResource):
    """Parameters of the signal report; every field is part of its cache key."""

    labels: SignalLabelsConfig = Field(default_factory=SignalLabelsConfig, description="Label horizons.")
    gbt: GbtBaselineConfig = Field(default_factory=GbtBaselineConfig, description="LightGBM baseline.")
    report: SignalReportSettings = Field(
        default_factory=SignalReportSettings, description="Bootstrap intervals, regime quintiles, null band."
    )

    def core_configs(self) -> tuple[SignalLabelConfig, GbtConfig, SignalReportConfig]:
        """The core models (not the Dagster subclasses, whose names would enter the keys)."""
        return (
            SignalLabelConfig.model_validate(self.labels.model_dump()),
            GbtConfig.model_validate(self.gbt.model_dump()),
            SignalReportConfig.model_validate(self.report.model_dump()),
        )
