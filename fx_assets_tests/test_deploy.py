"""deploy/ (the Kubernetes variant) checked against Dagster's and Kubernetes' own schemas: the
instance YAML, the k8s executor config of the feature runs, the GPU run tag of training runs,
and the Jobs that the run launcher would create from them; the manifests key by key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from fx_assets.executors import feature_executor, training_tags

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
ENV = {
    "FX_EXECUTOR": "k8s",
    "FX_K8S_EXECUTOR_CONFIG": str(DEPLOY / "k8s" / "feature-executor.yaml"),
    "FX_K8S_TRAINING_CONFIG": str(DEPLOY / "k8s" / "training-run.yaml"),
}


def _load(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def _launcher(monkeypatch: pytest.MonkeyPatch):
    """The K8sRunLauncher exactly as deploy/dagster.yaml configures it (no cluster contacted)."""
    from dagster._config import process_config
    from dagster_k8s import K8sRunLauncher

    monkeypatch.setattr("dagster_k8s.launcher.load_kubernetes_config", lambda **kw: None)
    cfg = _load("dagster.yaml")["run_launcher"]
    assert (cfg["module"], cfg["class"]) == ("dagster_k8s", "K8sRunLauncher")
    result = process_config(K8sRunLauncher.config_type(), cfg["config"])
    assert result.success, result.errors
    return K8sRunLauncher.from_config_value(None, result.value)


def test_instance_yaml_passes_dagsters_instance_schema(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster_postgres import DagsterPostgresStorage

    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    config, _ = dagster_instance_config(str(tmp_path))  # raises on any schema error
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert {"key": "fx/gpu", "limit": 1} in limits
    for var in ("PGHOST", "PGUSER", "PGPASSWORD", "PGDATABASE"):
        monkeypatch.setenv(var, "x")
    pg = process_config(DagsterPostgresStorage.config_type(), config["storage"]["postgres"])
    assert pg.success, pg.errors
    assert pg.value["postgres_db"]["scheme"] == "postgresql+psycopg2"  # type: ignore[index]


def test_feature_executor_config_passes_k8s_job_executors_schema() -> None:
    from dagster._config import process_config
    from dagster_k8s import k8s_job_executor

    doc = _load("k8s/feature-executor.yaml")
    result = process_config(k8s_job_executor.config_schema.config_type, doc)  # type: ignore[union-attr]
    assert result.success, result.errors
    # The code location picks it up from the environment alone.
    ex = feature_executor(ENV)
    assert ex is not None and ex.name == "k8s"
    resolved = ex.config_schema.resolve_config({})  # type: ignore[union-attr]
    assert resolved.success, resolved.errors
    step = resolved.value["config"]["step_k8s_config"]  # type: ignore[index]
    assert step["pod_spec_config"]["node_selector"] == {"fx-assets/pool": "cpu"}


def _job_for(launcher: Any, tags: dict[str, str]) -> Any:
    """What the launcher's _launch_k8s_job_with_args builds for a run with these tags."""
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import construct_dagster_k8s_job

    run = dg.DagsterRun(job_name="train_models", run_id="0" * 32, tags=tags)
    ctx = K8sContainerContext.create_for_run(run, launcher, include_run_tags=True)
    return construct_dagster_k8s_job(
        job_config=ctx.get_k8s_job_config(job_image="fx-assets:0.1.0", run_launcher=launcher),
        args=["dagster", "api", "execute_run", "{}"],
        job_name="dagster-run-0",
        pod_name="dagster-run-0",
        component="run_worker",
        user_defined_k8s_config=ctx.run_k8s_config,
    )


