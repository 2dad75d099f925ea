"""Where feature backfills and training runs execute, chosen by configuration only.

``build_features`` gets :func:`feature_executor`, read from the environment of the process that
loads the code location:

- ``FX_EXECUTOR=multiprocess`` (default): the code location's default executor (multiprocess on
  this machine; run config ``execution: {config: {multiprocess: …}}`` or ``{in_process: {}}``).
- ``FX_EXECUTOR=dask``: ``dagster_dask.dask_executor``. ``FX_DASK_ADDRESS=tcp://host:8786`` joins
  an existing scheduler; without it a local cluster of ``FX_DASK_WORKERS`` worker processes (default:
  the CPU count), one thread each (the numba kernels hold the GIL). A run can still override in
  run config: ``execution: {config: {address: tcp://…}}`` or ``{n_workers: 2}``. The workers need
  the same data root (a shared volume) and a persistent Dagster instance (``DAGSTER_HOME``).
- ``FX_EXECUTOR=k8s``: ``dagster_k8s.k8s_job_executor``, one pod per step; with
  ``FX_K8S_EXECUTOR_CONFIG`` pointing to a YAML file of that executor's config (e.g.
  ``deploy/k8s/feature-executor.yaml``: CPU node pool, requests and limits) as its defaults.

Training keeps the in-process executor (the device loader lives for one run); on Kubernetes its
run pod gets the GPU through the run tag ``dagster-k8s/config`` that :func:`training_tags` adds
from the YAML file ``FX_K8S_TRAINING_CONFIG`` points to (e.g. ``deploy/k8s/training-run.yaml``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

EXECUTORS = ("multiprocess", "dask", "k8s")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _yaml_file(var: str, env: Mapping[str, str]) -> dict[str, Any]:
    import yaml

    path = Path(env[var])
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{var} points to {path}, which does not exist") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{var}: {path} must hold a YAML mapping")
    return doc


def dask_cluster_config(address: str | None, n_workers: int) -> dict[str, Any]:
    """``dask_executor`` config: an existing scheduler, or a local cluster of worker processes."""
    if address:
        return {"cluster": {"existing": {"address": address}}}
    return {"cluster": {"local": {"n_workers": n_workers, "threads_per_worker": 1, "processes": True}}}


def feature_executor(env: Mapping[str, str] | None = None) -> dg.ExecutorDefinition | None:
    """The executor of the feature backfills (see the module docstring); None = the code
    location's default."""
    env = _env(env)
    kind = env.get("FX_EXECUTOR", "multiprocess").strip().lower() or "multiprocess"
    if kind not in EXECUTORS:
        raise ValueError(f"FX_EXECUTOR={kind!r}: expected one of {', '.join(EXECUTORS)}")
    if kind == "multiprocess":
        return None
    if kind == "dask":
        from dagster_dask import dask_executor

        try:
            workers = int(env.get("FX_DASK_WORKERS") or (os.cpu_count() or 1))
        except ValueError:
            raise ValueError(f"FX_DASK_WORKERS must be an integer, got {env['FX_DASK_WORKERS']!r}") from None
        if workers < 1:
            raise ValueError(f"FX_DASK_WORKERS must be at least 1, got {workers}")
        address = env.get("FX_DASK_ADDRESS") or ""

        def to_dask(cfg: dict[str, Any]) -> dict[str, Any]:
            # Dagster does not fill a configured executor's defaults in every path: fall back here.
            return dask_cluster_config(
                cfg.get("address", address) or None, int(cfg.get("n_workers", workers))
            )

        return dask_executor.configured(
            to_dask,
            name="dask",
            config_schema={
                "address": dg.Field(str, default_value=address, description="Scheduler; empty = local."),
                "n_workers": dg.Field(int, default_value=workers, description="Local worker processes."),
            },
        )
    from dagster_k8s import k8s_job_executor

    if env.get("FX_K8S_EXECUTOR_CONFIG"):
        return k8s_job_executor.configured(_yaml_file("FX_K8S_EXECUTOR_CONFIG", env), name="k8s")
    return k8s_job_executor


def training_tags(base: Mapping[str, str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` plus, when ``FX_K8S_TRAINING_CONFIG`` is set, the ``dagster-k8s/config`` run tag
    (GPU node selector, ``nvidia.com/gpu`` limits) read from that YAML file."""
    env = _env(env)
    tags = dict(base)
    if env.get("FX_K8S_TRAINING_CONFIG"):
        tags["dagster-k8s/config"] = json.dumps(_yaml_file("FX_K8S_TRAINING_CONFIG", env), sort_keys=True)
    return tags
