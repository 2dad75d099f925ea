"""Raw observation (stable files only, both schemas), the raw-folder sensor, and declarative
automation: a new quarter requests exactly its own chain, then its fold, then the report."""

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType

from fx_assets.assets.raw import observe_raw_files
from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.resources.storage import FxStorage
from fx_assets.settings import ProjectSettings

KEYS = ["2024-01|ES.FUT", "2024-04|ES.FUT", "2024-07|ES.FUT", "2024-10|ES.FUT"]


def settings(root: Path) -> ProjectSettings:
    return ProjectSettings(
        data_root=root, first_quarter=dt.date(2024, 1, 1), last_quarter=dt.date(2024, 10, 1), train_quarters=1
    )


def write(root: Path, schema: str, label: str, data: bytes) -> Path:
    p = root / "raw" / schema / "ES.FUT" / f"ES.FUT_{label}.dbn.zst"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def test_observation_reports_only_stable_partitions_with_both_files(tmp_path: Path) -> None:
    storage = FxStorage(root=str(tmp_path))
    write(tmp_path, "trades", "2024-Q1", b"t1")
    write(tmp_path, "mbp-10", "2024-Q1", b"b1")
    write(tmp_path, "trades", "2024-Q2", b"t2")  # no book file yet
    first = observe_raw_files(storage, "trades", KEYS, {})
    assert first.versions == {} and first.pending == ["2024-Q1|ES.FUT"]
    assert first.incomplete == ["2024-Q2|ES.FUT"]
    second = observe_raw_files(storage, "trades", KEYS, first.state)
    assert set(second.versions) == {"2024-01|ES.FUT"} and second.pending == []
    # still being written: its size changes between observations, so it is not reported
    growing = write(tmp_path, "mbp-10", "2024-Q2", b"b")
    third = observe_raw_files(storage, "trades", KEYS, second.state)
    growing.write_bytes(b"b2-longer")
    fourth = observe_raw_files(storage, "trades", KEYS, third.state)
    assert "2024-04|ES.FUT" not in fourth.versions and fourth.pending == ["2024-Q2|ES.FUT"]
    fifth = observe_raw_files(storage, "trades", KEYS, fourth.state)
    assert set(fifth.versions) == {"2024-01|ES.FUT", "2024-04|ES.FUT"}
    # a replaced file gets a new version once stable; the other partition's is unchanged
    f = tmp_path / "raw/trades/ES.FUT/ES.FUT_2024-Q1.dbn.zst"
    f.write_bytes(b"t1-new")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    sixth = observe_raw_files(
        storage, "trades", KEYS, observe_raw_files(storage, "trades", KEYS, fifth.state).state
    )
    assert sixth.versions["2024-01|ES.FUT"] != fifth.versions["2024-01|ES.FUT"]
    assert sixth.versions["2024-04|ES.FUT"] == fifth.versions["2024-04|ES.FUT"]


def test_raw_files_sensor_observes_on_change_and_confirms_once(tmp_path: Path) -> None:
    defs = build_definitions(settings(tmp_path))
    sensor = defs.resolve_sensor_def("raw_files_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    with dg.instance_for_test() as inst:

        def tick(cursor):
            return sensor.evaluate_tick(
                dg.build_sensor_context(instance=inst, cursor=cursor, definitions=defs)
            )

        r1 = tick(None)  # first tick: one observation (finds the demo's versions unchanged)
        assert len(r1.run_requests) == 1
        r2 = tick(r1.cursor)  # confirmation
        assert len(r2.run_requests) == 1 and r2.run_requests[0].run_key != r1.run_requests[0].run_key
        r3 = tick(r2.cursor)
        assert r3.run_requests == [] and r3.skip_message
        write(tmp_path, "trades", "2024-Q1", b"t1")
        r4 = tick(r3.cursor)
        assert len(r4.run_requests) == 1
        assert json.loads(r4.cursor)["confirmed"] is False


def observe(inst: dg.DagsterInstance, versions: dict[str, str]) -> None:
    for asset in ("raw_trades", "raw_mbp10"):
        for key, v in versions.items():
            inst.report_runless_asset_event(
                dg.AssetObservation(asset_key=asset, partition=key, tags={"dagster/data_version": v})
            )


def materialize(inst: dg.DagsterInstance, requested: dict[str, set[str]]) -> None:
    for asset, keys in requested.items():
        for key in keys or {None}:
            inst.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))


