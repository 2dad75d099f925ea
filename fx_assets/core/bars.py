"""Bar builders: volume, dollar, tick-imbalance and volume-imbalance bars of the active contract.

Owns the ``bars`` contract of docs/ARCHITECTURE.md: input trades (time ordered by ``ts_recv``)
of the active contract, output one row per bar with ``ts_open, ts_close, open, high, low,
close, volume, buy_volume, vwap, n_trades, duration_ns, instrument_id, session_id,
forced_close``. Kernels are numba (``_nb`` suffix) over plain arrays; ``build_bars`` validates
inputs and documents units.

Conventions (reference/microstructure.md §1.1-1.5):

* **Threshold bars.** A volume (dollar) bar closes at the first trade where the cumulative
  volume (``price * size * multiplier``) reaches the threshold; that trade goes wholly into the
  current bar, so a bar's volume is >= V (mlfinlab compares with ``>=`` and does not split).
  The accumulator restarts at zero for the next bar (no carry of the excess).
* **Breaks.** A bar never spans a change of ``session`` or ``instrument_id``: the bar open at a
  change is closed there with ``forced_close=True``. The partial bar at the end of the input is
  also closed with ``forced_close=True``; the caller decides whether to keep it (a quarter ends
  at a session end, so in practice it is the last bar of the quarter's last session).
* **Trade sign.** The aggressor flag (+1 buy, -1 sell) when known; when ``sign == 0`` the tick
  rule: ``sign(p_i - p_{i-1})`` if the price moved, else the previous trade's resolved sign.
  The tick-rule state starts at 0 (unknown) and is reset at every session start and every
  instrument change (roll). ``buy_volume`` sums the sizes of trades whose resolved sign is +1.
* **Imbalance bars** (AFML §2.3.2): signed quantity ``x_i = b_i`` (tick imbalance) or
  ``b_i * v_i`` (volume imbalance). The bar closes at the first tick T with
  ``|sum x| >= E0[T] * max(|E0[x]|, floor_frac * E0[|x|])``. ``E0[T]`` and ``E0[x]`` are read
  when the bar opens (so the threshold is constant within a bar and uses past ticks only).
  ``E0[x]``/``E0[|x|]`` are recursive EWMAs (``alpha = 2/(span+1)``, seeded with the first
  tick) updated after every tick; ``E0[T]`` is a recursive EWMA over the tick counts of closed
  bars (``alpha = 2/(span_bars+1)``), clamped to ``[min_factor*T_init, max_factor*T_init]``.
  The first bar of a segment is a tick bar of ``T_init`` ticks that seeds both EWMAs. A bar
  that reaches ``force_close_factor * E0[T]`` ticks is closed with ``forced_close=True``.
  A threshold of 0 (no signed flow seen yet) never closes a bar; only the force-close does.
  **All imbalance state resets at a session start as well as at a roll**: every session's
  bars are then a pure function of that session's trades, which makes per-quarter builds
  identical to one pass (quarters start at a session start) and keeps the overnight halt
  from carrying stale expectations into the next session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit
from pydantic import Field, model_validator

from fx_assets.core.active_contract import _aggressor_sign, _kept_trade
from fx_assets.core.calendar import interval_of
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.dbn import PRICE_DIVISOR
from fx_assets.core.errors import FxDataError
from fx_assets.core.tables import array_of, numpy_of

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
U32 = npt.NDArray[np.uint32]
I8 = npt.NDArray[np.int8]
B = npt.NDArray[np.bool_]

BarKind = Literal["volume", "dollar", "tick_imbalance", "volume_imbalance"]


class BarConfig(ConfigModel):
    """How trades are grouped into bars. Part of the bars cache key (every field matters)."""

    kind: BarKind = Field(
        "volume",
        description="Bar type: 'volume' (contracts), 'dollar' (USD notional), 'tick_imbalance' "
        "(signed tick count) or 'volume_imbalance' (signed contracts).",
    )
    volume_bar_size: int = Field(
        100, gt=0, description="Volume bar threshold V, in contracts; a bar closes once its volume >= V."
    )
    dollar_bar_size: float = Field(
        25_000_000.0,
        gt=0,
        description="Dollar bar threshold D, in USD of notional (price * size * multiplier); "
        "a bar closes once its notional >= D.",
    )
    multiplier: float = Field(
        50.0, gt=0, description="Contract multiplier, USD per index point (ES: 50) for dollar bars."
    )
    imbalance_expected_ticks_init: int = Field(
        50,
        gt=0,
        description="T_init, in ticks (trades): size of the warm-up tick bar that opens every "
        "session/contract segment and the centre of the E0[T] clamp.",
    )
    imbalance_ewma_span_bars: int = Field(
        20,
        gt=0,
        description="Span, in bars, of the recursive EWMA of past bars' tick counts E0[T] "
        "(alpha = 2/(span+1)).",
    )
    imbalance_ewma_span_ticks: int = Field(
        500,
        gt=0,
        description="Span, in ticks, of the recursive EWMAs E0[x] and E0[|x|] of the signed "
        "quantity x (alpha = 2/(span+1)).",
    )
    imbalance_ticks_min_factor: float = Field(
        0.25, gt=0, description="Lower clamp of E0[T], as a multiple of T_init (dimensionless)."
    )
    imbalance_ticks_max_factor: float = Field(
        4.0, gt=0, description="Upper clamp of E0[T], as a multiple of T_init (dimensionless)."
    )
    imbalance_floor_frac: float = Field(
        0.05,
        ge=0,
        description="Floor of |E0[x]| as a fraction of E0[|x|] (dimensionless): stops tiny "
        "expected imbalances from collapsing bars to 1-2 ticks.",
    )
    imbalance_force_close_factor: float = Field(
        3.0,
        gt=1.0,
        description="Force-close an imbalance bar (forced_close=True) once it holds "
        ">= factor * E0[T] ticks (dimensionless): stops bars exploding in trends.",
    )

    @model_validator(mode="after")
    def _clamp_order(self) -> BarConfig:
        if self.imbalance_ticks_min_factor > self.imbalance_ticks_max_factor:
            raise ValueError("imbalance_ticks_min_factor must be <= imbalance_ticks_max_factor")
        return self


# --- output table ---------------------------------------------------------------------------

BAR_SCHEMA = pa.schema(
    [
        ("ts_open", pa.int64()),
        ("ts_close", pa.int64()),
        ("open", pa.float64()),
        ("high", pa.float64()),
        ("low", pa.float64()),
        ("close", pa.float64()),
        ("volume", pa.float64()),
        ("buy_volume", pa.float64()),
        ("vwap", pa.float64()),
        ("n_trades", pa.int64()),
        ("duration_ns", pa.int64()),
        ("instrument_id", pa.uint32()),
        ("session_id", pa.int32()),
        ("forced_close", pa.bool_()),
    ]
)
_NP_DTYPES = {f.name: np.dtype(f.type.to_pandas_dtype()) for f in BAR_SCHEMA}


@dataclass(frozen=True)
class BarTable:
    """Bars as numpy columns (ARCHITECTURE.md order). Times in UTC ns, prices in index points,
    volumes in contracts, ``duration_ns = ts_close - ts_open``."""

    ts_open: I64
    ts_close: I64
    open: F64
    high: F64
    low: F64
    close: F64
    volume: F64
    buy_volume: F64
    vwap: F64
    n_trades: I64
    duration_ns: I64
    instrument_id: U32
    session_id: I32
    forced_close: B

    def __len__(self) -> int:
        return int(self.ts_close.shape[0])

    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in BAR_SCHEMA.names}

    def slice(self, start: int, stop: int | None = None) -> BarTable:
        """Rows ``[start, stop)`` (views)."""
        return BarTable(**{k: v[start:stop] for k, v in self.columns().items()})

    def to_arrow(self) -> pa.Table:
        # tables.array_of rather than pa.array: zero copy, and no pandas import (see array_of)
        return pa.Table.from_arrays(
            [array_of(self.columns()[f.name], f.type) for f in BAR_SCHEMA], schema=BAR_SCHEMA
        )

    @classmethod
    def from_arrow(cls, table: pa.Table, source: str = "bars") -> BarTable:
        """Columns of an Arrow table (zero copy where possible); raises FxDataError naming
        ``source`` and the column when one is missing or has the wrong type."""
        cols: dict[str, np.ndarray] = {}
        for field in BAR_SCHEMA:
            if field.name not in table.column_names:
                raise FxDataError(f"{source}: missing bar column {field.name!r}")
            col = table.column(field.name)
            if col.type != field.type:
                raise FxDataError(
                    f"{source}: bar column {field.name!r} has type {col.type}, expected {field.type}"
                )
            if col.null_count:
                raise FxDataError(f"{source}: bar column {field.name!r} has {col.null_count} nulls")
            # numpy_of: to_numpy without its pandas import
            cols[field.name] = np.asarray(numpy_of(col), dtype=_NP_DTYPES[field.name])
        return cls(**cols)

    @classmethod
    def concat(cls, parts: list[BarTable]) -> BarTable:
        return cls(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in BAR_SCHEMA.names})


# --- kernels --------------------------------------------------------------------------------

# Error codes returned by the kernels (checked in one pass inside the kernel: a separate numpy
# validation would cost more than building the bars).
_OK, _ERR_TS, _ERR_PRICE, _ERR_SIZE, _ERR_CAP, _ERR_SESSION = 0, 1, 2, 3, 4, 5


@njit(cache=True, inline="always")
def _resolve_sign(s: int, p: float, prev_p: float, prev_b: int) -> int:
    """Aggressor sign if known, else the tick rule (carrying the previous sign on no change).
    Written without branches: both inputs are unpredictable to the branch predictor."""
    a = (s > 0) - (s < 0)
    tick = (p > prev_p) - (p < prev_p)
    tick = tick + (tick == 0) * prev_b
    return a + (a == 0) * tick


@njit(cache=True, inline="always")
def _store(of, oi, o_inst, o_sess, o_forced, nb, ts0, ts1, o, h, lo, c, v, buy, pv, cnt, inst, sess, forced):  # fmt: skip
    of[0, nb] = o
    of[1, nb] = h
    of[2, nb] = lo
    of[3, nb] = c
    of[4, nb] = v
    of[5, nb] = buy
    of[6, nb] = pv
    oi[0, nb] = ts0
    oi[1, nb] = ts1
    oi[2, nb] = cnt
    o_inst[nb] = inst
    o_sess[nb] = sess
    o_forced[nb] = forced


@njit(cache=True, inline="always")
def _add_trade(open_, b_ts0, b_o, b_h, b_l, b_v, b_buy, b_pv, b_acc, b_n, t, p, v, b, dollar, multiplier):  # fmt: skip
    """One trade (ts ``t``, price ``p``, size ``v``, sign ``b``) into the bar being built, opening
    it first when none is open: the bar's state after the trade. Both threshold-bar kernels
    (from trade arrays and straight from sidecar records) call it, so their bars agree."""
    if not open_:
        b_ts0 = t
        b_o = p
        b_h = p
        b_l = p
        b_v = 0.0
        b_buy = 0.0
        b_pv = 0.0
        b_acc = 0.0
        b_n = 0
    # branch-free updates: prices and signs are unpredictable for the branch predictor
    b_h = max(b_h, p)
    b_l = min(b_l, p)
    b_v += v
    b_pv += p * v
    b_buy += v * (b > 0)
    b_n += 1
    if dollar:
        b_acc += p * v * multiplier
    else:
        b_acc += v
    return b_ts0, b_o, b_h, b_l, b_v, b_buy, b_pv, b_acc, b_n


@njit(cache=True)
def _threshold_bars_nb(ts, price, size, sign, session, inst, dollar, threshold, multiplier, cap, err):  # fmt: skip
    """Volume (``dollar=False``) or dollar bars into outputs of ``cap`` rows.

    Returns ``(of, oi, o_inst, o_sess, o_forced, nb)``: ``of`` rows = open, high, low, close,
    volume, buy volume, sum(p*v); ``oi`` rows = ts_open, ts_close, n_trades (one contiguous row
    per column, so ``of[k, :nb]`` is a zero-copy column). On bad input ``err`` receives
    (code, trade index) and the scan stops; ``_ERR_CAP`` means ``cap`` rows were too few.
    """
    n = ts.shape[0]
    cap = max(cap, 1)
    of = np.empty((7, cap), np.float64)
    oi = np.empty((3, cap), np.int64)
    o_inst = np.empty(cap, np.uint32)
    o_sess = np.empty(cap, np.int32)
    o_forced = np.empty(cap, np.bool_)
    nb = 0
    if n == 0:
        return of, oi, o_inst, o_sess, o_forced, nb
    open_ = False
    b_ts0 = ts[0]
    b_o = 0.0
    b_h = 0.0
    b_l = 0.0
    b_v = 0.0
    b_buy = 0.0
    b_pv = 0.0
    b_acc = 0.0
    b_n = 0
    prev_ts = ts[0]
    prev_p = price[0]
    prev_b = 0
    cur_sess = session[0]
    cur_inst = inst[0]
    if cur_sess < 0:
        err[0] = _ERR_SESSION
        err[1] = 0
        return of, oi, o_inst, o_sess, o_forced, nb
    for i in range(n):
        t = ts[i]
        p = price[i]
        v = float(size[i])
        if t < prev_ts:
            err[0] = _ERR_TS
            err[1] = i
            break
        if not (p > 0.0 and p < np.inf):
            err[0] = _ERR_PRICE
            err[1] = i
            break
        if not (v > 0.0 and v < np.inf):
            err[0] = _ERR_SIZE
            err[1] = i
            break
        s_i = session[i]
        k_i = inst[i]
        if s_i != cur_sess or k_i != cur_inst:
            if s_i < 0:
                err[0] = _ERR_SESSION
                err[1] = i
                break
            if open_:
                if nb >= cap:
                    err[0] = _ERR_CAP
                    err[1] = i
                    break
                _store(of, oi, o_inst, o_sess, o_forced, nb, b_ts0, prev_ts, b_o, b_h, b_l,
                       prev_p, b_v, b_buy, b_pv, b_n, cur_inst, cur_sess, True)  # fmt: skip
                nb += 1
                open_ = False
            cur_sess = s_i
            cur_inst = k_i
            prev_b = 0  # tick rule restarts at a session start and at a roll
            prev_p = p
        b = _resolve_sign(sign[i], p, prev_p, prev_b)
        b_ts0, b_o, b_h, b_l, b_v, b_buy, b_pv, b_acc, b_n = _add_trade(
            open_, b_ts0, b_o, b_h, b_l, b_v, b_buy, b_pv, b_acc, b_n, t, p, v, b, dollar, multiplier
        )
        open_ = True
        prev_ts = t
        prev_p = p
        prev_b = b
        if b_acc >= threshold:
            if nb >= cap:
                err[0] = _ERR_CAP
                err[1] = i
                break
            _store(of, oi, o_inst, o_sess, o_forced, nb, b_ts0, t, b_o, b_h, b_l, p, b_v,
                   b_buy, b_pv, b_n, cur_inst, cur_sess, False)  # fmt: skip
            nb += 1
            open_ = False
    if open_ and err[0] == _OK:
        if nb >= cap:
            err[0] = _ERR_CAP
            err[1] = n
        else:
            _store(of, oi, o_inst, o_sess, o_forced, nb, b_ts0, prev_ts, b_o, b_h, b_l, prev_p,
                   b_v, b_buy, b_pv, b_n, cur_inst, cur_sess, True)  # fmt: skip
            nb += 1
    return of, oi, o_inst, o_sess, o_forced, nb


@njit(cache=True)
def _resolve_signs_nb(ts, price, size, sign, session, inst):
    """Validated resolved trade signs (aggressor flag, tick-rule fallback) and segment starts.
    Returns (b, seg_start, error code, bad index)."""
    n = ts.shape[0]
    b_out = np.zeros(n, np.int8)
    seg = np.zeros(n, np.bool_)
    prev_p = 0.0
    prev_b = 0
    for i in range(n):
        p = price[i]
        v = float(size[i])
        if i > 0 and ts[i] < ts[i - 1]:
            return b_out, seg, _ERR_TS, i
        if not (p > 0.0 and p < np.inf):
            return b_out, seg, _ERR_PRICE, i
        if not (v > 0.0 and v < np.inf):
            return b_out, seg, _ERR_SIZE, i
        if i == 0 or session[i] != session[i - 1] or inst[i] != inst[i - 1]:
            if session[i] < 0:
                return b_out, seg, _ERR_SESSION, i
            seg[i] = True
            prev_b = 0
            prev_p = p
        b = _resolve_sign(sign[i], p, prev_p, prev_b)
        b_out[i] = b
        prev_p = p
        prev_b = b
    return b_out, seg, _OK, -1


@njit(cache=True)
def _imbalance_boundaries_nb(
    size, b, seg, volume_weighted, t_init, alpha_bars, alpha_ticks, t_min, t_max, floor_frac, force_factor
):
    """Close indices of imbalance bars. Returns (close_idx, forced, e0t, e0x, thr) per bar; the
    last three are the expectations/threshold the bar was judged against (NaN for warm-up)."""
    n = size.shape[0]
    close_idx = np.empty(n, np.int64)
    forced = np.empty(n, np.bool_)
    o_e0t = np.empty(n, np.float64)
    o_e0x = np.empty(n, np.float64)
    o_thr = np.empty(n, np.float64)
    nb = 0
    e0t = 0.0
    e0x = 0.0
    e0a = 0.0
    have_x = False
    warm = True
    theta = 0.0
    cnt = 0
    thr = 0.0
    limit = 0.0
    bar_e0x = 0.0
    for i in range(n):
        if seg[i]:
            if cnt > 0:  # close the open bar at the break
                close_idx[nb] = i - 1
                forced[nb] = True
                o_e0t[nb] = np.nan if warm else e0t
                o_e0x[nb] = np.nan if warm else bar_e0x
                o_thr[nb] = np.nan if warm else thr
                nb += 1
            e0t = float(t_init)
            e0x = 0.0
            e0a = 0.0
            have_x = False
            warm = True
            theta = 0.0
            cnt = 0
        if cnt == 0 and not warm:
            # threshold fixed at bar open, from expectations over past ticks/bars only
            ax = abs(e0x)
            fl = floor_frac * e0a
            thr = e0t * (ax if ax > fl else fl)
            limit = force_factor * e0t
            bar_e0x = e0x
        x = float(b[i])
        if volume_weighted:
            x *= float(size[i])
        theta += x
        cnt += 1
        if have_x:
            e0x += alpha_ticks * (x - e0x)
            e0a += alpha_ticks * (abs(x) - e0a)
        else:
            e0x = x
            e0a = abs(x)
            have_x = True
        close = False
        is_forced = False
        if warm:
            close = cnt >= t_init
        elif thr > 0.0 and abs(theta) >= thr:
            close = True
        elif cnt >= limit:
            close = True
            is_forced = True
        if close:
            close_idx[nb] = i
            forced[nb] = is_forced
            o_e0t[nb] = np.nan if warm else e0t
            o_e0x[nb] = np.nan if warm else bar_e0x
            o_thr[nb] = np.nan if warm else thr
            nb += 1
            if warm:
                e0t = float(cnt)
                warm = False
            else:
                e0t += alpha_bars * (cnt - e0t)
            e0t = min(max(e0t, t_min), t_max)
            theta = 0.0
            cnt = 0
    if cnt > 0:
        close_idx[nb] = n - 1
        forced[nb] = True
        o_e0t[nb] = np.nan if warm else e0t
        o_e0x[nb] = np.nan if warm else bar_e0x
        o_thr[nb] = np.nan if warm else thr
        nb += 1
    return close_idx[:nb], forced[:nb], o_e0t[:nb], o_e0x[:nb], o_thr[:nb]


@njit(cache=True)
def _aggregate_nb(ts, price, size, b, close_idx):
    """OHLCV of bars whose last trades are ``close_idx`` (contiguous, increasing), in the
    ``(of, oi)`` layout of ``_threshold_bars_nb``."""
    nb = close_idx.shape[0]
    of = np.empty((7, nb), np.float64)
    oi = np.empty((3, nb), np.int64)
    start = 0
    for j in range(nb):
        end = close_idx[j]
        h = price[start]
        lo = price[start]
        vol = 0.0
        buy = 0.0
        pv = 0.0
        for i in range(start, end + 1):
            p = price[i]
            v = float(size[i])
            h = max(h, p)
            lo = min(lo, p)
            vol += v
            pv += p * v
            if b[i] > 0:
                buy += v
        of[0, j] = price[start]
        of[1, j] = h
        of[2, j] = lo
        of[3, j] = price[end]
        of[4, j] = vol
        of[5, j] = buy
        of[6, j] = pv
        oi[0, j] = ts[start]
        oi[1, j] = ts[end]
        oi[2, j] = end - start + 1
        start = end + 1
    return of, oi


# --- bars straight from a trades sidecar ------------------------------------------------------

_ERR_ACTION = 6  # a record that is not a trade (the wrapper raises check_trade_actions' message)
_ACTION_TRADE = ord("T")


@njit(cache=True, nogil=True)
def _sidecar_threshold_bars_nb(ts, iid, price, size, side, action, bounds, act, days, lo, hi, dollar, threshold, multiplier, cap, err, info):  # fmt: skip
    """``_threshold_bars_nb`` fed straight from the sidecar records ``lo:hi`` (no
    ``ActiveTrades`` in between): a record is taken exactly when ``active_trades`` keeps it (its
    session's active contract, defined positive price and size) and decoded as it decodes it
    (price / PRICE_DIVISOR, float size, aggressor sign from ``side``, the session day), so the
    bars are the ones ``build_bars(active_trades(...))`` gives. Outputs grow as needed.

    ``info`` receives: kept trades, first / last kept ts, their (session, instrument), and the
    min / max ts of all records (the caller checks its session table covered them); ``err``:
    (code, record) for a non-trade record or kept trades out of ts order.
    Returns ``(of, oi, o_inst, o_sess, o_forced, nb, kept volume)``.
    """
    cap = max(cap, 16)
    of = np.empty((7, cap), np.float64)
    oi = np.empty((3, cap), np.int64)
    o_inst = np.empty(cap, np.uint32)
    o_sess = np.empty(cap, np.int32)
    o_forced = np.empty(cap, np.bool_)
    nb = 0
    started = False
    open_ = False
    b_ts0 = 0
    b_o = 0.0
    b_h = 0.0
    b_l = 0.0
    b_v = 0.0
    b_buy = 0.0
    b_pv = 0.0
    b_acc = 0.0
    b_n = 0
    prev_ts = 0
    prev_p = 0.0
    prev_b = 0
    cur_sess = 0
    cur_inst = 0
    kept = 0
    volume = 0.0
    mn = np.iinfo(np.int64).max
    mx = np.iinfo(np.int64).min
    k = 0
    # The outputs grow between passes of the inner loop, never inside it: with the output
    # arrays reassigned inside the record loop, numba's code for the loop ran at half speed
    # (1.1 against 0.55 s for 27.6 M records). A pass stops before the record that finds the
    # outputs full (nothing of it counted yet) and the next one resumes at that record.
    start = lo
    while True:
        stop = hi
        for i in range(start, hi):
            t = ts[i]
            mn = min(mn, t)
            mx = max(mx, t)
            if action[i] != _ACTION_TRADE:
                err[0] = _ERR_ACTION
                err[1] = i
                break
            # the selection of active_contract._active_keep_nb
            k = interval_of(bounds, t, k)
            if not k & 1:
                continue
            a = act[(k - 1) >> 1]
            x = iid[i]
            q = price[i]
            if not _kept_trade(a >= 0 and int(x) == a, q, size[i]):
                continue
            # the values of active_contract._active_write_nb
            p = q / PRICE_DIVISOR
            v = float(size[i])
            sg = _aggressor_sign(side[i])
            s_i = days[(k - 1) >> 1]
            if not started:
                started = True
                cur_sess = s_i
                cur_inst = x
                prev_ts = t
                prev_p = p
                info[1] = t
                info[3] = s_i
                info[4] = x
            if t < prev_ts:
                err[0] = _ERR_TS
                err[1] = i
                break
            if nb + 1 >= cap:  # room for this bar and a forced close: grow, resume here
                stop = i
                break
            kept += 1
            volume += v  # exact: integer sizes, float64 sums below 2**53
            # from here on, _threshold_bars_nb's loop body
            if s_i != cur_sess or x != cur_inst:
                if open_:
                    _store(of, oi, o_inst, o_sess, o_forced, nb, b_ts0, prev_ts, b_o, b_h, b_l,
                           prev_p, b_v, b_buy, b_pv, b_n, cur_inst, cur_sess, True)  # fmt: skip
                    nb += 1
                    open_ = False
                cur_sess = s_i
                cur_inst = x
                prev_b = 0  # tick rule restarts at a session start and at a roll
                prev_p = p
            b = _resolve_sign(sg, p, prev_p, prev_b)
            b_ts0, b_o, b_h, b_l, b_v, b_buy, b_pv, b_acc, b_n = _add_trade(
                open_, b_ts0, b_o, b_h, b_l, b_v, b_buy, b_pv, b_acc, b_n, t, p, v, b, dollar, multiplier
            )
            open_ = True
            prev_ts = t
            prev_p = p
            prev_b = b
            if b_acc >= threshold:
                _store(of, oi, o_inst, o_sess, o_forced, nb, b_ts0, t, b_o, b_h, b_l, p, b_v,
                       b_buy, b_pv, b_n, cur_inst, cur_sess, False)  # fmt: skip
                nb += 1
                open_ = False
        if stop == hi:
            break
        cap *= 2
        of2 = np.empty((7, cap), np.float64)
        oi2 = np.empty((3, cap), np.int64)
        of2[:, :nb] = of[:, :nb]
        oi2[:, :nb] = oi[:, :nb]
        of = of2
        oi = oi2
        o_inst = np.concatenate((o_inst[:nb], np.empty(cap - nb, np.uint32)))
        o_sess = np.concatenate((o_sess[:nb], np.empty(cap - nb, np.int32)))
        o_forced = np.concatenate((o_forced[:nb], np.empty(cap - nb, np.bool_)))
        start = stop
    if open_ and err[0] == _OK:
        _store(of, oi, o_inst, o_sess, o_forced, nb, b_ts0, prev_ts, b_o, b_h, b_l, prev_p,
               b_v, b_buy, b_pv, b_n, cur_inst, cur_sess, True)  # fmt: skip
        nb += 1
    info[0] = kept
    info[2] = prev_ts
    info[5] = cur_sess
    info[6] = cur_inst
    info[7] = mn
    info[8] = mx
    return of, oi, o_inst, o_sess, o_forced, nb, volume


@njit(cache=True, nogil=True)
def _session_cut_nb(ts, bounds, i):  # fmt: skip
    """The first record at or after ``i`` that opens a later session than record ``i``'s
    (``ts.shape[0]`` if none): a place to split the records where no bar can span the cut."""
    k0 = interval_of(bounds, ts[i], 0)
    k = k0
    for j in range(i, ts.shape[0]):
        k = interval_of(bounds, ts[j], k)
        if k != k0 and k & 1:
            return j
    return ts.shape[0]


# --- wrappers -------------------------------------------------------------------------------

_SIZE_DTYPES = (np.float64, np.float32, np.int64, np.int32, np.uint32, np.uint64, np.uint16)


def _check_inputs(
    ts: np.ndarray,
    price: np.ndarray,
    size: np.ndarray,
    sign: np.ndarray,
    session: np.ndarray,
    instrument_id: np.ndarray,
) -> tuple[I64, F64, np.ndarray, I8, I32, U32]:
    n = ts.shape[0]
    named = {
        "ts": ts,
        "price": price,
        "size": size,
        "sign": sign,
        "session": session,
        "instrument_id": instrument_id,
    }
    for name, arr in named.items():
        if arr.ndim != 1 or arr.shape[0] != n:
            raise FxDataError(f"trades column {name!r}: shape {arr.shape}, expected ({n},)")
    if size.dtype.type not in _SIZE_DTYPES:
        raise FxDataError(f"trades column 'size': unsupported dtype {size.dtype}")
    ts_a = np.ascontiguousarray(ts, dtype=np.int64)
    price_a = np.ascontiguousarray(price, dtype=np.float64)
    size_a = np.ascontiguousarray(size)
    sign_a = np.ascontiguousarray(sign, dtype=np.int8)
    sess_a = np.ascontiguousarray(session, dtype=np.int32)
    inst_a = np.ascontiguousarray(instrument_id, dtype=np.uint32)
    return ts_a, price_a, size_a, sign_a, sess_a, inst_a


def _raise_kernel_error(code: int, idx: int, ts: I64, price: F64, size: np.ndarray) -> None:
    if code == _ERR_TS:
        raise FxDataError(f"trades column 'ts': not time ordered at trade {idx} ({ts[idx]} < {ts[idx - 1]})")
    if code == _ERR_PRICE:
        raise FxDataError(f"trades column 'price': trade {idx} has invalid price {price[idx]!r}")
    if code == _ERR_SESSION:
        raise FxDataError(
            f"trades column 'session': trade {idx} is outside any session (halt/weekend, session "
            "-1); filter such trades before building bars"
        )
    if code == _ERR_SIZE:
        raise FxDataError(f"trades column 'size': trade {idx} has non-positive size {size[idx]!r}")


def _finish(of: F64, oi: I64, nb: int, inst: U32, sess: I32, forced: B) -> BarTable:
    # Views, not copies: the kernels size their outputs to a tight bound (see build_bars) and
    # lay each column out contiguously.
    lo, h = of[2, :nb], of[1, :nb]
    # VWAP: clipped to [low, high] because sum(p*v)/sum(v) can fall one ulp outside when all
    # prices are equal; the clip only ever moves it by rounding error.
    vwap = np.clip(of[6, :nb] / of[4, :nb], lo, h)
    return BarTable(
        ts_open=oi[0, :nb],
        ts_close=oi[1, :nb],
        open=of[0, :nb],
        high=h,
        low=lo,
        close=of[3, :nb],
        volume=of[4, :nb],
        buy_volume=of[5, :nb],
        vwap=vwap,
        n_trades=oi[2, :nb],
        duration_ns=oi[1, :nb] - oi[0, :nb],
        instrument_id=inst[:nb],
        session_id=sess[:nb],
        forced_close=forced[:nb],
    )


@dataclass(frozen=True)
class ImbalanceDiagnostics:
    """Per-bar expectations an imbalance bar was judged against (NaN for warm-up tick bars):
    ``expected_ticks`` = E0[T] (ticks), ``expected_imbalance`` = E0[x], ``threshold`` =
    E0[T] * max(|E0[x]|, floor), all read when the bar opened."""

    bars: BarTable
    expected_ticks: F64
    expected_imbalance: F64
    threshold: F64


def build_imbalance_bars_with_diagnostics(
    ts: np.ndarray,
    price: np.ndarray,
    size: np.ndarray,
    sign: np.ndarray,
    session: np.ndarray,
    instrument_id: np.ndarray,
    config: BarConfig,
) -> ImbalanceDiagnostics:
    """Imbalance bars plus the thresholds they used (AFML ``analyse_thresholds``)."""
    if config.kind not in ("tick_imbalance", "volume_imbalance"):
        raise ValueError(f"not an imbalance bar kind: {config.kind}")
    ts_a, price_a, size_a, sign_a, sess_a, inst_a = _check_inputs(
        ts, price, size, sign, session, instrument_id
    )
    b, seg, code, idx = _resolve_signs_nb(ts_a, price_a, size_a, sign_a, sess_a, inst_a)
    _raise_kernel_error(int(code), int(idx), ts_a, price_a, size_a)
    t_init = config.imbalance_expected_ticks_init
    close_idx, forced, e0t, e0x, thr = _imbalance_boundaries_nb(
        size_a,
        b,
        seg,
        config.kind == "volume_imbalance",
        t_init,
        2.0 / (config.imbalance_ewma_span_bars + 1.0),
        2.0 / (config.imbalance_ewma_span_ticks + 1.0),
        config.imbalance_ticks_min_factor * t_init,
        config.imbalance_ticks_max_factor * t_init,
        config.imbalance_floor_frac,
        config.imbalance_force_close_factor,
    )
    of, oi = _aggregate_nb(ts_a, price_a, size_a, b, close_idx)
    bars = _finish(of, oi, close_idx.shape[0], inst_a[close_idx], sess_a[close_idx], forced)
    return ImbalanceDiagnostics(bars=bars, expected_ticks=e0t, expected_imbalance=e0x, threshold=thr)


def build_bars(
    ts: np.ndarray,
    price: np.ndarray,
    size: np.ndarray,
    sign: np.ndarray,
    session: np.ndarray,
    instrument_id: np.ndarray,
    config: BarConfig,
) -> BarTable:
    """Bars of one instrument's active-contract trades.

    ``ts``: int64 UTC ns (``ts_recv``), non-decreasing. ``price``: float64 index points, > 0.
    ``size``: contracts (float or unsigned/signed int), > 0. ``sign``: int8 aggressor sign (+1
    buy, -1 sell, 0 unknown -> tick rule). ``session``: int32 session day
    (``calendar.session_day``; -1 is rejected). ``instrument_id``: uint32.
    Raises FxDataError naming the column and trade index on bad input. See the module
    docstring for the closing rules and forced closes.
    """
    if config.kind in ("tick_imbalance", "volume_imbalance"):
        return build_imbalance_bars_with_diagnostics(
            ts, price, size, sign, session, instrument_id, config
        ).bars
    ts_a, price_a, size_a, sign_a, sess_a, inst_a = _check_inputs(
        ts, price, size, sign, session, instrument_id
    )
    dollar = config.kind == "dollar"
    threshold = float(config.dollar_bar_size if dollar else config.volume_bar_size)
    n = ts_a.shape[0]
    cap = n
    if not dollar and n:
        # Every unforced bar holds >= V contracts and every forced one ends at a session or
        # contract change (or the input end); sessions change at most once a calendar day and
        # contracts only at session changes in well-formed input. The kernel reports an
        # overflow for anything else, and we retry with one row per trade.
        total = float(size_a.sum(dtype=np.float64))
        days = (int(ts_a[-1]) - int(ts_a[0])) // 86_400_000_000_000 + 2
        cap = min(n, int(total // threshold) + 2 * days + 16)
    mult = float(config.multiplier)
    err = np.zeros(2, np.int64)
    out = _threshold_bars_nb(ts_a, price_a, size_a, sign_a, sess_a, inst_a, dollar, threshold, mult, cap, err)
    if err[0] == _ERR_CAP:
        err[:] = 0
        out = _threshold_bars_nb(
            ts_a, price_a, size_a, sign_a, sess_a, inst_a, dollar, threshold, mult, n, err
        )
    _raise_kernel_error(int(err[0]), int(err[1]), ts_a, price_a, size_a)
    of, oi, o_inst, o_sess, o_forced, nb = out
    if of.shape[1] > 2 * nb + 1024:  # retry path (one row per trade): do not pin the slack
        of, oi = of[:, :nb].copy(), oi[:, :nb].copy()
        o_inst, o_sess, o_forced = o_inst[:nb].copy(), o_sess[:nb].copy(), o_forced[:nb].copy()
    return _finish(of, oi, int(nb), o_inst, o_sess, o_forced)


# --- diagnostics ----------------------------------------------------------------------------


def bars_per_session(bars: BarTable) -> tuple[I32, I64]:
    """Session ids (ascending) and the number of bars closed in each."""
    ids, counts = np.unique(bars.session_id, return_counts=True)
    return ids.astype(np.int32), counts.astype(np.int64)


def check_bar_density(bars: BarTable, target_bars_per_session: float, tolerance: float = 0.5) -> str | None:
    """A warning when bars per session drift more than ``tolerance`` (±50%) from the target.

    Checks the mean over sessions and every session on its own (partial first/last sessions of
    a data set may trip the per-session check; the message lists them). Returns None when all
    is within the band.
    """
    if target_bars_per_session <= 0:
        raise ValueError("target_bars_per_session must be > 0")
    ids, counts = bars_per_session(bars)
    if ids.size == 0:
        return f"no bars at all (target {target_bars_per_session:g} bars/session)"
    lo, hi = (1 - tolerance) * target_bars_per_session, (1 + tolerance) * target_bars_per_session
    mean = float(counts.mean())
    bad = np.flatnonzero((counts < lo) | (counts > hi))
    if lo <= mean <= hi and bad.size == 0:
        return None
    from fx_assets.core.calendar import session_label

    parts = [
        f"bar density off target {target_bars_per_session:g} bars/session "
        f"(band {lo:g}..{hi:g}): mean {mean:.1f} over {ids.size} sessions"
    ]
    if bad.size:
        shown = ", ".join(f"{session_label(int(ids[k]))}={int(counts[k])}" for k in bad[:5])
        more = f" (+{bad.size - 5} more)" if bad.size > 5 else ""
        parts.append(f"{bad.size} sessions outside the band: {shown}{more}")
    return "; ".join(parts)
