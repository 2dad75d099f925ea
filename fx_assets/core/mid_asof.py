"""The active contract's mid price as of given times, from the MBP-10 book (no Dagster).

``book_mid_asof``: one numba merge of the memory-mapped best-level columns with the queries
(last valid snapshot with ``ts_recv <= t``, optionally of a given contract per query).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from fx_assets.core.active_contract import _active_at, _active_table
from fx_assets.core.book import DEFAULT_BOOK_CHUNK, BookSource, _valid_touch
from fx_assets.core.dbn import PRICE_DIVISOR
from fx_assets.core.errors import FxDataError
from fx_assets.core.sidecar import sidecar_columns

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@njit(cache=True, nogil=True)
def _mid_asof_nb(
    ts: I64,
    iid: npt.NDArray[np.uint32],
    bid: I64,
    ask: I64,
    bounds: I64,
    act: I64,
    q: I64,
    order: I64,
    q_slot: I64,
    slot_iid: I64,
    out: F64,
) -> None:
    """One forward merge of the book (ts order) with the queries (in ``order``: ascending
    time): ``out[j]`` = mid of the last valid active snapshot with ``ts_recv <= q[j]`` of
    instrument ``slot_iid[q_slot[j]]`` (of any instrument when ``slot_iid`` is empty); NaN
    before the first. Mid as ``(px_to_float(bid) + px_to_float(ask)) / 2``."""
    n_slots = slot_iid.shape[0]
    last = np.full(max(n_slots, 1), np.nan)
    n = ts.shape[0]
    i = 0
    k = 0
    for r in range(order.shape[0]):
        jq = order[r]
        t = q[jq]
        while i < n and ts[i] <= t:
            b = bid[i]
            a = ask[i]
            if _valid_touch(b, a):
                ok, k = _active_at(bounds, act, ts[i], int(iid[i]), k)
                if ok:
                    mid = (b / PRICE_DIVISOR + a / PRICE_DIVISOR) / 2.0
                    if n_slots == 0:
                        last[0] = mid
                    else:
                        for s in range(n_slots):
                            if slot_iid[s] == iid[i]:
                                last[s] = mid
                                break
            i += 1
        out[jq] = last[q_slot[jq]]


def book_mid_asof(
    book: BookSource,
    ts_query: npt.NDArray[np.int64],
    chunk: int = DEFAULT_BOOK_CHUNK,
    *,
    instrument_id: npt.NDArray[np.uint32] | None = None,
) -> F64:
    """Mid price of the active contract's book as of each query time (last valid snapshot with
    ``ts_recv <= t``; NaN before the first): one numba merge of the memory-mapped book columns
    with the queries, no per-record temporaries (``chunk`` is accepted for compatibility).

    ``instrument_id`` (one per query, optional): only snapshots of that contract count. A bar
    right after a roll must not get the previous contract's mid (the last active snapshot
    before its open is usually the old contract's, from the session before)."""
    del chunk
    cols = sidecar_columns(book.path, ["ts_recv", "instrument_id", "bid_px_00", "ask_px_00"])
    ts = cols["ts_recv"]
    q = np.ascontiguousarray(ts_query, dtype=np.int64)
    out = np.full(q.shape[0], np.nan)
    if instrument_id is None:
        slot_iid = np.empty(0, np.int64)
        q_slot = np.zeros(q.shape[0], np.int64)
    else:
        qi = np.asarray(instrument_id, dtype=np.uint32)
        if qi.shape != q.shape:
            raise FxDataError(
                f"book_mid_asof: instrument_id {qi.shape} and ts_query {q.shape} differ in shape"
            )
        uniq, inv = np.unique(qi, return_inverse=True)
        slot_iid = uniq.astype(np.int64)
        q_slot = inv.astype(np.int64).reshape(-1)
    if ts.shape[0] == 0 or q.shape[0] == 0:
        return out
    ordered = q.shape[0] < 2 or bool(np.all(q[1:] >= q[:-1]))
    order = np.arange(q.shape[0], dtype=np.int64) if ordered else np.argsort(q, kind="stable")
    bounds, act, _ = _active_table(book.calendar, ts)
    _mid_asof_nb(
        ts, cols["instrument_id"], cols["bid_px_00"], cols["ask_px_00"], bounds, act, q, order,
        q_slot, slot_iid, out,
    )  # fmt: skip
    return out
