"""Declarative automation: the conditions that make each asset rebuild by itself, and the sensor
that evaluates them (``fx_automation``, RUNNING by default).

- Feature chain (7 stages): ``CHAIN`` — eager over **every** quarter (not only the latest time
  window): requested when a dependency's data version changed (a re-observed raw file with new
  content, a rebuilt upstream stage) or the asset's code version changed, never while a
  dependency partition is missing (an unobserved raw partition counts as missing: a quarter
  without both stable files is never requested) or in progress. A dependency update between
  the tick that requested a partition and the next one is not reset with the request
  (``HANDLED``): a step that failed because its raw files changed under it runs again.
- ``fold_ranges`` / ``trained_model``: ``EAGER_ALL`` — a fold is retrained when any fxcache
  quarter of its window has a new materialization, once every quarter of the window exists.
- ``walk_forward_report``: ``REPORT`` — refreshed after any fold changed, once no fold, and no
  input of a fold, is in progress or requested on the same tick (it reports the folds that exist
  and names the missing ones). A fold that lands while the report runs (a user's fold run, or a
  launch that lags its tick) brings another report: ``FOLD_UPDATE_UNREPORTED``.
- An asset is never requested while an asset that reads it is in progress
  (:func:`guard_readers`, applied to every automated asset from the graph's own edges). Why:
  ``since_last_handled`` resets on the target's own materialization, and when that lands between
  the same two ticks as a dependency's, Dagster 1.13 drops the dependency's update
  (``any_deps_updated`` carries no timing through its ``&``, so the reset wins). A fold that
  trained while the report ran was never reported (CI saw it); an fxcache rebuilt while a fold
  of its window trained would leave that fold stale for good. A reader is itself never requested
  while what it reads is in progress, so the two events always fall on different ticks.

The feature chain and the folds also wait until every partition of every dependency has passed
its blocking asset checks (:mod:`fx_assets.assets.checks`): a sidecar that does not match its
source, bars that lose volume or a failed causality spot-check stop the data from spreading.

An up-to-date partition is never requested again: only new data versions or code versions
trigger, not an empty cursor (the first evaluation of a fresh sensor requests nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg

AC = dg.AutomationCondition

#: For automation conditions (``AC.eager() & BLOCKING_CHECKS_PASSED``): every partition of every
#: dependency has passed its blocking checks, or is requested together with them on this tick.
#: Dagster's ``AC.all_deps_blocking_checks_passed()`` counts a dependency as passed when *any* of
#: its mapped partitions passed, so through the previous-quarter mapping of ``bar_features`` /
#: ``ofi_features`` / ``roll_calendar`` the previous quarter's good partition masks a failed check
#: of this quarter's (tested in Dagster 1.13.27).
BLOCKING_CHECKS_PASSED = ~AC.any_deps_match(
    AC.any_checks_match(~(AC.check_passed() | AC.will_be_requested()), blocking_only=True)
).with_label("all_dep_partitions_passed_blocking_checks")

#: A request on a tick that sees no dependency update since the previous one: the reset of both
#: ``HANDLED`` and ``FOLD_UPDATE_UNREPORTED``.
REQUESTED_WITHOUT_DEP_UPDATE = (AC.newly_requested() & ~AC.any_deps_updated()).with_label(
    "requested_with_no_dep_update_since"
)
#: When an eager asset's trigger resets: Dagster's ``handled`` (requested, updated, or the first
#: evaluation), except that the tick after a request does not reset when a dependency updated
#: since that request. Without the exception, a dependency update that lands between the tick
#: that requested a partition and the next one was swallowed with the request: a stage whose
#: raw files changed while it ran failed (``StageIO.check_current``), the new files'
#: observation landed before the next tick, and the partition waited for a user. A dependency
#: update by a run that also targeted the asset is not an update here (``any_deps_updated``
#: ignores those), so a step failing after an upstream step of its own run is not retried.
HANDLED = (REQUESTED_WITHOUT_DEP_UPDATE | AC.newly_updated() | AC.initial_evaluation()).with_label(
    "handled_unless_a_dep_updated_since_the_request"
)
EAGER = AC.eager().without(AC.in_latest_time_window()).replace("handled", HANDLED)
EAGER_ALL = EAGER & BLOCKING_CHECKS_PASSED
CHAIN = EAGER.replace("any_deps_updated", AC.any_deps_updated() | AC.code_version_changed()) & (
    BLOCKING_CHECKS_PASSED
)
#: "A fold changed after the report's run could have read it": set by a fold's update, cleared
#: only when the report is requested on a tick that sees no fold update. Not
#: ``since_last_handled``: its reset on the report's own materialization dropped a fold that
#: landed while the report ran (the report reads the folds when its run starts), on whichever
#: tick the two fell; nor a request on a tick whose predecessor saw a fold land (that report's
#: run may have started before the fold). Cost: a report made by hand is redone once by the
#: sensor when a fold changed since the sensor last requested one.
FOLD_UPDATE_UNREPORTED = (
    AC.any_deps_updated()
    .since(REQUESTED_WITHOUT_DEP_UPDATE | AC.initial_evaluation())
    .with_label("a_fold_updated_after_the_last_report_request")
)
REPORT = (
    FOLD_UPDATE_UNREPORTED
    & ~AC.any_deps_in_progress()
    & ~AC.any_deps_match(AC.will_be_requested()).with_label("any_fold_requested")
    # nor while a fold's inputs (its fxcache quarters, its ranges) are being built or requested:
    # that fold is requested on a later tick, and a report requested now would finish just
    # before it (CI: report and the new quarter's fold launched 1.8 s apart, the fold never reported)
    & ~AC.any_deps_match(AC.any_deps_in_progress() | AC.any_deps_match(AC.will_be_requested())).with_label(
        "a_fold_input_in_progress"
    )
    & ~AC.in_progress()
).with_label("any_fold_updated")


def readers_in_progress(readers: Iterable[str]) -> dg.AutomationCondition:
    """True for a partition that a partition of one of ``readers`` (assets that depend on it)
    reads while that partition is in progress (the dependency's mapping, both directions)."""
    conds = [AC.asset_matches(r, AC.in_progress()) for r in sorted(readers)]
    out = conds[0]
    for c in conds[1:]:
        out = out | c
    return out.with_label("a_reader_in_progress")


def guard_readers(assets: Sequence[Any]) -> list[Any]:
    """``assets`` with ``& ~readers_in_progress(...)`` added to the condition of every automated
    asset that automated assets read (readers found from the assets' declared dependencies, so a
    new edge is covered without listing it)."""
    readers: dict[dg.AssetKey, set[str]] = {}
    for a in assets:
        for spec in getattr(a, "specs", ()):
            if spec.automation_condition is None:
                continue
            for dep in spec.deps:
                readers.setdefault(dep.asset_key, set()).add(spec.key.to_user_string())

    def guard(spec: dg.AssetSpec) -> dg.AssetSpec:
        cond, by = spec.automation_condition, readers.get(spec.key)
        if cond is None or not by:
            return spec
        return spec.replace_attributes(automation_condition=cond & ~readers_in_progress(by))

    return list(dg.map_asset_specs(guard, assets))


def interval_seconds(var: str, default: int) -> int:
    """A sensor interval from the environment (seconds, ≥ 1)."""
    text = os.environ.get(var, "")
    try:
        value = int(text) if text else default
    except ValueError as exc:
        raise ValueError(f"{var} must be a whole number of seconds, got {text!r}") from exc
    if value < 1:
        raise ValueError(f"{var} must be at least 1 second, got {value}")
    return value


def automation_sensor() -> dg.AutomationConditionSensorDefinition:
    # emit_backfills=False: one run per partition key holding every asset requested for it (a
    # backfill would split the chain into single-asset runs).
    return dg.AutomationConditionSensorDefinition(
        "fx_automation",
        target=dg.AssetSelection.all(),
        default_status=dg.DefaultSensorStatus.RUNNING,
        emit_backfills=False,
        minimum_interval_seconds=interval_seconds("FX_AUTOMATION_INTERVAL_S", 30),
        description="Raw data → feature chain → folds → report, as data versions change.",
    )
