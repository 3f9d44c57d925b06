"""The supplier catalogue: which suppliers QuoteFlow asks, where, and with which settings.

The catalogue is data: a frozen ``Catalogue`` of frozen ``Supplier`` entries,
made once by the composition root and handed down (``app.create_app``); a
reload builds a new one and swaps it whole. Nothing below the app reads a
global list of suppliers.

Without a file it is ``default_catalogue``: the three lab suppliers behind
``--provider-url`` with the global settings, exactly as QuoteFlow always was.
With ``--suppliers FILE`` it is ``load``'s reading of a TOML file::

    [[supplier]]
    name = "atlas"                                # 1-32 of [a-z0-9_-], unique
    url = "https://atlas.example/v1/quote"        # GET {url}?sku=...&scenario=...
    share = 2                                     # each of these defaults to the
    connect_timeout = 0.25                        # global setting of that name
    read_timeout = 1.0
    breaker_failures = 5
    retry_budget_capacity = 20
    headers = { Authorization = "Bearer ${ATLAS_TOKEN}" }   # ${VAR}: from the environment
    adapter = "mypackage.adapters:atlas"          # foreign JSON → the supplier protocol

A supplier whose API is shaped otherwise says how to ask it (``templates.py``
compiles these; ``{sku}``, ``{quantity}``, ``{scenario}`` and ``{request_id}``
are filled in per request)::

    method = "POST"                                # GET (the default) or POST
    url = "https://api.harbor.example/v2/parts/{sku}/quote"
    query = { apikey = "${HARBOR_KEY}", qty = "{quantity}" }
    body = { items = [ { partNumber = "{sku}", quantity = "{quantity}" } ] }

    [supplier.oauth2]                              # RFC 6749 section 4.4
    token_url = "https://auth.harbor.example/oauth2/token"
    client_id = "${HARBOR_CLIENT_ID}"
    client_secret = "${HARBOR_CLIENT_SECRET}"
    scope = "quotes:read"                          # optional, as are the rest
    params = { audience = "quotes" }
    auth = "basic"                                 # or "post" (section 2.3.1)

Every check fails with one ``CatalogueError`` naming the file, the supplier
and the field. Header values, every ``${VAR}`` value and the OAuth2 client's
credentials are secrets: they are never part of a message, a ``repr`` or
``public()``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NoReturn, Protocol, TypeVar

import attrs
from yarl import URL

from quoteflow.batching import BatchError, BatchSpec, read_batch
from quoteflow.callers import Rate, parse_rate
from quoteflow.config import Settings
from quoteflow.errors import ConfigError
from quoteflow.money import DEFAULT_CURRENCY, minor_unit
from quoteflow.templates import (
    PLACEHOLDERS,
    Placeholder,
    RequestShape,
    Secret,
    TemplateError,
    Text,
    compile_shape,
    parse_json,
    parse_text,
    split_url,
)

MAX_SUPPLIERS = 32
"""Most suppliers one catalogue may name."""

NAME = re.compile(r"[a-z0-9_-]{1,32}")
"""What a supplier's name may be: it is a metric label, a log field and a JSON key."""

LAB_SUPPLIERS: tuple[str, ...] = ("atlas", "boreal", "cedar")
"""The suppliers of the default catalogue, in the order failures are listed."""

