"""Batch suppliers: one call asks for many lines of a cart.

A catalogue entry with a ``[supplier.batch]`` table (``catalogue.py``) is asked
this way, for a cart's lines and for a single quote alike (a one-line call)::

    [supplier.batch]
    max_items = 50          # lines per call
    items = "parts"         # the body's array (a dotted path) whose one element is a line
    # or, a delimited query value:  query = "pn"  and  separator = "|"
    rate_unit = "call"      # or "item": the supplier's `rate` counts lines

    [supplier.body]
    parts = [ { mpn = "{sku}", qty = "{quantity}" } ]

The element (or the query value) is the template of one line: rendered once
per line with its ``{sku}`` and ``{quantity}`` and put in the array (or joined
with the separator). Everywhere else a template may name ``{scenario}`` and
``{request_id}`` only: those are the call's, not a line's. A query-shaped call
may also name ``{quantity}`` elsewhere (a supplier that takes one quantity for
all its part numbers): its chunks then hold lines of one quantity each.

This module checks a ``batch`` table against the supplier's request shape,
splits a cart's lines into calls and renders a call. It does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from quoteflow.templates import (
    JSONTemplate,
    RequestShape,
    Shaped,
    Text,
    encode_json,
    header_value,
    render_json,
    uses_of,
)

MAX_ITEMS: Final = 1000
"""The largest ``max_items`` a catalogue may set (Arrow's list search takes 1,000)."""
RATE_UNITS: Final = ("call", "item")
_KEYS: Final = ("max_items", "items", "query", "separator", "rate_unit")
_LINE_PLACEHOLDERS: Final = frozenset({"sku", "quantity"})


class BatchError(ValueError):
    """A ``batch`` table QuoteFlow cannot use; ``field`` names the key at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


class Line(Protocol):
    """What a call asks for one line (``models.CartLine``)."""

    @property
    def sku(self) -> str: ...

    @property
    def quantity(self) -> int: ...


@attrs.frozen(kw_only=True)
class BatchSpec:
    """How one batch supplier takes many lines per call."""

    max_items: int
    items: tuple[str, ...] | None = None
    """The path of the body's array of lines, key by key; None for a query-shaped call."""
    element: JSONTemplate = attrs.field(default=None, repr=False)
    """One line's template in that array."""
    query: str | None = None
    """The query parameter that carries the lines' values, joined by ``separator``."""
    separator: str = ","
    rate_unit: str = "call"
    one_quantity: bool = False
    """A query-shaped call names ``{quantity}`` outside the line: one quantity per call."""

    def chunks(self, lines: Sequence[Line], burst: int | None) -> list[tuple[Line, ...]]:
        """``lines`` as calls: at most ``max_items`` each (and the rate's ``burst`` of items).

        A SKU holding the query's separator is asked in a call of its own: joined
        with the others it would read as two part numbers.
        """
        size = self.max_items if burst is None else max(1, min(self.max_items, burst))
        alone: list[tuple[Line, ...]] = []
        groups: dict[int, list[Line]] = {}
        for line in lines:
            if self.query is not None and self.separator in line.sku:
                alone.append((line,))
            else:
                groups.setdefault(line.quantity if self.one_quantity else 0, []).append(line)
        calls = [
            tuple(group[start : start + size])
            for group in groups.values()
            for start in range(0, len(group), size)
        ]
        return calls + alone

    def render(
        self,
        shape: RequestShape,
        lines: Sequence[Line],
        scenario: str,
        request_id: str,
    ) -> tuple[Shaped, bytes | None]:
        """One call's request for ``lines``: its URL, headers and the encoded body."""
        values = {
            "sku": "",
            "quantity": str(lines[0].quantity) if self.one_quantity else "",
            "scenario": scenario,
            "request_id": request_id,
        }
        each = [{**values, "sku": line.sku, "quantity": str(line.quantity)} for line in lines]
        url, shown = shape.url(values)
        if self.query is not None:
            # The joined value replaces the template's: rendered per line, then joined.
            template = dict(shape.query)[self.query]
            joined = self.separator.join(template.render(line)[0] for line in each)
            url = url.update_query({self.query: joined})
            shown = shown.update_query({self.query: joined})
        body: bytes | None = None
        if self.items is not None:
            rendered = render_json(_without(shape.body, self.items), values)
            _place(rendered, self.items, [render_json(self.element, line) for line in each])
            body = encode_json(rendered)
        headers = {name: text.render(values, header_value)[0] for name, text in shape.headers}
        return Shaped(url, shown, headers, None), body


def _place(body: Any, path: tuple[str, ...], items: list[object]) -> None:
    for key in path[:-1]:
        body = body[key]
    body[path[-1]] = items


def read_batch(table: object, shape: RequestShape | None, burst: int | None) -> BatchSpec:
    """Check a ``[supplier.batch]`` table against the supplier's request shape.

    ``burst``: the supplier's rate's burst, or None without a rate.
    Raises ``BatchError`` naming the key at fault.
    """
    if not isinstance(table, dict):
        raise BatchError("batch", "must be a table")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise BatchError(f"batch.{unknown[0]}", f"unknown key (known: {', '.join(_KEYS)})")
    max_items = table.get("max_items")
    if type(max_items) is not int or not 1 <= max_items <= MAX_ITEMS:
        raise BatchError("batch.max_items", f"must be an integer from 1 to {MAX_ITEMS}")
    rate_unit = table.get("rate_unit", "call")
    if rate_unit not in RATE_UNITS:
        raise BatchError("batch.rate_unit", 'must be "call" or "item"')
    if rate_unit == "item" and burst is None:
        raise BatchError("batch.rate_unit", '"item" needs the supplier\'s rate')
    if ("items" in table) == ("query" in table):
        raise BatchError("batch", 'needs one of "items" (a body array) or "query" (a query value)')
    if shape is None:
        raise BatchError("batch", "needs a request shape: a body with the items, or a query")
    if "items" in table:
        return _read_items(table, shape, max_items, rate_unit)
    return _read_query(table, shape, max_items, rate_unit)


def _read_items(
    table: Mapping[str, Any], shape: RequestShape, max_items: int, rate_unit: str
) -> BatchSpec:
    items = table["items"]
    if type(items) is not str or not items or any(not key for key in items.split(".")):
        raise BatchError("batch.items", 'must be a dotted path into the body, e.g. "parts"')
    if "separator" in table:
        raise BatchError("batch.separator", 'goes with "query", not "items"')
    path = tuple(items.split("."))
    if not shape.has_body:
        raise BatchError("batch.items", "the supplier has no body to put the items in")
    node: object = shape.body
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise BatchError("batch.items", f"the body has no {items!r}")
        node = node[key]
    if not isinstance(node, list) or len(node) != 1:
        raise BatchError("batch.items", f"body.{items} must be an array of one element: a line")
    element = node[0]
    if not uses_of(element) >= {"sku"}:
        raise BatchError("batch.items", f"body.{items}'s element must name {{sku}}")
    rest = uses_of(_without(shape.body, path)) | _uses_outside_body(shape)
    if rest & _LINE_PLACEHOLDERS:
        raise BatchError(
            "batch.items", "{sku} and {quantity} belong in the element: one value per line"
        )
    return BatchSpec(max_items=max_items, items=path, element=element, rate_unit=rate_unit)


def _read_query(
    table: Mapping[str, Any], shape: RequestShape, max_items: int, rate_unit: str
) -> BatchSpec:
    name = table["query"]
    queries = dict(shape.query)
    if type(name) is not str or name not in queries:
        raise BatchError("batch.query", "must name a key of the supplier's query table")
    separator = table.get("separator", ",")
    if type(separator) is not str or not 1 <= len(separator) <= 4:
        raise BatchError("batch.separator", "must be 1 to 4 characters")
    template: Text = queries[name]
    if "sku" not in template.placeholders:
        raise BatchError("batch.query", f"query.{name} must name {{sku}}")
    others = {key: text for key, text in shape.query if key != name}
    rest = frozenset().union(*(text.placeholders for text in others.values()))
    rest |= _uses_outside_body(shape, query=False)
    if shape.has_body:
        rest |= uses_of(shape.body)
    if "sku" in rest:
        raise BatchError("batch.query", f"{{sku}} belongs in query.{name}: one value per line")
    return BatchSpec(
        max_items=max_items,
        query=name,
        separator=separator,
        rate_unit=rate_unit,
        one_quantity="quantity" in rest,
    )


def _without(body: JSONTemplate, path: tuple[str, ...]) -> JSONTemplate:
    """The body template less the array at ``path``."""
    if not path or not isinstance(body, dict):
        return body
    head, rest = path[0], path[1:]
    return {
        key: (_without(value, rest) if key == head else value)
        for key, value in body.items()
        if key != head or rest
    }


def _uses_outside_body(shape: RequestShape, *, query: bool = True) -> frozenset[str]:
    uses = set(shape.path.placeholders)
    for _, text in shape.headers:
        uses |= text.placeholders
    if query:
        for _, text in shape.query:
            uses |= text.placeholders
    return frozenset(uses)