class Automation:
    """``fx_automation``'s conditions evaluated tick by tick on a test instance, for the
    definitions without their asset checks: these tests record materializations without runs,
    and the conditions' wait for blocking checks is tested with real runs in
    test_asset_checks.py."""

    WHEN = dt.datetime(2025, 2, 15, tzinfo=dt.UTC)

    def __init__(self, root: Path) -> None:
        self.full = f = build_definitions(settings(root))
        self.defs = dg.Definitions(
            assets=f.assets, jobs=f.jobs, resources=f.resources, sensors=f.sensors, executor=f.executor
        )
        graph = self.defs.resolve_asset_graph()
        self.keys = [k for k in graph.get_all_asset_keys() if graph.get(k).is_materializable]
        self.job = self.defs.resolve_implicit_global_asset_job_def()

    def tick(self, inst: dg.DagsterInstance, cursor: Any) -> tuple[Any, dict[str, set[str]]]:
        """One evaluation: its result and {asset: the partition keys it requested}."""
        r = dg.evaluate_automation_conditions(
            defs=self.defs, instance=inst, cursor=cursor, evaluation_time=self.WHEN
        )
        return r, {
            k.to_user_string(): {str(p) for p in r.get_requested_partitions(k) if p is not None}
            for k in self.keys
            if r.get_num_requested(k)
        }

    def up_to_date(self, inst: dg.DagsterInstance) -> Any:
        """Every quarter observed and built, its folds trained (train_quarters=1: KEYS[1:]) and
        reported; the first tick, which requests nothing: its result."""
        observe(inst, {k: "v1" for k in KEYS})
        materialize(inst, {a: set(KEYS) for a in FEATURE_STAGES})
        materialize(
            inst, {"fold_ranges": set(KEYS[1:]), "trained_model": set(KEYS[1:]), "walk_forward_report": set()}
        )
        r, req = self.tick(inst, None)
        assert req == {}, req
        return r

    def started_run(
        self, inst: dg.DagsterInstance, asset: str, partition: str | None = None
    ) -> dg.DagsterRun:
        """A run of ``asset`` (one partition or none) that has started and not ended."""
        run = inst.create_run_for_job(
            job_def=self.job,
            asset_selection=frozenset({dg.AssetKey(asset)}),
            tags={"dagster/partition": partition} if partition else None,
        )
        event = DagsterEvent(event_type_value=DagsterEventType.RUN_START.value, job_name=run.job_name)
        inst.report_dagster_event(event, run_id=run.run_id)
        return run


def test_automation_builds_a_new_quarter_then_its_fold_then_the_report(tmp_path: Path) -> None:
    auto = Automation(tmp_path)
    assert (
        not auto.defs.resolve_asset_graph().asset_check_keys
        and auto.full.resolve_asset_graph().asset_check_keys
    )
    tick = auto.tick
    chain = list(FEATURE_STAGES)
    with dg.instance_for_test() as inst:
        observe(inst, {k: "v1" for k in KEYS[:3]})
        materialize(inst, {a: set(KEYS[:3]) for a in chain})
        materialize(
            inst,
            {"fold_ranges": set(KEYS[1:3]), "trained_model": set(KEYS[1:3]), "walk_forward_report": set()},
        )
        r, req = tick(inst, None)
        assert req == {}  # everything up to date: the first evaluation requests nothing
        observe(inst, {k: "v1" for k in KEYS[:3]})  # re-observed, unchanged
        r, req = tick(inst, r.cursor)
        assert req == {}
        observe(inst, {KEYS[3]: "v1"})  # 2024-Q4 lands
        seen: list[dict[str, set[str]]] = []
        for _ in range(8):
            r, req = tick(inst, r.cursor)
            if not req:
                break
            seen.append(req)
            materialize(inst, req)
        flat = {
            a: set().union(*(s.get(a, set()) for s in seen)) for a in [*chain, "trained_model", "fold_ranges"]
        }
        assert all(flat[a] == {KEYS[3]} for a in chain), seen
        assert flat["trained_model"] == {KEYS[3]} and flat["fold_ranges"] == {KEYS[3]}, seen
        assert "walk_forward_report" in seen[-1] and "trained_model" in seen[-2], seen
        # the first stage group, then the rest: nothing is requested before its inputs exist
        assert set(seen[0]) == {"predecoded_trades", "predecoded_mbp10"}, seen
        # a changed old file rebuilds its own chain and the folds whose window holds it
        observe(inst, {KEYS[1]: "v2"})
        seen = []
        for _ in range(8):
            r, req = tick(inst, r.cursor)
            if not req:
                break
            seen.append(req)
            materialize(inst, req)
        fx = set().union(*(s.get("fxcache", set()) for s in seen))
        folds = set().union(*(s.get("trained_model", set()) for s in seen))
        # the next quarter's roll calendar reads this quarter's trades, and the one after warms
        # its features up from those bars: the change reaches exactly the declared dependents
        assert fx == set(KEYS[1:]) and folds == set(KEYS[1:]), seen
        assert set().union(*(s.get("predecoded_trades", set()) for s in seen)) == {KEYS[1]}, seen


