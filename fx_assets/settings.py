"""Project settings: where the data lives, which symbols and quarters the code location serves.

One code location serves the demo, the tests and production; what differs comes from the
environment or from a TOML file:

- ``FX_CONFIG``: path of a TOML file with a ``[project]`` table holding any of the keys below
  (``data_root``, ``symbols``, ``first_quarter``, ``last_quarter``). Relative ``data_root``
  values are resolved against the TOML file's folder.
- ``FX_DATA_ROOT`` (default ``./data``), ``FX_SYMBOLS`` (comma-separated, default ``ES.FUT``),
  ``FX_FIRST_QUARTER`` (e.g. ``2024-Q1``), ``FX_LAST_QUARTER`` (optional fixed end, e.g. ``2024-Q4``
  for a closed data set; without it — the default — the quarter dimension runs up to the last
  complete quarter and grows with the clock, and a quarter is built once its raw files are
  observed), ``FX_TRAIN_QUARTERS`` (rolling
  training window of a walk-forward fold, default 2). Environment variables win
  over the TOML file.

This module imports no Dagster: the CLI and the tests use it too.
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fx_assets.core.calendar import parse_quarter, quarter_label

DEFAULT_FIRST_QUARTER = "2024-Q1"


class ProjectSettings(BaseModel):
    """Where the data lives and which partitions exist."""

    model_config = ConfigDict(frozen=True)

    data_root: Path = Field(Path("data"), description="Root of raw/ and derived/ data (path).")
    symbols: tuple[str, ...] = Field(("ES.FUT",), description="Parent symbols (static partition dimension).")
    first_quarter: dt.date = Field(
        parse_quarter(DEFAULT_FIRST_QUARTER), description="First quarter of the time dimension."
    )
    last_quarter: dt.date | None = Field(
        None, description="Last quarter (inclusive); None = up to the last complete quarter."
    )
    train_quarters: int = Field(
        2,
        ge=1,
        le=12,
        description="Rolling training window of a fold, in quarters before its validation quarter. "
        "Fixed per deployment: it shapes the partition mapping of the training assets.",
    )

    @field_validator("symbols")
    @classmethod
    def _check_symbols(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one symbol is required")
        for s in v:
            # Dagster static partition keys may not contain these characters.
            if not s or any(c in s for c in "|[],/ "):
                raise ValueError(f"symbol {s!r} is not a valid partition key")
        return v

    @property
    def first_quarter_label(self) -> str:
        return quarter_label(self.first_quarter)

    @property
    def last_quarter_label(self) -> str | None:
        return quarter_label(self.last_quarter) if self.last_quarter else None


def _parse_symbols(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def load_settings(env: dict[str, str] | None = None) -> ProjectSettings:
    """Settings from ``FX_CONFIG`` (TOML) overlaid with ``FX_*`` environment variables."""
    env = dict(os.environ if env is None else env)
    values: dict[str, object] = {}
    cfg_path = env.get("FX_CONFIG")
    if cfg_path:
        path = Path(cfg_path)
        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ValueError(f"FX_CONFIG points to {path}, which does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"FX_CONFIG file {path} is not valid TOML: {exc}") from exc
        project = doc.get("project", {})
        unknown = set(project) - {"data_root", "symbols", "first_quarter", "last_quarter", "train_quarters"}
        if unknown:
            raise ValueError(f"{path}: unknown keys in [project]: {sorted(unknown)}")
        if "data_root" in project:
            root = Path(project["data_root"])
            values["data_root"] = root if root.is_absolute() else (path.parent / root)
        if "symbols" in project:
            sym = project["symbols"]
            values["symbols"] = _parse_symbols(sym) if isinstance(sym, str) else tuple(sym)
        for key in ("first_quarter", "last_quarter"):
            if key in project:
                values[key] = parse_quarter(str(project[key]))
        if "train_quarters" in project:
            values["train_quarters"] = int(project["train_quarters"])
    if env.get("FX_DATA_ROOT"):
        values["data_root"] = Path(env["FX_DATA_ROOT"])
    if env.get("FX_SYMBOLS"):
        values["symbols"] = _parse_symbols(env["FX_SYMBOLS"])
    if env.get("FX_FIRST_QUARTER"):
        values["first_quarter"] = parse_quarter(env["FX_FIRST_QUARTER"])
    if env.get("FX_LAST_QUARTER"):
        values["last_quarter"] = parse_quarter(env["FX_LAST_QUARTER"])
    if env.get("FX_TRAIN_QUARTERS"):
        try:
            values["train_quarters"] = int(env["FX_TRAIN_QUARTERS"])
        except ValueError as exc:
            raise ValueError(
                f"FX_TRAIN_QUARTERS must be an integer, got {env['FX_TRAIN_QUARTERS']!r}"
            ) from exc
    settings = ProjectSettings.model_validate(values)
    if settings.last_quarter and settings.last_quarter < settings.first_quarter:
        raise ValueError(
            f"last quarter {settings.last_quarter_label} is before first quarter {settings.first_quarter_label}"
        )
    return settings