RESERVED_HEADERS = frozenset(
    {
        "x-request-id",
        "x-attempt",
        "x-deadline-remaining-ms",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
"""Headers QuoteFlow (or HTTP itself) sets on every attempt: a catalogue cannot override them."""

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
"""An HTTP token (RFC 9110 section 5.6.2)."""
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FORBIDDEN_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Control characters (tab aside): a header value with CR or LF would split the request."""

_OPTIONAL = (
    "share",
    "connect_timeout",
    "read_timeout",
    "breaker_failures",
    "retry_budget_capacity",
    "headers",
    "adapter",
    "method",
    "query",
    "body",
    "oauth2",
    "rate",
    "batch",
    "hedge",
    "currency",
)
_KEYS = ("name", "url", *_OPTIONAL)
_SHAPING = ("method", "query", "body")
"""Keys that make a supplier asked exactly as its templates say, with no default query."""
_OAUTH2_KEYS = ("token_url", "client_id", "client_secret", "scope", "params", "auth", "timeout")
METHODS = ("GET", "POST")


class CatalogueError(ValueError):
    """A catalogue file QuoteFlow cannot serve from; the text is one line for the operator."""


class Adapter(Protocol):
    """Turns one supplier's decoded JSON into the supplier protocol's five fields.

    Takes whatever ``json.loads`` made of a 200 body and, if it takes a
    second argument, what was asked (``models.Asked``: the supplier, SKU,
    quantity and scenario), and returns a mapping of ``supplier``, ``sku``,
    ``unit_cents``, ``shipping_cents`` and ``stock``. What it returns passes
    the same strict checks as any supplier's body; raising, or returning
    anything else, makes the answer ``invalid_data``.
    """

    def __call__(self, payload: Any, /, *asked: Any) -> Mapping[str, Any]: ...


@attrs.frozen(kw_only=True)
class OAuth2Client:
    """A supplier's OAuth2 client-credentials grant (RFC 6749 section 4.4)."""

    token_url: str = attrs.field(repr=False)
    client_id: str = attrs.field(repr=False)
    client_secret: str = attrs.field(repr=False)
    scope: str | None = None
    params: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)
    """Extra form fields of the token request (KrakenD's ``endpoint_params``)."""
    auth: str = "basic"
    """How the client authenticates (section 2.3.1): HTTP Basic, or in the form (``post``)."""
    timeout: float = 5.0
    """Seconds one token request may take."""
    shown_token_url: str | None = None
    """``token_url`` if no ``${VAR}`` is in it: what a log line may show."""

    def public(self) -> dict[str, object]:
        return {
            "token_url": self.shown_token_url,
            "auth": self.auth,
            "scope": self.scope,
            "params": [name for name, _ in self.params],
        }


HEDGE_PERCENTILE = 0.65
"""The default hedge delay: this percentile of the supplier's recent answer times.

Chosen by measurement (``python -m bench.tails``, docs/retries.md "Hedged
attempts"), paid from the hedge bucket (0.2 a success): with a lognormal tail
(median 200 ms, sigma 0.9) at two callers, three runs each, the 0.7 percentile
(hedges sent about 350 ms in) left the p90 at 575 ms, the 0.6 made 3.45 calls
an answer; the 0.65 gave 98.7 % complete, p90 473 ms, 3.36 calls, no hedge
refused for want of a token."""


HEDGE_EARN = 0.2
"""A hedge token earned per successful attempt by default: Cloud Pub/Sub's publisher's
rate, which bounds hedges to a fifth of a healthy supplier's calls."""
HEDGE_BURST = 10
"""Hedge tokens a supplier may save up by default (full at start)."""


@attrs.frozen
class Hedge:
    """When a supplier's late first attempt is joined by a second (``hedging.py``)."""

    percentile: float | None = HEDGE_PERCENTILE
    """After this percentile of its recent answer times (never under 20 ms)..."""
    delay: float | None = None
    """...or after this many seconds, fixed."""
    earn: float = HEDGE_EARN
    """Hedge tokens earned by each attempt sent to it that brought a valid quote."""
    burst: int = HEDGE_BURST
    """Hedge tokens it may save up (the bucket is full at start)."""


@attrs.frozen(kw_only=True)
class Supplier:
    """One supplier as QuoteFlow asks it."""

    name: str
    url: str
    """The quote endpoint; every attempt is ``GET {url}?sku=...&scenario=...``."""
    share: int
    """Outbound slots this supplier may hold at once."""
    connect_timeout: float
    read_timeout: float
    breaker_failures: int
    """Failures in a row that open its circuit; 0: no breaker for it."""
    retry_budget_capacity: float
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)
    """Sent on every attempt, ``${VAR}`` already resolved: secrets, never shown."""
    adapter: Adapter | None = attrs.field(default=None, repr=False, eq=False)
    adapter_name: str | None = None
    """``package.module:function`` of ``adapter``, as the file names it."""
    adapter_takes_asked: bool = False
    """The adapter takes a second argument: what was asked (``models.Asked``)."""
    shape: RequestShape | None = attrs.field(default=None, repr=False)
    """How to ask it when that is not QuoteFlow's classic ``GET {url}?sku=&scenario=``
    with fixed headers; ``None``: exactly that."""
    oauth2: OAuth2Client | None = attrs.field(default=None, repr=False)
    shown_url: str | None = None
    """``url`` with each ``${VAR}`` as ``***``, if it has one."""
    rate: Rate | None = None
    """At most this many attempts per window, retries included (``None``: no rate)."""
    batch: BatchSpec | None = attrs.field(default=None, repr=False)
    """How it takes many lines per call (``batching.py``); ``None``: one SKU per call."""
    hedge: Hedge | None = None
    """Hedged second attempts (``hedge`` in its entry, else ``--hedge``); ``None``: none."""
    currency: str = DEFAULT_CURRENCY
    """What its quotes that name no currency are in: its entry's, else ``--currency``."""

    def public(self) -> dict[str, object]:
        """What a log line or the ``starting`` event may show: header names, never values."""
        fields: dict[str, object] = {
            "name": self.name,
            "url": self.url if self.shown_url is None else self.shown_url,
            "share": self.share,
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "breaker_failures": self.breaker_failures,
            "retry_budget_capacity": self.retry_budget_capacity,
            "headers": [name for name, _ in self.headers]
            if self.shape is None
            else [name for name, _ in self.shape.headers],
            "adapter": self.adapter_name,
        }
        if self.shape is not None:
            fields["method"] = self.shape.method
            fields["query"] = [name for name, _ in self.shape.query]
            fields["body"] = self.shape.has_body
        if self.oauth2 is not None:
            fields["oauth2"] = self.oauth2.public()
        if self.rate is not None:
            fields["rate"] = str(self.rate)
        if self.batch is not None:
            fields["batch"] = {"max_items": self.batch.max_items, "rate_unit": self.batch.rate_unit}
        if self.hedge is not None:
            fields["hedge"] = attrs.asdict(self.hedge)
        fields["currency"] = self.currency
        return fields


