import datetime as dt
from pathlib import Path

import dagster as dg

from fx_assets.partitions import (
    parse_partition_key,
    partition_key,
    previous_quarter_mapping,
    quarter_symbol_partitions,
)
from fx_assets.settings import ProjectSettings


def settings(**kw) -> ProjectSettings:
    base = {
        "data_root": Path("/tmp/x"),
        "symbols": ("ES.FUT", "NQ.FUT"),
        "first_quarter": dt.date(2024, 1, 1),
        "last_quarter": dt.date(2024, 10, 1),
    }
    base.update(kw)
    return ProjectSettings(**base)


def test_quarter_by_symbol_keys() -> None:
    parts = quarter_symbol_partitions(settings())
    keys = parts.get_partition_keys()
    assert len(keys) == 8
    assert "2024-01|ES.FUT" in keys and "2024-10|NQ.FUT" in keys
    p = parse_partition_key(keys[0])
    assert p.quarter_label in {"2024-Q1"} and p.symbol in {"ES.FUT", "NQ.FUT"}
    assert parse_partition_key(partition_key(dt.date(2024, 7, 1), "ES.FUT")).label == "2024-Q3|ES.FUT"


def test_open_ended_quarters_run_to_last_complete_quarter() -> None:
    parts = quarter_symbol_partitions(settings(last_quarter=None, symbols=("ES.FUT",)))
    keys = parts.get_partition_keys(current_time=dt.datetime(2025, 2, 15, tzinfo=dt.UTC))
    assert [parse_partition_key(k).quarter_label for k in keys] == [
        "2024-Q1",
        "2024-Q2",
        "2024-Q3",
        "2024-Q4",
    ]


def test_previous_quarter_mapping() -> None:
    parts = quarter_symbol_partitions(settings())
    mapping = previous_quarter_mapping()
    down = dg.MultiPartitionKey({"quarter": "2024-07", "symbol": "NQ.FUT"})
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        parts.subset_with_partition_keys([down]), parts, parts
    )
    ups = sorted(str(k) for k in result.partitions_subset.get_partition_keys())
    assert ups == ["2024-04|NQ.FUT", "2024-07|NQ.FUT"]
    first = dg.MultiPartitionKey({"quarter": "2024-01", "symbol": "ES.FUT"})
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        parts.subset_with_partition_keys([first]), parts, parts
    )
    assert sorted(str(k) for k in result.partitions_subset.get_partition_keys()) == ["2024-01|ES.FUT"]


def test_fold_runs_carry_no_per_dimension_partition_tags(tmp_path: Path) -> None:
    """A job backfill copies the first partition's tags into each range run, and Dagster reads
    ``dagster/partition/<dim>`` before the range tags (dagster-io/dagster#28861): the training
    partitions must not produce them, or a K-fold backfill trains one fold."""
    from fx_assets.definitions import build_definitions
    from fx_assets.partitions import training_partitions

    s = settings(data_root=tmp_path, symbols=("ES.FUT",))
    parts = training_partitions(s)
    assert parts is not None
    job = build_definitions(s).resolve_job_def("train_models")
    for key in ("2024-07|ES.FUT", "2024-10|ES.FUT"):
        tags = job.get_tags_for_partition_key(key, None)
        assert not [t for t in tags if t.startswith("dagster/partition/")], tags
        assert tags["dagster/partition"] == key
    assert [str(k) for k in parts.get_partition_keys()] == ["2024-07|ES.FUT", "2024-10|ES.FUT"]


def test_quarters_grow_with_the_clock_without_configuration() -> None:
    parts = quarter_symbol_partitions(settings(last_quarter=None, symbols=("ES.FUT",)))
    before = parts.get_partition_keys(current_time=dt.datetime(2025, 3, 31, tzinfo=dt.UTC))
    after = parts.get_partition_keys(current_time=dt.datetime(2025, 4, 1, tzinfo=dt.UTC))
    assert [str(k) for k in after] == [*map(str, before), "2025-01|ES.FUT"]
