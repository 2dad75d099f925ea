"""The snapshot row unit's data path (core/snapshot_rows.py) on a tiny synthetic ES quarter with
a roll, through real DBN files and sidecars: which records are rows, the bar context join,
chunk independence, causality (alteration after T, and the raw data cut at T) and the fxcache
file it writes."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from fx_assets.core import mid_asof
from fx_assets.core import snapshot_rows as sr
from fx_assets.core.active_contract import active_trades, quarter_roll_calendar
from fx_assets.core.bar_features import BarFeatureConfig, FeatureTable
from fx_assets.core.bar_rows import quarter_bar_features, quarter_bars
from fx_assets.core.bars import BarConfig, BarTable
from fx_assets.core.book import BookSource
from fx_assets.core.calendar import session_day
from fx_assets.core.causality import truncate_sidecar
from fx_assets.core.contracts import is_spread
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import DType, describe_fxcache, open_fxcache
from fx_assets.core.roll import RollCalendar
from fx_assets.core.sidecar import ensure_sidecar, open_sidecar, read_symbol_map, sidecar_columns
from fx_assets.core.snapshot_features import BAR_PROGRESS_NAMES, SnapshotFeatureConfig, feature_names
from fx_assets.core.snapshot_labels import running_breaks
from fx_assets_tests.conftest import make_market
from fx_assets_tests.test_stage_invariants import rewrite_dbn

Q = "2024-Q1"  # holds the March roll
KEY = bytes(range(32))
CFG = SnapshotFeatureConfig(flow_windows=[10, 50], trade_windows=[10], drift_windows=[10, 100])


@dataclass(frozen=True)
class Quarter:
    trades: Path
    book: BookSource
    calendar: RollCalendar
    bars: BarTable
    features: FeatureTable


def _bars_and_features(
    trades: Path, cal: RollCalendar, drop_open_last: bool = False
) -> tuple[BarTable, FeatureTable]:
    bars = quarter_bars(active_trades(trades, cal), BarConfig())
    if drop_open_last and len(bars) and bool(bars.forced_close[-1]):
        bars = bars.slice(0, len(bars) - 1)  # the input's partial last bar: not a closed bar
    return bars, quarter_bar_features(bars, [], BarFeatureConfig())


@pytest.fixture(scope="module")
def quarter(tmp_path_factory: pytest.TempPathFactory) -> Quarter:
    tmp = tmp_path_factory.mktemp("snaprows")
    root = make_market(tmp / "market", f"{Q}:{Q}", scale=0.003, seed=7)
    tr = ensure_sidecar(
        root / "raw" / "trades" / "ES.FUT" / f"ES.FUT_{Q}.dbn.zst", tmp / "sc" / "trades"
    ).path
    bk = ensure_sidecar(
        root / "raw" / "mbp-10" / "ES.FUT" / f"ES.FUT_{Q}.dbn.zst", tmp / "sc" / "mbp-10"
    ).path
    cal = quarter_roll_calendar(tr, None)
    bars, feats = _bars_and_features(tr, cal)
    return Quarter(tr, BookSource(bk, cal), cal, bars, feats)


def rows_of(
    q: Quarter, book: BookSource | None = None, chunk: int = 7919, bars=None, feats=None, trades=None
) -> sr.SnapshotChunk:
    book = book or q.book
    plan = sr.plan_snapshot_rows(
        book,
        q.bars if bars is None else bars,
        q.features if feats is None else feats,
        trades=q.trades if trades is None else trades,
    )
    parts = [  # a chunk's arrays are reused for the next: copy each as it comes
        sr.SnapshotChunk(p.ts.copy(), p.features.copy(), p.prices.copy(), p.rows.copy())
        for p in sr.iter_snapshot_rows(book, plan, CFG, chunk=chunk)
    ]
    assert sum(len(p.ts) for p in parts) == plan.n_rows
    return sr.SnapshotChunk(
        ts=np.concatenate([p.ts for p in parts]),
        features=np.concatenate([p.features for p in parts]),
        prices=np.concatenate([p.prices for p in parts]),
        rows=np.concatenate([p.rows for p in parts]),
    )


def reference_rows(book: BookSource) -> np.ndarray:
    """Record numbers of the rows, by the numpy definition: the session's active contract,
    F_LAST set, both touches present and not crossed."""
    c = sidecar_columns(book.path, ["ts_recv", "instrument_id", "flags", "bid_px_00", "ask_px_00"])
    days = session_day(c["ts_recv"])
    iid, known = book.calendar.active_instrument(days)
    b, a = c["bid_px_00"].astype(np.int64), c["ask_px_00"].astype(np.int64)
    undef = np.iinfo(np.int64).max
    ok = (days >= 0) & known & (c["instrument_id"] == iid) & ((c["flags"] & 128) != 0)
    ok &= (b != undef) & (a != undef) & (b > 0) & (b <= a)
    return np.flatnonzero(ok)


def test_rows_are_the_active_outright_contracts_last_records(quarter: Quarter) -> None:
    ref = reference_rows(quarter.book)
    c = sidecar_columns(quarter.book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    plan = sr.plan_snapshot_rows(quarter.book, quarter.bars, quarter.features, trades=quarter.trades)
    assert plan.n_selected == ref.size
    assert len(np.unique(c["instrument_id"])) >= 2  # the book holds more than the active contract
    got = rows_of(quarter)
    np.testing.assert_array_equal(got.ts, c["ts_recv"][ref][got.rows])
    mid = (c["bid_px_00"][ref] / 1e9 + c["ask_px_00"][ref] / 1e9) / 2
    np.testing.assert_array_equal(got.prices[:, 0], mid[got.rows])  # exact f64 mid
    np.testing.assert_array_equal(got.prices[:, 1], session_day(got.ts))
    codes = np.unique(got.prices[:, 2])
    assert codes.size == 2 and set(codes) <= {202403.0, 202406.0}  # the roll is crossed
    # the break count the labels use changes at every session and at the roll
    breaks = running_breaks(got.prices[:, 1], got.prices[:, 2])
    assert breaks[-1] == np.count_nonzero(np.diff(got.prices[:, 1]) != 0) + np.count_nonzero(
        (np.diff(got.prices[:, 2]) != 0) & (np.diff(got.prices[:, 1]) == 0)
    )
    n = plan.counts
    assert (
        n["rows_scanned"]
        == n["records"] - n["inactive_or_other_contract"] - n["not_last_in_event"] - n["no_or_crossed_touch"]
    )
    assert (
        n["rows"]
        == plan.n_rows
        == n["rows_scanned"] - n["dropped_no_closed_bar"] - n["dropped_bar_features_undefined"]
    )
    assert n["dropped_bar_features_undefined"] > 0  # the first quarter's bar-feature warm-up


def _rewrite_sidecar(src: Path, dest: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> Path:
    table = open_sidecar(src)
    cols = {name: np.array(table.column(name).to_numpy()) for name in table.schema.names}
    edit(cols)
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if b"checksum" not in k}
    out = pa.Table.from_arrays([pa.array(cols[n], type=table.schema.field(n).type) for n in table.schema.names],
                               names=table.schema.names).replace_schema_metadata(meta)  # fmt: skip
    with pa.OSFile(str(dest), "wb") as sink, pa.ipc.new_file(sink, out.schema) as w:
        w.write_batch(out.combine_chunks().to_batches(max_chunksize=max(out.num_rows, 1))[0])
    return dest


def test_spreads_and_inactive_contracts_never_become_rows(quarter: Quarter, tmp_path: Path) -> None:
    """Records relabelled as a calendar spread (or a contract that is never active) vanish
    from the rows; nothing else changes."""
    spread = next(s.instrument_id for s in read_symbol_map(quarter.trades) if is_spread(s.raw_symbol))
    ref = reference_rows(quarter.book)
    hit = ref[::97]

    def relabel(cols: dict[str, np.ndarray]) -> None:
        cols["instrument_id"][hit[::2]] = spread
        cols["instrument_id"][hit[1::2]] = 4_000_000_000

    alt = BookSource(_rewrite_sidecar(quarter.book.path, tmp_path / "alt.arrow", relabel), quarter.calendar)
    plan = sr.plan_snapshot_rows(alt, quarter.bars, quarter.features, trades=quarter.trades)
    assert plan.n_selected == ref.size - hit.size
    np.testing.assert_array_equal(reference_rows(alt), np.setdiff1d(ref, hit))


def test_chunk_size_changes_no_value(quarter: Quarter, tmp_path: Path) -> None:
    a = rows_of(quarter, chunk=1 << 30)
    for chunk in (613, 50_000):
        b = rows_of(quarter, chunk=chunk)
        for f in ("ts", "features", "prices", "rows"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f"chunk {chunk}: {f}")
    files = [
        sr.write_snapshot_fxcache(
            tmp_path / f"c{k}.fxcache",
            quarter.book,
            quarter.bars,
            quarter.features,
            CFG,
            "f32",
            KEY,
            trades=quarter.trades,
            chunk=k,
        )
        for k in (997, 1 << 30)
    ]
    assert files[0] == files[1]
    assert (tmp_path / "c997.fxcache").read_bytes() == (tmp_path / f"c{1 << 30}.fxcache").read_bytes()


def test_bar_context_is_the_last_bar_closed_strictly_before_the_row(quarter: Quarter) -> None:
    plan = sr.plan_snapshot_rows(quarter.book, quarter.bars, quarter.features, trades=quarter.trades)
    ts_rows = sidecar_columns(quarter.book.path, ["ts_recv"])["ts_recv"][reference_rows(quarter.book)]
    np.testing.assert_array_equal(
        plan.close_rows, np.searchsorted(ts_rows, quarter.bars.ts_close, side="left")
    )
    got = rows_of(quarter)
    nf = len(feature_names(CFG)) + len(BAR_PROGRESS_NAMES)
    j = np.searchsorted(plan.close_rows, got.rows, side="left") - 1
    assert (j >= 0).all()
    assert (quarter.bars.ts_close[j] <= got.ts).all()  # closed at or before the row's ts_recv ...
    assert (plan.close_rows[j] < got.rows).all()  # ... and its closing row precedes the row
    nxt = j + 1 < len(quarter.bars)
    assert (plan.close_rows[j[nxt] + 1] >= got.rows[nxt]).all()  # the next bar is not yet closed
    np.testing.assert_array_equal(got.features[:, nf:], plan.bar_values[j])


def _cut_points(q: Quarter, got: sr.SnapshotChunk) -> list[int]:
    """Row times T: random ones, one just before and one just after the roll."""
    rng = np.random.default_rng(3)
    picks = list(got.ts[rng.integers(len(got.ts) // 10, len(got.ts), 3)])
    roll = int(np.flatnonzero(np.diff(got.prices[:, 2]) != 0)[0])
    return sorted({int(t) for t in [*picks, got.ts[roll], got.ts[roll + 1]]})


def test_alteration_after_t_changes_no_row_up_to_t(quarter: Quarter, tmp_path: Path) -> None:
    full = rows_of(quarter)
    bts = sidecar_columns(quarter.book.path, ["ts_recv"])["ts_recv"]
    for i, t in enumerate(_cut_points(quarter, full)[:3]):
        after = bts > t

        def alter(cols: dict[str, np.ndarray], after: np.ndarray = after) -> None:
            for lvl in range(10):
                for side in ("bid", "ask"):
                    cols[f"{side}_sz_{lvl:02d}"][after] = cols[f"{side}_sz_{lvl:02d}"][after] * 3 + 1
            cols["side"][after] = np.where(cols["side"][after] == ord("B"), ord("A"), ord("B"))
            cols["size"][after] = cols["size"][after] + 5

        alt = BookSource(
            _rewrite_sidecar(quarter.book.path, tmp_path / f"alt{i}.arrow", alter), quarter.calendar
        )
        got = rows_of(quarter, alt, chunk=30_011)
        k = int(np.searchsorted(full.ts, t, side="right"))
        for f in ("ts", "features", "prices", "rows"):
            np.testing.assert_array_equal(getattr(got, f)[:k], getattr(full, f)[:k], err_msg=f"T={t}: {f}")
        assert not np.array_equal(got.features[k:], full.features[k:])  # the alteration does show after T
        names = sr.snapshot_feature_columns(
            CFG, sr.plan_snapshot_rows(quarter.book, quarter.bars, quarter.features, trades=quarter.trades)
        )
        for c in ("mlofi_1to5_k10", "mlofi_1to10_k50"):  # the level-aggregated OFI is covered
            assert not np.array_equal(got.features[k:, names.index(c)], full.features[k:, names.index(c)]), c


def test_raw_data_cut_at_t_gives_the_same_rows_up_to_t(quarter: Quarter, tmp_path: Path) -> None:
    """The held-out style check: book and trades cut to ts_recv <= T, bars and bar features
    rebuilt from the cut trades (their unfinished last bar is not a closed bar), rows
    recomputed: every row up to T is the same, bit for bit."""
    full = rows_of(quarter)
    for i, t in enumerate(_cut_points(quarter, full)):
        bk = tmp_path / f"book{i}.arrow"
        tr = tmp_path / f"trades{i}.arrow"
        truncate_sidecar(quarter.book.path, bk, after_ts=None, until_ts=t)
        truncate_sidecar(quarter.trades, tr, after_ts=None, until_ts=t)
        bars, feats = _bars_and_features(tr, quarter.calendar, drop_open_last=True)
        got = rows_of(quarter, BookSource(bk, quarter.calendar), bars=bars, feats=feats, trades=tr)
        k = int(np.searchsorted(full.ts, t, side="right"))
        assert len(got.ts) == k
        for f in ("ts", "features", "prices", "rows"):
            np.testing.assert_array_equal(getattr(got, f), getattr(full, f)[:k], err_msg=f"T={t}: {f}")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_the_fxcache_holds_the_rows(quarter: Quarter, tmp_path: Path, dtype: DType) -> None:
    p = tmp_path / "s.fxcache"
    counts = sr.write_snapshot_fxcache(
        p,
        quarter.book,
        quarter.bars,
        quarter.features,
        CFG,
        dtype,
        KEY,
        {"partition": Q},
        trades=quarter.trades,
        chunk=20_000,
    )
    got = rows_of(quarter)
    with open_fxcache(p) as fc:
        assert fc.n_bars == counts["rows"] == len(got.ts)
        assert fc.dtype == dtype and not fc.has_ofi
        assert fc.meta["row_unit"] == "snapshot" and fc.meta["rows"] == counts
        assert fc.group_names("price") == list(sr.SNAPSHOT_PRICE_COLUMNS)
        names = fc.group_names("feature")
        nf = len(feature_names(CFG))
        assert names[:nf] == feature_names(CFG)
        assert names[nf : nf + 3] == list(BAR_PROGRESS_NAMES)
        assert names[nf + 3 :] == [f"bar_{k}" for k in quarter.features.columns]
        np.testing.assert_array_equal(fc.ts, got.ts)
        np.testing.assert_array_equal(fc.prices[:, :3], got.prices)  # f64 whatever the value dtype
        tol = 2**-8 if dtype == "bf16" else 2**-23
        vals = fc.decoded()[:, : len(names)]
        np.testing.assert_allclose(vals, got.features, rtol=tol, atol=1e-30)
    d = describe_fxcache(p)
    assert d["valid"] and d["meta"]["row_unit"] == "snapshot"


def test_the_planning_pass_block_size_changes_nothing(
    quarter: Quarter, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sr.plan_snapshot_rows(quarter.book, quarter.bars, quarter.features, trades=quarter.trades)
    monkeypatch.setattr(sr, "_PLAN_BLOCK", 1009)
    b = sr.plan_snapshot_rows(quarter.book, quarter.bars, quarter.features, trades=quarter.trades)
    np.testing.assert_array_equal(a.close_rows, b.close_rows)
    assert a.counts == b.counts and a.n_selected == b.n_selected


def test_bad_input_is_named(quarter: Quarter, tmp_path: Path) -> None:
    def swap(cols: dict[str, np.ndarray]) -> None:
        cols["ts_recv"][5000], cols["ts_recv"][5001] = cols["ts_recv"][5001] + 1, cols["ts_recv"][5000]

    bad = BookSource(
        _rewrite_sidecar(quarter.book.path, tmp_path / "unordered.arrow", swap), quarter.calendar
    )
    with pytest.raises(FxDataError, match=r"unordered.arrow is not in ts_recv order at record 5001"):
        sr.plan_snapshot_rows(bad, quarter.bars, quarter.features, trades=quarter.trades, partition=Q)
    ref = reference_rows(quarter.book)

    def off_grid(cols: dict[str, np.ndarray]) -> None:
        cols["bid_px_03"][ref[700]] += 10_000_000  # 0.01 points: off the 0.25 tick

    bad = BookSource(
        _rewrite_sidecar(quarter.book.path, tmp_path / "offgrid.arrow", off_grid), quarter.calendar
    )
    plan = sr.plan_snapshot_rows(bad, quarter.bars, quarter.features, trades=quarter.trades)
    with pytest.raises(
        FxDataError, match=rf"offgrid.arrow: bid_px_03 = .* at record {ref[700]} .* tick grid"
    ):
        list(sr.iter_snapshot_rows(bad, plan, CFG, chunk=10_000))


def _trade_volume_upto(q: Quarter, trades: Path, at: np.ndarray) -> np.ndarray:
    """Volume of the active contract's trades (positive price and size) with ts_recv <= at."""
    c = sidecar_columns(trades, ["ts_recv", "instrument_id", "price", "size"])
    days = session_day(c["ts_recv"])
    iid, known = q.calendar.active_instrument(days)
    px = c["price"].astype(np.int64)
    ok = (days >= 0) & known & (c["instrument_id"] == iid) & (px != np.iinfo(np.int64).max) & (px > 0)
    cum = np.concatenate([[0.0], np.cumsum(np.where(ok & (c["size"] > 0), c["size"], 0).astype(np.float64))])
    return cum[np.searchsorted(c["ts_recv"], at, side="right")]


