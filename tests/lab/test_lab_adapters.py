"""``provider_lab.adapters``: the two dialects' adapters as pure functions of (payload, asked)."""

from __future__ import annotations

import ast
import copy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from provider_lab import adapters
from provider_lab.adapters import AdapterError, decimal_text, json_dialect, path_dialect

PRICE_LIST: dict[str, Any] = {
    "partNumber": "KB-001",
    "currency": "EUR",
    "priceBreaks": [
        {"minQuantity": 1, "unitPrice": "12.00"},
        {"minQuantity": 10, "unitPrice": "10.80"},
        {"minQuantity": 100, "unitPrice": "9.60"},
    ],
    "shipping": "3.00",
    "available": 20,
}
PRICED: dict[str, Any] = {
    "part": "KB-001",
    "qty": 10,
    "unitPriceCents": 1080,
    "freightCents": 300,
    "onHand": 20,
}


@dataclass(frozen=True)
class Asked:
    """What a caller of QuoteFlow might pass: any object with the three attributes."""

    supplier: str
    sku: str
    quantity: int


def asked(quantity: int = 1, sku: str = "KB-001") -> Asked:
    """Atlas asked for ``quantity`` of ``sku``."""
    return Asked("atlas", sku, quantity)


def changed(payload: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``payload`` with the value at ``path`` replaced (or removed: ``...``)."""
    result = copy.deepcopy(payload)
    target: Any = result
    for step in path[:-1]:
        target = target[step]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return result


# -- json_dialect --------------------------------------------------------------------------


OFFER: dict[str, Any] = {
    "supplier": "atlas",
    "sku": "KB-001",
    "currency": "EUR",
    "breaks": [
        {"quantity": 1, "unit_price": "12.00"},
        {"quantity": 10, "unit_price": "10.80"},
        {"quantity": 100, "unit_price": "9.60"},
    ],
    "shipping": "3.00",
    "stock": 20,
}


@pytest.mark.parametrize("quantity", [1, 9, 10, 100, 10_000])
def test_json_dialect_passes_the_price_list_through(quantity: int) -> None:
    """The offer in its own currency and decimal strings, every break: whatever the quantity
    (QuoteFlow picks the break for what it buys, and converts the currency)."""
    assert json_dialect(PRICE_LIST, asked(quantity)) == OFFER


def test_json_dialect_sorts_the_breaks() -> None:
    """Breaks in any order come out by quantity."""
    shuffled = changed(PRICE_LIST, ("priceBreaks",), PRICE_LIST["priceBreaks"][::-1])
    assert json_dialect(shuffled, asked(50)) == OFFER


def test_json_dialect_returns_the_offer_protocol_keys_of_strict_types() -> None:
    """Strings for names, currency and money, ``int`` for quantities and stock: never a float."""
    quote = json_dialect(PRICE_LIST, asked(10))
    assert list(quote) == ["supplier", "sku", "currency", "breaks", "shipping", "stock"]
    assert [type(value) for value in quote.values()] == [str, str, str, list, str, int]
    breaks: Any = quote["breaks"]
    assert all(
        (type(entry["quantity"]), type(entry["unit_price"])) == (int, str) for entry in breaks
    )


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("priceBreaks", 1, "unitPrice"), "10.805", "10.805"),
        (("priceBreaks", 0, "unitPrice"), "0.0034", "0.0034"),
        (("priceBreaks", 0, "unitPrice"), "0.000001", "0.000001"),
        (("shipping",), "0.5", "0.5"),
        (("currency",), "USD", "USD"),
        (("currency",), "JPY", "JPY"),
    ],
)
def test_json_dialect_keeps_sub_cent_prices_and_any_currency_as_given(
    path: tuple[Any, ...], value: Any, expected: str
) -> None:
    """A fraction of a cent is a price, not an error; the currency is the supplier's."""
    quote: Any = json_dialect(changed(PRICE_LIST, path, value), asked())
    found = {
        ("priceBreaks", 1, "unitPrice"): quote["breaks"][1]["unit_price"],
        ("priceBreaks", 0, "unitPrice"): quote["breaks"][0]["unit_price"],
        ("shipping",): quote["shipping"],
        ("currency",): quote["currency"],
    }[path]
    assert found == expected


def test_json_dialect_passes_breaks_that_start_above_one() -> None:
    """Breaks from 10 up: the offer says so (below 10 QuoteFlow buys nothing, or 10)."""
    payload = changed(PRICE_LIST, ("priceBreaks",), PRICE_LIST["priceBreaks"][1:])
    assert json_dialect(payload, asked(5))["breaks"] == OFFER["breaks"][1:]


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("priceBreaks", 0, "unitPrice"), "12.0000001", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), 12.0, "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), 12, "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "-1.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "1e3", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), " 12.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "12,00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "1_200.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "012.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "12.", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "NaN", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "١٢.٠٠", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "1" * 31, "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), ..., "not a decimal string"),
        (("currency",), "eur", "currency: not a three-letter upper-case code"),
        (("currency",), "EURO", "currency: not a three-letter upper-case code"),
        (("currency",), 978, "currency: not a three-letter upper-case code"),
        (("currency",), ..., "currency: not a three-letter upper-case code"),
        (("partNumber",), "KB-002", "partNumber: not the SKU asked"),
        (("partNumber",), ..., "partNumber: not the SKU asked"),
        (("priceBreaks",), [], "priceBreaks: not a non-empty list"),
        (("priceBreaks",), {"1": "12.00"}, "priceBreaks: not a non-empty list"),
        (("priceBreaks", 1), "10.80", "priceBreaks[1]: not an object"),
        (("priceBreaks", 1, "minQuantity"), 0, "minQuantity: not a positive integer"),
        (("priceBreaks", 1, "minQuantity"), "10", "minQuantity: not a positive integer"),
        (("priceBreaks", 1, "minQuantity"), True, "minQuantity: not a positive integer"),
        (("priceBreaks", 1, "minQuantity"), 1, "minQuantity: 1 is repeated"),
        (("available",), -1, "available: not a non-negative integer"),
        (("available",), "20", "available: not a non-negative integer"),
        (("available",), 20.0, "available: not a non-negative integer"),
        (("available",), True, "available: not a non-negative integer"),
        (("available",), ..., "available: not a non-negative integer"),
        (("shipping",), ..., "shipping: not a decimal string"),
        (("shipping",), 3.0, "shipping: not a decimal string"),
    ],
)
def test_json_dialect_refuses_what_is_not_a_clean_price_list(
    path: tuple[Any, ...], value: Any, problem: str
) -> None:
    """Each flaw is an ``AdapterError`` naming the field (QuoteFlow: ``invalid_data``)."""
    payload = changed(PRICE_LIST, path, value)
    with pytest.raises(AdapterError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        json_dialect(payload, asked())


@pytest.mark.parametrize("payload", [[PRICE_LIST], None, "KB-001", 5])
def test_adapters_refuse_a_payload_that_is_not_an_object(payload: Any) -> None:
    """A JSON array, null, string or number is not a quote."""
    for adapter in (json_dialect, path_dialect):
        with pytest.raises(AdapterError, match="payload: not a JSON object"):
            adapter(payload, asked(10))


@pytest.mark.parametrize("text", ["12.00", "10.8", "0.05", "7", "0", "0.0034", "123456.123456"])
def test_decimal_text_keeps_plain_decimals_as_written(text: str) -> None:
    """The protocol's decimal strings come back unchanged (trailing zeros included)."""
    assert decimal_text(text, "x") == text


def test_decimal_text_accepts_up_to_thirty_characters() -> None:
    """Thirty characters with six decimals (beyond a float's precision) pass as written."""
    text = "9" * 23 + "." + "9" * 6
    assert decimal_text(text, "x") == text
    with pytest.raises(AdapterError, match="x: not a decimal string"):
        decimal_text("9" + text, "x")


# -- path_dialect --------------------------------------------------------------------------


def test_path_dialect_maps_the_fields() -> None:
    """``unitPriceCents``, ``freightCents``, ``onHand`` become the protocol's three integers."""
    assert path_dialect(PRICED, asked(10)) == {
        "supplier": "atlas",
        "sku": "KB-001",
        "unit_cents": 1080,
        "shipping_cents": 300,
        "stock": 20,
    }


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("part",), "KB-002", "part: not the SKU asked"),
        (("part",), ..., "part: not the SKU asked"),
        (("qty",), 1, "qty: not the quantity asked"),
        (("qty",), "10", "qty: not the quantity asked"),
        (("qty",), ..., "qty: not the quantity asked"),
        (("unitPriceCents",), "1080", "unitPriceCents: not a non-negative integer"),
        (("unitPriceCents",), 1080.0, "unitPriceCents: not a non-negative integer"),
        (("unitPriceCents",), True, "unitPriceCents: not a non-negative integer"),
        (("unitPriceCents",), -1, "unitPriceCents: not a non-negative integer"),
        (("unitPriceCents",), ..., "unitPriceCents: not a non-negative integer"),
        (("freightCents",), None, "freightCents: not a non-negative integer"),
        (("onHand",), 2.5, "onHand: not a non-negative integer"),
    ],
)
def test_path_dialect_refuses_what_does_not_answer_the_question(
    path: tuple[Any, ...], value: Any, problem: str
) -> None:
    """Another SKU, another quantity, or a number that is not a strict integer."""
    with pytest.raises(AdapterError, match=problem):
        path_dialect(changed(PRICED, path, value), asked(10))


