"""A stage's reuse of a keyed fxcache verifies its checksums: a file changed in place is removed
and rebuilt, never reused (issue 8, "every cached body is checksummed")."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fx_assets.assets.common import cached_result, save_build_metadata
from fx_assets.core.fxcache import read_header, write_fxcache
from fx_assets.partitions import QuarterSymbol

KEY = "ab" * 32


def _io(path: Path) -> SimpleNamespace:
    # (no raw sources here: their check, StageIO.check_current, is tested in test_pipeline.py)
    return SimpleNamespace(
        path=lambda stage: path,
        key=lambda stage: KEY,
        part=QuarterSymbol(dt.date(2024, 1, 1), "ES.FUT"),
        check_current=lambda stage: None,
    )


def test_reuse_verifies_checksums_and_rebuilds_a_changed_file(tmp_path: Path) -> None:
    n = 200
    rng = np.random.default_rng(0)
    p = write_fxcache(
        tmp_path / "ES.FUT_2024-Q1.fxcache",
        np.arange(n, dtype=np.int64),
        {
            "feature": (["a", "b"], rng.normal(size=(n, 2))),
            "price": (["close"], 5000.0 + 0.25 * np.arange(n).reshape(n, 1)),
        },
        "f32",
        bytes.fromhex(KEY),
    )
    save_build_metadata(p, {"rows": n})  # what the stage records beside a file it built
    hit = cached_result(_io(p), "fxcache")  # type: ignore[arg-type]
    assert hit is not None and hit.metadata is not None and hit.metadata["action"] == "reused"
    h = read_header(p)
    raw = bytearray(p.read_bytes())
    raw[h.values_offset + 4 * (7 * h.row_width + 1)] ^= 0x01  # one finite feature value, low bit
    p.write_bytes(bytes(raw))
    io = _io(p)
    assert cached_result(io, "fxcache") is None  # type: ignore[arg-type]
    # rebuilt, and replaced in place (a concurrent reader never sees it missing)
    assert io.rebuild_reason == "checksum mismatch" and p.exists()


def test_inspect_says_invalid_after_an_in_place_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from fx_assets.cli import main

    p = write_fxcache(
        tmp_path / "x.fxcache",
        np.arange(50, dtype=np.int64),
        {"feature": (["a"], np.ones((50, 1))), "price": (["close"], np.full((50, 1), 5000.0))},
        "bf16",
        bytes.fromhex(KEY),
    )
    assert main(["inspect", str(p), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    h = read_header(p)
    raw = bytearray(p.read_bytes())
    raw[h.price_offset + 8 * h.price_width * 3] ^= 0x01  # a close, still finite
    p.write_bytes(bytes(raw))
    assert main(["inspect", str(p), "--json"]) == 1
    cap = capsys.readouterr()
    desc = json.loads(cap.out)
    assert desc["valid"] is False and "checksum mismatch in the price block" in desc["error"]
    assert "invalid" in cap.err


def _small(path: Path, **kw: object) -> Path:
    n = 300
    rng = np.random.default_rng(1)
    return write_fxcache(
        path,
        np.arange(n, dtype=np.int64),
        {
            "feature": (["a", "b"], rng.normal(size=(n, 2))),
            "price": (["close"], 5000.0 + 0.25 * np.arange(n).reshape(n, 1)),
            "ofi": (["o"], rng.normal(size=(n, 1))),
        },
        "f32",
        bytes.fromhex(KEY),
        **kw,  # type: ignore[arg-type]
    )


def test_read_back_records_the_written_file_verified_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_fxcache(read_back=True) re-hashes the file it wrote and records both kinds of full
    verification for its stamp (in this process and beside the file): the fxcache_valid check's
    verify_once(..., "fxcache", verify_fxcache) then does not scan it again, in this process or
    another; any later change of the file is verified again (and fails)."""
    from fx_assets.core import verified
    from fx_assets.core.errors import FxCacheError
    from fx_assets.core.fxcache import verify_fxcache

    verified.clear()
    reads: list[str] = []
    real = verified.verify_fxcache_bytes
    monkeypatch.setattr(verified, "verify_fxcache_bytes", lambda p: (reads.append(p.name), real(p))[1])
    p = _small(tmp_path / "x.fxcache", read_back=True)
    assert reads == ["x.fxcache"]  # read back once, right after the write
    assert verified.verified_kinds(p) == {"fxcache", "fxcache-bytes"}
    full: list[Path] = []
    assert not verified.verify_once(p, "fxcache", lambda q: full.append(q))
    verified.clear()  # another process: the record beside the file holds for this stamp
    assert not verified.verify_once(p, "fxcache", lambda q: full.append(q))
    assert not verified.verify_once(p, "fxcache-bytes", lambda q: full.append(q))
    assert full == []
    raw = bytearray(p.read_bytes())
    h = read_header(p)
    raw[h.values_offset + 4] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(FxCacheError, match="checksum mismatch in the values block"):
        verified.verify_once(p, "fxcache", verify_fxcache)
    # without read_back nothing is recorded: the check verifies the file in full
    verified.clear()
    q = _small(tmp_path / "y.fxcache")
    assert verified.verified_kinds(q) == set() and not verified.record_path(q).exists()


def test_read_back_refuses_a_file_that_is_not_the_one_written(tmp_path: Path) -> None:
    """The header read back must be the writer's and every region must hash to it: a body
    changed on its way to the disk, or another file put in its place, fails and is not recorded."""
    from fx_assets.core import verified
    from fx_assets.core.errors import FxCacheError

    verified.clear()
    p = _small(tmp_path / "x.fxcache")
    written = read_header(p)
    raw = bytearray(p.read_bytes())
    raw[written.price_offset + 8] ^= 0x01  # the body differs from what the header's checksums say
    p.write_bytes(bytes(raw))
    with pytest.raises(FxCacheError, match="checksum mismatch in the price block"):
        verified.verify_written_fxcache(p, written)
    assert verified.verified_kinds(p) == set() and not verified.record_path(p).exists()
    other = _small(tmp_path / "other.fxcache")
    other_header = read_header(_small(tmp_path / "z.fxcache", meta={"partition": "another"}))
    with pytest.raises(FxCacheError, match="header read back is not the one written"):
        verified.verify_written_fxcache(other, other_header)
    assert verified.verified_kinds(other) == set()