def test_bar_progress_follows_its_definition(quarter: Quarter) -> None:
    """bar_prog_volume / bar_prog_log_time / log_dt_bar_us against a plain numpy evaluation:
    the active contract's trades with ts_recv <= the row's, less those at or before the last
    closed bar's ts_close, over that bar's volume; the time since its close, raw and against
    its duration."""
    got = rows_of(quarter)
    plan = sr.plan_snapshot_rows(quarter.book, quarter.bars, quarter.features, trades=quarter.trades)
    j = np.searchsorted(plan.close_rows, got.rows, side="left") - 1
    bars = quarter.bars
    since = _trade_volume_upto(quarter, quarter.trades, got.ts) - _trade_volume_upto(
        quarter, quarter.trades, bars.ts_close[j]
    )
    el = np.log1p((got.ts - bars.ts_close[j]) / 1e3)
    names = sr.snapshot_feature_columns(CFG, plan)
    col = {k: got.features[:, names.index(k)] for k in BAR_PROGRESS_NAMES}
    np.testing.assert_allclose(col["bar_prog_volume"], since / bars.volume[j], rtol=1e-12, atol=0)
    np.testing.assert_allclose(col["log_dt_bar_us"], el, rtol=1e-12, atol=0)
    np.testing.assert_allclose(
        col["bar_prog_log_time"], el - np.log1p(bars.duration_ns[j] / 1e3), rtol=1e-9, atol=1e-12
    )
    assert (got.ts >= bars.ts_close[j]).all()  # the progress reads no bar still open
    # volume bars of 100 contracts: the open bar is partly filled (past 1 only where more bars
    # closed after the context's bar, between the previous row and this one)
    assert 0.1 < float(np.median(col["bar_prog_volume"])) < 0.9
    nxt = np.minimum(j + 1, len(bars) - 1)
    alone = (j + 1 < len(bars)) & (bars.ts_close[nxt] > got.ts)  # the next bar is still open
    alone &= ~bars.forced_close[j] & ~bars.forced_close[nxt]  # full bars (not a session's end)
    assert alone.mean() > 0.5
    # the open bar holds < 100 contracts, the closed one >= 100
    assert (col["bar_prog_volume"][alone] < 1.0).all(), col["bar_prog_volume"][alone].max()


