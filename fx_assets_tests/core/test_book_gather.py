"""``book._gather_book_nb`` (the book rows into float matrices, with the tick-grid check)
against a plain NumPy evaluation of its definition, bit for bit: prices int / 1e9 with
UNDEF_PRICE -> NaN, sizes and counts as float64, and the first off-grid defined price in
column order (bid levels 0.., ask levels 0.., then record order)."""

from __future__ import annotations

import numpy as np
import pytest

from fx_assets.core import book
from fx_assets.core.dbn import UNDEF_PRICE

LEVELS = 10
TICK = 250_000_000  # 0.25 index points in 1e-9 units


def _columns(rng: np.random.Generator, n_rec: int) -> dict[str, list[np.ndarray]]:
    cols: dict[str, list[np.ndarray]] = {}
    for f in book._BOOK_FIELDS:
        if f.endswith("_px"):
            # runs of repeated prices (what the run-of-equal-prices shortcut sees), some undefined
            base = np.repeat(rng.integers(16_000, 24_000, n_rec // 7 + 1), 7)[:n_rec]
            cols[f] = []
            for _ in range(LEVELS):
                px = (base + rng.integers(0, 3, n_rec)) * TICK
                px[rng.random(n_rec) < 0.05] = UNDEF_PRICE
                cols[f].append(px.astype(np.int64))
        else:
            cols[f] = [
                rng.integers(0, 2**32, n_rec, dtype=np.uint64).astype(np.uint32) for _ in range(LEVELS)
            ]
    return cols


def _plain(
    cols: dict[str, list[np.ndarray]], idx: np.ndarray, tick: int
) -> tuple[list[np.ndarray], tuple[int, int]]:
    mats = []
    for f in book._BOOK_FIELDS:
        m = np.empty((idx.size, LEVELS))
        for lvl, c in enumerate(cols[f]):
            v = c[idx]
            if f.endswith("_px"):
                m[:, lvl] = np.where(v == UNDEF_PRICE, np.nan, v / 1e9)
            else:
                m[:, lvl] = v.astype(np.float64)
        mats.append(m)
    first = (-1, -1)
    if tick > 0:
        for rank, c in enumerate(cols["bid_px"] + cols["ask_px"]):
            v = c[idx]
            bad = np.flatnonzero((v != UNDEF_PRICE) & (v % tick != 0))
            if bad.size:
                first = (rank, int(bad[0]))
                break
    return mats, first


@pytest.mark.parametrize("tick", [TICK, 0])
def test_gather_is_the_plain_definition_bit_for_bit(tick: int) -> None:
    """Several gather blocks, gaps in the index, an output offset (``row0``), and off-grid
    prices planted at several ranks and rows: a higher rank earlier, the lowest rank in a
    later block, a repeat of an off-grid price, an ask before a bid of the same level."""
    rng = np.random.default_rng(5)
    n_rec = 9000
    cols = _columns(rng, n_rec)
    ts = np.sort(rng.integers(0, 10**12, n_rec)).astype(np.int64)
    idx = np.sort(rng.choice(n_rec, 7000, replace=False)).astype(np.int64)
    row0 = 13

    def run() -> tuple[list[np.ndarray], np.ndarray, tuple[int, int]]:
        n = row0 + idx.size
        o_ts = np.full(n, -1, np.int64)
        mats = [np.full((n, LEVELS), -7.0) for _ in book._BOOK_FIELDS]
        got = book._gather_book_nb(
            idx, ts, *(tuple(cols[f]) for f in book._BOOK_FIELDS), tick, row0, o_ts, *mats
        )
        return mats, o_ts, (int(got[0]), int(got[1]))

    plants = [
        ("ask_px", 0, 100),  # rank 10, early
        ("bid_px", 6, 2500),  # rank 6, later block: the first by rank
        ("bid_px", 6, 2501),  # its repeat
        ("bid_px", 2, 6900),  # rank 2, last block: wins over both
        ("ask_px", 2, 6000),  # rank 12 before it in row order
        ("bid_px", 2, 6950),  # rank 2 again, later
    ]
    clean = {f: [c.copy() for c in cs] for f, cs in cols.items()}
    for k in range(len(plants) + 1):
        for f in cols:
            for lvl in range(LEVELS):
                cols[f][lvl][:] = clean[f][lvl]
        for f, lvl, r in plants[:k]:
            cols[f][lvl][idx[r]] = clean[f][lvl][idx[r]] + 1  # one unit off the grid
        cols["bid_px"][6][idx[2501]] = cols["bid_px"][6][idx[2500]]  # a run of one price
        mats, o_ts, first = run()
        want, want_first = _plain(cols, idx, tick)
        assert first == want_first, (k, first, want_first)
        assert o_ts[row0:].tobytes() == ts[idx].tobytes() and (o_ts[:row0] == -1).all()
        for f, m, w in zip(book._BOOK_FIELDS, mats, want, strict=True):
            assert m[row0:].tobytes() == w.tobytes(), f
            assert (m[:row0] == -7.0).all(), f
