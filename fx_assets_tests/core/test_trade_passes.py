"""``active_trades`` / ``active_trade_flow``: the kept trades of the sidecar's one fused pass
(selection, min / max time for the session table, the trade-action check) equal the numpy
definition, for any number of parts, with and without ``after_ts``; a record outside the years
of the first and last records gets the session table of the full range, and a non-trade record
is refused wherever it lies (also before ``after_ts``). ``trade_source`` (the OFI stage's loader)
gives, for any ``ts_recv`` window, the flow's trades of that window: written out of the sidecar
where its ``ts_recv`` never decreases, else the flow itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest

from fx_assets.core import active_contract as act
from fx_assets.core import bar_rows, dbn, sidecar
from fx_assets.core import ofi as ofi_core
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
    for load in (act.active_trades, act.active_trade_flow, act.trade_source):
        with pytest.raises(FxDataError, match=r"a\.arrow: 1 of 2 records are not trades \(actions \['C'\]"):
            load(bad.path, cal, after_ts=late)


def _window(flow: act.TradeFlow, lo_t: int, hi_t: int) -> tuple[np.ndarray, ...]:
    lo, hi = np.searchsorted(flow.ts, lo_t, side="right"), np.searchsorted(flow.ts, hi_t, side="right")
    return flow.ts[lo:hi], flow.size[lo:hi], flow.sign[lo:hi]


def _windows_equal(src: Any, flow: act.TradeFlow, ts: np.ndarray) -> int:
    """Every window of a set (record times as bounds, so trades at a bound are cut as
    ``side="right"`` cuts them; empty, whole and out-of-range windows too) of ``src``, through
    ``bar_rows._trade_slices`` into one reused buffer, equals that window of ``flow``."""
    n = ts.size
    at = [int(ts[i]) for i in (0, 1, n // 7, n // 3, n // 3 + 1, n // 2, 2 * n // 3, n - 2, n - 1)]
    lo_min = int(np.iinfo(np.int64).min)
    bounds = [(lo_min, at[-1]), (lo_min, at[2]), (at[0], at[1]), (at[3], at[4]), (at[4], at[4])]
    bounds += [(a, b) for a, b in zip(at, at[3:], strict=False)] + [(at[-1], at[-1] + 10**12), (at[5], at[3])]
    buf = bar_rows._TradeBuffers()
    kept = 0
    for lo_t, hi_t in bounds:
        got = bar_rows._trade_slices([src], lo_t, hi_t, buf)
        want = _window(flow, lo_t, hi_t)
        assert got.price is None
        for g, w, name in zip((got.ts, got.size, got.sign), want, ("ts", "size", "sign"), strict=True):
            assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), f"{name} of ({lo_t}, {hi_t}]"
        assert isinstance(got, ofi_core.PreparedTrades) == isinstance(src, act.TradeSidecar)
        if isinstance(got, ofi_core.PreparedTrades):
            _sums_equal_the_prep_pass(got)
        kept += got.ts.size
    # Two sources in one window (the previous quarter's tail and the quarter, in the stage):
    # the sums run on from the first source's trades into the second's.
    two = bar_rows._trade_slices([src, src], at[3], at[6], buf)
    one = _window(flow, at[3], at[6])
    assert two.ts.tobytes() == np.concatenate([one[0], one[0]]).tobytes()
    if isinstance(two, ofi_core.PreparedTrades):
        _sums_equal_the_prep_pass(two, sorted_ts=False)
    return kept


def _sums_equal_the_prep_pass(got: ofi_core.PreparedTrades, sorted_ts: bool = True) -> None:
    """The sums written with the trades are ``ofi._trade_prep_nb``'s, bit for bit, and the
    checks that pass skips hold."""
    n = got.ts.size
    cumv, cumd, bad = np.empty(n), np.empty(n), np.full(4, -1, np.int64)
    ofi_core._trade_prep_nb(got.ts, got.size, got.sign, cumv, cumd, bad)
    assert got.cumv.tobytes() == cumv.tobytes() and got.cumd.tobytes() == cumd.tobytes()
    assert bad[1:].tolist() == [-1, -1, -1] and (bad[0] == -1 or not sorted_ts)


@pytest.mark.parametrize("threads", [1, 3])
def test_trade_source_windows_equal_the_flow(
    quarter: tuple[Path, Any], threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an ordered sidecar, ``trade_source`` leaves the trades in it, and each window is the
    flow's (with and without ``after_ts``), for any number of parts of its order pass."""
    path, cal = quarter
    monkeypatch.setattr(act, "_MIN_TRADES_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    ts = sidecar_columns(path, NAMES)["ts_recv"]
    for after_ts in (None, int(ts[ts.size // 2])):
        src = act.trade_source(path, cal, after_ts=after_ts)
        assert isinstance(src, act.TradeSidecar)
        assert src.n_source == ts.size and src.after_ts == after_ts
        assert _windows_equal(src, act.active_trade_flow(path, cal, after_ts=after_ts), ts) > 1000


def test_trade_source_out_of_order_falls_back_to_the_flow(
    quarter: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record out of ``ts_recv`` order that no window keeps: ``trade_source`` is the flow
    (which accepts it) and its windows are the flow's; one that is kept: both refuse the file."""
    path, cal = quarter
    monkeypatch.setattr(act, "_MIN_TRADES_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    cols = dict(sidecar_columns(path, NAMES))
    ts0 = cols["ts_recv"]
    flow0 = act.active_trade_flow(path, cal)
    kept = np.isin(ts0, flow0.ts)
    mid = ts0.size // 2
    dropped = mid + int(np.flatnonzero(~kept[mid:] & (ts0[mid:] > ts0[mid - 1 :][: ts0.size - mid]))[0])
    ts = ts0.copy()
    ts[dropped] = ts[dropped - 1] - 1  # below its predecessor, and dropped (not the active contract's)
    cols["ts_recv"] = ts
    monkeypatch.setattr(act, "sidecar_columns", lambda _p, names: {k: cols[k] for k in names})
    src = act.trade_source(path, cal)
    assert isinstance(src, act.TradeFlow)
    assert _windows_equal(src, act.active_trade_flow(path, cal), ts0) > 1000
    ts = ts0.copy()
    j = len(flow0) // 2
    ts[int(np.flatnonzero(kept)[j])] = flow0.ts[j - 1] - 1  # a kept trade before the one kept before it
    cols["ts_recv"] = ts
    for load in (act.active_trade_flow, act.trade_source):
        with pytest.raises(FxDataError, match="trades are not in ts_recv order"):
            load(path, cal)


@pytest.mark.parametrize("where", [1, 4095, 4096, 4097, 9000, 12_287])
def test_order_action_scan_finds_the_first_bad_record(where: int) -> None:
    """``_order_actions_nb`` (blocks scanned without an exit first) names the numpy
    definition's first decrease and first non-trade record, for any split into parts (a
    part's first record is compared with the record before it)."""
    n = 12_288
    ts = np.arange(n, dtype=np.int64) * 10
    action = np.full(n, ord("T"), np.uint8)
    ts[where] = ts[where - 1] - 1  # below its predecessor
    action[[where, min(where + 5, n - 1)]] = ord("A")
    want_ts = int(np.flatnonzero(ts[1:] < ts[:-1])[0]) + 1
    want_act = int(np.flatnonzero(action != ord("T"))[0])
    for cuts in ([0, n], [0, where, n], [0, where + 1, n], [0, 4096, 8192, n]):
        infos = [np.full(2, -1, np.int64) for _ in cuts[1:]]
        for p in range(len(cuts) - 1):
            act._order_actions_nb(ts, action, cuts[p], cuts[p + 1], infos[p])
        assert min(int(i[0]) for i in infos if i[0] >= 0) == want_ts
        assert min(int(i[1]) for i in infos if i[1] >= 0) == want_act
    clean_ts, clean_act = np.arange(n, dtype=np.int64), np.full(n, ord("T"), np.uint8)
    info = np.full(2, 7, np.int64)
    act._order_actions_nb(clean_ts, clean_act, 0, n, info)
    assert info.tolist() == [-1, -1]


def test_trade_source_windows_with_unsigned_trades(
    quarter: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trades without an aggressor side (sign 0; the synthetic market has none) in the windows:
    their sizes enter the volume sum and +0.0 the signed one, as in ``_trade_prep_nb``."""
    path, cal = quarter
    cols = dict(sidecar_columns(path, NAMES))
    side = cols["side"].copy()
    side[::7] = ord("N")
    cols["side"] = side
    monkeypatch.setattr(act, "sidecar_columns", lambda _p, names: {k: cols[k] for k in names})
    src = act.trade_source(path, cal)
    assert isinstance(src, act.TradeSidecar)
    flow = act.active_trade_flow(path, cal)
    assert (flow.sign == 0).sum() > 100
    assert _windows_equal(src, flow, cols["ts_recv"]) > 1000


def test_trades_without_a_positive_defined_price_or_size_are_not_kept(
    quarter: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Active-contract trades with a zero, negative or undefined price, or a zero size (the
    synthetic market has none): no loader keeps them (the numpy definition, every loader), and
    the OFI stage's windows out of the sidecar are the flow's."""
    path, cal = quarter
    monkeypatch.setattr(act, "_MIN_TRADES_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    cols = dict(sidecar_columns(path, NAMES))
    sess = session_day(cols["ts_recv"])
    active, known = cal.active_instrument(sess)
    kept = np.flatnonzero(known & (cols["instrument_id"] == active))
    n_before = _check(path, cal, cols, None)
    price, size = cols["price"].copy(), cols["size"].copy()
    picks = kept[5::97]
    groups = np.array_split(picks, 4)
    price[groups[0]] = 0
    price[groups[1]] = -price[groups[1]]
    price[groups[2]] = UNDEF_PRICE
    size[groups[3]] = 0
    cols.update(price=price, size=size)
    monkeypatch.setattr(act, "sidecar_columns", lambda _p, names: {k: cols[k] for k in names})
    assert all(g.size > 10 for g in groups)
    assert _check(path, cal, cols, None) == n_before - picks.size
    src = act.trade_source(path, cal)
    assert isinstance(src, act.TradeSidecar)
    assert _windows_equal(src, act.active_trade_flow(path, cal), cols["ts_recv"]) > 1000
