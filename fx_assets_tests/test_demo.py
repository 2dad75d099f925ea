"""``fx-assets demo`` on a tiny market: every run it records belongs to one of the project's
named jobs, so the UI lists them there (not under ``__ephemeral_asset_job__``)."""

import io
from pathlib import Path

import dagster as dg
import pytest
from rich.console import Console

from fx_assets.demo import run_demo


def test_demo_runs_appear_under_the_named_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for k, v in {
        "DAGSTER_HOME": str(home),
        "FX_DATA_ROOT": str(tmp_path / "data"),
        "FX_SYMBOLS": "ES.FUT",
        "FX_FIRST_QUARTER": "2024-Q1",
        "FX_LAST_QUARTER": "2024-Q2",
        "FX_TRAIN_QUARTERS": "1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("FX_CONFIG", raising=False)
    out = io.StringIO()
    assert run_demo(scale=0.004, seed=11, signal=1.0, console=Console(file=out)) == 0, out.getvalue()
    with dg.DagsterInstance.from_config(str(home)) as inst:
        jobs = [r.job_name for r in inst.get_runs()]
    assert sorted(set(jobs)) == ["build_features", "observe_raw", "train_models", "walk_forward"], jobs
    assert jobs.count("build_features") == 2  # one run per partition
