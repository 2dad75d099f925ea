"""Sensors: new raw quarters request feature runs in order; a new fxcache requests its folds."""

import datetime as dt
import os
import shutil
from pathlib import Path

import dagster as dg

from fx_assets.definitions import build_definitions
from fx_assets.settings import ProjectSettings


def defs_for(root: Path) -> dg.Definitions:
    return build_definitions(
        ProjectSettings(
            data_root=root,
            first_quarter=dt.date(2024, 1, 1),
            last_quarter=dt.date(2024, 10, 1),
            train_quarters=1,
        )
    )


def test_raw_data_sensor_requests_earliest_pending_quarter(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = defs_for(root)
    sensor = defs.resolve_sensor_def("raw_data_sensor")
    with dg.instance_for_test() as inst:
        cursor = None
        got = []
        for _ in range(4):
            ctx = dg.build_sensor_context(instance=inst, cursor=cursor, definitions=defs)
            res = sensor(ctx)
            if isinstance(res, dg.SkipReason):
                break
            got += [r.partition_key for r in res.run_requests]
            cursor = res.cursor
        assert got == ["2024-01|ES.FUT", "2024-04|ES.FUT", "2024-07|ES.FUT"]
        ctx = dg.build_sensor_context(instance=inst, cursor=cursor, definitions=defs)
        assert isinstance(sensor(ctx), dg.SkipReason)
        # a touch changes no byte: nothing to do
        f = root / "raw/trades/ES.FUT/ES.FUT_2024-Q2.dbn.zst"
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert isinstance(
            sensor(dg.build_sensor_context(instance=inst, cursor=cursor, definitions=defs)), dg.SkipReason
        )
        # a replaced file (same size and mtime, one byte changed) is requested again
        data = bytearray(f.read_bytes())
        data[-1] ^= 1
        f.write_bytes(bytes(data))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        res = sensor(dg.build_sensor_context(instance=inst, cursor=cursor, definitions=defs))
        assert [r.partition_key for r in res.run_requests] == ["2024-04|ES.FUT"]


def test_retrain_sensor_targets_folds_using_the_quarter(tmp_path: Path) -> None:
    defs = defs_for(tmp_path)
    sensor = defs.resolve_sensor_def("retrain_sensor")
    with dg.instance_for_test() as inst:
        inst.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="fxcache", partition="2024-04|ES.FUT")
        )
        res = sensor.evaluate_tick(dg.build_sensor_context(instance=inst, definitions=defs))
        # 2024-Q2 is validated by fold 2024-Q2 and trains fold 2024-Q3 (train_quarters=1).
        assert sorted(r.partition_key for r in res.run_requests) == ["2024-04|ES.FUT", "2024-07|ES.FUT"]
