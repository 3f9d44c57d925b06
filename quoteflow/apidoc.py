"""QuoteFlow's OpenAPI document, with the catalogue's supplier names filled in.

The package keeps the document for the default catalogue (atlas, boreal,
cedar) and the default ``--max-cart-lines`` (200), served byte for byte; for
any other catalogue the names it lists (the ``Supplier`` enum, the longest
``quotes`` and ``failures`` of a quote and of a cart's line (with its
alternates' too), a basket's
``shipping``, the descriptions that name them) are the catalogue's, and for
another line limit the longest cart and the lists as long as it are that
limit's.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from quoteflow.models import MAX_ALTERNATES

_PER_SUPPLIER = (
    ("QuoteResult", "quotes"),
    ("QuoteResult", "failures"),
    ("CartLineResult", "quotes"),
    ("CartLineResult", "failures"),
    ("Basket", "shipping"),
)
"""(schema, property): arrays of at most one item per supplier (and SKU, on a cart's line)."""
_PER_SKU = frozenset({("CartLineResult", "quotes"), ("CartLineResult", "failures")})
"""(schema, property): a cart line's, one item per supplier for each of its SKUs."""
_PER_LINE = (
    ("CartRequest", "lines"),
    ("CartResult", "lines"),
    ("Basket", "picks"),
    ("Basket", "unquoted"),
)
"""(schema, property): arrays of at most one item per line of a cart."""


@functools.cache
def _kept() -> bytes:
    return resources.files("quoteflow").joinpath("openapi.json").read_bytes()


@functools.lru_cache(maxsize=4)  # the catalogue served now, and the one before a reload
def openapi_document(suppliers: tuple[str, ...], max_cart_lines: int | None = None) -> bytes:
    """The OpenAPI document of an app that asks ``suppliers``, in this order.

    ``max_cart_lines``: the most lines a cart may have (None: the kept document's).
    """
    kept = _kept()
    doc: dict[str, Any] = json.loads(kept)
    schemas = doc["components"]["schemas"]
    listed = tuple(schemas["Supplier"]["enum"])
    lines = schemas["CartRequest"]["properties"]["lines"]["maxItems"]
    if suppliers == listed and max_cart_lines in (None, lines):
        return kept
    if suppliers != listed:
        _name_suppliers(doc, listed, suppliers)
    if max_cart_lines is not None:
        for schema, prop in _PER_LINE:
            schemas[schema]["properties"][prop]["maxItems"] = max_cart_lines
    return json.dumps(doc, indent=2, ensure_ascii=False).encode() + b"\n"


def _name_suppliers(
    doc: dict[str, Any], listed: tuple[str, ...], suppliers: tuple[str, ...]
) -> None:
    """Rewrite ``doc``, written for the ``listed`` suppliers, for ``suppliers``."""
    schemas = doc["components"]["schemas"]
    named, order = ", ".join(listed), ", ".join(suppliers)
    info = doc["info"]
    info["description"] = info["description"].replace(
        f"three suppliers ({named})", f"{len(suppliers)} suppliers ({order})"
    )
    schemas["Supplier"]["enum"] = list(suppliers)
    for schema, prop in _PER_SUPPLIER:
        array = schemas[schema]["properties"][prop]
        skus = 1 + MAX_ALTERNATES if (schema, prop) in _PER_SKU else 1
        array["maxItems"] = skus * len(suppliers)
        array["description"] = array["description"].replace(named, order)