def test_trades_altered_after_t_change_no_row_up_to_t(quarter: Quarter, tmp_path: Path) -> None:
    """The bar progress reads the trades sidecar: trades altered after T (sizes, with the bars
    kept) change no row up to T, and do show after it."""
    full = rows_of(quarter)
    tts = sidecar_columns(quarter.trades, ["ts_recv"])["ts_recv"]
    for i, t in enumerate(_cut_points(quarter, full)[:2]):
        after = tts > t

        def alter(cols: dict[str, np.ndarray], after: np.ndarray = after) -> None:
            cols["size"][after] = cols["size"][after] * 2 + 3

        tr = _rewrite_sidecar(quarter.trades, tmp_path / f"tr{i}.arrow", alter)
        got = rows_of(quarter, trades=tr, chunk=30_011)
        k = int(np.searchsorted(full.ts, t, side="right"))
        for f in ("ts", "features", "prices", "rows"):
            np.testing.assert_array_equal(getattr(got, f)[:k], getattr(full, f)[:k], err_msg=f"T={t}: {f}")
        c = len(feature_names(CFG))  # bar_prog_volume
        assert not np.array_equal(got.features[k:, c], full.features[k:, c])


def test_bar_join_kernel_is_bit_identical_to_the_numpy_join() -> None:
    """``_join_bar_nb`` (bar progress and bar context, one pass into the block) writes exactly
    the bits of the NumPy join it replaced (``bar_progress`` into the progress columns, then a
    ``np.take`` of the bars' values into the rest), into a strided block's columns only: rows
    before and after their bar's close, bars of zero volume and duration, NaN bar values."""
    from fx_assets.core.snapshot_features import bar_progress

    rng = np.random.default_rng(11)
    n_bars, m, nv, c0 = 50, 4000, 7, 5
    close_vol = np.cumsum(rng.integers(50, 150, n_bars)).astype(np.float64)
    bar_volume = rng.integers(0, 150, n_bars).astype(np.float64)
    bar_volume[::9] = 0.0
    bar_ts_close = np.cumsum(rng.integers(1, 10**9, n_bars)).astype(np.int64)
    bar_duration_ns = rng.integers(-5, 10**10, n_bars).astype(np.int64)
    bar_duration_ns[::7] = 0
    bar_values = rng.normal(size=(n_bars, nv))
    bar_values[3, 2] = np.nan
    jj = np.sort(rng.integers(0, n_bars, m)).astype(np.int64)
    ts = bar_ts_close[jj] + rng.integers(-(10**6), 10**9, m)  # some before the close (clipped)
    vol = close_vol[jj] + rng.integers(-20, 200, m).astype(np.float64)  # some below (clipped)
    vol[::13] = close_vol[jj[::13]]  # exactly at the close
    width = c0 + 3 + nv + 2
    want = rng.normal(size=(m, width))
    got = want.copy()
    want[:, c0 : c0 + 3] = bar_progress(
        vol - close_vol[jj], bar_volume[jj], ts - bar_ts_close[jj], bar_duration_ns[jj]
    )
    np.take(bar_values, jj, axis=0, out=want[:, c0 + 3 : c0 + 3 + nv])
    sr._join_bar_nb(jj, vol, ts, close_vol, bar_volume, bar_ts_close, bar_duration_ns, bar_values, got, c0)
    assert got.tobytes() == want.tobytes()


