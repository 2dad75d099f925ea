"""benchmarks/common.py: the round summaries and the A B A B alternation the benchmarks rely on."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _common() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_common_under_test", REPO / "benchmarks" / "common.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


common = _common()


def test_rounds_summary() -> None:
    assert common.rounds_summary([3.0, 1.0, 2.0, 10.0]) == {
        "min": 1.0,
        "median": 2.5,
        "max": 10.0,
        "rounds": 4,
    }
    with pytest.raises(ValueError):
        common.rounds_summary([])


def test_alternate_runs_a_b_a_b_after_the_warmup() -> None:
    calls: list[str] = []
    seq = iter(range(100))

    def make(name: str) -> Callable[[], dict[str, float]]:
        def fn() -> dict[str, float]:
            calls.append(name)
            return {"wall_s": float(next(seq))}

        return fn

    out = common.alternate({"a": make("a"), "b": make("b")}, rounds=3, warmup=1)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three rounds, interleaved
    # The warm-up values (0, 1) are not in the figures; a got 2, 4, 6 and b 3, 5, 7.
    assert out["a"]["wall_s"] == {"min": 2.0, "median": 4.0, "max": 6.0, "rounds": 3}
    assert out["b"]["wall_s"] == {"min": 3.0, "median": 5.0, "max": 7.0, "rounds": 3}


def test_versions_and_machine_name_the_commit_and_the_cpu() -> None:
    v = common.versions({"peer": "1.2.3"})
    assert v["peers"] == {"peer": "1.2.3"} and v["fx_assets_commit"]
    assert {"python", "numpy", "numba", "pyarrow"} <= set(v)
    m = common.machine()
    assert m["cpu_model"] and m["cores_usable"] >= 1 and m["mem_total_gib"] > 0
