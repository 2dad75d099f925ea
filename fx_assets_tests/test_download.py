"""``fx-assets download`` and fx_assets.core.download against a local fake of Databento's
historical API (fake_databento.py) serving the real GLBX.MDP3 fixture files."""

from __future__ import annotations

import datetime as dt
import io
import logging
from pathlib import Path

import dagster as dg
import pytest
from rich.console import Console

from fx_assets import cli
from fx_assets.core import download as dl
from fx_assets.core.paths import DataLayout
from fx_assets_tests.fake_databento import FakeDatabento

KEY = "db-SECRETkey0123456789abcdefXYZ"  # distinctive, so any leak is found by substring
Q1 = dt.date(2024, 1, 1)


@pytest.fixture
def bodies(dbn_fixtures: Path) -> dict[str, bytes]:
    d = dbn_fixtures / "databento-python" / "GLBX.MDP3"
    return {
        "trades": (d / "test_data.trades.dbn.zst").read_bytes(),
        "mbp-10": (d / "test_data.mbp-10.dbn.zst").read_bytes(),
    }


@pytest.fixture
def fake(bodies: dict[str, bytes], monkeypatch: pytest.MonkeyPatch):
    # The client forces https on its gateway; the fake speaks plain HTTP on 127.0.0.1.
    monkeypatch.setattr("databento.historical.client.validate_gateway", lambda u: u)
    monkeypatch.setenv(dl.API_KEY_ENV, KEY)
    with FakeDatabento(bodies, key=KEY) as f:
        yield f


def run_cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=buf, width=200, force_terminal=False))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: never prompts
    rc = cli.main(list(argv))
    return rc, buf.getvalue()


def download_args(fake: FakeDatabento, root: Path, *extra: str) -> list[str]:
    return [
        "download",
        "--dataset",
        "GLBX.MDP3",
        "--symbols",
        "ES.FUT",
        "--schemas",
        "trades,mbp-10",
        "--quarters",
        "2024-Q1",
        "--out",
        str(root),
        "--gateway",
        fake.url,
        *extra,
    ]


def raw(root: Path, schema: str) -> Path:
    return DataLayout(root).raw_file(schema, "ES.FUT", Q1)


def leftovers(root: Path) -> list[Path]:
    return sorted(p for p in (root / "raw").rglob("*") if p.is_file() and p.name.startswith("."))


def test_missing_key_is_a_one_line_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(dl.API_KEY_ENV, raising=False)
    rc, out = run_cli(monkeypatch, "download", "--quarters", "2024-Q1", "--out", str(tmp_path))
    assert rc == 2
    assert out.strip().count("\n") == 0
    assert "DATABENTO_API_KEY is not set" in out


def test_cost_table_then_refuses_without_yes(
    fake: FakeDatabento, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path))
    assert rc == 1
    assert "rerun with --yes" in out
    # One row per (symbol, schema, quarter), then the total: 2 x $1.25, 2 x 4 records.
    assert out.count("2024-Q1") == 2 and "2.50" in out and "1.25" in out
    assert "total" in out and "8" in out and "0.002" in out  # billable GB of 2 x 1,234,567 bytes
    cost = [r for r in fake.requests if r["path"] == "/v0/metadata.get_cost"]
    assert {r["form"]["schema"] for r in cost} == {"trades", "mbp-10"}
    for r in cost:
        assert r["form"]["symbols"] == "ES.FUT" and r["form"]["stype_in"] == "parent"
        assert (r["form"]["start"], r["form"]["end"]) == ("2024-01-01", "2024-04-01")
    assert {"/v0/metadata.get_billable_size", "/v0/metadata.get_record_count"} <= set(fake.paths())
    assert "/v0/timeseries.get_range" not in fake.paths()
    assert not (tmp_path / "raw").exists() or not any((tmp_path / "raw").rglob("*.zst"))


