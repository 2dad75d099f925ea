"""Shared fixtures: the real Databento fixture folder and small synthetic markets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The threaded kernel paths split their input over numba's threads; on a one-CPU machine numba
# starts with one thread and those paths would go untested. Two threads are forced there (before
# numba is imported); an explicit NUMBA_NUM_THREADS wins.
_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
if _cpus < 2:
    os.environ.setdefault("NUMBA_NUM_THREADS", "2")

REPO = Path(__file__).resolve().parents[1]


def fixtures_dir() -> Path:
    env = os.environ.get("FX_FIXTURES")
    path = Path(env) if env else REPO.parent / "shared" / "fixtures" / "dbn"
    return path


@pytest.fixture(scope="session")
def dbn_fixtures() -> Path:
    path = fixtures_dir()
    if not path.is_dir():
        pytest.fail(f"Databento fixtures not found at {path} (set FX_FIXTURES)")
    return path


def init_dagster_home(home: Path) -> Path:
    """Create and migrate the Dagster instance at ``home`` once, in this process, before anything
    is launched in parallel on it (two first users of a fresh SQLite instance race in Dagster's
    own migration and leave it broken). Uses the project's dagster.yaml settings."""
    import dagster as dg

    home.mkdir(parents=True, exist_ok=True)
    # an absolute base_dir: a relative one is resolved against each process's working directory
    (home / "dagster.yaml").write_text(f"storage:\n  sqlite:\n    base_dir: {home / 'storage'}\n")
    with dg.DagsterInstance.from_config(str(home)):
        pass
    return home


def make_market(
    root: Path, quarters: str, *, scale: float = 0.004, seed: int = 11, signal: float = 1.0
) -> Path:
    """Write a tiny synthetic market under ``root`` (raw/ layout) and return ``root``."""
    from fx_assets.core.calendar import quarter_range
    from fx_assets.core.synth import SynthConfig, generate_market

    generate_market(
        root, SynthConfig(quarters=tuple(quarter_range(quarters)), scale=scale, seed=seed, signal=signal)
    )
    return root


@pytest.fixture(scope="session")
def market3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three quarters (2024-Q1..Q3) of a tiny ES market with a planted signal (read-only: copy
    it before changing files)."""
    return make_market(tmp_path_factory.mktemp("market3"), "2024-Q1:2024-Q3")
