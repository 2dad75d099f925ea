"""Shared fixtures: the real Databento fixture folder and small synthetic markets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
