"""Request templates: how a supplier whose API is not QuoteFlow's protocol is asked.

A catalogue entry may shape its supplier's request (``catalogue.py``): a
``method``, placeholders in the ``url``'s path, a ``query`` table, ``headers``
values and a JSON ``body``. This module turns those strings into templates
once, when the catalogue is read, and renders them once per request:

    {sku} {quantity} {scenario} {request_id}   what the caller asked, and the
                                               request's id
    ${VAR}                                     an environment variable, read
                                               at load time: a secret

Rendering knows where each value lands, and encodes it for that place: a path
segment (``A/B?x`` stays one segment, ``..`` cannot climb), a query value, a
header value (no CR or LF can split the request), or JSON, where a string that
is exactly one placeholder keeps the value's type (``"{quantity}"`` → 2).

A value that came from ``${VAR}`` is never shown: every template renders
twice over, the request QuoteFlow sends and the one it may show (a span's
``url.full``, a log line), where each secret is ``***``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import quote

import attrs
from yarl import URL

PLACEHOLDERS: Final = ("sku", "quantity", "scenario", "request_id")
"""What a template may ask for, as ``{name}``."""

REDACTED: Final = "***"
"""What a secret is shown as."""

_PIECE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``${VAR}`` (group 1) or ``{placeholder}`` (group 2); any other brace is text."""

_SEGMENT_SAFE: Final = "-._~!$&'()*+,;=:@"
"""What a path segment carries unencoded (RFC 3986 ``pchar`` less ``%``)."""
_LITERAL_PATH_SAFE: Final = _SEGMENT_SAFE + "/%"
"""A template's own path text: its slashes are segments, its ``%XX`` already encoded."""
_HEADER_SAFE: Final = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
"""Printable ASCII passes into a header value as is; ``%``, control characters and
anything else are percent-encoded (UTF-8), so no value can split the request."""


class TemplateError(ValueError):
    """A template that cannot be used; the text names the problem, never a secret's value."""


@attrs.frozen
class Secret:
    """The value of a ``${VAR}``: sent, never shown."""

    value: str = attrs.field(repr=False)

    def __str__(self) -> str:
        return REDACTED


@attrs.frozen
class Placeholder:
    """``{name}``: one of ``PLACEHOLDERS``, filled in per request."""

    name: str


Piece = str | Secret | Placeholder


@attrs.frozen
class Text:
    """A template string: text, secrets and placeholders, in order."""

    pieces: tuple[Piece, ...]

    @property
    def placeholders(self) -> frozenset[str]:
        return frozenset(piece.name for piece in self.pieces if isinstance(piece, Placeholder))

    @property
    def secret(self) -> bool:
        return any(isinstance(piece, Secret) for piece in self.pieces)

    @property
    def sole(self) -> Piece | None:
        """The one piece of a string that is exactly one placeholder or secret."""
        return self.pieces[0] if len(self.pieces) == 1 else None

    def render(
        self, values: Mapping[str, str], encode: Callable[[str], str] | None = None
    ) -> tuple[str, str]:
        """The text to send and the text to show; each placeholder's value through ``encode``.

        Text and secrets are sent as the template holds them (a path's were
        encoded when it was compiled, ``split_url``).
        """
        sent: list[str] = []
        shown: list[str] = []
        for piece in self.pieces:
            if isinstance(piece, str):
                sent.append(piece)
                shown.append(piece)
            elif isinstance(piece, Secret):
                sent.append(piece.value)
                shown.append(REDACTED)
            else:
                value = values[piece.name]
                value = value if encode is None else encode(value)
                sent.append(value)
                shown.append(value)
        return "".join(sent), "".join(shown)


