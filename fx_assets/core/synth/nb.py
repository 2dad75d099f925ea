"""Numba kernels of the synthetic market (plain arrays in, plain arrays out).

Owns the three sequential recursions that numpy cannot vectorise: the AR(1) latent order-flow
imbalance, the causal signal/impact path driven by realised order flow, and the MBP-10 book
state machine that turns a time-ordered event list into book records (with the optional
event-time snapshot signal: a touch offset driven by the book's own level-1 imbalance).
Callers in ``market.py`` / ``generate.py`` validate shapes and document units.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def ar1_nb(innov: np.ndarray, phi: float, x0: float) -> np.ndarray:
    """x[0] = phi*x0 + innov[0]; x[t] = phi*x[t-1] + innov[t]."""
    n = innov.shape[0]
    out = np.empty(n, dtype=np.float64)
    x = x0
    for t in range(n):
        x = phi * x + innov[t]
        out[t] = x
    return out


@njit(cache=True)
def signal_path_nb(
    flow: np.ndarray,
    volume: np.ndarray,
    sd: np.ndarray,
    decay_flow: float,
    rho: float,
    kappa: float,
    d0: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Causal signal path on a 1-second grid.

    ``ft[s]`` = EWMA of signed outright volume up to and including second ``s`` divided by
    the EWMA of total volume (+1 contract, so quiet periods give ~0): the recent net aggressor
    imbalance in [-1, 1]. ``d[s]`` is the signal component of the log price *in force during*
    second ``s``: d[s] = rho*d[s-1] + kappa*sd[s-1]*ft[s-1], d[0] = d0, so second ``s`` only
    sees flow of seconds < s. Returns (d, ft) and d_end (carried to the next session) as
    d[n] stored in an extra slot: ``d`` has n+1 entries.
    """
    n = flow.shape[0]
    d = np.empty(n + 1, dtype=np.float64)
    ft = np.empty(n, dtype=np.float64)
    num = 0.0
    den = 0.0
    d[0] = d0
    for s in range(n):
        num = decay_flow * num + flow[s]
        den = decay_flow * den + volume[s]
        ft[s] = num / (den + 1.0)
        d[s + 1] = rho * d[s] + kappa * sd[s] * ft[s]
    return d, ft


@njit(cache=True)
def _fresh_size(rng: np.random.Generator, base: float, level: int, imb_sign: float) -> int:
    # Depth grows gently away from the touch; the top 3 levels lean with the latent imbalance.
    mult = 0.55 + 0.12 * level
    if level < 3:
        mult *= 1.0 + 0.35 * imb_sign
    sz = base * mult * np.exp(0.4 * rng.standard_normal())
    if sz < 1.0:
        return 1
    return int(sz)


@njit(cache=True)
def _count_for(rng: np.random.Generator, size: int) -> int:
    c = int(size / (2.0 + 2.5 * rng.random()))
    if c < 1:
        c = 1
    if c > size:
        c = size
    return c


