"""The sensor-free command-line path: synth -> (Dagster-free) inspect of DBN, sidecar, fxcache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import databento as db
import numpy as np
import pytest

from fx_assets.cli import main
from fx_assets.core.fxcache import write_fxcache
from fx_assets.core.sidecar import ensure_sidecar


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_synth_inspect_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(
        capsys,
        "synth",
        "--out",
        str(tmp_path),
        "--quarters",
        "2024-Q2",
        "--scale",
        "0.002",
        "--seed",
        "5",
        "--null",
        "--json",
    )
    trades = tmp_path / "raw/trades/ES.FUT/ES.FUT_2024-Q2.dbn.zst"
    assert str(trades) in json.dumps(rep)
    store = db.DBNStore.from_file(trades)
    n = len(store.to_ndarray())
    desc = run_json(capsys, "inspect", str(trades), "--json")
    assert desc["kind"] == "dbn"
    assert json.dumps(desc).count("ES") > 0
    info = ensure_sidecar(trades, tmp_path / "side")
    sdesc = run_json(capsys, "inspect", str(info.path), "--json")
    assert sdesc["kind"] == "sidecar"
    assert n in {v for v in sdesc.values() if isinstance(v, int)}
    fx = write_fxcache(
        tmp_path / "x.fxcache",
        np.arange(5, dtype=np.int64),
        {
            "feature": (["a", "b"], np.arange(10.0).reshape(5, 2)),
            "price": (["close"], np.full((5, 1), 5000.0)),
        },
        "f32",
        b"k" * 32,
    )
    fdesc = run_json(capsys, "inspect", str(fx), "--json")
    assert fdesc["kind"] == "fxcache"
    assert "a" in json.dumps(fdesc)


def test_inspect_rejects_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    assert main(["inspect", str(bad)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.dbn.zst")]) == 2


def test_export_fxcache(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    fx = write_fxcache(
        tmp_path / "x.fxcache",
        np.arange(4, dtype=np.int64),
        {"feature": (["a"], np.arange(4.0).reshape(4, 1)), "price": (["close"], np.full((4, 1), 5000.0))},
        "f64",
        b"k" * 32,
    )
    assert main(["export", str(fx), str(tmp_path / "x.parquet")]) == 0
    t = pq.read_table(tmp_path / "x.parquet")
    assert t.num_rows == 4 and t.column("a").to_pylist() == [0.0, 1.0, 2.0, 3.0]
    assert main(["export", str(fx), str(tmp_path / "x.csv")]) == 2


def test_decode_reuses_and_rebuilds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dbn_fixtures: Path
) -> None:
    src = (
        dbn_fixtures
        / "nautilus_trader/historical_bars_catalog/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
    )
    assert main(["decode", str(src), "--out", str(tmp_path)]) == 0
    assert "decoded 120 records" in capsys.readouterr().err
    assert main(["decode", str(src), "--out", str(tmp_path)]) == 0
    assert "reused 120 records" in capsys.readouterr().err
    assert main(["decode", str(src), "--out", str(tmp_path), "--rebuild"]) == 0
    assert "decoded 120 records" in capsys.readouterr().err


def test_decode_imports_only_the_decoder(tmp_path: Path, dbn_fixtures: Path) -> None:
    """`fx-assets decode` without a terminal loads neither the progress display nor the feature
    stack (numba, pydantic), Dagster or torch: process start and imports are most of a short
    decode's time (benchmarks/bench_decode.py: CLI vs in-process)."""
    src = (
        dbn_fixtures
        / "nautilus_trader/historical_bars_catalog/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
    )
    code = (
        "import os, sys; from fx_assets.cli import main; "
        f"rc = main(['decode', {str(src)!r}, '--out', {str(tmp_path)!r}, '--rebuild']); "
        "print(rc, sorted(m for m in ('rich', 'numba', 'pydantic', 'dagster', 'torch') if m in sys.modules), "
        "os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("OPENBLAS_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    # numpy was imported for the decode with one OpenBLAS thread (no pool to start)
    assert proc.stdout.split() == ["0", "[]", "1"], proc.stdout
    assert "decoded 120 records" in proc.stderr


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_inspect_into_a_closed_pipe_ends_quietly(dbn_fixtures: Path, fmt: list[str]) -> None:
    """``fx-assets inspect … | head``: the reader is gone before the output is written."""
    import os
    import subprocess
    import sys

    src = next(iter(sorted(dbn_fixtures.rglob("*.dbn*"))))
    r, w = os.pipe()
    os.close(r)  # like `head` that has exited
    proc = subprocess.run(
        [sys.executable, "-m", "fx_assets.cli", "inspect", str(src), *fmt],
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    os.close(w)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode != 0  # the output is incomplete
