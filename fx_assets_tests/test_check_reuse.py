"""The path people run (issue 10): what a Dagster run of a feature partition executes.

- Every launch path that is not the ``build_features`` job (the asset page's Materialize, ``dagster
  asset materialize``, the automation sensor's runs) goes through the code location's implicit
  asset job: it runs in process and takes the blocking checks along.
- A cache-hit run verifies each stage file once: the asset's reuse check and its asset check do
  not both read it (:mod:`fx_assets.core.verified`), and a check whose inputs have the content of
  a passed evaluation reuses its verdict (``verdict: reused``) — never when an input changed.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from fx_assets.assets import checks as checks_mod
from fx_assets.core import fxcache, tables, verified
from fx_assets.definitions import FEATURE_STAGES
from fx_assets.partitions import partition_key
from fx_assets_tests.test_cache_integrity import _flip_value
from fx_assets_tests.test_pipeline import Q1, Q2, QUIET, defs_for


def test_asset_page_and_cli_materializations_run_in_process_with_their_checks(market3: Path) -> None:
    defs = defs_for(market3, last=Q2)
    job = defs.resolve_implicit_global_asset_job_def()
    # the 7 stages of one partition, as the asset page (or --select) picks them: one in-process
    # plan holding the stages and every blocking check of theirs
    sub = job.get_subset(asset_selection={dg.AssetKey(s) for s in FEATURE_STAGES})
    assert job.executor_def.name == sub.executor_def.name == "in_process"
    assert set(sub.graph.node_dict) == set(FEATURE_STAGES) | {
        "predecoded_trades_sidecar_matches_source",
        "predecoded_mbp10_sidecar_matches_source",
        "bars_volume_conserved",
        "bar_features_features_valid",
        "ofi_features_features_valid",
        "ofi_features_causal_spot_check",
        "fxcache_fxcache_valid",
    }


def _run(defs: dg.Definitions, inst: dg.DagsterInstance, quarter) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def("build_features")
    return job.execute_in_process(
        instance=inst, partition_key=partition_key(quarter, "ES.FUT"), run_config=QUIET
    )


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    out = {}
    for ev in result.all_events:
        if ev.event_type_value == "ASSET_CHECK_EVALUATION":
            d = ev.event_specific_data
            out[f"{d.asset_key.to_user_string()}.{d.check_name}"] = {
                "passed": d.passed,
                **{k: v.value for k, v in d.metadata.items()},
            }
    return out


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts full verifications of stage tables and fxcache files, by file."""
    calls: Counter = Counter()
    real_table, real_fx = tables.verify_table, fxcache.verify_fxcache

    def table(path):
        calls[("table", Path(path).name)] += 1
        return real_table(path)

    def fx(path):
        calls[("fxcache", Path(path).name)] += 1
        return real_fx(path)

    for mod in ("fx_assets.core.tables", "fx_assets.assets.common", "fx_assets.core.verify"):
        if hasattr(__import__(mod, fromlist=["x"]), "verify_table"):
            monkeypatch.setattr(f"{mod}.verify_table", table)
    monkeypatch.setattr("fx_assets.core.fxcache.verify_fxcache", fx)
    monkeypatch.setattr("fx_assets.assets.checks.verify_fxcache", fx)
    real_bytes = verified.verify_fxcache_bytes

    def fx_bytes(path):
        calls[("fxcache-bytes", Path(path).name)] += 1
        return real_bytes(path)

    monkeypatch.setattr("fx_assets.core.verified.verify_fxcache_bytes", fx_bytes)
    return calls