def test_nothing_is_rebuilt_while_an_asset_reading_it_runs(tmp_path: Path) -> None:
    """A fold that trains while the report runs would be lost for good: both materializations
    land between the same two ticks, ``since_last_handled`` resets on the report's own and drops
    the fold's (CI saw the report stall without the last fold); the same for an fxcache rebuilt
    while a fold of its window trains. So a dependency waits for a running reader, and the report
    is not requested on a tick that requests a fold."""
    auto = Automation(tmp_path)
    tick = auto.tick
    with dg.instance_for_test() as inst:

        def started_run(asset: str, partition: str | None = None) -> dg.DagsterRun:
            return auto.started_run(inst, asset, partition)

        r = auto.up_to_date(inst)
        # the report is running when a quarter's fxcache is rebuilt: the fold waits for it
        report_run = started_run("walk_forward_report")
        materialize(inst, {"fxcache": {KEYS[3]}})
        for _ in range(2):
            r, req = tick(inst, r.cursor)
            assert "trained_model" not in req, req  # (fold_ranges, which the report does not read, may run)
            materialize(inst, req)
        inst.report_run_failed(report_run)  # the report's run has ended
        r, req = tick(inst, r.cursor)
        # the fold whose window holds it (train_quarters=1), and not the report with it
        assert req.get("trained_model") == {KEYS[3]} and "walk_forward_report" not in req, req
        materialize(inst, req)
        r, req = tick(inst, r.cursor)
        assert req == {"walk_forward_report": set()}, req
        materialize(inst, req)
        # a fold (window KEYS[2..3]) trains when KEYS[2]'s OFI features are rebuilt: that fxcache
        # waits for the fold, then is rebuilt, and the folds reading it retrain after it
        fold_run = started_run("trained_model", KEYS[3])
        materialize(inst, {"ofi_features": {KEYS[2]}})
        for _ in range(2):
            r, req = tick(inst, r.cursor)
            assert "fxcache" not in req, req
        inst.report_run_failed(fold_run)
        r, req = tick(inst, r.cursor)
        assert req.get("fxcache") == {KEYS[2]}, req
        materialize(inst, req)
        r, req = tick(inst, r.cursor)
        assert req.get("trained_model") == {KEYS[2], KEYS[3]}, req
        assert "walk_forward_report" not in req, req  # not on the tick that requests the folds
        materialize(inst, req)
        # the folds changed, but a fold's fxcache is being rebuilt: its fold trains after it, so
        # a report now would end just before that fold (CI: launched 1.8 s apart, never refreshed)
        fx_run = started_run("fxcache", KEYS[3])
        r, req = tick(inst, r.cursor)
        assert "walk_forward_report" not in req, req
        inst.report_run_failed(fx_run)
        r, req = tick(inst, r.cursor)
        assert req == {"walk_forward_report": set()}, req


