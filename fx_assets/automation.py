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
  progress (it reports the folds that exist and names the missing ones).

An up-to-date partition is never requested again: only new data versions or code versions
trigger, not an empty cursor (the first evaluation of a fresh sensor requests nothing).
"""

from __future__ import annotations

import os

import dagster as dg

AC = dg.AutomationCondition

EAGER_ALL = AC.eager().without(AC.in_latest_time_window())
CHAIN = EAGER_ALL.replace("any_deps_updated", AC.any_deps_updated() | AC.code_version_changed())
REPORT = (
    AC.any_deps_updated().since_last_handled() & ~AC.any_deps_in_progress() & ~AC.in_progress()
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
