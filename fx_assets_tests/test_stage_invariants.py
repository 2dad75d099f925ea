"""End-to-end invariants of the feature stages (DESIGN.md §5.1 causality, §5.2 partition
equivalence) on a tiny synthetic ES market, through real DBN files and sidecars.

The stage chain is run exactly as ``fx_assets.assets.features`` runs it per partition (roll
calendar seeded by the previous quarter, stored and reloaded as Arrow; bars; bar features
warmed up from the earlier quarters' bars; OFI warmed up from the previous quarter's bars,
trades and book), and every stage output is written with ``write_table`` and read back, so
what is compared is what would be cached. Perturbed markets (truncated, altered, mirrored)
are written as genuine DBN files: the original metadata header bytes followed by re-encoded
records, one zstd frame.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from fx_assets.core import active_contract as act
from fx_assets.core import bar_rows, mid_asof, page_release, tables
from fx_assets.core import book as book_mod
from fx_assets.core import ofi as ofi_core
from fx_assets.core import ofi_warmup as ofi_warm
from fx_assets.core.bar_features import (
    BarFeatureConfig,
    FeatureTable,
    compute_bar_features,
    max_window,
    validate_features,
)
from fx_assets.core.bars import BarConfig, BarTable, build_bars
from fx_assets.core.calendar import quarter_label, session_day
from fx_assets.core.causality import CausalityConfig, StoredQuarter, spot_check_causality, truncate_sidecar
from fx_assets.core.contracts import is_spread
from fx_assets.core.dbn import UNDEF_PRICE, px_to_float, read_header, read_records
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import RollCalendar, compute_roll_calendar
from fx_assets.core.sidecar import ensure_sidecar, read_symbol_map, sidecar_columns
from fx_assets.core.synth import SynthConfig, generate_market

QUARTERS = (dt.date(2024, 1, 1), dt.date(2024, 4, 1), dt.date(2024, 7, 1))
LABELS = tuple(quarter_label(q) for q in QUARTERS)
SYMBOL = "ES.FUT"
TICK_UNITS = 250_000_000  # 0.25 index points in DBN 1e-9 units
N_LEVELS = 10
TOL = 1e-9

SMALL_OFI = ofi_core.OfiConfig(
    vpin_bucket_volume=200.0,
    vpin_buckets=10,
    kyle_window=20,
    kyle_min_bars=10,
    trade_imbalance_windows=[1, 5, 20],
    hawkes_bars=20,
)


@dataclass(frozen=True)
class Cfg:
    bars: BarConfig
    feats: BarFeatureConfig
    ofi: ofi_core.OfiConfig


DEFAULT = Cfg(BarConfig(), BarFeatureConfig(), ofi_core.OfiConfig())


@dataclass(frozen=True)
class QuarterOut:
    """Every stage output of one quarter, as read back from its Arrow file."""

    label: str
    trades_sidecar: Path
    calendar: RollCalendar
    trades: act.ActiveTrades
    book: book_mod.BookSource
    bars: BarTable
    features: FeatureTable
    ofi: ofi_core.OfiFeatures


def raw_path(root: Path, schema: str, label: str) -> Path:
    return root / "raw" / schema / SYMBOL / f"{SYMBOL}_{label}.dbn.zst"


def run_chain(
    trades_raw: Sequence[Path],
    book_raw: Sequence[Path],
    work: Path,
    cfg: Cfg = DEFAULT,
    book_chunk: int = book_mod.DEFAULT_BOOK_CHUNK,
) -> list[QuarterOut]:
    """The feature stages of consecutive quarters, chained as the Dagster assets chain them."""
    tr_sc = [ensure_sidecar(p, work / "sidecars" / "trades").path for p in trades_raw]
    bk_sc = [ensure_sidecar(p, work / "sidecars" / "mbp-10").path for p in book_raw]
    outs: list[QuarterOut] = []
    for i, label in enumerate(LABELS[: len(tr_sc)]):
        cal_file = tables.write_table(
            work / f"roll_calendar_{label}.arrow",
            act.quarter_roll_calendar(tr_sc[i], tr_sc[i - 1] if i else None).to_arrow(),
        )
        cal = act.roll_calendar_from_table(tables.read_table(cal_file))
        trades = act.active_trades(tr_sc[i], cal)
        bars_file = tables.write_table(
            work / f"bars_{label}.arrow", bar_rows.quarter_bars(trades, cfg.bars).to_arrow()
        )
        bars = BarTable.from_arrow(tables.read_table(bars_file), str(bars_file))
        # Earlier quarters' bars, oldest first, walking back until max_window bars (as the asset).
        previous: list[BarTable] = []
        for o in reversed(outs):
            if sum(len(b) for b in previous) >= max_window(cfg.feats):
                break
            previous.insert(0, o.bars)
        feats = bar_rows.quarter_bar_features(bars, previous, cfg.feats)
        validate_features(feats, label)
        f_file = tables.write_table(work / f"bar_features_{label}.arrow", feats.to_arrow())
        feats = FeatureTable.from_arrow(tables.read_table(f_file))
        book = book_mod.BookSource(bk_sc[i], cal)
        kw: dict[str, Any] = {}
        if outs:
            kw = {"prev_bars": outs[-1].bars, "prev_trades": outs[-1].trades, "prev_book": outs[-1].book}
        ofi = bar_rows.quarter_ofi(bars, trades, book, cfg.ofi, partition=label, book_chunk=book_chunk, **kw)
        ofi_core.validate_ofi(ofi, label)
        o_file = tables.write_table(work / f"ofi_features_{label}.arrow", ofi.to_arrow())
        ofi = ofi_core.OfiFeatures.from_arrow(tables.read_table(o_file))
        outs.append(QuarterOut(label, tr_sc[i], cal, trades, book, bars, feats, ofi))
    return outs


# --- DBN rewriting ----------------------------------------------------------------------------


def rewrite_dbn(src: Path, dst: Path, edit: Callable[[np.ndarray], np.ndarray]) -> Path:
    """``dst`` = ``src``'s metadata header bytes + ``edit(records)``, one zstd frame."""
    header = read_header(src)
    records = edit(np.array(read_records(src)))  # a writable copy
    dst.parent.mkdir(parents=True, exist_ok=True)
    payload = header.header_bytes + np.ascontiguousarray(records).tobytes()
    dst.write_bytes(zstandard.ZstdCompressor(level=1).compress(payload))
    return dst


def _price_fields(rec: np.ndarray) -> list[str]:
    assert rec.dtype.names is not None
    return [n for n in rec.dtype.names if n == "price" or n.startswith(("bid_px_", "ask_px_"))]


def _flip_side(side: np.ndarray) -> np.ndarray:
    out = side.copy()
    out[side == ord("A")] = ord("B")
    out[side == ord("B")] = ord("A")
    return out


