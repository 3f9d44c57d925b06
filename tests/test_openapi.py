"""The OpenAPI document: valid, served as kept, complete, and true of the live app."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from aiohttp import hdrs
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from quoteflow.apidoc import openapi_document
from quoteflow.app import create_app
from quoteflow.auth import ApiKeys
from quoteflow.bom import csv_body_cap
from quoteflow.config import Settings
from quoteflow.handlers import cart_body_cap
from tests.conftest import StartQuoteFlow
from tests.live import live_quoteflow


def _document() -> dict[str, Any]:
    text = resources.files("quoteflow").joinpath("openapi.json").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


def test_document_is_valid_openapi_31() -> None:
    """The kept document passes the OpenAPI 3.1 validator."""
    doc = _document()
    assert doc["openapi"].startswith("3.1.")
    validate(doc)


async def test_served_document_is_the_kept_one(start_quoteflow: StartQuoteFlow) -> None:
    """``GET /openapi.json`` serves the package's document byte for byte as JSON."""
    client = await start_quoteflow()
    response = await client.get("/openapi.json")
    assert response.status == 200
    assert response.content_type == "application/json"
    assert await response.json() == _document()


def test_document_lists_every_route() -> None:
    """Every route the app registers is documented, and every documented route exists."""
    app = create_app(Settings())
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != hdrs.METH_HEAD
    }
    documented = {(method, path) for path, item in _document()["paths"].items() for method in item}
    assert served == documented


# -- schemathesis against the live app ------------------------------------------------
#
# Loaded eagerly from the kept file: schemathesis' lazy ``from_fixture`` loader
# reads ``Item._nodeid``, which pytest 9 no longer has. The live server's URL is
# known only at run time, so it is passed to each call instead.

schema = schemathesis.openapi.from_dict(_document())
schema.config.generation.update(max_examples=100, database="none")


KEY = "schemathesis-key"


RATES = {"USD": "1.0850", "JPY": "162.50", "GBP": "0.8600", "KWD": "0.3330"}
"""The live app's ECB table in the ``rates`` run: two, zero and three minor digits."""


def _ecb_table(path: Path) -> str:
    """An ECB ``eurofxref-daily.xml`` of today's date (fresh) with ``RATES``, at ``path``."""
    rows = "".join(f"<Cube currency='{code}' rate='{rate}'/>" for code, rate in RATES.items())
    path.write_text(
        "<?xml version='1.0' encoding='UTF-8'?>"
        "<gesmes:Envelope xmlns:gesmes='http://www.gesmes.org/xml/2002-08-01'"
        " xmlns='http://www.ecb.int/vocabulary/2002-08-01/eurofxref'>"
        f"<Cube><Cube time='{dt.datetime.now(dt.UTC).date().isoformat()}'>{rows}</Cube></Cube>"
        "</gesmes:Envelope>"
    )
    return str(path)


@pytest.fixture(scope="module", params=["open", "keyed", "rates"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str], frozenset[str]]]:
    """A live QuoteFlow in front of healthy fake suppliers, without and with API keys, and
    with a rates table (then an answer in another currency converts every quote).

    The third item: the currencies the app answers in (``--currency``, and the table's).
    """
    overrides: dict[str, Any] = {"budget": 0.3}
    headers: dict[str, str] = {}
    answers_in = frozenset({Settings().currency})
    if request.param == "keyed":
        overrides.update(api_keys=ApiKeys([KEY]), metrics_require_key=True)
        headers["Authorization"] = f"Bearer {KEY}"
    if request.param == "rates":
        overrides["fx_rates"] = _ecb_table(tmp_path_factory.mktemp("fx") / "eurofxref-daily.xml")
        answers_in |= {"EUR", *RATES}
    with live_quoteflow(**overrides) as app:
        yield app.url, headers, answers_in


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_live_app_conforms(
    case: schemathesis.Case[Any], live: tuple[str, dict[str, str], frozenset[str]]
) -> None:
    """Generated valid and invalid requests: never a 5xx, every answer as documented."""
    url, headers, answers_in = live
    response = case.call(base_url=url, headers=headers, timeout=5)
    refused = _refused_beyond_the_schema(
        case.path, case.media_type, case.body, _size(response.request.body), answers_in
    )
    if refused is None:
        case.validate_response(response)
    elif refused == READ_OR_422:
        # A CSV body is any string to the schema: a bill of materials, or a 422
        # naming what it lacks (a header row, a SKU, a plain quantity ...).
        assert response.status_code in (200, 422), response.text
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
    else:
        # A rule no schema keyword can state (below): the body may match the
        # schema and still be refused, with exactly this status. A body over
        # its byte cap is refused unread, 413 whether it matched or not, and
        # schemathesis' list of statuses that reject bad data lacks 413.
        assert response.status_code == refused, response.text
        excluded = [positive_data_acceptance]
        if refused == 413:
            excluded.append(negative_data_rejection)
        case.validate_response(response, excluded_checks=excluded)


