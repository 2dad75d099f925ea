"""e2e only (on PYTHONPATH of the ``dagster dev`` the harness starts): shorten the daemon loop
interval Dagster hard-codes at 30 s (``dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS``,
read by the backfill daemon when it starts), when ``FX_E2E_DAEMON_INTERVAL_S`` is set.

The module is patched right after it is imported, so processes that never import it (run
workers, ``fx-assets synth``) pay nothing.
"""

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "dagster._daemon.controller"
_VALUE = os.environ.get("FX_E2E_DAEMON_INTERVAL_S")


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def patched(module):
            exec_module(module)
            module.DEFAULT_DAEMON_INTERVAL_SECONDS = int(_VALUE)

        loader.exec_module = patched  # type: ignore[method-assign]
        return spec


if _VALUE:
    sys.meta_path.insert(0, _PatchAfterImport())
