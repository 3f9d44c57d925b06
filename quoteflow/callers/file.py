"""The callers file: TOML, one ``[[caller]]`` table each, checked whole before it is used.

    [[caller]]
    name = "acme"                       # [a-z0-9_-]{1,32}, unique
    key_sha256 = "9f86d081884c7d65..."  # the key's SHA-256, hex: the file holds no secret
    rate = "100/60s"                    # optional: at most 100 admitted requests per 60 s
    seats = 2                           # optional: at most 2 requests in progress per process

    [[caller]]
    name = "beta"
    key = "${BETA_KEY}"                 # or the key itself, from the environment

``load_callers(path, environ)`` is a pure function of the file's text and the
environment: the same check at start-up, on ``SIGHUP`` and (under gunicorn) in
the master before it replaces the workers. Every problem is one line naming
the file and the caller, never quoting a key or a digest.
"""

from __future__ import annotations

import binascii
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quoteflow.auth import is_bearer_token, presented_digest
from quoteflow.callers.model import UNNAMED, Caller, Callers, Rate
from quoteflow.errors import ConfigError

FIELDS = ("name", "key", "key_sha256", "rate", "seats")
"""Every field a ``[[caller]]`` table may have."""

_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_SHOWABLE = re.compile(r"[A-Za-z0-9_-]{1,32}")
"""A field name or table name that may be quoted in an error (a key never looks like one)."""
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_RATE = re.compile(r"(\d{1,9})/(\d{1,9})([smh])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
MAX_SEATS = 10_000


def load_callers(path: str, environ: Mapping[str, str]) -> Callers:
    """Every caller of the file at ``path``; ``${VAR}`` keys come from ``environ``.

    Raises ``ConfigError`` with one line naming the file and the caller.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says where, never what: the text there may be a key.
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    try:
        return _callers(document, environ, path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _callers(document: dict[str, Any], environ: Mapping[str, str], path: str) -> Callers:
    for key in document:
        if key != "caller":
            raise ConfigError(f"unknown table or key {_show(key)} (only [[caller]] tables)")
    tables = document.get("caller")
    if tables is None:
        raise ConfigError("holds no [[caller]] table")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("caller must be [[caller]] tables")
    entries: list[tuple[bytes, Caller]] = []
    named: dict[bytes, str] = {}
    for number, table in enumerate(tables, start=1):
        digest, caller = _caller(table, number, environ)
        if caller.name in named.values():
            raise ConfigError(f"caller {caller.name!r} appears twice")
        if digest in named:
            raise ConfigError(f"callers {named[digest]!r} and {caller.name!r} have the same key")
        named[digest] = caller.name
        entries.append((digest, caller))
    return Callers(entries, source=path)


def _caller(table: dict[str, Any], number: int, environ: Mapping[str, str]) -> tuple[bytes, Caller]:
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"caller #{number}: name must be 1-32 of a-z 0-9 _ -")
    try:
        if name == UNNAMED:
            raise ConfigError("the name '-' stands for --api-keys-file's keys")
        for field in table:
            if field not in FIELDS:
                raise ConfigError(f"unknown field {_show(field)} ({', '.join(FIELDS)})")
        digest = _digest(table, environ)
        rate = parse_rate(table["rate"]) if "rate" in table else None
        seats = _seats(table["seats"]) if "seats" in table else None
    except ConfigError as exc:
        raise ConfigError(f"caller {name!r}: {exc}") from None
    return digest, Caller(name, rate, seats)


def _digest(table: dict[str, Any], environ: Mapping[str, str]) -> bytes:
    """The SHA-256 of the caller's key, from ``key_sha256`` or from ``key = "${VAR}"``."""
    if ("key" in table) == ("key_sha256" in table):
        raise ConfigError("give exactly one of key_sha256 and key")
    if "key_sha256" in table:
        hexdigest = table["key_sha256"]
        if not isinstance(hexdigest, str) or not _HEX64.fullmatch(hexdigest):
            raise ConfigError("key_sha256 must be 64 hex characters (a SHA-256 digest)")
        return binascii.unhexlify(hexdigest)
    reference = table["key"]
    found = _VARIABLE.fullmatch(reference) if isinstance(reference, str) else None
    if found is None:
        # Never echo it: a key written here by mistake must not reach a log.
        raise ConfigError('key must be "${VARIABLE}" (the file holds no key; or use key_sha256)')
    variable = found[1]
    if variable not in environ:
        raise ConfigError(f"key: ${{{variable}}} is not set")
    key = environ[variable].strip()
    if not is_bearer_token(key):
        raise ConfigError(f"key: ${{{variable}}} is not a bearer key (A-Z a-z 0-9 -._~+/)")
    digest, _ = presented_digest(f"Bearer {key}")
    return digest


def parse_rate(raw: object) -> Rate:
    """``"100/60s"``: 100 requests per 60 seconds (``m`` and ``h`` also name a unit)."""
    found = _RATE.fullmatch(raw) if isinstance(raw, str) else None
    if found is None:
        # Short and with a slash, it was meant as a rate: showing it helps.
        shown = f" {raw!r}" if isinstance(raw, str) and "/" in raw and len(raw) <= 16 else ""
        raise ConfigError(f'rate{shown} is not <requests>/<window>, like "100/60s"')
    quota, window = int(found[1]), int(found[2]) * _UNIT_SECONDS[found[3]]
    if quota < 1:
        raise ConfigError(f"rate {raw!r}: at least 1 request per window")
    if window < 1:
        raise ConfigError(f"rate {raw!r}: the window must be at least 1 s")
    try:
        return Rate(quota, window)
    except ValueError:
        raise ConfigError(
            f"rate {raw!r}: at most 1000000 requests per window of at most 1 day"
        ) from None


def _seats(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_SEATS:
        raise ConfigError(f"seats must be a whole number from 1 to {MAX_SEATS}")
    return raw


def _show(name: str) -> str:
    return repr(name) if _SHOWABLE.fullmatch(name) else "(a name that is not shown)"
