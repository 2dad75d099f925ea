"""Dagster resources: data-root storage and the device-resident feature store."""

from fx_assets.resources.storage import FxStorage

__all__ = ["FxStorage"]