def test_a_fold_that_lands_while_the_report_runs_is_reported_after_it(tmp_path: Path) -> None:
    """The report reads the folds' files when its run starts: a fold that lands after that (a
    user's fold run, or the sensor's when ticks and launches interleave) must bring another
    report, whichever tick the two materializations fall on. ``since_last_handled`` resets on the
    report's own materialization and dropped such a fold for good (CI: the report stalled without
    the last fold)."""
    auto = Automation(tmp_path)
    tick = auto.tick
    with dg.instance_for_test() as inst:

        def report_started() -> dg.DagsterRun:
            return auto.started_run(inst, "walk_forward_report")

        def report_lands(run: dg.DagsterRun) -> None:
            materialize(inst, {"walk_forward_report": set()})
            inst.report_run_failed(run)  # (the run has ended; its outcome does not matter here)

        r = auto.up_to_date(inst)
        # 1. the report runs; a fold lands, then the report, between the same two ticks
        run = report_started()
        materialize(inst, {"trained_model": {KEYS[3]}})
        report_lands(run)
        r, req = tick(inst, r.cursor)
        assert req == {"walk_forward_report": set()}, req
        materialize(inst, req)
        r, req = tick(inst, r.cursor)
        assert req == {}, req  # and once reported, nothing more
        # 2. the fold lands on a tick while the report runs, the report on the next one
        run = report_started()
        materialize(inst, {"trained_model": {KEYS[2]}})
        r, req = tick(inst, r.cursor)
        assert req == {}, req  # the report is running
        report_lands(run)
        r, req = tick(inst, r.cursor)
        assert req == {"walk_forward_report": set()}, req
        # 3. the sensor's own request: a fold lands after the report was requested, before the
        # next tick (the report's run may already have read the folds)
        materialize(inst, {"walk_forward_report": set()})
        materialize(inst, {"trained_model": {KEYS[1]}})
        r, req = tick(inst, r.cursor)
        assert req == {"walk_forward_report": set()}, req
        run = report_started()
        materialize(inst, {"trained_model": {KEYS[2]}})
        r, req = tick(inst, r.cursor)  # the tick after the request sees that fold
        assert req == {}, req
        report_lands(run)
        r, req = tick(inst, r.cursor)
        assert req == {"walk_forward_report": set()}, req
        materialize(inst, req)
        for _ in range(2):
            r, req = tick(inst, r.cursor)
            assert req == {}, req


def test_a_step_that_failed_on_sources_changed_under_it_is_requested_again(tmp_path: Path) -> None:
    """A stage requested on one tick reads raw files that change while it runs: it fails
    (``StageIO.check_current``) and records nothing. The new files' observation lands before
    the next tick; the partition must be requested again once its run has ended, not wait for
    a user."""
    auto = Automation(tmp_path)
    tick = auto.tick
    with dg.instance_for_test() as inst:
        r = auto.up_to_date(inst)
        observe(inst, {KEYS[3]: "v2"})  # new files for the last quarter
        r, req = tick(inst, r.cursor)
        assert req.get("predecoded_trades") == {KEYS[3]}, req  # (with the stages after it)
        run = auto.started_run(inst, "predecoded_trades", KEYS[3])
        observe(inst, {KEYS[3]: "v3"})  # changed again while the step runs, observed at once
        r, req = tick(inst, r.cursor)
        assert "predecoded_trades" not in req, req  # its run is in progress
        inst.report_run_failed(run)  # the step failed: its sources changed under it
        r, req = tick(inst, r.cursor)
        assert req.get("predecoded_trades") == {KEYS[3]}, req
        # requested once: when it and what follows it have landed, automation comes to rest
        for _ in range(8):
            materialize(inst, req)
            r, req = tick(inst, r.cursor)
            assert "predecoded_trades" not in req, req
            if not req:
                break
        assert req == {}, req


def test_a_fold_whose_quarter_was_rebuilt_while_it_trained_is_trained_again(tmp_path: Path) -> None:
    """The same for a fold: the sensor requests it, a user's run rebuilds an fxcache quarter of
    its window before the next tick, the fold fails (``ResidentQuarters.changed_since_loaded``)
    and is requested again once its run has ended."""
    auto = Automation(tmp_path)
    tick = auto.tick
    with dg.instance_for_test() as inst:
        r = auto.up_to_date(inst)
        materialize(inst, {"fxcache": {KEYS[2]}})  # (a rebuilt quarter: its folds retrain)
        r, req = tick(inst, r.cursor)
        assert req.get("trained_model") == {KEYS[2], KEYS[3]}, req
        runs = [auto.started_run(inst, "trained_model", k) for k in (KEYS[2], KEYS[3])]
        materialize(inst, {"fxcache": {KEYS[3]}})  # a user's run, while the folds train
        r, req = tick(inst, r.cursor)
        assert "trained_model" not in req, req
        inst.report_run_failed(runs[1])  # the fold of KEYS[2..3] read a quarter that changed
        materialize(inst, {"trained_model": {KEYS[2]}})  # the other one landed
        inst.report_run_failed(runs[0])
        r, req = tick(inst, r.cursor)
        assert req.get("trained_model") == {KEYS[3]}, req
