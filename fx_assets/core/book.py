"""Gathering the active contract's MBP-10 book into matrices, chunk by chunk (no Dagster).

Shared by both row units: :class:`BookSource` (a quarter's MBP-10 sidecar and its roll
calendar), ``_book_columns`` (the sidecar columns of the first ``levels`` levels),
``_select_active_nb`` (record numbers of the active contract in a record range) and
``_book_rows`` / ``_gather_book_nb`` (those records written into reused [n, levels] float
matrices, with the tick-grid check). ``DEFAULT_BOOK_CHUNK`` is the default chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from numba import njit

from fx_assets.core import ofi as ofi_core
from fx_assets.core.active_contract import _active_at, _active_table
from fx_assets.core.dbn import PRICE_DIVISOR, UNDEF_PRICE
from fx_assets.core.errors import FxDataError
from fx_assets.core.roll import RollCalendar

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
N_LEVELS = 10
DEFAULT_BOOK_CHUNK = 500_000


@dataclass(frozen=True)
class BookSource:
    """A quarter's MBP-10 sidecar and the calendar selecting its active contract."""

    path: Path
    calendar: RollCalendar


_BOOK_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")


@njit(cache=True, inline="always")
def _valid_touch(bid: int, ask: int) -> bool:
    """The one rule of which MBP-10 records carry a usable top of book (raw int prices): both
    best prices defined, the bid positive, not crossed. (The OFI kernel applies the same rule
    to float prices, where an undefined price is NaN.)"""
    return bid != UNDEF_PRICE and ask != UNDEF_PRICE and bid > 0 and bid <= ask


def _book_columns(levels: int) -> list[str]:
    """The MBP-10 sidecar columns the OFI pass reads: levels ``0 .. levels-1`` only."""
    return ["ts_recv", "instrument_id"] + [f"{f}_{i:02d}" for f in _BOOK_FIELDS for i in range(levels)]


@njit(cache=True, nogil=True)
def _select_active_nb(
    ts: I64, iid: npt.NDArray[np.uint32], bounds: I64, act: I64, lo: int, hi: int, out: I64
) -> int:
    """Record numbers in ``[lo, hi)`` of the session's active contract, into ``out``; count."""
    n = 0
    k = 0
    for i in range(lo, hi):
        ok, k = _active_at(bounds, act, ts[i], int(iid[i]), k)
        if ok:
            out[n] = i
            n += 1
    return n


# Rows per block: every column's slice of a block, and the block's rows of the six output
# matrices (1024 x 6 x 80 B), stay in the core's cache. 4096 rows (2 MB of output per block,
# the size of L2 here) gathered the scale-1 quarter's 2.29 M snapshot rows in 0.45 s CPU
# against 0.37 s at 1024 (0.40 s at 256, 0.39 s at 2048; core 0, 4 alternating rounds).
_GATHER_BLOCK = 1024


