"""Sensors: build features when a quarter's raw files land or change, retrain when an fxcache does.

- ``raw_data_sensor`` watches ``raw/{trades,mbp-10}/SYMBOL/`` for every partition of the
  feature assets. When both files of a partition exist and their identity (size, content hash,
  recorded beside the sidecars and re-hashed only when the stat moved) differs
  from the cursor, it requests a ``build_features`` run for that partition. A quarter's features
  warm up from the previous quarter's bars, so per symbol it requests only the earliest pending
  quarter per tick; the next one follows on a later tick, once its predecessor is done.
- ``retrain_sensor`` fires on each new ``fxcache`` materialization and requests ``train_models``
  runs for the folds whose window contains that quarter (the fold validated on it and the ones
  that train on it), so a backfilled quarter adds its fold and refreshes the folds after it.
"""

import json

import dagster as dg

from fx_assets.assets.raw import file_identity
from fx_assets.core.calendar import next_quarter
from fx_assets.partitions import parse_partition_key, partition_key
from fx_assets.resources.storage import FxStorage


def make_sensors(
    partitions_def: dg.MultiPartitionsDefinition,
    training_partitions: dg.MultiPartitionsDefinition | None,
    train_quarters: int,
    storage: FxStorage,
) -> list[dg.SensorDefinition]:
    @dg.sensor(
        name="raw_data_sensor",
        job_name="build_features",
        minimum_interval_seconds=60,
        description="Requests build_features for a partition when its raw trades and MBP-10 files appear or change.",
    )
    def raw_data_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        pending: dict[str, list[tuple[str, str]]] = {}
        for key in sorted(
            partitions_def.get_partition_keys(dynamic_partitions_store=context.instance), key=str
        ):
            part = parse_partition_key(key)
            files = [storage.raw_file(s, part.symbol, part.quarter) for s in ("trades", "mbp-10")]
            if not all(f.is_file() for f in files):
                continue
            records = [storage.layout.sidecar_dir(s, part.symbol) for s in ("trades", "mbp-10")]
            ident = "+".join(file_identity(f, r) for f, r in zip(files, records, strict=True))
            if seen.get(str(key)) != ident:
                pending.setdefault(part.symbol, []).append((str(key), ident))
        if not pending:
            return dg.SkipReason("no new or changed raw files")
        requests = []
        for symbol, items in pending.items():
            first, first_ident = items[0]  # earliest quarter first: the next one warms up from it
            seen[first] = first_ident
            requests.append(dg.RunRequest(partition_key=first, run_key=f"{first}:{first_ident}"))
            context.log.info(
                f"{symbol}: requesting build_features for {first} ({len(items) - 1} more pending)"
            )
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(seen, sort_keys=True))

    sensors = [raw_data_sensor]
    if training_partitions is not None:
        train_keys = {str(k) for k in training_partitions.get_partition_keys()}

        @dg.asset_sensor(
            name="retrain_sensor",
            asset_key=dg.AssetKey("fxcache"),
            job_name="train_models",
            description="Requests train_models for every fold whose window contains a newly materialized fxcache quarter.",
        )
        def retrain_sensor(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
            dagster_event = asset_event.dagster_event
            pk = dagster_event.partition if dagster_event else None
            if pk is None:
                return dg.SkipReason("fxcache materialization without a partition")
            part = parse_partition_key(pk)
            q = part.quarter
            folds = []
            for _ in range(train_quarters + 1):
                key = str(partition_key(q, part.symbol))
                if key in train_keys:
                    folds.append(key)
                q = next_quarter(q)
            if not folds:
                return dg.SkipReason(f"{part.label}: no fold uses this quarter yet")
            return [
                dg.RunRequest(partition_key=k, run_key=f"{k}:{asset_event.run_id}:{asset_event.timestamp}")
                for k in folds
            ]

        sensors.append(retrain_sensor)
    return sensors
