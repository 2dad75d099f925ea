"""Inputs are what they claim to be (issue 8, Found 5): a raw file's DBN schema must be its
folder's, and the active-trades step accepts trade records only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fx_assets.core import active_contract, dbn, sidecar
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import roll_calendar_from_sidecars
from fx_assets_tests.core.test_dbn import FIX, MBP1_BIG, TRADES_V1, write_dbn

MBP10 = FIX / "dbn" / "test_data.mbp-10.v3.dbn.zst"


@pytest.mark.parametrize(("src", "found"), [(MBP10, "mbp-10"), (MBP1_BIG, "mbp-1")])
def test_wrong_schema_in_the_trades_folder_fails_and_writes_nothing(
    src: Path, found: str, tmp_path: Path
) -> None:
    sc = tmp_path / "sc"
    with pytest.raises(FxDataError) as err:
        sidecar.ensure_sidecar(src, sc, expect_schema="trades")
    text = str(err.value)
    assert src.name in text and f"'{found}'" in text and "expected 'trades'" in text
    assert not list(sc.glob("*.arrow")) and not list(sc.glob(".*tmp*"))
    with pytest.raises(FxDataError, match="expected 'trades'"):
        sidecar.build_sidecar(src, tmp_path / "out" / "x.arrow", expect_schema="trades")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_right_schema_passes_and_a_reused_sidecar_is_checked_too(tmp_path: Path) -> None:
    sc = tmp_path / "sc"
    info = sidecar.ensure_sidecar(TRADES_V1, sc, expect_schema="trades")
    assert info.schema == "trades"
    assert sidecar.ensure_sidecar(TRADES_V1, sc, expect_schema="trades").reused
    # the same fresh sidecar asked for as mbp-10: not reused, and the decode refuses the file
    with pytest.raises(FxDataError, match="expected 'mbp-10'"):
        sidecar.ensure_sidecar(TRADES_V1, sc, expect_schema="mbp-10")


def test_dataset_is_checked_when_given(tmp_path: Path) -> None:
    h = dbn.read_header(TRADES_V1)
    with pytest.raises(FxDataError, match=f"dataset is '{h.dataset}', expected 'XNAS.ITCH'"):
        sidecar.ensure_sidecar(TRADES_V1, tmp_path / "sc", expect_schema="trades", expect_dataset="XNAS.ITCH")


def test_active_trades_refuses_non_trade_actions(tmp_path: Path) -> None:
    recs = dbn.read_records(TRADES_V1).copy()
    good = sidecar.build_sidecar(
        write_dbn(tmp_path / "t.dbn", dbn.read_header(TRADES_V1).header_bytes, recs, zstd=False),
        tmp_path / "t.arrow",
    )
    cal = roll_calendar_from_sidecars(good.path, None)
    active_contract.active_trades(good.path, cal)  # trades only: fine
    recs["action"][1] = ord("A")
    bad = sidecar.build_sidecar(
        write_dbn(tmp_path / "a.dbn", dbn.read_header(TRADES_V1).header_bytes, recs, zstd=False),
        tmp_path / "a.arrow",
    )
    with pytest.raises(FxDataError, match=r"a\.arrow: 1 of 2 records are not trades \(actions \['A'\]"):
        active_contract.active_trades(bad.path, roll_calendar_from_sidecars(bad.path, None))
    assert np.all(dbn.read_records(TRADES_V1)["action"] == ord("T"))