def test_training_runs_land_on_a_gpu_node_with_the_shared_volume(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster_k8s.job import get_user_defined_k8s_config

    from fx_assets.assets.training import GPU_TAGS

    launcher = _launcher(monkeypatch)
    tags = training_tags(GPU_TAGS, ENV)
    get_user_defined_k8s_config(tags)  # the tag passes dagster-k8s's schema
    spec = _job_for(launcher, tags).spec.template.spec
    (container,) = spec.containers
    assert spec.node_selector["fx-assets/pool"] == "gpu"
    assert str(container.resources.limits["nvidia.com/gpu"]) == "1"
    assert any(t.key == "nvidia.com/gpu" for t in spec.tolerations)
    assert spec.volumes[0].persistent_volume_claim.claim_name == "fx-data"
    assert {m.mount_path for m in container.volume_mounts} >= {"/data"}
    env = {e.name: e.value for e in container.env}
    assert env["FX_DATA_ROOT"] == "/data" and env["FX_EXECUTOR"] == "k8s"
    assert "DATABENTO_API_KEY" not in json.dumps(tags)


def test_feature_runs_stay_on_the_cpu_pool_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = _launcher(monkeypatch)
    spec = _job_for(launcher, {}).spec.template.spec
    (container,) = spec.containers
    assert spec.node_selector == {"fx-assets/pool": "cpu"}
    assert "nvidia.com/gpu" not in (container.resources.limits or {})
    assert spec.volumes[0].persistent_volume_claim.claim_name == "fx-data"
    # And the step pods the k8s executor creates from feature-executor.yaml.
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    step = _load("k8s/feature-executor.yaml")["step_k8s_config"]
    job = construct_dagster_k8s_job(
        job_config=DagsterK8sJobConfig(
            job_image="fx-assets:0.1.0", dagster_home="/opt/dagster/dagster_home", instance_config_map="x"
        ),
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-0",
        user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(step),
    )
    (c,) = job.spec.template.spec.containers
    assert job.spec.template.spec.node_selector == {"fx-assets/pool": "cpu"}
    assert c.resources.limits["memory"] == "4Gi" and job.spec.backoff_limit == 0


def _check_keys(obj: Any, cls_name: str, where: str) -> None:
    """Every key of a manifest (camelCase, as kubectl reads it) is a field of its Kubernetes
    model, recursively — a typo fails here instead of being dropped by the API server."""
    import kubernetes.client as k8s

    cls = getattr(k8s, cls_name)
    by_json = {v: k for k, v in cls.attribute_map.items()}
    assert isinstance(obj, dict), f"{where}: expected a mapping for {cls_name}"
    for key, value in obj.items():
        assert key in by_json, f"{where}: {key!r} is not a field of {cls_name}"
        typ = cls.openapi_types[by_json[key]]
        if typ.startswith("list[") and typ[5:-1].startswith("V1"):
            for i, item in enumerate(value):
                _check_keys(item, typ[5:-1], f"{where}.{key}[{i}]")
        elif typ.startswith("V1"):
            _check_keys(value, typ, f"{where}.{key}")


def test_manifests_match_the_kubernetes_models() -> None:
    kinds = {
        "ServiceAccount": "V1ServiceAccount",
        "Role": "V1Role",
        "RoleBinding": "V1RoleBinding",
        "Deployment": "V1Deployment",
        "Service": "V1Service",
        "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    }
    seen = []
    for name in ("k8s/services.yaml", "k8s/data-volume.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            _check_keys(doc, kinds[doc["kind"]], f"{name}:{doc['kind']}/{doc['metadata']['name']}")
            seen.append(doc["kind"])
    assert seen.count("Deployment") == 3 and "PersistentVolumeClaim" in seen
    pvc = _load("k8s/data-volume.yaml")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # step pods on several nodes write to it
    ws = _load("workspace.yaml")
    assert ws["load_from"][0]["grpc_server"]["location_name"] == "fx_assets"


def test_a_typo_in_a_manifest_is_caught() -> None:
    with pytest.raises(AssertionError, match="'nodeSelecter' is not a field of V1PodSpec"):
        _check_keys({"containers": [], "nodeSelecter": {}}, "V1PodSpec", "x")
