"""Synthetic market driver: config, per-quarter record streams, DBN files, report, manifest.

Owns the public entry point ``generate_market`` (used by the CLI and the Dagster demo) and
``iter_quarter_records`` (the in-memory record stream that the files are written from, also
used by tests to check what Databento reads back). One (symbol, quarter) is generated session
by session and streamed to two zstd DBN files, so memory is bounded by one session.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fx_assets.core import calendar
from fx_assets.core.atomic import atomic_path, atomic_write_text
from fx_assets.core.errors import FxDataError
from fx_assets.core.synth import market, nb
from fx_assets.core.synth.dbn_writer import (
    F_LAST,
    MBP10_DTYPE,
    PUBLISHER_ID_GLBX,
    RTYPE_MBP10,
    RTYPE_TRADES,
    TRADE_DTYPE,
    DbnStreamWriter,
    MappingInterval,
    SymbolMapping,
    encode_metadata,
)

BOOK_CHUNK_EVENTS = 65_536  # book kernel chunk: bounds the MBP-10 working set (~50 MB)
SNAP_TAU_FAST = 15.0  # snapshot signal: fast EWMA time constant of I1, in book events of the contract
SNAP_TAU_SLOW = 100.0  # ... and the slow one
SNAP_LEAN = 0.3  # driver I1 - 0.3 tanh(I): the latent lean of I1 out (fresh-queue slope ~0.35 x 0.93)
SNAP_DELAY = 8  # events: the EWMAs read I1 this late, so the response peaks ~8 + 34 = 42 later

SNAP_SIGNAL_DESCRIPTION = (
    "Event-time snapshot signal (off unless snap_signal != 0): before each book event n of an "
    "outright, with I1 = (Qb1 - Qa1)/(Qb1 + Qa1) the level-1 queue imbalance of its book after "
    "event n-1 and x = I1 - 0.3 tanh(I) (I the latent flow imbalance of the second: its lean of "
    "the fresh queue sizes taken out), F = a_f F + x(n-d) and S = a_s S + x(n-d) (a = 1 - 1/tau, "
    "tau_f = 15, tau_s = 100 events, delay d = 8 events, state carried across a quarter's sessions); at "
    "add/cancel/modify events D = round(snap_signal * (S - F)) ticks, and every written price of "
    "the outright (touch, all levels, record price, trades in both files) is the default "
    "market's plus D (a translation: sizes and draws are the default market's). D(n) = "
    "round(snap_signal * sum_{j>=d} (a_s^(j-d) - a_f^(j-d)) x(n-j)): an update's level-1 "
    "imbalance moves the mid in its direction with a response that is 0 for 8 updates, peaks "
    "about 42 updates later and is below 1% of its peak by 500. So the level-1 imbalance predicts "
    "the sign of the mid move h updates ahead with a strength peaking at h ~ 20-50 and gone by "
    "h ~ 500 (measured: docs/synthetic-market.md). snap_signal = 0 (and --null): D == 0, the "
    "files are exactly the default market's."
)

SIGNAL_DESCRIPTION = (
    "Causal order-flow signal on a 1-second grid. ft[s] = E_s(signed outright volume) / "
    "(E_s(outright volume) + 1), E_s an EWMA with time constant 60 s over seconds <= s "
    "(buy aggressor +size, sell -size). The log price is m[s] + d[s] with m a martingale "
    "(Gaussian bridge between session closes) and d[s] = rho*d[s-1] + signal*0.1*sd[s-1]*ft[s-1], "
    "rho = 0.5**(1/3600) (1 h half-life), sd[s] the martingale's per-second sd. So the expected "
    "log return over the next seconds is signal*0.1*sd*ft (minus the slow decay of d): positive in "
    "the recent net aggressor imbalance. The aggressor mix itself follows a latent OU imbalance I "
    "(tau 120 s): p(buy) = 0.5 + 0.3*tanh(I); the top three book levels lean with tanh(I) "
    "(bid sizes x (1 + 0.35 tanh I), ask sizes x (1 - 0.35 tanh I)). signal = 0: d == 0, the price "
    "does not depend on order flow or on any intraday information."
)


@dataclass(frozen=True)
class SynthConfig:
    """What to generate. ``quarters`` are first days of quarters (``calendar.parse_quarter``)."""

    quarters: tuple[dt.date, ...]
    symbols: tuple[str, ...] = ("ES.FUT",)
    scale: float = 1.0  # 1.0 ~ 20 M trades per quarter
    seed: int = 0
    signal: float = 0.0  # planted order-flow signal strength; 0.0 == --null
    book_ratio: float = 0.1  # book (MBP-10) records per outright trade
    # planted event-time signal, ticks per unit of the imbalance response (SNAP_SIGNAL_DESCRIPTION);
    # 0.0 == off (--null); != 0 makes a session's book be built before its trades are written
    snap_signal: float = 0.0

    def validate(self) -> None:
        if not self.quarters:
            raise FxDataError("synth config: no quarters requested")
        if isinstance(self.symbols, str):
            raise FxDataError(f"synth config: symbols must be a tuple, got the string {self.symbols!r}")
        for q in self.quarters:
            if not isinstance(q, dt.date):
                raise FxDataError(f"synth config: quarter {q!r} is not a datetime.date")
            if q.day != 1 or q.month not in (1, 4, 7, 10):
                raise FxDataError(f"synth config: {q} is not the first day of a quarter")
            if q < market.EPOCH_QUARTER:
                raise FxDataError(f"synth config: quarter {q} is before {market.EPOCH_QUARTER}")
        if not self.symbols:
            raise FxDataError("synth config: no symbols")
        for s in self.symbols:
            if not s or "/" in s or not s.replace(".", "").isalnum():
                raise FxDataError(f"synth config: bad symbol {s!r} (expected e.g. ES.FUT)")
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise FxDataError(f"synth config: scale must be > 0, got {self.scale}")
        if not (np.isfinite(self.book_ratio) and self.book_ratio >= 0):
            raise FxDataError(f"synth config: book_ratio must be >= 0, got {self.book_ratio}")
        if not np.isfinite(self.signal):
            raise FxDataError(f"synth config: signal must be finite, got {self.signal}")
        if not np.isfinite(self.snap_signal):
            raise FxDataError(f"synth config: snap_signal must be finite, got {self.snap_signal}")
        if not 0 <= self.seed < 2**32:
            raise FxDataError(f"synth config: seed must be in [0, 2**32), got {self.seed}")

    @property
    def null(self) -> bool:
        """No planted signal of either kind."""
        return self.signal == 0.0 and self.snap_signal == 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "symbols": list(self.symbols),
            "quarters": [calendar.quarter_label(q) for q in self.quarters],
            "scale": self.scale,
            "seed": self.seed,
            "signal": self.signal,
            "book_ratio": self.book_ratio,
        }
        if self.snap_signal != 0.0:  # absent when off: the default manifest stays byte-identical
            d["snap_signal"] = self.snap_signal
        return d


@dataclass
class QuarterReport:
    symbol: str
    quarter: str
    trades_path: str
    mbp10_path: str
    n_sessions: int
    first_session: str
    last_session: str
    n_trades: int
    n_spread_trades: int
    n_book_records: int
    n_book_trades: int
    contracts: dict[str, int]  # raw symbol -> instrument_id
    roll: dict[str, str]  # from, to, roll_date, expiry
    open_level: float  # spot-equivalent index level at the quarter's first open
    close_level: float  # ... and at its last close (the next quarter's open level)


@dataclass
class SynthReport:
    config: dict[str, Any]
    quarters: list[QuarterReport] = field(default_factory=list)
    manifest_path: str = ""
    elapsed_s: float = 0.0
    trades_per_s: float = 0.0
    peak_rss_mb: float = 0.0

    @property
    def files(self) -> list[str]:
        return [p for q in self.quarters for p in (q.trades_path, q.mbp10_path)]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["files"] = self.files
        d["n_trades"] = sum(q.n_trades for q in self.quarters)
        d["n_book_records"] = sum(q.n_book_records for q in self.quarters)
        return d


# --- records -------------------------------------------------------------------------------------


def _trade_records(plan: market.QuarterPlan, t: market.SessionTrades) -> np.ndarray:
    n = t.ts_event.size
    rec = np.zeros(n, dtype=TRADE_DTYPE)
    ids = np.asarray(plan.ids, dtype=np.uint32)
    rec["length"] = TRADE_DTYPE.itemsize // 4
    rec["rtype"] = RTYPE_TRADES
    rec["publisher_id"] = PUBLISHER_ID_GLBX
    rec["instrument_id"] = ids[t.slot]
    rec["ts_event"] = t.ts_event
    rec["price"] = t.price_tick * market.TICK_UNITS
    rec["size"] = t.size
    rec["action"] = b"T"
    rec["side"] = np.where(t.buy, b"B", b"A")
    rec["flags"] = 0
    rec["depth"] = 0
    rec["ts_recv"] = t.ts_recv
    rec["ts_in_delta"] = t.ts_in_delta
    rec["sequence"] = t.sequence
    return rec


def _book_records(plan: market.QuarterPlan, out: tuple[Any, ...]) -> np.ndarray:
    (recv, event, slot, action, side, price, size, depth, seq, bid, ask, bsz, asz, bct, act, m) = out
    rec = np.zeros(m, dtype=MBP10_DTYPE)
    ids = np.asarray(plan.ids[:2], dtype=np.uint32)
    rec["length"] = MBP10_DTYPE.itemsize // 4
    rec["rtype"] = RTYPE_MBP10
    rec["publisher_id"] = PUBLISHER_ID_GLBX
    rec["instrument_id"] = ids[slot]
    rec["ts_event"] = event
    rec["price"] = price * market.TICK_UNITS
    rec["size"] = size
    rec["action"] = action.view("S1")
    rec["side"] = side.view("S1")
    rec["flags"] = F_LAST
    rec["depth"] = depth
    rec["ts_recv"] = recv
    # Gateway-to-capture delta: a deterministic 10-30 us, never above ts_recv - ts_event.
    rec["ts_in_delta"] = np.minimum(10_000 + event % 20_000, np.maximum(recv - event, 0)).astype(np.int32)
    rec["sequence"] = seq
    for k in range(10):
        rec[f"bid_px_{k:02d}"] = (bid - k) * market.TICK_UNITS
        rec[f"ask_px_{k:02d}"] = (ask + k) * market.TICK_UNITS
        rec[f"bid_sz_{k:02d}"] = bsz[:, k]
        rec[f"ask_sz_{k:02d}"] = asz[:, k]
        rec[f"bid_ct_{k:02d}"] = bct[:, k]
        rec[f"ask_ct_{k:02d}"] = act[:, k]
    return rec


def _shift_trades(
    t: market.SessionTrades, b: market.SessionBookInput, ev_off: np.ndarray
) -> market.SessionTrades:
    """The session's trades with outright prices moved by the snapshot-signal offset of the book
    they met: a trade in the book feed takes its own event's offset (so it equals its ``T``
    record); any other outright trade the offset of the last book event of its instrument at or
    before its ``ts_recv`` (0 before the first). Spread prices are left alone."""
    price = t.price_tick.copy()
    for k in (0, 1):
        sel = np.flatnonzero(t.slot == k)
        e_k = np.flatnonzero(b.ev_slot == k)
        if sel.size == 0 or e_k.size == 0:
            continue
        pos = np.searchsorted(b.ev_ts_recv[e_k], t.ts_recv[sel], side="right") - 1
        off = np.where(pos >= 0, ev_off[e_k[np.maximum(pos, 0)]], 0)
        price[sel] += off
    is_t = np.flatnonzero(b.ev_kind == 1)
    if is_t.size:
        # T events carry the trade's sequence number: seq_start + index in the session's trades
        idx = b.ev_seq[is_t] - t.sequence[0]
        price[idx] = t.price_tick[idx] + ev_off[is_t]
    return dataclasses.replace(t, price_tick=price)


@dataclass
class SessionRecords:
    """One session's records: the trades array and the MBP-10 chunks (a lazy iterator)."""

    index: int
    session_day: int
    trades: np.ndarray
    book_chunks: Iterator[np.ndarray]
    log_level_end: float


