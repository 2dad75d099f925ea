"""fx_assets: a Dagster code location from Databento DBN archives to walk-forward models."""

__version__ = "0.1.0"
