"""Feature values must not depend on the CPU that computed them (core.detmath).

NumPy picks float64 transcendental kernels by the CPU's SIMD level, and they differ in the last
bit: golden digests written on an AVX-512 machine failed on an AVX2 one (``log_duration``). The
feature and label modules therefore call ``core.detmath`` (the C library's scalar functions), and
this file checks both halves: detmath equals Python's ``math`` element by element, and no module
that computes cached or training values calls a NumPy transcendental function.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from fx_assets.core import detmath

CORE = Path(__file__).resolve().parents[2] / "fx_assets" / "core"
# NumPy functions whose float64 results vary with the SIMD level NumPy dispatches to.
CPU_DEPENDENT = {
    "log", "log1p", "log2", "log10", "exp", "exp2", "expm1", "sin", "cos", "tan", "arcsin", "arccos",
    "arctan", "arctan2", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "power", "cbrt",
    "float_power", "logaddexp", "logaddexp2", "hypot",
}  # fmt: skip
# What is cached or trained on: the feature stages, the fxcache and the labels. (Reports,
# metrics and the synthetic market generator are outside: they write no cached feature value.)
GUARDED = (
    "active_contract.py", "bar_features.py", "bar_rows.py", "bars.py", "book.py", "calendar.py",
    "fxcache.py", "labels.py", "mid_asof.py", "ofi.py", "ofi_warmup.py", "roll.py", "sidecar.py",
    "snapshot_features.py", "snapshot_labels.py", "snapshot_rows.py", "tables.py",
)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "ref", "lo", "hi"),
    [
        ("log", math.log, 1e-300, 1e12),
        ("log1p", math.log1p, -0.999, 1e12),
        ("sin", math.sin, -1e4, 1e4),
        ("cos", math.cos, -1e4, 1e4),
    ],
)
def test_each_function_equals_the_scalar_c_library_bit_for_bit(name: str, ref, lo: float, hi: float) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(lo, hi, 20_000), np.exp(rng.uniform(-30, 25, 20_000))])
    x = x[(x >= lo) & (x <= hi)]
    got = getattr(detmath, name)(x)
    want = np.array([ref(float(v)) for v in x])
    assert got.view(np.int64).tolist() == want.view(np.int64).tolist()


def test_out_argument_and_shape_checks() -> None:
    x = np.linspace(1.0, 2.0, 7)
    out = np.empty(7)
    assert detmath.log(x, out=out) is out
    with pytest.raises(ValueError, match="1-D"):
        detmath.log(np.ones((2, 2)))
    with pytest.raises(ValueError, match="out must be float64"):
        detmath.log(x, out=np.empty(6))


def cpu_dependent_calls(source: str) -> list[str]:
    """``np.<f>(...)`` / ``numpy.<f>(...)`` calls of a CPU-dependent function in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name) and base.id in ("np", "numpy") and node.func.attr in CPU_DEPENDENT:
                found.append(f"line {node.lineno}: np.{node.func.attr}")
    return found


def test_the_guard_sees_a_numpy_call() -> None:
    assert cpu_dependent_calls("import numpy as np\ny = np.log1p(x) + np.sqrt(x)\n") == ["line 2: np.log1p"]


@pytest.mark.parametrize("module", GUARDED)
def test_no_cpu_dependent_numpy_function_in_cached_values(module: str) -> None:
    calls = cpu_dependent_calls((CORE / module).read_text())
    assert not calls, f"fx_assets/core/{module} calls {calls}: use fx_assets.core.detmath"