def parse_text(raw: str, environ: Mapping[str, str]) -> Text:
    """``raw`` as a template; ``TemplateError`` for an unknown placeholder or unset variable."""
    pieces: list[Piece] = []
    at = 0
    for match in _PIECE.finditer(raw):
        if match.start() > at:
            pieces.append(raw[at : match.start()])
        variable, placeholder = match.groups()
        if variable is not None:
            if variable not in environ:
                raise TemplateError(f"environment variable {variable} is not set")
            pieces.append(Secret(environ[variable]))
        else:
            if placeholder not in PLACEHOLDERS:
                known = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
                raise TemplateError(f"unknown placeholder {{{placeholder}}} (known: {known})")
            pieces.append(Placeholder(placeholder))
        at = match.end()
    if at < len(raw):
        pieces.append(raw[at:])
    return Text(tuple(pieces))


def path_segment(value: str) -> str:
    """``value`` as one path segment: nothing in it can end the path or climb out of it."""
    encoded = quote(value, safe=_SEGMENT_SAFE)
    if encoded in (".", ".."):
        # Dot segments would be resolved away (RFC 3986 section 5.2.4).
        return encoded.replace(".", "%2E")
    return encoded


def header_value(value: str) -> str:
    """``value`` as header text: printable ASCII as is, everything else percent-encoded."""
    if value.isascii() and value.isprintable() and "%" not in value:
        return value
    return quote(value, safe=_HEADER_SAFE)


def _literal_path(value: str) -> str:
    return quote(value, safe=_LITERAL_PATH_SAFE)


# -- the JSON body ----------------------------------------------------------------

JSONTemplate = dict[str, "JSONTemplate"] | list["JSONTemplate"] | Text | int | float | bool | None


