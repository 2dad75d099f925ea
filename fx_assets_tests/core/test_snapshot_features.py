"""Snapshot features: chunking changes no value, rows <= t never see rows > t, windows reset at
breaks, and each family equals a plain re-computation from its definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fx_assets.core.errors import FxDataError
from fx_assets.core.ofi import book_state_row
from fx_assets.core.snapshot_features import (
    SnapshotBook,
    SnapshotFeatureConfig,
    feature_names,
    snapshot_features,
)

TICK = 0.25
CFG = SnapshotFeatureConfig(
    flow_windows=[3, 20], mlofi_window=7, trade_windows=[4, 15], kyle_trades=6, vpin_bucket_volume=12.0,
    vpin_buckets=3, rate_window=9, drift_windows=[5, 30],
)  # fmt: skip


def make_book(n: int, seed: int = 0, breaks_at: tuple[int, ...] = (400,)) -> SnapshotBook:
    """A random MBP-10 stream: best bid walks on the tick grid, spread 1-3 ticks, levels one tick
    apart with some missing, random sizes; ~30% trade records with an aggressor side."""
    rng = np.random.default_rng(seed)
    bid = 5000.0 + TICK * np.cumsum(rng.choice([-1, 0, 0, 0, 1], n))
    spread = TICK * rng.choice([1, 1, 1, 2, 3], n)
    lv = np.arange(10)
    bid_px = bid[:, None] - TICK * lv[None, :]
    ask_px = (bid + spread)[:, None] + TICK * lv[None, :]
    miss = rng.random((n, 10)) < 0.05
    miss[:, :2] = False
    bid_px[miss] = np.nan
    ask_px[np.roll(miss, 1, axis=0)] = np.nan
    sz = lambda: rng.integers(1, 60, (n, 10)).astype(np.float64)  # noqa: E731
    action = np.where(rng.random(n) < 0.3, ord("T"), ord("A")).astype(np.uint8)
    side = np.where(action == ord("T"), rng.choice([-1, 1, 0], n, p=[0.45, 0.45, 0.1]), 0).astype(np.int8)
    size = np.where(action == ord("T"), rng.integers(1, 20, n), 0).astype(np.float64)
    ts = np.cumsum(rng.integers(1_000, 2_000_000, n)).astype(np.int64)
    breaks = np.searchsorted(np.asarray(breaks_at), np.arange(n), side="right").astype(np.int64)
    return SnapshotBook(ts, breaks, action, side, size, bid_px, ask_px, sz(), sz(), sz(), sz())


def _slice(b: SnapshotBook, lo: int, hi: int) -> SnapshotBook:
    return SnapshotBook(*(getattr(b, f)[lo:hi] for f in b.__dataclass_fields__))


def test_chunking_changes_no_value_and_truncation_changes_no_past_row() -> None:
    book = make_book(1500, breaks_at=(400, 1100))
    full, _ = snapshot_features(book, CFG)
    assert full.shape == (1500, len(feature_names(CFG))) and np.isfinite(full).all()
    parts, st = [], None
    for lo, hi in ((0, 1), (1, 333), (333, 401), (401, 1500)):
        out, st = snapshot_features(_slice(book, lo, hi), CFG, st)
        parts.append(out)
    np.testing.assert_array_equal(np.vstack(parts), full)
    # the raw data after row t changed: no value of rows <= t moves
    t = 900
    other = make_book(1500, seed=5, breaks_at=(400, 1100))
    mixed = SnapshotBook(
        *(
            np.concatenate([getattr(book, f)[: t + 1], getattr(other, f)[t + 1 :]])
            for f in book.__dataclass_fields__
        )
    )
    mixed.ts[t + 1 :] = mixed.ts[t] + np.cumsum(np.full(1500 - t - 1, 1000))
    cut, _ = snapshot_features(mixed, CFG)
    np.testing.assert_array_equal(cut[: t + 1], full[: t + 1])
    assert not np.array_equal(cut[t + 1 :], full[t + 1 :])


def _cks(b, qb, a, qa, b0, qb0, a0, qa0):  # type: ignore[no-untyped-def]
    return (qb if b >= b0 else 0) - (qb0 if b <= b0 else 0) - (qa if a <= a0 else 0) + (qa0 if a >= a0 else 0)


def test_each_family_equals_its_definition() -> None:
    book = make_book(900, seed=2, breaks_at=(500,))
    out, _ = snapshot_features(book, CFG)
    col = {c: out[:, j] for j, c in enumerate(feature_names(CFG))}
    brk = book.breaks
    start = np.array([int(np.flatnonzero(brk == brk[i])[0]) for i in range(len(book))])
    bpx = np.where(np.isnan(book.bid_px), -1e18, book.bid_px)
    apx = np.where(np.isnan(book.ask_px), 1e18, book.ask_px)
    bsz = np.where(np.isnan(book.bid_px), 0.0, book.bid_sz)
    asz = np.where(np.isnan(book.ask_px), 0.0, book.ask_sz)
    e = np.zeros((len(book), 10))
    for i in range(1, len(book)):
        if start[i] == i:
            continue
        for m in range(10):
            e[i, m] = _cks(
                bpx[i, m],
                bsz[i, m],
                apx[i, m],
                asz[i, m],
                bpx[i - 1, m],
                bsz[i - 1, m],
                apx[i - 1, m],
                asz[i - 1, m],
            )
    dep = 0.5 * (bsz[:, 0] + asz[:, 0])
    mid = 0.5 * (book.bid_px[:, 0] + book.ask_px[:, 0])
    trades = np.flatnonzero(book.action == ord("T"))
    for i in (0, 1, 2, 17, 250, 499, 500, 501, 520, 899):
        lo = start[i]
        for k in CFG.flow_windows:
            a = max(lo, i - k + 1)
            assert col[f"ofi_k{k}"][i] == pytest.approx(
                e[a : i + 1, 0].sum() / dep[a : i + 1].mean(), rel=1e-12
            )
            for lv in (5, 10):  # levels 1..L aggregated, over the per-level mean depth
                depth = (bsz[a : i + 1, :lv] + asz[a : i + 1, :lv]).sum(axis=1) / (2 * lv)
                assert col[f"mlofi_1to{lv}_k{k}"][i] == pytest.approx(
                    e[a : i + 1, :lv].sum() / depth.mean(), rel=1e-12
                )
        a = max(lo, i - CFG.mlofi_window + 1)
        for m in range(10):
            assert col[f"mlofi_l{m + 1}"][i] == pytest.approx(
                e[a : i + 1, m].sum() / dep[a : i + 1].mean(), rel=1e-12
            )
        tr = trades[(trades >= lo) & (trades <= i)]
        for k in CFG.trade_windows:
            last = tr[-k:]
            sv = float((book.side[last] * book.size[last]).sum())
            vol = float(book.size[last].sum())
            assert col[f"tsv_k{k}"][i] == sv
            assert col[f"timb_k{k}"][i] == pytest.approx(sv / vol if vol else 0.0, rel=1e-12)
            assert col[f"tcnt_k{k}"][i] == pytest.approx(
                book.side[last].sum() / len(last) if len(last) else 0.0
            )
        for k in CFG.drift_windows:
            j = max(lo, i - k)
            assert col[f"drift_k{k}"][i] == pytest.approx((mid[i] - mid[j]) / TICK)
            ch = np.diff(mid[lo : i + 1]) != 0  # a change at rows lo+1..i
            assert col[f"midchg_k{k}"][i] == (ch[-k:].sum() if ch.size else 0)
        assert col["spread_bps"][i] == pytest.approx(1e4 * (book.ask_px[i, 0] - book.bid_px[i, 0]) / mid[i])
        last_t = tr[-1] if tr.size else lo
        assert col["log_dt_trade_us"][i] == pytest.approx(math.log1p((book.ts[i] - book.ts[last_t]) / 1e3))
        assert col["log_rows_since_break"][i] == pytest.approx(math.log1p(i - lo))
        ref = book_state_row(
            book.bid_px[i],
            book.ask_px[i],
            book.bid_sz[i],
            book.ask_sz[i],
            book.bid_ct[i],
            book.ask_ct[i],
            TICK,
        )
        for name, v in ref.items():
            assert col[f"book_{name}"][i] == pytest.approx(v, rel=1e-12, abs=1e-15, nan_ok=True), name
    # at a break every window starts again
    assert col["mlofi_1to10_k20"][500] == 0.0 and col["mlofi_1to5_k3"][500] == 0.0
    assert col["ofi_k20"][500] == 0.0 and col["tsv_k15"][500] == (
        float(book.side[500] * book.size[500]) if book.action[500] == ord("T") else 0.0
    )


def test_kyle_lambda_and_vpin_follow_their_definitions() -> None:
    book = make_book(600, seed=4, breaks_at=())
    out, _ = snapshot_features(book, CFG)
    col = {c: out[:, j] for j, c in enumerate(feature_names(CFG))}
    mid_u = np.floor((book.bid_px[:, 0] + book.ask_px[:, 0]) / TICK + 0.5)  # half-ticks
    tr = np.flatnonzero(book.action == ord("T"))
    x = (book.side[tr] * book.size[tr]).astype(float)
    y = np.concatenate([[0.0], np.diff(mid_u[tr])])
    i = int(tr[40])
    k = CFG.kyle_trades
    xs, ys = x[40 - k + 1 : 41], y[40 - k + 1 : 41]
    want = 0.5 * np.cov(xs, ys, bias=True)[0, 1] / np.var(xs)
    assert col["kyle_lambda"][i] == pytest.approx(want, rel=1e-9)
    # VPIN: buckets of 12 contracts filled trade by trade
    buy = sell = vol = 0.0
    buckets = []
    for j in tr[tr <= i]:
        rem = book.size[j]
        while rem > 0:
            take = min(rem, 12.0 - vol)
            buy += take if book.side[j] > 0 else 0.0
            sell += take if book.side[j] < 0 else 0.0
            vol += take
            rem -= take
            if vol >= 12.0:
                buckets.append(abs(buy - sell) / 12.0)
                buy = sell = vol = 0.0
    assert col["vpin"][i] == pytest.approx(np.mean(buckets[-3:]), rel=1e-12)


def test_bad_chunks_are_refused_by_row() -> None:
    book = make_book(50)
    book.ask_px[7, 0] = book.bid_px[7, 0] - TICK
    with pytest.raises(FxDataError, match="row 7"):
        snapshot_features(book, CFG)
    book = make_book(50)
    book.ts[9] = book.ts[8] - 1
    with pytest.raises(FxDataError, match="row 9"):
        snapshot_features(book, CFG)
    book.bid_px[3, 0] = np.nan  # the ts check comes first, then the first row without a touch
    with pytest.raises(FxDataError, match="time-ordered at row 9"):
        snapshot_features(book, CFG)
    book = make_book(50)
    book.bid_px[31, 0] = np.nan
    book.ask_px[40, 0] = np.inf
    with pytest.raises(FxDataError, match="row 31 has no best bid/ask"):
        snapshot_features(book, CFG)
    book = make_book(50)  # a zero mid: spread_bps would divide by it (the kernel does not check)
    book.bid_px[12, 0], book.ask_px[12, 0] = -TICK, TICK
    with pytest.raises(FxDataError, match=r"row 12 .* zero mid"):
        snapshot_features(book, CFG)
    with pytest.raises(ValueError):
        SnapshotFeatureConfig(flow_windows=[0])


def test_registry_documents_every_column() -> None:
    from fx_assets.core.snapshot_features import BAR_PROGRESS_NAMES, snapshot_feature_registry

    for cfg in (CFG, SnapshotFeatureConfig()):
        reg = snapshot_feature_registry(cfg)
        assert list(reg) == [*feature_names(cfg), *BAR_PROGRESS_NAMES]
        assert all(r.description and r.unit and r.window for r in reg.values())


def test_bar_context_is_strictly_before_the_row() -> None:
    from fx_assets.core.snapshot_features import bar_context, last_closed_bar

    close_rows = np.array([3, 7, 8, 20])
    j = last_closed_bar(close_rows, 25)
    # row 3 is bar 0's closing record: not yet closed *before* row 3
    assert j[:4].tolist() == [-1, -1, -1, -1] and j[4] == 0 and j[8] == 1 and j[9] == 2 and j[20] == 2
    assert j[21] == 3
    # chunked: the same answer for a chunk starting at row 8
    np.testing.assert_array_equal(last_closed_bar(close_rows, 10, row0=8), j[8:18])
    vals = np.arange(8.0).reshape(4, 2)
    ctx, jj = bar_context(vals, close_rows, 25)
    np.testing.assert_array_equal(jj, j)
    assert (ctx[:4] == 0).all() and (ctx[9] == vals[2]).all()
    with pytest.raises(FxDataError):
        last_closed_bar(np.array([5, 4]), 10)


def test_log1p_table_is_libm_log1p() -> None:
    """The book-state slopes take log1p of integer depths from a table: the same bits."""
    from numba import njit

    from fx_assets.core.ofi import _LOG1P_INT, _log1p_nb

    @njit
    def libm(x: float) -> float:
        return math.log1p(x)

    ks = np.arange(_LOG1P_INT.shape[0], dtype=np.float64)
    assert all(libm(k) == _LOG1P_INT[int(k)] == _log1p_nb(k) for k in ks)
    assert _log1p_nb(2.5) == libm(2.5) and _log1p_nb(1e6) == libm(1e6)


def make_sparse_book(
    n: int, seed: int = 0, tick: float = TICK, breaks_at: tuple[int, ...] = (700,), one_sided: float = 0.0
) -> SnapshotBook:
    """A stream like real MBP-10 records: most updates change one level of one side (a size, a
    count, a level emptied or refilled), some move the best price (the whole side shifts), some
    repeat the book unchanged (trades), a few leave deep levels missing. ``one_sided``: the
    share of updates where only the ask side moves (the mid moves, the bid side is unchanged
    or changes at a deeper level only)."""
    rng = np.random.default_rng(seed)
    bid_px = np.empty((n, 10))
    ask_px = np.empty((n, 10))
    sz = [np.empty((n, 10)) for _ in range(4)]
    lv = np.arange(10)
    bid = 4000.0
    spread = 1
    cur_b = bid - tick * lv
    cur_a = bid + tick * spread + tick * lv
    cur = [rng.integers(1, 80, 10).astype(np.float64) for _ in range(4)]
    for i in range(n):
        u = rng.random()
        if u < 0.1:  # best price moves: the book shifts
            bid += tick * rng.choice([-1, 1])
            spread = int(rng.choice([1, 1, 1, 2]))
            cur_b = bid - tick * lv
            cur_a = bid + tick * spread + tick * lv
            cur[0][:] = np.roll(cur[0], 1)
            cur[1][:] = np.roll(cur[1], -1)
        elif u < 0.1 + one_sided:  # only the ask side moves (the spread changes)
            spread = max(1, spread + int(rng.choice([-1, 1])))
            cur_a = bid + tick * spread + tick * lv
            cur[1][:] = np.roll(cur[1], -1)
            if rng.random() < 0.5:  # and one deeper bid level changes size
                cur[0][int(rng.integers(1, 10))] = float(rng.integers(1, 80))
        elif u < 0.75:  # one level of one side changes
            k = int(rng.integers(0, 10))
            s = int(rng.integers(0, 2))
            cur[s][k] = float(rng.integers(1, 80))
            cur[2 + s][k] = float(rng.integers(1, 9))
        elif u < 0.8:  # a deep level empties or refills
            k = int(rng.integers(3, 10))
            px = cur_b if rng.random() < 0.5 else cur_a
            px[k] = (
                np.nan if px[k] == px[k] else (bid - tick * k if px is cur_b else bid + tick * (spread + k))
            )
        bid_px[i], ask_px[i] = cur_b, cur_a
        for j in range(4):
            sz[j][i] = cur[j]
    action = np.where(rng.random(n) < 0.25, ord("T"), ord("A")).astype(np.uint8)
    side = np.where(action == ord("T"), rng.choice([-1, 1, 0], n, p=[0.45, 0.45, 0.1]), 0).astype(np.int8)
    size = np.where(action == ord("T"), rng.integers(1, 20, n), 0).astype(np.float64)
    ts = np.cumsum(rng.integers(0, 3_000_000, n)).astype(np.int64)
    breaks = np.searchsorted(np.asarray(breaks_at), np.arange(n), side="right").astype(np.int64)
    return SnapshotBook(ts, breaks, action, side, size, bid_px, ask_px, sz[0], sz[1], sz[2], sz[3])


@pytest.mark.parametrize("tick", [TICK, 0.1, 1.0])
def test_fast_kernel_is_bit_identical_to_the_reference(tick: float) -> None:
    """The incremental kernel (slopes resumed at the first changed level, trade outputs kept
    between trades, power-of-two tick divisions as products, block-wise stores) gives exactly
    the bits of the kernel it replaced (fx_assets_tests/core/snapshot_reference.py), in one
    pass and in chunks, on books that change one level at a time and on fully random ones."""
    from fx_assets_tests.core import snapshot_reference as ref

    for cfg in (CFG, SnapshotFeatureConfig(tick_size=tick)):
        cfg = cfg.model_copy(update={"tick_size": tick})
        dense = make_book(1200, seed=3)
        dense.bid_px = dense.bid_px / TICK * tick  # make_book's grid is TICK: onto this tick's
        dense.ask_px = dense.ask_px / TICK * tick
        names = feature_names(cfg)
        old = [names.index(c) for c in ref.old_feature_names(cfg)]  # the columns the reference has
        assert len(old) == len(names) - 2 * len(cfg.flow_windows)
        one_sided = make_sparse_book(3000, seed=8, tick=tick, one_sided=0.2)
        for book in (make_sparse_book(3000, seed=7, tick=tick), one_sided, dense):
            want, _ = ref.snapshot_features(book, cfg)
            got, _ = snapshot_features(book, cfg)
            np.testing.assert_array_equal(got[:, old], want)
            assert np.ascontiguousarray(got[:, old]).tobytes() == want.tobytes()
            parts, st = [], None
            for lo, hi in ((0, 1), (1, 64), (64, 65), (65, 700), (700, len(book))):
                out, st = snapshot_features(_slice(book, lo, hi), cfg, st)
                parts.append(out)
            whole = np.vstack(parts)
            assert whole.tobytes() == got.tobytes()
            assert np.ascontiguousarray(whole[:, old]).tobytes() == want.tobytes()


# sha256 of every column (the aggregated-OFI ones too, which the reference kernel lacks) of
# snapshot_features on the books below, computed with the kernel of main 8d5837f: a speed-up of
# the scan must leave every bit alone. (Like the golden digests, it assumes glibc's log1p.)
SCAN_DIGEST = "57a56a3da9acf2845ffa23b70bcd60e4c8e5b37fe68eb9fa458e887ff581435d"


def test_scan_output_bits_are_unchanged() -> None:
    """The whole output, all columns, bit for bit as the kernel of 8d5837f gave it: sparse
    books (one level at a time, one-sided moves) and dense random ones, two ticks, two configs."""
    import hashlib

    h = hashlib.sha256()
    for tick in (TICK, 0.1):
        for cfg in (CFG, SnapshotFeatureConfig()):
            cfg = cfg.model_copy(update={"tick_size": tick})
            dense = make_book(1200, seed=3)
            dense.bid_px = dense.bid_px / TICK * tick
            dense.ask_px = dense.ask_px / TICK * tick
            books = (
                make_sparse_book(3000, seed=7, tick=tick),
                make_sparse_book(3000, seed=8, tick=tick, one_sided=0.2),
                dense,
            )
            for book in books:
                out, _ = snapshot_features(book, cfg)
                h.update(out.tobytes())
    assert h.hexdigest() == SCAN_DIGEST


def test_out_buffer_is_written_in_place() -> None:
    """``out`` is written in place: a row-major buffer, or the first F columns of a wider
    row-major block (the caller's fxcache block), leaving the other columns alone."""
    book = make_book(300, seed=9)
    want, _ = snapshot_features(book, CFG)
    nf = len(feature_names(CFG))
    buf = np.full((300, nf), np.nan)
    got, _ = snapshot_features(book, CFG, out=buf)
    assert np.shares_memory(got, buf) and got.tobytes() == want.tobytes()
    wide = np.full((300, nf + 5), -7.0)
    got, _ = snapshot_features(book, CFG, out=wide[:, :nf])
    assert np.shares_memory(got, wide) and got.tobytes() == want.tobytes()
    assert (wide[:, nf:] == -7.0).all()
    with pytest.raises(FxDataError, match="out is"):
        snapshot_features(book, CFG, out=np.empty((3, 300)))
    with pytest.raises(FxDataError, match="out is"):  # feature-major: rows not contiguous
        snapshot_features(book, CFG, out=np.empty((nf, 300)).T)


def test_docs_table_is_the_registry() -> None:
    """docs/snapshot-features.md documents every column of the default stack, as the registry
    says (formula, unit, reach): regenerate it with ``snapshot_feature_table()``."""
    from pathlib import Path

    from fx_assets.core.snapshot_features import BAR_PROGRESS_NAMES, snapshot_feature_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "snapshot-features.md").read_text()
    assert snapshot_feature_table() in doc
    # 52 scan and bar progress columns, then the 28 bar features of the last closed bar
    assert len(feature_names(SnapshotFeatureConfig())) + len(BAR_PROGRESS_NAMES) == 52
