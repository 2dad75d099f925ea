"""Snapshot row unit, features: one row of causal features per MBP-10 update, in chunks.

Owns the per-update feature stack of reference/snapshot.md §2 (the bar row unit's features are
``bar_features`` and ``ofi``). Row ``n`` is one MBP-10 record of the active contract in
``ts_recv`` order (trade records, action ``T``, included); every value of row ``n`` reads rows
``<= n`` only. The scan is sequential, so it runs over chunks with its state carried in a
:class:`SnapshotState` (previous book, ring buffers, running sums, clocks): a quarter is
processed chunk by chunk in bounded memory, and the chunk size changes no value (tested bit
for bit). All state resets at a *break* (a change of the running break count: session
boundary or contract roll), so no window reads across one; windows that have not filled yet
since the break use the rows they have (``rows_since_break`` says how many).

Columns (``feature_names(cfg)``; each with its formula and unit in
:func:`snapshot_feature_registry`; prices in ticks unless stated; sizes in contracts):

- book state of the snapshot, the bar OFI stage's kernel (``ofi._book_state_nb``):
  ``book_<name>`` for the imbalances at 1 / 5 / 10 levels, weighted-mid and microprice offsets,
  slopes, depth-weighted distance imbalance, centre of mass, spread, order-count imbalance;
- ``ofi_k{K}``: best-level order-flow imbalance (Cont–Kukanov–Stoikov event form, e of each
  update against the previous one) summed over the last K updates, divided by the mean best
  depth (Q_b1 + Q_a1) / 2 over the same updates;
- ``mlofi_l{m}``: the same at level m (1..levels, by rank; a missing level is price ∓∞, size 0)
  over the last ``mlofi_window`` updates;
- ``tsv_k{K}``, ``timb_k{K}``, ``tcnt_k{K}``: over the last K trades, signed volume
  Σ s·v, its share Σ s·v / Σ v, and the count imbalance Σ s / K (s = +1 buyer-, −1 seller-
  initiated, 0 unknown);
- ``vpin``: mean of |B − S| / V over the last ``vpin_buckets`` full volume buckets of
  ``vpin_bucket_volume`` contracts (0 before the first bucket fills);
- ``kyle_lambda``: OLS slope of the mid change between consecutive trades (ticks) on the
  trade's signed size, over the last ``kyle_trades`` trades (ticks per contract; 0 without
  variance);
- ``log_dt_update_us``, ``log_dt_trade_us``, ``log_dt_mid_us``: log1p of the microseconds since
  the previous update, the last trade, the last mid change (0 at a break);
- ``log_event_rate_hz``: log1p of updates per second over the last ``rate_window`` updates;
- ``spread_bps``: 1e4 · spread / mid;
- ``drift_k{K}``: mid now minus mid K updates ago (ticks); ``midchg_k{K}``: mid changes among the
  last K updates;
- ``log_rows_since_break``: log1p of the updates since the last break.

Integer quantities (sizes, OFI terms, half-tick mids) are summed in float64 running sums, which
stay exact (integers below 2^53), so a long quarter does not drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit
from pydantic import Field, field_validator

from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.ofi import _BOOK_STATE_COLS, _book_state_nb, ofi_feature_registry

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

TRADE = ord("T")
_BIG = 1e18  # a missing level's price, bid side -BIG, ask side +BIG (size 0)


class SnapshotFeatureConfig(ConfigModel):
    """Parameters of the snapshot feature stack (windows in updates or trades)."""

    tick_size: float = Field(0.25, gt=0, description="Instrument tick (price units).")
    levels: int = Field(10, ge=1, le=10, description="Book levels read (MBP-10: up to 10).")
    flow_windows: list[int] = Field(
        default_factory=lambda: [10, 50, 200], description="OFI windows (updates)."
    )
    mlofi_window: int = Field(50, ge=1, description="Multi-level OFI window (updates).")
    trade_windows: list[int] = Field(default_factory=lambda: [10, 50], description="Trade windows (trades).")
    kyle_trades: int = Field(50, ge=3, description="Kyle's λ window (trades).")
    vpin_bucket_volume: float = Field(50.0, gt=0, description="VPIN volume bucket (contracts).")
    vpin_buckets: int = Field(20, ge=1, description="VPIN buckets averaged.")
    rate_window: int = Field(50, ge=1, description="Event-rate window (updates).")
    drift_windows: list[int] = Field(
        default_factory=lambda: [10, 100], description="Mid-drift windows (updates)."
    )

    @field_validator("flow_windows", "trade_windows", "drift_windows")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(k < 1 for k in v) or len(set(v)) != len(v):
            raise ValueError(f"windows must be distinct positive counts, got {v}")
        return v


def feature_names(cfg: SnapshotFeatureConfig) -> list[str]:
    """Output columns, in order (see the module docstring)."""
    return [
        *(f"book_{c}" for c in _BOOK_STATE_COLS),
        *(f"ofi_k{k}" for k in cfg.flow_windows),
        *(f"mlofi_l{m + 1}" for m in range(cfg.levels)),
        *(f"{p}_k{k}" for k in cfg.trade_windows for p in ("tsv", "timb", "tcnt")),
        "vpin",
        "kyle_lambda",
        "log_dt_update_us",
        "log_dt_trade_us",
        "log_dt_mid_us",
        "log_event_rate_hz",
        "spread_bps",
        *(f"{p}_k{k}" for k in cfg.drift_windows for p in ("drift", "midchg")),
        "log_rows_since_break",
    ]


@dataclass(frozen=True)
class SnapshotFeatureSpec:
    """Registry entry of one snapshot feature: its formula, unit and trailing reach."""

    name: str
    description: str
    unit: str
    window: str  # what the value reads: "this update", "last K updates", "last K trades", ...


def snapshot_feature_registry(cfg: SnapshotFeatureConfig | None = None) -> dict[str, SnapshotFeatureSpec]:
    """Every snapshot feature, in output column order (names depend on the config)."""
    c = cfg or SnapshotFeatureConfig()
    S = SnapshotFeatureSpec
    ofi_reg = ofi_feature_registry()
    reg = [
        S(
            f"book_{n}",
            f"{ofi_reg[n].description} — of this update's book",
            "see the OFI registry",
            "this update",
        )
        for n in _BOOK_STATE_COLS
    ]
    reg += [
        S(
            f"ofi_k{k}",
            "Σ e_n over the last K updates / mean (Qb_1 + Qa_1)/2 over them; e_n = CKS best-level term "
            "1{Pb≥Pb'}Qb − 1{Pb≤Pb'}Qb' − 1{Pa≤Pa'}Qa + 1{Pa≥Pa'}Qa' (' = the previous update), 0 at a break",
            "mean best depths",
            f"last {k} updates",
        )
        for k in c.flow_windows
    ]
    reg += [
        S(
            f"mlofi_l{m + 1}",
            f"level-{m + 1} CKS OFI (by rank; missing bid −∞, ask +∞, size 0) summed over the last K "
            "updates / mean best depth over them",
            "mean best depths",
            f"last {c.mlofi_window} updates",
        )
        for m in range(c.levels)
    ]
    for k in c.trade_windows:
        reg += [
            S(
                f"tsv_k{k}",
                "Σ s·v over the last K trades (s = +1 buyer-, −1 seller-initiated, 0 unknown)",
                "contracts",
                f"last {k} trades",
            ),
            S(
                f"timb_k{k}",
                "Σ s·v / Σ v over the last K trades (0 without volume)",
                "[−1, 1]",
                f"last {k} trades",
            ),
            S(
                f"tcnt_k{k}",
                "Σ s / (trades in the window) over the last K trades",
                "[−1, 1]",
                f"last {k} trades",
            ),
        ]
    reg += [
        S(
            "vpin",
            f"mean |B − S| / V over the last {c.vpin_buckets} full buckets of V = {c.vpin_bucket_volume:g} "
            "contracts, trades split across buckets (0 before the first bucket)",
            "[0, 1]",
            f"last {c.vpin_buckets} volume buckets",
        ),
        S(
            "kyle_lambda",
            "OLS slope of Δmid between consecutive trades on the trade's signed size (0 without variance)",
            "ticks per contract",
            f"last {c.kyle_trades} trades",
        ),
        S(
            "log_dt_update_us",
            "log1p(µs since the previous update); 0 at a break",
            "log µs",
            "last 2 updates",
        ),
        S(
            "log_dt_trade_us",
            "log1p(µs since the last trade, or the break)",
            "log µs",
            "since the last trade",
        ),
        S(
            "log_dt_mid_us",
            "log1p(µs since the last mid change, or the break)",
            "log µs",
            "since the last mid change",
        ),
        S(
            "log_event_rate_hz",
            "log1p((K − 1) / (ts_n − ts_{n−K+1})) over the last K updates",
            "log updates/s",
            f"last {c.rate_window} updates",
        ),
        S("spread_bps", "10⁴ · (Pa_1 − Pb_1) / mid", "basis points", "this update"),
    ]
    for k in c.drift_windows:
        reg += [
            S(f"drift_k{k}", "mid now − mid K updates ago (or at the break)", "ticks", f"last {k} updates"),
            S(
                f"midchg_k{k}",
                "updates among the last K whose mid differs from the previous update's",
                "count",
                f"last {k} updates",
            ),
        ]
    reg.append(
        S("log_rows_since_break", "log1p(updates since the last break)", "log count", "since the break")
    )
    out = {r.name: r for r in reg}
    assert list(out) == feature_names(c), "registry and kernel columns differ"
    return out


@dataclass
class SnapshotBook:
    """One chunk of MBP-10 records of the active contract, ts_recv order; arrays [n, >= levels].

    Prices float64 (price units, NaN = missing level), sizes and counts float64; ``action`` the
    DBN action byte (``T`` = trade), ``side`` +1 / -1 / 0 (aggressor of a trade), ``size`` the
    record's size (a trade's volume), ``breaks`` the running break count per row.
    """

    ts: I64
    breaks: I64
    action: npt.NDArray[np.uint8]
    side: npt.NDArray[np.int8]
    size: F64
    bid_px: F64
    ask_px: F64
    bid_sz: F64
    ask_sz: F64
    bid_ct: F64
    ask_ct: F64

    def __len__(self) -> int:
        return int(self.ts.shape[0])


@dataclass
class SnapshotState:
    """What the scan carries from one chunk to the next (all arrays; see ``new_state``)."""

    ints: I64  # counters and clocks, see _I_* below
    prev: F64  # [4, levels]: previous bid px, ask px, bid sz, ask sz
    ofi_ring: F64  # [R, levels] per-level OFI of the last R updates
    dep_ring: F64  # [R] best depth of the last R updates
    sums: F64  # running sums (layout: see _n_sums and the kernel's s_* offsets)
    trade_ring: F64  # [T, 4]: signed size, size, sign, mid change (half-ticks) since the previous trade
    mid_ring: I64  # [D] half-tick mids of the last D updates
    chg_ring: I64  # [D] 1 where the mid changed at that update
    ts_ring: I64  # [rate_window + 1]
    vpin_ring: F64  # [vpin_buckets] |B - S| / V of full buckets
    vpin_cur: F64  # [3]: buy, sell, volume of the open bucket


# integer state slots
_I_ROWS, _I_POS, _I_TRADES, _I_TPOS, _I_BREAK, _I_LAST_TS, _I_LAST_TRADE_TS = 0, 1, 2, 3, 4, 5, 6
_I_LAST_MID_TS, _I_LAST_U, _I_TRADE_U, _I_DPOS, _I_RPOS, _I_BUCKETS, _I_BPOS = 7, 8, 9, 10, 11, 12, 13
_N_INTS = 14


def _sizes(cfg: SnapshotFeatureConfig) -> tuple[int, int, int]:
    """Ring lengths, one longer than the longest window they serve."""
    r = max(max(cfg.flow_windows), cfg.mlofi_window) + 1
    t = max(max(cfg.trade_windows), cfg.kyle_trades) + 1
    d = max(cfg.drift_windows) + 1
    return r, t, d


def _n_sums(cfg: SnapshotFeatureConfig) -> int:
    # ofi + depth per flow window, mlofi per level + its depth, 3 per trade window, 5 Kyle sums,
    # mid changes per drift window, vpin sum
    return (
        2 * len(cfg.flow_windows)
        + cfg.levels
        + 1
        + 3 * len(cfg.trade_windows)
        + 5
        + len(cfg.drift_windows)
        + 1
    )


def new_state(cfg: SnapshotFeatureConfig) -> SnapshotState:
    """The state at the start of a quarter (everything reset; the first row is a break)."""
    r, t, d = _sizes(cfg)
    ints = np.zeros(_N_INTS, dtype=np.int64)
    ints[_I_BREAK] = np.iinfo(np.int64).min  # no break seen yet: the first row resets
    return SnapshotState(
        ints=ints,
        prev=np.zeros((4, cfg.levels)),
        ofi_ring=np.zeros((r, cfg.levels)),
        dep_ring=np.zeros(r),
        sums=np.zeros(_n_sums(cfg)),
        trade_ring=np.zeros((t, 4)),
        mid_ring=np.zeros(d, dtype=np.int64),
        chg_ring=np.zeros(d, dtype=np.int64),
        ts_ring=np.zeros(cfg.rate_window + 1, dtype=np.int64),
        vpin_ring=np.zeros(cfg.vpin_buckets),
        vpin_cur=np.zeros(3),
    )


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
    book: SnapshotBook,
    cfg: SnapshotFeatureConfig,
    state: SnapshotState | None = None,
    *,
    out: F64 | None = None,
) -> tuple[F64, SnapshotState]:
    """Features of one chunk, ``[n, len(feature_names(cfg))]`` float64, and the state to pass
    with the next chunk (``state`` None: the start of a quarter). The chunk's rows must be
    time-ordered and every row must have a best bid and ask, not crossed (FxDataError names
    the first row that is not). ``out``: a C-contiguous float64 ``[F, n]`` (feature-major)
    array to write into, reused from chunk to chunk (a fresh output per chunk page-faults
    every page again); the result is its transpose ``out.T``."""
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
    nf = len(feature_names(cfg))
    if out is None:
        out = np.empty((nf, n))
    elif out.shape != (nf, n) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise FxDataError(
            f"snapshot chunk: out is {out.dtype} {out.shape}, want C-contiguous float64 [{nf}, {n}]"
        )
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


def last_closed_bar(close_rows: npt.ArrayLike, n_rows: int, row0: int = 0) -> npt.NDArray[np.int64]:
    """For each snapshot row ``row0 .. row0 + n_rows - 1``, the index of the last bar *closed
    strictly before it*: bar j is closed for row n only if the row of its closing record is < n
    (an equal ``ts_recv`` is not "before", snapshot.md §4.2), else -1. ``close_rows`` are the bars'
    closing rows in the snapshot stream, increasing. Chunks pass their first row as ``row0``."""
    c = np.asarray(close_rows, dtype=np.int64)
    if c.ndim != 1 or (c.size > 1 and bool((np.diff(c) < 0).any())):
        raise FxDataError("last_closed_bar: close_rows must be a 1-D increasing array of row indices")
    rows = np.arange(row0, row0 + n_rows, dtype=np.int64)
    return np.searchsorted(c, rows, side="left").astype(np.int64) - 1


def bar_context(
    bar_values: F64, close_rows: npt.ArrayLike, n_rows: int, row0: int = 0
) -> tuple[F64, npt.NDArray[np.int64]]:
    """The features of each row's last closed bar (``bar_values[j]``, [n_bars, F]) joined as of
    strictly before the row, and that bar's index (-1: none yet, values 0)."""
    j = last_closed_bar(close_rows, n_rows, row0)
    v = np.asarray(bar_values, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] != np.asarray(close_rows).shape[0]:
        raise FxDataError(f"bar_context: {v.shape} bar values for {np.asarray(close_rows).shape[0]} bars")
    out = np.zeros((n_rows, v.shape[1]))
    has = j >= 0
    out[has] = v[j[has]]
    return out, j
