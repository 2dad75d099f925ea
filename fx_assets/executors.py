"""Where feature backfills and training runs execute, chosen by configuration only.

``build_features`` gets :func:`feature_executor`, read from the environment of the process that
loads the code location:

- ``FX_EXECUTOR=in_process`` (default): the code location's default executor, in process: a
  partition's 7 stages run in one process (no process start and package import per step);
  partitions run in parallel as separate runs.
- ``FX_EXECUTOR=multiprocess``: Dagster's multiprocess executor, one process per step.
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

EXECUTORS = ("in_process", "multiprocess", "dask", "k8s")


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


def _run_safe_dask_executor() -> dg.ExecutorDefinition:
    """``dagster_dask.dask_executor`` with two fixes, for ``local`` and ``existing`` clusters
    (other cluster types run dagster-dask's own code, with fix 1):

    1. dagster-dask 0.29.27 hands the ``DagsterRun`` to ``client.submit``, and distributed 2026.8
       walks tuple arguments; a run whose ops use a ``pool`` (the decode assets do) carries a
       ``RunOpConcurrency`` record, which refuses iteration, so every such step failed before
       reaching a worker. The workers never read that field (the Dask executor does not enforce
       pools; the run queue already used it), so they get the run without it.
    2. It names each Dask task ``{job}.{step}``: two runs of one job on one cluster (a backfill)
       submit the same key, Dask treats them as one task and the second run gets the first one's
       result (its own partition never built). Tasks here are named ``{run_id}.{step}``.
    """
    import copy

    import dask.distributed
    from dagster._core.errors import raise_execution_interrupts
    from dagster._core.events import DagsterEvent
    from dagster._utils import iterate_with_context
    from dagster_dask import dask_executor
    from dagster_dask.executor import DaskExecutor, get_dask_resource_requirements, query_on_dask_worker

    class RunSafeDaskExecutor(DaskExecutor):
        def execute(self, plan_context: Any, execution_plan: Any) -> Any:
            run = plan_context.dagster_run
            if run.run_op_concurrency is not None:
                plan_context = copy.copy(plan_context)
                run = run._replace(run_op_concurrency=None)
                plan_context._plan_data = plan_context.plan_data._replace(dagster_run=run)
            if self.cluster_type not in ("local", "existing"):
                yield from super().execute(plan_context, execution_plan)
                return
            if not plan_context.instance.is_persistent:
                raise dg.DagsterInvariantViolationError(
                    "Dask execution requires a persistent DagsterInstance"
                )
            if self.cluster_type == "existing":
                cluster: Any = self.cluster_configuration["address"]
            else:
                cluster = dask.distributed.LocalCluster(**self.build_dict(plan_context.job_name))
            instance_ref = plan_context.instance.get_ref()
            with dask.distributed.Client(cluster) as client:
                futures: dict[str, Any] = {}
                for level in execution_plan.get_steps_to_execute_by_level():
                    for step in level:
                        # Dask orders the steps: each task waits for its upstream tasks' futures.
                        deps = [futures[k] for inp in step.step_inputs for k in inp.dependency_keys]
                        futures[step.key] = client.submit(
                            query_on_dask_worker,
                            deps,
                            plan_context.reconstructable_job,
                            run,
                            plan_context.run_config,
                            [step.key],
                            instance_ref,
                            execution_plan.known_state,
                            key=f"{run.run_id}.{step.key}",
                            resources=get_dask_resource_requirements(step.tags),
                        )
                done = dask.distributed.as_completed(list(futures.values()), with_results=True)
                for _future, events in iterate_with_context(raise_execution_interrupts, done):
                    for event in events:
                        if not isinstance(event, DagsterEvent):
                            raise TypeError(f"a Dask task returned {type(event).__name__}, not DagsterEvent")
                        yield event
            if self.cluster_type == "local":
                cluster.close()

    @dg.executor(
        name="dask",
        config_schema=dask_executor.config_schema.as_field(),
        requirements=dg.multiple_process_executor_requirements(),
    )
    def run_safe_dask_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
        cluster: Any = init_context.executor_config["cluster"]
        ((cluster_type, cluster_configuration),) = cluster.items()
        return RunSafeDaskExecutor(cluster_type, cluster_configuration)

    return run_safe_dask_executor


def feature_executor(env: Mapping[str, str] | None = None) -> dg.ExecutorDefinition | None:
    """The executor of the feature backfills (see the module docstring); None = the code
    location's default."""
    env = _env(env)
    kind = env.get("FX_EXECUTOR", "in_process").strip().lower() or "in_process"
    if kind not in EXECUTORS:
        raise ValueError(f"FX_EXECUTOR={kind!r}: expected one of {', '.join(EXECUTORS)}")
    if kind == "in_process":
        return None
    if kind == "multiprocess":
        return dg.multiprocess_executor
    if kind == "dask":
        dask_executor = _run_safe_dask_executor()
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
