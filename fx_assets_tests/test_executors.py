"""Executor choice by configuration (fx_assets.executors) and a feature backfill on a local Dask
cluster of worker processes giving the same bytes as the multiprocess executor."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import pytest

from fx_assets.executors import dask_cluster_config, feature_executor, training_tags
from fx_assets_tests.conftest import make_market

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def test_default_is_the_code_locations_executor() -> None:
    assert feature_executor({}) is None  # the code location's default: in process
    assert feature_executor({"FX_EXECUTOR": "in_process"}) is None
    assert feature_executor({"FX_EXECUTOR": "multiprocess"}) is dg.multiprocess_executor
    with pytest.raises(ValueError, match="FX_EXECUTOR='spark'"):
        feature_executor({"FX_EXECUTOR": "spark"})
    with pytest.raises(ValueError, match="FX_DASK_WORKERS must be an integer"):
        feature_executor({"FX_EXECUTOR": "dask", "FX_DASK_WORKERS": "two"})


def test_dask_choice_and_its_run_config() -> None:
    ex = feature_executor({"FX_EXECUTOR": "dask", "FX_DASK_ADDRESS": "tcp://10.0.0.5:8786"})
    assert ex is not None and ex.name == "dask"
    schema = ex.config_schema
    # Defaults from the environment; run config may override either field.
    resolved = schema.resolve_config({})  # type: ignore[union-attr]
    assert resolved.success
    assert resolved.value == {"config": {"cluster": {"existing": {"address": "tcp://10.0.0.5:8786"}}}}
    # as in run config: execution: {config: {address: "", n_workers: 2}}
    resolved = schema.resolve_config({"config": {"address": "", "n_workers": 2}})  # type: ignore[union-attr]
    assert resolved.value == {"config": dask_cluster_config(None, 2)}


def test_definitions_pick_the_executor_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fx_assets.definitions import build_definitions
    from fx_assets.settings import ProjectSettings

    settings = ProjectSettings(data_root=tmp_path)
    monkeypatch.setenv("FX_EXECUTOR", "dask")
    monkeypatch.setenv("FX_DASK_WORKERS", "3")
    job = build_definitions(settings).resolve_job_def("build_features")
    assert job.executor_def.name == "dask"
    # Run config of such a run: the two documented fields, nothing else.
    dg.validate_run_config(job, {"execution": {"config": {"n_workers": 2}}})
    with pytest.raises(dg.DagsterInvalidConfigError, match="workers"):
        dg.validate_run_config(job, {"execution": {"config": {"workers": 2}}})
    monkeypatch.setenv("FX_EXECUTOR", "k8s")
    assert build_definitions(settings).resolve_job_def("build_features").executor_def.name == "k8s"
    monkeypatch.delenv("FX_EXECUTOR")
    assert build_definitions(settings).resolve_job_def("build_features").executor_def.name == "in_process"


def test_training_tags_add_the_k8s_run_config_only_when_set(tmp_path: Path) -> None:
    base = {"fx/gpu": "1"}
    assert training_tags(base, {}) == base
    f = tmp_path / "t.yaml"
    f.write_text("container_config:\n  resources:\n    limits: {nvidia.com/gpu: 1}\n")
    tags = training_tags(base, {"FX_K8S_TRAINING_CONFIG": str(f)})
    assert tags["fx/gpu"] == "1"
    assert json.loads(tags["dagster-k8s/config"])["container_config"]["resources"]["limits"] == {
        "nvidia.com/gpu": 1
    }
    with pytest.raises(ValueError, match="does not exist"):
        training_tags(base, {"FX_K8S_TRAINING_CONFIG": str(tmp_path / "nope.yaml")})


def dask_build_features_job() -> dg.JobDefinition:
    """The same job under another pointer: Dagster caches a reconstructed job per pointer and
    process, so the multiprocess phase's job (and executor) would otherwise be reused."""
    from fx_assets_tests import jobs_for_tests

    return jobs_for_tests.build_features_job()


def _build_two_partitions(root: Path, inst: dg.DagsterInstance, target: object) -> set[int]:
    """Both partitions through build_features; the pids of the processes that ran the steps."""
    pids: set[int] = set()
    for quarter in ("2024-01", "2024-04"):  # Q2 is warmed up from Q1's bars
        with dg.execute_job(
            dg.reconstructable(target),  # type: ignore[arg-type]
            instance=inst,
            run_config=QUIET,
            tags={
                "dagster/partition/quarter": quarter,
                "dagster/partition/symbol": "ES.FUT",
                "dagster/partition": f"{quarter}|ES.FUT",
            },
        ) as result:
            assert result.success, quarter
            assert len(result.get_asset_materialization_events()) == 7
            pids |= {e.pid for e in result.all_events if e.event_type_value == "STEP_SUCCESS" and e.pid}
    return pids


def _tree(root: Path) -> dict[str, bytes]:
    """Every data file's bytes (not the build metadata beside them: it records timings; nor the
    records of verifications: they hold the files' inodes and ctimes)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith((".meta.json", ".verified.json"))
    }


NO_COMPUTE_LOGS = {
    "compute_logs": {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
}


@pytest.mark.slow
def test_dask_cluster_of_worker_processes_gives_the_multiprocess_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import Client, LocalCluster

    root = make_market(tmp_path / "market", "2024-Q1:2024-Q2")
    monkeypatch.setenv("FX_DATA_ROOT", str(root))
    monkeypatch.setenv("FX_FIRST_QUARTER", "2024-Q1")
    monkeypatch.setenv("FX_LAST_QUARTER", "2024-Q2")
    derived = root / "derived"

    # Multiprocess executor, then the same raw files through Dask: cache keys and sidecar
    # metadata name the raw files' path, so both runs use the same root.
    monkeypatch.setenv("FX_EXECUTOR", "multiprocess")
    from fx_assets_tests import jobs_for_tests

    with dg.instance_for_test() as inst:
        _build_two_partitions(root, inst, jobs_for_tests.build_features_job)
    reference = _tree(derived)
    assert len(reference) >= 14
    shutil.rmtree(derived)

    # The workers are started after the environment is set, so they see the same settings.
    monkeypatch.setenv("FX_EXECUTOR", "dask")
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        monkeypatch.setenv("FX_DASK_ADDRESS", cluster.scheduler_address)
        # No compute-log capture: with it each Dask worker thread waits for the step's tail
        # subprocess to exit (py-spy: compute_logs.execute_posix_tail -> Popen.wait), holding
        # the worker at no CPU for minutes. This test checks bytes and process ids, not logs.
        with dg.instance_for_test(overrides=NO_COMPUTE_LOGS) as inst:
            step_pids = _build_two_partitions(root, inst, dask_build_features_job)
            runs = inst.get_runs()
        worker_pids = set(client.run(os.getpid).values())
    # Every step of both runs ran in one of the cluster's worker processes.
    assert step_pids and step_pids <= worker_pids and os.getpid() not in step_pids
    assert {r.tags.get("dagster/partition") for r in runs} == {"2024-01|ES.FUT", "2024-04|ES.FUT"}
    dask_tree = _tree(derived)
    assert sorted(dask_tree) == sorted(reference)
    for name, data in reference.items():
        assert dask_tree[name] == data, name
