"""Tests of fx_assets.core.contracts: symbols, expiries, roll dates, front contract, ids."""

from __future__ import annotations

import datetime as dt

import pytest

from fx_assets.core.contracts import (
    Contract,
    contracts_for_quarter,
    expiry_of,
    front_contract,
    instrument_id_for,
    is_spread,
    parse_outright,
    roll_date_of,
    spread_symbol,
    third_friday,
)


def test_third_friday_known_expiries() -> None:
    # Real ES expiries.
    assert third_friday(2024, 3) == dt.date(2024, 3, 15)
    assert third_friday(2024, 6) == dt.date(2024, 6, 21)
    assert third_friday(2024, 9) == dt.date(2024, 9, 20)
    assert third_friday(2024, 12) == dt.date(2024, 12, 20)
    assert third_friday(2025, 12) == dt.date(2025, 12, 19)
    for y in range(2000, 2040):
        for m in (3, 6, 9, 12):
            d = third_friday(y, m)
            assert d.weekday() == 4 and 15 <= d.day <= 21


def test_roll_date_is_thursday_week_before() -> None:
    c = Contract("ES", 2024, 3)
    assert c.roll_date == dt.date(2024, 3, 7)
    assert c.roll_date.weekday() == 3
    assert roll_date_of(c.expiry) == c.expiry - dt.timedelta(days=8)


def test_symbols_and_parsing() -> None:
    c = Contract("ES", 2024, 3)
    assert c.raw_symbol == "ESH4"
    assert c.next().raw_symbol == "ESM4"
    assert Contract("ES", 2024, 12).next() == Contract("ES", 2025, 3)
    assert Contract("ES", 2025, 3).prev() == Contract("ES", 2024, 12)
    assert spread_symbol(c, c.next()) == "ESH4-ESM4"
    assert is_spread("ESH4-ESM4") and not is_spread("ESH4")
    assert parse_outright("ESZ3") == Contract("ES", 2023, 12)
    assert parse_outright("ESH4-ESM4") is None
    assert parse_outright("ES.FUT") is None
    assert parse_outright("ESX4") is None
    assert parse_outright("NQU4") == Contract("NQ", 2024, 9)
    assert parse_outright("ESH9", ref_year=2018) == Contract("ES", 2019, 3)
    assert parse_outright("ESH9", ref_year=2027) == Contract("ES", 2029, 3)
    with pytest.raises(ValueError):
        Contract("ES", 2024, 4)


def test_expiry_of() -> None:
    assert expiry_of("ESH4") == dt.date(2024, 3, 15)
    assert expiry_of("ESU4") == dt.date(2024, 9, 20)
    assert expiry_of("ESH4-ESM4") is None
    assert expiry_of("garbage") is None
    assert expiry_of("ESH1", ref_year=2021) == dt.date(2021, 3, 19)


def test_front_contract_rolls_on_roll_date() -> None:
    assert front_contract("ES", dt.date(2024, 3, 6)).raw_symbol == "ESH4"
    assert front_contract("ES", dt.date(2024, 3, 7)).raw_symbol == "ESM4"
    assert front_contract("ES", dt.date(2024, 1, 2)).raw_symbol == "ESH4"
    assert front_contract("ES", dt.date(2024, 12, 31)).raw_symbol == "ESH5"
    assert front_contract("ES", dt.date(2024, 12, 11)).raw_symbol == "ESZ4"
    assert front_contract("ES", dt.date(2024, 12, 12)).raw_symbol == "ESH5"


def test_contracts_for_quarter() -> None:
    x, y, z = contracts_for_quarter("ES", dt.date(2024, 7, 1))
    assert (x.raw_symbol, y.raw_symbol, z.raw_symbol) == ("ESU4", "ESZ4", "ESH5")
    x, y, z = contracts_for_quarter("ES", dt.date(2024, 10, 1))
    assert (x.raw_symbol, y.raw_symbol, z.raw_symbol) == ("ESZ4", "ESH5", "ESM5")
    with pytest.raises(ValueError):
        contracts_for_quarter("ES", dt.date(2024, 2, 1))


def test_instrument_ids_deterministic_and_distinct() -> None:
    assert instrument_id_for("ESH4") == instrument_id_for("ESH4")
    syms = []
    for y in range(2015, 2035):
        for m in (3, 6, 9, 12):
            c = Contract("ES", y, m)
            syms += [c.raw_symbol, spread_symbol(c, c.next()), spread_symbol(c, c.next().next())]
    ids = {instrument_id_for(s) for s in set(syms)}
    assert len(ids) == len(set(syms))
    assert all(0 < i < 2**32 for i in ids)