def iter_quarter_records(
    config: SynthConfig, symbol: str, quarter: dt.date
) -> tuple[market.QuarterPlan, Iterator[SessionRecords]]:
    """The quarter's plan and a lazy stream of per-session records (trades, book chunks).

    Book chunks of a session must be consumed before the next session is requested (the book
    state carries over).
    """
    plan = market.plan_quarter(config.seed, symbol, quarter)

    def gen() -> Iterator[SessionRecords]:
        n_slots = 2
        st_bid = np.full(n_slots, -1, dtype=np.int64)
        st_ask = np.full(n_slots, -1, dtype=np.int64)
        st_bsz = np.zeros((n_slots, 10), dtype=np.int64)
        st_asz = np.zeros((n_slots, 10), dtype=np.int64)
        st_bct = np.zeros((n_slots, 10), dtype=np.int64)
        st_act = np.zeros((n_slots, 10), dtype=np.int64)
        last_ts = np.zeros(1, dtype=np.int64)
        d = 0.0
        seq = 1_000_000
        # Snapshot-signal state carries across the quarter's sessions like the book state (a T
        # record at a session's start then still prints at the previous record's touch).
        st_fast = np.zeros(n_slots, dtype=np.float64)
        st_slow = np.zeros(n_slots, dtype=np.float64)
        st_off = np.zeros(n_slots, dtype=np.int64)
        st_ring = np.zeros((n_slots, SNAP_DELAY), dtype=np.float64)
        st_pos = np.zeros(n_slots, dtype=np.int64)
        for i in range(plan.sessions.size):
            res = market.simulate_session(
                plan,
                i,
                seed=config.seed,
                scale=config.scale,
                signal=config.signal,
                book_ratio=config.book_ratio,
                d_start=d,
                seq_start=seq,
            )
            d = res.d_end
            seq += res.trades.ts_event.size
            b = res.book
            ev_off = np.zeros(b.ev_ts_recv.size, dtype=np.int64)

            def chunks(
                b: market.SessionBookInput = b,
                st_fast: np.ndarray = st_fast,
                st_slow: np.ndarray = st_slow,
                st_off: np.ndarray = st_off,
                st_ring: np.ndarray = st_ring,
                st_pos: np.ndarray = st_pos,
                ev_off: np.ndarray = ev_off,
            ) -> Iterator[np.ndarray]:
                n_ev = b.ev_ts_recv.size
                for ci, lo in enumerate(range(0, n_ev, BOOK_CHUNK_EVENTS)):
                    hi = min(n_ev, lo + BOOK_CHUNK_EVENTS)
                    out = nb.book_nb(
                        b.ev_ts_recv[lo:hi],
                        b.ev_ts_event[lo:hi],
                        b.ev_sec[lo:hi],
                        b.ev_slot[lo:hi],
                        b.ev_kind[lo:hi],
                        b.ev_side[lo:hi],
                        b.ev_size[lo:hi],
                        b.ev_seq[lo:hi],
                        b.bid_tick,
                        b.ask_tick,
                        b.depth_base,
                        b.imb,
                        st_bid,
                        st_ask,
                        st_bsz,
                        st_asz,
                        st_bct,
                        st_act,
                        last_ts,
                        np.random.default_rng([b.kernel_seed, ci]),
                        float(config.snap_signal),
                        1.0 - 1.0 / SNAP_TAU_FAST,
                        1.0 - 1.0 / SNAP_TAU_SLOW,
                        st_fast,
                        st_slow,
                        st_off,
                        st_ring,
                        st_pos,
                        SNAP_LEAN,
                        ev_off[lo:hi],
                    )
                    yield _book_records(plan, out)

            trades = res.trades
            book_chunks: Iterator[np.ndarray] = chunks()
            if config.snap_signal != 0.0:
                # The offsets are known only once the book has run: build the session's book
                # first, then print every outright trade at the book it met.
                built = list(book_chunks)
                trades = _shift_trades(trades, b, ev_off)
                book_chunks = iter(built)
            yield SessionRecords(
                i, int(plan.sessions[i]), _trade_records(plan, trades), book_chunks, res.log_level_end
            )

    return plan, gen()


