"""``raw_files_sensor``: observe the raw sources whenever the raw folders change.

Declarative automation (:mod:`fx_assets.automation`) propagates new data from the raw
observations down to the report; what no condition can see is a file appearing on disk, so
this sensor watches ``raw/{trades,mbp-10}/SYMBOL/`` (names, sizes, mtimes) and the set of
quarter partitions (it grows with the clock). When that listing differs from the one at its
last request it launches an ``observe_raw`` run, and one more at the next tick to confirm: the
observation reports a file only once it is unchanged between two observations
(:mod:`fx_assets.assets.raw`). The cursor holds the listing digest, so an unchanged folder
launches nothing, and switching the sensor on after a demo launches one observation that finds
the same data versions (nothing downstream is requested).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dagster as dg

from fx_assets.assets.raw import SCHEMAS
from fx_assets.automation import interval_seconds
from fx_assets.resources.storage import FxStorage

IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def raw_listing(root: Path, symbols: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every raw archive of the configured symbols."""
    out = []
    for schema in SCHEMAS:
        for symbol in symbols:
            folder = root / "raw" / schema / symbol
            if not folder.is_dir():
                continue
            for f in sorted(folder.glob("*.dbn.zst")):
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                out.append((str(f.relative_to(root)), st.st_size, st.st_mtime_ns))
    return out


def make_sensors(
    partitions_def: dg.MultiPartitionsDefinition, symbols: tuple[str, ...], storage: FxStorage
) -> list[dg.SensorDefinition]:
    @dg.sensor(
        name="raw_files_sensor",
        job_name="observe_raw",
        minimum_interval_seconds=interval_seconds("FX_RAW_POLL_S", 30),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Observes raw_trades and raw_mbp10 when files in the raw folders appear or change.",
    )
    def raw_files_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {}
        keys = [str(k) for k in partitions_def.get_partition_keys(dynamic_partitions_store=context.instance)]
        listing = raw_listing(storage.layout.root, symbols)
        digest = hashlib.sha256(json.dumps([keys, listing]).encode()).hexdigest()[:24]
        if cursor.get("digest") == digest and cursor.get("confirmed"):
            return dg.SkipReason(f"raw folders unchanged ({len(listing)} files)")
        confirming = cursor.get("digest") == digest
        busy = context.instance.get_runs(dg.RunsFilter(job_name="observe_raw", statuses=IN_PROGRESS), limit=1)
        if busy:
            # The observation state is per observation: never run two at once.
            return dg.SkipReason(f"observation {busy[0].run_id} still in progress")
        context.log.info(
            f"{'confirming' if confirming else 'raw folders changed'}: observing {len(listing)} files"
        )
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"{digest}:{'confirm' if confirming else 'seen'}")],
            cursor=json.dumps({"digest": digest, "confirmed": confirming}),
        )

    return [raw_files_sensor]
