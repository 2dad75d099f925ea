"""Dagster instance set-up before parallel launches (issue 8, Found 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fx_assets_tests.conftest import REPO, init_dagster_home

PROBE = "import dagster as dg; i = dg.DagsterInstance.get(); print(len(i.get_runs())); i.dispose()"


@pytest.mark.slow
def test_parallel_first_users_of_an_initialised_home_succeed(tmp_path: Path) -> None:
    home = init_dagster_home(tmp_path / "home")
    env = dict(os.environ, DAGSTER_HOME=str(home), PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["0", "0", "0"]


def test_makefile_initialises_the_instance_before_parallel_targets() -> None:
    text = (REPO / "Makefile").read_text()
    assert "DagsterInstance.get()" in text
    for target in ("demo", "test", "ui"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{target}:"))
        assert "instance" in line.split(":", 1)[1].split(), line
