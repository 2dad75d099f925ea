"""The harness itself: dagster dev starts on a free port, loads the code location, answers
GraphQL, and its whole process group is gone after stop()."""

import os
import signal

from fx_assets_tests.e2e.harness import DagsterDev, _group_alive


def test_dagster_dev_starts_answers_graphql_and_stops(dagster_dev_factory) -> None:
    dev: DagsterDev = dagster_dev_factory(quarters="")
    assert dev.sensor_state("fx_automation") == "RUNNING"
    data = dev.gql("query { version }")
    assert data["version"]
    jobs = dev.gql(
        "query($s: RepositorySelector!) { repositoryOrError(repositorySelector: $s) {"
        " ... on Repository { jobs { name } } } }",
        {"s": dev.repo_selector},
    )["repositoryOrError"]["jobs"]
    assert {"build_features", "observe_raw"} <= {j["name"] for j in jobs}
    pgid = dev.proc.pid
    dev.stop()
    assert not _group_alive(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)  # nothing left to signal
    except ProcessLookupError:
        pass
