"""The legal buy and the money rule, held to obvious answers; the offer protocol's every rule.

The legal buy is checked against a brute force over every quantity up to the
stock, and each rounding against ``fractions.Fraction`` (whose ``round`` is
half-even): the code under test only ever divides integers once.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quoteflow.codec import decode_supplier_quote, supplier_quote_from
from quoteflow.errors import InvalidSupplierData
from quoteflow.fx import Rates, RateTable
from quoteflow.models import (
    INVALID_DATA,
    NO_RATE,
    Failure,
    OfferTerms,
    PriceBreak,
    RankedQuote,
    SupplierQuote,
)
from quoteflow.money import (
    MICROS_PER_MINOR,
    CrossRate,
    half_even,
    micros_of_decimal,
    micros_of_text,
    minor_unit,
)
from quoteflow.offers import Pricing, legal_buy

# -- the legal buy against brute force ------------------------------------------------


def brute_buy(need: int, stock: int, terms: OfferTerms) -> tuple[int, int] | None:
    """(units, amount) of the cheapest legal buy, trying every quantity up to the stock."""
    best: tuple[int, int] | None = None
    scale = MICROS_PER_MINOR[terms.exponent]
    for units in range(1, stock + 1):
        if units < need or units < terms.moq or units % terms.multiple:
            continue
        in_force = [b for b in terms.breaks if b.quantity <= units]
        if not in_force:
            continue
        amount = round(Fraction(in_force[-1].micros * units, scale))
        if best is None or amount < best[1]:
            best = (units, amount)
    return best


@st.composite
def offers(draw: st.DrawFn) -> tuple[int, int, OfferTerms]:
    quantities = sorted(draw(st.sets(st.integers(1, 60), min_size=1, max_size=5)))
    breaks = tuple(
        PriceBreak(q, draw(st.integers(0, 3_000_000) | st.sampled_from([3400, 5000, 4999])))
        for q in quantities
    )
    terms = OfferTerms(
        currency=None,
        breaks=breaks,
        moq=draw(st.integers(1, 40)),
        multiple=draw(st.integers(1, 12)),
        exponent=draw(st.sampled_from([0, 2, 3])),
    )
    return draw(st.integers(1, 50)), draw(st.integers(0, 150)), terms


@settings(max_examples=400, deadline=None)
@given(offers())
def test_the_legal_buy_is_the_cheapest_of_every_quantity(case: tuple[int, int, OfferTerms]) -> None:
    need, stock, terms = case
    found = legal_buy(need, stock, terms)
    expected = brute_buy(need, stock, terms)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found.units, found.amount) == expected


def test_a_break_makes_a_hundred_cheaper_than_ninety() -> None:
    terms = OfferTerms(
        currency=None, breaks=(PriceBreak(1, 5_000_000), PriceBreak(100, 4_000_000)), exponent=2
    )
    buy = legal_buy(90, 1000, terms)
    assert buy is not None
    assert (buy.units, buy.amount) == (100, 40000)  # 400.00, not 90 × 5.00 = 450.00


def test_a_need_of_seven_is_bought_as_ten() -> None:
    terms = OfferTerms(currency=None, breaks=(PriceBreak(1, 3400),), moq=10, multiple=10)
    buy = legal_buy(7, 5000, terms)
    assert buy is not None
    assert (buy.units, buy.amount) == (10, 3)  # 10 × 0.0034 = 0.034 → 0.03


def test_nothing_legal_below_the_first_break_or_past_the_stock() -> None:
    terms = OfferTerms(currency=None, breaks=(PriceBreak(100, 10),), multiple=30)
    assert legal_buy(1, 119, terms) is None  # 120 is the first legal buy
    buy = legal_buy(1, 120, terms)
    assert buy is not None
    assert buy.units == 120


# -- the money rule against Fraction ---------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 2**53 - 1),
    st.decimals(min_value=Decimal("0.0001"), max_value=Decimal("100000"), places=4),
    st.decimals(min_value=Decimal("0.0001"), max_value=Decimal("100000"), places=4),
    st.sampled_from([0, 2, 3]),
    st.sampled_from([0, 2, 3]),
)
def test_a_conversion_rounds_once_half_even(
    amount: int, rate_from: Decimal, rate_to: Decimal, exp_from: int, exp_to: int
) -> None:
    cross = CrossRate(rate_from, rate_to, exp_from, exp_to)
    exact = Fraction(amount, 10**exp_from) * Fraction(rate_to) / Fraction(rate_from) * 10**exp_to
    assert cross.convert(amount) == round(exact)


@given(st.integers(-(10**12), 10**12), st.integers(1, 10**9))
def test_half_even_is_fractions_round(numerator: int, denominator: int) -> None:
    assert half_even(numerator, denominator) == round(Fraction(numerator, denominator))


def test_ties_go_to_even() -> None:
    assert [half_even(n, 2) for n in (1, 3, 5, 7)] == [0, 2, 2, 4]
    assert half_even(-1, 2) == 0


def test_decimal_strings_are_read_exactly() -> None:
    assert micros_of_text("0.0034") == 3400
    assert micros_of_text("12") == 12_000_000
    assert micros_of_text("9.900000") == 9_900_000
    for bad in ("01", "1.", ".5", "1.0000001", "-1", "1e3", " 1", "1_0", "1,5", "NaN", "Infinity"):
        assert micros_of_text(bad) is None, bad
    assert micros_of_decimal(Decimal("0.0034")) == 3400
    for bad_decimal in ("-0.01", "NaN", "Infinity", "0.0000001"):
        assert micros_of_decimal(Decimal(bad_decimal)) is None, bad_decimal


def test_minor_units_are_the_iso_list() -> None:
    assert (minor_unit("USD"), minor_unit("JPY"), minor_unit("KWD"), minor_unit("CLF")) == (
        2,
        0,
        3,
        4,
    )
    for refused in ("XAU", "XXX", "XTS", "usd", "EURO", None, 978):
        assert minor_unit(refused) is None


# -- pricing a quote for a request ---------------------------------------------------------


def _table(**rates: str) -> Rates:
    fresh = Rates(max_age=6 * 86400)
    table = RateTable(
        dt.date.today(), {"EUR": Decimal(1), **{k: Decimal(v) for k, v in rates.items()}}
    )
    fresh.use(table)
    return fresh


def _offer(**fields: Any) -> SupplierQuote:
    wire = {"supplier": "boreal", "sku": "R-1", "stock": 1000, **fields}
    return supplier_quote_from(wire, supplier="boreal", sku="R-1", currency="USD")


def test_a_quote_as_today_is_priced_as_today() -> None:
    pricing = Pricing("USD", {})
    quote = _offer(unit_cents=1100, shipping_cents=250)
    assert quote.terms is None
    priced = pricing.price(quote, 2)
    assert priced == RankedQuote(
        supplier="boreal",
        sku="R-1",
        unit_cents=1100,
        shipping_cents=250,
        stock=1000,
        total_cents=2450,
    )


def test_a_euro_offer_is_converted_line_and_shipping_apart() -> None:
    rates = _table(USD="1.0850")
    quote = _offer(
        currency="EUR",
        breaks=[{"quantity": 1, "unit_price": "11.00"}, {"quantity": 10, "unit_price": "9.90"}],
        shipping="3.00",
    )
    priced = Pricing("USD", {}, rates).price(quote, 10)
    assert isinstance(priced, RankedQuote)
    assert priced.unit_cents is None
    assert priced.line_cents == round(Fraction(9900) * Fraction("1.0850"))  # 10742
    assert priced.shipping_cents == round(Fraction(300) * Fraction("1.0850"))  # 326
    assert priced.total_cents == priced.line_cents + priced.shipping_cents
    assert priced.buy_quantity is None
    assert priced.offer is not None
    assert (priced.offer.currency, priced.offer.unit_micros, priced.offer.shipping) == (
        "EUR",
        9_900_000,
        300,
    )
    assert priced.offer.rate == "1.085"
    assert priced.offer.rate_date == dt.date.today().isoformat()


def test_a_currency_without_a_fresh_rate_is_no_rate() -> None:
    quote = _offer(currency="JPY", unit_price="1650", shipping_cents=500)
    assert Pricing("USD", {}).price(quote, 1) == Failure("boreal", NO_RATE)
    assert Pricing("USD", {}, _table(USD="1.08")).price(quote, 1) == Failure("boreal", NO_RATE)
    stale = Rates(max_age=86400)
    stale.use(
        RateTable(dt.date(2020, 1, 2), {"EUR": Decimal(1), "USD": Decimal(1), "JPY": Decimal(1)})
    )
    assert Pricing("USD", {}, stale).price(quote, 1) == Failure("boreal", NO_RATE)
    # Its own currency needs no rate at all.
    priced = Pricing("JPY", {}).price(quote, 1)
    assert isinstance(priced, RankedQuote)
    assert (priced.unit_cents, priced.total_cents) == (1650, 2150)


def test_a_suppliers_own_currency_applies_to_a_quote_naming_none() -> None:
    quote = _offer(unit_cents=1000, shipping_cents=0)  # today's shape, but the supplier is in EUR
    priced = Pricing("USD", {"boreal": "EUR"}, _table(USD="2")).price(quote, 3)
    assert isinstance(priced, RankedQuote)
    assert (priced.line_cents, priced.total_cents, priced.unit_cents) == (6000, 6000, None)


def test_an_amount_past_2_53_is_invalid_data() -> None:
    quote = _offer(unit_cents=2**52, shipping_cents=0)
    assert Pricing("USD", {}).price(quote, 2) == Failure("boreal", INVALID_DATA)
    assert Pricing("USD", {}).price(quote, 1) is not None


def test_sub_cent_prices_round_per_line() -> None:
    quote = _offer(unit_price="0.0034", moq=10, multiple=10, shipping_cents=0)
    priced = Pricing("USD", {}).price(quote, 7)
    assert isinstance(priced, RankedQuote)
    assert (priced.buy_quantity, priced.line_cents, priced.total_cents) == (10, 3, 3)
    assert priced.offer is not None
    assert priced.offer.unit_micros == 3400
    assert priced.offer.rate is None


# -- the offer protocol's rules, each refused as invalid_data naming its field ---------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"currency": "XAU", "unit_cents": 1, "shipping_cents": 0}, "currency"),
        ({"currency": "usd", "unit_cents": 1, "shipping_cents": 0}, "currency"),
        ({"currency": "ZZZ", "unit_cents": 1, "shipping_cents": 0}, "currency"),
        ({"unit_price": "1.0000001", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": 1.5, "shipping_cents": 0}, "unit_price"),
        ({"unit_price": "-1", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": "1e2", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": "NaN", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": "Infinity", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": " 1", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": "1_000", "shipping_cents": 0}, "unit_price"),
        ({"unit_price": "1,5", "shipping_cents": 0}, "unit_price"),
        ({"unit_cents": 1, "unit_price": "1", "shipping_cents": 0}, "unit_price"),
        ({"breaks": [], "shipping_cents": 0}, "breaks"),
        (
            {
                "breaks": [{"quantity": 10, "unit_price": "1"}, {"quantity": 5, "unit_price": "2"}],
                "shipping_cents": 0,
            },
            "breaks",
        ),
        (
            {
                "breaks": [{"quantity": 1, "unit_price": "1", "unit_cents": 100}],
                "shipping_cents": 0,
            },
            "breaks",
        ),
        ({"breaks": [{"quantity": 0, "unit_price": "1"}], "shipping_cents": 0}, "breaks"),
        ({"unit_cents": 1, "shipping_cents": 0, "shipping": "1.00"}, "shipping"),
        ({"unit_cents": 1}, "shipping"),
        ({"unit_cents": 1, "shipping": "1.001"}, "shipping"),
        ({"unit_cents": 1, "shipping": "3.000"}, "shipping"),
        ({"unit_cents": 1, "shipping": 1.0}, "shipping"),
        ({"currency": "JPY", "unit_cents": 1, "shipping": "1.5"}, "shipping"),
        ({"unit_cents": 1, "shipping_cents": 0, "moq": 0}, "moq"),
        ({"unit_cents": 1, "shipping_cents": 0, "multiple": 10**9 + 1}, "multiple"),
        ({"unit_cents": 1, "shipping_cents": 0, "moq": True}, "moq"),
        ({"unit_cents": 1, "shipping_cents": 0, "discount": "1"}, "discount"),
    ],
)
def test_each_broken_rule_is_invalid_data_naming_the_field(
    fields: dict[str, Any], named: str
) -> None:
    body = json.dumps({"supplier": "boreal", "sku": "R-1", "stock": 5, **fields}).encode()
    with pytest.raises(InvalidSupplierData, match=named):
        decode_supplier_quote(body, supplier="boreal", sku="R-1")


def test_a_json_number_reaches_an_adapter_as_an_exact_decimal() -> None:
    """What an adapter is given: 0.0034 as ``Decimal("0.0034")``, which it may pass on."""
    from quoteflow.codec import decode_supplier_json

    payload = decode_supplier_json(b'{"UnitPrice": 0.0034, "big": 1e400}')
    assert payload["UnitPrice"] == Decimal("0.0034")
    adapted = {
        "supplier": "boreal",
        "sku": "R-1",
        "unit_price": payload["UnitPrice"],
        "shipping": Decimal("2.50"),
        "stock": 10,
    }
    quote = supplier_quote_from(adapted, supplier="boreal", sku="R-1", adapted=True)
    assert quote.terms is not None
    assert quote.terms.breaks == (PriceBreak(1, 3400),)
    assert quote.shipping_cents == 250
    # The same Decimal straight from a supplier's own JSON is a number, not a string: refused.
    with pytest.raises(InvalidSupplierData, match="unit_price"):
        supplier_quote_from(adapted, supplier="boreal", sku="R-1")


def test_a_large_price_is_priced_and_only_an_amount_past_2_53_is_refused() -> None:
    """The cap is on amounts in minor units, not on a price's digits: ten billion yen is fine."""
    quote = _offer(currency="JPY", unit_price="10000000000", shipping="0")
    priced = Pricing("JPY", {}).price(quote, 1)
    assert isinstance(priced, RankedQuote)
    assert priced.total_cents == 10_000_000_000
    dear = _offer(currency="JPY", unit_price="10000000000000", shipping="0")  # 10**13 yen each
    assert Pricing("JPY", {}).price(dear, 1000) == Failure("boreal", INVALID_DATA)
    shipped = _offer(currency="JPY", unit_cents=1, shipping="10000000000")
    assert shipped.shipping_cents == 10_000_000_000
    with pytest.raises(InvalidSupplierData, match="shipping"):
        _offer(currency="USD", unit_cents=1, shipping="90071992547409.92")