@njit(cache=True)
def book_nb(
    ev_ts_recv: np.ndarray,  # int64 [n] sorted
    ev_ts_event: np.ndarray,  # int64 [n]
    ev_sec: np.ndarray,  # int64 [n] second of the session the event belongs to
    ev_slot: np.ndarray,  # int64 [n] book slot (0..n_slots-1)
    ev_kind: np.ndarray,  # int8 [n]: 0 add/cancel/modify event, 1 trade
    ev_side: np.ndarray,  # int8 [n]: trades: +1 buy aggressor, -1 sell aggressor
    ev_size: np.ndarray,  # int64 [n]: trades: size
    ev_seq: np.ndarray,  # int64 [n]
    bid_tick: np.ndarray,  # int64 [n_slots, n_sec] latent best bid (ticks)
    ask_tick: np.ndarray,  # int64 [n_slots, n_sec] latent best ask (ticks)
    depth_base: np.ndarray,  # float64 [n_sec] typical level size
    imb: np.ndarray,  # float64 [n_sec] latent imbalance in [-1, 1] (+ = more bids)
    st_bid: np.ndarray,  # int64 [n_slots] state: current best bid tick (-1 = empty book)
    st_ask: np.ndarray,  # int64 [n_slots]
    st_bsz: np.ndarray,  # int64 [n_slots, 10]
    st_asz: np.ndarray,  # int64 [n_slots, 10]
    st_bct: np.ndarray,  # int64 [n_slots, 10]
    st_act: np.ndarray,  # int64 [n_slots, 10]
    last_ts: np.ndarray,  # int64 [1] ts_recv of the last record written (monotonic guard)
    rng: np.random.Generator,
    snap_strength: float,  # planted snapshot signal, ticks per unit of x (0: off, no effect)
    snap_a_fast: float,  # per-event decay of the fast EWMA of I1 (1 - 1/tau_fast)
    snap_a_slow: float,  # per-event decay of the slow EWMA of I1 (1 - 1/tau_slow)
    st_fast: np.ndarray,  # float64 [n_slots] state: fast sum F
    st_slow: np.ndarray,  # float64 [n_slots] state: slow sum S
    st_off: np.ndarray,  # int64 [n_slots] state: touch offset D in ticks
    st_ring: np.ndarray,  # float64 [n_slots, delay] state: the last `delay` I1 values (delay >= 1)
    st_pos: np.ndarray,  # int64 [n_slots] state: ring position (oldest entry)
    snap_lean: float,  # the driver is I1 - snap_lean * imb[s] (the latent lean's share of I1 removed)
    ev_off: np.ndarray,  # int64 [n] out: the offset D the event's book was placed with
) -> tuple[
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    int,
]:
    """Run the MBP-10 book through the events; return the records (book *after* each event).

    Before every event the book of its slot is moved to the latent best bid/ask of the event's
    second (levels that survive keep their sizes, new levels get fresh sizes). For an
    add/cancel/modify event that move *is* the record when it changed the touch; for a trade
    it is written as a separate refresh record just before the trade, so that every ``T``
    record prints at the best ask (buy) / best bid (sell) of the previous record of its
    instrument. Outputs (m = records written): ts_recv, ts_event, slot, action (ASCII),
    side (ASCII), price (ticks), size, depth, seq, bid/ask ticks [m] of level 0, bsz/asz/bct/
    act [m, 10]; bid level k = bid0 - k ticks, ask level k = ask0 + k ticks.

    Snapshot signal (``snap_strength != 0``): before event i of slot k, with ``I1`` the level-1
    imbalance ``(Qb1 - Qa1)/(Qb1 + Qa1)`` of the slot's book after its previous event (0 on an
    empty book), the driver ``x = I1 - snap_lean * imb[s]`` enters a ring of ``d`` =
    ``st_ring.shape[1]`` events (0 before the session's first), ``F = a_f F + x[n-d]``, ``S =
    a_s S + x[n-d]``, and at add/cancel/modify events (never at a trade, so a T record prints at
    the previous record's touch) ``D = round(strength * (S - F))`` ticks. D *translates* the
    written prices (touch, every level, the record's price); the book state machine itself (sizes,
    draws) is the default one, so I1 is exactly the default market's and there is no feedback.
    ``D(n) = round(strength * sum_{j>=d} (a_s**(j-d) - a_f**(j-d)) x[n-j])``: a causal response,
    0 up to lag d, peaking at lag ~ d + ln(tau_s/tau_f) tau_s tau_f / (tau_s - tau_f), dying out
    after a few tau_s. Strength 0: D == 0, no change.
    """
    n = ev_ts_recv.shape[0]
    m_max = 2 * n
    o_recv = np.empty(m_max, dtype=np.int64)
    o_event = np.empty(m_max, dtype=np.int64)
    o_slot = np.empty(m_max, dtype=np.int64)
    o_action = np.empty(m_max, dtype=np.uint8)
    o_side = np.empty(m_max, dtype=np.uint8)
    o_price = np.empty(m_max, dtype=np.int64)
    o_size = np.empty(m_max, dtype=np.int64)
    o_depth = np.empty(m_max, dtype=np.uint8)
    o_seq = np.empty(m_max, dtype=np.int64)
    o_bid = np.empty(m_max, dtype=np.int64)
    o_ask = np.empty(m_max, dtype=np.int64)
    o_bsz = np.empty((m_max, 10), dtype=np.int64)
    o_asz = np.empty((m_max, 10), dtype=np.int64)
    o_bct = np.empty((m_max, 10), dtype=np.int64)
    o_act = np.empty((m_max, 10), dtype=np.int64)
    nb_ = np.empty(10, dtype=np.int64)
    nbc = np.empty(10, dtype=np.int64)
    A = np.uint8(65)
    B = np.uint8(66)
    C = np.uint8(67)
    M = np.uint8(77)
    T = np.uint8(84)
    m = 0
    lt = last_ts[0]
    for i in range(n):
        k = ev_slot[i]
        s = ev_sec[i]
        if snap_strength != 0.0:
            i1 = 0.0
            if st_bid[k] >= 0:
                q1 = st_bsz[k, 0] + st_asz[k, 0]
                if q1 > 0:
                    i1 = (st_bsz[k, 0] - st_asz[k, 0]) / q1
            # The EWMAs read the driver `delay` events late, so D carries no weight at the short
            # lags over which I1 is autocorrelated; the latent lean (slow, shared by many events)
            # is taken out so D(n) does not already hold the slow part of I1(n): the AUC is back
            # at 0.5 once the response has passed (h ~ 500).
            p = st_pos[k]
            x_in = st_ring[k, p]
            st_ring[k, p] = i1 - snap_lean * imb[s]
            st_pos[k] = p + 1 if p + 1 < st_ring.shape[1] else 0
            st_fast[k] = snap_a_fast * st_fast[k] + x_in
            st_slow[k] = snap_a_slow * st_slow[k] + x_in
            if ev_kind[i] == 0:
                st_off[k] = np.int64(np.round(snap_strength * (st_slow[k] - st_fast[k])))
        ev_off[i] = st_off[k]
        off = st_off[k]
        tb = bid_tick[k, s]
        ta = ask_tick[k, s]
        base = depth_base[s]
        im = imb[s]
        moved = tb != st_bid[k] or ta != st_ask[k]
        act = np.uint8(0)
        sd = np.uint8(0)
        px = 0
        qty = 0
        dep = 0
        if moved:
            old_b = st_bid[k]
            old_a = st_ask[k]
            # Record of the move: touch improved -> add there; touch retreated -> cancel there.
            # Both touches usually move together: report either side's change at random.
            bid_changed = tb != old_b
            ask_changed = ta != old_a
            use_bid = bid_changed and (not ask_changed or rng.random() < 0.5)
            if old_b < 0:
                act, sd, px, dep = A, B, tb, 0
            elif use_bid and tb > old_b:
                act, sd, px, dep = A, B, tb, 0
            elif use_bid:
                act, sd, px, dep = C, B, old_b, 0
                qty = st_bsz[k, 0]
            elif ta < old_a:
                act, sd, px, dep = A, np.uint8(65), ta, 0
            else:
                act, sd, px, dep = C, np.uint8(65), old_a, 0
                qty = st_asz[k, 0]
            for lv in range(10):
                j = lv + (old_b - tb) if old_b >= 0 else -1
                if 0 <= j < 10:
                    nb_[lv] = st_bsz[k, j]
                    nbc[lv] = st_bct[k, j]
                else:
                    nb_[lv] = _fresh_size(rng, base, lv, im)
                    nbc[lv] = _count_for(rng, nb_[lv])
            for lv in range(10):
                st_bsz[k, lv] = nb_[lv]
                st_bct[k, lv] = nbc[lv]
            for lv in range(10):
                j = (ta + lv) - old_a if old_a >= 0 else -1
                if 0 <= j < 10:
                    nb_[lv] = st_asz[k, j]
                    nbc[lv] = st_act[k, j]
                else:
                    nb_[lv] = _fresh_size(rng, base, lv, -im)
                    nbc[lv] = _count_for(rng, nb_[lv])
            for lv in range(10):
                st_asz[k, lv] = nb_[lv]
                st_act[k, lv] = nbc[lv]
            st_bid[k] = tb
            st_ask[k] = ta
            if act == A:
                qty = st_bsz[k, 0] if sd == B else st_asz[k, 0]
        if ev_kind[i] == 1 and moved:
            # Refresh record carrying the moved book, strictly before the trade.
            t_r = ev_ts_recv[i] - 1
            if t_r < lt:
                t_r = lt
            t_e = ev_ts_event[i] - 1
            if t_e > t_r:
                t_e = t_r
            o_recv[m] = t_r
            o_event[m] = t_e
            o_slot[m] = k
            o_action[m] = act
            o_side[m] = sd
            o_price[m] = px + off
            o_size[m] = qty
            o_depth[m] = dep
            o_seq[m] = ev_seq[i]
            o_bid[m] = st_bid[k] + off
            o_ask[m] = st_ask[k] + off
            for lv in range(10):
                o_bsz[m, lv] = st_bsz[k, lv]
                o_asz[m, lv] = st_asz[k, lv]
                o_bct[m, lv] = st_bct[k, lv]
                o_act[m, lv] = st_act[k, lv]
            lt = t_r
            m += 1
        if ev_kind[i] == 1:
            q = ev_size[i]
            if ev_side[i] > 0:
                act, sd, px = T, B, st_ask[k]
                left = st_asz[k, 0] - q
                if left <= 0:
                    # Level exhausted at a price the latent touch keeps: hidden liquidity refills.
                    st_asz[k, 0] = _fresh_size(rng, base, 0, -im)
                    st_act[k, 0] = _count_for(rng, st_asz[k, 0])
                else:
                    st_asz[k, 0] = left
                    if st_act[k, 0] > left:
                        st_act[k, 0] = left
            else:
                act, sd, px = T, np.uint8(65), st_bid[k]
                left = st_bsz[k, 0] - q
                if left <= 0:
                    st_bsz[k, 0] = _fresh_size(rng, base, 0, im)
                    st_bct[k, 0] = _count_for(rng, st_bsz[k, 0])
                else:
                    st_bsz[k, 0] = left
                    if st_bct[k, 0] > left:
                        st_bct[k, 0] = left
            qty = q
            dep = 0
        elif not moved:
            # Plain add / cancel / modify at a level, more often near the touch.
            lv = 0
            while lv < 9 and rng.random() > 0.35:
                lv += 1
            bid_side = rng.random() < 0.5 * (1.0 + 0.3 * im)
            cur = st_bsz[k, lv] if bid_side else st_asz[k, lv]
            u = rng.random()
            q = 1 + int(rng.exponential(0.15 * base + 1.0))
            if u < 0.4 or cur <= 1:
                act = A
                new = cur + q
            elif u < 0.75:
                act = C
                if q >= cur:
                    q = cur - 1
                new = cur - q
            else:
                act = M
                new = _fresh_size(rng, base, lv, im if bid_side else -im)
                q = new
            if bid_side:
                st_bsz[k, lv] = new
                st_bct[k, lv] = _count_for(rng, new)
                sd = B
                px = st_bid[k] - lv
            else:
                st_asz[k, lv] = new
                st_act[k, lv] = _count_for(rng, new)
                sd = np.uint8(65)
                px = st_ask[k] + lv
            qty = q
            dep = lv
        t_r = ev_ts_recv[i]
        if t_r < lt:
            t_r = lt
        o_recv[m] = t_r
        o_event[m] = ev_ts_event[i] if ev_ts_event[i] <= t_r else t_r
        o_slot[m] = k
        o_action[m] = act
        o_side[m] = sd
        o_price[m] = px + off
        o_size[m] = qty
        o_depth[m] = dep
        o_seq[m] = ev_seq[i]
        o_bid[m] = st_bid[k] + off
        o_ask[m] = st_ask[k] + off
        for lv in range(10):
            o_bsz[m, lv] = st_bsz[k, lv]
            o_asz[m, lv] = st_asz[k, lv]
            o_bct[m, lv] = st_bct[k, lv]
            o_act[m, lv] = st_act[k, lv]
        lt = t_r
        m += 1
    last_ts[0] = lt
    return (
        o_recv[:m],
        o_event[:m],
        o_slot[:m],
        o_action[:m],
        o_side[:m],
        o_price[:m],
        o_size[:m],
        o_depth[:m],
        o_seq[:m],
        o_bid[:m],
        o_ask[:m],
        o_bsz[:m],
        o_asz[:m],
        o_bct[:m],
        o_act[:m],
        m,
    )
