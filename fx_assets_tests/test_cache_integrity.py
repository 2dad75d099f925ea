"""Damaged cached files in a Dagster run (issue 8, Found 6): a stage table or sidecar whose body
no longer matches its checksum is rebuilt, never reused, and the materialization says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa

from fx_assets.core import sidecar, tables
from fx_assets.core.sidecar import verify_sidecar
from fx_assets_tests.test_pipeline import INGEST, Q1, defs_for, materialize, meta


def _flip_value(path: Path, column: str) -> None:
    """Overwrite the middle value of a stage table's ``column`` in place (still valid Arrow)."""
    values = tables.read_table(path).column(column).to_numpy()
    needle = values[len(values) // 2].tobytes()
    data = bytearray(path.read_bytes())
    pos = data.find(needle, len(data) // 8)
    assert pos > 0
    data[pos : pos + len(needle)] = (np.frombuffer(needle, values.dtype) + 1).astype(values.dtype).tobytes()
    path.write_bytes(bytes(data))


def test_damaged_bars_and_sidecar_are_rebuilt_and_reported(market3: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    defs = defs_for(root, last=Q1)
    with dg.instance_for_test() as inst:
        first = materialize(defs, inst, [*INGEST, "bars"], Q1)
        bars = Path(meta(first, "bars")["path"])
        side = Path(meta(first, "predecoded_trades")["path"])
        assert meta(materialize(defs, inst, ["bars"], Q1), "bars")["action"] == "reused"
        _flip_value(bars, "close")
        r = materialize(defs, inst, ["bars"], Q1)
        assert meta(r, "bars")["action"] == "rebuilt (checksum mismatch)"
        tables.verify_table(bars)
        assert meta(materialize(defs, inst, ["bars"], Q1), "bars")["action"] == "reused"
        # 1,000 prices of the trades sidecar, from its first row (inside the sampled blocks that
        # every reuse checks; damage elsewhere is the asset check's: test_integrity.py)
        with pa.memory_map(str(side), "r") as src:
            batch = pa.ipc.open_file(src).get_batch(0)
            off, _ = sidecar._column_places(src, batch)[batch.schema.names.index("price")]
        with open(side, "r+b") as f:
            f.seek(off)
            f.write(np.arange(1000, dtype=np.int64).tobytes())
        r = materialize(defs, inst, ["predecoded_trades"], Q1)
        assert meta(r, "predecoded_trades")["action"] == "rebuilt (checksum mismatch)"
        verify_sidecar(side, root / "raw/trades/ES.FUT/ES.FUT_2024-Q1.dbn.zst")
