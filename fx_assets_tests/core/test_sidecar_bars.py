"""``bar_rows.sidecar_bars`` (the bars stage's one pass from the trades sidecar) gives the bars
of ``quarter_bars(active_trades(...))`` bit for bit: one shard or many (cut at session opens),
volume and dollar bars, a roll inside the quarter, and the same errors."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

from fx_assets.core import bar_rows, dbn, sidecar
from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
from fx_assets.core.bar_rows import quarter_bars, sidecar_bars
from fx_assets.core.bars import BarConfig
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import roll_calendar_from_sidecars
from fx_assets_tests.conftest import make_market
from fx_assets_tests.core.test_dbn import TRADES_V1, write_dbn


@pytest.fixture(scope="module")
def quarter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("sidecar_bars")
    # 2024-Q1 holds the March roll of ES (H4 -> M4)
    root = make_market(tmp / "market", "2024-Q1", scale=0.01, seed=3)
    raw = root / "raw" / "trades" / "ES.FUT" / "ES.FUT_2024-Q1.dbn.zst"
    path = sidecar.ensure_sidecar(raw, tmp / "sc").path
    cal = quarter_roll_calendar(path, None)
    assert len(cal.events) >= 1, "the fixture should hold a roll"
    return path, cal


def _same(path: Path, cal: object, config: BarConfig) -> int:
    trades = active_trades(path, cal)  # type: ignore[arg-type]
    want = quarter_bars(trades, config)
    got = sidecar_bars(path, cal, config)  # type: ignore[arg-type]
    assert (got.n_trades, got.volume, got.n_source) == (
        len(trades),
        float(trades.size.sum()),
        trades.n_source,
    )
    for name, col in want.columns().items():
        other = got.bars.columns()[name]
        assert other.dtype == col.dtype and other.tobytes() == col.tobytes(), name
    return len(want)


@pytest.mark.parametrize("kind", ["volume", "dollar"])
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_sidecar_bars_equal_bars_of_active_trades(
    quarter: tuple[Path, object], kind: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cal = quarter
    monkeypatch.setattr(bar_rows, "_MIN_RECORDS_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    config = BarConfig(kind=kind, volume_bar_size=20, dollar_bar_size=20 * 50 * 5000.0)
    assert _same(path, cal, config) > 100


@pytest.mark.parametrize("kind", ["volume", "dollar"])
@pytest.mark.parametrize("threads", [1, 3])
def test_sidecar_bars_outputs_grown_many_times(
    quarter: tuple[Path, object], kind: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs that start at the kernel's minimum of 16 rows and double between passes over the
    records (each pass stops before the record that finds them full and the next resumes
    there): the same bars, kept-trade count and volume as the active trades give, with no
    record counted twice or skipped at a resumption."""
    path, cal = quarter
    monkeypatch.setattr(bar_rows, "_MIN_RECORDS_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    monkeypatch.setattr(bar_rows, "_CAP_RECORDS_PER_BAR", 1 << 40)
    monkeypatch.setattr(bar_rows, "_CAP_MIN_BARS", 0)
    config = BarConfig(kind=kind, volume_bar_size=20, dollar_bar_size=20 * 50 * 5000.0)
    assert _same(path, cal, config) > 16 * 2**5  # at least 5 doublings in one shard


def test_shards_that_do_not_meet_at_a_session_change_are_built_in_one(
    quarter: tuple[Path, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut inside a session (as an unordered file could give) is detected: one shard then."""
    path, cal = quarter
    monkeypatch.setattr(bar_rows, "_MIN_RECORDS_PER_THREAD", 1000)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 4)
    monkeypatch.setattr(bar_rows, "_session_cut_nb", lambda ts, bounds, i: i)  # cut anywhere
    calls: list[list[int]] = []
    shards = bar_rows._bar_shards

    def spy(cols, bounds, act, days, cuts, config):
        calls.append(list(cuts))
        return shards(cols, bounds, act, days, cuts, config)

    monkeypatch.setattr(bar_rows, "_bar_shards", spy)
    _same(path, cal, BarConfig(volume_bar_size=20))
    assert len(calls) == 2 and len(calls[-1]) == 2


def test_sidecar_bars_raise_as_active_trades(tmp_path: Path) -> None:
    recs = dbn.read_records(TRADES_V1).copy()
    recs["action"][1] = ord("A")
    bad = sidecar.build_sidecar(
        write_dbn(tmp_path / "a.dbn", dbn.read_header(TRADES_V1).header_bytes, recs, zstd=False),
        tmp_path / "a.arrow",
    )
    with pytest.raises(FxDataError, match=r"a\.arrow: 1 of 2 records are not trades"):
        sidecar_bars(bad.path, roll_calendar_from_sidecars(bad.path, None), BarConfig())
    assert np.all(dbn.read_records(TRADES_V1)["action"] == ord("T"))