# --- metadata -----------------------------------------------------------------------------------


def _utc_date(ns: int) -> dt.date:
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=ns // 1000)).date()


def quarter_mappings(plan: market.QuarterPlan, schema: str) -> list[SymbolMapping]:
    """raw symbol -> instrument_id intervals (UTC dates, end exclusive) as Databento writes them
    for a parent request over the quarter's sessions: every listed instrument of the file over
    the whole file range, the expiring outright and its spread up to their expiry day."""
    start = _utc_date(int(plan.open_ns[0]))
    end = _utc_date(int(plan.close_ns[-1]) - 1) + dt.timedelta(days=1)
    x_end = min(end, plan.x.expiry + dt.timedelta(days=1))
    spans = [(start, x_end), (start, end), (start, x_end), (start, end)]
    keep = range(4) if schema == "trades" else range(2)  # the book feed has outrights only
    return [
        SymbolMapping(plan.raw[k], (MappingInterval(spans[k][0], spans[k][1], str(plan.ids[k])),))
        for k in keep
    ]


def _quarter_paths(out_dir: Path, symbol: str, quarter: dt.date) -> tuple[Path, Path]:
    label = calendar.quarter_label(quarter)
    raw = out_dir / "raw"
    return (
        raw / "trades" / symbol / f"{symbol}_{label}.dbn.zst",
        raw / "mbp-10" / symbol / f"{symbol}_{label}.dbn.zst",
    )


