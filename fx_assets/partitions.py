"""Partitions: quarter (time window) × symbol (static), and the mappings between them.

Quarter keys are Dagster time-window keys (``2024-01`` = the quarter starting 2024-01-01),
because only a time-window dimension gives a "previous quarter" mapping; people see them as
``2024-Q1`` through :func:`quarter_label` (descriptions and metadata).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

import dagster as dg

from fx_assets.core.calendar import next_quarter, parse_quarter, quarter_label
from fx_assets.settings import ProjectSettings

QUARTER_DIM = "quarter"
SYMBOL_DIM = "symbol"
QUARTER_CRON = "0 0 1 1,4,7,10 *"
QUARTER_FMT = "%Y-%m"
PARTITION_TAG = "dagster/partition"


def quarter_partitions(settings: ProjectSettings) -> dg.TimeWindowPartitionsDefinition:
    start = dt.datetime.combine(settings.first_quarter, dt.time())
    end = (
        dt.datetime.combine(next_quarter(settings.last_quarter), dt.time()) if settings.last_quarter else None
    )
    return dg.TimeWindowPartitionsDefinition(
        start=start, end=end, cron_schedule=QUARTER_CRON, fmt=QUARTER_FMT, timezone="UTC"
    )


def quarter_symbol_partitions(settings: ProjectSettings) -> dg.MultiPartitionsDefinition:
    return dg.MultiPartitionsDefinition(
        {
            QUARTER_DIM: quarter_partitions(settings),
            SYMBOL_DIM: dg.StaticPartitionsDefinition(list(settings.symbols)),
        }
    )


class FoldPartitionsDefinition(dg.MultiPartitionsDefinition):
    """The training assets' quarter × symbol partitions, tagging a run with its key only.

    A job backfill of ``train_models`` copies the first partition's tags into every range run
    and Dagster reads the per-dimension tags (``dagster/partition/quarter`` …) before the range
    tags, so each run trained only its first fold while reporting success (dagster-io/dagster
    #28861). Without the per-dimension tags the range tags decide, and the backfill trains
    every requested fold. Single-partition runs still carry ``dagster/partition``.
    """

    def get_tags_for_partition_key(self, partition_key: str) -> Mapping[str, str]:
        return {PARTITION_TAG: str(self.get_partition_key_from_str(partition_key))}


def training_partitions(settings: ProjectSettings) -> dg.MultiPartitionsDefinition | None:
    """Validation quarters: the first one has ``train_quarters`` quarters of data before it.
    None when the configured range is too short for a single fold."""
    first = settings.first_quarter
    for _ in range(settings.train_quarters):
        first = next_quarter(first)
    if settings.last_quarter is not None and first > settings.last_quarter:
        return None
    shifted = settings.model_copy(update={"first_quarter": first})
    return FoldPartitionsDefinition(
        {
            QUARTER_DIM: quarter_partitions(shifted),
            SYMBOL_DIM: dg.StaticPartitionsDefinition(list(settings.symbols)),
        }
    )


def fold_window_mapping(train_quarters: int) -> dg.MultiPartitionMapping:
    """A fold's quarters: the validation quarter and the ``train_quarters`` before it."""
    return dg.MultiPartitionMapping(
        {
            QUARTER_DIM: dg.DimensionPartitionMapping(
                QUARTER_DIM, dg.TimeWindowPartitionMapping(start_offset=-train_quarters, end_offset=0)
            ),
            SYMBOL_DIM: dg.DimensionPartitionMapping(SYMBOL_DIM, dg.IdentityPartitionMapping()),
        }
    )


def previous_quarter_mapping() -> dg.MultiPartitionMapping:
    """Same symbol; the current and the previous quarter (absent at the first quarter)."""
    return dg.MultiPartitionMapping(
        {
            QUARTER_DIM: dg.DimensionPartitionMapping(
                QUARTER_DIM,
                dg.TimeWindowPartitionMapping(start_offset=-1, allow_nonexistent_upstream_partitions=True),
            ),
            SYMBOL_DIM: dg.DimensionPartitionMapping(SYMBOL_DIM, dg.IdentityPartitionMapping()),
        }
    )


@dataclass(frozen=True)
class QuarterSymbol:
    """A partition as the core layer sees it."""

    quarter: dt.date
    symbol: str

    @property
    def label(self) -> str:
        return f"{quarter_label(self.quarter)}|{self.symbol}"

    @property
    def quarter_label(self) -> str:
        return quarter_label(self.quarter)


def parse_partition_key(key: str | dg.MultiPartitionKey) -> QuarterSymbol:
    """``2024-01|ES.FUT`` (or a MultiPartitionKey) -> QuarterSymbol."""
    if isinstance(key, dg.MultiPartitionKey):
        dims = key.keys_by_dimension
        return QuarterSymbol(parse_quarter(dims[QUARTER_DIM]), dims[SYMBOL_DIM])
    quarter, _, symbol = str(key).partition("|")
    if not symbol:
        raise ValueError(f"partition key {key!r} is not QUARTER|SYMBOL")
    return QuarterSymbol(parse_quarter(quarter), symbol)


def partition_key(quarter: dt.date, symbol: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({QUARTER_DIM: quarter.strftime(QUARTER_FMT), SYMBOL_DIM: symbol})


def context_partition(context: dg.AssetExecutionContext) -> QuarterSymbol:
    return parse_partition_key(context.partition_key)
