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
- ``mlofi_1to{L}_k{K}`` (L = 5 and 10, capped at ``levels``): the level terms e^(m) of
  ``mlofi_l{m}`` summed over levels 1..L and over the last K updates (each flow window),
  divided by the mean per-level depth Σ_(m≤L) (Q_bm + Q_am) / (2L) over the same updates
  (Xu–Gould–Howison's multi-level OFI, aggregated over levels);
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

The registry also documents the bar progress columns (:data:`BAR_PROGRESS_NAMES`, computed by
:func:`bar_progress` in ``snapshot_rows``, which knows the bars): how far the still-open bar
has got since the last closed bar's close (its trade volume over the closed bar's volume, the
time since the close, raw and over the closed bar's duration). ``docs/snapshot-features.md``
is the registry as a table (:func:`snapshot_feature_table`; a test keeps the two equal).

Integer quantities (sizes, OFI terms, half-tick mids) are summed in float64 running sums, which
stay exact (integers below 2^53), so a long quarter does not drift.

Speed (``benchmarks/bench_snapshot.py``), each step giving the same bits as a plain evaluation
(``fx_assets_tests/core/snapshot_reference.py`` is the previous kernel; a test compares them):
the book slopes resume at the first level (per side) that differs from the previous update
(most updates change one level) and the two sides' levels run side by side in one loop (two
independent dependency chains overlap), the book state's level sums are taken in the OFI level
loop (each row's levels read once), the trade-window, VPIN and Kyle outputs are computed on trade
rows only and repeated between them, divisions by a power-of-two tick are products, ``log1p``
of a zero clock is not called, the slopes' usual distances (half a tick to the mid, one tick
between levels) are not divided by, and each row is written once, straight into ``out`` (row
major: a caller-owned buffer reused from chunk to chunk, or the first columns of the caller's
fxcache block, so ``snapshot_rows`` copies nothing). A test pins the whole output's sha256 to
the bits of the kernel before these last steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit
from pydantic import Field, field_validator

from fx_assets.core import detmath
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.ofi import _BOOK_STATE_COLS, _log1p_nb, _ratio, ofi_feature_registry

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


def agg_levels(cfg: SnapshotFeatureConfig) -> list[int]:
    """Depths L of the level-aggregated OFI columns: 5 and 10, capped at ``cfg.levels``."""
    return sorted({min(5, cfg.levels), cfg.levels})


def feature_names(cfg: SnapshotFeatureConfig) -> list[str]:
    """Output columns, in order (see the module docstring)."""
    return [
        *(f"book_{c}" for c in _BOOK_STATE_COLS),
        *(f"ofi_k{k}" for k in cfg.flow_windows),
        *(f"mlofi_1to{lv}_k{k}" for k in cfg.flow_windows for lv in agg_levels(cfg)),
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


# Bar progress: how far the current, still-open bar has got, from the last closed bar
# (joined in ``snapshot_rows`` beside the bar context; :func:`bar_progress`).
BAR_PROGRESS_NAMES = ("bar_prog_volume", "bar_prog_log_time", "log_dt_bar_us")


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
            f"mlofi_1to{lv}_k{k}",
            f"Σ_(m≤{lv}) e^(m)_n summed over the last K updates (e^(m) the level-m CKS term of "
            f"mlofi_l<m>) / mean over them of the per-level depth Σ_(m≤{lv}) (Qb_m + Qa_m) / (2·{lv}) "
            "(Xu–Gould–Howison multi-level OFI aggregated over levels; missing levels size 0); 0 "
            "without depth",
            "mean per-level depths",
            f"last {k} updates",
        )
        for k in c.flow_windows
        for lv in agg_levels(c)
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
    reg += [
        S(
            "bar_prog_volume",
            "volume of the active contract's trades (the trades the bars are built from) with "
            "ts_recv ≤ this update's and > the last closed bar's ts_close / that bar's volume",
            "bars' volume (for volume bars ≈ volume / threshold)",
            "since the last closed bar",
        ),
        S(
            "bar_prog_log_time",
            "log1p(µs from the last closed bar's ts_close to this update) − log1p(that bar's duration in µs)",
            "log ratio",
            "since the last closed bar",
        ),
        S(
            "log_dt_bar_us",
            "log1p(µs from the last closed bar's ts_close to this update)",
            "log µs",
            "since the last closed bar",
        ),
    ]
    out = {r.name: r for r in reg}
    assert list(out) == [*feature_names(c), *BAR_PROGRESS_NAMES], "registry and kernel columns differ"
    return out


