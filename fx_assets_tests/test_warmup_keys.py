"""The bar_features asset reads exactly the bars its key lists (issue 8.3), with a short
previous quarter: the warm-up then reaches two quarters back, and so does the key.

Raw files are placeholders (their identity is all the keys need) and the bars files are
synthetic tables written where the keys put them, so only the bar_features step runs."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from fx_assets.assets import features as feature_assets
from fx_assets.assets.common import StageIO
from fx_assets.core import lineage
from fx_assets.core.bar_features import max_window
from fx_assets.core.bars import BarTable
from fx_assets.core.calendar import session_day
from fx_assets.core.tables import write_table
from fx_assets.definitions import build_definitions
from fx_assets.partitions import QuarterSymbol, partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage
from fx_assets.settings import ProjectSettings

Q0, Q1, Q2, Q3 = dt.date(2023, 10, 1), dt.date(2024, 1, 1), dt.date(2024, 4, 1), dt.date(2024, 7, 1)
SYMBOL = "ES.FUT"


def synthetic_bars(quarter: dt.date, n: int, seed: int) -> BarTable:
    """``n`` plausible 10-minute bars of one contract inside the quarter's sessions."""
    start = np.datetime64(quarter.isoformat(), "ns").astype(np.int64) + 86_400 * 10**9
    ts = start + np.arange(4 * n, dtype=np.int64) * 600 * 10**9
    ts = ts[session_day(ts) >= 0][:n]
    rng = np.random.default_rng(seed)
    close = 5000.0 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))
    open_ = np.concatenate([[close[0]], close[:-1]])
    spread = np.abs(rng.normal(0, 0.5, n)) + 0.25
    volume = np.full(n, 100.0)
    return BarTable(
        ts_open=ts - 300 * 10**9,
        ts_close=ts,
        open=open_,
        high=np.maximum(open_, close) + spread,
        low=np.minimum(open_, close) - spread,
        close=close,
        volume=volume,
        buy_volume=np.round(volume * rng.uniform(0.3, 0.7, n)),
        vwap=(open_ + close) / 2,
        n_trades=np.full(n, 20, dtype=np.int64),
        duration_ns=np.full(n, 300 * 10**9, dtype=np.int64),
        instrument_id=np.full(n, 42, dtype=np.uint32),
        session_id=session_day(ts).astype(np.int32),
        forced_close=np.zeros(n, dtype=bool),
    )


@pytest.mark.parametrize("short_q2", [False, True])
def test_bar_features_reads_what_its_key_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_q2: bool
) -> None:
    storage, pipeline = FxStorage(root=str(tmp_path)), PipelineConfig()
    need = max_window(pipeline.stage_configs().bar_features)
    for q in (Q0, Q1, Q2, Q3):
        raw = storage.layout.raw_file("trades", SYMBOL, q)
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_bytes(f"placeholder trades of {q}".encode())
    io = StageIO(storage, pipeline, QuarterSymbol(Q3, SYMBOL))
    sizes = {Q0: 2 * need, Q1: 2 * need, Q2: need // 3 if short_q2 else 2 * need, Q3: 500}
    for i, (q, n) in enumerate(sizes.items()):
        write_table(io.path("bars", q), synthetic_bars(q, n, i).to_arrow())

    opened: list[dt.date] = []
    real_load = feature_assets._load_bars
    monkeypatch.setattr(feature_assets, "_load_bars", lambda io_, q: opened.append(q) or real_load(io_, q))

    defs = build_definitions(ProjectSettings(data_root=tmp_path, first_quarter=Q0, last_quarter=Q3))
    asset = defs.resolve_assets_def("bar_features")
    ctx = dg.build_asset_context(partition_key=partition_key(Q3, SYMBOL))
    result = asset(ctx, storage=storage, pipeline=pipeline)
    assert isinstance(result, dg.MaterializeResult)

    plan = (Q1, Q2) if short_q2 else (Q2,)
    assert io.bar_features_warmup() == plan
    assert sorted(opened) == sorted([*plan, Q3]), "the asset opened other bars than its key lists"
    assert result.metadata is not None and result.metadata["warmup_bars"] == need
    key = io.key("bar_features")
    assert str(io.path("bar_features")) == str(result.metadata["path"].value)  # type: ignore[union-attr]

    # The key covers the raw files behind every bars file read: 2023-Q4's trades (the roll
    # calendar of 2024-Q1's bars) count exactly when the warm-up reaches 2024-Q1.
    q0 = io.identity("trades", Q0)
    assert q0 is not None

    def replaced(schema: str, q: dt.date):
        return dataclasses.replace(q0, size=1) if (schema, q) == ("trades", Q0) else io.identity(schema, q)

    moved = lineage.bar_features_key(io.cfg, replaced, Q3, io.bar_count) != key
    assert moved is short_q2
