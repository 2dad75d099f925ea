"""The snapshot feature kernel as it was before the incremental rewrite (commit 63a9e85): a
slow-path reference kept only in the tests (and for the benchmark's A B A B comparison), so
that the fast kernel can be shown bit-identical to it on random data."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from fx_assets.core.errors import FxDataError
from fx_assets.core.ofi import _book_state_nb
from fx_assets.core.snapshot_features import (
    _BIG,
    _I_BPOS,
    _I_BREAK,
    _I_BUCKETS,
    _I_DPOS,
    _I_LAST_MID_TS,
    _I_LAST_TRADE_TS,
    _I_LAST_TS,
    _I_LAST_U,
    _I_POS,
    _I_ROWS,
    _I_RPOS,
    _I_TPOS,
    _I_TRADE_U,
    _I_TRADES,
    F64,
    TRADE,
    SnapshotBook,
    SnapshotFeatureConfig,
    SnapshotState,
    feature_names,
    new_state,
)


def old_feature_names(cfg: SnapshotFeatureConfig) -> list[str]:
    """The columns this kernel computes, in its order: the scan's columns before the
    level-aggregated OFI (``mlofi_1to<L>_k<K>``) was added."""
    return [c for c in feature_names(cfg) if not c.startswith("mlofi_1to")]


@njit(cache=True, nogil=True)
def _back(pos: int, k: int, size: int) -> int:
    """Ring index ``k`` steps before ``pos`` (0 <= k < size), without a modulo."""
    j = pos - k
    return j + size if j < 0 else j


@njit(cache=True, nogil=True)
def _px(p: float, bid: bool) -> float:
    if p != p:
        return -_BIG if bid else _BIG
    return p


@njit(cache=True, nogil=True)
def _cks(b: float, qb: float, a: float, qa: float, b0: float, qb0: float, a0: float, qa0: float) -> float:
    """CKS order-flow term of one level: this update (b, qb, a, qa) against the previous."""
    e = 0.0
    if b >= b0:
        e += qb
    if b <= b0:
        e -= qb0
    if a <= a0:
        e -= qa
    if a >= a0:
        e += qa0
    return e


@njit(cache=True, nogil=True)
def _snapshot_nb(
    ts, brk, action, side, size, bpx, apx, bsz, asz, bct, act,
    levels, tick, flow_w, mlofi_k, trade_w, kyle_k, vb_vol, vb_n, drift_w,
    ints, prev, ofi_ring, dep_ring, sums, trade_ring, mid_ring, chg_ring, ts_ring, vpin_ring, vpin_cur,
    out,
):  # fmt: skip
    """The scan over one chunk; ``out`` is [F, n] (feature-major). Rings are one longer than
    their longest window, so the value leaving window k is always ``ring[(pos - k) % size]``."""
    n = ts.shape[0]
    R = ofi_ring.shape[0]
    T = trade_ring.shape[0]
    D = mid_ring.shape[0]
    RK = ts_ring.shape[0]
    nf = flow_w.shape[0]
    ntw = trade_w.shape[0]
    nd = drift_w.shape[0]
    s_dep = nf
    s_ml = 2 * nf
    s_mld = s_ml + levels
    s_tr = s_mld + 1
    s_ky = s_tr + 3 * ntw
    s_chg = s_ky + 5
    s_vp = s_chg + nd
    for i in range(n):
        u = np.int64(math.floor((bpx[i, 0] + apx[i, 0]) / tick + 0.5))  # mid in half-ticks: (b + a) / tick
        # ---- a break resets every window, clock and the previous book
        if brk[i] != ints[_I_BREAK]:
            ints[:] = 0
            ints[_I_BREAK] = brk[i]
            sums[:] = 0.0
            vpin_cur[:] = 0.0
            ints[_I_LAST_TS] = ts[i]
            ints[_I_LAST_TRADE_TS] = ts[i]
            ints[_I_LAST_MID_TS] = ts[i]
            ints[_I_LAST_U] = u
            ints[_I_TRADE_U] = u
        rows = ints[_I_ROWS]
        # ---- per-level OFI of this update (0 on the first row after a break)
        pos = ints[_I_POS]
        for m in range(levels):
            b = _px(bpx[i, m], True)
            a = _px(apx[i, m], False)
            qb = bsz[i, m] if bpx[i, m] == bpx[i, m] else 0.0
            qa = asz[i, m] if apx[i, m] == apx[i, m] else 0.0
            e = _cks(b, qb, a, qa, prev[0, m], prev[2, m], prev[1, m], prev[3, m]) if rows > 0 else 0.0
            ofi_ring[pos, m] = e
            if m == 0:
                for w in range(nf):
                    if rows >= flow_w[w]:
                        sums[w] -= ofi_ring[_back(pos, flow_w[w], R), 0]
                    sums[w] += e
            if rows >= mlofi_k:
                sums[s_ml + m] -= ofi_ring[_back(pos, mlofi_k, R), m]
            sums[s_ml + m] += e
            prev[0, m] = b
            prev[1, m] = a
            prev[2, m] = qb
            prev[3, m] = qa
        dep = 0.5 * (prev[2, 0] + prev[3, 0])
        dep_ring[pos] = dep
        for w in range(nf):
            if rows >= flow_w[w]:
                sums[s_dep + w] -= dep_ring[_back(pos, flow_w[w], R)]
            sums[s_dep + w] += dep
        if rows >= mlofi_k:
            sums[s_mld] -= dep_ring[_back(pos, mlofi_k, R)]
        sums[s_mld] += dep
        ints[_I_POS] = pos + 1 if pos + 1 < R else 0
        # ---- mid changes
        dpos = ints[_I_DPOS]
        changed = 1 if (rows > 0 and u != ints[_I_LAST_U]) else 0
        chg_ring[dpos] = changed
        mid_ring[dpos] = u
        for w in range(nd):
            if rows >= drift_w[w]:
                sums[s_chg + w] -= chg_ring[_back(dpos, drift_w[w], D)]
            sums[s_chg + w] += changed
        if changed:
            ints[_I_LAST_MID_TS] = ts[i]
        # ---- trades
        if action[i] == TRADE:
            v = size[i]
            sg = float(side[i])
            tpos = ints[_I_TPOS]
            nt = ints[_I_TRADES]
            dmid = float(u - ints[_I_TRADE_U]) if nt > 0 else 0.0
            trade_ring[tpos, 0] = sg * v
            trade_ring[tpos, 1] = v
            trade_ring[tpos, 2] = sg
            trade_ring[tpos, 3] = dmid
            for w in range(ntw):
                k = trade_w[w]
                for c in range(3):
                    if nt >= k:
                        sums[s_tr + 3 * w + c] -= trade_ring[_back(tpos, k, T), c]
                    sums[s_tr + 3 * w + c] += trade_ring[tpos, c]
            # Kyle: x = signed size, y = mid change since the previous trade (half-ticks)
            if nt >= kyle_k:
                j = _back(tpos, kyle_k, T)
                xo = trade_ring[j, 0]
                yo = trade_ring[j, 3]
                sums[s_ky] -= 1.0
                sums[s_ky + 1] -= xo
                sums[s_ky + 2] -= yo
                sums[s_ky + 3] -= xo * xo
                sums[s_ky + 4] -= xo * yo
            x = sg * v
            sums[s_ky] += 1.0
            sums[s_ky + 1] += x
            sums[s_ky + 2] += dmid
            sums[s_ky + 3] += x * x
            sums[s_ky + 4] += x * dmid
            ints[_I_TPOS] = tpos + 1 if tpos + 1 < T else 0
            ints[_I_TRADES] = nt + 1
            ints[_I_TRADE_U] = u
            ints[_I_LAST_TRADE_TS] = ts[i]
            # VPIN: fill volume buckets (a trade may close several)
            rem = v
            while rem > 0.0:
                room = vb_vol - vpin_cur[2]
                take = rem if rem < room else room
                if sg > 0:
                    vpin_cur[0] += take
                elif sg < 0:
                    vpin_cur[1] += take
                vpin_cur[2] += take
                rem -= take
                if vpin_cur[2] >= vb_vol:
                    bpos = ints[_I_BPOS]
                    val = abs(vpin_cur[0] - vpin_cur[1]) / vb_vol
                    if ints[_I_BUCKETS] >= vb_n:
                        sums[s_vp] -= vpin_ring[bpos]
                    vpin_ring[bpos] = val
                    sums[s_vp] += val
                    ints[_I_BPOS] = bpos + 1 if bpos + 1 < vb_n else 0
                    ints[_I_BUCKETS] += 1
                    vpin_cur[:] = 0.0
        # ---- event rate over the last min(rows + 1, RK - 1) updates
        rpos = ints[_I_RPOS]
        ts_ring[rpos] = ts[i]
        cnt_r = min(rows + 1, RK - 1)
        t_first = ts_ring[_back(rpos, (cnt_r - 1), RK)]
        ints[_I_RPOS] = rpos + 1 if rpos + 1 < RK else 0
        # ---- outputs of row i
        _book_state_nb(bpx[i], apx[i], bsz[i], asz[i], bct[i], act[i], levels, tick, out, 0, i)
        o = 12
        for w in range(nf):
            md = sums[s_dep + w] / min(rows + 1, flow_w[w])
            out[o, i] = sums[w] / md if md > 0 else 0.0
            o += 1
        md = sums[s_mld] / min(rows + 1, mlofi_k)
        for m in range(levels):
            out[o, i] = sums[s_ml + m] / md if md > 0 else 0.0
            o += 1
        nt = ints[_I_TRADES]
        for w in range(ntw):
            cnt = min(nt, trade_w[w])
            sv = sums[s_tr + 3 * w]
            vol = sums[s_tr + 3 * w + 1]
            out[o, i] = sv
            out[o + 1, i] = sv / vol if vol > 0 else 0.0
            out[o + 2, i] = sums[s_tr + 3 * w + 2] / cnt if cnt > 0 else 0.0
            o += 3
        nb = ints[_I_BUCKETS]
        out[o, i] = sums[s_vp] / min(nb, vb_n) if nb > 0 else 0.0
        kn = sums[s_ky]
        lam = 0.0
        if kn >= 3:
            sxx = sums[s_ky + 3] - sums[s_ky + 1] * sums[s_ky + 1] / kn
            sxy = sums[s_ky + 4] - sums[s_ky + 1] * sums[s_ky + 2] / kn
            if sxx > 1e-9:
                lam = 0.5 * sxy / sxx  # half-ticks -> ticks per contract
        out[o + 1, i] = lam
        out[o + 2, i] = math.log1p(max(ts[i] - ints[_I_LAST_TS], 0) / 1e3)
        out[o + 3, i] = math.log1p(max(ts[i] - ints[_I_LAST_TRADE_TS], 0) / 1e3)
        out[o + 4, i] = math.log1p(max(ts[i] - ints[_I_LAST_MID_TS], 0) / 1e3)
        span = ts[i] - t_first
        out[o + 5, i] = math.log1p((cnt_r - 1) * 1e9 / span) if span > 0 else 0.0
        out[o + 6, i] = 1e4 * (apx[i, 0] - bpx[i, 0]) / (0.5 * (apx[i, 0] + bpx[i, 0]))
        o += 7
        for w in range(nd):
            k = drift_w[w]
            back = k if rows >= k else rows
            out[o, i] = 0.5 * (u - mid_ring[_back(dpos, back, D)])
            out[o + 1, i] = sums[s_chg + w]
            o += 2
        out[o, i] = math.log1p(rows)
        ints[_I_DPOS] = dpos + 1 if dpos + 1 < D else 0
        ints[_I_ROWS] = rows + 1
        ints[_I_LAST_TS] = ts[i]
        ints[_I_LAST_U] = u
    return 0


def snapshot_features(
    book: SnapshotBook, cfg: SnapshotFeatureConfig, state: SnapshotState | None = None
) -> tuple[F64, SnapshotState]:
    """Features of one chunk, ``[n, len(old_feature_names(cfg))]`` float64, and the state to pass
    with the next chunk (``state`` None: the start of a quarter). The chunk's rows must be
    time-ordered and every row must have a best bid and ask, not crossed (FxDataError names
    the first row that is not)."""
    n, lv = len(book), cfg.levels
    for name in ("breaks", "action", "side", "size"):
        if getattr(book, name).shape != (n,):
            raise FxDataError(f"snapshot chunk: {name} has shape {getattr(book, name).shape}, want ({n},)")
    for name in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        a = getattr(book, name)
        if a.ndim != 2 or a.shape[0] != n or a.shape[1] < lv or a.dtype != np.float64:
            raise FxDataError(f"snapshot chunk: {name} is {a.dtype} {a.shape}, want float64 [{n}, >= {lv}]")
    if n and bool((np.diff(book.ts) < 0).any()):
        raise FxDataError(
            f"snapshot chunk: ts not time-ordered at row {int(np.flatnonzero(np.diff(book.ts) < 0)[0]) + 1}"
        )
    b1, a1 = book.bid_px[:, 0], book.ask_px[:, 0]
    bad = ~(np.isfinite(b1) & np.isfinite(a1) & (a1 >= b1))
    if bool(bad.any()):
        j = int(np.flatnonzero(bad)[0])
        raise FxDataError(
            f"snapshot chunk: row {j} has no best bid/ask or is crossed ({b1[j]!r} / {a1[j]!r})"
        )
    st = new_state(cfg) if state is None else state
    out = np.empty((len(old_feature_names(cfg)), n))
    _snapshot_nb(
        np.ascontiguousarray(book.ts, dtype=np.int64), np.ascontiguousarray(book.breaks, dtype=np.int64),
        np.ascontiguousarray(book.action, dtype=np.uint8), np.ascontiguousarray(book.side, dtype=np.int8),
        np.ascontiguousarray(book.size, dtype=np.float64),
        book.bid_px, book.ask_px, book.bid_sz, book.ask_sz, book.bid_ct, book.ask_ct,
        lv, float(cfg.tick_size), np.asarray(cfg.flow_windows, dtype=np.int64), int(cfg.mlofi_window),
        np.asarray(cfg.trade_windows, dtype=np.int64), int(cfg.kyle_trades), float(cfg.vpin_bucket_volume),
        int(cfg.vpin_buckets), np.asarray(cfg.drift_windows, dtype=np.int64),
        st.ints, st.prev, st.ofi_ring, st.dep_ring, st.sums, st.trade_ring, st.mid_ring, st.chg_ring,
        st.ts_ring, st.vpin_ring, st.vpin_cur, out,
    )  # fmt: skip
    return out.T, st