def alter_after(rec: np.ndarray, tau: int, pair: tuple[int, int]) -> np.ndarray:
    """Every record with ``ts_recv > tau`` changed: the two outrights' ids swapped (moves the
    volume leader, hence the roll), prices +3 ticks, sizes and counts changed, sides flipped."""
    late = rec["ts_recv"] > tau
    r = rec.copy()
    iid = r["instrument_id"][late]
    a, b = pair
    r["instrument_id"][late] = np.where(iid == a, b, np.where(iid == b, a, iid))
    for f in _price_fields(r):
        px = r[f][late]
        r[f][late] = np.where(px != UNDEF_PRICE, px + 3 * TICK_UNITS, px)
    r["size"][late] = r["size"][late] * 3 + 1
    r["side"][late] = _flip_side(r["side"][late])
    if "bid_px_00" in (r.dtype.names or ()):
        for side in ("bid", "ask"):
            for i in range(N_LEVELS):
                present = late & (r[f"{side}_px_{i:02d}"] != UNDEF_PRICE)
                r[f"{side}_sz_{i:02d}"][present] = r[f"{side}_sz_{i:02d}"][present] * 2 + 1
                r[f"{side}_ct_{i:02d}"][present] = r[f"{side}_ct_{i:02d}"][present] + 1
    return r


MIRROR_C_UNITS = 10_000 * 1_000_000_000  # reflect around 10000 index points


def mirror_records(rec: np.ndarray) -> np.ndarray:
    """p -> 2c - p, bid <-> ask (sizes and counts follow their side), aggressor sides flipped."""
    r = rec.copy()

    def refl(px: np.ndarray) -> np.ndarray:
        return np.where(px != UNDEF_PRICE, 2 * MIRROR_C_UNITS - px, px)

    r["price"] = refl(rec["price"])
    r["side"] = _flip_side(rec["side"])
    if "bid_px_00" in (r.dtype.names or ()):
        for i in range(N_LEVELS):
            k = f"{i:02d}"
            r[f"bid_px_{k}"] = refl(rec[f"ask_px_{k}"])
            r[f"ask_px_{k}"] = refl(rec[f"bid_px_{k}"])
            for q in ("sz", "ct"):
                r[f"bid_{q}_{k}"] = rec[f"ask_{q}_{k}"]
                r[f"ask_{q}_{k}"] = rec[f"bid_{q}_{k}"]
    return r


# --- comparisons ------------------------------------------------------------------------------


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equal values (NaN == NaN)."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def max_diff(a: np.ndarray, b: np.ndarray, what: str) -> float:
    """max |a - b| over defined values; NaN positions must coincide."""
    assert a.shape == b.shape, f"{what}: shapes {a.shape} != {b.shape}"
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        j = int(np.flatnonzero(na != nb)[0])
        raise AssertionError(f"{what}: NaN positions differ first at row {j} ({a[j]!r} vs {b[j]!r})")
    m = ~na
    return float(np.max(np.abs(a[m] - b[m]), initial=0.0))


def bars_prefix_equal(x: BarTable, y: BarTable, n: int, what: str) -> None:
    assert len(x) >= n and len(y) >= n, f"{what}: {len(x)} / {len(y)} bars, need {n}"
    for name, col in x.columns().items():
        assert same(col[:n], y.columns()[name][:n]), f"{what}: bars column {name} differs in bars <= t"


def features_prefix_equal(x: QuarterOut, y: QuarterOut, n: int, what: str) -> None:
    bars_prefix_equal(x.bars, y.bars, n, what)
    assert list(x.features.columns) == list(y.features.columns)
    assert same(x.features.ts_close[:n], y.features.ts_close[:n])
    for name, col in x.features.columns.items():
        assert same(col[:n], y.features.columns[name][:n]), f"{what}: bar feature {name} differs in bars <= t"
    assert list(x.ofi.columns) == list(y.ofi.columns)
    assert same(x.ofi.ts_close[:n], y.ofi.ts_close[:n])
    assert same(x.ofi.bars_since_reset[:n], y.ofi.bars_since_reset[:n]), f"{what}: bars_since_reset"
    for name, col in x.ofi.columns.items():
        assert same(col[:n], y.ofi.columns[name][:n]), f"{what}: OFI feature {name} differs in bars <= t"


def calendar_rows(cal: RollCalendar, upto: int | None = None) -> list[tuple[int, int, str | None, bool]]:
    rows = list(
        zip(
            cal.session_day.tolist(),
            cal.instrument_id.tolist(),
            cal.raw_symbol,
            cal.is_roll.tolist(),
            strict=True,
        )
    )
    return [r for r in rows if upto is None or r[0] <= upto]


def outright_ids(trades_sidecar: Path) -> tuple[int, int]:
    ids = sorted({m.instrument_id for m in read_symbol_map(trades_sidecar) if not is_spread(m.raw_symbol)})
    assert len(ids) == 2, ids
    return ids[0], ids[1]


# --- fixtures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Market:
    root: Path
    trades: tuple[Path, ...]
    book: tuple[Path, ...]
    outs: list[QuarterOut]  # the default chain over all quarters


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Market:
    root = tmp_path_factory.mktemp("stage_market")
    generate_market(root, SynthConfig(quarters=QUARTERS, symbols=(SYMBOL,), scale=0.003, seed=11))
    trades = tuple(raw_path(root, "trades", lb) for lb in LABELS)
    book = tuple(raw_path(root, "mbp-10", lb) for lb in LABELS)
    return Market(root, trades, book, run_chain(trades, book, root / "work"))


# --- 1. causality (truncation and alteration after bar t) -----------------------------------