def parse_json(value: object, environ: Mapping[str, str], where: str) -> JSONTemplate:
    """A TOML table as a JSON body template; ``TemplateError`` names the key at fault."""
    if isinstance(value, dict):
        return {key: parse_json(item, environ, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [parse_json(item, environ, f"{where}[{n}]") for n, item in enumerate(value)]
    if isinstance(value, str):
        try:
            return parse_text(value, environ)
        except TemplateError as exc:
            raise TemplateError(f"{where}: {exc}") from None
    if type(value) in (int, float, bool):
        return value  # type: ignore[return-value]  # narrowed by the test above
    raise TemplateError(f"{where}: a {type(value).__name__} has no JSON form")


def _json_uses(template: JSONTemplate) -> frozenset[str]:
    if isinstance(template, dict):
        return frozenset().union(*(_json_uses(item) for item in template.values()))
    if isinstance(template, list):
        return frozenset().union(*(_json_uses(item) for item in template))
    if isinstance(template, Text):
        return template.placeholders
    return frozenset()


def _render_json(template: JSONTemplate, values: Mapping[str, str]) -> object:
    if isinstance(template, Text):
        sole = template.sole
        if isinstance(sole, Placeholder):
            value = values[sole.name]
            return int(value) if sole.name == "quantity" else value  # its type, not text
        if isinstance(sole, Secret):
            return sole.value
        return template.render(values)[0]
    if isinstance(template, dict):
        return {key: _render_json(item, values) for key, item in template.items()}
    if isinstance(template, list):
        return [_render_json(item, values) for item in template]
    return template


uses_of = _json_uses
"""Every placeholder a JSON template names."""
render_json = _render_json
"""A JSON template rendered with ``values``, as a value ready to encode."""


# -- a whole request ------------------------------------------------------------------


@attrs.frozen
class Shaped:
    """One request's rendering: sent as is by every attempt of that request."""

    url: URL
    shown_url: URL
    """``url`` with every secret as ``***``: what a span or a log line may carry."""
    headers: Mapping[str, str]
    body: object | None = attrs.field(repr=False)
    """The encoded body, as the HTTP client sends it (``supplier.py``: an aiohttp payload)."""


@attrs.frozen(kw_only=True)
class RequestShape:
    """How one supplier is asked: its templates, checked and compiled once."""

    method: str
    origin: str
    """``scheme://host[:port]``: no placeholder or secret may move the request elsewhere."""
    path: Text
    query: tuple[tuple[str, Text], ...]
    headers: tuple[tuple[str, Text], ...] = attrs.field(repr=False)
    body: JSONTemplate = attrs.field(repr=False, default=None)
    has_body: bool = False
    static_body: bytes | None = attrs.field(repr=False, default=None)
    """The encoded body when no placeholder is in it: encoded once, at load time."""
    uses: frozenset[str] = frozenset()
    """Every placeholder used anywhere."""
    shown_origin: str = ""
    content_type: str = "application/json"
    """The body's ``Content-Type``: the one ``headers`` names, else JSON's."""

    def url(self, values: Mapping[str, str]) -> tuple[URL, URL]:
        """The URL to send and the one to show, for ``values``."""
        path, shown_path = self.path.render(values, path_segment)
        url = URL(self.origin + path, encoded=True)
        shown = URL(self.shown_origin + shown_path, encoded=True)
        if self.query:
            sent_query: list[tuple[str, str]] = []
            shown_query: list[tuple[str, str]] = []
            for name, text in self.query:
                value, visible = text.render(values)
                sent_query.append((name, value))
                shown_query.append((name, visible))
            url = url.with_query(sent_query)
            shown = shown.with_query(shown_query)
        return url, shown

    def render_headers(self, values: Mapping[str, str]) -> dict[str, str]:
        return {name: text.render(values, header_value)[0] for name, text in self.headers}

    def render_body(self, values: Mapping[str, str]) -> bytes | None:
        if not self.has_body:
            return None
        if self.static_body is not None:
            return self.static_body
        return encode_json(_render_json(self.body, values))


def encode_json(value: object) -> bytes:
    """A body as suppliers' JSON readers expect it: compact UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def split_url(raw: str, environ: Mapping[str, str]) -> tuple[str, Text]:
    """A ``url`` template as its origin (checked by the caller) and its path template.

    Placeholders and ``${VAR}`` may stand only in the path: the origin decides
    where the request (and the token with it) goes.
    """
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise TemplateError("must be an http:// or https:// URL with a host")
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if _PIECE.search(authority):
        raise TemplateError("a placeholder or ${VAR} in the host part (only the path may have one)")
    text = parse_text(path, environ)
    for piece in text.pieces:
        if isinstance(piece, str) and ("?" in piece or "#" in piece):
            raise TemplateError("must not have a query or fragment (use the query table)")
    encoded: list[Piece] = []
    for piece in text.pieces:
        if isinstance(piece, str):
            encoded.append(_literal_path(piece))
        elif isinstance(piece, Secret):
            encoded.append(Secret(path_segment(piece.value)))
        else:
            encoded.append(piece)
    return f"{scheme}://{authority}", Text(tuple(encoded))


def compile_shape(
    *,
    method: str,
    origin: str,
    path: Text,
    query: tuple[tuple[str, Text], ...],
    headers: tuple[tuple[str, Text], ...],
    body: JSONTemplate,
    has_body: bool,
) -> RequestShape:
    """A checked ``RequestShape``; what each part uses is worked out here, once."""
    uses = set(path.placeholders)
    for _, text in query:
        uses |= text.placeholders
    for _, text in headers:
        uses |= text.placeholders
    body_uses = _json_uses(body) if has_body else frozenset()
    uses |= body_uses
    static_body = None
    if has_body and not body_uses:
        static_body = encode_json(_render_json(body, {}))
    return RequestShape(
        method=method,
        origin=origin,
        shown_origin=origin,
        path=path,
        query=query,
        headers=headers,
        body=body,
        has_body=has_body,
        static_body=static_body,
        uses=frozenset(uses),
        content_type=next(
            (
                text.render(dict.fromkeys(PLACEHOLDERS, ""))[0]
                for name, text in headers
                if name.lower() == "content-type"
            ),
            "application/json",
        ),
    )
