"""A running Dagster for end-to-end tests: ``dagster dev`` (webserver + daemon) on 127.0.0.1.

:func:`start_dagster_dev` makes a temporary ``DAGSTER_HOME`` (the project's ``dagster.yaml``
with its storage paths dropped, so runs live in the home, plus the overrides below), a data
root holding a small synthetic market written by ``fx-assets synth``, initialises the instance
once (``dagster instance migrate``: concurrent first opens of a fresh SQLite home corrupt it),
starts ``dagster dev`` in its own process group on a free port and waits until the code
location is loaded. :class:`DagsterDev` then talks GraphQL to it (:meth:`DagsterDev.gql` and a
few typed helpers), waits with bounds (:func:`wait_until`), and :meth:`DagsterDev.stop` ends the
whole process group (SIGINT, then SIGKILL after a grace period).

Speed for tests comes only from configuration: short automation and sensor intervals
(``FX_AUTOMATION_INTERVAL_S``, ``FX_RAW_POLL_S``), a 1 s run-queue interval, and
``FX_E2E_DAEMON_INTERVAL_S`` which ``sitecustomize`` in this folder applies to the daemon loops
that Dagster hard-codes at 30 s (the backfill daemon); nothing else is patched.

Stable API (other e2e suites build on it): ``start_dagster_dev``, ``DagsterDev`` (``url``,
``home``, ``data_root``, ``env``, ``location``, ``repository``, ``gql``, ``launch_run``,
``launch_asset_backfill``, ``launch_job_backfill``, ``backfill``, ``wait_backfill``, ``runs``,
``wait_runs_idle``, ``materialized_partitions``, ``materialization_times``, ``observed_partitions``, ``latest_metadata``, ``sensor_state``, ``start_sensor``,
``stop_sensor``, ``restart``, ``stop``,
``log_tail``, ``state_report``), ``wait_until``, ``wait_for_folds_and_report``, ``synth_market``, ``drop_quarter``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LOCATION = "fx_assets"
REPOSITORY = "__repository__"
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
ACTIVE = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "MANAGED", "CANCELING"}

T = TypeVar("T")


class E2EError(AssertionError):
    """A bounded wait ran out or the server answered with an error."""


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 1.0,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns something truthy (returned), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}\n{extra}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _python() -> str:
    return sys.executable


def _bin(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else name


def synth_market(
    root: Path,
    quarters: str,
    *,
    symbols: Iterable[str] = ("ES.FUT",),
    scale: float = 0.004,
    seed: int = 11,
    signal_strength: float = 1.0,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Write a synthetic market under ``root/raw`` with ``fx-assets synth`` (the user's command)."""
    cmd = [
        _python(),
        "-m",
        "fx_assets.cli",
        "synth",
        "--out",
        str(root),
        "--symbols",
        ",".join(symbols),
        "--quarters",
        quarters,
        "--scale",
        str(scale),
        "--seed",
        str(seed),
        "--signal",
        str(signal_strength),
    ]
    proc = subprocess.run(cmd, env=dict(env or os.environ), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise E2EError(
            f"fx-assets synth failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return root


def drop_quarter(
    staging: Path, data_root: Path, quarter_label: str, symbols: Iterable[str] = ("ES.FUT",)
) -> list[Path]:
    """Move one quarter's trades and MBP-10 files from a staging root into the data root's raw
    folders, each with an atomic rename (as a person's ``mv`` on one file system would)."""
    moved = []
    for symbol in symbols:
        for schema in ("trades", "mbp-10"):
            src = staging / "raw" / schema / symbol / f"{symbol}_{quarter_label}.dbn.zst"
            if not src.is_file():
                raise E2EError(f"{src} does not exist: synthesise {quarter_label} into {staging} first")
            dst = data_root / "raw" / schema / symbol / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.part")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
            moved.append(dst)
    return moved


def instance_yaml(overrides: Mapping[str, Any] | None = None) -> str:
    """The project's dagster.yaml without its storage paths (they default into DAGSTER_HOME),
    with test overrides: no telemetry or community pop-up, a fast run queue."""
    base = yaml.safe_load((REPO / "dagster.yaml").read_text()) or {}
    for key in ("storage", "local_artifact_storage", "compute_logs"):
        base.pop(key, None)
    base["telemetry"] = {"enabled": False}
    base["nux"] = {"enabled": False}
    base["run_coordinator"] = {
        "module": "dagster.core.run_coordinator",
        "class": "QueuedRunCoordinator",
        "config": {"dequeue_interval_seconds": 1},
    }
    for key, value in (overrides or {}).items():
        base[key] = value
    return yaml.safe_dump(base, sort_keys=False)


@dataclass
class DagsterDev:
    """One ``dagster dev`` process group and a GraphQL client for it."""

    home: Path
    data_root: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    location: str = LOCATION
    repository: str = REPOSITORY
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / f"dagster_dev.{self.starts}.log"

    @property
    def repo_selector(self) -> dict[str, str]:
        return {"repositoryLocationName": self.location, "repositoryName": self.repository}

    # --- process ---------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> DagsterDev:
        if self.proc is not None:
            raise E2EError("dagster dev is already running")
        self.starts += 1
        log = self.log_path.open("w")
        workspace = self.home / "workspace.yaml"

        def restore_signals() -> None:  # a parent that ignores SIGINT would make dagster ignore it
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

        self.proc = subprocess.Popen(
            [_bin("dagster"), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=self.home,  # dagster dev puts its cwd on sys.path: keep it free of project files
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=restore_signals,
        )
        log.close()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        def server_up() -> bool:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_until(server_up, timeout, "the webserver's /server_info", 0.5, self.log_tail)

        def loaded() -> bool:
            data = self.gql(
                "query { workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus "
                "locationOrLoadError { __typename ... on PythonError { message } } } } } }"
            )
            entries = data["workspaceOrError"].get("locationEntries", [])
            for e in entries:
                err = e.get("locationOrLoadError") or {}
                if err.get("__typename") == "PythonError":
                    raise E2EError(f"code location {e['name']} failed to load: {err['message']}")
            return any(e["name"] == self.location and e["loadStatus"] == "LOADED" for e in entries)

        wait_until(loaded, timeout, f"code location {self.location} to load", 0.5, self.log_tail)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise E2EError(f"dagster dev exited with {self.proc.returncode}\n{self.log_tail()}")

    def stop(self, grace: float = 60) -> None:
        """End the whole process group: SIGINT (dagster's clean shutdown), SIGKILL after ``grace``."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def restart(self, timeout: float = 120) -> None:
        """Stop and start again on the same home, data root and port (webserver and daemon)."""
        self.stop()
        self.start(timeout)

    def log_tail(self, n: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def failure_messages(self, run_id: str, limit: int = 3) -> list[str]:
        """The step/run failure messages of one run, read from the instance's event log."""
        import dagster as dg

        out = []
        with dg.DagsterInstance.from_config(str(self.home)) as inst:
            for e in inst.all_logs(run_id):
                ev = e.dagster_event
                if ev is not None and ev.event_type_value in ("STEP_FAILURE", "RUN_FAILURE"):
                    err = getattr(ev.event_specific_data, "error", None)
                    text = err.to_string() if err is not None else (ev.message or "")
                    out.append(f"{ev.event_type_value} {ev.step_key or ''}: {text[-1500:]}")
        return out[:limit]

    def state_report(self, assets: Iterable[str] = ()) -> str:
        """What a person would look at in the UI when automation stalls: every run (created time,
        job, partition, assets, status; the failures' messages) and each asset's materialized
        partitions. Printed by waits that run out, so a red CI says why."""
        lines = ["runs (oldest first):"]
        try:
            runs = sorted(self.runs(), key=lambda r: r.get("startTime") or 0.0)
            for r in runs:
                tags = tags_of(r)
                sel = ",".join("/".join(a["path"]) for a in r.get("assetSelection") or [])
                part = tags.get("dagster/partition") or (
                    f"{tags.get('dagster/asset_partition_range_start')}..{tags.get('dagster/asset_partition_range_end')}"
                    if "dagster/asset_partition_range_start" in tags
                    else "-"
                )
                lines.append(
                    f"  {r.get('startTime') or 0:.1f} {r['status']:<8} {r['jobName']} {part} [{sel}]"
                )
                if r["status"] == "FAILURE":
                    lines += [f"      {m}" for m in self.failure_messages(r["runId"])]
            for asset in assets:
                lines.append(f"{asset}: {sorted(self.materialized_partitions(asset).items(), key=str)}")
        except Exception as exc:  # the report must never hide the original timeout
            lines.append(f"(state report failed: {exc!r})")
        return "\n".join(lines)

    # --- GraphQL ---------------------------------------------------------------------------
    def gql(self, query: str, variables: Mapping[str, Any] | None = None, timeout: float = 60) -> dict:
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        req = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise E2EError(f"GraphQL HTTP {exc.code}: {exc.read()[:2000]!r}") from exc
        if doc.get("errors"):
            raise E2EError(f"GraphQL errors: {json.dumps(doc['errors'])[:3000]}")
        return doc["data"]

    @staticmethod
    def _ok(result: dict, success: str) -> dict:
        if result.get("__typename") != success:
            raise E2EError(f"expected {success}, got {json.dumps(result)[:3000]}")
        return result

    def launch_run(
        self,
        job: str,
        *,
        tags: Mapping[str, str] | None = None,
        asset_selection: Iterable[str] | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> str:
        selector: dict[str, Any] = {**self.repo_selector, "jobName": job}
        if asset_selection is not None:
            selector["assetSelection"] = [{"path": [a]} for a in asset_selection]
        params = {
            "selector": selector,
            "runConfigData": dict(run_config or {}),
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        data = self.gql(LAUNCH_RUN, {"executionParams": params})
        return self._ok(data["launchRun"], "LaunchRunSuccess")["run"]["runId"]

    def launch_asset_backfill(
        self, assets: Iterable[str], partitions: Iterable[str], tags: Mapping[str, str] | None = None
    ) -> str:
        params = {
            "assetSelection": [{"path": [a]} for a in assets],
            "partitionNames": list(partitions),
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
        }
        data = self.gql(LAUNCH_BACKFILL, {"backfillParams": params})
        return self._ok(data["launchPartitionBackfill"], "LaunchBackfillSuccess")["backfillId"]

    def launch_job_backfill(
        self, job: str, partitions: Iterable[str], tags: Mapping[str, str] | None = None
    ) -> str:
        params = {
            "selector": {
                "partitionSetName": f"{job}_partition_set",
                "repositorySelector": self.repo_selector,
            },
            "partitionNames": list(partitions),
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
        }
        data = self.gql(LAUNCH_BACKFILL, {"backfillParams": params})
        return self._ok(data["launchPartitionBackfill"], "LaunchBackfillSuccess")["backfillId"]

    def backfill(self, backfill_id: str) -> dict:
        data = self.gql(BACKFILL, {"backfillId": backfill_id})
        return self._ok(data["partitionBackfillOrError"], "PartitionBackfill")

    def wait_backfill(self, backfill_id: str, timeout: float = 180) -> dict:
        """The backfill once it has finished (any terminal status) and all its runs have ended."""

        def done() -> dict | None:
            self._check_alive()
            b = self.backfill(backfill_id)
            if b["status"] in ("REQUESTED", "CANCELING"):
                return None
            if any(r["status"] not in FINISHED for r in b["runs"]):
                return None
            return b

        return wait_until(done, timeout, f"backfill {backfill_id}", 1.0, self.log_tail)

    def runs(self, limit: int = 200, **filters: Any) -> list[dict]:
        data = self.gql(RUNS, {"filter": filters or None, "limit": limit})
        return self._ok(data["runsOrError"], "Runs")["results"]

    def wait_runs_idle(self, timeout: float = 120, quiet: float = 0.0) -> list[dict]:
        """All runs once none is queued or running (and none has started for ``quiet`` seconds)."""
        stable_since: list[float] = []

        def idle() -> list[dict] | None:
            self._check_alive()
            rs = self.runs()
            if any(r["status"] in ACTIVE for r in rs):
                stable_since.clear()
                return None
            key = len(rs)
            if not stable_since or stable_since[0] != key:
                stable_since[:] = [key, time.monotonic()]
            return rs if time.monotonic() - stable_since[1] >= quiet else None

        return wait_until(idle, timeout + quiet, "runs to finish", 1.0, self.log_tail)

    def materialized_partitions(self, asset: str) -> dict[str, int]:
        """Partition key -> number of materializations recorded for it (None key: unpartitioned)."""
        data = self.gql(ASSET_EVENTS, {"assetKey": {"path": [asset]}})
        a = data["assetOrError"]
        if a.get("__typename") != "Asset":
            return {}
        out: dict[str, int] = {}
        for m in a["assetMaterializations"]:
            k = m["partition"] or ""
            out[k] = out.get(k, 0) + 1
        return out

    def materialization_times(self, asset: str) -> dict[str, list[float]]:
        """Partition key -> timestamps (s) of its materializations, oldest first."""
        data = self.gql(ASSET_EVENTS, {"assetKey": {"path": [asset]}})
        a = data["assetOrError"]
        out: dict[str, list[float]] = {}
        for m in a.get("assetMaterializations") or []:
            out.setdefault(m["partition"] or "", []).append(float(m["timestamp"]) / 1000.0)
        return {k: sorted(v) for k, v in out.items()}

    def observed_partitions(self, asset: str) -> set[str]:
        """Partition keys of a source asset that have at least one observation."""
        data = self.gql(ASSET_OBSERVATIONS, {"assetKey": {"path": [asset]}})
        a = data["assetOrError"]
        if a.get("__typename") != "Asset":
            return set()
        return {o["partition"] for o in a["assetObservations"] if o["partition"]}

    def latest_metadata(self, asset: str, partition: str | None = None) -> dict[str, Any]:
        """label -> value of the newest materialization's metadata (ints, floats, text, json)."""
        data = self.gql(
            ASSET_METADATA,
            {"assetKey": {"path": [asset]}, "partitions": [partition] if partition else None},
        )
        mats = data["assetOrError"].get("assetMaterializations") or []
        if not mats:
            return {}
        out: dict[str, Any] = {}
        for e in mats[0]["metadataEntries"]:
            for k in ("intValue", "floatValue", "text", "jsonString", "mdStr", "boolValue"):
                if k in e:
                    out[e["label"]] = e[k]
        return out

    def sensor_state(self, name: str) -> str:
        return self._sensor(name)["sensorState"]["status"]

    def _sensor(self, name: str) -> dict:
        data = self.gql(SENSOR, {"sensorSelector": {**self.repo_selector, "sensorName": name}})
        return self._ok(data["sensorOrError"], "Sensor")

    def start_sensor(self, name: str) -> None:
        data = self.gql(START_SENSOR, {"sensorSelector": {**self.repo_selector, "sensorName": name}})
        self._ok(data["startSensor"], "Sensor")

    def stop_sensor(self, name: str, settle: float = 8.0, timeout: float = 90) -> None:
        """Stop a sensor and wait until it stays stopped for ``settle`` seconds: a daemon tick in
        flight when the mutation lands writes its state back and can undo the stop."""
        deadline = time.monotonic() + timeout
        while True:
            data = self.gql(STOP_SENSOR, {"id": self._sensor(name)["sensorState"]["id"]})
            self._ok(data["stopSensor"], "StopSensorMutationResult")
            time.sleep(settle)
            if self.sensor_state(name) == "STOPPED":
                return
            if time.monotonic() > deadline:
                raise E2EError(f"sensor {name} does not stay stopped\n{self.log_tail()}")


def wait_for_folds_and_report(dev: DagsterDev, folds: list[str], timeout: float) -> None:
    """Wait (bounded) until every fold in ``folds`` has a ``trained_model`` materialization and
    ``walk_forward_report`` was materialized after the newest of them, then until runs are idle."""

    def latest(asset: str) -> float | None:
        mats = dev.gql(
            f'query {{ assetOrError(assetKey: {{path: ["{asset}"]}}) {{'
            " ... on Asset { assetMaterializations(limit: 1) { timestamp } } } }"
        )["assetOrError"].get("assetMaterializations")
        return float(mats[0]["timestamp"]) if mats else None

    before = {r["runId"] for r in dev.runs()}

    def done() -> bool:
        # Automation does not retry a failed run: a failure ends the wait at once, with its reason.
        failed = [r for r in dev.runs() if r["runId"] not in before and r["status"] == "FAILURE"]
        if failed:
            raise E2EError(f"a run failed while waiting for folds {folds}\n{diagnose()}")
        have = dev.materialized_partitions("trained_model")
        if not all(f in have for f in folds):
            return False
        report, model = latest("walk_forward_report"), latest("trained_model")
        return report is not None and model is not None and report > model

    def diagnose() -> str:
        chain = ("predecoded_trades", "bars", "bar_features", "ofi_features", "fxcache", "fold_ranges")
        return dev.state_report((*chain, "trained_model", "walk_forward_report")) + "\n" + dev.log_tail(3000)

    wait_until(done, timeout, f"folds {folds} and a report after them", 2.0, diagnose)
    dev.wait_runs_idle(120, quiet=8)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; look for a live member.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def start_dagster_dev(
    base: Path,
    *,
    quarters: str = "2024-Q1:2024-Q4",
    symbols: Iterable[str] = ("ES.FUT",),
    scale: float = 0.004,
    seed: int = 11,
    first_quarter: str = "2024-Q1",
    train_quarters: int = 2,
    automation_interval_s: int = 3,
    raw_poll_s: int = 3,
    instance_overrides: Mapping[str, Any] | None = None,
    extra_env: Mapping[str, str] | None = None,
    data_root: Path | None = None,
    timeout: float = 180,
) -> DagsterDev:
    """A started ``dagster dev`` on a fresh home and a fresh synthetic market (see module doc).

    ``quarters`` is what lies in the raw folders at start ("" for none); ``data_root`` reuses
    an existing root instead. ``instance_overrides`` replace top-level keys of the instance's
    dagster.yaml (e.g. ``storage`` for PostgreSQL)."""
    base.mkdir(parents=True, exist_ok=True)
    home = base / "dagster_home"
    home.mkdir()
    symbols = tuple(symbols)
    root = data_root if data_root is not None else base / "data"
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FX_", "DAGSTER_"))}
    pythonpath = [str(HERE / "site"), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        {
            "DAGSTER_HOME": str(home),
            "PYTHONPATH": os.pathsep.join(pythonpath),
            "PYTHONUNBUFFERED": "1",
            "FX_DATA_ROOT": str(root),
            "FX_SYMBOLS": ",".join(symbols),
            "FX_FIRST_QUARTER": first_quarter,
            "FX_TRAIN_QUARTERS": str(train_quarters),
            "FX_AUTOMATION_INTERVAL_S": str(automation_interval_s),
            "FX_RAW_POLL_S": str(raw_poll_s),
            "FX_E2E_DAEMON_INTERVAL_S": "2",
            **dict(extra_env or {}),
        }
    )
    if quarters and data_root is None:
        synth_market(root, quarters, symbols=symbols, scale=scale, seed=seed, env=env)
    (home / "dagster.yaml").write_text(instance_yaml(instance_overrides))
    (home / "workspace.yaml").write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {
                        "python_module": {
                            "module_name": "fx_assets.definitions",
                            "location_name": LOCATION,
                            "working_directory": str(REPO),
                        }
                    }
                ]
            }
        )
    )
    migrate = subprocess.run(
        [_bin("dagster"), "instance", "migrate"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if migrate.returncode != 0:
        raise E2EError(f"dagster instance migrate failed: {migrate.stdout[-2000:]}{migrate.stderr[-2000:]}")
    dev = DagsterDev(home=home, data_root=root, env=env)
    try:
        dev.start(timeout)
    except BaseException:
        dev.stop()
        raise
    return dev


LAUNCH_RUN = """
mutation LaunchRun($executionParams: ExecutionParams!) { launchRun(executionParams: $executionParams) {
  __typename
  ... on LaunchRunSuccess { run { runId status tags { key value } } }
  ... on PythonError { message stack }
  ... on InvalidSubsetError { message }
  ... on RunConfigValidationInvalid { errors { message } }
  ... on PipelineNotFoundError { message }
} }"""

LAUNCH_BACKFILL = """
mutation LaunchBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on PythonError { message stack }
    ... on PartitionSetNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on InvalidStepError { invalidStepKey }
    ... on InvalidOutputError { stepKey invalidOutputName }
} }"""

BACKFILL = """
query Backfill($backfillId: String!) { partitionBackfillOrError(backfillId: $backfillId) {
  __typename
  ... on PartitionBackfill { id status isAssetBackfill numPartitions partitionNames
    runs(limit: 200) { runId status jobName tags { key value } } }
  ... on BackfillNotFoundError { message }
  ... on PythonError { message }
} }"""

RUNS = """
query Runs($filter: RunsFilter, $limit: Int) { runsOrError(filter: $filter, limit: $limit) {
  __typename
  ... on Runs { results { runId jobName status startTime endTime tags { key value } assetSelection { path } } }
  ... on PythonError { message }
} }"""

ASSET_EVENTS = """
query AssetEvents($assetKey: AssetKeyInput!) { assetOrError(assetKey: $assetKey) {
  __typename
  ... on Asset { assetMaterializations(limit: 1000) { partition runId timestamp } }
} }"""

ASSET_OBSERVATIONS = """
query AssetObservations($assetKey: AssetKeyInput!) { assetOrError(assetKey: $assetKey) {
  __typename
  ... on Asset { assetObservations(limit: 1000) { partition runId timestamp } }
} }"""

ASSET_METADATA = """
query AssetMetadata($assetKey: AssetKeyInput!, $partitions: [String!]) { assetOrError(assetKey: $assetKey) {
  __typename
  ... on Asset { assetMaterializations(limit: 1, partitions: $partitions) { partition runId metadataEntries {
    label
    ... on IntMetadataEntry { intValue }
    ... on FloatMetadataEntry { floatValue }
    ... on TextMetadataEntry { text }
    ... on BoolMetadataEntry { boolValue }
    ... on JsonMetadataEntry { jsonString }
    ... on MarkdownMetadataEntry { mdStr }
  } } }
} }"""

SENSOR = """
query Sensor($sensorSelector: SensorSelector!) { sensorOrError(sensorSelector: $sensorSelector) {
  __typename
  ... on Sensor { id name sensorState { id selectorId status } }
  ... on SensorNotFoundError { message }
  ... on PythonError { message }
} }"""

START_SENSOR = """
mutation StartSensor($sensorSelector: SensorSelector!) { startSensor(sensorSelector: $sensorSelector) {
  __typename
  ... on Sensor { name sensorState { status } }
  ... on SensorNotFoundError { message }
  ... on UnauthorizedError { message }
  ... on PythonError { message }
} }"""

STOP_SENSOR = """
mutation StopSensor($id: String) { stopSensor(id: $id) {
  __typename
  ... on StopSensorMutationResult { instigationState { status } }
  ... on UnauthorizedError { message }
  ... on PythonError { message }
} }"""


def tags_of(run: Mapping[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run.get("tags", [])}
