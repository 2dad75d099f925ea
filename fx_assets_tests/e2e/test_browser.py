"""The Dagster UI as a person uses it, in Debian's Chromium driven by Playwright (.ci/browser.sh
installs both): the asset graph shows every asset in its group, one partition is materialized
by clicking, and the walk-forward report's equity picture opens.

Screenshots go to ``artifacts/screenshots/`` (``FX_SCREENSHOTS`` overrides; CI keeps them).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fx_assets_tests.e2e.harness import REPO, DagsterDev
from fx_assets_tests.e2e.phases import Phases

pytestmark = pytest.mark.browser

SHOTS = Path(os.environ.get("FX_SCREENSHOTS", REPO / "artifacts" / "screenshots"))
PARTITION = "2024-01|ES.FUT"
FOLD = "2024-04|ES.FUT"
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
UI_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    exe = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(exe).is_file():
        pytest.fail("Debian's chromium is not installed: run .ci/browser.sh")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run .ci/browser.sh")
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


def shot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def groups_of_assets(dev: DagsterDev) -> dict[str, set[str]]:
    """group -> asset names, as the code location defines them (the source of truth)."""
    nodes = dev.gql("query { assetNodes { assetKey { path } groupName } }")["assetNodes"]
    out: dict[str, set[str]] = {}
    for n in nodes:
        out.setdefault(n["groupName"], set()).add("/".join(n["assetKey"]["path"]))
    return out


def drawn(label: str, name: str) -> bool:
    """A node label shows the asset's name, or a middle-truncated form of it ("walk_forwa…_report")."""
    if "…" not in label:
        return label == name
    head, tail = label.split("…", 1)
    return name.startswith(head) and name.endswith(tail)


def build_for_the_report(dev: DagsterDev) -> None:
    """Features of both quarters, the 2024-Q2 fold (few epochs) and the report, recorded in the
    running instance (in this process: the UI shows them like any other run)."""
    import dagster as dg

    from fx_assets.definitions import build_definitions
    from fx_assets.settings import load_settings

    settings = load_settings({k: v for k, v in dev.env.items() if k.startswith("FX_")})
    defs = build_definitions(settings)
    res = dict(defs.resources or {})
    short = {**QUIET, "resources": {"training": {"config": {"train": {"epochs": 3}}}}}
    with dg.DagsterInstance.from_config(str(dev.home)) as inst:
        for pk in (PARTITION, "2024-04|ES.FUT"):
            r = defs.resolve_job_def("build_features").execute_in_process(
                partition_key=pk, instance=inst, resources=res, run_config=QUIET
            )
            assert r.success, pk
        r = defs.resolve_job_def("train_models").execute_in_process(
            instance=inst,
            resources=res,
            run_config=short,
            tags={"dagster/asset_partition_range_start": FOLD, "dagster/asset_partition_range_end": FOLD},
        )
        assert r.success
        r = defs.resolve_job_def("walk_forward").execute_in_process(
            instance=inst, resources=res, run_config=short
        )
        assert r.success


def test_ui_graph_click_to_materialize_and_equity_picture(dagster_dev_factory, chromium) -> None:
    from playwright.sync_api import expect

    phase = Phases()
    for old in SHOTS.glob("*.png"):
        old.unlink()
    dev: DagsterDev = dagster_dev_factory(quarters="2024-Q1:2024-Q2", train_quarters=1)
    dev.stop_sensor("fx_automation")  # this test builds what it shows; automation would race it
    phase("start")
    page = chromium.new_page(viewport={"width": 1600, "height": 1000})
    page.set_default_timeout(UI_TIMEOUT_MS)
    repo = f"{dev.repository}@{dev.location}"

    # 1. The asset graph: the global lineage lists every group; each group's graph draws each of
    #    its assets as a node (not only as a link to another group).
    groups = groups_of_assets(dev)
    assert set(groups) == {"raw", "ingest", "features", "training", "research"}, groups
    page.goto(f"{dev.url}/asset-groups", wait_until="networkidle")
    for g in groups:
        expect(page.get_by_text(g, exact=True).first).to_be_visible()
    expect(page.get_by_text("(fetching statuses)")).to_have_count(0)
    shot(page, "01-global-lineage")
    for i, (g, names) in enumerate(sorted(groups.items()), start=2):
        page.goto(f"{dev.url}/locations/{repo}/asset-groups/{g}", wait_until="networkidle")
        nodes = page.locator("[class*='AssetNode_assetName']")
        expect(nodes).to_have_count(len(names))
        labels = [t.strip() for t in nodes.all_inner_texts()]
        assert all(any(drawn(lbl, n) for lbl in labels) for n in names), (g, labels, names)
        expect(page.get_by_text("Loading…")).to_have_count(0)  # statuses filled in before the picture
        shot(page, f"{i:02d}-group-{g}")
    phase("graph")

    # 2. Materialize one partition by clicking: asset page -> Materialize -> pick the quarter and
    #    the symbol -> "Launch 1 run"; then the run's page until it says Success.
    page.goto(f"{dev.url}/assets/predecoded_trades?view=partitions", wait_until="networkidle")
    page.get_by_role("button", name="Materialize").first.click()
    dialog = page.get_by_role("dialog")
    quarter = dialog.get_by_placeholder(re.compile("^ex: "))
    quarter.fill(PARTITION.split("|")[0])
    quarter.press("Enter")
    dialog.get_by_role("button", name="All", exact=True).nth(1).click()  # the symbol dimension
    expect(dialog.get_by_text("1 partition", exact=True)).to_be_visible()
    shot(page, "06-launch-dialog")
    dialog.get_by_role("button", name="Launch 1 run").click()
    toast = page.get_by_text(re.compile(r"Launched run [0-9a-f]{8}"))
    expect(toast).to_be_visible()
    short_id = re.search(r"[0-9a-f]{8}", toast.inner_text()).group(0)  # type: ignore[union-attr]
    run = next(r for r in dev.runs() if r["runId"].startswith(short_id))
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags.get("dagster/partition") == PARTITION
    assert [a["path"] for a in run["assetSelection"]] == [["predecoded_trades"]]
    page.goto(f"{dev.url}/runs/{run['runId']}", wait_until="networkidle")
    expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=180_000)
    shot(page, "07-run-success")
    assert dev.materialized_partitions("predecoded_trades").get(PARTITION, 0) >= 1
    phase("click to materialize")

    # 3. The report's equity picture: its metadata row opens the picture, which really loads.
    build_for_the_report(dev)
    phase("build for the report")
    page.goto(f"{dev.url}/assets/trained_model", wait_until="networkidle")
    folds = page.get_by_role("row").filter(has=page.get_by_text("folds", exact=True)).locator("table")
    expect(folds).to_be_visible()
    header = folds.locator("th").all_inner_texts()
    cells = folds.locator("tbody tr").first.locator("td").all_inner_texts()
    assert len(cells) == len(header) and cells[0] == "2024-Q2 ES.FUT", (header, cells)
    shot(page, "08-trained-model-folds")
    page.goto(f"{dev.url}/assets/walk_forward_report", wait_until="networkidle")
    row = page.get_by_role("row").filter(has_text="ES.FUT_equity")
    row.get_by_text("[Show Markdown]").click()
    img = page.get_by_role("dialog").locator("img")
    expect(img).to_be_visible()
    width, height, alt = img.evaluate("i => [i.naturalWidth, i.naturalHeight, i.alt]")
    assert width > 300 and height > 100 and alt == "ES.FUT walk-forward"
    shot(page, "09-report-equity")
    page.close()
    phase("report pages")
    phase.report()
