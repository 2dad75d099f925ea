"""Assets materialized through Dagster on an ephemeral instance, on a tiny synthetic market."""

import datetime as dt
import os
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import zstandard
from dagster._core.definitions.observe import observe

from fx_assets.core.sidecar import open_sidecar
from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.settings import ProjectSettings

Q1, Q2, Q3 = dt.date(2024, 1, 1), dt.date(2024, 4, 1), dt.date(2024, 7, 1)
FEATURES = list(FEATURE_STAGES)
INGEST = FEATURES[:3]
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
# Appended to a .dbn.zst: a file of other content (other hash, other keys) with the same records,
# as a vendor's re-issue of a file would be.
EMPTY_ZSTD_FRAME = zstandard.ZstdCompressor().compress(b"")


def defs_for(root: Path, last: dt.date = Q3, train_quarters: int = 1) -> dg.Definitions:
    return build_definitions(
        ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=last, train_quarters=train_quarters)
    )


def materialize(
    defs: dg.Definitions,
    inst: dg.DagsterInstance,
    selection: list[str],
    quarter: dt.date,
    *,
    raise_on_error: bool = True,
):
    return dg.materialize(
        list(defs.assets or []),
        selection=selection,
        partition_key=partition_key(quarter, "ES.FUT"),
        instance=inst,
        resources=dict(defs.resources or {}),
        run_config=QUIET,
        raise_on_error=raise_on_error,
    )


def step_failure(r: dg.ExecuteInProcessResult) -> str:
    """The message of the run's one failed step (the run failed, nothing else did)."""
    assert not r.success
    (failure,) = [e for e in r.all_events if e.is_step_failure]
    return failure.step_failure_data.error.message


def meta(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    for ev in result.get_asset_materialization_events():
        if ev.asset_key.to_user_string() == asset:
            return {k: v.value for k, v in ev.materialization.metadata.items()}
    raise KeyError(asset)


@pytest.fixture
def market(market3: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    return root


def observed_versions(defs: dg.Definitions, inst: dg.DagsterInstance) -> dict[str, str]:
    sources = [a for a in defs.assets or [] if not isinstance(a, dg.AssetsDefinition)]
    # A file is reported once it is unchanged between two observations (fx_assets.assets.raw).
    for _ in range(2):
        observe(sources, instance=inst, resources=dict(defs.resources or {}), run_config=QUIET)
    out = {}
    for key in ("raw_trades", "raw_mbp10"):
        records = inst.fetch_observations(dg.AssetKey(key), limit=100).records
        for r in records:
            ev = r.event_log_entry.asset_observation
            out.setdefault(f"{key}[{ev.partition}]", ev.data_version)
    return out


def test_ingest_two_partitions_and_invalidation(market: Path) -> None:
    defs = defs_for(market, last=Q2)
    with dg.instance_for_test() as inst:
        versions = observed_versions(defs, inst)
        assert {
            "raw_trades[2024-01|ES.FUT]",
            "raw_trades[2024-04|ES.FUT]",
            "raw_mbp10[2024-04|ES.FUT]",
        } <= set(versions)
        for q in (Q1, Q2):
            r = materialize(defs, inst, INGEST, q)
            assert r.success
            m = meta(r, "predecoded_trades")
            assert m["action"] == "decoded" and m["records"] > 1000
            sidecar = Path(m["path"])
            assert open_sidecar(sidecar).num_rows == m["records"]
            roll = meta(r, "roll_calendar")
            assert roll["sessions"] >= 60
            assert len(roll["rolls"].records) == 1  # one quarterly roll per quarter
        # A second run reuses the fresh sidecar.
        r = materialize(defs, inst, ["predecoded_trades"], Q2)
        assert meta(r, "predecoded_trades")["action"] == "reused"
        # A touch changes no byte: same data version, the sidecar is reused.
        raw = market / "raw/trades/ES.FUT/ES.FUT_2024-Q2.dbn.zst"
        st = raw.stat()
        os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert observed_versions(defs, inst) == versions
        r = materialize(defs, inst, ["predecoded_trades"], Q2)
        assert meta(r, "predecoded_trades")["action"] == "reused"


def _same_size_same_mtime_edit(raw: Path, offset_in_records: int) -> int:
    """Rewrite ``raw`` uncompressed (the decoder goes by magic, not by name) with one record's
    price changed, then give the file its old size and mtime; returns the new price."""
    from fx_assets.core import dbn

    st = raw.stat()
    h = dbn.read_header(raw)
    body = b"".join(a.tobytes() for a in dbn.iter_records(raw))
    plain = bytearray(h.header_bytes + body)
    pos = h.header_len + offset_in_records + 16  # price of the record starting there (int64 at +16)
    price = int.from_bytes(plain[pos : pos + 8], "little", signed=True) + 250_000_000
    plain[pos : pos + 8] = price.to_bytes(8, "little", signed=True)
    raw.write_bytes(bytes(plain))
    os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns))
    return price


