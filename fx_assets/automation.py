"""Declarative automation: the conditions that make each asset rebuild by itself, and the sensor
that evaluates them (``fx_automation``, RUNNING by default).

- Feature chain (7 stages): ``CHAIN`` — eager over **every** quarter (not only the latest time
  window): requested when a dependency's data version changed (a re-observed raw file with new
  content, a rebuilt upstream stage) or the asset's code version changed, never while a
  dependency partition is missing (an unobserved raw partition counts as missing: a quarter
  without both stable files is never requested) or in progress.
- ``fold_ranges`` / ``trained_model``: ``EAGER_ALL`` — a fold is retrained when any fxcache
  quarter of its window has a new materialization, once every quarter of the window exists.
- ``walk_forward_report``: ``REPORT`` — refreshed after any fold changed, once no fold is in
  progress or requested (it reports the folds that exist and names the missing ones).
- The report and the folds never run at the same time under automation: ``trained_model`` uses
  ``FOLD`` (``EAGER_ALL`` while the report is not in progress). Why: ``since_last_handled``
  resets on the target's own materialization, and when that lands between the same two ticks as
  a dependency's (a fold that trained while the report ran), Dagster 1.13 drops the dependency's
  update (``any_deps_updated`` carries no timing through its ``&``, so the reset wins): the
  report would never show that fold. Mutual exclusion keeps the two events on different ticks.

The feature chain and the folds also wait until every partition of every dependency has passed
its blocking asset checks (:mod:`fx_assets.assets.checks`): a sidecar that does not match its
source, bars that lose volume or a failed causality spot-check stop the data from spreading.

An up-to-date partition is never requested again: only new data versions or code versions
trigger, not an empty cursor (the first evaluation of a fresh sensor requests nothing).
"""

from __future__ import annotations

import os

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

EAGER = AC.eager().without(AC.in_latest_time_window())
EAGER_ALL = EAGER & BLOCKING_CHECKS_PASSED
CHAIN = EAGER.replace("any_deps_updated", AC.any_deps_updated() | AC.code_version_changed()) & (
    BLOCKING_CHECKS_PASSED
)
REPORT_KEY = "walk_forward_report"
FOLD = EAGER_ALL & ~AC.asset_matches(REPORT_KEY, AC.in_progress()).with_label("report_in_progress")
REPORT = (
    AC.any_deps_updated().since_last_handled()
    & ~AC.any_deps_in_progress()
    & ~AC.any_deps_match(AC.will_be_requested()).with_label("any_fold_requested")
    & ~AC.in_progress()
).with_label("any_fold_updated")


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
