"""``FxStorage``: the data root as a Dagster resource (paths of raw and derived files)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg

from fx_assets.core.configmodel import ValidatedCopy
from fx_assets.core.paths import DataLayout


class FxStorage(ValidatedCopy, dg.ConfigurableResource):
    """Where raw DBN files are read and derived files are written."""

    root: str

    @property
    def layout(self) -> DataLayout:
        return DataLayout(Path(self.root).expanduser().resolve())

    def raw_file(self, schema: str, symbol: str, quarter: dt.date) -> Path:
        return self.layout.raw_file(schema, symbol, quarter)
