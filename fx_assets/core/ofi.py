"""Order-flow-imbalance (OFI) and order-book feature kernels (pure numba/numpy, no Dagster).

Owns the per-bar microstructure features of the ``ofi_features`` stage: Cont–Kukanov–Stoikov
best-level OFI, multi-level OFI (Xu–Gould–Howison, Cont–Cucuringu–Zhang normalisation), book
state at the bar close (imbalances, weighted mid, slopes, centre of mass, spread), flow
toxicity (VPIN, Kyle's λ, trade imbalance), activity (event rate, Hawkes-type intensity,
realised variance of the mid, queue depletion) and their lag-1 deltas; the feature registry
(`ofi_feature_registry`), the config (`OfiConfig`) and the validator (`validate_ofi`).
Formulas follow ``shared/reference/microstructure.md`` §0, §2, §3, §4.

Causality (rule C). Bar j (close ``τ_j = bar_ts_close[j]``) uses the book snapshots and trades
with ``ts ∈ (τ_{j-1}, τ_j]`` (its own formation window), per-bar results of earlier bars of
the same reset segment, and the book *as of* ``τ_j`` (last valid snapshot with ts ≤ τ_j). An
event at ``τ_j + 1 ns`` belongs to bar j+1. Window boundaries come from
``searchsorted(ts, τ, side="right")`` — one line, tested by the anti-regression test.

Resets. A reset segment starts at bar 0 of the call, at every change of ``bar_instrument``
(a roll) and wherever the caller's ``bar_reset`` is true. Nothing crosses a reset: the first
valid snapshot after it has no predecessor (e = 0), and every trailing window (Kyle, trade
imbalance, Hawkes, VPIN volume, deltas) starts again.

Design: two passes, both sharded over contiguous bar ranges on a thread pool calling
``nogil`` kernels.
  0. *Input pass* (wrapper): one numba pass per input validates it (book sharded over rows,
     also flagging valid snapshots; trades sequential, also filling the cumulative volume and
     signed volume that VPIN reads), and the bar windows come from a galloping merge search.
  1. *Event pass* (`_event_pass_nb`): per bar, sums over its own window's events (OFI terms,
     depths, queue depletion, realised variance, trade volumes, the bar-local Hawkes sum),
     the index and ln(mid) of the as-of snapshot, and the book-state features of that
     snapshot (computed here while its row is in cache). The only state is the previous
     valid snapshot; a shard rebuilds it at its first bar by scanning back to the last valid
     snapshot of the segment (this is the shard's warm-up; it reads, it does not recompute).
  2. *Bar pass* (`_bar_pass_nb`): per bar, every trailing feature recomputed *from scratch*
     from the per-bar sums of the last ``w`` bars of the segment (Kyle OLS, trade imbalance,
     Hawkes) — no running sums, so no rounding drift — and VPIN from the cumulative (signed)
     volume arrays. VPIN's bucket boundaries only move forward within a segment, so each is
     found by a short forward search from its position at the previous bar (a full search
     at a shard's first bar); the position found is the unique searchsorted answer, so this
     is a speed-up only. Where a boundary is an integer volume (integer sizes and bucket
     volume: the sidecar's case), its value F (cumulative signed volume at that volume, a
     function of the volume alone within the segment) is read from a ring filled once per
     volume as the bars advance, instead of searched for at each of the ~n·V/bar-volume bars
     that reach it: the same value, bit for bit. When every size of the call and V are
     integers (below 2^52), each bucket term is an exact integer and their sum exact in any
     order, so the n-term sum is one difference of running sums along the volume's residue
     class mod V, kept in a second ring (the comb): two loads per bar, bit for bit the loop.
     Hawkes terms whose exp underflows to exactly 0.0 (a prefix of the window: the closes
     ascend) are skipped; they add +0.0 to a sum that starts at +0.0.
  Every output of bar j is therefore a pure function of (input arrays, j): the sharded result
  equals the sequential one bit for bit for any number of shards. The equivalent
  "replay W bars" warm-up is what a *caller* needs across partitions: `ofi_warmup_bars`
  says how many trailing bars of the previous partition to pass (with ``n_warmup``).

VPIN buckets are anchored at the bar close: the most recent bucket ends at the cumulative
volume of the last trade ≤ τ_j, and the n buckets of exactly V contracts before it are cut
pro-rata inside trades. VPIN_j thus always measures exactly the last n·V contracts, and does
not depend on where the history (partition, shard) started — only on having n·V contracts of
the segment before τ_j (NaN before).

Units: prices in price units (float, NaN for a missing level), sizes and counts in contracts
/ orders (float64), timestamps int64 ns, tick size in price units.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit
from pydantic import Field, model_validator

from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.tables import array_of, numpy_of

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

FORMAT_VERSION = "1"
NS_PER_S = 1e9
MIN_DURATION_S = 1e-6  # floor of the bar window length: volume bars may close at the same ns
_EPS = 1e-12

# ---------------------------------------------------------------------------------------------
# Config and registry
# ---------------------------------------------------------------------------------------------


class OfiConfig(ConfigModel):
    """Parameters of the OFI / book feature kernels (frozen; part of the cache identity)."""

    tick_size: float = Field(
        0.25,
        gt=0,
        description="Minimum price increment of the contract, in index points (0.25 for ES and NQ); "
        "the unit of the *_ticks features. A contract property, not inferred from the data (inferring "
        "it from a quarter would let later records change earlier bars); book prices off this grid "
        "are an error.",
    )
    levels: int = Field(
        10,
        ge=5,
        le=10,
        description="Book levels used (by rank, 1 = best). mlofi_1_10 / depth_imbalance_10 / "
        "slopes / centre of mass use levels 1..levels; mlofi_1_5 and depth_imbalance_5 use 1..5.",
    )
    vpin_bucket_volume: float = Field(
        1000.0,
        gt=0,
        description="VPIN bucket size V in contracts (ELO: ADV/50; set per symbol).",
    )
    vpin_buckets: int = Field(50, ge=1, description="Number n of VPIN buckets (dimensionless).")
    kyle_window: int = Field(50, ge=3, description="Kyle's λ rolling OLS window, in bars.")
    kyle_min_bars: int = Field(
        20, ge=3, description="Minimum valid (x, y) bars in the Kyle window; fewer gives NaN."
    )
    trade_imbalance_windows: list[int] = Field(
        default_factory=lambda: [1, 5, 20],
        description="Trade-imbalance windows, in bars (one feature trade_imbalance_<w> each).",
    )
    rv_return_scale: float = Field(
        1e4,
        gt=0,
        description="Multiplier of Δln(mid) in mid_realized_var and Kyle's y "
        "(1e4: basis points, so RV is in bps²).",
    )
    hawkes_decay_s: float = Field(
        1.0, gt=0, description="Decay time δ of the exponential event-intensity kernel, seconds."
    )
    hawkes_bars: int = Field(
        50,
        ge=1,
        description="Truncation of the intensity kernel, in bars: events of the last hawkes_bars "
        "bars (of the segment) count; makes the value reproducible from a finite warm-up.",
    )
    warmup_bars: int | None = Field(
        None,
        ge=1,
        description="Bars a caller replays before a partition (bars). None: derived, "
        "max(kyle_window, max trade-imbalance window, hawkes_bars) + 1. VPIN additionally "
        "needs vpin_buckets·vpin_bucket_volume contracts: see ofi_warmup_bars().",
    )
    n_shards: int = Field(
        0,
        ge=0,
        description="Contiguous bar shards per pass (0: 4 × the call's threads, 1 with one thread; "
        "capped by bars).",
    )
    n_workers: int = Field(
        0, ge=0, description="Threads running the nogil kernels (0: numba's thread count)."
    )

    @model_validator(mode="after")
    def _check(self) -> OfiConfig:
        if self.kyle_min_bars > self.kyle_window:
            raise ValueError("kyle_min_bars must be <= kyle_window")
        if not self.trade_imbalance_windows or min(self.trade_imbalance_windows) < 1:
            raise ValueError("trade_imbalance_windows must be non-empty positive bar counts")
        if len(set(self.trade_imbalance_windows)) != len(self.trade_imbalance_windows):
            raise ValueError("trade_imbalance_windows must be distinct")
        return self

    @property
    def effective_warmup_bars(self) -> int:
        """Warm-up in bars that fills every bar-count window (and the lag-1 deltas)."""
        if self.warmup_bars is not None:
            return self.warmup_bars
        return max(self.kyle_window, max(self.trade_imbalance_windows), self.hawkes_bars) + 1

    @property
    def workers(self) -> int:
        return self.n_workers if self.n_workers > 0 else int(numba.get_num_threads())


@dataclass(frozen=True)
class OfiFeatureSpec:
    """Registry entry of one OFI feature.

    ``signed``: flips sign under the mirror (bid↔ask, p → 2c − p, trade signs flipped).
    ``mirror_partner``: the feature it turns into under the mirror (bid_slope ↔ ask_slope).
    ``log_price``: built from ln(mid), so the additive price mirror holds only to O(Δp/p).
    ``nan_prefix``: NaN allowed in a leading run of each reset segment (warm-up), never later.
    """

    name: str
    description: str
    window: int  # trailing bars the value depends on (0: book as of τ_j only)
    lower: float
    upper: float
    signed: bool
    mirror_partner: str | None = None
    log_price: bool = False
    nan_prefix: bool = False

    @property
    def bounds(self) -> tuple[float, float] | None:
        """Documented closed range, None when any finite value is allowed (as bar_features)."""
        if math.isinf(self.lower) and math.isinf(self.upper):
            return None
        return (self.lower, self.upper)


_INF = math.inf

# Kernel column order of the bar pass (trade-imbalance columns follow, one per window).
_BASE_COLS = (
    "ofi_l1",
    "ofi_l1_norm",
    "mlofi_1_5",
    "mlofi_1_10",
    "l1_imbalance",
    "depth_imbalance_5",
    "depth_imbalance_10",
    "weighted_mid_offset",
    "microprice_offset",
    "bid_slope",
    "ask_slope",
    "slope_imbalance",
    "book_com_asymmetry",
    "book_com_offset",
    "spread_ticks",
    "order_count_imbalance",
    "vpin",
    "kyle_lambda",
    "queue_depletion_asymmetry",
    "mid_realized_var",
    "event_rate",
    "hawkes_intensity",
    "log_bar_duration",
    "n_book_events",
    "n_trades",
)
_N_BASE = len(_BASE_COLS)
_BOOK_STATE_COLS = _BASE_COLS[4:16]  # written by _book_state_nb, in this order
_DELTA_OF = ("ofi_l1_norm", "mlofi_1_5", "mlofi_1_10", "l1_imbalance", "depth_imbalance_5")


def _kernel_names(cfg: OfiConfig) -> list[str]:
    names = list(_BASE_COLS)
    names[names.index("vpin")] = f"vpin_{cfg.vpin_buckets}"
    names[names.index("kyle_lambda")] = f"kyle_lambda_{cfg.kyle_window}"
    names += [f"trade_imbalance_{w}" for w in cfg.trade_imbalance_windows]
    return names


def ofi_feature_registry(config: OfiConfig | None = None) -> dict[str, OfiFeatureSpec]:
    """Registry of every OFI feature, in output column order (names depend on the config)."""
    c = config or OfiConfig()
    L = c.levels
    S = OfiFeatureSpec
    reg = [
        S(
            "ofi_l1",
            "CKS best-level OFI Σ_n e_n over the bar's snapshots (contracts); "
            "e_n = 1{Pb≥Pb'}Qb − 1{Pb≤Pb'}Qb' − 1{Pa≤Pa'}Qa + 1{Pa≥Pa'}Qa' (' = previous valid "
            "snapshot); e = 0 at the first snapshot after a reset; 0 for a bar without snapshots",
            1,
            -_INF,
            _INF,
            True,
        ),
        S(
            "ofi_l1_norm",
            "ofi_l1 / mean over the bar's snapshots of (Qb_1+Qa_1)/2; 0 when the bar "
            "has no snapshot or zero mean depth",
            1,
            -_INF,
            _INF,
            True,
        ),
        S(
            "mlofi_1_5",
            "Σ_{m=1..5} OFI^(m) / Q̄^5, OFI^(m) = level-m CKS OFI (XGH; missing bid "
            "price −∞, ask +∞, size 0), Q̄^5 = mean over levels 1..5 and the bar's snapshots of "
            "(Qb_m+Qa_m)/2 (CCZ); 0 when Q̄ = 0",
            1,
            -_INF,
            _INF,
            True,
        ),
        S("mlofi_1_10", f"as mlofi_1_5 over levels 1..{L}", 1, -_INF, _INF, True),
        S(
            "l1_imbalance",
            "I_1 = (Qb_1−Qa_1)/(Qb_1+Qa_1) as of τ_j; 0 if no size",
            0,
            -1.0,
            1.0,
            True,
            nan_prefix=True,
        ),
        S(
            "depth_imbalance_5",
            "Σ_{k≤5}(Qb_k−Qa_k)/Σ_{k≤5}(Qb_k+Qa_k) (w_k = 1) as of τ_j",
            0,
            -1.0,
            1.0,
            True,
            nan_prefix=True,
        ),
        S(
            "depth_imbalance_10",
            f"as depth_imbalance_5 over levels 1..{L}",
            0,
            -1.0,
            1.0,
            True,
            nan_prefix=True,
        ),
        S(
            "weighted_mid_offset",
            "(m_w − m)/s = I_1/2, m_w = (Qb_1·Pa_1+Qa_1·Pb_1)/(Qb_1+Qa_1), "
            "s = Pa_1 − Pb_1; 0 for a locked book",
            0,
            -0.5,
            0.5,
            True,
            nan_prefix=True,
        ),
        S(
            "microprice_offset",
            "weighted-mid microprice adjustment (m_w − m)/tick = I_1·s/(2·tick) "
            "(no fitted g-table: parameter-free, hence causal)",
            0,
            -_INF,
            _INF,
            True,
            nan_prefix=True,
        ),
        S(
            "bid_slope",
            "Næs–Skjeltorp bid slope with distances in ticks: (1/N)[v_1/|Pb_1−m| + "
            "Σ_{τ<N}(v_{τ+1}/v_τ − 1)/|Pb_{τ+1}−Pb_τ|], v_τ = ln(1 + cum size to τ); N present "
            "levels; pairs with equal prices skipped",
            0,
            0.0,
            _INF,
            False,
            "ask_slope",
            nan_prefix=True,
        ),
        S("ask_slope", "as bid_slope on the ask side", 0, 0.0, _INF, False, "bid_slope", nan_prefix=True),
        S(
            "slope_imbalance",
            "(bid_slope − ask_slope)/(bid_slope + ask_slope); 0 if both 0",
            0,
            -1.0,
            1.0,
            True,
            nan_prefix=True,
        ),
        S(
            "book_com_asymmetry",
            "(D^a − D^b)/(D^a + D^b), D^b = ΣQb_k(m−Pb_k)/ΣQb_k, D^a = "
            "ΣQa_k(Pa_k−m)/ΣQa_k over present levels; positive = bid depth closer to the mid",
            0,
            -1.0,
            1.0,
            True,
            nan_prefix=True,
        ),
        S(
            "book_com_offset",
            "(m − P_com)/tick, P_com = Σ(Qb_k·Pb_k+Qa_k·Pa_k)/Σ(Qb_k+Qa_k); at one "
            "level equals microprice_offset (COM_1 − m = −(m_w − m))",
            0,
            -_INF,
            _INF,
            True,
            nan_prefix=True,
        ),
        S("spread_ticks", "(Pa_1 − Pb_1)/tick as of τ_j", 0, 0.0, _INF, False, nan_prefix=True),
        S(
            "order_count_imbalance",
            "Σ_k(Cb_k − Ca_k)/Σ_k(Cb_k + Ca_k) over present levels (order counts) as of τ_j; 0 if no orders",
            0,
            -1.0,
            1.0,
            True,
            nan_prefix=True,
        ),
        S(
            f"vpin_{c.vpin_buckets}",
            f"Σ_{{k<n}}|V^B_k − V^S_k|/(n·V), n = {c.vpin_buckets} buckets of "
            f"V = {c.vpin_bucket_volume:g} contracts ending at the cumulative volume of τ_j, "
            "trades split pro-rata, aggressor-signed (unknown sign: volume without imbalance); "
            "NaN until n·V contracts since the reset",
            0,
            0.0,
            1.0,
            False,
            nan_prefix=True,
        ),
        S(
            f"kyle_lambda_{c.kyle_window}",
            f"OLS slope (with intercept) of y = Δln m_j·"
            f"{c.rv_return_scale:g} on x = Σ b_i v_i (signed contracts) over the last "
            f"{c.kyle_window} bars of the segment with both mids; NaN below {c.kyle_min_bars} "
            "bars or var(x) ≈ 0",
            c.kyle_window,
            -_INF,
            _INF,
            False,
            log_price=True,
            nan_prefix=True,
        ),
        S(
            "queue_depletion_asymmetry",
            "(D_a − D_b)/(D_a + D_b) over the bar's L1 transitions: "
            "D_b += max(Qb'−Qb, 0) if Pb = Pb', += Qb' if Pb < Pb' (queue consumed); D_a "
            "likewise with Pa > Pa'; 0 if no depletion; positive = ask queue depleted more",
            1,
            -1.0,
            1.0,
            True,
        ),
        S(
            "mid_realized_var",
            f"Σ (Δln m·{c.rv_return_scale:g})² over consecutive valid snapshots "
            "of the bar (first increment from the previous bar's last snapshot)",
            1,
            0.0,
            _INF,
            False,
            log_price=True,
        ),
        S(
            "event_rate",
            "(valid book snapshots + trades in the window)/window length, events/s; "
            f"window (τ_{{j−1}}, τ_j] floored at {MIN_DURATION_S:g} s",
            1,
            0.0,
            _INF,
            False,
            nan_prefix=True,
        ),
        S(
            "hawkes_intensity",
            f"Σ_i exp(−(τ_j − t_i)/δ)/δ over book+trade events of the last "
            f"{c.hawkes_bars} bars of the segment, δ = {c.hawkes_decay_s:g} s (events/s)",
            c.hawkes_bars,
            0.0,
            _INF,
            False,
        ),
        S(
            "log_bar_duration",
            f"ln(max(τ_j − τ_{{j−1}}, {MIN_DURATION_S:g} s)/1 s); NaN for the "
            "first bar of a call without ts_window_start",
            1,
            -_INF,
            _INF,
            False,
            nan_prefix=True,
        ),
        S("n_book_events", "valid book snapshots in the window (count)", 1, 0.0, _INF, False),
        S("n_trades", "trades in the window (count)", 1, 0.0, _INF, False),
    ]
    reg += [
        S(
            f"trade_imbalance_{w}",
            f"Σ(V^B − V^S)/ΣV over the last {w} bars of the segment "
            "(unknown-sign volume counts in ΣV); 0 if ΣV = 0",
            w,
            -1.0,
            1.0,
            True,
        )
        for w in c.trade_imbalance_windows
    ]
    bounds = {s.name: s for s in reg}
    for base in _DELTA_OF:
        b = bounds[base]
        span = b.upper - b.lower
        reg.append(
            S(
                f"d_{base}",
                f"{base}[j] − {base}[j−1] (same segment; NaN at its first bar)",
                2,
                -span,
                span,
                b.signed,
                nan_prefix=True,
            )
        )
    return {s.name: s for s in reg}


# ---------------------------------------------------------------------------------------------
# Inputs and outputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BookArrays:
    """MBP snapshots of the active contract, ts_recv order. Arrays [n, ≥levels], C order.

    Prices float64 in price units, NaN for a missing level; sizes (contracts) and order counts
    float64 (other numeric dtypes are converted, which copies). A snapshot whose best bid or
    ask is missing, or which is crossed (Pb_1 > Pa_1), is dropped (§0 cleaning).
    """

    ts: I64
    bid_px: F64
    ask_px: F64
    bid_sz: F64
    ask_sz: F64
    bid_ct: F64
    ask_ct: F64


@dataclass(frozen=True)
class UnsignedSizeBook(BookArrays):
    """``BookArrays`` whose sizes and counts were converted from unsigned integers (as
    ``book._book_rows`` gathers them from the sidecar): finite and ≥ 0 by construction, so
    ``compute_ofi_features`` skips their per-level check (a read of all four matrices). The
    ts order and everything else are checked as for any book."""


@dataclass(frozen=True)
class TradeArrays:
    """Trades of the active contract, ts_recv order: size ≥ 0 (contracts), sign ∈ {+1, −1, 0}.
    ``price`` is not read by the kernels (None: not loaded, see ``stages.TradeFlow``)."""

    ts: I64
    price: F64 | None
    size: F64
    sign: npt.NDArray[np.int8]


@dataclass(frozen=True)
class PreparedTrades(TradeArrays):
    """``TradeArrays`` written out of a trades sidecar (``active_contract.TradeSidecar``) with
    their cumulative volume and signed volume (``cumv``, ``cumd``: the additions of
    ``_trade_prep_nb``, in its order, made while the trades were written). What the sidecar
    gives them makes ``_trade_prep_nb``'s checks hold by construction (``ts`` in order: the
    sidecar's ``ts_recv`` was checked; sizes integers > 0 from ``uint32``; signs in {-1, 0, +1}),
    so ``compute_ofi_features`` skips that pass (a read of the three columns and a write of two)."""

    cumv: F64
    cumd: F64


def _arrow_of(values: np.ndarray) -> pa.Array:
    """``pa.array(values)`` of a 1-D numpy column, its type from the dtype (no pandas import)."""
    return array_of(values, pa.from_numpy_dtype(values.dtype))


@dataclass
class OfiFeatures:
    """One row per bar: ``ts_close``, ``bars_since_reset`` (capped at the warm-up, so a
    partition computed with enough warm-up gives the same values) and float64 features."""

    ts_close: I64
    bars_since_reset: npt.NDArray[np.int32]
    columns: dict[str, F64]
    config: OfiConfig
    tick_size: float
    meta: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ts_close.shape[0])

    def to_arrow(self) -> pa.Table:
        """Arrow table (ts_close, bars_since_reset, features…) with the config in metadata."""
        # tables.array_of: pa.array's type inference without its pandas import
        arrays = [_arrow_of(self.ts_close), _arrow_of(self.bars_since_reset)]
        names = ["ts_close", "bars_since_reset"]
        for k, v in self.columns.items():
            arrays.append(_arrow_of(v))
            names.append(k)
        md = {
            b"fx.format_version": FORMAT_VERSION.encode(),
            b"fx.ofi_config": self.config.model_dump_json().encode(),
            b"fx.tick_size": repr(self.tick_size).encode(),
        }
        md.update({k.encode(): v.encode() for k, v in self.meta.items()})
        return pa.Table.from_arrays(arrays, names=names).replace_schema_metadata(md)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> OfiFeatures:
        md = table.schema.metadata or {}
        if b"fx.ofi_config" not in md:
            raise FxDataError("ofi_features table has no fx.ofi_config metadata")
        cfg = OfiConfig.model_validate(json.loads(md[b"fx.ofi_config"]))
        # Views of the (memory-mapped) table where the type already matches: no copies.
        # (tables.numpy_of: to_numpy without its pandas import)
        cols = {
            n: np.asarray(numpy_of(table.column(n)), dtype=np.float64)
            for n in table.column_names
            if n not in ("ts_close", "bars_since_reset")
        }
        return cls(
            ts_close=np.asarray(numpy_of(table.column("ts_close")), dtype=np.int64),
            bars_since_reset=np.asarray(numpy_of(table.column("bars_since_reset")), dtype=np.int32),
            columns=cols,
            config=cfg,
            tick_size=float(md.get(b"fx.tick_size", b"nan")),
        )


# ---------------------------------------------------------------------------------------------
# Numba kernels
# ---------------------------------------------------------------------------------------------

# Columns of the per-bar sums written by the event pass.
_L_NSNAP, _L_NTR, _L_OFI1, _L_D1, _L_ML5, _L_D5, _L_MLL, _L_DL = 0, 1, 2, 3, 4, 5, 6, 7
_L_DEPB, _L_DEPA, _L_RV, _L_VOL, _L_BUY, _L_SELL, _L_HAWK = 8, 9, 10, 11, 12, 13, 14
_L_LNM = 15  # ln(mid) of the as-of snapshot (NaN without one): Kyle's y without a log per window bar
_N_LOC = 16


@njit(cache=True, nogil=True)
def _event_pass_nb(
    b_ts, bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct, valid, t_ts, t_size, t_sign,
    snap_lo, snap_hi, trd_lo, trd_hi, seg_snap_lo, bar_close, reset,
    levels, tick, rv_scale, decay_ns, b0, b1, loc, asof, out,
):  # fmt: skip
    """Per-bar sums over each bar's own window, bars [b0, b1) (one shard), and the book-state
    features of the as-of snapshot into out[4:16, j] (here, while its row is in cache; a pure
    function of the snapshot, so reused when bar j has the same one as bar j−1)."""
    n5 = min(5, levels)
    prev = -1
    prev_lnm = 0.0
    prev_mid = math.nan  # the mid whose log is prev_lnm (a memo: the mid is often unchanged)
    for j in range(b0, b1):
        if j == b0 or reset[j]:
            # Shard warm-up / reset: predecessor = last valid snapshot of the segment before
            # this bar's window (none right after a reset, since the range is then empty).
            prev = -1
            p = snap_lo[j] - 1
            while p >= seg_snap_lo[j]:
                if valid[p]:
                    prev = p
                    break
                p -= 1
            if prev >= 0:
                prev_mid = 0.5 * (bid_px[prev, 0] + ask_px[prev, 0])
                prev_lnm = math.log(prev_mid)
        tau = bar_close[j]
        nsnap = 0.0
        ofi1 = 0.0
        d1 = 0.0
        ml5 = 0.0
        d5 = 0.0
        mll = 0.0
        dl = 0.0
        depb = 0.0
        depa = 0.0
        rv = 0.0
        hawk = 0.0
        # exp(−(τ − t)/δ) of the last event time seen (events often share a timestamp)
        last_t = tau + 1
        last_x = 0.0
        for i in range(snap_lo[j], snap_hi[j]):
            if not valid[i]:
                continue
            nsnap += 1.0
            t = b_ts[i]
            if t != last_t:
                last_t = t
                last_x = math.exp(-(tau - t) / decay_ns)
            hawk += last_x
            for m in range(levels):
                pb = bid_px[i, m]
                pa = ask_px[i, m]
                qb = bid_sz[i, m] if pb == pb else 0.0
                qa = ask_sz[i, m] if pa == pa else 0.0
                dep = 0.5 * (qb + qa)
                if m == 0:
                    d1 += dep
                if m < n5:
                    d5 += dep
                dl += dep
                if prev >= 0:
                    ppb = bid_px[prev, m]
                    ppa = ask_px[prev, m]
                    pqb = bid_sz[prev, m] if ppb == ppb else 0.0
                    pqa = ask_sz[prev, m] if ppa == ppa else 0.0
                    # XGH convention: a missing bid is −∞, a missing ask +∞ (size 0).
                    pb = pb if pb == pb else -math.inf
                    ppb = ppb if ppb == ppb else -math.inf
                    pa = pa if pa == pa else math.inf
                    ppa = ppa if ppa == ppa else math.inf
                    # Branch-free form of "e = 0; if c: e ±= q": adding ±0.0 instead of
                    # skipping leaves e unchanged (e starts at +0.0, so it is never −0.0).
                    e = 0.0 + (qb if pb >= ppb else 0.0)
                    e -= pqb if pb <= ppb else 0.0
                    e -= qa if pa <= ppa else 0.0
                    e += pqa if pa >= ppa else 0.0
                    if m == 0:
                        ofi1 += e
                        # Queue depletion at L1: a queue shrinking at an unchanged price, or
                        # wholly consumed when the price moves away from the mid.
                        if pb == ppb:
                            if pqb > qb:
                                depb += pqb - qb
                        elif pb < ppb:
                            depb += pqb
                        if pa == ppa:
                            if pqa > qa:
                                depa += pqa - qa
                        elif pa > ppa:
                            depa += pqa
                    if m < n5:
                        ml5 += e
                    mll += e
            mid = 0.5 * (bid_px[i, 0] + ask_px[i, 0])
            if mid != prev_mid:
                prev_mid = mid
                lnm = math.log(mid)
            else:
                lnm = prev_lnm
            if prev >= 0:
                r = (lnm - prev_lnm) * rv_scale
                rv += r * r
            prev_lnm = lnm
            prev = i
        ntr = 0.0
        vol = 0.0
        buy = 0.0
        sell = 0.0
        for i in range(trd_lo[j], trd_hi[j]):
            v = t_size[i]
            ntr += 1.0
            vol += v
            if t_sign[i] > 0:
                buy += v
            elif t_sign[i] < 0:
                sell += v
            t = t_ts[i]
            if t != last_t:
                last_t = t
                last_x = math.exp(-(tau - t) / decay_ns)
            hawk += last_x
        loc[j, _L_NSNAP] = nsnap
        loc[j, _L_NTR] = ntr
        loc[j, _L_OFI1] = ofi1
        loc[j, _L_D1] = d1
        loc[j, _L_ML5] = ml5
        loc[j, _L_D5] = d5
        loc[j, _L_MLL] = mll
        loc[j, _L_DL] = dl
        loc[j, _L_DEPB] = depb
        loc[j, _L_DEPA] = depa
        loc[j, _L_RV] = rv
        loc[j, _L_VOL] = vol
        loc[j, _L_BUY] = buy
        loc[j, _L_SELL] = sell
        loc[j, _L_HAWK] = hawk
        loc[j, _L_LNM] = prev_lnm if prev >= 0 else math.nan
        if prev < 0:
            for k in range(4, 16):
                out[k, j] = math.nan
        elif j > b0 and asof[j - 1] == prev:
            for k in range(4, 16):
                out[k, j] = out[k, j - 1]
        else:
            _book_state_nb(
                bid_px[prev], ask_px[prev], bid_sz[prev], ask_sz[prev], bid_ct[prev], ask_ct[prev],
                levels, tick, out, 4, j,
            )  # fmt: skip
        asof[j] = prev


# log1p of the integers below 2^14 (cumulative depths in contracts), from the same libm
# log1p the kernels call: a table lookup gives the identical value, without the libm call that
# dominated the per-update book state of the snapshot row unit
_LOG1P_INT = np.array([math.log1p(k) for k in range(1 << 14)], dtype=np.float64)


@njit(cache=True, nogil=True)
def _log1p_nb(x):
    """math.log1p(x), by table for the small non-negative integers (bit-identical)."""
    if 0.0 <= x < 16384.0:
        k = int(x)
        if k == x:
            return _LOG1P_INT[k]
    return math.log1p(x)


@njit(cache=True, nogil=True)
def _side_slope_nb(px, sz, levels, mid, tick):
    """Næs–Skjeltorp slope of one side, price distances in ticks (see the registry)."""
    n = 0
    acc = 0.0
    cum = 0.0
    prev_v = 0.0
    prev_p = 0.0
    for k in range(levels):
        p = px[k]
        if p != p:
            break
        cum += sz[k]
        v = _log1p_nb(cum)
        if k == 0:
            d = abs(p - mid) / tick
            if d > 0.0:
                acc += v / d
        else:
            d = abs(p - prev_p) / tick
            if d > 0.0 and prev_v > 0.0:
                acc += (v / prev_v - 1.0) / d
        prev_v = v
        prev_p = p
        n += 1
    if n == 0:
        return math.nan
    return acc / n


@njit(cache=True, nogil=True)
def _ratio(num, den):
    """Safe division with fallback 0 (§0 div(x, y, 0))."""
    if abs(den) <= 1e-12:
        return 0.0
    return num / den


@njit(cache=True, nogil=True)
def _book_state_nb(bpx, apx, bsz, asz, bct, act, levels, tick, out, o, j):
    """Book-state features of one snapshot (rows of length ≥ levels) into out[o:o+12, j]."""
    pb = bpx[0]
    pa = apx[0]
    qb = bsz[0]
    qa = asz[0]
    mid = 0.5 * (pb + pa)
    s = pa - pb
    i1 = _ratio(qb - qa, qb + qa)
    n5 = min(5, levels)
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
    for k in range(levels):
        b = bpx[k]
        a = apx[k]
        vb = bsz[k] if b == b else 0.0
        va = asz[k] if a == a else 0.0
        cb = bct[k] if b == b else 0.0
        ca = act[k] if a == a else 0.0
        if k < n5:
            num5 += vb - va
            den5 += vb + va
        numl += vb - va
        denl += vb + va
        ctn += cb - ca
        ctd += cb + ca
        # Centred prices (exact on a tick grid), so the mirror flips these terms exactly.
        if b == b:
            sb += vb
            db += vb * (mid - b)
            com += vb * (b - mid)
        if a == a:
            sa += va
            da += va * (a - mid)
            com += va * (a - mid)
    out[o + 0, j] = i1
    out[o + 1, j] = _ratio(num5, den5)
    out[o + 2, j] = _ratio(numl, denl)
    out[o + 3, j] = 0.5 * i1 if s > 0.0 else 0.0
    out[o + 4, j] = i1 * (0.5 * s) / tick
    bsl = _side_slope_nb(bpx, bsz, levels, mid, tick)
    asl = _side_slope_nb(apx, asz, levels, mid, tick)
    out[o + 5, j] = bsl
    out[o + 6, j] = asl
    out[o + 7, j] = _ratio(bsl - asl, bsl + asl)
    dbm = _ratio(db, sb)
    dam = _ratio(da, sa)
    out[o + 8, j] = _ratio(dam - dbm, dam + dbm)
    out[o + 9, j] = -_ratio(com, sb + sa) / tick
    out[o + 10, j] = s / tick
    out[o + 11, j] = _ratio(ctn, ctd)


_SCAN = 16  # block of the forward scan in _first_ge_nb (a power of two)
# The VPIN ring of F values: at most 2^20 volumes (8 MiB; 2^16 for the default 50 buckets of
# 1000 contracts), and only below 2^52 contracts, where every integer is a float64 and int()
# of it exact.
_VPIN_RING_MAX = 1 << 20
_VPIN_RING_TOP = float(1 << 52)
# exp(x) is exactly +0.0 below this (e^−760 ≈ 8e−331, far below half the smallest subnormal
# 4.9e−324: any libm rounds it to 0; tested against the kernels' exp).
_EXP_ZERO_BELOW = -760.0


@njit(cache=True, nogil=True)
def _first_ge_nb(a, p, hi, c):
    """First i in [p, hi) with a[i] ≥ c, hi if none; a non-decreasing and a[i] < c for i < p.

    Equals ``p0 + searchsorted(a[p0:hi], c)`` for any p0 ≤ p: the answer is unique, only the
    cost of finding it changes. A VPIN boundary moves by about one bar's trades per bar, so
    step forward by blocks of _SCAN (one probe each), then find the answer inside its block
    by a branch-free binary search; a long move (a large bar, the first search of a shard)
    switches to galloping.
    """
    for _ in range(8):
        if hi - p < _SCAN:
            break
        if a[p + _SCAN - 1] < c:
            p += _SCAN
            continue
        b = p  # answer in [b, b + n)
        n = _SCAN
        while n > 1:
            h = n >> 1
            b = b + h if a[b + h - 1] < c else b
            n -= h
        return b
    # galloping from p, then a binary search on (lo, up]
    lo = p - 1  # a[lo] < c (or lo before the start)
    up = hi  # a[up] ≥ c, or up = hi
    step = 1
    while True:
        nxt = lo + step
        if nxt >= hi:
            break
        if a[nxt] >= c:
            up = nxt
            break
        lo = nxt
        step *= 2
    while up - lo > 1:
        mid = (lo + up) >> 1
        if a[mid] < c:
            lo = mid
        else:
            up = mid
    return up


@njit(cache=True, nogil=True)
def _bar_pass_nb(
    loc, asof, bar_close, has_start, ts_start,
    seg_start, seg_trd_lo, trd_hi, cumv, cumd, t_sign, levels, vpin_v, vpin_n, vpin_int,
    kyle_w, kyle_min, rv_scale, ti_windows, decay_ns, hawkes_bars, b0, b1, out,
):  # fmt: skip
    """Per-bar features of bars [b0, b1) into out[:, j] (columns × bars), from the per-bar sums.

    Every value of bar j is a pure function of the inputs and j. The only state carried from
    bar to bar is the VPIN boundary positions, which merely speed up a search whose answer is
    unique, the ring of F values at integer volumes, each the value that search gives
    (computed by the same expression from the same trade), the comb's running sums (exact
    integers), and the first Hawkes term not known to be 0.0, so none can change a result.
    ``vpin_int``: the comb's precondition (integer sizes and V, volumes below 2^52).
    """
    xs = np.empty(kyle_w)
    ys = np.empty(kyle_w)
    # Kyle's (x, y) of every bar the shard's windows reach, once: each bar's window then copies
    # them instead of recomputing the same differences for each of the kyle_w bars holding it.
    k0 = max(b0 - kyle_w + 1, 1)
    kx = np.empty(max(b1 - k0, 0))
    ky = np.empty(max(b1 - k0, 0))
    kok = np.empty(max(b1 - k0, 0), np.bool_)
    for k in range(k0, b1):
        kok[k - k0] = asof[k] >= 0 and asof[k - 1] >= 0
        ky[k - k0] = (loc[k, _L_LNM] - loc[k - 1, _L_LNM]) * rv_scale
        kx[k - k0] = loc[k, _L_BUY] - loc[k, _L_SELL]
    # ptr[k]: trade index at or before the one holding VPIN boundary k+1 of the previous bar.
    # Boundaries only move forward within a segment (the cumulative volume at τ_j does), so
    # every pointer only advances; it restarts at the segment's first trade on a new segment
    # and at the shard's first bar (from where the first search is a full galloping search).
    ptr = np.empty(vpin_n, np.int64)
    # F(x), the cumulative signed volume at cumulative volume x, of every integer x the
    # boundaries can reach, filled once as the bars advance (a ring of the last ``n_ring``
    # volumes of the segment): with integer sizes and an integer bucket volume every boundary
    # is such an x, and F(x) is the value the search would give (its trade index is unique),
    # so a boundary costs one load instead of a search (~20 ns each, 50 per bar). Other
    # boundaries (fractional volumes, a bar longer than the ring) take the search.
    span = vpin_n * vpin_v + 4096.0
    n_ring = 1
    while n_ring < span and n_ring < _VPIN_RING_MAX:
        n_ring *= 2
    use_ring = span <= n_ring
    ring = np.empty(n_ring if use_ring else 1)
    ring_mask = n_ring - 1
    fill_x = 0.0  # next integer volume to fill
    fill_i = 0  # its trade index (moves forward only)
    ring_lo = 0.0  # lowest volume filled since the segment start (or a jump over a long bar)
    # The comb (``vpin_int``: integer sizes from the call's start, an integer V, volumes below
    # 2^52). Then F(x) at an integer x is an integer, so each bucket term D(y) = |F(y) − F(y−V)|
    # is an exact integer and any sum of them below 2^53 is exact in any order: the bar's sum
    # Σ_{k<n} D(cj − kV) equals P(cj) − P(cj − nV) bit for bit, P(x) = P(x − V) + D(x) the
    # running sum along x's residue class mod V (0 on [comb_lo, comb_lo + V)), kept in a second
    # ring as F is filled. Two loads per bar instead of n, each far apart in the ring (a cache
    # miss each). Valid once cj − nV ≥ comb_lo (the chain starts at the segment start, again
    # after a fill skips over a long bar); before that, and outside the integer case, the loop.
    comb = vpin_int and use_ring and n_ring >= (vpin_n + 1) * vpin_v + 8
    pring = np.empty(n_ring if comb else 1)
    v_int = int(vpin_v) if comb else 0
    comb_lo = 0.0  # first volume of the chain of P
    cur_seg = -1
    hk = 0  # first Hawkes term of the previous bar not known to be 0.0
    nlev5 = min(5, levels)
    for j in range(b0, b1):
        s0 = seg_start[j]
        # -- own-window flow terms
        n = loc[j, _L_NSNAP]
        out[0, j] = loc[j, _L_OFI1]
        out[1, j] = _ratio(loc[j, _L_OFI1], loc[j, _L_D1] / n) if n > 0 else 0.0
        out[2, j] = _ratio(loc[j, _L_ML5], loc[j, _L_D5] / (n * nlev5)) if n > 0 else 0.0
        out[3, j] = _ratio(loc[j, _L_MLL], loc[j, _L_DL] / (n * levels)) if n > 0 else 0.0
        # (out[4:16, j], the book state as of τ_j, is written by the event pass)
        # -- VPIN over the last n·V contracts of the segment before τ_j
        tlo = seg_trd_lo[j]
        thi = trd_hi[j]
        base = cumv[tlo - 1] if tlo > 0 else 0.0
        if s0 != cur_seg:
            cur_seg = s0
            for k in range(vpin_n):
                ptr[k] = tlo
            fill_x = math.ceil(base)
            fill_i = tlo
            ring_lo = fill_x
            comb_lo = fill_x
        cj = cumv[thi - 1] if thi > tlo else base
        if thi > tlo and cj - vpin_n * vpin_v >= base - 1e-9:
            # Fill F up to the bar's highest boundary cj − V (below cj, so every answer is a
            # trade of the segment before thi: the search's, which starts at tlo); the comb
            # fills up to cj itself (its first trade with cumv ≥ cj is also before thi, and
            # F(cj) = cumd[thi − 1]: only zero sizes can follow that trade).
            if comb:
                if fill_x <= cj:
                    if cj - fill_x >= n_ring - vpin_v - 3:  # a long bar: skip to its end
                        fill_x = math.floor(cj) - (n_ring - v_int - 4)
                        ring_lo = fill_x
                        comb_lo = fill_x
                        while cumv[fill_i] < fill_x:
                            fill_i += 1
                    # F trade by trade over the bar's trades (fill_i: the first one not done),
                    # each writing 4 volumes from fx whatever its size (no unpredictable
                    # branch for the usual sizes): a later trade overwrites the extra ones,
                    # and those past cj (≤ 3) land on slots of volumes the P pass below
                    # does not read (the fill spans < n_ring − V − 3 volumes), which the
                    # next bar's fill writes first.
                    x0 = int(fill_x)
                    fx = x0
                    for i in range(fill_i, thi):
                        cv = cumv[i]
                        cd = cumd[i]
                        sg = float(t_sign[i])
                        for u in range(4):
                            ring[(fx + u) & ring_mask] = cd - sg * (cv - float(fx + u))
                        e = int(cv)
                        for xi in range(fx + 4, e + 1):
                            ring[xi & ring_mask] = cd - sg * (cv - float(xi))
                        if e >= fx:
                            fx = e + 1
                    fill_i = thi
                    fill_x = float(fx)
                    # P along each residue class mod V (0 on the chain's first V volumes),
                    # in runs that wrap neither the slot nor its predecessor's: a run is a
                    # plain loop reading V slots back, which the compiler vectorises (the
                    # dependence distance V is checked at run time; ~0.17 -> 0.12 us a bar).
                    # Each slot takes the same operations in the same dependence order, so
                    # the same bits.
                    c_from = int(comb_lo) + v_int
                    for xi in range(x0, min(c_from, fx)):
                        pring[xi & ring_mask] = 0.0
                    xi = max(x0, c_from)
                    while xi < fx:
                        r0 = xi & ring_mask
                        rb0 = (xi - v_int) & ring_mask
                        run = min(fx - xi, n_ring - r0, n_ring - rb0)
                        for t in range(run):
                            pring[r0 + t] = pring[rb0 + t] + abs(ring[r0 + t] - ring[rb0 + t])
                        xi += run
            else:
                top = cj - vpin_v
                if use_ring and fill_x <= top < _VPIN_RING_TOP:
                    if top - fill_x >= n_ring:  # a bar longer than the ring: skip to its end
                        fill_x = math.floor(top) - (n_ring - 1)
                        ring_lo = fill_x
                    while fill_x <= top:
                        while cumv[fill_i] < fill_x:
                            fill_i += 1
                        # every integer volume up to cumv[fill_i] has its answer at fill_i
                        cv = cumv[fill_i]
                        cd = cumd[fill_i]
                        sg = float(t_sign[fill_i])
                        stop = min(cv, top)
                        while fill_x <= stop:
                            ring[int(fill_x) & ring_mask] = cd - sg * (cv - fill_x)
                            fill_x += 1.0
            if comb and comb_lo <= cj - vpin_n * vpin_v and cj < fill_x:
                # (P(cj − nV) is still in the ring: the fill ended at cj and nV + 4 < n_ring)
                acc = pring[int(cj) & ring_mask] - pring[int(cj - vpin_n * vpin_v) & ring_mask]
            else:
                # (in the comb's case the ring's ≤ 3 lowest volumes may hold the slots past cj)
                lo_ok = max(ring_lo, fill_x - n_ring + (4 if comb else 0)) if use_ring else math.inf
                acc = 0.0
                fhi = cumd[thi - 1]
                for k in range(1, vpin_n + 1):
                    c = cj - k * vpin_v
                    if lo_ok <= c < fill_x and c == math.floor(c):
                        flo = ring[int(c) & ring_mask]
                    else:
                        i = _first_ge_nb(cumv, ptr[k - 1], thi, c)
                        ptr[k - 1] = i
                        if i >= thi:
                            i = thi - 1
                        # cumulative signed volume at cumulative volume c (pro-rata in trade i)
                        flo = cumd[i] - float(t_sign[i]) * (cumv[i] - c)
                    acc += abs(fhi - flo)
                    fhi = flo
            out[16, j] = acc / (vpin_n * vpin_v)
        else:
            out[16, j] = math.nan
        # -- Kyle's λ: OLS with intercept over the last kyle_w bars of the segment
        # (the means' sums taken while the window's pairs are gathered: the same additions
        # in the same order as a second loop over them)
        m = 0
        mx = 0.0
        my = 0.0
        for k in range(max(j - kyle_w + 1, s0 + 1), j + 1):
            if kok[k - k0]:
                y = ky[k - k0]
                x = kx[k - k0]
                ys[m] = y
                xs[m] = x
                mx += x
                my += y
                m += 1
        lam = math.nan
        if m >= kyle_min:
            mx /= m
            my /= m
            sxx = 0.0
            sxy = 0.0
            sx2 = 0.0
            for q in range(m):
                dx = xs[q] - mx
                sxx += dx * dx
                sxy += dx * (ys[q] - my)
                sx2 += xs[q] * xs[q]
            if sxx > 1e-12 * max(sx2, 1.0):
                lam = sxy / sxx
        out[17, j] = lam
        # -- queue depletion, realised variance
        out[18, j] = _ratio(loc[j, _L_DEPA] - loc[j, _L_DEPB], loc[j, _L_DEPA] + loc[j, _L_DEPB])
        out[19, j] = loc[j, _L_RV]
        # -- window length, event rate
        if j > 0 or has_start:
            t0 = bar_close[j - 1] if j > 0 else ts_start
            dur = max((bar_close[j] - t0) / 1e9, 1e-6)
            out[20, j] = (loc[j, _L_NSNAP] + loc[j, _L_NTR]) / dur
            out[22, j] = math.log(dur)
        else:
            out[20, j] = math.nan
            out[22, j] = math.nan
        # -- truncated exponential intensity at τ_j (events/s). Recomputed over the window:
        # a recursive decay would carry rounding from the segment start, so a shard or a
        # partition starting from a warm-up would not reproduce it bit for bit.
        # Leading terms whose exp underflows to exactly 0.0 add +0.0 (loc ≥ 0, finite) to
        # h = +0.0, so starting after them changes no bit; the closes ascend, so they are a
        # prefix of the window, and the first kept bar only moves forward (hk).
        h = 0.0
        k = max(j - hawkes_bars + 1, s0, hk)
        while k < j and -(bar_close[j] - bar_close[k]) / decay_ns < _EXP_ZERO_BELOW:
            k += 1
        hk = k
        for k in range(hk, j + 1):
            h += loc[k, _L_HAWK] * math.exp(-(bar_close[j] - bar_close[k]) / decay_ns)
        out[21, j] = h / (decay_ns / 1e9)
        out[23, j] = loc[j, _L_NSNAP]
        out[24, j] = loc[j, _L_NTR]
        # -- trade imbalance over the last w bars of the segment
        for q in range(ti_windows.shape[0]):
            w = ti_windows[q]
            num = 0.0
            den = 0.0
            for k in range(max(j - w + 1, s0), j + 1):
                num += loc[k, _L_BUY] - loc[k, _L_SELL]
                den += loc[k, _L_VOL]
            out[25 + q, j] = _ratio(num, den)


# ---------------------------------------------------------------------------------------------
# Python wrappers
# ---------------------------------------------------------------------------------------------


def book_state_row(
    bid_px: F64, ask_px: F64, bid_sz: F64, ask_sz: F64, bid_ct: F64, ask_ct: F64, tick_size: float
) -> dict[str, float]:
    """Book-state features of one snapshot (1-D rows; levels = row length). For tests/tools."""
    rows = [
        np.ascontiguousarray(x, dtype=np.float64) for x in (bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct)
    ]
    out = np.empty((len(_BOOK_STATE_COLS), 1))
    b, a, bs, as_, bc, ac = rows
    _book_state_nb(b, a, bs, as_, bc, ac, b.shape[0], float(tick_size), out, 0, 0)
    return dict(zip(_BOOK_STATE_COLS, out[:, 0].tolist(), strict=True))


@njit(cache=True, nogil=True)
def _book_prep_nb(ts, bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct, levels, r0, r1, valid, bad, sizes):
    """One pass over snapshots [r0, r1) (one shard): validity flag of each snapshot, and the
    first row (−1: none) that is out of ts order (bad[0]) or, with ``sizes``, has a present
    price with a NaN or negative bid_sz, bid_ct, ask_sz, ask_ct (bad[1..4])."""
    b_ts = -1
    b_bs = -1
    b_bc = -1
    b_as = -1
    b_ac = -1
    for i in range(r0, r1):
        if b_ts < 0 and i > 0 and ts[i] < ts[i - 1]:
            b_ts = i
        for k in range(levels if sizes else 0):
            if bid_px[i, k] == bid_px[i, k]:
                if b_bs < 0 and not (bid_sz[i, k] >= 0.0):
                    b_bs = i
                if b_bc < 0 and not (bid_ct[i, k] >= 0.0):
                    b_bc = i
            if ask_px[i, k] == ask_px[i, k]:
                if b_as < 0 and not (ask_sz[i, k] >= 0.0):
                    b_as = i
                if b_ac < 0 and not (ask_ct[i, k] >= 0.0):
                    b_ac = i
        pb = bid_px[i, 0]
        pa = ask_px[i, 0]
        # §0 cleaning: both sides present (finite), not crossed, positive bid.
        valid[i] = abs(pb) < math.inf and abs(pa) < math.inf and pb <= pa and pb > 0.0
    bad[0] = b_ts
    bad[1] = b_bs
    bad[2] = b_bc
    bad[3] = b_as
    bad[4] = b_ac


@njit(cache=True, nogil=True)
def _trade_prep_nb(ts, size, sign, cumv, cumd, bad):
    """One pass over the trades: the cumulative volume and signed volume (the same additions
    as ``np.cumsum(size)`` and ``np.cumsum(size * sign)``, without their full-size temporaries),
    and the first row (−1: none) out of ts order (bad[0]), with a size that is not finite and
    ≥ 0 (bad[1]), with a sign outside {−1, 0, +1} (bad[2]), with a size that is not an
    integer (bad[3]: not an error; it tells whether VPIN's sums are exact integers)."""
    b_ts = -1
    b_sz = -1
    b_sg = -1
    b_int = -1
    v = 0.0
    d = 0.0
    for i in range(ts.shape[0]):
        if b_ts < 0 and i > 0 and ts[i] < ts[i - 1]:
            b_ts = i
        x = size[i]
        if b_sz < 0 and not (x >= 0.0 and x < math.inf):
            b_sz = i
        if b_int < 0 and x != math.floor(x):
            b_int = i
        g = sign[i]
        if b_sg < 0 and g != -1 and g != 0 and g != 1:
            b_sg = i
        xd = x * float(g)
        if i == 0:
            v = x
            d = xd
        else:
            v += x
            d += xd
        cumv[i] = v
        cumd[i] = d
    bad[0] = b_ts
    bad[1] = b_sz
    bad[2] = b_sg
    bad[3] = b_int


@njit(cache=True, nogil=True)
def _search_right_nb(ts, q, out):
    """out[j] = searchsorted(ts, q[j], side="right") for non-decreasing ts and q: each search
    gallops forward from the previous answer (the answer is unique, so the result is the
    same), instead of a full binary search over ts per query."""
    n = ts.shape[0]
    p = 0
    for j in range(q.shape[0]):
        x = q[j]
        if p < n and ts[p] <= x:
            lo = p  # ts[lo] ≤ x
            step = 1
            while True:
                nxt = lo + step
                if nxt >= n:
                    up = n
                    break
                if ts[nxt] > x:
                    up = nxt
                    break
                lo = nxt
                step *= 2
            while up - lo > 1:
                mid = (lo + up) >> 1
                if ts[mid] <= x:
                    lo = mid
                else:
                    up = mid
            p = up
        out[j] = p


def search_right(ts: I64, q: I64, out: I64) -> None:
    """``out[:] = np.searchsorted(ts, q, side="right")`` for ascending ``ts`` (int64) and
    ``q``, by one forward merge (:func:`_search_right_nb`); unsorted ``q`` falls back to
    ``np.searchsorted``, which gives the same answer for any ``q``."""
    if q.shape[0] > 1 and not bool(np.all(q[1:] >= q[:-1])):
        out[:] = np.searchsorted(ts, q, side="right")
        return
    _search_right_nb(ts, q, out)


def _as_f64(x: npt.ArrayLike, name: str, ndim: int) -> F64:
    a = np.ascontiguousarray(x, dtype=np.float64)
    if a.ndim != ndim:
        raise FxDataError(f"OFI input column {name}: expected {ndim}-D array, got shape {a.shape}")
    return a


def _raise_unsorted(ts: I64, i: int, name: str) -> None:
    if i >= 0:
        raise FxDataError(
            f"OFI input column {name}: timestamps not sorted at row {i} ({int(ts[i - 1])} > {int(ts[i])})"
        )


def _check_sorted(ts: I64, name: str) -> None:
    if ts.shape[0] > 1:
        bad = np.flatnonzero(np.diff(ts) < 0)
        if bad.size:
            _raise_unsorted(ts, int(bad[0]) + 1, name)


def _shard_bounds(n: int, k: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, k + 1).round().astype(np.int64)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


# Large work arrays come from numba's allocator, not numpy's: numpy advises huge pages for big
# allocations (MADV_HUGEPAGE), and on VMs where faulting huge pages in is slow that alone cost
# ~0.3 s per scale-1 quarter (measured with NUMPY_MADVISE_HUGEPAGE=0 vs 1).
@njit(cache=True)
def _empty_1d(n: int) -> F64:
    return np.empty(n)


@njit(cache=True)
def _empty_2d(a: int, b: int) -> F64:
    return np.empty((a, b))


def compute_ofi_features(
    book: BookArrays,
    trades: TradeArrays,
    bar_ts_close: npt.ArrayLike,
    bar_instrument: npt.ArrayLike,
    config: OfiConfig,
    *,
    tick_size: float | None = None,
    n_warmup: int = 0,
    ts_window_start: int | None = None,
    bar_reset: npt.ArrayLike | None = None,
    partition: str = "?",
    workers: int | None = None,
) -> OfiFeatures:
    """Per-bar OFI / book / flow features (see `ofi_feature_registry` for every formula).

    Args:
        book, trades: events of the active contract, ts_recv order (units in the classes).
        bar_ts_close: int64 ns close stamp τ_j of every bar (non-decreasing).
        bar_instrument: uint32 instrument of every bar; a change starts a reset segment.
        config: kernel parameters.
        tick_size: minimum price increment of the contract, price units (ticks features);
            None (default): ``config.tick_size``. A value given here takes precedence.
        n_warmup: leading bars that are only warm-up (replayed, not returned). To compute a
            partition equal to the sequential pass, pass the previous partition's last
            ``ofi_warmup_bars(...)`` bars (and their events) first with this count.
        ts_window_start: the close of the bar preceding bar 0 (ns), if known: bar 0's window
            is (ts_window_start, τ_0]; else it is every event ≤ τ_0 and its length is unknown
            (event_rate / log_bar_duration NaN).
        bar_reset: optional bool per bar forcing an extra reset (e.g. a data gap).
        partition: label used in error messages.
        workers: threads of this call (None: ``config.workers``); a caller already running
            calls in parallel passes 1. Results do not depend on it (see the module docstring).

    Returns:
        `OfiFeatures` of bars ``n_warmup:`` (ts_close, bars_since_reset, feature columns).
    """
    cfg = config
    L = cfg.levels
    tick = float(cfg.tick_size if tick_size is None else tick_size)
    if not (tick > 0 and math.isfinite(tick)):
        raise FxDataError(f"OFI {partition}: tick_size must be a positive number, got {tick_size}")
    b_ts = np.ascontiguousarray(book.ts, dtype=np.int64)
    nb_ = b_ts.shape[0]
    arr = {}
    for nm in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        a = _as_f64(getattr(book, nm), nm, 2)
        if a.shape[0] != nb_ or a.shape[1] < L:
            raise FxDataError(
                f"OFI {partition}: book column {nm} has shape {a.shape}, expected ({nb_}, >={L})"
            )
        arr[nm] = a
    t_ts = np.ascontiguousarray(trades.ts, dtype=np.int64)
    t_size = _as_f64(trades.size, "trades.size", 1)
    t_sign = np.ascontiguousarray(trades.sign, dtype=np.int8)
    trades_ok = t_size.shape[0] == t_sign.shape[0] == t_ts.shape[0]
    prepared = None
    if isinstance(trades, PreparedTrades):
        prepared = (_as_f64(trades.cumv, "trades.cumv", 1), _as_f64(trades.cumd, "trades.cumd", 1))
        if not (trades_ok and prepared[0].shape[0] == prepared[1].shape[0] == t_ts.shape[0]):
            raise FxDataError(f"OFI {partition}: prepared trade columns have different lengths")

    workers = cfg.workers if workers is None else max(1, int(workers))
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        return _compute(
            cfg, tick, b_ts, arr, not isinstance(book, UnsignedSizeBook), t_ts, t_size, t_sign, trades_ok, bar_ts_close,
            bar_instrument, n_warmup, ts_window_start, bar_reset, partition, workers, pool, prepared,
        )  # fmt: skip
    finally:
        if pool is not None:
            pool.shutdown()


def _compute(
    cfg: OfiConfig,
    tick: float,
    b_ts: I64,
    arr: dict[str, F64],
    check_sizes: bool,
    t_ts: I64,
    t_size: F64,
    t_sign: npt.NDArray[np.int8],
    trades_ok: bool,
    bar_ts_close: npt.ArrayLike,
    bar_instrument: npt.ArrayLike,
    n_warmup: int,
    ts_window_start: int | None,
    bar_reset: npt.ArrayLike | None,
    partition: str,
    workers: int,
    pool: ThreadPoolExecutor | None,
    prepared: tuple[F64, F64] | None = None,
) -> OfiFeatures:
    """Body of `compute_ofi_features` once the input columns have their dtypes."""
    L = cfg.levels
    nb_ = b_ts.shape[0]

    def run_all(fn: Callable[[tuple[int, int]], None], shards: list[tuple[int, int]]) -> None:
        if pool is None or len(shards) <= 1:
            for sh in shards:
                fn(sh)
        else:
            list(pool.map(fn, shards))

    # Input validation (book and trades in one pass each, the trades' pass also filling the
    # cumulative volumes for VPIN); errors are raised in a fixed order: book, trades, bars.
    book_shards = _shard_bounds(nb_, max(1, min(workers, nb_)))
    book_bad = np.full((max(1, len(book_shards)), 5), -1, np.int64)
    valid = np.empty(nb_, np.bool_)
    nt = t_ts.shape[0]
    # Cumulative volume / signed volume over the call (differences only are used: exact for
    # integer sizes, so VPIN does not depend on where the arrays start).
    # (``prepared``: a PreparedTrades' own, written with the trades; its checks hold by construction)
    cumv, cumd = (
        prepared
        if prepared is not None
        else (_empty_1d(nt if trades_ok else 0), _empty_1d(nt if trades_ok else 0))
    )
    trade_bad = np.full(4, -1, np.int64)

    def prep(q: int) -> None:
        if q < 0:  # the trades' pass is sequential (a running sum): started first
            if trades_ok and prepared is None:
                _trade_prep_nb(t_ts, t_size, t_sign, cumv, cumd, trade_bad)
        else:
            r0, r1 = book_shards[q]
            _book_prep_nb(
                b_ts, arr["bid_px"], arr["ask_px"], arr["bid_sz"], arr["ask_sz"], arr["bid_ct"],
                arr["ask_ct"], L, r0, r1, valid, book_bad[q], check_sizes,
            )  # fmt: skip

    tasks = [-1, *range(len(book_shards))]
    if pool is None:
        for q in tasks:
            prep(q)
    else:
        list(pool.map(prep, tasks))

    def first(col: npt.NDArray[np.int64]) -> int:
        ok = col[col >= 0]
        return int(ok.min()) if ok.size else -1

    _raise_unsorted(b_ts, first(book_bad[:, 0]), "book.ts")
    for c, (side, q) in enumerate((("bid", "sz"), ("bid", "ct"), ("ask", "sz"), ("ask", "ct"))):
        r = first(book_bad[:, 1 + c])
        if r >= 0:
            v = arr[f"{side}_{q}"]
            k = int(np.flatnonzero(np.isfinite(arr[f"{side}_px"][r, :L]) & ~(v[r, :L] >= 0))[0])
            raise FxDataError(
                f"OFI {partition}: book column {side}_{q}_{k:02d} invalid ({v[r, k]}) at "
                f"snapshot {r} with a price present"
            )
    if not trades_ok:
        raise FxDataError(f"OFI {partition}: trade columns have different lengths")
    _raise_unsorted(t_ts, int(trade_bad[0]), "trades.ts")
    if trade_bad[1] >= 0:
        r = int(trade_bad[1])
        raise FxDataError(f"OFI {partition}: trades.size invalid ({t_size[r]}) at trade {r}")
    if trade_bad[2] >= 0:
        raise FxDataError(f"OFI {partition}: trades.sign must be in {{-1, 0, +1}}")
    # VPIN's comb (see _bar_pass_nb): integer sizes and bucket volume, every cumulative volume
    # (and so every |cumulative signed volume|) below 2^52, where integer sums are exact.
    vpin_v = float(cfg.vpin_bucket_volume)
    vpin_int = bool(
        trade_bad[3] < 0 and vpin_v == math.floor(vpin_v) and (nt == 0 or cumv[nt - 1] < _VPIN_RING_TOP)
    )

    tau = np.ascontiguousarray(bar_ts_close, dtype=np.int64)
    inst = np.ascontiguousarray(bar_instrument).astype(np.int64)
    n = tau.shape[0]
    if inst.shape[0] != n:
        raise FxDataError(f"OFI {partition}: bar_instrument length {inst.shape[0]} != bars {n}")
    _check_sorted(tau, "bar_ts_close")
    if not 0 <= n_warmup <= n:
        raise FxDataError(f"OFI {partition}: n_warmup={n_warmup} outside [0, {n}]")

    # Event windows (τ_{j-1}, τ_j]: side="right" puts an event at τ_j in bar j and one at
    # τ_j + 1 ns in bar j+1 (the predecessor's off-by-one put bar t+1's window on bar t).
    snap_hi = np.empty(n, np.int64)
    trd_hi = np.empty(n, np.int64)
    _search_right_nb(b_ts, tau, snap_hi)
    _search_right_nb(t_ts, tau, trd_hi)
    if ts_window_start is None:
        s_lo0, t_lo0 = 0, 0
    else:
        s_lo0 = int(np.searchsorted(b_ts, ts_window_start, side="right"))
        t_lo0 = int(np.searchsorted(t_ts, ts_window_start, side="right"))
    snap_lo = np.empty(n, np.int64)
    trd_lo = np.empty(n, np.int64)
    if n:
        snap_lo[0], trd_lo[0] = s_lo0, t_lo0
        snap_lo[1:], trd_lo[1:] = snap_hi[:-1], trd_hi[:-1]

    reset = np.zeros(n, np.bool_)
    if n:
        reset[0] = True
        reset[1:] = inst[1:] != inst[:-1]
    if bar_reset is not None:
        br = np.asarray(bar_reset, dtype=np.bool_)
        if br.shape != (n,):
            raise FxDataError(f"OFI {partition}: bar_reset has shape {br.shape}, expected ({n},)")
        reset |= br
    idx = np.arange(n, dtype=np.int64)
    seg_start = np.maximum.accumulate(np.where(reset, idx, 0)) if n else idx
    seg_snap_lo = snap_lo[seg_start]
    seg_trd_lo = trd_lo[seg_start]

    loc = _empty_2d(n, _N_LOC)  # every cell written by the event pass
    asof = np.full(n, -1, np.int64)
    names = _kernel_names(cfg)
    out = _empty_2d(len(names), n)  # columns × bars: each feature column is contiguous
    decay_ns = cfg.hawkes_decay_s * NS_PER_S
    ti_w = np.asarray(cfg.trade_imbalance_windows, dtype=np.int64)
    # One thread: one shard (more would only repeat the shards' warm-up scans).
    k = cfg.n_shards if cfg.n_shards > 0 else (4 * workers if workers > 1 else 1)
    shards = _shard_bounds(n, max(1, min(k, n)))

    def ev(bounds: tuple[int, int]) -> None:
        _event_pass_nb(
            b_ts, arr["bid_px"], arr["ask_px"], arr["bid_sz"], arr["ask_sz"], arr["bid_ct"],
            arr["ask_ct"], valid, t_ts, t_size, t_sign, snap_lo, snap_hi, trd_lo, trd_hi,
            seg_snap_lo, tau, reset, L, tick, float(cfg.rv_return_scale), decay_ns, bounds[0],
            bounds[1], loc, asof, out,
        )  # fmt: skip

    def bp(bounds: tuple[int, int]) -> None:
        _bar_pass_nb(
            loc, asof, tau, ts_window_start is not None,
            np.int64(ts_window_start if ts_window_start is not None else 0), seg_start,
            seg_trd_lo, trd_hi, cumv, cumd, t_sign, L,
            vpin_v, cfg.vpin_buckets, vpin_int, cfg.kyle_window, cfg.kyle_min_bars,
            float(cfg.rv_return_scale), ti_w, decay_ns, cfg.hawkes_bars, bounds[0], bounds[1],
            out,
        )  # fmt: skip

    run_all(ev, shards)  # the bar pass reads the event pass's sums of earlier shards
    run_all(bp, shards)

    cols: dict[str, F64] = {nm: out[i] for i, nm in enumerate(names)}
    # Lag-1 deltas within a segment (NaN at its first bar).
    for base in _DELTA_OF:
        x = cols[base]
        d = np.full(n, np.nan)
        if n > 1:
            np.subtract(x[1:], x[:-1], out=d[1:])
        d[reset] = np.nan
        cols[f"d_{base}"] = d
    order = list(ofi_feature_registry(cfg))
    w = cfg.effective_warmup_bars
    bsr = np.minimum(idx - seg_start, w).astype(np.int32)
    sl = slice(n_warmup, n)
    return OfiFeatures(
        ts_close=tau[sl].copy(),
        bars_since_reset=bsr[sl].copy(),
        columns={nm: cols[nm][sl] for nm in order},
        config=cfg,
        tick_size=tick,
        meta={"fx.partition": partition},
    )


def ofi_warmup_bars(prev_bar_volume: npt.ArrayLike, config: OfiConfig) -> int:
    """Trailing bars of the previous partition to replay (``n_warmup``) for exact continuity.

    At least ``config.effective_warmup_bars`` (bar-count windows, deltas) and enough bars to
    hold ``vpin_buckets · vpin_bucket_volume`` contracts (VPIN), plus one bar of margin for
    trades sharing the boundary timestamp; capped at the number of bars available.
    """
    v = np.asarray(prev_bar_volume, dtype=np.float64)
    n = v.shape[0]
    need = config.vpin_buckets * config.vpin_bucket_volume
    # The running sum from the last bar back, over a growing tail: its first t sums are those
    # of the whole reversed column (np.cumsum adds in order), so the first sum reaching
    # ``need`` is found without summing a quarter's bars for every chunk of quarter_ofi.
    t = 1024
    while True:
        t = min(t, n)
        csum = np.cumsum(v[n - t :][::-1])
        k = int(np.searchsorted(csum, need, side="left"))
        if k < t or t == n:
            break
        t *= 4
    k_vpin = k + 2
    return int(min(n, max(config.effective_warmup_bars, k_vpin)))


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _scan_column_nb(x, seg_first, lo, hi):
    """One pass over a feature column: the first bar (−1: none) that is ±inf, that is NaN,
    that is NaN after a non-NaN value of its reset segment (``seg_first`` marks each segment's
    first bar), and that is neither NaN nor inside [lo, hi]."""
    inf_j = -1
    nan_j = -1
    late_nan_j = -1
    out_j = -1
    seen = False
    for j in range(x.shape[0]):
        if seg_first[j]:
            seen = False
        v = x[j]
        if v != v:
            if nan_j < 0:
                nan_j = j
            if seen and late_nan_j < 0:
                late_nan_j = j
            continue
        seen = True
        if inf_j < 0 and (v == math.inf or v == -math.inf):
            inf_j = j
        if out_j < 0 and (v < lo or v > hi):
            out_j = j
    return inf_j, nan_j, late_nan_j, out_j


@njit(cache=True, nogil=True)
def _column_flags_nb(x, seg_first, lo, hi):
    """How many bars of a feature column `_scan_column_nb` would report in each of its four
    classes (±inf, NaN, NaN after a non-NaN value of its segment, outside [lo, hi]): zero
    exactly where it finds none. No branch and no state carried from bar to bar, so the
    compiler vectorises it (~4x the scan's speed); only a column with something to report is
    scanned. A NaN after a non-NaN value of its segment exists iff some NaN directly follows a
    non-NaN value inside a segment (the bar after the segment's last non-NaN value before it),
    which is what is counted (``seg_first[0]`` is taken as set)."""
    n_inf = 0
    n_nan = 0
    n_late = 0
    n_out = 0
    n = x.shape[0]
    if n:
        v = x[0]
        n_nan += v != v
        n_inf += abs(v) == math.inf
        n_out += (v < lo) | (v > hi)  # (False for NaN, as the scan skips it)
    for j in range(1, n):
        v = x[j]
        u = x[j - 1]
        nan = v != v
        n_nan += nan
        n_late += nan & (u == u) & (not seg_first[j])
        n_inf += abs(v) == math.inf
        n_out += (v < lo) | (v > hi)
    return n_inf, n_nan, n_late, n_out


def validate_ofi(table: OfiFeatures | pa.Table, partition: str) -> None:
    """Raise FxDataError (naming partition, feature, bar) unless the table is sound.

    Checks: every registry column present; no ±inf; NaN only in a leading run of a reset
    segment (and only for features that allow warm-up NaN); finite values inside the
    documented bounds; book events present at all (``n_book_events``) and OFI not identically
    zero when they are (the predecessor accepted an all-zero OFI cache silently).
    """
    t = OfiFeatures.from_arrow(table) if isinstance(table, pa.Table) else table
    reg = ofi_feature_registry(t.config)
    n = len(t)
    seg_first = t.bars_since_reset == 0
    if n:
        seg_first = seg_first.copy()
        seg_first[0] = True

    def where(j: int) -> str:
        return f"bar {j} (ts_close={int(t.ts_close[j])})"

    for name, spec in reg.items():
        if name not in t.columns:
            raise FxDataError(f"ofi_features {partition}: feature column {name} missing")
        x = np.ascontiguousarray(t.columns[name], dtype=np.float64)
        if x.shape != (n,):
            raise FxDataError(f"ofi_features {partition}: feature {name} has shape {x.shape}")
        tol = 1e-9 * max(1.0, abs(spec.lower) if math.isfinite(spec.lower) else 1.0)
        # One vectorised count per column; the scan (one pass, the first bar of each class)
        # only where there is something to report (numpy's isinf / isnan / bound masks took
        # ~10 passes over each).
        n_inf, n_nan, n_late, n_out = _column_flags_nb(x, seg_first, spec.lower - tol, spec.upper + tol)
        if not (n_inf or n_late or n_out or (n_nan and not spec.nan_prefix)):
            continue
        inf_j, nan_j, late_nan_j, out_j = _scan_column_nb(x, seg_first, spec.lower - tol, spec.upper + tol)
        if inf_j >= 0:
            raise FxDataError(f"ofi_features {partition}: feature {name} is ±inf at {where(inf_j)}")
        if nan_j >= 0 and not spec.nan_prefix:
            raise FxDataError(
                f"ofi_features {partition}: feature {name} is NaN at {where(nan_j)} (no warm-up NaN allowed)"
            )
        # NaN is allowed while no other value has been seen since the segment start.
        if late_nan_j >= 0:
            raise FxDataError(
                f"ofi_features {partition}: feature {name} is NaN after its warm-up at {where(late_nan_j)}"
            )
        if out_j >= 0:
            raise FxDataError(
                f"ofi_features {partition}: feature {name} = {x[out_j]!r} outside its bounds "
                f"[{spec.lower}, {spec.upper}] at {where(out_j)}"
            )
    nbook = t.columns["n_book_events"]
    if n and nbook.sum() == 0:
        raise FxDataError(
            f"ofi_features {partition}: feature n_book_events is 0 on all {n} bars (from "
            f"{where(0)}): no book data reached the OFI kernel"
        )
    if n and nbook.sum() >= 2:
        zero = all(not np.any(t.columns[f] != 0.0) for f in ("ofi_l1", "mlofi_1_5", "mlofi_1_10"))
        if zero:
            j = int(np.flatnonzero(nbook > 0)[0])
            raise FxDataError(
                f"ofi_features {partition}: feature ofi_l1 (and mlofi) is all zero although "
                f"{int(nbook.sum())} book events exist (first at {where(j)}): OFI not computed"
            )


def feature_names(config: OfiConfig | None = None) -> Sequence[str]:
    """Output feature columns in order."""
    return list(ofi_feature_registry(config))
