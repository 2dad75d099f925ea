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
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from fx_assets.assets import checks as checks_mod
from fx_assets.core import fxcache, tables, verified
from fx_assets.definitions import FEATURE_STAGES
from fx_assets.partitions import partition_key
from fx_assets_tests.test_asset_checks import flip_unsampled_price_byte
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
        # Verified files carry a record of the verification beside them; without it (as a run
        # of a fresh process saw them before this record existed) each file is verified in full.
        records = sorted((root / "derived").rglob("*.verified.json"))
        assert {r.name.split(".")[-3] for r in records} == {"arrow", "fxcache"}, records
        for r in records:
            r.unlink()
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
        # the next run (another process: nothing remembered in memory) finds the records of those
        # verifications with the files' stat stamps unchanged: a full hit reads no file whole
        verified.clear()
        counted.clear()
        again = _run(defs, inst, Q2)
        assert again.success and not counted, counted
        assert all(c["passed"] and c.get("verdict") != "evaluated" for c in _checks(again).values())
        assert {
            ev.materialization.metadata["action"].value for ev in again.get_asset_materialization_events()
        } == {"reused"}


def test_a_damaged_input_is_never_covered_by_a_recorded_verdict(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = defs_for(root, last=Q1)
    with dg.instance_for_test() as inst:
        assert _run(defs, inst, Q1).success
        feats = next((root / "derived" / "bar_features").rglob("*.arrow"))
        # the build run verified it and recorded that beside it (the shortcut of the next hit)
        assert verified.record_path(feats).is_file()
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
    monkeypatch.setattr("fx_assets.assets.common.package_fingerprint", lambda: "another package source")
    assert checks_mod.recorded_verdict(out, "c", ["a", "B"], evaluate)["verdict"] == "evaluated"
    assert len(calls) == 4

    def failing() -> dict:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        checks_mod.recorded_verdict(out, "c", ["z"], failing)
    assert checks_mod.recorded_verdict(out, "c", ["z"], evaluate)["verdict"] == "evaluated"


def test_recorded_verdict_reads_the_package_sources_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full cache hit runs 5 recorded checks: the fingerprint of the sources they carry is read
    once per process (the code the process imported), not once a check."""
    from fx_assets.assets import common
    from fx_assets.core import codeversion

    reads: list[int] = []

    def fingerprint() -> str:
        reads.append(1)
        return "the package source"

    monkeypatch.setattr(codeversion, "source_fingerprint", lambda root=None: fingerprint())
    codeversion.package_fingerprint.cache_clear()
    try:
        out = tmp_path / "x.arrow"
        out.write_bytes(b"x")
        for check in ("volume_conserved", "features_valid", "causal_spot_check"):
            common.recorded_verdict(out, check, ["a"], lambda: {"rows": 1})
            common.recorded_verdict(out, check, ["a"], lambda: {"rows": 1})
        assert len(reads) == 1
    finally:
        codeversion.package_fingerprint.cache_clear()  # the next caller reads the real sources


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


def _edit_in_place(f: Path, data: bytes) -> None:
    """Overwrite ``f``'s bytes in place (same inode and size), as a tool editing it would; after
    a pause, so that the coarse kernel clock has moved on since the file was last written."""
    time.sleep(0.05)
    with open(f, "r+b") as fh:
        fh.write(data)


def test_a_recorded_verification_holds_across_processes_only_for_the_same_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verified.clear()
    f = tmp_path / "t.arrow"
    f.write_bytes(b"abc")
    seen: list[bytes] = []

    def check(p: Path) -> None:
        data = p.read_bytes()
        seen.append(data)
        if data != b"abc" and data != b"abd":
            raise ValueError(f"{p}: checksum mismatch")

    assert verified.verify_once(f, "k", check)
    assert verified.record_path(f).is_file()
    verified.clear()  # another process: nothing in memory, the record beside the file
    assert not verified.verify_once(f, "k", check)
    assert verified.verify_once(f, "other kind", check)  # recorded per kind
    verified.clear()
    assert not verified.verify_once(f, "k", check) and not verified.verify_once(f, "other kind", check)
    assert len(seen) == 2

    # damaged in place (same size and inode): the stamp moved, so it is verified and fails
    _edit_in_place(f, b"abz")
    verified.clear()
    with pytest.raises(ValueError, match="checksum"):
        verified.verify_once(f, "k", check)
    verified.clear()
    with pytest.raises(ValueError, match="checksum"):  # a failure records nothing
        verified.verify_once(f, "k", check)

    # repaired in place with its mtime set back: ctime still moved, so it is verified again
    st = f.stat()
    _edit_in_place(f, b"abc")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    verified.clear()
    assert verified.verify_once(f, "k", check)
    verified.clear()
    assert not verified.verify_once(f, "k", check)

    # replaced by rename (same size), a copy in its place, a touch: verified again each time
    tmp = tmp_path / "t.new"
    tmp.write_bytes(b"abd")
    os.replace(tmp, f)
    verified.clear()
    assert verified.verify_once(f, "k", check) and seen[-1] == b"abd"
    shutil.copy2(f, tmp)
    os.replace(tmp, f)
    verified.clear()
    assert verified.verify_once(f, "k", check)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    verified.clear()
    assert verified.verify_once(f, "k", check)

    # another package source, a record of another file or a torn record: verified again
    verified.clear()
    assert not verified.verify_once(f, "k", check)
    monkeypatch.setattr(verified, "_code", lambda: "another package source")
    verified.clear()
    assert verified.verify_once(f, "k", check)
    monkeypatch.undo()
    g = tmp_path / "g.arrow"
    g.write_bytes(b"abd")
    verified.verify_once(f, "k", check)
    shutil.copy(verified.record_path(f), verified.record_path(g))
    verified.clear()
    assert verified.verify_once(g, "k", check)
    verified.record_path(f).write_text('{"version": 1, "na')
    verified.clear()
    assert verified.verify_once(f, "k", check)
    # persist=False neither reads nor writes the record
    verified.record_path(f).unlink()
    verified.clear()
    assert verified.verify_once(f, "k", check, persist=False)
    assert not verified.record_path(f).exists()


def test_a_record_that_cannot_be_written_only_costs_verifications(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only data root: the verification passes, nothing is recorded, the next process
    verifies again."""
    verified.clear()
    f = tmp_path / "t.arrow"
    f.write_bytes(b"abc")

    def read_only(path, _text):
        raise PermissionError(13, "Read-only file system", str(path))

    monkeypatch.setattr(verified, "atomic_write_text", read_only)
    assert verified.verify_once(f, "k", lambda p: None)
    assert not verified.record_path(f).exists()
    assert not verified.verify_once(f, "k", lambda p: None)  # remembered in this process
    verified.clear()
    assert verified.verify_once(f, "k", lambda p: None)


def test_verify_against_once_verifies_again_when_either_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sidecar checked against its raw file: the pass is remembered with both files' stat
    stamps; an edit of either (same size, mtime set back), a replaced sidecar, a link pointed at
    another raw file, a code change or ``force`` verifies again."""
    verified.clear()
    side, raw = tmp_path / "s.arrow", tmp_path / "r.dbn.zst"
    side.write_bytes(b"side")
    raw.write_bytes(b"raw0")
    link = tmp_path / "link.dbn.zst"
    link.symlink_to(raw)
    seen: list[tuple[bytes, bytes]] = []

    def check(p: Path) -> None:
        pair = (p.read_bytes(), link.read_bytes())
        seen.append(pair)
        if pair != (b"side", b"raw0"):
            raise ValueError(f"{p}: source changed")

    def once(**kw) -> bool:
        verified.clear()  # each call as a fresh process would make it: only the record counts
        return verified.verify_against_once(side, link, "sidecar_matches_source", check, **kw)

    assert once() and not once() and len(seen) == 1
    assert not verified.verify_against_once(side, link, "sidecar_matches_source", check)  # in memory
    # the raw file edited in place, same size, its mtime set back: ctime moved
    st = raw.stat()
    _edit_in_place(raw, b"raw1")
    os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ValueError, match="source changed"):
        once()
    with pytest.raises(ValueError, match="source changed"):  # a failure records nothing
        once()
    _edit_in_place(raw, b"raw0")
    os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert once() and not once()
    # the sidecar edited in place, then replaced by rename (same bytes): verified each time
    sst = side.stat()
    _edit_in_place(side, b"sidX")
    os.utime(side, ns=(sst.st_atime_ns, sst.st_mtime_ns))
    with pytest.raises(ValueError):
        once()
    tmp = tmp_path / "s.new"
    tmp.write_bytes(b"side")
    os.replace(tmp, side)
    n = len(seen)
    assert once() and not once() and len(seen) == n + 1
    # the link pointed at a copy of the raw file (same bytes, same mtime): another file
    copy = tmp_path / "copy.dbn.zst"
    shutil.copy2(raw, copy)
    link.unlink()
    link.symlink_to(copy)
    assert once() and not once()
    # another package source, or forced: verified although the stamps are unchanged
    monkeypatch.setattr(verified, "_code", lambda: "another package source")
    assert once() and not once()
    assert once(force=True) and not once()
    # recorded beside the sidecar, for this pair only: a verification of the sidecar alone
    # under the same name is another one
    assert verified.record_path(side).is_file()
    assert verified.verify_once(side, "sidecar_matches_source", check)
    assert len(seen) == n + 5


def _check_only(defs: dg.Definitions, inst: dg.DagsterInstance, quarter, run_config: dict | None = None):
    """``predecoded_trades.sidecar_matches_source`` alone (the UI's "Execute" on the check)."""
    key = dg.AssetCheckKey(dg.AssetKey("predecoded_trades"), "sidecar_matches_source")
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection={key}
    )
    r = job.execute_in_process(
        instance=inst,
        partition_key=partition_key(quarter, "ES.FUT"),
        run_config={**QUIET, **(run_config or {})},
        raise_on_error=False,
    )
    assert set(job.graph.node_dict) == {"predecoded_trades_sidecar_matches_source"}
    (ev,) = r.get_asset_check_evaluations()
    return {
        "passed": ev.passed,
        "description": ev.description or "",
        **{k: v.value for k, v in ev.metadata.items()},
    }


def test_sidecar_check_hashes_again_only_when_a_file_moved(
    market3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = defs_for(root, last=Q1)
    calls: list[str] = []
    real = checks_mod.verify_sidecar

    def counted(path, source):
        calls.append(Path(path).name)
        return real(path, source)

    monkeypatch.setattr(checks_mod, "verify_sidecar", counted)
    with dg.instance_for_test() as inst:
        first = _checks(_run(defs, inst, Q1))
        assert len(calls) == 2 and first["predecoded_trades.sidecar_matches_source"]["verdict"] == "evaluated"
        verified.clear()  # a later run in another process: the records beside the sidecars
        hit = _checks(_run(defs, inst, Q1))
        assert len(calls) == 2, calls
        for schema in ("trades", "mbp10"):
            got = hit[f"predecoded_{schema}.sidecar_matches_source"]
            assert got["passed"] and got["verdict"] == "reused", got

        raw = root / "raw" / "trades" / "ES.FUT" / "ES.FUT_2024-Q1.dbn.zst"
        (side,) = (root / "derived" / "predecoded" / "trades").rglob("ES.FUT_2024-Q1.*.arrow")
        original, st = raw.read_bytes(), raw.stat()
        # a same-size edit of the raw file with its mtime set back: hashed again, and it fails
        verified.clear()
        _edit_in_place(raw, bytes([original[0] ^ 0xFF]))
        os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns))
        bad = _check_only(defs, inst, Q1)
        assert not bad["passed"] and "source changed" in bad["description"] and len(calls) == 3, (bad, calls)
        _edit_in_place(raw, original[:1])
        os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns))
        verified.clear()
        good = _check_only(defs, inst, Q1)
        assert good["passed"] and good["verdict"] == "evaluated" and len(calls) == 4
        verified.clear()
        assert _check_only(defs, inst, Q1)["verdict"] == "reused" and len(calls) == 4

        # the sidecar replaced by a copy with one price byte changed: hashed again, it fails
        side_bytes = side.read_bytes()
        tmp = side.with_name("replacement.tmp")
        shutil.copy2(side, tmp)
        flip_unsampled_price_byte(tmp)
        os.replace(tmp, side)
        verified.clear()
        bad = _check_only(defs, inst, Q1)
        assert not bad["passed"] and "checksum mismatch in column price" in bad["description"], bad
        assert len(calls) == 5
        tmp.write_bytes(side_bytes)
        os.replace(tmp, side)
        verified.clear()
        assert _check_only(defs, inst, Q1)["verdict"] == "evaluated" and len(calls) == 6

        # a code change, or rehash asked for: hashed again although nothing moved
        monkeypatch.setattr(verified, "_code", lambda: "another package source")
        verified.clear()
        assert _check_only(defs, inst, Q1)["verdict"] == "evaluated" and len(calls) == 7
        verified.clear()
        assert _check_only(defs, inst, Q1)["verdict"] == "reused" and len(calls) == 7
        forced = _check_only(
            defs,
            inst,
            Q1,
            {"ops": {"predecoded_trades_sidecar_matches_source": {"config": {"rehash": True}}}},
        )
        assert forced["passed"] and forced["verdict"] == "evaluated" and len(calls) == 8
