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
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest

from fx_assets.assets import features as features_mod
from fx_assets.assets.common import StageIO
from fx_assets.automation import BLOCKING_CHECKS_PASSED
from fx_assets.core import sidecar as sidecar_core
from fx_assets.core import tables, verify
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import read_header
from fx_assets.core.sidecar import sidecar_columns, sidecar_path
from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import QuarterSymbol, partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.settings import ProjectSettings

Q1, Q2 = dt.date(2024, 1, 1), dt.date(2024, 4, 1)
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
CHECKS = {
    ("predecoded_trades", "sidecar_matches_source"),
    ("predecoded_mbp10", "sidecar_matches_source"),
    ("bars", "volume_conserved"),
    ("bar_features", "features_valid"),
    ("ofi_features", "features_valid"),
    ("ofi_features", "causal_spot_check"),
    ("fxcache", "fxcache_valid"),
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
    inst = dg.DagsterInstance.ephemeral()
    for q in (Q1, Q2):
        r = run(defs, inst, "materialize", q)
        assert r.success
        res = check_results(r)
        assert set(res) == CHECKS, set(res)
        assert all(e.passed for e in res.values()), {k: e.description for k, e in res.items()}
    return root, defs


def run(
    defs: dg.Definitions,
    inst: dg.DagsterInstance,
    how: str,
    quarter: dt.date,
    selection: list[str] | None = None,
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
    if stage in ("trades", "mbp-10"):
        src = io.raw(stage)
        return sidecar_path(src, io.layout.sidecar_dir(stage, "ES.FUT"))
    return io.path(stage)


@contextlib.contextmanager
def kept(path: Path) -> Iterator[None]:
    """Whatever happens to ``path`` inside, its original bytes are back afterwards."""
    original = path.read_bytes()
    try:
        yield
    finally:
        path.write_bytes(original)


def rewrite_table(path: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    """``path`` rewritten by the stage writer as ``edit(table)``: a well-formed file, wrong content."""
    table = tables.read_table(path)
    edited = edit(pa.table({n: table.column(n).to_numpy() for n in table.column_names}))
    tables.write_table(path, edited.replace_schema_metadata(table.schema.metadata))


def set_value(column: str, row: int, value: float) -> Callable[[Path], None]:
    def edit(t: pa.Table) -> pa.Table:
        v = t.column(column).to_numpy().copy()
        v[row] = value
        return t.set_column(t.column_names.index(column), column, pa.array(v))

    return lambda path: rewrite_table(path, edit)


def look_ahead(column: str) -> Callable[[Path], None]:
    """Each bar holds the next bar's value: a stage output planted with a one-bar look-ahead."""

    def edit(t: pa.Table) -> pa.Table:
        v = t.column(column).to_numpy().copy()
        v[:-1] = v[1:]
        return t.set_column(t.column_names.index(column), column, pa.array(v))

    return lambda path: rewrite_table(path, edit)


def flip_unsampled_price_byte(path: Path) -> None:
    """One byte of the sidecar's ``price`` column changed where a sampled reuse does not look
    (between its first two sampled blocks): the predecoded asset reuses the sidecar and only the
    full verification of the check can see it. (The test makes reuse sample, as it does for
    sidecars above ``sidecar._FULL_REUSE_BYTES`` of columns, i.e. real quarters.)"""
    prices = sidecar_columns(path, ["price"])["price"]
    raw = bytearray(path.read_bytes())
    length = prices.nbytes
    gap_mid = ((length - 4096) // 15 + 4096) // 2  # sidecar._sample_ranges: 16 blocks of 4 KiB
    row = gap_mid // 8
    at = raw.find(prices[row : row + 4].tobytes())
    assert at > 0 and raw.find(prices[row : row + 4].tobytes(), at + 1) < 0
    raw[at + 3] ^= 0x01
    path.write_bytes(bytes(raw))


DEFECTS: dict[str, tuple[tuple[str, str], str, Callable[[Path], None], list[str]]] = {
    # check, planted file, plant, words the failure must name (besides the partition)
    "corrupted_sidecar_byte": (
        ("predecoded_trades", "sidecar_matches_source"),
        "trades",
        flip_unsampled_price_byte,
        ["checksum mismatch in column price"],
    ),
    "dropped_bar_volume": (
        ("bars", "volume_conserved"),
        "bars",
        set_value("volume", 700, 1.0),
        ["column 'volume'", "session"],
    ),
    "non_finite_bar_feature": (
        ("bar_features", "features_valid"),
        "bar_features",
        set_value("rsi_14", 900, float("inf")),
        ["feature 'rsi_14' bar 900"],
    ),
    "non_finite_ofi_feature": (
        ("ofi_features", "features_valid"),
        "ofi_features",
        set_value("ofi_l1", 900, float("nan")),
        ["feature ofi_l1 is NaN", "bar 900"],
    ),
    "look_ahead_in_bars": (
        ("ofi_features", "causal_spot_check"),
        "bars",
        look_ahead("high"),
        ["raw data cut at ts_recv", "bars column 'high'"],
    ),
    "look_ahead_in_bar_features": (
        ("ofi_features", "causal_spot_check"),
        "bar_features",
        look_ahead("log_return"),
        ["raw data cut at ts_recv", "bar_features column 'log_return'"],
    ),
    "look_ahead_in_ofi_features": (
        ("ofi_features", "causal_spot_check"),
        "ofi_features",
        look_ahead("trade_imbalance_1"),
        ["raw data cut at ts_recv", "ofi_features column 'trade_imbalance_1'"],
    ),
}
RUNNERS = ["materialize", "job"]


@pytest.mark.parametrize("how", RUNNERS)
def test_checks_pass_on_a_good_partition(built: tuple[Path, dg.Definitions], how: str) -> None:
    _, defs = built
    inst = dg.DagsterInstance.ephemeral()
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
    assert causal["max_rel_diff_ofi"].value <= 1e-9


@pytest.mark.parametrize("how", RUNNERS)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_check_fails_on_its_planted_defect(
    built: tuple[Path, dg.Definitions], defect: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, defs = built
    check, target, plant, words = DEFECTS[defect]
    monkeypatch.setattr(sidecar_core, "_FULL_REUSE_BYTES", 0)  # reuse samples, as for a real quarter
    path = stage_path(root, target)
    with kept(path):
        inst = dg.DagsterInstance.ephemeral()
        plant(path)
        r = run(defs, inst, how, Q2)
        assert not r.success
        ev = check_results(r)[check]
        assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
        text = ev.description or ""
        for w in ["2024-Q2|ES.FUT", *words]:
            assert w in text, (w, text)
        if check[1] != "causal_spot_check":
            assert path.name in text, text  # the file


@pytest.mark.parametrize("how", RUNNERS)
def test_fxcache_check_fails_on_a_corrupt_written_file(
    built: tuple[Path, dg.Definitions], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fxcache asset fully verifies a file before reusing it, so the defect is planted in the
    write itself: one value byte changes after the file is written (as bit rot would)."""
    root, defs = built
    path = stage_path(root, "fxcache")
    real = features_mod.write_fxcache

    def corrupting_write(dest: Path, *args: Any, **kwargs: Any) -> Any:
        out = real(dest, *args, **kwargs)
        raw = bytearray(Path(dest).read_bytes())
        raw[read_header(dest).values_offset + 101] ^= 0x01
        Path(dest).write_bytes(bytes(raw))
        return out

    monkeypatch.setattr(features_mod, "write_fxcache", corrupting_write)
    with kept(path):
        inst = dg.DagsterInstance.ephemeral()
        path.unlink()  # so that the asset writes it again
        r = run(defs, inst, how, Q2)
        assert not r.success
        ev = check_results(r)[("fxcache", "fxcache_valid")]
        assert not ev.passed
        text = ev.description or ""
        assert "2024-Q2|ES.FUT" in text and path.name in text and "checksum mismatch" in text, text


@pytest.mark.parametrize("how", RUNNERS)
def test_failing_blocking_check_stops_downstream_steps(built: tuple[Path, dg.Definitions], how: str) -> None:
    root, defs = built
    path = stage_path(root, "bars")
    with kept(path):
        inst = dg.DagsterInstance.ephemeral()
        set_value("volume", 700, 1.0)(path)
        r = run(defs, inst, how, Q2)
        assert not r.success
        res = check_results(r)
        assert not res[("bars", "volume_conserved")].passed
        done = materialized(r)
        assert "bars" in done  # the asset itself was materialized (reused), then its check failed
        assert not done & {"bar_features", "ofi_features", "fxcache"}
        # Nothing downstream ran: neither the assets nor their checks.
        assert not {k for k in res if k[0] in ("bar_features", "ofi_features", "fxcache")}
        assert {e.step_key for e in r.get_step_failure_events()} == {"bars_volume_conserved"}


def test_checks_are_per_partition(built: tuple[Path, dg.Definitions]) -> None:
    """Q2's defect does not fail Q1's checks."""
    root, defs = built
    path = stage_path(root, "bars")
    with kept(path):
        inst = dg.DagsterInstance.ephemeral()
        set_value("volume", 700, 1.0)(path)
        r = run(defs, inst, "materialize", Q1)
        assert r.success
        assert all(e.passed for e in check_results(r).values())


def test_checks_are_registered_blocking_and_partitioned(tmp_path: Path) -> None:
    defs = build_definitions(ProjectSettings(data_root=tmp_path, first_quarter=Q1, last_quarter=Q2))
    dg.Definitions.validate_loadable(defs)
    specs = [s for c in defs.asset_checks or [] for s in c.check_specs]
    assert {(s.asset_key.to_user_string(), s.name) for s in specs} == CHECKS
    assert all(s.blocking for s in specs)
    graph = defs.resolve_asset_graph()
    for c in defs.asset_checks or []:
        for key in c.check_keys:
            assert c.partitions_def == graph.get(key.asset_key).partitions_def, key


@pytest.mark.parametrize("stage", ["bars", "bar_features", "ofi_features"])
def test_table_checks_verify_the_body_checksum(built: tuple[Path, dg.Definitions], stage: str) -> None:
    """A byte changed inside a stored table's body (values still plausible): the asset rebuilds
    such a file on reuse, and the check, run on demand, names it."""
    root, _ = built
    path = stage_path(root, stage)
    io = StageIO(FxStorage(root=str(root)), PipelineConfig(), QuarterSymbol(Q2, "ES.FUT"))
    check: dict[str, Callable[[], object]] = {
        "bars": lambda: verify.verify_bar_volume(
            path, io.sidecar("trades").path, io.path("roll_calendar"), partition="2024-Q2|ES.FUT"
        ),
        "bar_features": lambda: verify.verify_bar_features_file(path, partition="2024-Q2|ES.FUT"),
        "ofi_features": lambda: verify.verify_ofi_features_file(path, partition="2024-Q2|ES.FUT"),
    }
    check[stage]()  # good
    column = {"bars": "close", "bar_features": "rsi_14", "ofi_features": "ofi_l1"}[stage]
    values = tables.read_table(path).column(column).to_numpy()
    with kept(path):
        raw = bytearray(path.read_bytes())
        at = raw.find(values[500:504].tobytes())
        raw[at] ^= 0x01  # lowest mantissa bit of one value
        path.write_bytes(bytes(raw))
        with pytest.raises(
            FxDataError, match=f"2024-Q2\\|ES.FUT: {path}: checksum mismatch in column '{column}'"
        ):
            check[stage]()


def _with_condition(defs: dg.Definitions, asset: str, cond: dg.AutomationCondition) -> dg.Definitions:
    assets = [
        a.map_asset_specs(lambda s: s.replace_attributes(automation_condition=cond))
        if isinstance(a, dg.AssetsDefinition) and a.key.to_user_string() == asset
        else a
        for a in defs.assets or []
    ]
    return dg.Definitions(assets=assets, asset_checks=defs.asset_checks, resources=defs.resources)


AC = dg.AutomationCondition


def test_automation_waits_for_blocking_checks_only_when_asked(built: tuple[Path, dg.Definitions]) -> None:
    """Dagster 1.13.27, on this graph: ``eager()`` requests bar_features[Q2] although the blocking
    check of bars[Q2] failed; so does ``eager() & all_deps_blocking_checks_passed()`` (bars[Q1],
    also a dependency, passed); ``eager() & automation.BLOCKING_CHECKS_PASSED`` holds it back."""
    root, defs = built
    eager = AC.eager().without(AC.in_latest_time_window())
    conditions = {
        "eager": eager,
        "dagster_blocking": eager & AC.all_deps_blocking_checks_passed(),
        "all_partitions": eager & BLOCKING_CHECKS_PASSED,
    }
    path = stage_path(root, "bars")
    inst = dg.DagsterInstance.ephemeral()
    assert run(defs, inst, "materialize", Q1).success
    cursors = {
        name: dg.evaluate_automation_conditions(
            defs=_with_condition(defs, "bar_features", c), instance=inst
        ).cursor
        for name, c in conditions.items()
    }
    with kept(path):
        set_value("volume", 700, 1.0)(path)
        assert not run(defs, inst, "materialize", Q2, selection=["bars"]).success
    requested = {}
    for name, c in conditions.items():
        r = dg.evaluate_automation_conditions(
            defs=_with_condition(defs, "bar_features", c), instance=inst, cursor=cursors[name]
        )
        requested[name] = {str(k) for k in r.get_requested_partitions(dg.AssetKey("bar_features"))}
    assert requested == {
        "eager": {"2024-04|ES.FUT"},
        "dagster_blocking": {"2024-04|ES.FUT"},
        "all_partitions": set(),
    }
    # ... and once bars[Q2] is good again and its check passed, it is requested.
    assert run(defs, inst, "materialize", Q2, selection=["bars"]).success
    r = dg.evaluate_automation_conditions(
        defs=_with_condition(defs, "bar_features", conditions["all_partitions"]),
        instance=inst,
        cursor=r.cursor,
    )
    assert {str(k) for k in r.get_requested_partitions(dg.AssetKey("bar_features"))} == {"2024-04|ES.FUT"}


def test_the_graphs_conditions_wait_for_blocking_checks(built: tuple[Path, dg.Definitions]) -> None:
    """The feature chain and the folds use the condition the test above proves (the report is
    downstream of the folds, which already waited)."""
    from fx_assets import automation

    _, defs = built
    graph = defs.resolve_asset_graph()
    waiting = {
        k.to_user_string()
        for k in graph.get_all_asset_keys()
        if graph.get(k).automation_condition is not None
        and automation.BLOCKING_CHECKS_PASSED in graph.get(k).automation_condition.children
    }
    assert {"bars", "bar_features", "ofi_features", "fxcache"} <= waiting
    assert automation.BLOCKING_CHECKS_PASSED in automation.EAGER_ALL.children  # the folds' condition