def test_chunk_rows_kernel_is_the_numpy_form() -> None:
    """``_chunk_rows_nb`` gives exactly what the NumPy lines it replaced gave: the records'
    action, aggressor sign (via ``_SIDE_SIGN``), float size, the running break count (from the
    previous chunk's slot and count, +1 at each slot change) and the price columns."""
    rng = np.random.default_rng(12)
    n_rec, m = 5000, 3000
    action = rng.choice(np.frombuffer(b"TAMCR", np.uint8), n_rec)
    side = rng.choice(np.frombuffer(b"ABN", np.uint8), n_rec)
    size = rng.integers(0, 2**32, n_rec, dtype=np.uint64).astype(np.uint32)
    idx = np.sort(rng.choice(n_rec, m, replace=False)).astype(np.int64)
    slot = np.sort(rng.integers(0, 40, m)).astype(np.int64)
    bid0 = 4000.0 + 0.25 * rng.integers(0, 400, m)
    ask0 = bid0 + 0.25 * rng.integers(1, 4, m)
    slot_day, slot_code = rng.normal(size=40), rng.normal(size=40)
    for last_slot, n_breaks in ((-1, 0), (int(slot[0]), 17), (int(slot[0]) + 1, 5)):
        change = np.empty(m, np.int64)
        change[0] = slot[0] != last_slot
        np.not_equal(slot[1:], slot[:-1], out=change[1:])
        want_prices = np.empty((m, 3))
        np.add(bid0, ask0, out=want_prices[:, 0])
        want_prices[:, 0] /= 2.0
        np.take(slot_day, slot, out=want_prices[:, 1])
        np.take(slot_code, slot, out=want_prices[:, 2])
        got = (
            np.empty(m, np.uint8),
            np.empty(m, np.int8),
            np.empty(m),
            np.empty(m, np.int64),
            np.empty((m, 3)),
        )
        sr._chunk_rows_nb(
            idx, slot, action, side, size, bid0, ask0, slot_day, slot_code, last_slot, n_breaks, *got
        )
        want = (
            action[idx],
            sr._SIDE_SIGN[side[idx]],
            size[idx].astype(np.float64),
            n_breaks + np.cumsum(change),
        )
        for g, w in zip(got, (*want, want_prices), strict=True):
            assert g.dtype == w.dtype and g.tobytes() == w.tobytes()


