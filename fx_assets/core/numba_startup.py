"""What a process pays the first time it runs a numba kernel, and the part of it avoided here.

The first kernel a process runs (loaded from numba's cache or compiled) makes numba load its
implementation registries, ``numba.np.arraymath`` among them. That module's import asks whether
a BLAS is available by importing ``scipy.linalg.cython_blas`` (``numba.np.linalg.ensure_blas``),
and keeps the answer only to choose how a later compile of ``np.dot`` / ``np.vdot`` lowers.
scipy is installed beside fx_assets (lightgbm requires it), so every Dagster run process and
every CLI call that runs a kernel imported ``scipy.linalg``: ~0.15 s of a ~0.3 s first call,
for an answer that ``importlib.util.find_spec("scipy")`` gives without importing anything. No
kernel of fx_assets uses BLAS.

:func:`defer_blas_probe` installs a one-shot import hook. When numba imports
``numba.np.arraymath``, its probe answers "present" if scipy can be found (else numba's own
probe runs: an ImportError, cheap); numba's real ``ensure_blas`` is put back in both modules as
soon as that import ends, so a kernel that does compile ``np.dot`` runs numba's full check
(scipy's BLAS integer width included) then, and imports scipy then. If numba's layout is not
the one this was written against (checked with numba 0.68), the hook steps aside and numba probes as
usual.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

PROBING_MODULE = "numba.np.arraymath"  # runs the probe at import (``_HAVE_BLAS``)
PROBE_MODULE = "numba.np.linalg"  # defines the probe (``ensure_blas``)


def _blas_present() -> None:
    """``ensure_blas`` while numba.np.arraymath imports, with scipy installed: it is."""


def _findable(name: str) -> bool:
    """Whether ``import name`` would find a module, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class _DeferringLoader(importlib.abc.Loader):
    """numba.np.arraymath's own loader, run with the probe answered by :func:`_blas_present`."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self._real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        linalg = importlib.import_module(PROBE_MODULE)
        probe = getattr(linalg, "ensure_blas", None)
        if probe is None or not _findable("scipy"):
            self._real.exec_module(module)  # numba's own probe
            return
        linalg.ensure_blas = _blas_present  # type: ignore[attr-defined]
        try:
            self._real.exec_module(module)
        finally:
            linalg.ensure_blas = probe  # type: ignore[attr-defined]
            if getattr(module, "ensure_blas", None) is _blas_present:
                module.ensure_blas = probe  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._real, name)


class _DeferBlasProbe(importlib.abc.MetaPathFinder):
    """Finds numba.np.arraymath once, through the normal path finder, with the loader wrapped."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PROBING_MODULE:
            return None
        remove_hook()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # not numba's layout: the normal import
        spec.loader = _DeferringLoader(spec.loader)
        return spec


def defer_blas_probe() -> bool:
    """Install the hook (once; not when numba.np.arraymath is already imported). True if
    installed by this call."""
    if PROBING_MODULE in sys.modules or any(isinstance(f, _DeferBlasProbe) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _DeferBlasProbe())
    return True


def remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DeferBlasProbe)]
