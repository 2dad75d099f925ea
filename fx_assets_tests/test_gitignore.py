"""Files Dagster writes into the project root (DAGSTER_HOME under make demo / make ui) and the
browser test's screenshots are ignored by git."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WRITTEN = [
    ".nux/nux.yaml",
    ".telemetry/id.yaml",
    ".logs_queue/queue.log",
    "logs/event.log",
    "storage/run_1/compute_logs/x.out",
    "history/runs.db",
    "history/runs/index.db",
    "schedules/schedules.db",
    ".dagster_home/storage/runs.db",
    "artifacts/screenshots/asset-graph.png",
]


def test_dagster_instance_files_are_ignored() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail("needs a git checkout of the project")
    out = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *WRITTEN],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    not_ignored = [ln.split("\t")[-1] for ln in out.splitlines() if ln.startswith("::")]
    assert not_ignored == [], not_ignored