def test_trade_volume_merge_gives_row_and_bar_close_volumes_bit_for_bit() -> None:
    """``_trade_volume_nb`` (one forward merge giving each row's trade volume and, on the way,
    each bar close's) against plain prefix sums over the trades: ties of trade, row and bar
    close times, trades of inactive sessions / other contracts / undefined or non-positive price
    / zero size, bar closes before the first row and between rows, calls of any size (one row
    to many), calls skipped (a chunk with nothing kept), and bars closing after the last row
    left unset."""
    rng = np.random.default_rng(21)
    undef = np.iinfo(np.int64).max
    bounds = np.array([0, 5_000, 6_000, 10**9], np.int64)  # two sessions, a halt between
    act = np.array([5, 6], np.int64)
    n = 20_000
    tts = np.sort(rng.integers(0, 12_000, n)).astype(np.int64)  # many equal times
    tiid = rng.choice(np.array([5, 6, 7], np.uint32), n)
    tpx = rng.choice(np.array([100, 250, 0, -5, undef], np.int64), n, p=[0.4, 0.4, 0.05, 0.05, 0.1])
    tsz = rng.integers(0, 4, n).astype(np.uint32)
    tc = np.sort(np.concatenate([rng.integers(-50, 12_500, 300), tts[rng.integers(0, n, 100)]]))
    tc = tc.astype(np.int64)
    at = np.sort(np.concatenate([rng.integers(0, 11_000, 3000), tts[rng.integers(0, n, 500)], tc[:50]]))
    at = at.astype(np.int64)

    def plain(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(bounds, tts, side="right")
        slot = np.clip((k - 1) >> 1, 0, act.size - 1)
        ok = (k & 1).astype(bool) & (tiid == act[slot]) & (tpx != undef) & (tpx > 0) & (tsz > 0)
        cum = np.concatenate([[0.0], np.cumsum(np.where(ok, tsz, 0).astype(np.float64))])
        return cum[np.searchsorted(tts, t, side="right")]

    for seed in range(3):
        r2 = np.random.default_rng(seed)
        cuts = np.unique(np.concatenate([[0, at.size], r2.integers(0, at.size, 40)]))
        close_vol = np.zeros(tc.size)
        st, cum = np.array([0, 0, 0, -1], np.int64), np.zeros(1)
        out = np.full(at.size, np.nan)
        called = np.zeros(at.size, bool)
        for lo, hi in itertools.pairwise(cuts):
            if r2.random() < 0.2:
                continue  # a chunk whose rows are all dropped: no call
            sr._trade_volume_nb(
                tts, tiid, tpx, tsz, bounds, act, at[lo:hi], out[lo:hi], tc, close_vol, st, cum
            )
            called[lo:hi] = True
        assert out[called].tobytes() == plain(at[called]).tobytes()
        last = at[np.flatnonzero(called)[-1]]
        passed = tc <= last
        assert close_vol[passed].tobytes() == plain(tc[passed]).tobytes()
        assert not close_vol[~passed].any()  # not reached: left unset
        assert st[3] == -1

    # out of ts_recv order: a trade before the previous one, or after the last record (the
    # session table covers the first to the last record): the merge stops there and says where
    for bad, edit in (
        (7000, lambda x: x.__setitem__(7000, x[6990] - 1)),
        (n - 1, lambda x: x.__setitem__(n - 1, x[5000])),
    ):
        tb = tts.copy()
        edit(tb)
        st, cum = np.array([0, 0, 0, -1], np.int64), np.zeros(1)
        sr._trade_volume_nb(
            tb, tiid, tpx, tsz, bounds, act, at, np.empty(at.size), tc, np.zeros(tc.size), st, cum
        )
        first = bad if bad < n - 1 else int(np.argmax(tb > tb[-1]))
        assert st[3] == first, (st, first)


def test_trades_out_of_order_are_refused(quarter: Quarter, tmp_path: Path) -> None:
    """The bar progress merge reads the trades in ts_recv order: a trades sidecar that is not
    (two records swapped) is refused, naming the first record read out of order."""

    def swap(cols: dict[str, np.ndarray]) -> None:
        i = cols["ts_recv"].shape[0] // 3
        while cols["ts_recv"][i + 1] == cols["ts_recv"][i]:
            i += 1
        cols["ts_recv"][[i, i + 1]] = cols["ts_recv"][[i + 1, i]]

    tr = _rewrite_sidecar(quarter.trades, tmp_path / "swapped.arrow", swap)
    with pytest.raises(FxDataError, match=r"swapped.arrow: trades are not in ts_recv order at record \d+"):
        rows_of(quarter, trades=tr)


def test_plan_context_kernel_is_the_last_closed_bar_form() -> None:
    """``SnapshotPlan.context`` (a forward merge over the closing rows) gives exactly what the
    NumPy form it replaced gave (``last_closed_bar``, clipped to 0 where none, kept where a bar
    is closed and its context defined): bars closing on the same row, before the first row,
    after the last, chunks starting anywhere, with and without output buffers."""
    from fx_assets.core.snapshot_features import last_closed_bar

    rng = np.random.default_rng(31)
    n_rows, n_bars = 5000, 700
    close_rows = np.sort(rng.integers(0, n_rows + 40, n_bars)).astype(np.int64)
    close_rows[:5] = 0  # several bars closing on the first row
    close_rows[100:110] = close_rows[100]
    bar_ok = rng.random(n_bars) < 0.9
    plan = sr.SnapshotPlan(
        n_rows, close_rows, [], np.empty((n_bars, 0)), bar_ok, 0
    )  # only close_rows and bar_ok matter here
    bufs = (np.ones(6000, np.bool_), np.full(6000, -9, np.int64))
    for row0, m in ((0, 1), (0, 700), (1, 50), (37, 1200), (2500, 2500), (4990, 10), (n_rows, 5)):
        j = last_closed_bar(close_rows, m, row0)
        has = j >= 0
        want_jj = np.where(has, j, 0)
        want_keep = has & bar_ok[want_jj]
        for out in (None, bufs):
            keep, jj, n_keep = plan.context(row0, m, out)
            assert keep.tobytes() == want_keep.tobytes() and jj.tobytes() == want_jj.tobytes(), (row0, m)
            assert n_keep == int(want_keep.sum())


def test_the_stage_hands_back_the_free_heap_before_its_work(
    quarter: Quarter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot fxcache stage's peak is its chunk plus what is live: it releases the free heap
    earlier stages left before it plans (bench_snapshot_quarter: 1.117x -> 1.039x for a
    book-heavy quarter)."""
    order: list[str] = []
    plan = sr.plan_snapshot_rows
    monkeypatch.setattr(sr, "release_free_heap", lambda: order.append("release") or True)
    monkeypatch.setattr(sr, "plan_snapshot_rows", lambda *a, **k: (order.append("plan"), plan(*a, **k))[1])
    sr.write_snapshot_fxcache(
        tmp_path / "s.fxcache",
        quarter.book,
        quarter.bars,
        quarter.features,
        CFG,
        "bf16",
        KEY,
        trades=quarter.trades,
    )
    assert order == ["release", "plan"]


def test_records_without_a_usable_touch_are_neither_rows_nor_mids(quarter: Quarter, tmp_path: Path) -> None:
    """Active-contract last records whose top of book is crossed, one-sided (an undefined
    price) or has a non-positive bid (the synthetic market has none): not rows (the numpy
    definition, ``reference_rows``), and ``book_mid_asof`` passes over them to the last usable
    record before (``book._valid_touch``, the one rule both apply)."""
    ref0 = reference_rows(quarter.book)
    picks = ref0[3::41]
    groups = np.array_split(picks, 4)
    tick = 250_000_000  # 0.25 in DBN price units

    def plant(rec: np.ndarray) -> np.ndarray:
        rec["bid_px_00"][groups[0]] = rec["ask_px_00"][groups[0]] + tick  # crossed
        rec["bid_px_00"][groups[1]] = np.iinfo(np.int64).max  # no bid
        rec["ask_px_00"][groups[2]] = np.iinfo(np.int64).max  # no ask
        rec["bid_px_00"][groups[3]] = 0
        return rec

    raw = quarter.book.path.parents[2] / "market" / "raw" / "mbp-10" / "ES.FUT" / f"ES.FUT_{Q}.dbn.zst"
    planted = rewrite_dbn(raw, tmp_path / "planted.dbn.zst", plant)
    book = BookSource(ensure_sidecar(planted, tmp_path / "sc").path, quarter.calendar)
    assert all(g.size > 5 for g in groups)
    ref = reference_rows(book)
    assert ref.size == ref0.size - picks.size
    plan = sr.plan_snapshot_rows(book, quarter.bars, quarter.features, trades=quarter.trades)
    assert plan.n_selected == ref.size
    # the mid as of each planted record's time: the last usable active record's at or before it
    # (any record of the event, F_LAST or not)
    c = sidecar_columns(book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    iid, known = book.calendar.active_instrument(session_day(c["ts_recv"]))
    b, a = c["bid_px_00"].astype(np.int64), c["ask_px_00"].astype(np.int64)
    undef = np.iinfo(np.int64).max
    usable = np.flatnonzero(
        known & (c["instrument_id"] == iid) & (b != undef) & (a != undef) & (b > 0) & (b <= a)
    )
    q = c["ts_recv"][picks]
    at = np.searchsorted(c["ts_recv"][usable], q, side="right") - 1
    mids = (b[usable] / 1e9 + a[usable] / 1e9) / 2
    want = np.where(at >= 0, mids[np.maximum(at, 0)], np.nan)
    np.testing.assert_array_equal(mid_asof.book_mid_asof(book, q), want)
