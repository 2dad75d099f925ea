"""``active_trades`` / ``active_trade_flow``: the kept trades of the sidecar's one fused pass
(selection, min / max time for the session table, the trade-action check) equal the numpy
definition, for any number of parts, with and without ``after_ts``; a record outside the years
of the first and last records gets the session table of the full range, and a non-trade record
is refused wherever it lies (also before ``after_ts``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest

from fx_assets.core import active_contract as act
from fx_assets.core import dbn, sidecar
from fx_assets.core.active_contract import quarter_roll_calendar
from fx_assets.core.calendar import session_day
from fx_assets.core.dbn import UNDEF_PRICE, px_to_float
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import roll_calendar_from_sidecars
from fx_assets.core.sidecar import sidecar_columns
from fx_assets_tests.conftest import make_market
from fx_assets_tests.core.test_dbn import TRADES_V1, write_dbn

NAMES = ["ts_recv", "instrument_id", "price", "size", "side", "action"]
DAY_NS = 86_400 * 10**9


@pytest.fixture(scope="module")
def quarter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("trade_passes")
    root = make_market(tmp / "market", "2024-Q1", scale=0.01, seed=5)
    raw = root / "raw" / "trades" / "ES.FUT" / "ES.FUT_2024-Q1.dbn.zst"
    path = sidecar.ensure_sidecar(raw, tmp / "sc").path
    return path, quarter_roll_calendar(path, None)


def _check(path: Path, cal: Any, cols: dict[str, np.ndarray], after_ts: int | None) -> int:
    """Both loaders against the numpy definition of the kept trades of ``cols``."""
    ts = cols["ts_recv"]
    sess = session_day(ts)
    active, known = cal.active_instrument(sess)
    price, size, side = cols["price"], cols["size"], cols["side"]
    keep = known & (cols["instrument_id"] == active) & (price != UNDEF_PRICE) & (price > 0) & (size > 0)
    if after_ts is not None:
        keep &= ts > after_ts
    want = {
        "ts": ts[keep],
        "price": px_to_float(price[keep]),
        "size": size[keep].astype(np.float64),
        "sign": np.select([side[keep] == ord("B"), side[keep] == ord("A")], [1, -1], 0).astype(np.int8),
        "session": sess[keep],
        "instrument_id": cols["instrument_id"][keep].astype(np.uint32),
    }
    t = act.active_trades(path, cal, after_ts=after_ts)
    f = act.active_trade_flow(path, cal, after_ts=after_ts)
    assert t.n_source == f.n_source == ts.size and t.after_ts == f.after_ts == after_ts
    for name, col in want.items():
        got = getattr(t, name)
        assert got.dtype == col.dtype and got.tobytes() == col.tobytes(), f"active_trades.{name}"
        if name in ("ts", "size", "sign"):
            got = getattr(f, name)
            assert got.dtype == col.dtype and got.tobytes() == col.tobytes(), f"active_trade_flow.{name}"
    return int(keep.sum())


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_kept_trades_equal_the_numpy_definition(
    quarter: tuple[Path, Any], threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cal = quarter
    monkeypatch.setattr(act, "_MIN_TRADES_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    cols = sidecar_columns(path, NAMES)
    n = cols["ts_recv"].size
    assert n > 5 * 1000
    assert _check(path, cal, cols, None) > 1000
    assert 0 < _check(path, cal, cols, int(cols["ts_recv"][2 * n // 3])) < n // 2


@pytest.mark.parametrize("threads", [1, 3])
def test_a_record_outside_the_end_records_years_gets_the_full_session_table(
    quarter: tuple[Path, Any], threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session table is first built from the first and last records' times; a record of
    another year in between (here moved a year on, so no longer in order) makes the pass run
    again with the table of the records' full range, and the selection is the definition's."""
    path, cal = quarter
    monkeypatch.setattr(act, "_MIN_TRADES_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    cols = dict(sidecar_columns(path, NAMES))
    ts = cols["ts_recv"].copy()
    mid = ts.size // 2
    ts[mid] += 366 * DAY_NS
    cols["ts_recv"] = ts
    monkeypatch.setattr(act, "sidecar_columns", lambda _p, names: {k: cols[k] for k in names})
    spans: list[Any] = []
    real = act._active_table

    def spy(calendar: Any, t: np.ndarray, span: Any = None) -> Any:
        spans.append(span)
        return real(calendar, t, span)

    monkeypatch.setattr(act, "_active_table", spy)
    _check(path, cal, cols, None)
    assert spans[-1] == (int(ts.min()), int(ts.max())) and spans[-2] == (int(ts[0]), int(ts[-1]))


def test_a_non_trade_record_is_refused_also_before_after_ts(tmp_path: Path) -> None:
    recs = dbn.read_records(TRADES_V1).copy()
    recs["action"][0] = ord("C")
    bad = sidecar.build_sidecar(
        write_dbn(tmp_path / "a.dbn", dbn.read_header(TRADES_V1).header_bytes, recs, zstd=False),
        tmp_path / "a.arrow",
    )
    cal = roll_calendar_from_sidecars(bad.path, None)
    late = int(recs["ts_recv"].max())  # every record is at or before it: none is kept
    for load in (act.active_trades, act.active_trade_flow):
        with pytest.raises(FxDataError, match=r"a\.arrow: 1 of 2 records are not trades \(actions \['C'\]"):
            load(bad.path, cal, after_ts=late)
