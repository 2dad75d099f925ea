"""Price, order-flow and book model of the synthetic ES-like market (one session at a time).

Owns every modelling choice of ``docs/synthetic-market.md``: the quarterly price skeleton
(session closes, stochastic daily volatility), the intraday activity and volatility profiles,
the latent order-flow imbalance, the planted signal, contract/spread volume shares around the
roll, trade sizes, and the event list fed to the MBP-10 book kernel (``nb.book_nb``).

Determinism: every random draw comes from ``numpy.random.default_rng`` seeded by
``(seed, symbol key, session day or quarter index, stream id)``, so a session depends only on
the config, its symbol and its day, and a quarter never on which other quarters are generated.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from fx_assets.core import calendar
from fx_assets.core.contracts import Contract, contracts_for_quarter, instrument_id_for, spread_symbol
from fx_assets.core.synth import nb

# --- model constants (documented in docs/synthetic-market.md) ---------------------------------
TICK = 0.25
TICK_UNITS = 250_000_000  # 0.25 index points in DBN 1e-9 fixed point
TRADES_PER_SESSION_AT_SCALE_1 = 20_000_000 / 63  # ~63 sessions a quarter -> ~20 M trades
DAILY_VOL = 0.01  # mean daily log-return sd
LOGVOL_PHI = 0.97  # AR(1) persistence of log daily vol (session to session)
LOGVOL_SD = 0.45  # stationary sd of log daily vol
LEVEL_KAPPA = 1.0 / 120.0  # weak mean reversion of the log level per session (keeps 4000-6000)
EPOCH_QUARTER = dt.date(1990, 1, 1)  # the skeleton starts here at the symbol's base level
IMB_TAU_S = 120.0  # latent flow-imbalance OU time constant (s)
IMB_BUY_SLOPE = 0.3  # p(buy) = 0.5 + 0.3 * tanh(I)
FLOW_TAU_S = 60.0  # EWMA time constant of the realised-flow signal (s)
SIGNAL_KAPPA = 0.1  # drift per second = signal * 0.1 * sd_s * ft_{s-1}
SIGNAL_HALFLIFE_S = 3600.0  # the signal (impact) component decays with a 1 h half-life
QUARTER_TAPER_S = 1800  # last 30 min of a quarter: signal component tapered to 0
SIZE_ALPHA = 1.35  # trade size = floor(U ** (-1/alpha)), heavy tail
SIZE_CAP = 2500
SPREAD_SHARE_BASE = 0.02  # calendar-spread share of trades away from the roll
SPREAD_SHARE_ROLL = 0.06  # extra share around the roll (Gaussian bump, 1.5 sessions wide)
SPREAD_SHARE_AFTER_EXPIRY = 0.01
ROLL_SCALE_SESSIONS = 0.55  # logistic width of the volume migration
BASE_LEVELS = {"ES": 5000.0, "NQ": 18000.0, "YM": 38000.0, "RTY": 2000.0, "MES": 5000.0}
RTH_DEPTH = 300.0  # typical level size in RTH (contracts)
LATENCY_MEDIAN_NS = 250_000  # ts_recv - ts_event, lognormal
SEC = calendar.NS_PER_SECOND

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def symbol_key(symbol: str) -> int:
    """Stable 32-bit key of a parent symbol for RNG seeding."""
    return int.from_bytes(hashlib.blake2b(symbol.encode(), digest_size=4).digest(), "little")


def root_of(symbol: str) -> str:
    """``ES.FUT`` -> ``ES``."""
    return symbol.split(".")[0].upper()


def base_level(symbol: str) -> float:
    root = root_of(symbol)
    if root in BASE_LEVELS:
        return BASE_LEVELS[root]
    return 1000.0 + float(symbol_key(symbol) % 9000)


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([int(k) & 0xFFFFFFFF for k in key])


# --- intraday profiles -------------------------------------------------------------------------


@lru_cache(maxsize=1)
def minute_profiles() -> tuple[F64, F64, F64]:
    """Per minute since 17:00 Chicago (1380 minutes): trade intensity g, variance weight v
    (both relative, unnormalised) and RTH flag."""
    m = np.arange(1380, dtype=np.float64)
    g = np.empty(1380)
    g[m < 540] = 0.05  # 17:00-02:00 Asia
    g[(m >= 540) & (m < 840)] = 0.10  # 02:00-07:00 Europe
    g[(m >= 840) & (m < 930)] = 0.22  # 07:00-08:30 pre-open
    rth = (m >= 930) & (m < 1335)  # 08:30-15:15
    u = (m[rth] - 930 + 0.5) / 405.0
    g[rth] = 0.6 + 1.8 * ((u - 0.5) / 0.5) ** 2  # U shape: 2.4 at the ends, 0.6 at noon
    g[m >= 1335] = 0.3  # 15:15-16:00
    v = g**0.6
    v[930:933] *= 6.0  # 08:30 scheduled data: variance bump
    v[1200] *= 3.0  # 13:00 scheduled event
    return g, v, rth.astype(np.float64)


def overnight_volume_share() -> float:
    g, _, rth = minute_profiles()
    return float(g[rth == 0].sum() / g.sum())


# --- skeleton: session closes and daily vol ----------------------------------------------------


def _quarter_index(q: dt.date) -> int:
    return (q.year - EPOCH_QUARTER.year) * 4 + (q.month - 1) // 3


@lru_cache(maxsize=64)
def _skeleton_chain(seed: int, skey: int, upto: int) -> tuple[tuple[F64, F64, F64], ...]:
    """(log-level close, log-vol, daily sd) per session for every quarter 0..upto."""
    y, lv = 0.0, 0.0
    out = []
    q = EPOCH_QUARTER
    for qi in range(upto + 1):
        sess = calendar.quarter_sessions(q)
        n = sess.size
        r = _rng(seed, skey, qi, 0x5C1E)
        eta = r.standard_normal(n)
        eps = r.standard_normal(n)
        ys, lvs, sds = np.empty(n), np.empty(n), np.empty(n)
        c = math.sqrt(1.0 - LOGVOL_PHI**2) * LOGVOL_SD
        for i in range(n):
            lv = LOGVOL_PHI * lv + c * eta[i]
            sd = DAILY_VOL * math.exp(lv - LOGVOL_SD**2)
            y = y * (1.0 - LEVEL_KAPPA) + sd * eps[i]
            ys[i], lvs[i], sds[i] = y, lv, sd
        out.append((ys, lvs, sds))
        q = calendar.next_quarter(q)
    return tuple(out)


def quarter_skeleton(seed: int, symbol: str, quarter: dt.date) -> tuple[float, F64, F64, F64]:
    """(log level at the quarter's first open, closes[n], log-vol[n], daily sd[n]) of a quarter,
    log level relative to the symbol's base level. Depends only on (seed, symbol, quarter)."""
    qi = _quarter_index(quarter)
    if qi < 0:
        raise ValueError(f"quarters before {EPOCH_QUARTER} are not supported: {quarter}")
    chain = _skeleton_chain(int(seed), symbol_key(symbol), qi)
    y0 = float(chain[qi - 1][0][-1]) if qi > 0 else 0.0
    ys, lvs, sds = chain[qi]
    return y0, ys, lvs, sds


def carry_rate(t_ns: F64 | float, seed: int, symbol: str) -> F64:
    """Annual carry (financing minus dividends) as a smooth function of time: 0.025 + 0.02*sin,
    7-year period, seed-dependent phase, so in [0.5%, 4.5%]: near-minus-far calendar spreads are
    negative, about -6 to -56 points for ES."""
    phase = (symbol_key(symbol) ^ (int(seed) * 2654435761)) % 6283 / 1000.0
    years = np.asarray(t_ns, dtype=np.float64) / (365.25 * calendar.NS_PER_DAY)
    return np.asarray(0.025 + 0.02 * np.sin(2.0 * np.pi * years / 7.0 + phase))


def contract_expiry_ns(c: Contract) -> int:
    """Final settlement time: 08:30 Chicago on the expiry Friday (UTC ns)."""
    local = (c.expiry - dt.date(1970, 1, 1)).days * calendar.NS_PER_DAY + calendar.RTH_OPEN_LOCAL_NS
    return int(calendar.local_to_utc_ns(np.array([local], dtype=np.int64))[0])


# --- quarter context ---------------------------------------------------------------------------


@dataclass(frozen=True)
class QuarterPlan:
    """Instruments, sessions and volume shares of one (symbol, quarter)."""

    symbol: str
    quarter: dt.date
    sessions: npt.NDArray[np.int32]
    open_ns: I64
    close_ns: I64
    x: Contract  # expiring in the quarter (front until the roll)
    y: Contract  # next (front after the roll)
    z: Contract  # after next (far leg of the post-expiry spread)
    ids: tuple[int, int, int, int]  # X, Y, X-Y, Y-Z instrument ids
    raw: tuple[str, str, str, str]
    roll_index: int  # index of the roll session (the session ending on the roll date)
    expiry_index: int  # index of the expiry session
    share_y: F64  # per session: Y's share of outright volume
    share_spread: F64  # per session: spreads' share of all trades
    y0: float
    closes: F64
    logvol: F64
    daily_sd: F64


def plan_quarter(seed: int, symbol: str, quarter: dt.date) -> QuarterPlan:
    root = root_of(symbol)
    x, y, z = contracts_for_quarter(root, quarter)
    sessions = calendar.quarter_sessions(quarter)
    open_ns, close_ns = calendar.session_bounds_utc(sessions)
    epoch = dt.date(1970, 1, 1)
    roll_day = (x.roll_date - epoch).days
    exp_day = (x.expiry - epoch).days
    # Holidays are ignored, so the roll Thursday and expiry Friday are always sessions.
    roll_index = int(np.searchsorted(sessions, roll_day))
    expiry_index = int(np.searchsorted(sessions, exp_day))
    d = np.arange(sessions.size, dtype=np.float64)
    share_y = 0.03 + 0.94 / (1.0 + np.exp(-(d - roll_index) / ROLL_SCALE_SESSIONS))
    share_y[d > expiry_index] = 1.0
    share_spread = SPREAD_SHARE_BASE + SPREAD_SHARE_ROLL * np.exp(-(((d - roll_index) / 1.5) ** 2))
    share_spread[d > expiry_index] = SPREAD_SHARE_AFTER_EXPIRY
    raw = (x.raw_symbol, y.raw_symbol, spread_symbol(x, y), spread_symbol(y, z))
    ids = tuple(instrument_id_for(r) for r in raw)
    if len(set(ids)) != 4:
        raise ValueError(f"instrument id collision among {raw}")
    y0, closes, logvol, daily_sd = quarter_skeleton(seed, symbol, quarter)
    return QuarterPlan(
        symbol=symbol,
        quarter=quarter,
        sessions=sessions,
        open_ns=open_ns,
        close_ns=close_ns,
        x=x,
        y=y,
        z=z,
        ids=(ids[0], ids[1], ids[2], ids[3]),
        raw=raw,
        roll_index=roll_index,
        expiry_index=expiry_index,
        share_y=share_y,
        share_spread=share_spread,
        y0=y0,
        closes=closes,
        logvol=logvol,
        daily_sd=daily_sd,
    )


# --- one session -------------------------------------------------------------------------------


@dataclass
class SessionTrades:
    """All trades of a session, time ordered (ts_recv non-decreasing)."""

    ts_event: I64
    ts_recv: I64
    ts_in_delta: npt.NDArray[np.int32]
    slot: npt.NDArray[np.int8]  # 0 X, 1 Y, 2 X-Y, 3 Y-Z
    price_tick: I64
    size: I64
    buy: npt.NDArray[np.bool_]
    sequence: I64


@dataclass
class SessionBookInput:
    """Everything the book kernel needs for a session (outrights X=slot 0, Y=slot 1)."""

    ev_ts_recv: I64
    ev_ts_event: I64
    ev_sec: I64
    ev_slot: I64
    ev_kind: npt.NDArray[np.int8]
    ev_side: npt.NDArray[np.int8]
    ev_size: I64
    ev_seq: I64
    bid_tick: I64
    ask_tick: I64
    depth_base: F64
    imb: F64
    kernel_seed: int


@dataclass
class SessionResult:
    trades: SessionTrades
    book: SessionBookInput
    d_end: float  # signal component carried to the next session
    log_level_end: float
    mid_ticks_front: I64  # per second, front outright mid in ticks * 2 (for tests / reports)


def _latency(r: np.random.Generator, n: int) -> tuple[I64, npt.NDArray[np.int32]]:
    lat = (LATENCY_MEDIAN_NS * np.exp(0.35 * r.standard_normal(n))).astype(np.int64) + 1000
    in_delta = r.integers(10_000, 30_000, n).astype(np.int32)
    return lat, in_delta


def simulate_session(
    plan: QuarterPlan,
    i: int,
    *,
    seed: int,
    scale: float,
    signal: float,
    book_ratio: float,
    d_start: float,
    seq_start: int,
) -> SessionResult:
    """Simulate session ``i`` of the quarter: trades of every instrument, latent books, and the
    book-feed event list. ``d_start`` is the signal component carried from session i-1."""
    day = int(plan.sessions[i])
    skey = symbol_key(plan.symbol)
    r = _rng(seed, skey, day, 0x5E55)
    open_ns = int(plan.open_ns[i])
    n_sec = int((int(plan.close_ns[i]) - open_ns) // SEC)
    last_session = i == plan.sessions.size - 1

    # Intraday profiles on the 1-second grid (local Chicago minute since 17:00).
    g_min, v_min, rth_min = minute_profiles()
    tod = calendar.local_time_of_day_ns(open_ns + np.arange(0, n_sec, 60, dtype=np.int64) * SEC)
    minute = ((tod - calendar.SESSION_OPEN_LOCAL_NS) % calendar.NS_PER_DAY) // calendar.NS_PER_MINUTE
    minute = np.clip(minute, 0, 1379)
    g_sec = np.repeat(g_min[minute], 60)[:n_sec]
    v_sec = np.repeat(v_min[minute], 60)[:n_sec]
    v_sec = v_sec / v_sec.sum()

    # Activity follows the day's volatility (busy days are volatile days).
    lv = float(plan.logvol[i])
    activity = math.exp(0.7 * lv - 0.245 * LOGVOL_SD**2)
    n_target = TRADES_PER_SESSION_AT_SCALE_1 * scale * activity
    lam = n_target * g_sec / g_sec.sum()

    # Expiry session: the expiring contract stops at 08:30 Chicago.
    sec_0830 = int((calendar.RTH_OPEN_LOCAL_NS - calendar.SESSION_OPEN_LOCAL_NS + calendar.NS_PER_DAY) // SEC)
    x_alive_sec = n_sec if i < plan.expiry_index else (sec_0830 if i == plan.expiry_index else 0)
    share_x = np.full(n_sec, 1.0 - float(plan.share_y[i]))
    share_x[x_alive_sec:] = 0.0
    spread_slot_sec = np.full(n_sec, 2, dtype=np.int8)
    spread_slot_sec[x_alive_sec:] = 3
    p_spread = float(plan.share_spread[i])

    # --- trades (independent of prices) ---
    counts = r.poisson(lam)
    n = int(counts.sum())
    sec = np.repeat(np.arange(n_sec, dtype=np.int64), counts)
    t_off = np.sort(sec * SEC + r.integers(0, SEC, n))
    sec = t_off // SEC
    phi = math.exp(-1.0 / IMB_TAU_S)
    imb_latent = nb.ar1_nb(
        r.standard_normal(n_sec) * math.sqrt(1.0 - phi * phi), phi, float(r.standard_normal())
    )
    timb = np.tanh(imb_latent)
    buy = r.random(n) < (0.5 + IMB_BUY_SLOPE * timb)[sec]
    size = np.minimum(np.floor(r.random(n) ** (-1.0 / SIZE_ALPHA)), SIZE_CAP).astype(np.int64)
    size = np.maximum(size, 1)
    u = r.random(n)
    is_spread = u < p_spread
    u2 = (u - p_spread) / (1.0 - p_spread)
    slot = np.where(is_spread, spread_slot_sec[sec], np.where(u2 < share_x[sec], 0, 1)).astype(np.int8)

    # --- realised flow -> signal component (causal) ---
    outright = slot < 2
    signed = np.where(buy, size, -size).astype(np.float64)
    flow = np.bincount(sec[outright], weights=signed[outright], minlength=n_sec)
    vol = np.bincount(sec[outright], weights=size[outright].astype(np.float64), minlength=n_sec)
    sd_day = float(plan.daily_sd[i])
    sd_sec = sd_day * np.sqrt(v_sec)
    rho = 0.5 ** (1.0 / SIGNAL_HALFLIFE_S)
    d_path, _ft = nb.signal_path_nb(
        flow, vol, sd_sec, math.exp(-1.0 / FLOW_TAU_S), rho, SIGNAL_KAPPA * signal, d_start
    )

    # --- martingale part: Gaussian bridge from the previous close to this session's close ---
    y_open = plan.y0 if i == 0 else float(plan.closes[i - 1])
    y_close = float(plan.closes[i])
    z = r.standard_normal(n_sec)
    cum = np.cumsum(sd_sec * z)
    vcum = np.cumsum(v_sec)  # sums to 1
    bridged = cum - vcum * (cum[-1] - (y_close - y_open))
    m_path = y_open + np.concatenate(([0.0], bridged[:-1]))  # value in force during each second
    d_sec = d_path[:-1].copy()
    d_end = float(d_path[-1])
    if last_session:
        w = np.clip((n_sec - np.arange(n_sec)) / QUARTER_TAPER_S, 0.0, 1.0)
        d_sec *= w
        d_end = 0.0
    x_log = m_path + d_sec
    spot = base_level(plan.symbol) * np.exp(x_log)

    # --- contract prices (carry) and latent touches ---
    t_sec = open_ns + np.arange(n_sec, dtype=np.int64) * SEC
    c = carry_rate(t_sec.astype(np.float64), seed, plan.symbol)
    ns_year = 365.25 * calendar.NS_PER_DAY

    def fut(con: Contract) -> F64:
        tau = np.maximum(contract_expiry_ns(con) - t_sec, 0).astype(np.float64) / ns_year
        return np.asarray(spot * np.exp(c * tau))

    fx_, fy_, fz_ = fut(plan.x), fut(plan.y), fut(plan.z)
    n_min = (n_sec + 59) // 60
    wide_p = np.where(rth_min[minute] > 0, 0.01, np.where(g_min[minute] < 0.15, 0.12, 0.04))
    bid_tick = np.empty((2, n_sec), dtype=np.int64)
    ask_tick = np.empty((2, n_sec), dtype=np.int64)
    for k, f in enumerate((fx_, fy_)):
        wide = np.repeat((r.random(n_min) < wide_p).astype(np.int64), 60)[:n_sec]
        b = np.floor(f / TICK - 0.5 * wide).astype(np.int64)
        bid_tick[k] = b
        ask_tick[k] = b + 1 + wide
    sp_xy = np.floor((fx_ - fy_) / TICK).astype(np.int64)
    sp_yz = np.floor((fy_ - fz_) / TICK).astype(np.int64)

    price_tick = np.empty(n, dtype=np.int64)
    for k in (0, 1):
        sel = slot == k
        s_k = sec[sel]
        price_tick[sel] = np.where(buy[sel], ask_tick[k][s_k], bid_tick[k][s_k])
    for k, sp in ((2, sp_xy), (3, sp_yz)):
        sel = slot == k
        s_k = sec[sel]
        price_tick[sel] = np.where(buy[sel], sp[s_k] + 1, sp[s_k])

    ts_event = open_ns + t_off
    lat, in_delta = _latency(r, n)
    # Records received after 16:00 would fall into the halt: cap at the session close - 1 ns.
    close_ns = int(plan.close_ns[i])
    ts_recv = np.minimum(np.maximum.accumulate(ts_event + lat), close_ns - 1)
    sequence = seq_start + np.arange(n, dtype=np.int64)
    trades = SessionTrades(ts_event, ts_recv, in_delta, slot, price_tick, size, buy, sequence)

    # --- book-feed events (outrights only) ---
    out_idx = np.flatnonzero(outright)
    lam_out = lam * (1.0 - p_spread)
    if book_ratio >= 1.0:
        t_sel = out_idx  # every outright trade is a T record
    else:
        t_sel = out_idx[r.random(out_idx.size) < 0.4 * book_ratio]  # thinned feed
    # A/C/M budget: book_ratio x outright trades in all, less the T records and the refresh
    # records the T records alone would need (touch moved since the slot's previous T).
    s_t, k_t = sec[t_sel], slot[t_sel]
    refresh_est = 0
    for k in (0, 1):
        sk = s_t[k_t == k]
        if sk.size:
            bb, aa = bid_tick[k][sk], ask_tick[k][sk]
            refresh_est += 1 + int(((bb[1:] != bb[:-1]) | (aa[1:] != aa[:-1])).sum())
    budget = max(0.0, book_ratio * out_idx.size - t_sel.size - refresh_est)
    acm_mean = lam_out * (budget / max(float(lam_out.sum()), 1e-12))
    acm_counts = r.poisson(acm_mean)
    n_acm = int(acm_counts.sum())
    a_sec = np.repeat(np.arange(n_sec, dtype=np.int64), acm_counts)
    a_ts_event = open_ns + a_sec * SEC + r.integers(0, SEC, n_acm)
    a_lat, _ = _latency(r, n_acm)
    a_ts_recv = np.minimum(a_ts_event + a_lat, close_ns - 1)
    p_book_x = np.clip(0.2 + 0.6 * share_x, 0.0, 1.0)
    p_book_x[x_alive_sec:] = 0.0
    a_slot = (r.random(n_acm) >= p_book_x[a_sec]).astype(np.int64)
    a_seq = seq_start + np.searchsorted(ts_recv, a_ts_recv, side="right") - 1
    a_seq = np.maximum(a_seq, seq_start)

    ev_ts_recv = np.concatenate((ts_recv[t_sel], a_ts_recv))
    order = np.argsort(ev_ts_recv, kind="stable")
    nt = t_sel.size
    book = SessionBookInput(
        ev_ts_recv=ev_ts_recv[order],
        ev_ts_event=np.concatenate((ts_event[t_sel], a_ts_event))[order],
        ev_sec=np.concatenate((sec[t_sel], np.clip(a_sec, 0, n_sec - 1)))[order],
        ev_slot=np.concatenate((slot[t_sel].astype(np.int64), a_slot))[order],
        ev_kind=np.concatenate((np.ones(nt, np.int8), np.zeros(n_acm, np.int8)))[order],
        ev_side=np.concatenate((np.where(buy[t_sel], 1, -1).astype(np.int8), np.zeros(n_acm, np.int8)))[
            order
        ],
        ev_size=np.concatenate((size[t_sel], np.zeros(n_acm, np.int64)))[order],
        ev_seq=np.concatenate((sequence[t_sel], a_seq))[order],
        bid_tick=bid_tick,
        ask_tick=ask_tick,
        depth_base=RTH_DEPTH * (g_sec / 1.2) ** 0.6,
        imb=timb,
        kernel_seed=int(r.integers(0, 2**31 - 1)),
    )
    front = 0 if i < plan.roll_index and x_alive_sec > 0 else 1
    mid2 = bid_tick[front] + ask_tick[front]
    return SessionResult(trades, book, d_end, float(x_log[-1]), mid2)
