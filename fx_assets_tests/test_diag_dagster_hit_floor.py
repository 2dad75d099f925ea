"""The step shapes that ``benchmarks.diag_dagster_hit_floor`` compares are what it says they are:
the same 7 materializations and 7 blocking check evaluations in 14, 7 or 1 step, and a check of
the one-step shape runs alone without materializing anything."""

import dagster as dg
import pytest

from benchmarks import diag_dagster_hit_floor as diag


def _run(job: dg.JobDefinition) -> dg.ExecuteInProcessResult:
    with dg.instance_for_test() as inst:
        return job.execute_in_process(instance=inst, partition_key=diag.PARTITIONS[0])


@pytest.mark.parametrize(("shape", "steps"), [("14_steps", 14), ("7_steps", 7), ("1_step", 1)])
def test_each_shape_materializes_the_7_stages_and_evaluates_7_checks(shape: str, steps: int) -> None:
    job = diag._defs(shape).resolve_job_def("j")
    r = _run(job)
    assert r.success
    started = {e.step_key for e in r.all_events if e.event_type_value == "STEP_START"}
    assert len(started) == steps
    mats = [e.asset_key.to_user_string() for e in r.get_asset_materialization_events() if e.asset_key]
    assert sorted(mats) == sorted(diag.NAMES)
    evals = r.get_asset_check_evaluations()
    assert len(evals) == 7 and all(e.passed for e in evals)


def test_a_check_of_the_one_step_shape_runs_alone() -> None:
    job = diag._defs("1_step").resolve_job_def("j")
    key = dg.AssetCheckKey(dg.AssetKey("bars"), "ok")
    r = _run(job.get_subset(asset_selection=set(), asset_check_selection={key}))
    assert r.success
    assert r.get_asset_materialization_events() == []
    assert [e.asset_check_key for e in r.get_asset_check_evaluations()] == [key]
