"""Quarterly futures contract logic (CME equity-index style: ES, NQ, ...).

Owns the naming and dates of quarterly outrights and calendar spreads used by the synthetic
market and the roll calendar:

* month codes ``H`` (March), ``M`` (June), ``U`` (September), ``Z`` (December); raw symbols
  ``ESH4`` (root + code + last digit of the year, as CME/Databento write them);
* calendar spreads ``ESH4-ESM4`` (near leg first);
* expiry = third Friday of the contract month; roll date = the Thursday of the week before
  expiry (expiry - 8 days), when volume migrates to the next contract;
* a deterministic ``instrument_id`` per raw symbol (CME security ids are arbitrary integers; ours
  are a hash so that every file and quarter agrees on them).

A one-digit year is ambiguous (``ESH4`` is 2014, 2024, 2034...): ``parse_outright`` /
``expiry_of`` resolve it to the year nearest ``ref_year`` (default 2025; pass the data's year).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass

MONTH_CODES: dict[int, str] = {3: "H", 6: "M", 9: "U", 12: "Z"}
CODE_MONTHS: dict[str, int] = {v: k for k, v in MONTH_CODES.items()}

_OUTRIGHT_RE = re.compile(r"^([A-Z0-9]{1,4}?)([HMUZ])(\d{1,2})$")
_DEFAULT_REF_YEAR = 2025


@dataclass(frozen=True, order=True)
class Contract:
    """One quarterly outright: root ``ES``, contract year and month (3/6/9/12)."""

    root: str
    year: int
    month: int

    def __post_init__(self) -> None:
        if self.month not in MONTH_CODES:
            raise ValueError(f"contract month must be 3, 6, 9 or 12, got {self.month}")

    @property
    def raw_symbol(self) -> str:
        return f"{self.root}{MONTH_CODES[self.month]}{self.year % 10}"

    @property
    def expiry(self) -> dt.date:
        return third_friday(self.year, self.month)

    @property
    def roll_date(self) -> dt.date:
        return roll_date_of(self.expiry)

    def next(self) -> Contract:
        m = self.month + 3
        return Contract(self.root, self.year + (m - 1) // 12, (m - 1) % 12 + 1)

    def prev(self) -> Contract:
        m = self.month - 3
        return Contract(self.root, self.year + (m - 1) // 12, (m - 1) % 12 + 1)


def third_friday(year: int, month: int) -> dt.date:
    """Third Friday of a month (the CME quarterly equity-index expiry)."""
    first = dt.date(year, month, 1)
    first_friday = first + dt.timedelta(days=(4 - first.weekday()) % 7)
    return first_friday + dt.timedelta(days=14)


def roll_date_of(expiry: dt.date) -> dt.date:
    """The conventional roll date: Thursday of the week before expiry (8 days earlier)."""
    return expiry - dt.timedelta(days=8)


def spread_symbol(near: Contract, far: Contract) -> str:
    """Calendar-spread raw symbol, near leg first: ``ESH4-ESM4``."""
    return f"{near.raw_symbol}-{far.raw_symbol}"


def is_spread(raw_symbol: str) -> bool:
    """True for a calendar spread (or any multi-leg symbol): raw symbols containing ``-``."""
    return "-" in raw_symbol


def parse_outright(raw_symbol: str, ref_year: int = _DEFAULT_REF_YEAR) -> Contract | None:
    """``ESH4`` -> Contract; None for spreads and symbols that are not quarterly outrights.

    The one- (or two-) digit year is resolved to the year nearest ``ref_year`` with those
    trailing digits (CME reuses ``ESH4`` every ten years).
    """
    if is_spread(raw_symbol):
        return None
    m = _OUTRIGHT_RE.match(raw_symbol.strip().upper())
    if m is None:
        return None
    root, code, digits = m.group(1), m.group(2), m.group(3)
    mod = 10 ** len(digits)
    d = int(digits)
    base = ref_year - ref_year % mod + d
    candidates = (base - mod, base, base + mod)
    year = min(candidates, key=lambda y: (abs(y - ref_year), y))
    return Contract(root, year, CODE_MONTHS[code])


def expiry_of(raw_symbol: str, ref_year: int = _DEFAULT_REF_YEAR) -> dt.date | None:
    """Expiry (third Friday) of an outright like ``ESH4``; None for spreads / unknown symbols."""
    c = parse_outright(raw_symbol, ref_year)
    return None if c is None else c.expiry


def contract_expiring_in_quarter(root: str, quarter_start: dt.date) -> Contract:
    """The outright whose expiry falls in the quarter starting at ``quarter_start``."""
    if quarter_start.month not in (1, 4, 7, 10) or quarter_start.day != 1:
        raise ValueError(f"not a quarter's first day: {quarter_start}")
    return Contract(root, quarter_start.year, quarter_start.month + 2)


def front_contract(root: str, day: dt.date) -> Contract:
    """Most-traded outright for a session ending on ``day``: the nearest contract until its roll
    date (exclusive), then the next one."""
    c = Contract(root, day.year, 3 * ((day.month - 1) // 3) + 3)
    while day >= c.roll_date:
        c = c.next()
    return c


def contracts_for_quarter(root: str, quarter_start: dt.date) -> tuple[Contract, Contract, Contract]:
    """(expiring, next, after-next) outrights relevant to a quarter: the contract that expires in
    it (front until its roll), the one that takes over at the roll, and the one after (leg of
    the calendar spread traded once the expiring contract is gone)."""
    x = contract_expiring_in_quarter(root, quarter_start)
    y = x.next()
    return x, y, y.next()


def instrument_id_for(raw_symbol: str) -> int:
    """Deterministic instrument id for a raw symbol (stable across runs, files and quarters).

    A 24-bit hash offset by 1000: ids look like CME security ids (arbitrary positive ints) and
    collisions among the few dozen symbols of one market are checked by the generator.
    """
    h = hashlib.blake2b(raw_symbol.encode(), digest_size=8).digest()
    return 1000 + int.from_bytes(h, "little") % (1 << 24)
