"""numba's BLAS probe is deferred (core/numba_startup.py): a process's first kernel no longer
imports scipy.linalg, and a kernel that does use BLAS still gets numba's full check and a right
answer. Each case runs in a fresh interpreter (the hook acts once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

FIRST_KERNEL = """
import json, sys
import numpy as np
import fx_assets
from fx_assets.core.fxcache import _first_decrease_nb
assert _first_decrease_nb(np.array([1, 2, 1], dtype=np.int64)) == 2
import numba.np.arraymath as am, numba.np.linalg as nl
from fx_assets.core.numba_startup import _DeferBlasProbe
state = {
    "scipy_linalg": "scipy.linalg" in sys.modules,
    "have_blas": bool(am._HAVE_BLAS),
    "probe_restored": am.ensure_blas is nl.ensure_blas and nl.ensure_blas.__module__ == "numba.np.linalg",
    "hook_left": any(isinstance(f, _DeferBlasProbe) for f in sys.meta_path),
}
"""


def _run(code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + "\nprint(json.dumps(state))"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_kernel_of_a_process_does_not_import_scipy_linalg() -> None:
    state = _run(FIRST_KERNEL)
    assert state == {"scipy_linalg": False, "have_blas": True, "probe_restored": True, "hook_left": False}


def test_a_kernel_that_uses_blas_gets_numbas_check_and_the_right_answer() -> None:
    state = _run(
        FIRST_KERNEL
        + """
from numba import njit
@njit
def dot(a, b):
    return np.dot(a, b)
x, y = np.random.default_rng(1).random((2, 7))
state["dot_equal"] = bool(dot(x, y) == np.dot(x, y))
state["scipy_linalg_after"] = "scipy.linalg" in sys.modules  # numba's real probe ran
"""
    )
    assert state["dot_equal"] and state["scipy_linalg_after"] and not state["scipy_linalg"]


def test_without_scipy_numba_probes_as_usual() -> None:
    state = _run(
        """
import importlib.abc, sys
class NoScipy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "scipy" or name.startswith("scipy."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, NoScipy())
"""
        + FIRST_KERNEL
    )
    assert state["have_blas"] is False and state["probe_restored"] and not state["hook_left"]
