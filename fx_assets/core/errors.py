"""Error types of the core layer. Messages always name the file, partition, column or bar."""

from __future__ import annotations


class FxDataError(ValueError):
    """Bad or inconsistent input data (corrupt file, wrong schema, invalid values)."""


class FxCacheError(FxDataError):
    """A derived cache file failed validation on load (stale, truncated, wrong format)."""
