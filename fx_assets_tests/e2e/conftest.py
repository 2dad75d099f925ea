"""Fixtures for the e2e suite: a running ``dagster dev`` on a temporary home and data root.

Every test under this folder is marked ``e2e`` (deselected by default; ``make test-e2e``).

- ``dagster_dev_factory``: ``start(**kw) -> DagsterDev`` (arguments of
  :func:`fx_assets_tests.e2e.harness.start_dagster_dev`), each stopped at the end of the test.
- ``e2e_dagster``: one started instance shared by a test module (4 quarters of ES, default
  settings), for suites whose tests build on each other in file order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fx_assets_tests.e2e.harness import DagsterDev, start_dagster_dev


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def dagster_dev_factory(tmp_path: Path) -> Iterator[Callable[..., DagsterDev]]:
    started: list[DagsterDev] = []

    def start(**kw: Any) -> DagsterDev:
        dev = start_dagster_dev(tmp_path / f"dev{len(started)}", **kw)
        started.append(dev)
        return dev

    yield start
    for dev in started:
        dev.stop()


@pytest.fixture(scope="module")
def e2e_dagster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    dev = start_dagster_dev(tmp_path_factory.mktemp("e2e"))
    yield dev
    dev.stop()