@attrs.frozen
class Catalogue:
    """Every supplier QuoteFlow asks, in the order failures are listed."""

    suppliers: tuple[Supplier, ...]
    path: str | None = None
    """The file it was read from; ``None`` for the default catalogue."""
    names: tuple[str, ...] = attrs.field(init=False)

    @names.default
    def _names(self) -> tuple[str, ...]:
        return tuple(supplier.name for supplier in self.suppliers)

    def __len__(self) -> int:
        return len(self.suppliers)

    def shares(self) -> dict[str, int]:
        """Each supplier's share of the outbound slots."""
        return {supplier.name: supplier.share for supplier in self.suppliers}

    def hedges(self) -> dict[str, tuple[int, float]]:
        """Each hedged supplier's hedge bucket: its ``burst`` and ``earn``."""
        return {
            supplier.name: (supplier.hedge.burst, supplier.hedge.earn)
            for supplier in self.suppliers
            if supplier.hedge is not None and supplier.batch is None
        }

    def public(self) -> list[dict[str, object]]:
        """The suppliers as a log line may show them (``Supplier.public``)."""
        return [supplier.public() for supplier in self.suppliers]


def default_hedge(settings: Settings) -> Hedge | None:
    """A supplier's hedging unless its entry says: ``--hedge``'s, at the default percentile."""
    return hedge_of(settings) if settings.hedge else None


def hedge_of(settings: Settings, **keys: Any) -> Hedge:
    """A hedge with ``--hedge-earn`` and ``--hedge-burst`` unless ``keys`` say otherwise."""
    keys.setdefault("earn", settings.hedge_earn)
    keys.setdefault("burst", settings.hedge_burst)
    return Hedge(**keys)


def default_share(settings: Settings, count: int) -> int:
    """A supplier's share unless set: ``--supplier-share``, else all but one slot per other one."""
    if settings.supplier_share is not None:
        return settings.supplier_share
    return max(1, settings.outbound_limit - (count - 1))


def default_catalogue(settings: Settings) -> Catalogue:
    """The three lab suppliers under ``provider_url``, with the global settings."""
    base = URL(settings.provider_url) / "quotes"
    share = default_share(settings, len(LAB_SUPPLIERS))
    return Catalogue(
        tuple(
            Supplier(
                name=name,
                url=str(base / name),
                share=share,
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
                breaker_failures=settings.breaker_failures,
                retry_budget_capacity=settings.retry_budget_capacity,
                hedge=default_hedge(settings),
                currency=settings.currency,
            )
            for name in LAB_SUPPLIERS
        )
    )