def snapshot_feature_table(cfg: SnapshotFeatureConfig | None = None) -> str:
    """The registry as the markdown table of ``docs/snapshot-features.md``."""
    rows = ["| column | formula | unit | reads |", "|---|---|---|---|"]
    for r in snapshot_feature_registry(cfg).values():
        cells = (f"`{r.name}`", r.description, r.unit, r.window)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def bar_progress(vol_since: F64, bar_volume: F64, elapsed_ns: I64, bar_duration_ns: I64) -> F64:
    """The :data:`BAR_PROGRESS_NAMES` columns, ``[n, 3]``, of rows whose last closed bar had
    ``bar_volume`` (contracts) and ``bar_duration_ns``, from the trade volume since its close
    (``vol_since``, contracts; trades at the close's own ts_recv count with the closed bar) and
    the ns since its ``ts_close`` (>= 0: the bar closed before the row; negatives, which only
    rows that are dropped for want of a closed bar can have, are clipped to 0). The stage
    writes these columns with ``snapshot_rows._join_bar_nb``, the same operations per row (a
    test compares the two bit for bit)."""
    v = np.maximum(np.asarray(vol_since, dtype=np.float64), 0.0)
    bv = np.asarray(bar_volume, dtype=np.float64)
    el_us = np.maximum(np.asarray(elapsed_ns, dtype=np.float64), 0.0) / 1e3
    du_us = np.maximum(np.asarray(bar_duration_ns, dtype=np.float64), 0.0) / 1e3
    out = np.empty((v.shape[0], len(BAR_PROGRESS_NAMES)))
    np.divide(v, bv, out=out[:, 0], where=bv > 0)
    out[bv <= 0, 0] = 0.0
    out[:, 2] = detmath.log1p(el_us)  # not np.log1p: its bits depend on the CPU (core.detmath)
    out[:, 1] = out[:, 2] - detmath.log1p(du_us)
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
    # [2, 5, levels]: per side, the slope loop's acc, cum, v, p and the level's term after each
    # level of the previous update's book, so an update that leaves the first k levels alone
    # resumes there (re-adding the cached terms when only the mid moved)
    slope: F64
    trade_out: F64  # [3 * trade windows + 2]: trade-window, VPIN and Kyle outputs of the last trade
    # [R, 2 * len(agg_levels)]: per aggregated depth L, Σ_(m≤L) e^(m) and Σ_(m≤L) (Qb_m + Qa_m)
    # of the last R updates
    agg_ring: F64


# integer state slots
_I_ROWS, _I_POS, _I_TRADES, _I_TPOS, _I_BREAK, _I_LAST_TS, _I_LAST_TRADE_TS = 0, 1, 2, 3, 4, 5, 6
_I_LAST_MID_TS, _I_LAST_U, _I_TRADE_U, _I_DPOS, _I_RPOS, _I_BUCKETS, _I_BPOS = 7, 8, 9, 10, 11, 12, 13
_I_SLOPE_NB, _I_SLOPE_NA = 14, 15  # levels the previous update's bid / ask slope loop processed
_N_INTS = 16


def _sizes(cfg: SnapshotFeatureConfig) -> tuple[int, int, int]:
    """Ring lengths, one longer than the longest window they serve."""
    r = max(max(cfg.flow_windows), cfg.mlofi_window) + 1
    t = max(max(cfg.trade_windows), cfg.kyle_trades) + 1
    d = max(cfg.drift_windows) + 1
    return r, t, d