@pytest.mark.parametrize("where", ["inside the first 64 KiB", "after the first 64 KiB"])
def test_same_size_same_mtime_replacement_is_noticed_everywhere(market: Path, where: str) -> None:
    """Found 4 and 7: a re-download with the same size and mtime. Its data version, the sidecar
    and the stage keys all follow the one content hash, so the new bars come from a new sidecar."""
    from fx_assets.core.checksum import hash_file
    from fx_assets.core.sidecar import sidecar_columns

    defs = defs_for(market, last=Q1)
    raw = market / "raw/trades/ES.FUT/ES.FUT_2024-Q1.dbn.zst"
    record = 48 * (10 if where.startswith("inside") else 5000)
    _same_size_same_mtime_edit(raw, record)  # now uncompressed, so that a byte edit stays valid
    with dg.instance_for_test() as inst:
        first = materialize(defs, inst, [*INGEST, "bars"], Q1)
        before = observed_versions(defs, inst)["raw_trades[2024-01|ES.FUT]"]
        st = raw.stat()
        price = _same_size_same_mtime_edit(raw, record)
        assert (raw.stat().st_size, raw.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        assert observed_versions(defs, inst)["raw_trades[2024-01|ES.FUT]"] != before
        r = materialize(defs, inst, [*INGEST, "bars"], Q1)
        side = meta(r, "predecoded_trades")
        assert side["action"] == "rebuilt (source changed)" and side["source_hash"] == hash_file(raw)
        assert sidecar_columns(side["path"], ["price"])["price"][record // 48] == price
        assert meta(r, "bars")["cache_key"] != meta(first, "bars")["cache_key"]
        assert meta(r, "bars").get("action") != "reused"


def test_missing_raw_file_names_partition_and_path(market: Path) -> None:
    (market / "raw/mbp-10/ES.FUT/ES.FUT_2024-Q2.dbn.zst").unlink()
    defs = defs_for(market, last=Q2)
    with dg.instance_for_test() as inst:
        r = materialize(defs, inst, ["predecoded_mbp10"], Q2, raise_on_error=False)
        assert not r.success
        text = str(r.get_step_failure_events()[0].event_specific_data.error)
        assert "2024-Q2|ES.FUT" in text and "ES.FUT_2024-Q2.dbn.zst" in text


def test_features_then_one_training_run(market: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fx_assets.assets.common as asset_common

    released: list[bool] = []
    real = asset_common.release_free_heap
    monkeypatch.setattr(asset_common, "release_free_heap", lambda: released.append(real()))
    defs = defs_for(market, last=Q3, train_quarters=1)
    with dg.instance_for_test() as inst:
        for q in (Q1, Q2, Q3):
            r = materialize(defs, inst, FEATURES, q)
            assert r.success
            bars = meta(r, "bars")
            assert bars["volume_conserved"] is True and bars["bars"] > 500
            assert meta(r, "fxcache")["bars"] > 0
        # Each run's first step handed back the free heap earlier runs left (one process).
        assert len(released) == 3
        assert meta(r, "bar_features")["warmup_bars"] > 0  # Q3 warmed up from Q2
        assert meta(r, "ofi_features")["warmed_up_from_previous_quarter"] is True
        # Cache hit: the same partition again reuses every keyed file.
        again = materialize(defs, inst, ["bars", "bar_features", "ofi_features", "fxcache"], Q3)
        assert all(
            meta(again, a)["action"] == "reused" for a in ("bars", "bar_features", "ofi_features", "fxcache")
        )

        # Both folds (validation 2024-Q2 and 2024-Q3) in ONE run: each quarter uploaded once.
        job = defs.resolve_job_def("train_models")
        r = job.execute_in_process(
            instance=inst,
            resources=dict(defs.resources or {}),
            run_config=QUIET,
            tags={
                "dagster/asset_partition_range_start": "2024-04|ES.FUT",
                "dagster/asset_partition_range_end": "2024-07|ES.FUT",
            },
        )
        assert r.success
        tm = meta(r, "trained_model")
        assert tm["uploads"] == 3
        assert set(tm["uploads_by_quarter"].values()) == {1}
        obs = inst.fetch_observations(dg.AssetKey("trained_model"), limit=10).records
        assert {o.event_log_entry.asset_observation.partition for o in obs} == {
            "2024-04|ES.FUT",
            "2024-07|ES.FUT",
        }
        rep = defs.resolve_job_def("walk_forward").execute_in_process(
            instance=inst, resources=dict(defs.resources or {}), run_config=QUIET
        )
        assert rep.success
        rm = meta(rep, "walk_forward_report")
        assert rm["missing_folds"] == "none"
        assert np.isfinite(float(rm["ES.FUT_sharpe"]))

        # Issue 8.1: the loader's value dtype shapes the model, so a bfloat16 request trains new
        # models instead of reusing the float32 ones; the float32 request then reuses its own.
        from fx_assets.resources.training import DeviceFxCacheLoader

        res = dict(defs.resources or {})
        for dtype, action in (("bfloat16", "| trained |"), ("float32", "| reused |")):
            loader = DeviceFxCacheLoader(storage=res["storage"], pipeline=res["pipeline"], value_dtype=dtype)
            r = job.execute_in_process(
                instance=inst,
                resources={**res, "fxcache_loader": loader},
                run_config=QUIET,
                tags={
                    "dagster/asset_partition_range_start": "2024-04|ES.FUT",
                    "dagster/asset_partition_range_end": "2024-07|ES.FUT",
                },
            )
            assert r.success
            assert meta(r, "trained_model")["folds"].count(action) == 2, (
                dtype,
                meta(r, "trained_model")["folds"],
            )
        assert (market / "reports" / "ES.FUT_walk_forward.png").stat().st_size > 1000

        # Issue 11: a device-memory budget below a fold's size streams each fold from its
        # fxcache files through the same asset; nothing is uploaded, and the budget is in the key.
        streaming = DeviceFxCacheLoader(
            storage=res["storage"],
            pipeline=res["pipeline"],
            device_memory_budget_gib=1e-6,
            stream_block_rows=1024,
        )
        r = job.execute_in_process(
            instance=inst,
            resources={**res, "fxcache_loader": streaming},
            run_config=QUIET,
            tags={
                "dagster/asset_partition_range_start": "2024-04|ES.FUT",
                "dagster/asset_partition_range_end": "2024-07|ES.FUT",
            },
        )
        assert r.success
        tm = meta(r, "trained_model")
        assert tm["uploads"] == 0 and tm["folds"].count("| trained |") == 2, tm["folds"]
        obs = [
            o.event_log_entry.asset_observation
            for o in inst.fetch_observations(dg.AssetKey("trained_model"), limit=2).records
        ]
        for o in obs:
            md = {k: v.value for k, v in o.metadata.items()}
            assert md["fold_rows"] == "stream" and md["stream_blocks"] > 0 and md["stream_h2d_bytes"] > 0, md
            assert md["fold_device_gib"] > md["device_budget_gib"]

        # A partial success is never reported as success: with the 2024-Q3 fold's ranges file gone
        # (deleted by hand), that fold fails inside the run, the step and run fail naming it, and
        # only the fold that finished is recorded as materialized.
        gone = sorted((market / "derived" / "fold_ranges" / "ES.FUT").glob("ES.FUT_2024-Q3.*"))
        assert gone
        for f in gone:
            f.rename(f.with_name(f.name + ".aside"))
        try:
            r = dg.materialize(  # trained_model alone (train_models would rebuild fold_ranges)
                list(defs.assets or []),
                selection=["trained_model"],
                instance=inst,
                resources=res,
                run_config=QUIET,
                raise_on_error=False,
                tags={
                    "dagster/asset_partition_range_start": "2024-04|ES.FUT",
                    "dagster/asset_partition_range_end": "2024-07|ES.FUT",
                },
            )
        finally:
            for f in gone:
                f.with_name(f.name + ".aside").rename(f)
        assert not r.success
        # read from the instance: a failed step's logged events are stored, not yielded to `r`
        mats = inst.all_logs(r.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        assert [e.dagster_event.partition for e in mats if e.dagster_event] == ["2024-04|ES.FUT"]
        (failure,) = [e for e in r.all_events if e.is_step_failure]
        error = failure.step_failure_data.error
        assert error is not None and "1 of 2 fold(s) failed: 2024-Q3 ES.FUT" in error.message


def test_build_features_through_the_multiprocess_executor(
    market: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps in separate processes share nothing but files: the keyed-file hand-off must work."""
    monkeypatch.setenv("FX_DATA_ROOT", str(market))
    monkeypatch.setenv("FX_FIRST_QUARTER", "2024-Q1")
    monkeypatch.setenv("FX_LAST_QUARTER", "2024-Q1")
    from fx_assets_tests import jobs_for_tests

    with dg.instance_for_test() as inst:
        with dg.execute_job(
            dg.reconstructable(jobs_for_tests.build_features_job),
            instance=inst,
            run_config=QUIET,
            tags={
                "dagster/partition/quarter": "2024-01",
                "dagster/partition/symbol": "ES.FUT",
                "dagster/partition": "2024-01|ES.FUT",
            },
        ) as result:
            assert result.success
            mats = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
            assert mats == set(FEATURES)


def test_two_parameter_sets_coexist_on_disk(market: Path) -> None:
    from fx_assets.resources.pipeline import BarsConfig, PipelineConfig

    defs = defs_for(market, last=Q1)
    res = dict(defs.resources or {})
    with dg.instance_for_test() as inst:
        stages = FEATURES
        a = dg.materialize(
            list(defs.assets or []),
            selection=stages,
            partition_key=partition_key(Q1, "ES.FUT"),
            instance=inst,
            resources=res,
            run_config=QUIET,
        )
        res50 = {**res, "pipeline": PipelineConfig(bars=BarsConfig(volume_bar_size=50))}
        b = dg.materialize(
            list(defs.assets or []),
            selection=stages,
            partition_key=partition_key(Q1, "ES.FUT"),
            instance=inst,
            resources=res50,
            run_config=QUIET,
        )
        pa_, pb = Path(meta(a, "fxcache")["path"]), Path(meta(b, "fxcache")["path"])
        assert pa_ != pb and pa_.is_file() and pb.is_file()
        assert meta(b, "bars")["bars"] > 1.5 * meta(a, "bars")["bars"]
        assert len(list((market / "derived/fxcache/ES.FUT").glob("*.fxcache"))) == 2
        # Different configs are different data versions, so Dagster shows downstream as unsynced.
        va = inst.get_latest_materialization_event(dg.AssetKey("fxcache"))
        assert va is not None


@pytest.mark.parametrize("fixture", ["dbn/test_data.mbp-10.v3.dbn.zst", "dbn/test_data.mbp-1.v3.dbn.zst"])
def test_book_file_in_the_trades_folder_fails_naming_file_and_schemas(
    market: Path, dbn_fixtures: Path, fixture: str
) -> None:
    """Found 5: a book file in raw/trades was decoded as trades and a valid fxcache written."""
    raw = market / "raw/trades/ES.FUT/ES.FUT_2024-Q1.dbn.zst"
    shutil.copyfile(dbn_fixtures / fixture, raw)
    defs = defs_for(market, last=Q1)
    with dg.instance_for_test() as inst:
        r = materialize(defs, inst, INGEST, Q1, raise_on_error=False)
        assert not r.success
        text = str(r.get_step_failure_events()[0].event_specific_data.error)
        found = fixture.split(".")[1]
        assert "ES.FUT_2024-Q1.dbn.zst" in text and f"'{found}'" in text and "expected 'trades'" in text
    assert not list((market / "derived/predecoded/trades").rglob("*.arrow"))
    assert not (market / "derived/roll_calendar").exists()


def test_snapshot_row_unit_writes_one_row_per_book_update(market: Path) -> None:
    """``pipeline.fxcache.row_unit: snapshot``: the fxcache asset writes snapshot rows under its
    own key, beside the bar-row file, and ``fx-assets inspect`` shows the row unit, width and
    names."""
    from fx_assets.cli import describe_path
    from fx_assets.core.fxcache import open_fxcache
    from fx_assets.core.snapshot_features import SnapshotFeatureConfig, feature_names
    from fx_assets.resources.pipeline import FxCacheWriteConfig, PipelineConfig

    defs = defs_for(market, last=Q1)
    res = dict(defs.resources or {})
    with dg.instance_for_test() as inst:
        a = materialize(defs, inst, FEATURES, Q1)
        snap = {
            **res,
            "pipeline": PipelineConfig(fxcache=FxCacheWriteConfig(row_unit="snapshot", dtype="bf16")),
        }
        b = dg.materialize(
            list(defs.assets or []),
            selection=["fxcache"],
            partition_key=partition_key(Q1, "ES.FUT"),
            instance=inst,
            resources=snap,
            run_config=QUIET,
        )
        assert b.success
    ma, mb = meta(a, "fxcache"), meta(b, "fxcache")
    assert ma["row_unit"] == "bar" and mb["row_unit"] == "snapshot"
    pa_, pb = Path(ma["path"]), Path(mb["path"])
    assert pa_ != pb and pa_.is_file() and pb.is_file()
    with open_fxcache(pa_) as fa, open_fxcache(pb) as fb:
        assert fa.meta["row_unit"] == "bar" and fb.meta["row_unit"] == "snapshot"
        assert fb.n_bars == mb["rows"] > fa.n_bars  # more book updates than bars
        assert fb.group_names("price") == ["mid", "session", "contract"] and fb.dtype == "bf16"
    desc = describe_path(pb)
    assert desc["row_unit"] == "snapshot" and desc["valid"]
    names = feature_names(SnapshotFeatureConfig())
    assert desc["feature_names"][: len(names)] == names
    assert desc["feature_width"] == len(desc["feature_names"]) > len(names)  # + the bar context


def changes_the_file(fn, path: Path, data: bytes, *, before: bool = False):
    """``fn`` wrapped so that ``path`` gets ``data`` right after it returns (or before it runs):
    a raw file that changes while a step runs."""

    def wrapped(*args, **kwargs):
        if before:
            path.write_bytes(data)
        out = fn(*args, **kwargs)
        if not before:
            path.write_bytes(data)
        return out

    return wrapped


def test_a_fold_whose_raw_data_changes_while_it_trains_is_not_recorded(
    market: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model of data that changed while it trained must not stand as up to date: recorded, its
    materialization would come after its inputs' change, and automation would never retrain it
    (a user's rebuild of the fxcache while the fold trained). The fold fails naming the quarter,
    the run records no materialization of it; run again, it trains on the new data's files. The
    same for the fold's ranges."""
    import fx_assets.assets.training as training
    import fx_assets.core.trainers.mlp as mlp

    defs = defs_for(market, last=Q2, train_quarters=1)
    raw_q1 = market / "raw" / "trades" / "ES.FUT" / "ES.FUT_2024-Q1.dbn.zst"
    original = raw_q1.read_bytes()
    with dg.instance_for_test() as inst:
        for q in (Q1, Q2):
            assert materialize(defs, inst, FEATURES, q).success
        with monkeypatch.context() as m:
            m.setattr(
                training,
                "fold_range",
                changes_the_file(training.fold_range, raw_q1, original + EMPTY_ZSTD_FRAME),
            )
            r = materialize(defs, inst, ["fold_ranges"], Q2, raise_on_error=False)
        assert "2024-Q2|ES.FUT: the raw data of its quarters changed while its fold ranges" in step_failure(r)
        assert not inst.all_logs(r.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        raw_q1.write_bytes(original)
        with monkeypatch.context() as m:
            m.setattr(mlp, "train_mlp", changes_the_file(mlp.train_mlp, raw_q1, original + EMPTY_ZSTD_FRAME))
            r = materialize(defs, inst, ["fold_ranges", "trained_model"], Q2, raise_on_error=False)
        message = step_failure(r)
        assert (
            "the raw data of 2024-Q1|ES.FUT (now " in message and "changed while this fold trained" in message
        )
        mats = inst.all_logs(r.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        assert [e.dagster_event.asset_key.to_user_string() for e in mats if e.dagster_event] == [
            "fold_ranges"
        ]
        # the original data back: the same fold trains and is recorded
        raw_q1.write_bytes(original)
        r = materialize(defs, inst, ["trained_model"], Q2)
        assert r.success and meta(r, "trained_model")["folds"].count("| reused |") == 1


def test_a_stage_whose_raw_data_changes_while_it_builds_is_not_recorded(
    market: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a feature stage (built or reused): its file is named by the raw files'
    contents hashed when the step started; if they changed before the step ends, recording it
    would mark the partition up to date with a file of the old data, and the stages after it
    would find no file for the current sources. The step fails naming the partition and stage.
    (bar_features reads no sidecar, whose own check catches a change in the stages that do.)"""
    import fx_assets.assets.common as common
    import fx_assets.assets.features as features

    defs = defs_for(market, last=Q1)
    raw = market / "raw" / "trades" / "ES.FUT" / "ES.FUT_2024-Q1.dbn.zst"
    original = raw.read_bytes()
    changed = original + EMPTY_ZSTD_FRAME
    with dg.instance_for_test() as inst:
        assert materialize(defs, inst, [*INGEST, "bars"], Q1).success
        with monkeypatch.context() as m:
            m.setattr(
                features,
                "quarter_bar_features",
                changes_the_file(features.quarter_bar_features, raw, changed),
            )
            r = materialize(defs, inst, ["bar_features"], Q1, raise_on_error=False)
        assert "2024-Q1|ES.FUT: its raw data changed while bar_features was built" in step_failure(r)
        assert not inst.all_logs(r.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        # the original bytes back: the file built above is the one for them, reused
        raw.write_bytes(original)
        assert meta(materialize(defs, inst, ["bar_features"], Q1), "bar_features")["action"] == "reused"
        # a cache hit whose sources change before it is recorded fails the same way (here while
        # the existing file is verified)
        with monkeypatch.context() as m:
            m.setattr(common, "verify_once", changes_the_file(common.verify_once, raw, changed, before=True))
            r = materialize(defs, inst, ["bar_features"], Q1, raise_on_error=False)
        raw.write_bytes(original)
        assert "its raw data changed while bar_features was built" in step_failure(r)
