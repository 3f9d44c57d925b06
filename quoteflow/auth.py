"""Bearer API keys: read from a file once at start-up, compared in constant time.

A key is never kept, logged or shown as text after loading: ``ApiKeys`` holds
only SHA-256 digests and its ``repr`` gives their count. A presented key is
hashed too, so every comparison is between two 32-byte strings (no length
leak), and every configured key is compared (no early exit telling which one
matched, or how many were tried).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from pathlib import Path

_BEARER = re.compile(r"Bearer +([A-Za-z0-9\-._~+/]+=*) *", re.IGNORECASE)
"""``Authorization: Bearer <token>`` with RFC 6750's token syntax; the scheme is case-blind."""

_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


class ApiKeysError(Exception):
    """The keys file cannot be used: unreadable, not text, a malformed line, or no key at all."""


class ApiKeys:
    """The set of keys that open the protected routes; holds digests, never the keys."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str]) -> None:
        digests = tuple(sorted({_digest(key) for key in keys}))
        if not digests:
            raise ApiKeysError("no API key given")
        self._digests = digests

    @classmethod
    def from_file(cls, path: str) -> ApiKeys:
        """Keys from ``path``, one per line; blank lines and ``#`` comments are skipped.

        Raises ``ApiKeysError`` with a one-line reason that never quotes a key.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ApiKeysError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ApiKeysError(f"{path} is not UTF-8 text") from None
        keys: list[str] = []
        for number, line in enumerate(text.splitlines(), start=1):
            key = line.strip()
            if not key or key.startswith("#"):
                continue
            if not _TOKEN.fullmatch(key):
                # The line may be a key with a typo: name its number, never its text.
                raise ApiKeysError(f"{path} line {number} is not a bearer key (A-Z a-z 0-9 -._~+/)")
            keys.append(key)
        if not keys:
            raise ApiKeysError(f"{path} holds no API key")
        return cls(keys)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        count = len(self)
        return f"ApiKeys({count} key{'' if count == 1 else 's'})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKeys) and self._digests == other._digests

    def __hash__(self) -> int:
        return hash(self._digests)

    @property
    def digests(self) -> tuple[bytes, ...]:
        """The SHA-256 digest of every key (for ``callers``: each key an unnamed caller)."""
        return self._digests

    def accepts(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries one of the keys."""
        presented, well_formed = presented_digest(authorization)
        found = False
        for digest in self._digests:
            # Bitwise or, not ``any()``: every key is compared, whichever matches.
            found |= hmac.compare_digest(presented, digest)
        return found and well_formed


def presented_digest(authorization: str | None) -> tuple[bytes, bool]:
    """The digest of the bearer key in an ``Authorization`` value, and whether there was one.

    A value that carries no bearer key still gets a digest (of nothing), so
    that checking it costs what checking a key costs.
    """
    match = _BEARER.fullmatch(authorization or "")
    return _digest(match[1] if match else ""), match is not None


def is_bearer_token(key: str) -> bool:
    """Whether ``key`` can be sent as ``Authorization: Bearer <key>`` (RFC 6750's syntax)."""
    return _TOKEN.fullmatch(key) is not None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()
