"""Money: exact decimals in and out, and the one rounding rule QuoteFlow uses.

No binary float ever holds a price. A supplier's decimal string (``"0.0034"``)
is read into an integer count of *micros* (millionths of the major unit: the
protocol allows at most six decimal places), every amount is an integer count
of a currency's minor units (ISO 4217: cents for USD, yen for JPY, fils for
KWD), and rounding happens in exactly one function, :func:`half_even`, on an
exact integer fraction. So the three steps of a line's price,

    amount  = half_even(unit price × units bought)            in the offer's minor units
    shown   = half_even(amount × rate_to ÷ rate_from)         in the answer's minor units

are each one exact division rounded once: no rounded cross rate in between,
and the result is what ``fractions.Fraction`` would give (``tests/test_money.py``
holds them to it). The conversion is exact rational arithmetic, which is what
"one decimal context of at least 34 significant digits with one rounding at the
end" asks for, without the context's own rounding of the quotient.
"""

from __future__ import annotations

import functools
import re
from decimal import ROUND_HALF_EVEN, Context, Decimal
from typing import Final

from quoteflow.iso4217 import MINOR_UNITS

DEFAULT_CURRENCY: Final = "USD"
"""The answer's currency, and every supplier's, when nothing says otherwise (``--currency``)."""

MICROS: Final = 1_000_000
"""Micros per major unit: the finest price the protocol carries (six decimal places)."""
PRICE_PLACES: Final = 6
MICROS_PER_MINOR: Final = (1_000_000, 100_000, 10_000, 1_000, 100, 10, 1)
"""Micros in one minor unit, by the minor unit's digits: ``MICROS_PER_MINOR[2]`` is 10,000."""

DECIMAL_TEXT: Final = re.compile(r"(0|[1-9][0-9]*)(?:\.([0-9]{1,6}))?")
"""A price as a supplier may write it: no sign, exponent, spaces, ``NaN`` or ``Infinity``."""

MAX_DECIMAL_TEXT: Final = 40
"""Longer strings are refused before the pattern runs (a price is never that long)."""


def minor_unit(code: object) -> int | None:
    """The minor unit's digits of an ISO 4217 code, or None (unknown, lower case, ``XAU``)."""
    if type(code) is not str:
        return None
    return MINOR_UNITS.get(code)


def half_even(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded to an integer, ties to even: the only rounding here.

    ``denominator`` is positive; both are exact integers, so nothing is lost before it.
    """
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2):
        return quotient + 1
    return quotient


def micros_of_text(text: str) -> int | None:
    """A decimal string's value in micros, or None if it is not a plain decimal of ≤ 6 places."""
    if len(text) > MAX_DECIMAL_TEXT:
        return None
    match = DECIMAL_TEXT.fullmatch(text)
    if match is None:
        return None
    whole, fraction = match.groups()
    fraction = fraction or ""
    return int(whole) * MICROS + int(fraction.ljust(PRICE_PLACES, "0"))


def micros_of_decimal(value: Decimal) -> int | None:
    """An adapter's ``Decimal`` in micros: finite, not negative, at most six places; else None."""
    if not value.is_finite() or value.is_signed():
        return None
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)  # finite
    if exponent < -PRICE_PLACES:
        return None
    if value.adjusted() > MAX_DECIMAL_TEXT:
        return None
    numerator, denominator = value.as_integer_ratio()
    whole, rest = divmod(int(numerator) * MICROS, int(denominator))
    return whole if rest == 0 else None


@functools.lru_cache(maxsize=4096)
def text_of_micros(micros: int, places: int = 2) -> str:
    """Micros as the shortest decimal with at least ``places`` places (``"0.0034"``, ``"9.90"``).

    ``places`` is the currency's minor unit: yen are written ``"1650"``, dinars ``"1.250"``.
    """
    whole, fraction = divmod(micros, MICROS)
    digits = f"{fraction:06d}".rstrip("0").ljust(places, "0")
    return f"{whole}.{digits}" if digits else str(whole)


@functools.lru_cache(maxsize=4096)
def text_of_minor(amount: int, exponent: int) -> str:
    """Minor units as a decimal string with exactly the currency's places (``"3.00"``)."""
    if exponent == 0:
        return str(amount)
    whole, fraction = divmod(amount, 10**exponent)
    return f"{whole}.{fraction:0{exponent}d}"


class CrossRate:
    """How many minor units of one currency one minor unit of another is worth, exactly.

    Built from two rates against one base (the ECB's euro): ``rate_to / rate_from``,
    with both minor units folded in, kept as one integer fraction so that a
    conversion is a single exact division (:meth:`convert`).
    """

    __slots__ = ("date", "denominator", "numerator", "shown")

    def __init__(
        self,
        rate_from: Decimal,
        rate_to: Decimal,
        exp_from: int,
        exp_to: int,
        date: str | None = None,
    ) -> None:
        to_num, to_den = rate_to.as_integer_ratio()
        from_num, from_den = rate_from.as_integer_ratio()
        # amount_minor / 10**exp_from major units × rate_to / rate_from × 10**exp_to
        self.numerator: int = to_num * from_den * 10**exp_to
        self.denominator: int = to_den * from_num * 10**exp_from
        self.shown = _ten_digits(rate_to, rate_from)
        """The cross rate (major units of the answer's currency per one of the offer's),
        to 10 significant digits: for people, never used to compute."""
        self.date = date
        """The date of the rates it was made from (``YYYY-MM-DD``), for people too."""
        self.date = date
        """The date of the rates it was made from (``YYYY-MM-DD``), for people too."""

    def convert(self, amount: int) -> int:
        """``amount`` minor units of the offer's currency in the answer's, rounded once."""
        return half_even(amount * self.numerator, self.denominator)


def _ten_digits(rate_to: Decimal, rate_from: Decimal) -> str:
    value = _DISPLAY.divide(rate_to, rate_from)  # correctly rounded to 10 digits
    return f"{value.normalize(_DISPLAY):f}"


_DISPLAY: Final = Context(prec=10, rounding=ROUND_HALF_EVEN)