@njit(cache=True, nogil=True)
def _gather_book_nb(
    idx: I64,
    ts: I64,
    bid_px: tuple[np.ndarray, ...],
    ask_px: tuple[np.ndarray, ...],
    bid_sz: tuple[np.ndarray, ...],
    ask_sz: tuple[np.ndarray, ...],
    bid_ct: tuple[np.ndarray, ...],
    ask_ct: tuple[np.ndarray, ...],
    tick_units: int,
    row0: int,
    o_ts: I64,
    o_bpx: F64,
    o_apx: F64,
    o_bsz: F64,
    o_asz: F64,
    o_bct: F64,
    o_act: F64,
) -> tuple[int, int]:
    """Rows ``idx`` of the level columns into rows ``row0 ..`` of the [n, levels] matrices.

    Prices as ``dbn.px_to_float`` (int / 1e9, UNDEF_PRICE -> NaN). With ``tick_units`` > 0,
    returns the first defined price off the grid as (column rank, position in ``idx``) in the
    order a column-by-column check finds it (bid levels 0.., then ask levels 0.., then record
    order); (-1, -1) if none. One thread: the copy is memory-bound (two threads measured
    slower on the 2-core machine).
    """
    n = idx.shape[0]
    levels = len(bid_px)
    n_blocks = (n + _GATHER_BLOCK - 1) // _GATHER_BLOCK
    big = 2 * levels  # above every rank
    bad_rank = np.full(n_blocks, big, np.int64)
    bad_pos = np.zeros(n_blocks, np.int64)
    for blk in range(n_blocks):
        b0 = blk * _GATHER_BLOCK
        b1 = min(b0 + _GATHER_BLOCK, n)
        for r in range(b0, b1):
            o_ts[row0 + r] = ts[idx[r]]
        for lvl in range(levels):
            # A level's bid and ask in one loop (one read of the index per row for both). The
            # grid check (a 64-bit modulo, the costliest step here) runs once per run of equal
            # defined prices: a level's price mostly repeats from record to record, and a repeat
            # of an off-grid price was already recorded at its first row. A block keeps the
            # lowest rank and, for it, the first row: rows ascend and only a strictly lower
            # rank replaces, so the bid/ask interleaving finds what column order found.
            cb = bid_px[lvl]
            ca = ask_px[lvl]
            last_b = UNDEF_PRICE
            last_a = UNDEF_PRICE
            for r in range(b0, b1):
                i = idx[r]
                vb = cb[i]
                va = ca[i]
                o_bpx[row0 + r, lvl] = np.nan if vb == UNDEF_PRICE else vb / PRICE_DIVISOR
                o_apx[row0 + r, lvl] = np.nan if va == UNDEF_PRICE else va / PRICE_DIVISOR
                if tick_units > 0:
                    if vb != UNDEF_PRICE and vb != last_b:
                        last_b = vb
                        if vb % tick_units != 0 and lvl < bad_rank[blk]:
                            bad_rank[blk] = lvl
                            bad_pos[blk] = r
                    if va != UNDEF_PRICE and va != last_a:
                        last_a = va
                        if va % tick_units != 0 and levels + lvl < bad_rank[blk]:
                            bad_rank[blk] = levels + lvl
                            bad_pos[blk] = r
            c1 = bid_sz[lvl]
            c2 = ask_sz[lvl]
            c3 = bid_ct[lvl]
            c4 = ask_ct[lvl]
            for r in range(b0, b1):
                i = idx[r]
                o_bsz[row0 + r, lvl] = c1[i]
                o_asz[row0 + r, lvl] = c2[i]
                o_bct[row0 + r, lvl] = c3[i]
                o_act[row0 + r, lvl] = c4[i]
    best_rank = big
    best_pos = -1
    for blk in range(n_blocks):  # blocks in row order: lowest rank, then earliest row
        if bad_rank[blk] < best_rank:
            best_rank = bad_rank[blk]
            best_pos = bad_pos[blk]
    if best_rank == big:
        return -1, -1
    return best_rank, best_pos


@njit(cache=True)
def _empty_i64(n: int) -> I64:
    return np.empty(n, np.int64)


class _BookBuffers:
    """Output matrices reused from one OFI chunk to the next: a fresh 100-MB-class allocation
    per chunk would page-fault every page again (a chunk's ``BookArrays`` are views into
    these, dead before the next chunk is built).

    ``small_pages``: allocate with numba's allocator (4 KiB pages, as ``ofi._empty_2d``)
    instead of numpy's, which advises huge pages for large arrays; where the kernel must
    compact memory to fault a huge page in, that stalls (the OFI stage's gather spent
    0.3 s of system time in it, after the earlier stages of the process). ``reserve`` sizes
    the buffers once for the largest chunk, so they never grow (a growth re-faults them)."""

    def __init__(self, small_pages: bool = False) -> None:
        self.rows = 0
        self.levels = 0
        self.small_pages = small_pages
        self.ts = np.empty(0, np.int64)
        self.mats: list[F64] = []
        self.idx = np.empty(0, np.int64)

    def reserve(self, rows: int, levels: int, records: int = 0) -> None:
        """Capacity for ``rows`` output rows and an index of ``records`` records (untouched
        pages cost nothing)."""
        self.take(rows, levels)
        self.index(records)

    def take(self, n: int, levels: int) -> tuple[I64, list[F64]]:
        if n > self.rows or levels != self.levels:
            cap = max(n, int(self.rows * 1.25)) if levels == self.levels else n
            if self.small_pages:
                self.ts = _empty_i64(cap)
                self.mats = [ofi_core._empty_2d(cap, levels) for _ in _BOOK_FIELDS]
            else:
                self.ts = np.empty(cap, np.int64)
                self.mats = [np.empty((cap, levels), np.float64) for _ in _BOOK_FIELDS]
            self.rows, self.levels = cap, levels
        return self.ts[:n], [m[:n] for m in self.mats]

    def index(self, n: int) -> I64:
        """A record-index buffer of ``n`` entries (the same memory from call to call)."""
        if n > self.idx.shape[0]:
            self.idx = _empty_i64(n) if self.small_pages else np.empty(n, np.int64)
        return self.idx[:n]