# -- as a user's module -------------------------------------------------------------------


@pytest.mark.parametrize("adapter", [json_dialect, path_dialect])
def test_asked_is_duck_typed_and_payloads_are_left_alone(adapter: Any) -> None:
    """Any object with ``supplier``, ``sku`` and ``quantity``; the payload is not changed."""
    payload = copy.deepcopy(PRICE_LIST if adapter is json_dialect else PRICED)
    before = copy.deepcopy(payload)
    extra = SimpleNamespace(supplier="north", sku="KB-001", quantity=10, request_id="r1")
    assert adapter(payload, extra) == adapter(payload, Asked("north", "KB-001", 10))
    assert payload == before


def test_adapters_import_the_standard_library_only() -> None:
    """Nothing from ``quoteflow``, the rest of the lab or aiohttp: a user's module, on its own."""
    source = Path(adapters.__file__).read_text(encoding="utf-8")
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, provider_lab.adapters; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('quoteflow', 'aiohttp', 'attrs') or m.startswith('provider_lab.') "
            "and m != 'provider_lab.adapters'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert loaded.stdout.strip() == "[]"


def test_the_catalogue_names_resolve() -> None:
    """``provider_lab.adapters:json_dialect`` and ``:path_dialect`` are callables."""
    for name in ("json_dialect", "path_dialect"):
        assert callable(getattr(adapters, name))