def _pick_bars(out: QuarterOut, rng: np.random.Generator, n_random: int) -> list[int]:
    """Random bars t outside the quarter's first and last session, plus (when the quarter rolls)
    one in the session that decides the roll and one a few sessions before it."""
    b = out.bars
    sess = np.unique(b.session_id)
    inner = np.flatnonzero((b.session_id != sess[0]) & (b.session_id != sess[-1]))
    picks = [int(x) for x in rng.choice(inner, size=n_random, replace=False)]
    roll_idx = np.flatnonzero(out.calendar.is_roll)
    if roll_idx.size:
        k = int(roll_idx[0])
        for back in (1, 4):
            if k - back >= 1:
                in_s = np.flatnonzero(b.session_id == out.calendar.session_day[k - back])
                if in_s.size:
                    picks.append(int(in_s[in_s.size // 2]))
    return sorted(set(picks))


@pytest.mark.parametrize(
    ("qi", "small_ofi"), [(0, False), (1, False), (1, True)], ids=["Q1", "Q2", "Q2-small-ofi"]
)
def test_truncation_and_alteration_after_bar_t_change_nothing_up_to_t(
    market: Market, tmp_path: Path, qi: int, small_ofi: bool
) -> None:
    cfg = Cfg(DEFAULT.bars, DEFAULT.feats, SMALL_OFI) if small_ofi else DEFAULT
    ref = (
        market.outs[qi]
        if not small_ofi
        else run_chain(market.trades[: qi + 1], market.book[: qi + 1], tmp_path / "ref", cfg)[qi]
    )
    rng = np.random.default_rng(100 + qi + 10 * small_ofi)
    picks = _pick_bars(ref, rng, n_random=3)
    pair = outright_ids(ref.trades_sidecar)
    roll_changed = 0
    for t in picks:
        tau = int(ref.bars.ts_close[t])
        s_t = int(ref.bars.session_id[t])
        variants = {
            "truncated": lambda r, tau=tau: r[r["ts_recv"] <= tau],
            "altered": lambda r, tau=tau: alter_after(r, tau, pair),
        }
        for name, edit in variants.items():
            work = tmp_path / f"t{t}_{name}"
            trades = [*market.trades[:qi], rewrite_dbn(market.trades[qi], work / "trades.dbn.zst", edit)]
            book = [*market.book[:qi], rewrite_dbn(market.book[qi], work / "mbp10.dbn.zst", edit)]
            out = run_chain(trades, book, work, cfg)[qi]
            what = f"{ref.label} bar t={t} ({name})"
            assert calendar_rows(out.calendar, s_t) == calendar_rows(ref.calendar, s_t), what
            features_prefix_equal(ref, out, t + 1, what)
            if name == "truncated":
                # Only trades sharing bar t's close stamp can follow it (one partial bar).
                assert len(out.bars) <= t + 2, what
                assert int(out.calendar.session_day[-1]) == s_t, what
            else:
                assert not same(out.bars.close[t + 1 :], ref.bars.close[t + 1 :]), (
                    f"{what}: alteration not seen"
                )
                if calendar_rows(out.calendar) != calendar_rows(ref.calendar):
                    roll_changed += 1
    if qi == 1:
        # The alteration moved the roll of a later session at least once, and bars <= t held.
        assert roll_changed >= 1


def test_off_grid_price_after_bar_t_is_an_error_not_a_change(market: Market, tmp_path: Path) -> None:
    """The tick is a config property (OfiConfig.tick_size), never inferred from the quarter, so a
    late off-grid price cannot rescale earlier bars' tick features: it is reported instead."""
    ref = market.outs[1]
    t = len(ref.bars) // 2
    tau = int(ref.bars.ts_close[t])

    def half_tick_up(rec: np.ndarray) -> np.ndarray:
        r = rec.copy()
        late = r["ts_recv"] > tau
        for f in _price_fields(r):
            px = r[f][late]
            r[f][late] = np.where(px != UNDEF_PRICE, px + TICK_UNITS // 2, px)
        return r

    book = [market.book[0], rewrite_dbn(market.book[1], tmp_path / "mbp10.dbn.zst", half_tick_up)]
    with pytest.raises(FxDataError, match=r"off the 0\.25 tick grid"):
        run_chain(market.trades[:2], book, tmp_path / "work")


# --- 2. partition equivalence ----------------------------------------------------------------


def reference_book(sidecar: Path, cal: RollCalendar) -> ofi_core.BookArrays:
    """The active contract's MBP-10 snapshots of a quarter, built directly from the sidecar."""
    c = sidecar_columns(sidecar)
    active, known = cal.active_instrument(session_day(c["ts_recv"]))
    keep = known & (c["instrument_id"] == active)

    def mat(prefix: str) -> np.ndarray:
        cols = [c[f"{prefix}_{i:02d}"][keep] for i in range(N_LEVELS)]
        if prefix.endswith("_px"):
            return np.stack([px_to_float(x) for x in cols], axis=1)
        return np.stack(cols, axis=1).astype(np.float64)

    return ofi_core.BookArrays(
        c["ts_recv"][keep],
        mat("bid_px"),
        mat("ask_px"),
        mat("bid_sz"),
        mat("ask_sz"),
        mat("bid_ct"),
        mat("ask_ct"),
    )


def _cat(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(list(parts))


@pytest.mark.parametrize(
    "cfg",
    [
        DEFAULT,
        Cfg(BarConfig(kind="volume_imbalance"), BarFeatureConfig(memory_tol=1e-10), SMALL_OFI),
    ],
    ids=["default", "imbalance-small-ofi"],
)
def test_partitions_equal_one_sequential_pass(market: Market, tmp_path: Path, cfg: Cfg) -> None:
    outs = market.outs if cfg == DEFAULT else run_chain(market.trades, market.book, tmp_path, cfg)
    worst = assert_partitions_equal_sequential(outs, cfg)
    assert set(worst) == set(outs[0].features.columns) | set(outs[0].ofi.columns)
    # The interior quarters were warmed up: no bar feature is NaN there.
    for o in outs[1:]:
        for name, col in o.features.columns.items():
            assert not np.isnan(col).any(), f"{o.label} bar feature {name} has NaN after warm-up"


def test_partitions_equal_sequential_with_no_book_at_the_warmup_start(market: Market, tmp_path: Path) -> None:
    """The OFI replay of the previous quarter must also rebuild the last valid book snapshot:
    remove the previous quarter's book around the first replayed bar, so that a replay of
    exactly ``ofi_warmup_bars`` bars starts without one."""
    cfg = Cfg(DEFAULT.bars, DEFAULT.feats, SMALL_OFI)
    q1 = market.outs[0].bars
    k = len(q1) - ofi_core.ofi_warmup_bars(q1.volume, SMALL_OFI)
    lo, hi = int(q1.ts_close[k - 4]), int(q1.ts_close[k + 3])
    thin = rewrite_dbn(
        market.book[0],
        tmp_path / "thin_mbp10.dbn.zst",
        lambda r: r[(r["ts_recv"] <= lo) | (r["ts_recv"] > hi)],
    )
    outs = run_chain(market.trades[:2], [thin, market.book[1]], tmp_path / "work", cfg)
    assert_partitions_equal_sequential(outs, cfg)
    # and chunked equals unchunked on that market
    p, o = outs
    kw: dict[str, Any] = {"prev_bars": p.bars, "prev_trades": p.trades, "prev_book": p.book}
    for chunk in (300, 10**15):
        part = bar_rows.quarter_ofi(o.bars, o.trades, o.book, SMALL_OFI, book_chunk=chunk, **kw)
        for name, col in o.ofi.columns.items():
            assert max_diff(part.columns[name], col, f"chunk {chunk} OFI {name}") <= TOL, name


def assert_partitions_equal_sequential(outs: list[QuarterOut], cfg: Cfg) -> dict[str, float]:
    """Roll calendar, bars, bar features and OFI of the quarters equal one sequential pass
    over all of them (calendar and bars exactly; features to TOL). Returns max |diff| per feature."""
    # Roll calendar: one pass over all quarters' trades equals the seeded per-quarter calendars.
    cols = [sidecar_columns(o.trades_sidecar, ["ts_recv", "instrument_id", "size"]) for o in outs]
    symbols = [m for o in outs for m in read_symbol_map(o.trades_sidecar)]
    seq_cal = compute_roll_calendar(
        _cat([session_day(c["ts_recv"]) for c in cols]),
        _cat([c["instrument_id"] for c in cols]),
        _cat([c["size"] for c in cols]),
        symbols,
    )
    assert calendar_rows(seq_cal) == [r for o in outs for r in calendar_rows(o.calendar)]

    tr = [o.trades for o in outs]
    seq_bars = build_bars(
        _cat([t.ts for t in tr]),
        _cat([t.price for t in tr]),
        _cat([t.size for t in tr]),
        _cat([t.sign for t in tr]),
        _cat([t.session for t in tr]),
        _cat([t.instrument_id for t in tr]),
        cfg.bars,
    )
    per_q = BarTable.concat([o.bars for o in outs])
    for name, col in seq_bars.columns().items():
        assert same(col, per_q.columns()[name]), f"bars column {name}"

    seq_feats = compute_bar_features(seq_bars, cfg.feats)
    ticks = {o.ofi.tick_size for o in outs}
    assert ticks == {0.25}, ticks
    books = [reference_book(o.book.path, o.book.calendar) for o in outs]
    seq_ofi = ofi_core.compute_ofi_features(
        ofi_core.BookArrays(
            *(_cat([getattr(b, f) for b in books]) for f in ofi_core.BookArrays.__dataclass_fields__)
        ),
        ofi_core.TradeArrays(
            _cat([t.ts for t in tr]),
            _cat([t.price for t in tr]),
            _cat([t.size for t in tr]),
            _cat([t.sign for t in tr]),
        ),
        seq_bars.ts_close,
        seq_bars.instrument_id,
        cfg.ofi,
        tick_size=0.25,
    )
    worst: dict[str, float] = {}
    start = 0
    for o in outs:
        sl = slice(start, start + len(o.bars))
        start += len(o.bars)
        for name, col in o.features.columns.items():
            d = max_diff(col, seq_feats.columns[name][sl], f"{o.label} bar feature {name}")
            worst[name] = max(worst.get(name, 0.0), d)
        assert same(o.ofi.bars_since_reset, seq_ofi.bars_since_reset[sl]), f"{o.label} bars_since_reset"
        for name, col in o.ofi.columns.items():
            d = max_diff(col, seq_ofi.columns[name][sl], f"{o.label} OFI feature {name}")
            worst[name] = max(worst.get(name, 0.0), d)
    bad = {k: v for k, v in worst.items() if v > TOL}
    assert not bad, f"partition vs sequential max |diff| above {TOL}: {bad}"
    return worst


# --- 3. chunked OFI ---------------------------------------------------------------------------


@pytest.mark.parametrize("ofi_cfg", [DEFAULT.ofi, SMALL_OFI], ids=["default-ofi", "small-ofi"])
@pytest.mark.parametrize("qi", [0, 1, 2])
def test_chunked_ofi_equals_unchunked(
    market: Market, monkeypatch: pytest.MonkeyPatch, qi: int, ofi_cfg: ofi_core.OfiConfig
) -> None:
    o = market.outs[qi]
    kw: dict[str, Any] = {}
    if qi:
        p = market.outs[qi - 1]
        kw = {"prev_bars": p.bars, "prev_trades": p.trades, "prev_book": p.book}
    whole = bar_rows.quarter_ofi(o.bars, o.trades, o.book, ofi_cfg, book_chunk=10**15, **kw)
    calls: list[int] = []
    real = ofi_core.compute_ofi_features

    def counting(*args: Any, **kwargs: Any) -> ofi_core.OfiFeatures:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ofi_core, "compute_ofi_features", counting)
    n_book = sidecar_columns(o.book.path, ["ts_recv"])["ts_recv"].size
    for chunk in (500, 3000):
        calls.clear()
        part = bar_rows.quarter_ofi(o.bars, o.trades, o.book, ofi_cfg, book_chunk=chunk, **kw)
        assert len(calls) >= max(2, n_book // chunk // 2), (len(calls), n_book, chunk)
        assert same(part.ts_close, whole.ts_close)
        assert same(part.bars_since_reset, whole.bars_since_reset)
        for name, col in whole.columns.items():
            d = max_diff(part.columns[name], col, f"{o.label} chunk {chunk} OFI {name}")
            assert d <= TOL, f"{o.label} chunk {chunk}: OFI {name} max |diff| {d}"


def test_populated_output_columns_are_separate_writable_rows() -> None:
    """quarter_ofi's output columns (their pages touched in advance): k C-contiguous float64 columns of
    n rows, each written without touching another (what the chunks' copies rely on)."""
    for k, n in ((33, 10_007), (3, 1), (0, 5), (4, 0)):
        cols = bar_rows._populated_columns(k, n)
        assert len(cols) == k
        for i, c in enumerate(cols):
            assert c.shape == (n,) and c.dtype == np.float64 and c.flags.c_contiguous and c.flags.writeable
            c[:] = np.arange(n, dtype=np.float64) + 1e6 * i
        for i, c in enumerate(cols):
            assert np.array_equal(c, np.arange(n, dtype=np.float64) + 1e6 * i)


# --- 4. conservation, sessions and rolls -------------------------------------------------------


@pytest.mark.parametrize("qi", [0, 1, 2])
def test_bar_volume_is_the_active_contracts_traded_volume(market: Market, qi: int) -> None:
    o = market.outs[qi]
    c = sidecar_columns(o.trades_sidecar, ["ts_recv", "instrument_id", "price", "size"])
    sess = session_day(c["ts_recv"])
    active, known = o.calendar.active_instrument(sess)
    ok = (sess >= 0) & (c["price"] != UNDEF_PRICE) & (c["price"] > 0) & (c["size"] > 0)
    mine = ok & known & (c["instrument_id"] == active)
    # Every session with an outright trade has an active contract.
    out_sess = np.unique(sess[ok & ~np.isin(c["instrument_id"], _spread_ids(o.trades_sidecar))])
    assert np.array_equal(out_sess, o.calendar.session_day)

    b = o.bars
    assert float(b.volume.sum()) == float(c["size"][mine].sum(dtype=np.int64))
    assert int(b.n_trades.sum()) == int(mine.sum())
    s_ids, s_idx = np.unique(sess[mine], return_inverse=True)
    want = np.bincount(s_idx, weights=c["size"][mine].astype(np.float64))
    b_ids, b_idx = np.unique(b.session_id, return_inverse=True)
    got = np.bincount(b_idx, weights=b.volume)
    assert np.array_equal(s_ids, b_ids), "sessions with active trades != sessions with bars"
    assert np.array_equal(want, got), "bar volume per session != traded volume per session"
    # No bar spans a session break or a roll.
    assert np.array_equal(session_day(b.ts_open), b.session_id)
    assert np.array_equal(session_day(b.ts_close), b.session_id)
    act_b, known_b = o.calendar.active_instrument(b.session_id)
    assert known_b.all() and np.array_equal(act_b, b.instrument_id)
    # Sessions are contiguous runs of bars; a bar is forced closed only as the last one of its
    # session (where it meets the break), every other bar holds >= V contracts.
    last_of_session = np.r_[b.session_id[1:] != b.session_id[:-1], True]
    assert int(last_of_session.sum()) == len(s_ids)
    assert not (b.forced_close & ~last_of_session).any()
    assert np.all(b.volume[~b.forced_close] >= DEFAULT.bars.volume_bar_size)
    assert int(b.forced_close.sum()) >= len(s_ids) // 2
    assert np.all(b.ts_open <= b.ts_close) and np.all(np.diff(b.ts_close) >= 0)


def _spread_ids(trades_sidecar: Path) -> list[int]:
    return sorted({m.instrument_id for m in read_symbol_map(trades_sidecar) if is_spread(m.raw_symbol)})


# --- 5. mirror ----------------------------------------------------------------------------------


def test_mirrored_market_flips_signed_ofi_features(market: Market, tmp_path: Path) -> None:
    n = 2
    trades = [rewrite_dbn(market.trades[i], tmp_path / f"t{i}.dbn.zst", mirror_records) for i in range(n)]
    book = [rewrite_dbn(market.book[i], tmp_path / f"b{i}.dbn.zst", mirror_records) for i in range(n)]
    mirrored = run_chain(trades, book, tmp_path / "work")
    two_c = 2 * MIRROR_C_UNITS / 1e9
    reg = ofi_core.ofi_feature_registry(DEFAULT.ofi)
    for o, m in zip(market.outs[:n], mirrored, strict=True):
        assert calendar_rows(o.calendar) == calendar_rows(m.calendar)
        a, b = o.bars, m.bars
        for name in (
            "ts_open",
            "ts_close",
            "volume",
            "n_trades",
            "instrument_id",
            "session_id",
            "forced_close",
        ):
            assert same(a.columns()[name], b.columns()[name]), f"{o.label} mirrored bars {name}"
        assert np.array_equal(b.open, two_c - a.open) and np.array_equal(b.close, two_c - a.close)
        assert np.array_equal(b.high, two_c - a.low) and np.array_equal(b.low, two_c - a.high)
        assert np.array_equal(b.buy_volume, a.volume - a.buy_volume)
        np.testing.assert_allclose(b.vwap, two_c - a.vwap, rtol=0, atol=1e-8)
        assert m.ofi.tick_size == o.ofi.tick_size
        for name, spec in reg.items():
            x = o.ofi.columns[name]
            y = m.ofi.columns[spec.mirror_partner or name]
            expect = -x if spec.signed else x
            if spec.log_price:
                # ln(2c - mid) is not -ln(mid): only the sign pattern and the NaN positions hold.
                assert np.array_equal(np.isnan(expect), np.isnan(y)), name
                continue
            d = max_diff(y, expect, f"{o.label} mirrored OFI {name}")
            assert d <= TOL, f"{o.label} mirrored OFI {name}: max |diff| {d}"
        signed = [k for k, s in reg.items() if s.signed]
        assert any(np.nanmax(np.abs(o.ofi.columns[k])) > 0 for k in signed)


# --- 6. fxcache assembly --------------------------------------------------------------------------


def scan_mid(book: book_mod.BookSource, ts: int, instrument: int) -> float:
    """Direct backward search: the last valid snapshot of ``instrument`` with ts_recv <= ts, in
    a session where that instrument is the active contract."""
    c = sidecar_columns(book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    r = int(np.searchsorted(c["ts_recv"], ts, side="right")) - 1
    while r >= 0:
        if int(c["instrument_id"][r]) == instrument:
            act, known = book.calendar.active_instrument(session_day(c["ts_recv"][r : r + 1]))
            bid, ask = int(c["bid_px_00"][r]), int(c["ask_px_00"][r])
            if known[0] and int(act[0]) == instrument and UNDEF_PRICE not in (bid, ask) and 0 < bid <= ask:
                return (bid / 1e9 + ask / 1e9) / 2.0
        r -= 1
    return float("nan")


@pytest.mark.parametrize("qi", [0, 1])
def test_fxcache_columns(market: Market, qi: int) -> None:
    o = market.outs[qi]
    b = o.bars
    ts, groups, dropped = bar_rows.assemble_fxcache_columns(b, o.features, o.ofi, o.book)
    assert list(groups) == ["feature", "price", "ofi"]
    assert groups["feature"][0] == list(o.features.columns)
    assert groups["price"][0] == list(bar_rows.PRICE_COLUMNS)
    assert groups["price"][0] == ["open", "high", "low", "close", "vwap", "mid_open", "contract"]
    assert groups["ofi"][0] == list(o.ofi.columns)
    for g, (names, values) in groups.items():
        assert values.shape == (len(ts), len(names)), g
        assert np.isfinite(values).all(), f"fxcache group {g} has a non-finite value"
    assert len(ts) > 0 and np.all(np.diff(ts) >= 0)

    # The kept rows are exactly those with every feature defined and a book mid at the open.
    ok_f = np.column_stack([np.isfinite(v) for v in o.features.columns.values()]).all(axis=1)
    ok_o = np.column_stack([np.isfinite(v) for v in o.ofi.columns.values()]).all(axis=1)
    c = sidecar_columns(o.book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    act, known = o.calendar.active_instrument(session_day(c["ts_recv"]))
    valid = (
        known
        & (c["instrument_id"] == act)
        & (c["bid_px_00"] != UNDEF_PRICE)
        & (c["ask_px_00"] != UNDEF_PRICE)
        & (c["bid_px_00"] > 0)
        & (c["bid_px_00"] <= c["ask_px_00"])
    )
    first_snap = {
        int(i): int(c["ts_recv"][valid & (c["instrument_id"] == i)].min()) for i in np.unique(b.instrument_id)
    }
    ok_p = b.ts_open >= np.array([first_snap[int(i)] for i in b.instrument_id])
    keep = ok_f & ok_o & ok_p
    assert qi > 0 or (~keep).any(), "the first quarter's warm-up should drop rows"
    assert np.array_equal(ts, b.ts_close[keep])
    assert dropped == {
        "bar_features_undefined": int((~ok_f).sum()),
        "ofi_undefined": int((~ok_o).sum()),
        "no_book_at_open": int((~ok_p).sum()),
        "total": int((~keep).sum()),
    }
    prices = dict(zip(groups["price"][0], groups["price"][1].T, strict=True))
    for name in ("open", "high", "low", "close", "vwap"):
        assert np.array_equal(prices[name], getattr(b, name)[keep]), name
    codes = {
        int(i): e.year * 100 + e.month
        for i, e in zip(o.calendar.instrument_id, o.calendar.expiry, strict=True)
        if e
    }
    assert np.array_equal(
        prices["contract"], np.array([codes[int(i)] for i in b.instrument_id[keep]], dtype=float)
    )
    for g, table in (("feature", o.features.columns), ("ofi", o.ofi.columns)):
        for k, name in enumerate(groups[g][0]):
            assert np.array_equal(groups[g][1][:, k], table[name][keep]), f"{g} {name}"

    # mid_open: the book mid of the bar's own contract as of its open, by direct search, on
    # random kept bars and on every roll bar and its successor (kept or not).
    rng = np.random.default_rng(7 + qi)
    kept_idx = np.flatnonzero(keep)
    sample = rng.choice(np.arange(kept_idx.size), size=12, replace=False)
    for j_k, j in zip(sample, kept_idx[sample], strict=True):
        assert prices["mid_open"][j_k] == scan_mid(o.book, int(b.ts_open[j]), int(b.instrument_id[j])), j
    # Roll bars are dropped above (the OFI state resets there); with every feature filled in,
    # only the mid decides, and a roll bar must get its own contract's mid (or none).
    rolls = np.flatnonzero(np.diff(b.instrument_id.astype(np.int64)) != 0) + 1
    assert rolls.size == 1
    filled_f = FeatureTable(
        o.features.ts_close,
        {k: np.nan_to_num(v) for k, v in o.features.columns.items()},
        0,
        o.features.config,
    )
    filled_o = ofi_core.OfiFeatures(
        o.ofi.ts_close,
        o.ofi.bars_since_reset,
        {k: np.nan_to_num(v) for k, v in o.ofi.columns.items()},
        o.ofi.config,
        o.ofi.tick_size,
    )
    ts2, groups2, dropped2 = bar_rows.assemble_fxcache_columns(b, filled_f, filled_o, o.book)
    assert np.array_equal(ts2, b.ts_close[ok_p]) and dropped2["total"] == int((~ok_p).sum())
    mid2 = np.full(len(b), np.nan)
    mid2[ok_p] = groups2["price"][1][:, list(bar_rows.PRICE_COLUMNS).index("mid_open")]
    probe = np.r_[rolls, rolls + 1, 0]
    direct = mid_asof.book_mid_asof(o.book, b.ts_open[probe], instrument_id=b.instrument_id[probe])
    for j, got, got_direct in zip(probe, mid2[probe], direct, strict=True):
        want = scan_mid(o.book, int(b.ts_open[j]), int(b.instrument_id[j]))
        assert same(np.array([got, got_direct]), np.array([want, want])), f"bar {j}: mid_open {got} != {want}"


# --- 7. stage kernels against their numpy definitions -------------------------------------------


@pytest.mark.parametrize("qi", [0, 1])
def test_active_trades_equal_the_numpy_definition(market: Market, qi: int) -> None:
    o = market.outs[qi]
    c = sidecar_columns(o.trades_sidecar, ["ts_recv", "instrument_id", "price", "size", "side"])
    sess = session_day(c["ts_recv"])
    active, known = o.calendar.active_instrument(sess)
    keep = known & (c["instrument_id"] == active) & (c["price"] != UNDEF_PRICE) & (c["price"] > 0)
    keep &= c["size"] > 0
    t = act.active_trades(o.trades_sidecar, o.calendar)
    want = {
        "ts": c["ts_recv"][keep],
        "price": px_to_float(c["price"][keep]),
        "size": c["size"][keep].astype(np.float64),
        "sign": np.select([c["side"][keep] == ord("B"), c["side"][keep] == ord("A")], [1, -1], 0).astype(
            np.int8
        ),
        "session": sess[keep],
        "instrument_id": c["instrument_id"][keep].astype(np.uint32),
    }
    assert 0 < len(t) < c["ts_recv"].size and t.n_source == c["ts_recv"].size
    for name, col in want.items():
        got = getattr(t, name)
        assert got.dtype == col.dtype and same(got, col), f"active_trades.{name}"


@pytest.mark.parametrize("qi", [1, 2])
def test_roll_calendar_from_sidecars_equals_compute_roll_calendar(market: Market, qi: int) -> None:
    """The per-(session, contract) volume pass gives the calendar of the trades themselves: this
    quarter's trades plus the previous quarter's last session, as one array."""
    cur, prev = market.outs[qi], market.outs[qi - 1]
    names = ["ts_recv", "instrument_id", "size"]
    c, p = sidecar_columns(cur.trades_sidecar, names), sidecar_columns(prev.trades_sidecar, names)
    s_c, s_p = session_day(c["ts_recv"]), session_day(p["ts_recv"])
    first = int(s_c[s_c >= 0].min())
    take = s_p == int(s_p[(s_p >= 0) & (s_p < first)].max())
    ref = compute_roll_calendar(
        np.concatenate([s_p[take], s_c]),
        np.concatenate([p["instrument_id"][take], c["instrument_id"]]),
        np.concatenate([p["size"][take], c["size"]]),
        list(read_symbol_map(cur.trades_sidecar)) + list(read_symbol_map(prev.trades_sidecar)),
    )
    got = act.quarter_roll_calendar(cur.trades_sidecar, prev.trades_sidecar)
    assert calendar_rows(got) == [r for r in calendar_rows(ref) if r[0] >= first]
    assert got.events == tuple(e for e in ref.events if e.session_day >= first)


@pytest.mark.parametrize("buffers", [None, "numpy", "small_pages"])
@pytest.mark.parametrize("levels", [10, 5])
def test_book_rows_equal_the_reference_matrices(market: Market, levels: int, buffers: str | None) -> None:
    """``_book_rows`` over record ranges of two quarters (each cut in pieces) gives the numpy
    reference's rows, in order, the first ``levels`` levels, prices as ``px_to_float``; into
    reused buffers too (either allocator, reserved or grown, the parts' record indices sharing
    one index buffer), the second call into the same buffers giving the same rows."""
    parts, refs = [], []
    for o in market.outs[:2]:
        c = sidecar_columns(o.book.path)
        n = c["ts_recv"].size
        cuts = [0, n // 3, n // 3, 2 * n // 3 + 7, n]  # an empty range too
        parts += [(o.book, c, lo, hi) for lo, hi in itertools.pairwise(cuts)]
        refs.append(reference_book(o.book.path, o.calendar))
    buf = None if buffers is None else book_mod._BookBuffers(small_pages=buffers == "small_pages")
    if buffers == "small_pages":
        records = sum(hi - lo for _, _, lo, hi in parts)
        buf.reserve(records, levels, records)  # type: ignore[union-attr]
    if buf is not None:  # a first call into the buffers (a smaller one: they grow or are reused)
        book_mod._book_rows(parts[:2], levels, TICK_UNITS, buf)
    got = book_mod._book_rows(parts, levels, TICK_UNITS, buf)
    assert same(got.ts, _cat([r.ts for r in refs]))
    assert isinstance(got, ofi_core.UnsignedSizeBook)  # the sidecar's sizes and counts: unsigned
    for name in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        m = getattr(got, name)
        assert m.shape == (got.ts.size, levels) and m.flags.c_contiguous and m.dtype == np.float64
        assert same(m, _cat([getattr(r, name)[:, :levels] for r in refs])), name
    empty = book_mod._book_rows([], levels)
    assert empty.ts.shape == (0,) and empty.bid_px.shape == (0, levels)


def test_off_grid_error_names_the_first_bad_price_column_by_column(market: Market, tmp_path: Path) -> None:
    """Several off-grid prices: the error names the first in column order (bid levels, then ask
    levels), then record order, with its record number and ts_recv, as a column-by-column check
    over the kept rows would."""
    o = market.outs[0]
    c = sidecar_columns(o.book.path)
    sess = session_day(c["ts_recv"])
    active, known = o.calendar.active_instrument(sess)
    kept = np.flatnonzero(known & (c["instrument_id"] == active))
    ok = kept[(c["bid_px_07"][kept] != UNDEF_PRICE) & (c["ask_px_03"][kept] != UNDEF_PRICE)]
    r_ask, r_bid_late, r_bid = int(ok[10]), int(ok[-20]), int(ok[len(ok) // 2])
    foreign = int(np.flatnonzero(~(known & (c["instrument_id"] == active)))[0])

    def edit(rec: np.ndarray) -> np.ndarray:
        r = rec.copy()
        r["ask_px_03"][r_ask] += TICK_UNITS // 5  # earlier record, later column
        r["bid_px_07"][[r_bid, r_bid_late]] += TICK_UNITS // 2
        r["bid_px_00"][foreign] += 1  # not the active contract's: never checked
        return r

    raw = rewrite_dbn(market.book[0], tmp_path / "mbp10.dbn.zst", edit)
    path = ensure_sidecar(raw, tmp_path / "sc").path
    cols = sidecar_columns(path)
    n = cols["ts_recv"].size
    bad_px = int(cols["bid_px_07"][r_bid])
    want = (
        f"{path}: bid_px_07 = {bad_px * 1e-9!r} at record {r_bid} (ts_recv {int(cols['ts_recv'][r_bid])}) "
        "is off the 0.25 tick grid (OfiConfig.tick_size)"
    )
    with pytest.raises(FxDataError) as err:
        book_mod._book_rows([(book_mod.BookSource(path, o.calendar), cols, 0, n)], N_LEVELS, TICK_UNITS)
    assert str(err.value) == want
    # Without that record in range, the ask column's record is the first.
    with pytest.raises(FxDataError, match=rf"ask_px_03 = .* at record {r_ask} "):
        book_mod._book_rows([(book_mod.BookSource(path, o.calendar), cols, 0, r_bid)], N_LEVELS, TICK_UNITS)
    # tick_units 0: no check
    assert (
        book_mod._book_rows([(book_mod.BookSource(path, o.calendar), cols, 0, n)], N_LEVELS).ts.size
        == kept.size
    )


@pytest.mark.parametrize("ofi_cfg", [DEFAULT.ofi, SMALL_OFI], ids=["default-ofi", "small-ofi"])
@pytest.mark.parametrize("qi", [1, 2])
def test_previous_quarter_tail_is_enough_for_the_ofi_warmup(
    market: Market, monkeypatch: pytest.MonkeyPatch, qi: int, ofi_cfg: ofi_core.OfiConfig
) -> None:
    """``quarter_ofi`` with the previous quarter's trades loaded only after
    ``ofi_warmup_start`` equals the run with all of them; the first replayed bar is the one the
    whole-book scan gives; trades loaded from too late are refused."""
    o, p = market.outs[qi], market.outs[qi - 1]
    cols = sidecar_columns(p.book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    has = ofi_warm._has_valid_snapshot([(p.book, cols)], p.bars.ts_close)
    j0 = len(p.bars) - ofi_core.ofi_warmup_bars(p.bars.volume, ofi_cfg)
    k = ofi_warm._replay_start(j0, has, p.bars.instrument_id)
    start = ofi_warm.ofi_warmup_start(p.bars, p.book, ofi_cfg)
    assert k > 0 and start == int(p.bars.ts_close[k - 1])
    for w in (1, 2):  # the scanned window grows until the walk back stops inside it
        monkeypatch.setattr(ofi_warm, "_WARMUP_SCAN_BARS", w)
        assert ofi_warm.ofi_warmup_start(p.bars, p.book, ofi_cfg) == start
    monkeypatch.undo()
    tail = act.active_trades(p.trades_sidecar, p.calendar, after_ts=start)
    assert 0 < len(tail) < len(p.trades) and tail.after_ts == start
    cut = int(np.searchsorted(p.trades.ts, start, side="right"))
    assert same(tail.ts, p.trades.ts[cut:]) and same(tail.price, p.trades.price[cut:])
    whole = bar_rows.quarter_ofi(
        o.bars, o.trades, o.book, ofi_cfg, prev_bars=p.bars, prev_trades=p.trades, prev_book=p.book
    )
    for chunk in (book_mod.DEFAULT_BOOK_CHUNK, 3000):
        part = bar_rows.quarter_ofi(
            o.bars,
            o.trades,
            o.book,
            ofi_cfg,
            prev_bars=p.bars,
            prev_trades=tail,
            prev_book=p.book,
            book_chunk=chunk,
        )
        assert same(part.ts_close, whole.ts_close) and same(part.bars_since_reset, whole.bars_since_reset)
        for name, col in whole.columns.items():
            assert max_diff(part.columns[name], col, f"{o.label} OFI {name}") <= TOL
    late = act.active_trades(p.trades_sidecar, p.calendar, after_ts=start + 1)
    with pytest.raises(FxDataError, match="warm-up needs them after"):
        bar_rows.quarter_ofi(
            o.bars, o.trades, o.book, ofi_cfg, prev_bars=p.bars, prev_trades=late, prev_book=p.book
        )


def _snapshot_flags(
    sources: list[tuple[Any, dict[str, np.ndarray]]], tc: np.ndarray, after: int | None
) -> np.ndarray:
    """Plain reference of ``_has_valid_snapshot``: every valid snapshot of the active contract
    after ``after`` flags the first bar whose close is at or after it."""
    has = np.zeros(tc.size, np.bool_)
    for src, c in sources:
        ts, b, a = c["ts_recv"], c["bid_px_00"], c["ask_px_00"]
        active, known = src.calendar.active_instrument(session_day(ts))
        ok = (
            known
            & (c["instrument_id"] == active)
            & (b != UNDEF_PRICE)
            & (a != UNDEF_PRICE)
            & (b > 0)
            & (b <= a)
        )
        if after is not None:
            ok &= ts > after
        j = np.searchsorted(tc, ts[ok], side="left")
        has[j[j < tc.size]] = True
    return has


@pytest.mark.parametrize("qi", [1, 2])
def test_replay_start_scanned_equals_the_whole_list_walk(
    market: Market, monkeypatch: pytest.MonkeyPatch, qi: int
) -> None:
    """``quarter_ofi``'s chunk replay starts: the walk back over flags of a scanned window of
    bars (grown as needed) gives the start the flags of the whole bar list give, for bar lists
    of two quarters (the previous quarter's tail first), with and without a close before bar
    0; the flags of a window, scanned only up to its last close, are the plain reference's."""
    o, p = market.outs[qi], market.outs[qi - 1]
    names = ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"]
    sources = [(p.book, sidecar_columns(p.book.path, names)), (o.book, sidecar_columns(o.book.path, names))]
    k0 = len(p.bars) // 2
    tc = np.concatenate([p.bars.ts_close[k0:], o.bars.ts_close])
    inst = np.concatenate([p.bars.instrument_id[k0:], o.bars.instrument_id])
    rng = np.random.default_rng(11 + qi)
    for before_first in (int(p.bars.ts_close[k0 - 1]), None):
        full = _snapshot_flags(sources, tc, before_first)
        assert same(ofi_warm._has_valid_snapshot(sources, tc, before_first), full)
        lo, hi = 40, 400  # a window in the middle: flags scanned up to its own last close
        assert same(ofi_warm._has_valid_snapshot(sources, tc[lo:hi], int(tc[lo - 1])), full[lo:hi])
        # ... also when a snapshot lies exactly at that close (moved onto one here)
        hi = lo + 1 + int(np.flatnonzero(full[lo + 1 :])[0]) + 1
        c = sources[0][1] if tc[hi - 1] <= p.bars.ts_close[-1] else sources[1][1]
        at = c["ts_recv"][(c["ts_recv"] > tc[hi - 2]) & (c["ts_recv"] <= tc[hi - 1])]
        for t in at:
            win = tc[lo:hi].copy()
            win[-1] = t
            got = ofi_warm._has_valid_snapshot(sources, win, int(tc[lo - 1]))
            assert same(got, _snapshot_flags(sources, win, int(tc[lo - 1])))
        assert any(_snapshot_flags(sources, np.r_[tc[lo : hi - 1], t], int(tc[lo - 1]))[-1] for t in at)
        assert not full.all()  # there are bars without a snapshot to walk back over
        # starts where the walk back is long: bars without a snapshot before them
        gaps = np.flatnonzero(~full[1:]) + 1
        js = np.r_[0, 1, len(tc) - 1, rng.choice(gaps, size=min(30, gaps.size), replace=False)]
        for w in (1, 3, 256):
            monkeypatch.setattr(ofi_warm, "_WARMUP_SCAN_BARS", w)
            for j in js:
                want = ofi_warm._replay_start(int(j), full, inst)
                assert ofi_warm._replay_start_scanned(sources, tc, inst, int(j), before_first) == want, (j, w)


# --- threaded paths -------------------------------------------------------------------------


def test_threaded_passes_equal_the_single_thread_results(
    market: Market, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll-volume, active-trade and trend-scanning kernels split large inputs over threads;
    forcing the split on this small market must give exactly the single-thread outputs."""
    import numba

    from fx_assets.core import bar_features as bf_core
    from fx_assets.core import roll as roll_core

    if numba.config.NUMBA_NUM_THREADS < 2:  # never a silent skip: this test must run or fail
        pytest.fail(
            f"the threaded kernels need >= 2 numba threads, this process has "
            f"NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS} (conftest.py sets 2 on one-CPU "
            "machines unless NUMBA_NUM_THREADS is set explicitly)"
        )
    monkeypatch.setattr(roll_core, "_MIN_TRADES_PER_THREAD", 1)
    monkeypatch.setattr(act, "_MIN_TRADES_PER_THREAD", 1)
    monkeypatch.setattr(bf_core, "_MIN_BARS_PER_THREAD", 1)
    before = numba.get_num_threads()
    numba.set_num_threads(2)  # the split the kernels see, whatever an earlier test left
    try:
        threaded = run_chain(market.trades, market.book, tmp_path / "work")
    finally:
        numba.set_num_threads(before)
    for ref, out in zip(market.outs, threaded, strict=True):
        assert np.array_equal(ref.calendar.instrument_id, out.calendar.instrument_id)
        for name in ("ts", "price", "size", "sign", "session", "instrument_id"):
            assert np.array_equal(getattr(ref.trades, name), getattr(out.trades, name)), name
        for name, col in ref.features.columns.items():
            assert np.array_equal(col, out.features.columns[name], equal_nan=True), name


def test_page_releaser_only_touches_file_mappings_and_keeps_data(market: Market) -> None:
    anon = np.arange(1_000_000, dtype=np.int64)
    assert page_release.PageReleaser([anon]).columns == []  # never MADV_DONTNEED on anonymous memory
    cols = sidecar_columns(market.outs[0].book.path, ["ts_recv", "bid_px_00"])
    before = {k: v.copy() for k, v in cols.items()}
    rel = page_release.PageReleaser(list(cols.values()))
    assert len(rel.columns) == 2
    rel.release_before(len(cols["ts_recv"]))
    for k, v in cols.items():  # released pages fault back in from the page cache
        assert np.array_equal(v, before[k])


# --- the causality spot-check (core of the ``causal_spot_check`` asset check) ----------------


def stored_quarter(outs: list[QuarterOut], qi: int, work: Path, cfg: Cfg = DEFAULT) -> StoredQuarter:
    """A chain's quarter as the asset check sees it: its stored files and configs."""
    o = outs[qi]
    return StoredQuarter(
        partition=f"{o.label}|{SYMBOL}",
        trades_sidecar=o.trades_sidecar,
        book_sidecar=o.book.path,
        calendar=o.calendar,
        bars=o.bars,
        bar_features=tables.read_table(work / f"bar_features_{o.label}.arrow"),
        ofi=tables.read_table(work / f"ofi_features_{o.label}.arrow"),
        bar_config=cfg.bars,
        bar_feature_config=cfg.feats,
        ofi_config=cfg.ofi,
        previous_bars=lambda n: [p.bars for p in outs[:qi]],
    )


def test_truncate_sidecar_keeps_exactly_the_records_in_the_span(market: Market, tmp_path: Path) -> None:
    src = market.outs[1].book.path
    ts = sidecar_columns(src, ["ts_recv"])["ts_recv"]
    lo, hi = int(ts[len(ts) // 3]), int(ts[len(ts) // 2])
    n = truncate_sidecar(src, tmp_path / "cut.arrow", after_ts=lo, until_ts=hi)
    cut = sidecar_columns(tmp_path / "cut.arrow")
    full = sidecar_columns(src)
    keep = (ts > lo) & (ts <= hi)
    assert n == int(keep.sum()) > 0
    for name, col in full.items():
        assert np.array_equal(cut[name], col[keep]), name
    assert truncate_sidecar(src, tmp_path / "none.arrow", after_ts=hi, until_ts=hi) == 0
    assert sidecar_columns(tmp_path / "none.arrow", ["ts_recv"])["ts_recv"].size == 0


@pytest.mark.parametrize("qi", [0, 1, 2])
def test_spot_check_passes_on_the_stored_chain(market: Market, qi: int) -> None:
    """Cut at several drawn bars of every quarter (the first one unwarmed): bars equal bit for
    bit, features within the tolerance, and only a span of the quarter's records was read."""
    q = stored_quarter(market.outs, qi, market.root / "work")
    n_trades = sidecar_columns(q.trades_sidecar, ["ts_recv"])["ts_recv"].size
    bars_seen = set()
    for seed in range(3):
        r = spot_check_causality(q, CausalityConfig(seed=seed))
        assert not r.skipped, r.skipped
        assert r.bars_compared >= 8 and r.ofi_rows == 8
        assert r.max_rel_diff_ofi <= 1e-9 and r.max_rel_diff_bar_features <= 1e-9
        assert 0 < r.trades_records < n_trades
        bars_seen.add(r.bar)
    assert len(bars_seen) == 3
    # the draw is a function of the partition and the seed: the same bar again
    assert spot_check_causality(q, CausalityConfig(seed=0)).bar == spot_check_causality(q).bar


def _shift_next(v: np.ndarray) -> np.ndarray:
    out = v.copy()
    out[:-1] = v[1:]
    return out


@pytest.mark.parametrize("stage", ["bar_features", "ofi"])
def test_spot_check_finds_a_look_ahead_kernel(
    market: Market, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """A kernel that reads the next bar: its stored outputs pass validation, but recomputed from
    data cut at T the value of the last bar before T differs, and the check names it."""
    if stage == "bar_features":
        real_bf = bar_rows.compute_bar_features

        def leaky_bf(*args: Any, **kwargs: Any) -> FeatureTable:
            out = real_bf(*args, **kwargs)
            out.columns["log_volume"] = _shift_next(out.columns["log_volume"])
            return out

        monkeypatch.setattr(bar_rows, "compute_bar_features", leaky_bf)
        column = "bar_features column 'log_volume'"
    else:
        real_ofi = ofi_core.compute_ofi_features

        def leaky_ofi(*args: Any, **kwargs: Any) -> ofi_core.OfiFeatures:
            out = real_ofi(*args, **kwargs)
            out.columns["event_rate"] = _shift_next(out.columns["event_rate"])
            return out

        monkeypatch.setattr(ofi_core, "compute_ofi_features", leaky_ofi)
        column = "ofi_features column 'event_rate'"
    work = tmp_path / "work"
    outs = run_chain(market.trades[:2], market.book[:2], work)
    with pytest.raises(FxDataError, match="raw data cut at ts_recv") as err:
        spot_check_causality(stored_quarter(outs, 1, work))
    assert column in str(err.value) and f"{LABELS[1]}|{SYMBOL}" in str(err.value)
