"""Synthetic ES-like futures market written as genuine Databento DBN files.

Public API (used by the CLI and the Dagster demo): ``SynthConfig``, ``generate_market``,
``SynthReport``. The model is documented in ``docs/synthetic-market.md``; ``market`` holds the
price/flow/book model, ``nb`` its numba kernels, ``dbn_writer`` the DBN encoding and
``generate`` the driver.
"""

from fx_assets.core.synth.generate import (
    SIGNAL_DESCRIPTION,
    QuarterReport,
    SynthConfig,
    SynthReport,
    generate_market,
    iter_quarter_records,
    write_quarter,
)

__all__ = [
    "SIGNAL_DESCRIPTION",
    "QuarterReport",
    "SynthConfig",
    "SynthReport",
    "generate_market",
    "iter_quarter_records",
    "write_quarter",
]