def write_quarter(
    out_dir: Path,
    config: SynthConfig,
    symbol: str,
    quarter: dt.date,
    progress: Callable[[str, int, int], None] | None = None,
) -> QuarterReport:
    """Generate one (symbol, quarter) into its two DBN files (each atomically)."""
    plan, sessions = iter_quarter_records(config, symbol, quarter)
    trades_path, mbp_path = _quarter_paths(out_dir, symbol, quarter)
    start_ns, end_ns = int(plan.open_ns[0]), int(plan.close_ns[-1])
    th = encode_metadata(
        schema="trades",
        symbols=[symbol],
        start_ns=start_ns,
        end_ns=end_ns,
        mappings=quarter_mappings(plan, "trades"),
    )
    bh = encode_metadata(
        schema="mbp-10",
        symbols=[symbol],
        start_ns=start_ns,
        end_ns=end_ns,
        mappings=quarter_mappings(plan, "mbp-10"),
    )
    label = calendar.quarter_label(quarter)
    n_spread = n_book_t = 0
    spread_ids = np.asarray(plan.ids[2:], dtype=np.uint32)
    n_sess = plan.sessions.size
    open_level = market.base_level(symbol) * float(np.exp(plan.y0))
    with atomic_path(trades_path) as ttmp, atomic_path(mbp_path) as btmp:
        with DbnStreamWriter(ttmp, th, TRADE_DTYPE) as tw, DbnStreamWriter(btmp, bh, MBP10_DTYPE) as bw:
            for sr in sessions:
                tw.write(sr.trades)
                n_spread += int(np.isin(sr.trades["instrument_id"], spread_ids).sum())
                for chunk in sr.book_chunks:
                    n_book_t += int((chunk["action"] == b"T").sum())
                    bw.write(chunk)
                close_level = market.base_level(symbol) * float(np.exp(sr.log_level_end))
                if progress is not None:
                    progress(f"{symbol} {label}", sr.index + 1, n_sess)
            n_trades, n_book = tw.n_records, bw.n_records
    return QuarterReport(
        symbol=symbol,
        quarter=label,
        trades_path=str(trades_path),
        mbp10_path=str(mbp_path),
        n_sessions=int(n_sess),
        first_session=calendar.session_label(int(plan.sessions[0])),
        last_session=calendar.session_label(int(plan.sessions[-1])),
        n_trades=n_trades,
        n_spread_trades=n_spread,
        n_book_records=n_book,
        n_book_trades=n_book_t,
        contracts={plan.raw[k]: int(plan.ids[k]) for k in range(4)},
        roll={
            "from": plan.x.raw_symbol,
            "to": plan.y.raw_symbol,
            "roll_date": plan.x.roll_date.isoformat(),
            "expiry": plan.x.expiry.isoformat(),
        },
        open_level=round(open_level, 2),
        close_level=round(close_level, 2),
    )


