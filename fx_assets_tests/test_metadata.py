"""Metadata people read in the UI: a cache hit reports what the build reported, tables keep their
columns, metrics say what they measure."""

import math
import re
import shutil
from pathlib import Path

import dagster as dg
import pytest

from fx_assets_tests.test_pipeline import FEATURES, Q1, Q2, QUIET, defs_for, materialize

KEYED = ["roll_calendar", "bars", "bar_features", "ofi_features", "fxcache"]
FOLD = {
    "dagster/asset_partition_range_start": "2024-04|ES.FUT",
    "dagster/asset_partition_range_end": "2024-04|ES.FUT",
}


@pytest.fixture
def market(market3: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    return root


def all_meta(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    return {
        ev.asset_key.to_user_string(): dict(ev.materialization.metadata)
        for ev in result.get_asset_materialization_events()
    }


def without_action(md: dict) -> dict:
    return {k: v for k, v in md.items() if k != "action"}


def fold_observations(inst: dg.DagsterInstance, run_id: str) -> dict[str, dict]:
    recs = inst.fetch_observations(dg.AssetKey("trained_model"), limit=50).records
    return {
        r.event_log_entry.asset_observation.partition: dict(r.event_log_entry.asset_observation.metadata)
        for r in recs
        if r.run_id == run_id
    }


def table_cells(md: str) -> list[list[str]]:
    """Rows of a markdown table, split on the ``|`` that are not escaped (as GFM does)."""
    rows = [ln.strip() for ln in md.splitlines() if ln.strip().startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", r)[1:-1]] for r in rows]


def assert_table_columns_hold(md: str, must_show: str) -> None:
    rows = table_cells(md)
    assert len(rows) >= 3, md
    assert all(len(r) == len(rows[0]) for r in rows), md
    assert must_show in md and "2024-04|ES.FUT" not in md and "|ES.FUT" not in md, md


def test_cache_hit_reports_the_build_metadata_and_tables_hold(market: Path) -> None:
    defs = defs_for(market, last=Q2, train_quarters=1)
    res = dict(defs.resources or {})
    with dg.instance_for_test() as inst:
        assert materialize(defs, inst, FEATURES, Q1).success
        built = all_meta(materialize(defs, inst, FEATURES, Q2))
        reused = all_meta(materialize(defs, inst, FEATURES, Q2))
        for stage in KEYED:
            assert built[stage]["action"].value == "built", stage
            assert reused[stage]["action"].value == "reused", stage
            # Same tables, counts, pictures and timings as the run that wrote the file.
            assert without_action(reused[stage]) == without_action(built[stage]), stage
        assert "bars_per_session" in reused["bars"] and "summary" in reused["ofi_features"]

        train = defs.resolve_job_def("train_models")
        first = train.execute_in_process(instance=inst, resources=res, run_config=QUIET, tags=FOLD)
        again = train.execute_in_process(instance=inst, resources=res, run_config=QUIET, tags=FOLD)
        assert first.success and again.success
        obs1, obs2 = fold_observations(inst, first.run_id), fold_observations(inst, again.run_id)
        assert set(obs1) == set(obs2) == {"2024-04|ES.FUT"}
        o1, o2 = obs1["2024-04|ES.FUT"], obs2["2024-04|ES.FUT"]
        assert o1["action"].value == "trained" and o2["action"].value == "reused"
        assert "equity_curve" in o2 and "sharpe" in o2
        assert without_action(o2) == without_action(o1)

        # Tables keep their columns: the fold is shown as "2024-Q2 ES.FUT", never with its key's "|".
        for r in (first, again):
            m = all_meta(r)
            assert_table_columns_hold(m["fold_ranges"]["folds"].value, "2024-Q2 ES.FUT")
            assert_table_columns_hold(m["trained_model"]["folds"].value, "2024-Q2 ES.FUT")
        assert o2["fold"].value == "2024-Q2 ES.FUT"

        rep = defs.resolve_job_def("walk_forward").execute_in_process(
            instance=inst, resources=res, run_config=QUIET
        )
        rm = all_meta(rep)["walk_forward_report"]
        rows = table_cells(rm["folds"].value)
        assert all(len(r) == len(rows[0]) for r in rows)
        header = rows[0]
        # A sum of log returns is called so; total_return is the compounded one.
        assert {"net_total_log_return", "total_return"} <= set(header)
        log_ret = float(rows[2][header.index("net_total_log_return")])
        total = float(rows[2][header.index("total_return")])
        assert total == pytest.approx(math.expm1(log_ret), abs=2e-5)
        assert rm["ES.FUT_total_return"].value == pytest.approx(
            math.expm1(rm["ES.FUT_total_log_return"].value), abs=2e-5
        )
        assert o2["total_return"].value == pytest.approx(math.expm1(o2["total_log_return"].value), abs=2e-5)


def test_lost_metadata_sidecar_means_rebuild_not_bare_metadata(market: Path) -> None:
    from fx_assets.assets.common import metadata_sidecar

    defs = defs_for(market, last=Q1)
    with dg.instance_for_test() as inst:
        built = all_meta(materialize(defs, inst, ["predecoded_trades", "roll_calendar", "bars"], Q1))
        path = Path(built["bars"]["path"].value)
        side = metadata_sidecar(path)
        assert side.is_file()
        side.unlink()
        again = all_meta(materialize(defs, inst, ["bars"], Q1))["bars"]
        assert again["action"].value == "built" and side.is_file()
        assert again["bars_per_session"] == built["bars"]["bars_per_session"]
        side.write_text("{torn")
        assert all_meta(materialize(defs, inst, ["bars"], Q1))["bars"]["action"].value == "built"
