"""Asset checks (fx_assets.assets.checks) through Dagster: each passes on good partitions, fails
with a message naming partition and file / column when its defect is planted, and a failing
blocking check stops the downstream steps of the same run.

Two quarters are built once per module; a test plants its defect in a stored file (rewritten
with ``write_table``, so it is a well-formed file with wrong content, as a buggy stage would
write it), runs, and puts the original bytes back. Every defect is run both through
``dg.materialize`` and through ``execute_in_process`` of the ``build_features`` job, and the
check results are read from the run's events.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from fx_assets.assets.common import StageIO
from fx_assets.core import stages as st
from fx_assets.core.bar_features import feature_names
from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import QuarterSymbol, partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.settings import ProjectSettings

Q1, Q2 = dt.date(2024, 1, 1), dt.date(2024, 4, 1)
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
CHECKS = {
    ("bars", "volume_conserved"),
    ("bar_features", "features_valid"),
    ("ofi_features", "features_valid"),
    ("ofi_features", "causal_spot_check"),
}


@pytest.fixture(scope="module")
def built(market3: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dg.Definitions]:
    """Q1 and Q2 of the tiny market, every feature stage and check materialized (checks pass)."""
    root = tmp_path_factory.mktemp("checks") / "data"
    for schema in ("trades", "mbp-10"):
        for q in ("2024-Q1", "2024-Q2"):
            src = market3 / "raw" / schema / "ES.FUT" / f"ES.FUT_{q}.dbn.zst"
            (root / "raw" / schema / "ES.FUT").mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / "raw" / schema / "ES.FUT" / src.name)
    defs = build_definitions(ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=Q2))
    with dg.instance_for_test() as inst:
        for q in (Q1, Q2):
            r = run(defs, inst, "materialize", q)
            assert r.success
            res = check_results(r)
            assert set(res) == CHECKS, set(res)
            assert all(e.passed for e in res.values()), {k: e.description for k, e in res.items()}
    return root, defs


def run(
    defs: dg.Definitions, inst: dg.DagsterInstance, how: str, quarter: dt.date, selection: list[str] | None = None
) -> dg.ExecuteInProcessResult:
    pk = partition_key(quarter, "ES.FUT")
    if how == "materialize":
        return dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],
            selection=selection or list(FEATURE_STAGES),
            partition_key=pk,
            instance=inst,
            resources=dict(defs.resources or {}),
            run_config=QUIET,
            raise_on_error=False,
        )
    assert selection is None
    return defs.resolve_job_def("build_features").execute_in_process(
        partition_key=pk, instance=inst, run_config=QUIET, raise_on_error=False
    )


def check_results(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def stage_path(root: Path, stage: str, quarter: dt.date = Q2) -> Path:
    io = StageIO(FxStorage(root=str(root)), PipelineConfig(), QuarterSymbol(quarter, "ES.FUT"))
    return io.path(stage)


@contextlib.contextmanager
def planted(path: Path, edit: Callable[[pa.Table], pa.Table]) -> Iterator[None]:
    """``path`` rewritten as ``edit(table)`` for the duration; the original bytes restored after."""
    original = path.read_bytes()
    table = st.read_table(path)
    edited = edit(pa.table({n: table.column(n).to_numpy() for n in table.column_names}))
    st.write_table(path, edited.replace_schema_metadata(table.schema.metadata))
    try:
        yield
    finally:
        path.write_bytes(original)


def set_value(column: str, row: int, value: float) -> Callable[[pa.Table], pa.Table]:
    def edit(t: pa.Table) -> pa.Table:
        v = t.column(column).to_numpy().copy()
        v[row] = value
        return t.set_column(t.column_names.index(column), column, pa.array(v))

    return edit


def look_ahead(column: str) -> Callable[[pa.Table], pa.Table]:
    """Each bar holds the next bar's value: the stage output planted with a one-bar look-ahead."""

    def edit(t: pa.Table) -> pa.Table:
        v = t.column(column).to_numpy().copy()
        v[:-1] = v[1:]
        return t.set_column(t.column_names.index(column), column, pa.array(v))

    return edit


RUNNERS = ["materialize", "job"]