def _book_rows(
    parts: Sequence[tuple[BookSource, dict[str, np.ndarray], int, int]],
    levels: int,
    tick_units: int = 0,
    buffers: _BookBuffers | None = None,
    tables: Sequence[tuple[I64, I64]] | None = None,
) -> ofi_core.BookArrays:
    """Active-contract book rows of the record ranges ``[lo, hi)`` of each source, in order, as
    [n, ``levels``] float matrices written in place (no per-column temporaries, no second
    concatenation copy; into ``buffers`` when given). With ``tick_units`` > 0, a defined price
    off the tick grid raises (naming file, column, record and ts_recv). ``tables``: each
    part's ``_active_table`` (bounds, active ids) over its whole source, built once by the
    caller (any table covering the records gives the same selection). An
    ``ofi.UnsignedSizeBook`` when every size and count column read is of an unsigned integer
    type (the sidecar's)."""
    picked: list[tuple[BookSource, dict[str, np.ndarray], I64]] = []
    # one index buffer for all parts (each part's selection is a slice of it)
    whole = None if buffers is None else buffers.index(sum(max(hi - lo, 0) for _, _, lo, hi in parts))
    at = 0
    for p, (src, c, lo, hi) in enumerate(parts):
        if hi <= lo:
            continue
        ts = c["ts_recv"]
        if tables is None:
            bounds, act, _ = _active_table(src.calendar, ts[lo:hi])
        else:
            bounds, act = tables[p]
        idx = np.empty(hi - lo, dtype=np.int64) if whole is None else whole[at : at + hi - lo]
        n = _select_active_nb(ts, c["instrument_id"], bounds, act, lo, hi, idx)
        picked.append((src, c, idx[:n]))
        at += n
    total = sum(int(i.shape[0]) for _, _, i in picked)
    if buffers is None:
        o_ts = np.empty(total, dtype=np.int64)
        mats = [np.empty((total, levels), dtype=np.float64) for _ in _BOOK_FIELDS]
    else:
        o_ts, mats = buffers.take(total, levels)
    row = 0
    for src, c, idx in picked:
        if idx.size == 0:
            continue
        c_bpx, c_apx, c_bsz, c_asz, c_bct, c_act = (
            tuple(c[f"{f}_{i:02d}"] for i in range(levels)) for f in _BOOK_FIELDS
        )
        m_bpx, m_apx, m_bsz, m_asz, m_bct, m_act = mats
        rank, pos = _gather_book_nb(
            idx, c["ts_recv"], c_bpx, c_apx, c_bsz, c_asz, c_bct, c_act, tick_units, row, o_ts,
            m_bpx, m_apx, m_bsz, m_asz, m_bct, m_act,
        )  # fmt: skip
        if rank >= 0:
            side, lvl = divmod(int(rank), levels)
            name = f"{('bid_px', 'ask_px')[side]}_{lvl:02d}"
            r = int(idx[pos])
            raise FxDataError(
                f"{src.path}: {name} = {int(c[name][r]) * 1e-9!r} at record {r} "
                f"(ts_recv {int(c['ts_recv'][r])}) is off the {tick_units * 1e-9:g} tick grid "
                "(OfiConfig.tick_size)"
            )
        row += int(idx.shape[0])
    # sizes and counts from unsigned integer columns (the sidecar's): finite and >= 0 already
    unsigned = all(
        np.issubdtype(c[f"{f}_{i:02d}"].dtype, np.unsignedinteger)
        for _, c, _ in picked
        for f in ("bid_sz", "ask_sz", "bid_ct", "ask_ct")
        for i in range(levels)
    )
    return (ofi_core.UnsignedSizeBook if unsigned else ofi_core.BookArrays)(o_ts, *mats)
