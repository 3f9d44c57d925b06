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
from provider_lab.adapters import AdapterError, cents, json_dialect, path_dialect

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


@pytest.mark.parametrize(
    ("quantity", "unit"),
    [(1, 1200), (2, 1200), (9, 1200), (10, 1080), (99, 1080), (100, 960), (10_000, 960)],
)
def test_json_dialect_picks_the_break_for_the_quantity(quantity: int, unit: int) -> None:
    """The largest ``minQuantity`` not above the quantity asked sets the unit price."""
    assert json_dialect(PRICE_LIST, asked(quantity)) == {
        "supplier": "atlas",
        "sku": "KB-001",
        "unit_cents": unit,
        "shipping_cents": 300,
        "stock": 20,
    }


def test_json_dialect_does_not_rely_on_the_order_of_breaks() -> None:
    """Breaks in any order give the same price."""
    shuffled = changed(PRICE_LIST, ("priceBreaks",), PRICE_LIST["priceBreaks"][::-1])
    assert json_dialect(shuffled, asked(50))["unit_cents"] == 1080


def test_json_dialect_returns_exactly_five_keys_of_strict_types() -> None:
    """``supplier`` and ``sku`` strings, the rest ``int`` (never a Decimal or a float)."""
    quote = json_dialect(PRICE_LIST, asked(10))
    assert list(quote) == ["supplier", "sku", "unit_cents", "shipping_cents", "stock"]
    assert [type(value) for value in quote.values()] == [str, str, int, int, int]


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("priceBreaks", 1, "unitPrice"), "10.805", "a fraction of a cent"),
        (("priceBreaks", 0, "unitPrice"), "12.001", "a fraction of a cent"),
        (("shipping",), "0.5000001", "a fraction of a cent"),
        (("priceBreaks", 0, "unitPrice"), 12.0, "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), 12, "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "-1.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "1e3", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), " 12.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "12,00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "1_200.00", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "NaN", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "١٢.٠٠", "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), "1" * 31, "not a decimal string"),
        (("priceBreaks", 0, "unitPrice"), ..., "not a decimal string"),
        (("currency",), "USD", "currency: not EUR"),
        (("currency",), ..., "currency: not EUR"),
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
    ],
)
def test_json_dialect_refuses_what_is_not_a_clean_price_list(
    path: tuple[Any, ...], value: Any, problem: str
) -> None:
    """Each flaw is an ``AdapterError`` naming the field (QuoteFlow: ``invalid_data``)."""
    payload = changed(PRICE_LIST, path, value)
    with pytest.raises(AdapterError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        json_dialect(payload, asked())


def test_json_dialect_refuses_a_quantity_below_every_break() -> None:
    """Breaks from 10 up and 5 units asked: no price applies."""
    payload = changed(PRICE_LIST, ("priceBreaks",), PRICE_LIST["priceBreaks"][1:])
    with pytest.raises(AdapterError, match="none for a quantity of 5"):
        json_dialect(payload, asked(5))
    assert json_dialect(payload, asked(10))["unit_cents"] == 1080


@pytest.mark.parametrize("payload", [[PRICE_LIST], None, "KB-001", 5])
def test_adapters_refuse_a_payload_that_is_not_an_object(payload: Any) -> None:
    """A JSON array, null, string or number is not a quote."""
    for adapter in (json_dialect, path_dialect):
        with pytest.raises(AdapterError, match="payload: not a JSON object"):
            adapter(payload, asked(10))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.00", 1200), ("10.8", 1080), ("0.05", 5), ("7", 700), ("12.000", 1200), ("0", 0)],
)
def test_cents_are_exact(text: str, expected: int) -> None:
    """Decimal strings of euros to whole cents, with no float in between."""
    assert cents(text, "x") == expected
    assert type(cents(text, "x")) is int


def test_cents_of_the_longest_accepted_text_are_exact() -> None:
    """Thirty digits (beyond a float's and Decimal's default precision) still come out exact."""
    assert cents("9" * 27 + ".99", "x") == int("9" * 27 + "99")


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