def test_max_cost_refuses_above_the_limit(
    fake: FakeDatabento, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes", "--max-cost", "2.00"))
    assert rc == 2
    assert "$2.50" in out and "above --max-cost $2.00" in out
    assert "/v0/timeseries.get_range" not in fake.paths()
    rc, _ = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes", "--max-cost", "2.50"))
    assert rc == 0 and raw(tmp_path, "trades").is_file()


def test_download_lands_files_skips_them_after_and_never_shows_the_key(
    fake: FakeDatabento,
    bodies: dict[str, bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 0, out
    for schema in ("trades", "mbp-10"):
        assert raw(tmp_path, schema).read_bytes() == bodies[schema]
    got = [r for r in fake.requests if r["path"] == "/v0/timeseries.get_range"]
    assert [r["form"]["schema"] for r in got] == ["trades", "mbp-10"]
    assert all(r["form"]["stype_in"] == "parent" and r["form"]["symbols"] == "ES.FUT" for r in got)
    assert leftovers(tmp_path) == []
    # A rerun finds both files complete: no quote, no download.
    n = len(fake.requests)
    rc, out2 = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 0 and "already present" in out2
    assert len(fake.requests) == n
    # The key went to the server (basic auth) and nowhere else.
    assert all(r["headers"]["authorization"].startswith("Basic ") for r in fake.requests)
    seen = out + out2 + caplog.text + "".join(capfd.readouterr())
    assert KEY not in seen


def test_interrupted_download_leaves_nothing_and_restarts(
    fake: FakeDatabento, bodies: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.drop["/v0/timeseries.get_range"] = 0.5  # the trades body stops halfway, connection closed
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 2
    assert "ES.FUT trades 2024-Q1: download" in out
    assert not raw(tmp_path, "trades").exists() and not raw(tmp_path, "mbp-10").exists()
    assert leftovers(tmp_path) == []
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 0, out
    assert raw(tmp_path, "trades").read_bytes() == bodies["trades"]
    assert raw(tmp_path, "mbp-10").read_bytes() == bodies["mbp-10"]


def test_a_cleanly_cut_stream_is_caught_by_its_zstd_frames(
    fake: FakeDatabento, dbn_fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 120 real ESU4 trades: cut to 90% with a matching Content-Length, the client sees success
    # and the file still decodes (28 records); only the zstd frame check sees the cut.
    cat = dbn_fixtures / "nautilus_trader" / "historical_bars_catalog"
    fake.bodies["trades"] = (cat / "futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst").read_bytes()
    fake.truncate["/v0/timeseries.get_range"] = 0.9
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 2 and "truncated download" in out
    assert not raw(tmp_path, "trades").exists() and leftovers(tmp_path) == []


def test_stale_temporary_of_a_killed_run_is_removed(
    fake: FakeDatabento, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    final = raw(tmp_path, "trades")
    final.parent.mkdir(parents=True)
    stale = final.with_name(f".{final.name}.tmp-99999-deadbeef")
    stale.write_bytes(b"half a file")
    rc, _ = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 0 and final.is_file() and not stale.exists()


@pytest.mark.parametrize(
    ("where", "status", "expect"),
    [
        ("/v0/metadata.get_cost", 401, "HTTP 401: Authentication failed. (check DATABENTO_API_KEY)"),
        ("/v0/timeseries.get_range", 401, "HTTP 401: Authentication failed. (check DATABENTO_API_KEY)"),
        ("/v0/timeseries.get_range", 503, "HTTP 503: busy (server error: retry later)"),
        ("/v0/timeseries.get_range", 500, "HTTP 500: boom (server error: retry later)"),
    ],
)
def test_http_errors_give_a_clear_message_and_no_partial_file(
    fake: FakeDatabento,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    status: int,
    expect: str,
) -> None:
    detail = {401: "Authentication failed.", 503: "busy", 500: "boom"}[status]
    fake.fail[where] = (status, {"detail": detail})
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 2
    assert expect in out
    assert "ES.FUT trades 2024-Q1" in out
    assert not raw(tmp_path, "trades").exists() and leftovers(tmp_path) == []


def test_wrong_key_401_and_an_echoed_key_is_scrubbed(
    fake: FakeDatabento, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "db-WRONGkeyZZZZZZZZZZZZZZZZZZZ"
    monkeypatch.setenv(dl.API_KEY_ENV, wrong)
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 2 and "HTTP 401" in out and "check DATABENTO_API_KEY" in out
    monkeypatch.setenv(dl.API_KEY_ENV, KEY)
    fake.fail["/v0/metadata.get_cost"] = (422, {"detail": f"bad request from key {KEY}"})
    rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
    assert rc == 2 and "HTTP 422" in out and KEY not in out and "***" in out


def test_incomplete_quarter_is_refused() -> None:
    with pytest.raises(ValueError, match="2026-Q4 is not complete yet"):
        dl.plan("GLBX.MDP3", ["ES.FUT"], ["trades"], [dt.date(2026, 10, 1)], today=dt.date(2026, 12, 1))
    with pytest.raises(ValueError, match="no symbols"):
        dl.plan("GLBX.MDP3", [], ["trades"], [Q1])
    with pytest.raises(ValueError, match="schema 'ohlcv-1m'"):
        dl.plan("GLBX.MDP3", ["ES.FUT"], ["ohlcv-1m"], [Q1])


def test_batch_job_above_the_threshold_resumes_and_reuses_its_job(
    fake: FakeDatabento, bodies: dict[str, bytes], tmp_path: Path
) -> None:
    client = dl.make_client(KEY, fake.url)
    layout = DataLayout(tmp_path)
    reqs = dl.plan("GLBX.MDP3", ["ES.FUT"], ["mbp-10"], [Q1])
    quotes = dl.quote(client, reqs, layout, key=KEY, batch_threshold_bytes=1_000_000)
    assert [q.method for q in quotes] == ["batch"]  # 1,234,567 billable bytes > 1 MB
    # First attempt: the job is submitted, then listing its files fails.
    fake.fail["/v0/batch.list_files"] = (503, {"detail": "busy"})
    with pytest.raises(dl.DownloadError, match="HTTP 503"):
        dl.download(client, quotes, key=KEY, poll_seconds=0.0)
    assert not raw(tmp_path, "mbp-10").exists()
    # Second attempt: same job (no second submit, so no second bill); the file body is cut
    # halfway once, and the client resumes it with a Range request.
    job = next(iter(fake.jobs.values()))
    fake.drop[f"/v0/batch/download/U/{job['id']}/{job['file']}"] = 0.5
    (res,) = dl.download(client, quotes, key=KEY, poll_seconds=0.0)
    assert res.action == "batch" and res.extra["job_id"] == job["id"]
    assert raw(tmp_path, "mbp-10").read_bytes() == bodies["mbp-10"]
    assert fake.paths().count("/v0/batch.submit_job") == 1
    sub = next(r for r in fake.requests if r["path"] == "/v0/batch.submit_job")
    assert sub["form"]["split_duration"] == "none" and sub["form"]["stype_in"] == "parent"
    assert any("range" in r["headers"] for r in fake.requests if "batch/download" in r["path"])
    assert leftovers(tmp_path) == [] and not any(
        p.is_dir() for p in (tmp_path / "raw/mbp-10/ES.FUT").iterdir()
    )


def test_raw_observation_sees_downloaded_files(
    fake: FakeDatabento, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fx_assets.definitions import build_definitions
    from fx_assets.settings import ProjectSettings

    defs = build_definitions(ProjectSettings(data_root=tmp_path, first_quarter=Q1, last_quarter=Q1))
    job = defs.resolve_job_def("observe_raw")
    with dg.instance_for_test() as inst:
        assert job.execute_in_process(instance=inst, resources=dict(defs.resources or {})).success
        assert inst.fetch_observations(dg.AssetKey("raw_trades"), limit=5).records == []
        rc, out = run_cli(monkeypatch, *download_args(fake, tmp_path, "--yes"))
        assert rc == 0, out
        # A file is reported once it is unchanged between two observations (raw_files_sensor
        # observes after every change of the raw folders, and once more to confirm).
        for _ in range(2):
            assert job.execute_in_process(instance=inst, resources=dict(defs.resources or {})).success
        for name in ("raw_trades", "raw_mbp10"):
            (rec,) = inst.fetch_observations(dg.AssetKey(name), limit=5).records
            obs = rec.event_log_entry.asset_observation
            assert obs is not None and obs.partition == "2024-01|ES.FUT"
            assert obs.data_version


# --- the download_raw job ---------------------------------------------------------------------


def _dagster_text(inst: dg.DagsterInstance, run_id: str) -> str:
    """Everything Dagster stored about a run: events (messages, metadata, errors), config, tags."""
    run = inst.get_run_by_id(run_id)
    assert run is not None
    events = inst.all_logs(run_id)
    return "\n".join(
        [dg.serialize_value(e) for e in events] + [repr(run.run_config), repr(run.tags)]  # type: ignore[arg-type]
    )


def _download_run(defs: dg.Definitions, inst: dg.DagsterInstance, max_cost: float = 10.0):
    job = defs.resolve_job_def("download_raw")
    return job.execute_in_process(
        instance=inst,
        run_config={
            "ops": {"download_raw_files": {"config": {"quarters": "2024-Q1", "max_cost_usd": max_cost}}}
        },
        raise_on_error=False,
    )


def _defs_with_fake(root: Path, fake: FakeDatabento) -> dg.Definitions:
    from fx_assets.assets.download import DatabentoResource
    from fx_assets.definitions import build_definitions
    from fx_assets.settings import ProjectSettings

    defs = build_definitions(ProjectSettings(data_root=root, first_quarter=Q1, last_quarter=Q1))
    # The code location's job and resources, with the gateway pointed at the fake.
    key_res = DatabentoResource(api_key=dg.EnvVar(dl.API_KEY_ENV), gateway=fake.url)
    return dg.Definitions(
        assets=list(defs.assets or []),
        jobs=list(defs.jobs or []),
        resources={**dict(defs.resources or {}), "databento": key_res},
    )


def test_download_job_fetches_then_observe_raw_sees_the_files(
    fake: FakeDatabento, bodies: dict[str, bytes], tmp_path: Path
) -> None:
    defs = _defs_with_fake(tmp_path, fake)
    with dg.instance_for_test() as inst:
        r = _download_run(defs, inst)
        assert r.success
        for schema in ("trades", "mbp-10"):
            assert raw(tmp_path, schema).read_bytes() == bodies[schema]
        (mat,) = [e for e in r.all_events if e.event_type_value == "STEP_OUTPUT"]
        md = mat.event_specific_data.metadata  # type: ignore[union-attr]
        assert md["fetched"].value == 2 and md["cost_usd"].value == 2.5
        text = _dagster_text(inst, r.run_id)
        assert KEY not in text and "DATABENTO_API_KEY" not in repr(inst.get_run_by_id(r.run_id).run_config)  # type: ignore[union-attr]
        for _ in range(2):  # seen, then confirmed unchanged: reported
            obs = defs.resolve_job_def("observe_raw").execute_in_process(
                instance=inst, resources=dict(defs.resources or {})
            )
            assert obs.success
        (rec,) = inst.fetch_observations(dg.AssetKey("raw_mbp10"), limit=5).records
        assert rec.event_log_entry.asset_observation.partition == "2024-01|ES.FUT"  # type: ignore[union-attr]


def test_download_job_refuses_over_budget_and_errors_hold_no_key(fake: FakeDatabento, tmp_path: Path) -> None:
    defs = _defs_with_fake(tmp_path, fake)
    with dg.instance_for_test() as inst:
        r = _download_run(defs, inst, max_cost=1.0)
        assert not r.success
        text = _dagster_text(inst, r.run_id)
        assert "above --max-cost $1.00" in text and KEY not in text
        assert "/v0/timeseries.get_range" not in fake.paths()
        fake.fail["/v0/timeseries.get_range"] = (422, {"detail": f"echo {KEY}"})
        r = _download_run(defs, inst)
        assert not r.success
        text = _dagster_text(inst, r.run_id)
        assert "HTTP 422" in text and KEY not in text
        assert not raw(tmp_path, "trades").exists() and leftovers(tmp_path) == []


def test_download_job_without_the_key_names_the_variable(
    fake: FakeDatabento, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(dl.API_KEY_ENV)
    defs = _defs_with_fake(tmp_path, fake)
    # Dagster resolves the EnvVar before the run starts and says which variable is missing
    # (its own config error; the launchpad shows the same before launching).
    with dg.instance_for_test() as inst, pytest.raises(dg.DagsterInvalidConfigError) as err:
        _download_run(defs, inst)
    assert 'environment variable "DATABENTO_API_KEY" which is not set' in str(err.value)
    assert "/v0/metadata.get_cost" not in fake.paths()