def load(path: str, settings: Settings, environ: Mapping[str, str]) -> Catalogue:
    """Read and check the catalogue file at ``path``; ``CatalogueError`` names what is wrong."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line N, column M)".
        raise CatalogueError(f"{path}: not TOML: {exc}") from None
    except UnicodeDecodeError:
        raise CatalogueError(f"{path}: not TOML: not UTF-8") from None
    return parse(document, settings, environ, path=path)


def parse(
    document: Mapping[str, Any],
    settings: Settings,
    environ: Mapping[str, str],
    *,
    path: str = "<catalogue>",
) -> Catalogue:
    """Check a decoded catalogue document and build the ``Catalogue`` it describes."""
    unknown = sorted(set(document) - {"supplier"})
    if unknown:
        raise CatalogueError(f"{path}: unknown key {unknown[0]!r} (only [[supplier]] tables)")
    tables = document.get("supplier")
    if not isinstance(tables, list) or not tables:
        raise CatalogueError(f"{path}: no [[supplier]] table")
    if len(tables) > MAX_SUPPLIERS:
        raise CatalogueError(
            f"{path}: {len(tables)} suppliers, at most {MAX_SUPPLIERS} are allowed"
        )
    share = default_share(settings, len(tables))
    suppliers: list[Supplier] = []
    seen: set[str] = set()
    for index, table in enumerate(tables, start=1):
        reader = _Reader(path, index, table)
        supplier = reader.supplier(settings, environ, share)
        if supplier.name in seen:
            raise CatalogueError(f"{path}: supplier {supplier.name!r}: name: used twice")
        seen.add(supplier.name)
        suppliers.append(supplier)
    return Catalogue(tuple(suppliers), path=path)


class _Reader:
    """Reads one ``[[supplier]]`` table, naming it in every error."""

    def __init__(self, path: str, index: int, table: object) -> None:
        self.path = path
        self.where = f"supplier #{index}"
        if not isinstance(table, dict):
            self.fail("not a table")
        self.table: dict[str, Any] = table

    def fail(self, problem: str, field: str | None = None) -> NoReturn:
        at = f"{self.where}: {field}" if field else self.where
        raise CatalogueError(f"{self.path}: {at}: {problem}")

    def supplier(self, settings: Settings, environ: Mapping[str, str], share: int) -> Supplier:
        table = self.table
        name = table.get("name")
        if name is None:
            self.fail("missing", "name")
        if type(name) is not str or not NAME.fullmatch(name):
            self.fail("must be 1-32 characters of a-z, 0-9, _ and -", "name")
        self.where = f"supplier {name!r}"
        unknown = sorted(set(table) - set(_KEYS))
        if unknown:
            self.fail(f"unknown key (known: {', '.join(_KEYS)})", unknown[0])
        if "url" not in table:
            self.fail("missing", "url")
        adapter_name = self.text("adapter") if "adapter" in table else None
        adapter = None if adapter_name is None else self.adapter(adapter_name)
        url = self.url(table["url"], environ)
        oauth2 = self.oauth2(table["oauth2"], environ) if "oauth2" in table else None
        headers = self.headers(table.get("headers", {}), environ, oauth2 is not None)
        shape = self.shape(url, headers, environ)
        rate = self.rate(table["rate"]) if "rate" in table else None
        batch = None
        if "batch" in table:
            try:
                batch = read_batch(table["batch"], shape, None if rate is None else rate.quota)
            except BatchError as exc:
                self.fail(str(exc), exc.field)
            if adapter is not None and not _takes_two(adapter):
                self.fail(
                    "a batch supplier's adapter takes what was asked too: (payload, asked)",
                    "adapter",
                )
        return Supplier(
            name=name,
            url=url,
            share=self.share(table.get("share", share), settings.outbound_limit),
            connect_timeout=self.duration("connect_timeout", settings.connect_timeout),
            read_timeout=self.duration("read_timeout", settings.read_timeout),
            breaker_failures=self.integer("breaker_failures", settings.breaker_failures, 0, 1000),
            retry_budget_capacity=self.number(
                "retry_budget_capacity", settings.retry_budget_capacity, at_least=1
            ),
            headers=() if shape is not None else _fixed(headers),
            adapter=adapter,
            adapter_name=adapter_name,
            adapter_takes_asked=adapter is not None and _takes_two(adapter),
            shape=shape,
            oauth2=oauth2,
            shown_url=None if shape is None else shape.shown_origin + shape.path.render(_BRACED)[1],
            rate=rate,
            batch=batch,
            hedge=self.hedge(table["hedge"], batch, settings)
            if "hedge" in table
            else default_hedge(settings),
            currency=self.currency(table.get("currency", settings.currency)),
        )

    def currency(self, value: object) -> str:
        """An ISO 4217 code with a minor unit, upper case."""
        if minor_unit(value) is None:
            self.fail("must be an ISO 4217 currency code with a minor unit, e.g. EUR", "currency")
        assert isinstance(value, str)
        return value

    def shape(
        self, url: str, headers: tuple[tuple[str, Text], ...], environ: Mapping[str, str]
    ) -> RequestShape | None:
        """The supplier's request templates, or ``None`` for the classic request."""
        table = self.table
        origin, path = self.template("url", lambda: split_url(url, environ))
        shaped = any(key in table for key in _SHAPING) or bool(path.placeholders)
        method = table.get("method", "GET")
        if method not in METHODS:
            self.fail('must be "GET" or "POST"', "method")
        if "body" in table:
            if method != "POST":
                self.fail('a body needs method = "POST"', "body")
            if not isinstance(table["body"], dict):
                self.fail("must be a table (the JSON object sent)", "body")
            body = self.template("body", lambda: parse_json(table["body"], environ, "body"))
        else:
            body = None
        if shaped:
            query = self.query(table.get("query", {}), environ)
        else:
            # Classic, but with a secret in the path or a placeholder in a header:
            # the same request, rendered.
            if not path.secret and not any(text.placeholders for _, text in headers):
                return None
            query = (("sku", Text((_SKU,))), ("scenario", Text((_SCENARIO,))))
        if body is not None and not any(name.lower() == "content-type" for name, _ in headers):
            headers = (*headers, ("Content-Type", Text(("application/json",))))
        return compile_shape(
            method=method,
            origin=origin,
            path=path,
            query=query,
            headers=headers,
            body=body,
            has_body=body is not None,
        )

    def hedge(self, value: object, batch: BatchSpec | None, settings: Settings) -> Hedge | None:
        """``hedge = true | false``, or ``{ percentile = 0.7 }`` or ``{ delay = 0.3 }``.

        A table may add ``earn`` (0 < earn <= 1) and ``burst`` (1 to 1000): its
        hedge bucket's (``retry.HedgeBudget``); else ``--hedge-earn``/``--hedge-burst``.
        """
        if value is False:
            return None
        if batch is not None:
            self.fail("a batch supplier's calls are not hedged", "hedge")
        if value is True:
            return hedge_of(settings)
        if not isinstance(value, dict) or not set(value) <= {
            "percentile",
            "delay",
            "earn",
            "burst",
        }:
            self.fail(
                "must be true, false, or a table of percentile or delay, earn and burst", "hedge"
            )
        when = [key for key in ("percentile", "delay") if key in value]
        if len(when) != 1:
            self.fail("must have exactly one of percentile = P or delay = SECONDS", "hedge")
        keys: dict[str, Any] = {}
        for key in value:
            number = value[key]
            if type(number) not in (int, float) or not math.isfinite(number):
                self.fail("must be a number", f"hedge.{key}")
        if "percentile" in value:
            if not 0 < value["percentile"] < 1:
                self.fail("must be between 0 and 1 (0.7: the 70th percentile)", "hedge.percentile")
            keys["percentile"] = float(value["percentile"])
        else:
            if not 0.02 <= value["delay"] <= 60:
                self.fail("must be from 0.02 to 60 seconds", "hedge.delay")
            keys["percentile"], keys["delay"] = None, float(value["delay"])
        if "earn" in value:
            if not 0 < value["earn"] <= 1:
                self.fail("must be more than 0 and at most 1 (tokens per success)", "hedge.earn")
            keys["earn"] = float(value["earn"])
        if "burst" in value:
            if type(value["burst"]) is not int or not 1 <= value["burst"] <= 1000:
                self.fail("must be a whole number from 1 to 1000", "hedge.burst")
            keys["burst"] = value["burst"]
        return hedge_of(settings, **keys)

    def rate(self, value: object) -> Rate:
        """``"20/1s"``: the callers' file's syntax and meaning (GCRA, a burst of the quota)."""
        try:
            return parse_rate(value)
        except ConfigError as exc:
            self.fail(str(exc).removeprefix("rate "), "rate")

    def template(self, field: str, parse: Callable[[], _T]) -> _T:
        try:
            return parse()
        except TemplateError as exc:
            self.fail(str(exc), field)

    def query(self, value: object, environ: Mapping[str, str]) -> tuple[tuple[str, Text], ...]:
        if not isinstance(value, dict):
            self.fail("must be a table of name = value", "query")
        found: list[tuple[str, Text]] = []
        for name, raw in value.items():
            field = f"query.{name}"
            if not name:
                self.fail("a query name may not be empty", "query")
            if type(raw) is int:
                raw = str(raw)
            if type(raw) is not str:
                self.fail("must be a string or an integer", field)
            found.append((name, self.template(field, partial(parse_text, raw, environ))))
        return tuple(found)

    def oauth2(self, value: object, environ: Mapping[str, str]) -> OAuth2Client:
        if not isinstance(value, dict):
            self.fail("must be a table ([supplier.oauth2])", "oauth2")
        unknown = sorted(set(value) - set(_OAUTH2_KEYS))
        if unknown:
            self.fail(f"unknown key (known: {', '.join(_OAUTH2_KEYS)})", f"oauth2.{unknown[0]}")
        texts: dict[str, str] = {}
        for key in ("token_url", "client_id", "client_secret"):
            field = f"oauth2.{key}"
            if key not in value:
                self.fail("missing", field)
            if type(value[key]) is not str or not value[key]:
                self.fail("must be a non-empty string", field)
            texts[key] = self.resolve(value[key], environ, field)
        token_url = texts["token_url"]
        try:
            parsed = URL(token_url)
            parsed.port  # noqa: B018 -- parsing the port is the check
        except ValueError:
            self.fail("not a URL", "oauth2.token_url")
        if parsed.scheme not in ("http", "https") or not parsed.host or parsed.fragment:
            self.fail("must be an http:// or https:// URL with a host", "oauth2.token_url")
        scope = value.get("scope")
        if scope is not None and (type(scope) is not str or _FORBIDDEN_IN_VALUE.search(scope)):
            self.fail("must be a string (space-separated scopes)", "oauth2.scope")
        params = value.get("params", {})
        if not isinstance(params, dict):
            self.fail("must be a table of name = value", "oauth2.params")
        resolved: list[tuple[str, str]] = []
        for key, raw in params.items():
            field = f"oauth2.params.{key}"
            if type(raw) is not str:
                self.fail("must be a string", field)
            if key in ("grant_type", "scope", "client_id", "client_secret"):
                self.fail("set by QuoteFlow from the oauth2 table", field)
            resolved.append((key, self.resolve(raw, environ, field)))
        auth = value.get("auth", "basic")
        if auth not in ("basic", "post"):
            self.fail('must be "basic" or "post"', "oauth2.auth")
        timeout = value.get("timeout", 5.0)
        if type(timeout) not in (int, float) or not 0 < timeout <= 60:
            self.fail("must be more than 0 and at most 60 s", "oauth2.timeout")
        return OAuth2Client(
            token_url=token_url,
            client_id=texts["client_id"],
            client_secret=texts["client_secret"],
            scope=scope,
            params=tuple(resolved),
            auth=auth,
            timeout=float(timeout),
            shown_token_url=None if "${" in value["token_url"] else token_url,
        )

    def text(self, field: str) -> str:
        value = self.table[field]
        if type(value) is not str:
            self.fail("must be a string", field)
        return value

    def url(self, value: object, environ: Mapping[str, str]) -> str:
        """The url as written (placeholders and all), its origin and literal path checked."""
        if type(value) is not str:
            self.fail("must be a string", "url")
        origin, path = self.template("url", lambda: split_url(value, environ))
        try:
            url = URL(origin + path.render(_NAMES)[0])
            url.port  # noqa: B018 -- parsing the port is the check
        except ValueError:
            self.fail("not a URL", "url")
        if url.scheme not in ("http", "https") or not url.host:
            self.fail("must be an http:// or https:// URL with a host", "url")
        if url.user is not None or url.password is not None:
            self.fail("must not carry credentials (send them in headers)", "url")
        if url.query_string or url.fragment:
            self.fail("must not have a query or fragment (QuoteFlow sets ?sku=&scenario=)", "url")
        return value

    def share(self, value: object, limit: int) -> int:
        if type(value) is not int or value < 1:
            self.fail("must be an integer of at least 1", "share")
        if value > limit:
            self.fail(f"{value} is above the outbound limit ({limit})", "share")
        return value

    def duration(self, field: str, default: float) -> float:
        """Seconds, as the global timeouts allow them: above 0, at most an hour."""
        value = self.number(field, default)
        if not 0 < value <= 3600:
            self.fail("must be more than 0 and at most 3600 s", field)
        return value

    def number(self, field: str, default: float, *, at_least: float | None = None) -> float:
        """An integer or a float (never a boolean or a string), finite."""
        value = self.table.get(field, default)
        if type(value) not in (int, float) or not math.isfinite(value):
            self.fail("must be a number", field)
        if at_least is not None and value < at_least:
            self.fail(f"must be at least {at_least}", field)
        return float(value)

    def integer(self, field: str, default: int, low: int, high: int) -> int:
        value = self.table.get(field, default)
        if type(value) is not int or not low <= value <= high:
            self.fail(f"must be an integer from {low} to {high}", field)
        return value

    def headers(
        self, value: object, environ: Mapping[str, str], oauth2: bool
    ) -> tuple[tuple[str, Text], ...]:
        if not isinstance(value, dict):
            self.fail("must be a table of header name = value", "headers")
        found: list[tuple[str, Text]] = []
        seen: set[str] = set()
        for header, raw in value.items():
            field = f"headers.{header}"
            if not _HEADER_NAME.fullmatch(header):
                self.fail("not a valid header name", "headers")
            if header.lower() in RESERVED_HEADERS:
                self.fail("set by QuoteFlow on every attempt", field)
            if oauth2 and header.lower() == "authorization":
                self.fail("set from the oauth2 token", field)
            if header.lower() in seen:
                self.fail("named twice (header names ignore case)", field)
            seen.add(header.lower())
            if type(raw) is not str:
                self.fail("must be a string", field)
            text = self.template(field, partial(parse_text, raw, environ))
            for piece in text.pieces:
                # A placeholder's value is encoded as it is sent (templates.header_value).
                fixed = piece.value if isinstance(piece, Secret) else piece
                if isinstance(fixed, str) and _FORBIDDEN_IN_VALUE.search(fixed):
                    # Never the value itself: it is a credential.
                    self.fail("contains a control character", field)
            found.append((header, text))
        return tuple(found)

    def resolve(self, raw: str, environ: Mapping[str, str], field: str) -> str:
        """``raw`` with each ``${NAME}`` replaced by that environment variable."""

        def variable(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in environ:
                self.fail(f"environment variable {name} is not set", field)
            return environ[name]

        return _VARIABLE.sub(variable, raw)

    def adapter(self, target: str) -> Adapter:
        """The callable ``target`` names, imported now."""
        module_name, sep, attribute = target.partition(":")
        if not sep or not module_name or not attribute:
            self.fail("must be 'package.module:function'", "adapter")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            self.fail(f"module {module_name!r} cannot be imported", "adapter")
        except Exception as exc:  # a broken module, reported by its class only
            self.fail(f"module {module_name!r} failed to import ({type(exc).__name__})", "adapter")
        found: object = module
        for part in attribute.split("."):
            found = getattr(found, part, None)
            if found is None:
                self.fail(f"{module_name!r} has no {attribute!r}", "adapter")
        if not callable(found):
            self.fail(f"{target!r} is not callable", "adapter")
        if not _takes_two(found) and not _takes_one(found):
            self.fail(f"{target!r} must take (payload) or (payload, asked)", "adapter")
        adapter: Adapter = found
        return adapter


_T = TypeVar("_T")
_SKU = Placeholder("sku")
_SCENARIO = Placeholder("scenario")
_NAMES = {name: name for name in PLACEHOLDERS}
"""Placeholders filled in with their own names: a template's path, for the URL checks."""
_BRACED = {name: "{" + name + "}" for name in PLACEHOLDERS}
"""Placeholders left as they are written: a template as a log line shows it."""


def _fixed(headers: tuple[tuple[str, Text], ...]) -> tuple[tuple[str, str], ...]:
    """Headers with no placeholder, as the text every attempt sends."""
    return tuple((name, text.render({})[0]) for name, text in headers)


def _positional(adapter: object) -> tuple[int, bool] | None:
    """How many positional arguments ``adapter`` takes, and whether it takes more (*args)."""
    try:
        signature = inspect.signature(adapter)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None  # a builtin without a signature: called with one argument
    count = 0
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            return count, True
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count, False


def _takes_two(adapter: object) -> bool:
    found = _positional(adapter)
    return found is not None and (found[0] >= 2 or found[1])


def _takes_one(adapter: object) -> bool:
    found = _positional(adapter)
    return found is None or found[0] >= 1 or found[1]