def generate_market(
    out_dir: Path,
    config: SynthConfig,
    progress: Callable[[str, int, int], None] | None = None,
) -> SynthReport:
    """Write the synthetic market for every (symbol, quarter) of ``config`` under ``out_dir/raw``
    and ``out_dir/raw/synth_manifest.json``; return the report. ``progress(stage, done, total)``
    is called after each session."""
    config.validate()
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    report = SynthReport(config=config.to_dict())
    for symbol in config.symbols:
        for q in config.quarters:
            report.quarters.append(write_quarter(out_dir, config, symbol, q, progress))
    report.elapsed_s = round(time.perf_counter() - t0, 3)
    n = sum(q.n_trades for q in report.quarters)
    report.trades_per_s = round(n / report.elapsed_s, 1) if report.elapsed_s > 0 else 0.0
    report.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    manifest = out_dir / "raw" / "synth_manifest.json"
    report.manifest_path = str(manifest)
    atomic_write_text(manifest, json.dumps(manifest_dict(config, report), indent=2, sort_keys=True))
    return report


def manifest_dict(config: SynthConfig, report: SynthReport) -> dict[str, Any]:
    """The manifest: config, planted-signal description, model constants and the files."""
    consts = {
        k: getattr(market, k)
        for k in dir(market)
        if k.isupper() and isinstance(getattr(market, k), int | float | str)
    }
    return {
        "generator": "fx_assets.core.synth",
        "config": config.to_dict(),
        "signal": {
            "strength": config.signal,
            "null": config.null,
            "description": SIGNAL_DESCRIPTION,
            **(
                {"snap_strength": config.snap_signal, "snap_description": SNAP_SIGNAL_DESCRIPTION}
                if config.snap_signal != 0.0
                else {}
            ),
        },
        "model": consts,
        "book_feed": {
            "book_ratio": config.book_ratio,
            "rule": (
                "book_ratio >= 1: every outright trade is a T record; book_ratio < 1: each outright "
                "trade is a T record with probability 0.4 x book_ratio. A refresh record (A or C at "
                "the touch) precedes a T record whenever the touch moved since the instrument's "
                "previous record. Poisson add/cancel/modify events fill the session up to "
                "book_ratio x outright trades: their expected number is book_ratio x n - (T records) "
                "- (refresh records the T records alone would need), at least 0. Spreads are "
                "not in the book feed."
            ),
        },
        "quarters": [dataclasses.asdict(q) for q in report.quarters],
    }