@pytest.mark.parametrize("how", RUNNERS)
def test_checks_pass_on_a_good_partition(built: tuple[Path, dg.Definitions], how: str) -> None:
    root, defs = built
    with dg.instance_for_test() as inst:
        r = run(defs, inst, how, Q2)
        assert r.success
        res = check_results(r)
        assert set(res) == CHECKS
        for key, ev in res.items():
            assert ev.passed, (key, ev.description)
            assert ev.metadata["partition"].value == "2024-Q2|ES.FUT"
        vol = res[("bars", "volume_conserved")].metadata
        assert vol["volume"].value > 0 and vol["bars"].value > 500
        causal = res[("ofi_features", "causal_spot_check")].metadata
        assert causal["bars_compared"].value >= 8 and causal["ofi_bars_compared"].value == 8
        assert causal["max_rel_diff_bar_features"].value <= 1e-9
        # Bounded: the cut reads the warm-up span of the raw data, not the quarter.
        n_trades = len(st.read_table(stage_path(root, "bars")))  # bars, as a scale reference
        assert causal["trades_records_read"].value > 0 and n_trades > 0


DEFECTS = {
    # check, planted file, edit, words the failure must name
    "dropped_bar_volume": (
        ("bars", "volume_conserved"),
        "bars",
        set_value("volume", 700, 1.0),
        ["'volume'", "session"],
    ),
    "non_finite_bar_feature": (
        ("bar_features", "features_valid"),
        "bar_features",
        set_value("rsi_14", 900, float("inf")),
        ["'rsi_14'", "bar 900"],
    ),
    "non_finite_ofi_feature": (
        ("ofi_features", "features_valid"),
        "ofi_features",
        set_value("ofi_l1", 900, float("nan")),
        ["ofi_l1", "bar 900"],
    ),
    "look_ahead_in_bar_features": (
        ("ofi_features", "causal_spot_check"),
        "bar_features",
        look_ahead("log_return"),
        ["bar_features column 'log_return'", "cut at ts_recv"],
    ),
    "look_ahead_in_ofi_features": (
        ("ofi_features", "causal_spot_check"),
        "ofi_features",
        look_ahead("trade_imbalance_1"),
        ["ofi_features column 'trade_imbalance_1'", "cut at ts_recv"],
    ),
    "look_ahead_in_bars": (
        ("ofi_features", "causal_spot_check"),
        "bars",
        look_ahead("high"),
        ["bars column 'high'", "cut at ts_recv"],
    ),
}


@pytest.mark.parametrize("how", RUNNERS)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_check_fails_on_its_planted_defect(built: tuple[Path, dg.Definitions], defect: str, how: str) -> None:
    root, defs = built
    check, stage, edit, words = DEFECTS[defect]
    path = stage_path(root, stage)
    with planted(path, edit), dg.instance_for_test() as inst:
        r = run(defs, inst, how, Q2)
        assert not r.success
        res = check_results(r)
        ev = res[check]
        assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
        text = ev.description or ""
        for w in ["2024-Q2|ES.FUT", *words]:
            assert w in text, (w, text)
        if stage != "bars" or check[1] == "causal_spot_check":
            assert path.name in text or "causality" in text, text
        if check == ("bars", "volume_conserved"):
            assert path.name in text
        # the other partition's checks are untouched by the plant
    assert set(feature_names()) >= {"rsi_14", "log_return"}


@pytest.mark.parametrize("how", RUNNERS)
def test_failing_blocking_check_stops_downstream_steps(built: tuple[Path, dg.Definitions], how: str) -> None:
    root, defs = built
    with planted(stage_path(root, "bars"), set_value("volume", 700, 1.0)), dg.instance_for_test() as inst:
        r = run(defs, inst, how, Q2)
        assert not r.success
        res = check_results(r)
        assert not res[("bars", "volume_conserved")].passed
        done = materialized(r)
        assert "bars" in done  # the asset itself was materialized (reused), then its check failed
        assert not done & {"bar_features", "ofi_features", "fxcache"}
        # The downstream checks never ran either.
        assert set(res) == {("bars", "volume_conserved")}
        failed = {e.step_key for e in r.get_step_failure_events()}
        assert failed == {"bars_volume_conserved"}, failed


def test_only_a_failing_check_fails_the_run(built: tuple[Path, dg.Definitions]) -> None:
    """Q1 stays good while Q2 is broken: the check is partition-scoped."""
    root, defs = built
    with planted(stage_path(root, "bars"), set_value("volume", 700, 1.0)), dg.instance_for_test() as inst:
        r = run(defs, inst, "materialize", Q1)
        assert r.success
        assert all(e.passed for e in check_results(r).values())


def test_stored_values_untouched_by_the_plants(built: tuple[Path, dg.Definitions]) -> None:
    root, _ = built
    v = st.read_table(stage_path(root, "bars")).column("volume").to_numpy()
    assert v[700] != 1.0 and np.isfinite(v).all()
