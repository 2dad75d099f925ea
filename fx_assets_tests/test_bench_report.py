"""benchmarks/report.py: the README tables are regenerated from the result files only, and the
committed READMEs are what the committed result files give (so a hand edit of a figure fails)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _report() -> ModuleType:
    # Loaded by path: benchmarks/ is not an installed package (report.py needs only the stdlib).
    spec = importlib.util.spec_from_file_location(
        "bench_report_under_test", REPO / "benchmarks" / "report.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


report = _report()

README = """# Title

Hand-written text stays.

<!-- BEGIN GENERATED: summary -->
stale summary
<!-- END GENERATED -->

Between sections.

<!-- BEGIN GENERATED: result:bench_alpha -->
hand-typed figure 1.23 s
<!-- END GENERATED -->

<!-- BEGIN GENERATED: result:bench_indicators -->
<!-- END GENERATED -->

<!-- BEGIN GENERATED: other -->
<!-- END GENERATED -->
Tail.
"""


def _fake_results(d: Path) -> None:
    d.mkdir()
    alpha = {
        "benchmark": "bench_alpha",
        "when": "2026-01-02T03:04:05Z",
        "mode": "full",
        "machine": {"cpu_model": "Fake CPU 9000", "cores_usable": 2, "mem_total_gib": 8.0},
        "versions": {"fx_assets_commit": "0123456789abcdef"},
        "load_average_before": [0.5, 0.4, 0.3],
        "load_average_after": [1.5, 0.4, 0.3],
        "command": "python -m benchmarks.bench_alpha",
        "figures": {"x": {"min": 1.0, "median": 2.0, "max": 3.0, "rounds": 5}},
        "targets": [
            {"name": "alpha speed", "value": 4.321, "target": ">= 2 x", "pass": True, "note": ""},
            {"name": "alpha memory", "value": 9876.5, "target": "< 100 MiB", "pass": False, "note": ""},
            {"name": "alpha skipped", "value": None, "target": "< 1 s", "pass": None, "note": "no disk"},
        ],
    }
    beta = {  # the other targets shape (gpu_h200.json): name -> {value, target, pass}
        "command": "python3 -m benchmarks.bench_beta",
        "targets": {"beta_GBps": {"value": 55.5, "target": ">= 50.0", "pass": True}},
    }
    gamma = {
        "benchmark": "gamma",
        "figures": {
            "run_seconds": 19.65,
            "nested": {"bytes": 613325109},
            "cold": {
                "stages": {"decode": 1.5, "bars": {"min": 0.25, "median": 0.5, "max": 0.75, "rounds": 3}}
            },
        },
    }
    (d / "bench_alpha.json").write_text(json.dumps(alpha))
    (d / "bench_beta.json").write_text(json.dumps(beta))
    (d / "gamma.json").write_text(json.dumps(gamma))
    (d / "broken.json").write_text("{not json")


def test_sections_are_regenerated_from_the_result_files(tmp_path: Path) -> None:
    _fake_results(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert report.main(["--results", str(tmp_path / "results"), "--readme", str(readme), "--no-plots"]) == 0
    text = readme.read_text()
    # Outside the markers: untouched.
    assert text.startswith("# Title\n\nHand-written text stays.\n")
    assert "Between sections." in text and text.endswith("Tail.\n")
    # Inside: only what the files say.
    assert "stale summary" not in text and "hand-typed figure 1.23 s" not in text
    alpha = text.split("BEGIN GENERATED: result:bench_alpha -->")[1].split("<!-- END GENERATED -->")[0]
    assert "| alpha speed | 4.321 | >= 2 x | **pass** |" in alpha
    assert "| alpha memory | 9876 | < 100 MiB | **FAIL** |" in alpha
    assert "| alpha skipped | – | < 1 s | skip |" in alpha
    assert "Fake CPU 9000, 2 cores, 8 GiB" in alpha and "0.5 → 1.5" in alpha and "`0123456789`" in alpha
    # A known section whose file is missing says so.
    assert "`results/bench_indicators.json`: not run." in text
    # The summary lists every file, with pass / fail / skip counts.
    summary = text.split("BEGIN GENERATED: summary -->")[1].split("<!-- END GENERATED -->")[0]
    for name in ("bench_alpha", "bench_beta", "gamma", "broken"):
        assert f"`{name}.json`" in summary
    assert "| 1 / 1 / 1 |" in summary
    # Every file not claimed by a section is rendered generically in "other".
    other = text.split("BEGIN GENERATED: other -->")[1].split("<!-- END GENERATED -->")[0]
    assert "| beta_GBps | 55.5 | >= 50.0 | **pass** |" in other
    assert "| `run_seconds` | 19.65 |" in other and "| `nested.bytes` | 613,325,109 |" in other
    assert "`results/broken.json`: unreadable" in other
    # A per-stage breakdown anywhere under figures gets a table (medians of rounds) and a picture.
    assert "| decode | 1.5 |" in other and "| bars | 0.5 |" in other and "| **total** | **2** |" in other
    assert "![gamma: per-stage seconds](plots/gamma_stages.png)" in other
    # Regenerating again changes nothing; --check agrees.
    assert report.main(["--results", str(tmp_path / "results"), "--readme", str(readme), "--check"]) == 0
    # A figure changed in a result file makes the README stale until the report runs again.
    data = json.loads((tmp_path / "results" / "bench_alpha.json").read_text())
    data["targets"][0]["value"] = 5.5
    (tmp_path / "results" / "bench_alpha.json").write_text(json.dumps(data))
    assert report.main(["--results", str(tmp_path / "results"), "--readme", str(readme), "--check"]) == 1
    assert "4.321" in readme.read_text()  # --check writes nothing


def test_a_known_table_falls_back_to_the_generic_view_on_an_unknown_shape(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    odd = {
        "figures": {"volume_bars": {"timings": {}}},
        "targets": [{"name": "t", "value": 1.0, "target": "> 0", "pass": True}],
    }
    (tmp_path / "results" / "bench_peers.json").write_text(json.dumps(odd))
    text = report.regenerate(
        "<!-- BEGIN GENERATED: result:bench_peers -->\n<!-- END GENERATED -->\n",
        report.load_results(tmp_path / "results"),
    )
    assert "generic view" in text and "| t | 1 | > 0 | **pass** |" in text


def test_an_unclosed_marker_is_an_error() -> None:
    with pytest.raises(ValueError, match="has no"):
        report.regenerate("<!-- BEGIN GENERATED: summary -->\nno end\n", {})


@pytest.mark.parametrize(
    "readme", [REPO / "benchmarks" / "README.md", REPO / "README.md"], ids=["bench", "main"]
)
def test_committed_readme_is_what_the_committed_results_give(readme: Path) -> None:
    text = readme.read_text()
    assert "<!-- BEGIN GENERATED:" in text
    assert report.regenerate(text, report.load_results(REPO / "benchmarks" / "results")) == text, (
        f"{readme.relative_to(REPO)} differs from the result files: run `python -m benchmarks.report` "
        "(figures between the GENERATED markers are never edited by hand)"
    )


def test_plots_are_drawn_from_the_result_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _fake_results(tmp_path / "results")
    made = report.write_plots(report.load_results(tmp_path / "results"), tmp_path / "plots")
    assert made == [tmp_path / "plots" / "gamma_stages.png"]
    assert made[0].read_bytes().startswith(b"\x89PNG")
