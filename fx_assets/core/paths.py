"""The data-root layout: where raw files are expected and where each derived file goes.

Raw input keeps the layout Databento users already have::

    raw/trades/ES.FUT/ES.FUT_2024-Q1.dbn.zst
    raw/mbp-10/ES.FUT/ES.FUT_2024-Q1.dbn.zst

Derived files live under ``derived/<stage>/<symbol>/`` and carry their cache key in the file
name, so runs with different parameters coexist and never overwrite each other.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from fx_assets.core.calendar import quarter_label

RAW_SCHEMAS = ("trades", "mbp-10")


@dataclass(frozen=True)
class DataLayout:
    root: Path

    def raw_file(self, schema: str, symbol: str, quarter: dt.date) -> Path:
        if schema not in RAW_SCHEMAS:
            raise ValueError(f"unknown raw schema {schema!r}; expected one of {RAW_SCHEMAS}")
        return self.root / "raw" / schema / symbol / f"{symbol}_{quarter_label(quarter)}.dbn.zst"

    def sidecar_dir(self, schema: str, symbol: str) -> Path:
        return self.root / "derived" / "predecoded" / schema / symbol

    def stage_dir(self, stage: str, symbol: str) -> Path:
        return self.root / "derived" / stage / symbol

    def stage_file(self, stage: str, symbol: str, quarter: dt.date, key_hex: str, suffix: str) -> Path:
        """``derived/<stage>/<symbol>/<symbol>_<2024-Q1>.<key16>.<suffix>``."""
        return self.stage_dir(stage, symbol) / f"{symbol}_{quarter_label(quarter)}.{key_hex[:16]}.{suffix}"

    def models_dir(self, symbol: str, quarter: dt.date, key_hex: str) -> Path:
        return self.root / "models" / symbol / f"{quarter_label(quarter)}.{key_hex[:16]}"

    def reports_dir(self) -> Path:
        return self.root / "reports"