def _size(sent: object) -> int:
    """Bytes of a body as it was sent (JSON's escapes and all)."""
    if isinstance(sent, str):
        return len(sent.encode())
    return len(sent) if isinstance(sent, bytes) else 0


READ_OR_422 = 0
"""Not one status: a CSV cart is read (200) or refused with a 422, by rules of its own."""


def _refused_beyond_the_schema(
    path: str, media_type: str | None, body: object, size: int, answers_in: frozenset[str]
) -> int | None:
    """The status of a request refused for a rule JSON Schema cannot state, else None.

    A body is capped in bytes (``size``: ``--max-request-bytes``, a cart's
    ``cart_body_cap``), which long non-ASCII strings can pass whatever the
    schema says, and is then refused unread. JSON Schema counts 64.0 as an
    integer; the contract wants the integer literal and refuses 64.0. A cart
    asks each SKU once, as a line's or an alternate, whatever the quantities
    (``uniqueItems`` compares whole lines). A ``currency`` of three capitals
    is answered only if it is an ISO 4217 code the app answers in
    (``answers_in``: its ``--currency`` and the currencies of its rates
    table, which change at run time). A CSV cart
    (``media_type`` ``text/csv``) is a string to the schema, read by rules of its
    own (a header row, plain integer quantities ...) under a cap of its own
    (``csv_body_cap``): ``READ_OR_422``.
    """
    defaults = Settings()
    if path == "/api/carts" and media_type == "text/csv":
        return 413 if size > csv_body_cap(defaults.max_cart_lines) else READ_OR_422
    if path == "/api/carts":
        cap = cart_body_cap(defaults.max_cart_lines)
    elif path == "/api/quotes":
        cap = defaults.max_request_bytes
    else:
        return None
    if size > cap:
        return 413
    if not isinstance(body, dict):
        return None
    currency = body.get("currency")
    if isinstance(currency, str) and currency not in answers_in:
        return 422
    if path == "/api/quotes":
        return 422 if isinstance(body.get("quantity"), float) else None
    lines = body.get("lines")
    if not isinstance(lines, list):
        return None
    objects = [line for line in lines if isinstance(line, dict)]
    skus = [line["sku"] for line in objects if isinstance(line.get("sku"), str)]
    for line in objects:
        alternates = line.get("alternates")
        if isinstance(alternates, list):
            skus += [sku for sku in alternates if isinstance(sku, str)]
    floats = any(isinstance(line.get("quantity"), float) for line in objects)
    return 422 if floats or len(set(skus)) < len(skus) else None


def test_a_catalogues_document_is_valid_and_names_its_suppliers() -> None:
    """With another catalogue the document still validates and names its suppliers, in order."""
    doc = json.loads(openapi_document(("north", "south")))
    validate(doc)
    assert doc["components"]["schemas"]["Supplier"]["enum"] == ["north", "south"]
    assert "2 suppliers (north, south)" in doc["info"]["description"]
    assert "atlas" not in json.dumps(doc)
    schemas = doc["components"]["schemas"]
    for schema, array, most in [
        ("QuoteResult", "quotes", 2),
        ("QuoteResult", "failures", 2),
        ("CartLineResult", "quotes", 10),  # 2 suppliers x a line's SKU and 4 alternates
        ("CartLineResult", "failures", 10),
        ("Basket", "shipping", 2),
    ]:
        assert schemas[schema]["properties"][array]["maxItems"] == most, (schema, array)
    kept = resources.files("quoteflow").joinpath("openapi.json").read_bytes()
    assert openapi_document(("atlas", "boreal", "cedar")) == kept  # byte for byte
    assert openapi_document(("atlas", "boreal", "cedar"), Settings().max_cart_lines) == kept


def test_a_cart_line_limits_document_says_how_long_a_cart_may_be() -> None:
    """With another --max-cart-lines, a cart and every list as long as it say that limit."""
    doc = json.loads(openapi_document(("atlas", "boreal", "cedar"), 7))
    validate(doc)
    schemas = doc["components"]["schemas"]
    assert schemas["CartRequest"]["properties"]["lines"]["maxItems"] == 7
    assert schemas["CartResult"]["properties"]["lines"]["maxItems"] == 7
    assert schemas["Basket"]["properties"]["picks"]["maxItems"] == 7
    assert schemas["Basket"]["properties"]["unquoted"]["maxItems"] == 7
    assert schemas["Supplier"]["enum"] == ["atlas", "boreal", "cedar"]
