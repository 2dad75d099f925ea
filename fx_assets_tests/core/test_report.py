"""Walk-forward report: fold results on disk and their stitching, gross and net side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fx_assets.core import metrics as M
from fx_assets.core.errors import FxDataError
from fx_assets.core.report import FoldOOS, gross_returns, stitch


def _fold(name: str, t0: int, day0: int, seed: int, cost: float = 1e-4) -> FoldOOS:
    rng = np.random.default_rng(seed)
    n = 40
    pos = rng.integers(-1, 2, n).astype(np.int8)
    pos[-1] = 0
    y = rng.normal(0, 1e-3, n)
    net = M.strategy_returns(pos, y, cost)
    sessions = (day0 + np.arange(n) // 8).astype(np.int32)
    return FoldOOS(name, t0 + np.arange(n, dtype=np.int64), sessions, pos, net, gross_returns(net, pos, cost))


def test_gross_and_net_round_trip_and_stitch(tmp_path: Path) -> None:
    a, b = _fold("2024-Q2", 0, 19800, 1), _fold("2024-Q3", 1000, 19900, 2)
    back = FoldOOS.load(a.save(tmp_path / "oos.npz"))
    np.testing.assert_array_equal(back.gross_returns, a.gross_returns)
    wf = stitch([b, a])
    s = wf.summary()
    assert s["net_sharpe"] == s["sharpe"] == pytest.approx(M.sharpe_daily(wf.returns, wf.sessions))
    assert s["gross_sharpe"] == pytest.approx(M.sharpe_daily(wf.gross_returns, wf.sessions))
    cost = s["gross_total_log_return"] - s["net_total_log_return"]
    assert cost == pytest.approx(1e-4 * np.abs(np.diff(wf.positions(), prepend=0)).sum())
    assert cost > 0 and s["turnover"] == pytest.approx(np.abs(np.diff(wf.positions(), prepend=0)).mean())
    with pytest.raises(FxDataError, match="overlap"):
        stitch([a, a])
