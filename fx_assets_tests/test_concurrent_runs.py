"""Two runs of the same partition at once (issue 8, Found 8): every file is built once, the
other run waits on its build lock and reuses it; both succeed."""

from __future__ import annotations

import multiprocessing as mp
import shutil
from pathlib import Path

from fx_assets_tests.test_pipeline import INGEST, Q1


def _run(root: str, barrier: object, out: object) -> None:
    import dagster as dg

    from fx_assets.partitions import partition_key
    from fx_assets_tests.test_pipeline import QUIET, defs_for, meta

    defs = defs_for(Path(root), last=Q1)
    with dg.instance_for_test() as inst:
        barrier.wait()  # type: ignore[attr-defined]
        r = dg.materialize(
            list(defs.assets or []),
            selection=[*INGEST, "bars"],
            partition_key=partition_key(Q1, "ES.FUT"),
            instance=inst,
            resources=dict(defs.resources or {}),
            run_config=QUIET,
        )
        out.put(  # type: ignore[attr-defined]
            {
                a: str(meta(r, a).get("action", "built"))
                for a in ("predecoded_trades", "roll_calendar", "bars")
            }
        )


def test_two_concurrent_runs_build_each_file_once(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_run, args=(str(root), barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    trades = sorted(r["predecoded_trades"] for r in results)
    assert trades == ["decoded", "reused"], results
    for stage in ("roll_calendar", "bars"):
        assert sorted(r[stage] for r in results) == ["built", "reused"], results