def _n_sums(cfg: SnapshotFeatureConfig) -> int:
    # ofi + depth per flow window, mlofi per level + its depth, 3 per trade window, 5 Kyle sums,
    # mid changes per drift window, vpin sum, then (aggregated OFI, its depth) per flow window
    # and aggregated depth L
    return (
        2 * len(cfg.flow_windows)
        + cfg.levels
        + 1
        + 3 * len(cfg.trade_windows)
        + 5
        + len(cfg.drift_windows)
        + 1
        + 2 * len(cfg.flow_windows) * len(agg_levels(cfg))
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
        slope=np.zeros((2, 5, cfg.levels)),
        trade_out=np.zeros(3 * len(cfg.trade_windows) + 2),
        agg_ring=np.zeros((r, 2 * len(agg_levels(cfg)))),
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


@njit(cache=True, nogil=True, inline="always")
def _per_tick(x: float, tick: float, inv_tick: float) -> float:
    """x / tick; as x * (1 / tick) when the tick is a power of two (then the same bits: both
    are the correctly rounded x · 2^k), which spares a division (inv_tick 0: divide)."""
    if inv_tick > 0.0:
        return x * inv_tick
    return x / tick


@njit(cache=True, nogil=True, inline="always")
def _slope_start(cache, side, j, midch, nvalid, mid, tick, inv_tick):
    """Where ``ofi._side_slope_nb`` of this update resumes on one side: the loop state after
    level ``j - 1`` (levels < j of this side unchanged since the previous update, whose loop
    state is in ``cache[side]``). If the mid moved (``midch``), only level 0's term (its
    distance to the mid) is new: the cached terms of levels 1 .. j-1 are added again in order,
    without their logs and divisions. A term that is not added is stored as +0.0, and adding
    +0.0 changes no sum here (the sum is never -0.0). Returns (j, n, acc, cum, prev_v, prev_p)."""
    j = min(j, nvalid)
    if j == 0:
        return 0, 0, 0.0, 0.0, 0.0, 0.0
    if midch:
        d = _per_tick(abs(cache[side, 3, 0] - mid), tick, inv_tick)
        v = cache[side, 2, 0]
        t = 0.0
        if d == 0.5:
            t = v * 2.0
        elif d > 0.0:
            t = v / d
        acc = 0.0
        acc += t
        cache[side, 4, 0] = t
        cache[side, 0, 0] = acc
        for k in range(1, j):
            acc += cache[side, 4, k]
            cache[side, 0, k] = acc
    else:
        acc = cache[side, 0, j - 1]
    return j, j, acc, cache[side, 1, j - 1], cache[side, 2, j - 1], cache[side, 3, j - 1]


@njit(cache=True, nogil=True, inline="always")
def _slope_step(px, sz, i, k, mid, tick, inv_tick, cache, side, acc, cum, prev_v, prev_p):
    """Level ``k`` of ``ofi._side_slope_nb``'s loop on one side (the same operations in the same
    order), its loop state stored in ``cache[side, :, k]``; returns the new loop state."""
    p = px[i, k]
    cum += sz[i, k]
    v = _log1p_nb(cum)
    # the usual distances, half a tick to the mid and one tick between levels, need no
    # division: v / 0.5 is v * 2 and x / 1 is x, exactly (the same bits)
    t = 0.0
    if k == 0:
        d = _per_tick(abs(p - mid), tick, inv_tick)
        if d == 0.5:
            t = v * 2.0
        elif d > 0.0:
            t = v / d
    else:
        d = _per_tick(abs(p - prev_p), tick, inv_tick)
        if d > 0.0 and prev_v > 0.0:
            x = v / prev_v - 1.0
            t = x if d == 1.0 else x / d
    acc += t
    cache[side, 4, k] = t
    cache[side, 0, k] = acc
    cache[side, 1, k] = cum
    cache[side, 2, k] = v
    cache[side, 3, k] = p
    return acc, cum, v, p


@njit(cache=True, nogil=True, inline="always")
def _slopes_resume(bpx, apx, bsz, asz, i, levels, mid, tick, inv_tick, cache, jb, ja, midch, nvb, nva):
    """``ofi._side_slope_nb`` of row ``i`` for both sides, each resumed at its first changed
    level (``_slope_start``) and run to its first missing level. The two sides' levels are
    processed in one loop, side by side: each side's operations are the same and in the same
    order as alone (the same bits), but the two independent chains of log-lookups and
    divisions overlap (measured alone on the scale-1 quarter: 200 -> 110-145 ns per row for
    full recomputes, one loop per side vs both in one loop). Returns (bid slope, bid levels
    processed, ask slope, ask levels processed)."""
    kb, nb, accb, cumb, pvb, ppb = _slope_start(cache, 0, jb, midch, nvb, mid, tick, inv_tick)
    ka, na, acca, cuma, pva, ppa = _slope_start(cache, 1, ja, midch, nva, mid, tick, inv_tick)
    # a side is done at its first missing level (NaN price) or at ``levels``
    while kb < levels or ka < levels:
        if kb < levels:
            if bpx[i, kb] == bpx[i, kb]:
                accb, cumb, pvb, ppb = _slope_step(
                    bpx, bsz, i, kb, mid, tick, inv_tick, cache, 0, accb, cumb, pvb, ppb
                )
                kb += 1
                nb += 1
            else:
                kb = levels
        if ka < levels:
            if apx[i, ka] == apx[i, ka]:
                acca, cuma, pva, ppa = _slope_step(
                    apx, asz, i, ka, mid, tick, inv_tick, cache, 1, acca, cuma, pva, ppa
                )
                ka += 1
                na += 1
            else:
                ka = levels
    bsl = accb / nb if nb > 0 else math.nan
    asl = acca / na if na > 0 else math.nan
    return bsl, nb, asl, na


@njit(cache=True, nogil=True, inline="always")
def _book_state_row(
    bpx, apx, bsz, asz, i, levels, tick, inv_tick, slope, ints, jb, ja, midch,
    num5, den5, numl, denl, ctn, ctd, sb, sa, db, da, com, out,
):  # fmt: skip
    """``ofi._book_state_nb`` of row ``i`` into ``out[i, 0:12]`` (the same formulas, operation
    for operation), with the slopes resumed where the book did not change. The level sums
    (``num5`` .. ``com``) come from the kernel's level loop, which adds the same terms in the
    same level order as ``_book_state_nb``'s loop (so the same bits) while the row's levels are
    loaded for the OFI terms anyway (one pass over the row instead of two)."""
    pb = bpx[i, 0]
    pa = apx[i, 0]
    qb = bsz[i, 0]
    qa = asz[i, 0]
    mid = 0.5 * (pb + pa)
    s = pa - pb
    i1 = _ratio(qb - qa, qb + qa)
    out[i, 0] = i1
    out[i, 1] = _ratio(num5, den5)
    out[i, 2] = _ratio(numl, denl)
    out[i, 3] = 0.5 * i1 if s > 0.0 else 0.0
    out[i, 4] = _per_tick(i1 * (0.5 * s), tick, inv_tick)
    nvb = ints[_I_SLOPE_NB]
    nva = ints[_I_SLOPE_NA]
    bsl, nb, asl, na = _slopes_resume(
        bpx, apx, bsz, asz, i, levels, mid, tick, inv_tick, slope, jb, ja, midch, nvb, nva
    )
    ints[_I_SLOPE_NB] = nb
    ints[_I_SLOPE_NA] = na
    out[i, 5] = bsl
    out[i, 6] = asl
    out[i, 7] = _ratio(bsl - asl, bsl + asl)
    dbm = _ratio(db, sb)
    dam = _ratio(da, sa)
    out[i, 8] = _ratio(dam - dbm, dam + dbm)
    out[i, 9] = _per_tick(-_ratio(com, sb + sa), tick, inv_tick)
    out[i, 10] = _per_tick(s, tick, inv_tick)
    out[i, 11] = _ratio(ctn, ctd)


@njit(cache=True, nogil=True, inline="always")
def _log1p_us(dt_ns: int) -> float:
    """log1p(max(dt, 0) / 1e3): µs from ns; 0 without the libm call when dt <= 0 (log1p(0) is 0:
    the same bits; records of one event share their ts_recv)."""
    if dt_ns <= 0:
        return 0.0
    return math.log1p(dt_ns / 1e3)


# error_model="numpy": a float division by zero would give inf/NaN instead of raising, so numba
# emits no zero test and exception exit per division (the scan has ~40 per row); every division
# here is guarded (counts, depths and spans tested > 0, the tick > 0 by its config) except the
# mid of spread_bps, which snapshot_features checks (_check_chunk_nb). Same bits otherwise.
@njit(cache=True, nogil=True, error_model="numpy")
def _snapshot_nb(
    ts, brk, action, side, size, bpx, apx, bsz, asz, bct, act,
    levels, tick, inv_tick, flow_w, mlofi_k, trade_w, kyle_k, vb_vol, vb_n, drift_w, agg_lv,
    ints, prev, ofi_ring, dep_ring, sums, trade_ring, mid_ring, chg_ring, ts_ring, vpin_ring, vpin_cur,
    slope, trade_out, agg_ring, out,
):  # fmt: skip
    """The scan over one chunk; ``out`` is [n, F] (row-major; rows may be strided, each row's
    values contiguous), written row by row: one row is a few whole cache lines, written once.
    Rings are one longer than their longest window, so the value leaving window k is always
    ``ring[(pos - k) % size]``. The trade outputs change only on trade rows: computed there,
    kept in ``trade_out`` and repeated on the rows between (the same values a recomputation from
    the unchanged sums gives)."""
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
    s_ag = s_vp + 1  # (Σ e, Σ depth) per flow window and aggregated depth
    nag = agg_lv.shape[0]
    o_ag = 12 + nf  # first aggregated-OFI output column
    o_tr = 12 + nf + nf * nag + levels  # first trade output column
    n5 = min(5, levels)
    n_tr = 3 * ntw + 2
    for i in range(n):
        u = np.int64(math.floor(_per_tick(bpx[i, 0] + apx[i, 0], tick, inv_tick) + 0.5))  # half-ticks
        # ---- a break resets every window, clock and the previous book
        if brk[i] != ints[_I_BREAK]:
            ints[:] = 0
            ints[_I_BREAK] = brk[i]
            sums[:] = 0.0
            vpin_cur[:] = 0.0
            trade_out[:] = 0.0
            ints[_I_LAST_TS] = ts[i]
            ints[_I_LAST_TRADE_TS] = ts[i]
            ints[_I_LAST_MID_TS] = ts[i]
            ints[_I_LAST_U] = u
            ints[_I_TRADE_U] = u
        rows = ints[_I_ROWS]
        # ---- per-level OFI of this update (0 on the first row after a break); the first
        # level that differs from the previous update, per side, for the slopes
        midch = rows > 0 and bpx[i, 0] + apx[i, 0] != prev[0, 0] + prev[1, 0]
        jb = 0 if rows == 0 else levels
        ja = jb
        pos = ints[_I_POS]
        ce = 0.0  # Σ e^(m) and Σ (Qb_m + Qa_m) over the levels so far (integers: exact)
        cq = 0.0
        g = 0
        # the book state's level sums (_book_state_row), in ofi._book_state_nb's order
        mid = 0.5 * (bpx[i, 0] + apx[i, 0])
        num5 = 0.0
        den5 = 0.0
        numl = 0.0
        denl = 0.0
        ctn = 0.0
        ctd = 0.0
        sb = 0.0
        sa = 0.0
        db = 0.0
        da = 0.0
        com = 0.0
        for m in range(levels):
            rb = bpx[i, m]
            ra = apx[i, m]
            hb = rb == rb  # level present (not NaN)
            ha = ra == ra
            b = rb if hb else -_BIG
            a = ra if ha else _BIG
            qb = bsz[i, m] if hb else 0.0
            qa = asz[i, m] if ha else 0.0
            cb = bct[i, m] if hb else 0.0
            ca = act[i, m] if ha else 0.0
            if m < n5:
                num5 += qb - qa
                den5 += qb + qa
            numl += qb - qa
            denl += qb + qa
            ctn += cb - ca
            ctd += cb + ca
            if hb:
                sb += qb
                db += qb * (mid - rb)
                com += qb * (rb - mid)
            if ha:
                sa += qa
                da += qa * (ra - mid)
                com += qa * (ra - mid)
            if m < jb and (b != prev[0, m] or qb != prev[2, m]):
                jb = m
            if m < ja and (a != prev[1, m] or qa != prev[3, m]):
                ja = m
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
            ce += e
            cq += qb + qa
            if g < nag and m + 1 == agg_lv[g]:
                agg_ring[pos, 2 * g] = ce
                agg_ring[pos, 2 * g + 1] = cq
                g += 1
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
        for w in range(nf):
            old = _back(pos, flow_w[w], R)
            for g in range(2 * nag):
                j = s_ag + 2 * nag * w + g
                if rows >= flow_w[w]:
                    sums[j] -= agg_ring[old, g]
                sums[j] += agg_ring[pos, g]
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
            # the trade outputs, until the next trade
            nt = ints[_I_TRADES]
            for w in range(ntw):
                cnt = min(nt, trade_w[w])
                sv = sums[s_tr + 3 * w]
                vol = sums[s_tr + 3 * w + 1]
                trade_out[3 * w] = sv
                trade_out[3 * w + 1] = sv / vol if vol > 0 else 0.0
                trade_out[3 * w + 2] = sums[s_tr + 3 * w + 2] / cnt if cnt > 0 else 0.0
            nb = ints[_I_BUCKETS]
            trade_out[3 * ntw] = sums[s_vp] / min(nb, vb_n) if nb > 0 else 0.0
            kn = sums[s_ky]
            lam = 0.0
            if kn >= 3:
                sxx = sums[s_ky + 3] - sums[s_ky + 1] * sums[s_ky + 1] / kn
                sxy = sums[s_ky + 4] - sums[s_ky + 1] * sums[s_ky + 2] / kn
                if sxx > 1e-9:
                    lam = 0.5 * sxy / sxx  # half-ticks -> ticks per contract
            trade_out[3 * ntw + 1] = lam
        # ---- event rate over the last min(rows + 1, RK - 1) updates
        rpos = ints[_I_RPOS]
        ts_ring[rpos] = ts[i]
        cnt_r = min(rows + 1, RK - 1)
        t_first = ts_ring[_back(rpos, (cnt_r - 1), RK)]
        ints[_I_RPOS] = rpos + 1 if rpos + 1 < RK else 0
        # ---- outputs of row i
        _book_state_row(
            bpx, apx, bsz, asz, i, levels, tick, inv_tick, slope, ints, jb, ja, midch,
            num5, den5, numl, denl, ctn, ctd, sb, sa, db, da, com, out,
        )  # fmt: skip
        o = 12
        for w in range(nf):
            md = sums[s_dep + w] / min(rows + 1, flow_w[w])
            out[i, o] = sums[w] / md if md > 0 else 0.0
            o += 1
        for w in range(nf):
            cnt_w = min(rows + 1, flow_w[w])
            for g in range(nag):
                j = s_ag + 2 * nag * w + 2 * g
                # Σ e / (Σ depth / (2 L · updates)): the mean per-level depth, one division
                dq = sums[j + 1]
                out[i, o_ag + nag * w + g] = sums[j] * (cnt_w * 2.0 * agg_lv[g]) / dq if dq > 0 else 0.0
        o = o_ag + nf * nag
        md = sums[s_mld] / min(rows + 1, mlofi_k)
        if md > 0:
            for m in range(levels):
                out[i, o + m] = sums[s_ml + m] / md
        else:
            for m in range(levels):
                out[i, o + m] = 0.0
        for c in range(n_tr):
            out[i, o_tr + c] = trade_out[c]
        o = o_tr + n_tr
        out[i, o] = _log1p_us(ts[i] - ints[_I_LAST_TS])
        out[i, o + 1] = _log1p_us(ts[i] - ints[_I_LAST_TRADE_TS])
        out[i, o + 2] = _log1p_us(ts[i] - ints[_I_LAST_MID_TS])
        span = ts[i] - t_first
        out[i, o + 3] = math.log1p((cnt_r - 1) * 1e9 / span) if span > 0 else 0.0
        out[i, o + 4] = 1e4 * (apx[i, 0] - bpx[i, 0]) / (0.5 * (apx[i, 0] + bpx[i, 0]))
        o += 5
        for w in range(nd):
            k = drift_w[w]
            back = k if rows >= k else rows
            out[i, o] = 0.5 * (u - mid_ring[_back(dpos, back, D)])
            out[i, o + 1] = sums[s_chg + w]
            o += 2
        out[i, o] = _log1p_nb(rows)
        ints[_I_DPOS] = dpos + 1 if dpos + 1 < D else 0
        ints[_I_ROWS] = rows + 1
        ints[_I_LAST_TS] = ts[i]
        ints[_I_LAST_U] = u
    return 0


@njit(cache=True, nogil=True)
def _check_chunk_nb(ts, bid1, ask1):
    """The chunk's preconditions in one pass: (first row whose ts is below the previous row's,
    first row without a finite best bid and ask, crossed, or with a zero mid: spread_bps divides
    by it), each -1 if none."""
    bad_ts = -1
    bad_touch = -1
    for i in range(ts.shape[0]):
        if bad_ts < 0 and i > 0 and ts[i] < ts[i - 1]:
            bad_ts = i
        b = bid1[i]
        a = ask1[i]
        if bad_touch < 0 and not (math.isfinite(b) and math.isfinite(a) and a >= b and a + b != 0.0):
            bad_touch = i
    return bad_ts, bad_touch


def _inv_tick(tick: float) -> float:
    """1 / tick where the tick is a power of two (x / tick == x * (1 / tick) bit for bit), else 0."""
    m, _ = math.frexp(tick)
    return 1.0 / tick if m == 0.5 else 0.0


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
    the first row that is not). ``out``: a float64 ``[n, F]`` array to write into (the
    result is ``out``), reused from chunk to chunk (a fresh output per chunk page-faults every
    page again); its rows may be strided (each row's F values contiguous), so the caller's
    wider row-major block, ``block[:, :F]``, is written in place without a copy."""
    n, lv = len(book), cfg.levels
    for name in ("breaks", "action", "side", "size"):
        if getattr(book, name).shape != (n,):
            raise FxDataError(f"snapshot chunk: {name} has shape {getattr(book, name).shape}, want ({n},)")
    for name in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        a = getattr(book, name)
        if a.ndim != 2 or a.shape[0] != n or a.shape[1] < lv or a.dtype != np.float64:
            raise FxDataError(f"snapshot chunk: {name} is {a.dtype} {a.shape}, want float64 [{n}, >= {lv}]")
    ts = np.ascontiguousarray(book.ts, dtype=np.int64)
    b1, a1 = book.bid_px[:, 0], book.ask_px[:, 0]
    # one compiled pass (the NumPy checks it replaces made six passes and temporaries: ~5% of
    # the scan's time)
    bad_ts, bad_touch = _check_chunk_nb(ts, b1, a1)
    if bad_ts >= 0:
        raise FxDataError(f"snapshot chunk: ts not time-ordered at row {bad_ts}")
    if bad_touch >= 0:
        j = int(bad_touch)
        raise FxDataError(
            f"snapshot chunk: row {j} has no best bid/ask, is crossed or has a zero mid ({b1[j]!r} / {a1[j]!r})"
        )
    st = new_state(cfg) if state is None else state
    nf = len(feature_names(cfg))
    if out is None:
        out = np.empty((n, nf))
    elif (
        out.ndim != 2
        or out.shape != (n, nf)
        or out.dtype != np.float64
        or not out.flags.writeable
        or (nf > 1 and out.strides[1] != 8)
        or (n > 1 and out.strides[0] < 8 * nf)
    ):
        raise FxDataError(
            f"snapshot chunk: out is {out.dtype} {out.shape} strides {out.strides}, want float64 "
            f"[{n}, {nf}] with contiguous rows"
        )
    _snapshot_nb(
        ts, np.ascontiguousarray(book.breaks, dtype=np.int64),
        np.ascontiguousarray(book.action, dtype=np.uint8), np.ascontiguousarray(book.side, dtype=np.int8),
        np.ascontiguousarray(book.size, dtype=np.float64),
        book.bid_px, book.ask_px, book.bid_sz, book.ask_sz, book.bid_ct, book.ask_ct,
        lv, float(cfg.tick_size), _inv_tick(float(cfg.tick_size)), np.asarray(cfg.flow_windows, dtype=np.int64), int(cfg.mlofi_window),
        np.asarray(cfg.trade_windows, dtype=np.int64), int(cfg.kyle_trades), float(cfg.vpin_bucket_volume),
        int(cfg.vpin_buckets), np.asarray(cfg.drift_windows, dtype=np.int64),
        np.asarray(agg_levels(cfg), dtype=np.int64),
        st.ints, st.prev, st.ofi_ring, st.dep_ring, st.sums, st.trade_ring, st.mid_ring, st.chg_ring,
        st.ts_ring, st.vpin_ring, st.vpin_cur, st.slope, st.trade_out, st.agg_ring, out,
    )  # fmt: skip
    return out, st


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
