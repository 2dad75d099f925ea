"""Golden outputs of the feature stages: speed work must not change a single bit.

A small two-quarter synthetic market runs through the stage drivers of
:mod:`fx_assets.core.bar_rows` as the assets call them (roll calendar, active trades, bars, bar
features and OFI warmed up from the previous quarter, the fxcache assembly and file in every
dtype); every column's XXH3-128 (:func:`fx_assets.core.tables.table_checksums`) and every
fxcache region checksum must equal the ones recorded in ``golden/stage_digests.json`` (written
by the code before the fxcache / OFI speed-ups of issue 10). OFI runs on the trade flow the
flow (``active_trade_flow``), and again from the full active trades with a small
``book_chunk`` (many chunks, each replaying its warm-up), which must give the same bits, and
with 1, 2 and 7 workers (chunks run in parallel, one thread each), on the flow and on the trades
the asset leaves in their sidecars (``trade_source``: each chunk's window written out of them).

A deliberate change of a stage's numbers regenerates the file:
``FX_GOLDEN_WRITE=1 python -m pytest fx_assets_tests/core/test_stage_golden.py`` (and says
why in its commit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import (
    TradeSidecar,
    active_trade_flow,
    active_trades,
    quarter_roll_calendar,
    trade_source,
)
from fx_assets.core.bar_features import BarFeatureConfig
from fx_assets.core.bar_rows import assemble_fxcache_columns, quarter_bar_features, quarter_bars, quarter_ofi
from fx_assets.core.bars import BarConfig
from fx_assets.core.book import BookSource
from fx_assets.core.checksum import hash_file
from fx_assets.core.fxcache import read_header, write_fxcache
from fx_assets.core.ofi_warmup import ofi_warmup_start
from fx_assets.core.sidecar import ensure_sidecar
from fx_assets.core.tables import table_checksums
from fx_assets_tests.conftest import make_market

GOLDEN = Path(__file__).parent / "golden" / "stage_digests.json"
QUARTERS = ("2024-Q2", "2024-Q3")
KEY = bytes(range(32))


def _raw(root: Path, schema: str, q: str) -> Path:
    return root / "raw" / schema / "ES.FUT" / f"ES.FUT_{q}.dbn.zst"


def _digests(tmp: Path) -> dict[str, Any]:
    root = make_market(tmp / "market", f"{QUARTERS[0]}:{QUARTERS[1]}", scale=0.01, seed=5, signal=1.0)
    sc = {
        (schema, q): ensure_sidecar(_raw(root, schema, q), tmp / "sidecars" / schema).path
        for schema in ("trades", "mbp-10")
        for q in QUARTERS
    }
    out: dict[str, Any] = {}
    prev_cal = prev_bars = None
    for i, q in enumerate(QUARTERS):
        label = q
        prev_q = QUARTERS[i - 1] if i else None
        cal = quarter_roll_calendar(sc["trades", q], sc["trades", prev_q] if prev_q else None)
        trades = active_trades(sc["trades", q], cal)
        bars = quarter_bars(trades, BarConfig())
        feats = quarter_bar_features(bars, [prev_bars] if prev_bars is not None else [], BarFeatureConfig())
        book = BookSource(sc["mbp-10", q], cal)
        cfg = ofi_core.OfiConfig()
        kw: dict[str, Any] = {}
        if prev_bars is not None and prev_cal is not None and prev_q is not None:
            prev_book = BookSource(sc["mbp-10", prev_q], prev_cal)
            start = ofi_warmup_start(prev_bars, prev_book, cfg)
            kw = {
                "prev_bars": prev_bars,
                "prev_trades": active_trades(sc["trades", prev_q], prev_cal, after_ts=start),
                "prev_book": prev_book,
            }
        # The OFI asset loads the trade flow only: the same trades, times, sizes and signs.
        flow = active_trade_flow(sc["trades", q], cal)
        for f in ("ts", "size", "sign"):
            assert np.array_equal(getattr(flow, f), getattr(trades, f)), f
        flow_kw = dict(kw)
        if kw:
            prev_flow = active_trade_flow(sc["trades", prev_q], prev_cal, after_ts=kw["prev_trades"].after_ts)
            assert np.array_equal(prev_flow.ts, kw["prev_trades"].ts)
            flow_kw["prev_trades"] = prev_flow
        # The asset's loader: the trades left in the (ordered) sidecars, both quarters.
        src = trade_source(sc["trades", q], cal)
        assert isinstance(src, TradeSidecar)
        src_kw = dict(kw)
        if kw:
            src_kw["prev_trades"] = trade_source(
                sc["trades", prev_q], prev_cal, after_ts=kw["prev_trades"].after_ts
            )
            assert isinstance(src_kw["prev_trades"], TradeSidecar)
        ofi = quarter_ofi(bars, flow, book, cfg, partition=label, **flow_kw)
        ofi_small = quarter_ofi(bars, trades, book, cfg, partition=label, book_chunk=5_000, **kw)
        d: dict[str, Any] = {
            "roll_calendar": table_checksums(cal.to_arrow()),
            "bars": table_checksums(bars.to_arrow()),
            "bar_features": table_checksums(feats.to_arrow()),
            "ofi_features": table_checksums(ofi.to_arrow()),
        }
        assert table_checksums(ofi_small.to_arrow()) == d["ofi_features"], f"{q}: OFI depends on book_chunk"
        # Chunks run n_workers at a time (one thread each): the same bits for any thread count.
        for w in (1, 2, 7):
            par_cfg = ofi_core.OfiConfig(n_workers=w)
            for chunk in (5_000, 40_000):
                par = quarter_ofi(bars, flow, book, par_cfg, partition=label, book_chunk=chunk, **flow_kw)
                got = table_checksums(par.to_arrow())
                assert got == d["ofi_features"], f"{q}: OFI with {w} workers, book_chunk {chunk} differs"
                par = quarter_ofi(bars, src, book, par_cfg, partition=label, book_chunk=chunk, **src_kw)
                got = table_checksums(par.to_arrow())
                assert got == d["ofi_features"], (
                    f"{q}: OFI from the sidecar, {w} workers, chunk {chunk} differs"
                )
        ts, groups, dropped = assemble_fxcache_columns(bars, feats, ofi, book)
        d["fxcache_dropped"] = dropped
        for dtype in ("f32", "bf16", "f64"):
            path = tmp / f"{q}.{dtype}.fxcache"
            write_fxcache(path, ts, groups, dtype, KEY, {"partition": label, "dropped_rows": dropped})
            h = read_header(path)
            d[f"fxcache_{dtype}"] = {
                "file": hash_file(path),
                **{k: v.hex() for k, v in h.checksums().items()},
            }
        out[q] = d
        prev_cal, prev_bars = cal, bars
    return out


def test_stage_outputs_match_golden(tmp_path: Path) -> None:
    got = _digests(tmp_path)
    if os.environ.get("FX_GOLDEN_WRITE") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {GOLDEN}")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for q in want:
        for stage, digests in want[q].items():
            if isinstance(digests, dict) and stage in got[q]:
                bad = sorted(k for k in digests if got[q][stage].get(k) != digests[k])
                assert not bad, f"{q} {stage}: columns / regions changed: {bad}"
            else:
                assert got[q][stage] == digests, f"{q} {stage}"
        assert sorted(got[q]) == sorted(want[q])
