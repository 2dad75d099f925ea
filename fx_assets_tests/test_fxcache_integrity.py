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
    return SimpleNamespace(
        path=lambda stage: path, key=lambda stage: KEY, part=QuarterSymbol(dt.date(2024, 1, 1), "ES.FUT")
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