def test_a_cache_hit_run_verifies_each_file_once_and_reuses_passed_verdicts(
    market3: Path, tmp_path: Path, counted: Counter
) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = defs_for(root, last=Q2)
    with dg.instance_for_test() as inst:
        assert _run(defs, inst, Q1).success
        first = _run(defs, inst, Q2)
        assert first.success
        built = {k: c["verdict"] for k, c in _checks(first).items() if "verdict" in c}
        # the bars stage evaluated volume conservation on the trades it had in memory
        assert built.pop("bars.volume_conserved") == "reused"
        assert set(built.values()) == {"evaluated"}
        verified.clear()
        counted.clear()
        hit = _run(defs, inst, Q2)
        assert hit.success
        reused = {
            ev.asset_key.to_user_string()
            for ev in hit.get_asset_materialization_events()
            if ev.materialization.metadata["action"].value == "reused"
        }
        assert reused == set(FEATURE_STAGES)
        # each file read by the stages and checks of the run is verified in full exactly once
        assert counted and max(counted.values()) == 1, counted
        assert any(kind == "fxcache-bytes" for kind, _ in counted)
        got = _checks(hit)
        assert all(c["passed"] for c in got.values()), got
        for name in (
            "bars.volume_conserved",
            "bar_features.features_valid",
            "ofi_features.features_valid",
            "ofi_features.causal_spot_check",
            "fxcache.fxcache_valid",
        ):
            assert got[name]["verdict"] == "reused", name
        # figures of the evaluation that passed come back with the verdict
        assert got["bars.volume_conserved"]["volume"] == _checks(first)["bars.volume_conserved"]["volume"]


def test_a_damaged_input_is_never_covered_by_a_recorded_verdict(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = defs_for(root, last=Q1)
    with dg.instance_for_test() as inst:
        assert _run(defs, inst, Q1).success
        feats = next((root / "derived" / "bar_features").rglob("*.arrow"))
        verified.clear()
        _flip_value(feats, "rsi_14")
        # the asset's reuse check finds it and rebuilds; the rebuilt file has the original bytes
        r = _run(defs, inst, Q1)
        assert r.success
        tables.verify_table(feats)
        # damaged after this process verified it: the stat moved, so the check's input identity
        # verifies it again and fails instead of reusing the recorded verdict
        _flip_value(feats, "rsi_14")
        with pytest.raises(Exception, match="checksum"):
            checks_mod.recorded_verdict(
                feats, "features_valid", [verified.table_identity(feats)], lambda: {"rows": 1}
            )


def test_recorded_verdict_reevaluates_when_inputs_or_code_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "x.arrow"
    out.write_bytes(b"x")
    calls: list[int] = []

    def evaluate() -> dict:
        calls.append(1)
        return {"rows": 7}

    assert checks_mod.recorded_verdict(out, "c", ["a", "b"], evaluate)["verdict"] == "evaluated"
    again = checks_mod.recorded_verdict(out, "c", ["a", "b"], evaluate)
    assert again == {"rows": 7, "verdict": "reused"} and len(calls) == 1
    assert checks_mod.recorded_verdict(out, "c", ["a", "B"], evaluate)["verdict"] == "evaluated"
    assert checks_mod.recorded_verdict(out, "other", ["a", "B"], evaluate)["verdict"] == "evaluated"
    monkeypatch.setattr("fx_assets.assets.common.source_fingerprint", lambda: "another package source")
    assert checks_mod.recorded_verdict(out, "c", ["a", "B"], evaluate)["verdict"] == "evaluated"
    assert len(calls) == 4

    def failing() -> dict:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        checks_mod.recorded_verdict(out, "c", ["z"], failing)
    assert checks_mod.recorded_verdict(out, "c", ["z"], evaluate)["verdict"] == "evaluated"


def test_verify_once_verifies_again_after_any_change_of_the_file(tmp_path: Path) -> None:
    verified.clear()
    f = tmp_path / "t.bin"
    f.write_bytes(b"abc")
    seen: list[bytes] = []
    assert verified.verify_once(f, "k", lambda p: seen.append(p.read_bytes()))
    assert not verified.verify_once(f, "k", lambda p: seen.append(p.read_bytes()))
    assert verified.verify_once(f, "other kind", lambda p: seen.append(p.read_bytes()))
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a touch
    assert verified.verify_once(f, "k", lambda p: seen.append(p.read_bytes()))
    tmp = tmp_path / "t.new"
    tmp.write_bytes(b"abd")
    os.replace(tmp, f)  # replaced by rename (same size)
    assert verified.verify_once(f, "k", lambda p: seen.append(p.read_bytes()))
    assert seen[-1] == b"abd"

    def bad(_p: Path) -> None:
        raise ValueError("damaged")

    f.write_bytes(b"zzz")
    with pytest.raises(ValueError):
        verified.verify_once(f, "k", bad)
    assert "k" not in verified.verified_kinds(f)
