"""QuoteFlow's OpenAPI document, with the catalogue's supplier names filled in.

The package keeps the document for the default catalogue (atlas, boreal,
cedar), served byte for byte; for any other catalogue the names it lists
(the ``Supplier`` enum, the longest ``quotes`` and ``failures``, the
descriptions that name them) are the catalogue's.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def _kept() -> bytes:
    return resources.files("quoteflow").joinpath("openapi.json").read_bytes()


@functools.lru_cache(maxsize=4)  # the catalogue served now, and the one before a reload
def openapi_document(suppliers: tuple[str, ...]) -> bytes:
    """The OpenAPI document of an app that asks ``suppliers``, in this order."""
    kept = _kept()
    doc: dict[str, Any] = json.loads(kept)
    schemas = doc["components"]["schemas"]
    listed = tuple(schemas["Supplier"]["enum"])
    if suppliers == listed:
        return kept
    named, order = ", ".join(listed), ", ".join(suppliers)
    info = doc["info"]
    info["description"] = info["description"].replace(
        f"three suppliers ({named})", f"{len(suppliers)} suppliers ({order})"
    )
    schemas["Supplier"]["enum"] = list(suppliers)
    result = schemas["QuoteResult"]["properties"]
    result["quotes"]["maxItems"] = result["failures"]["maxItems"] = len(suppliers)
    result["failures"]["description"] = result["failures"]["description"].replace(named, order)
    return json.dumps(doc, indent=2, ensure_ascii=False).encode() + b"\n"
