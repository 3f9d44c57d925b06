"""The token endpoint's memory: the client's credentials, the tokens issued, the counts.

Plain data with no I/O: :mod:`provider_lab.oauth2` serves ``POST /oauth2/token``
from it, the control API (``/oauth2``) reads and changes it, and the bearer
check of the ``json`` dialect asks it whether a token is still good. Times are
the event loop's monotonic clock, passed in by the caller.
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from typing import Final, Literal

import attrs

TOKEN_LIMIT: Final = 10_000
"""Tokens remembered at most; past it the oldest issued is forgotten (and then refused)."""

MAX_TTL: Final = 31_536_000
"""The longest ``expires_in`` the lab hands out: a year, in seconds."""

MAX_FAULT_MS: Final = 600_000

MAX_CREDENTIAL: Final = 256


def credential_ok(value: object) -> bool:
    """Whether ``value`` can be a client id, a client secret or an API key: 1–256 printable
    characters (no control characters, no lone surrogates, which no request could carry)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_CREDENTIAL and value.isprintable()


FaultKind = Literal["down", "slow", "http_500"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = ("down", "slow", "http_500")


@attrs.frozen
class TokenFault:
    """How the token endpoint misbehaves until told otherwise (not a one-shot queue).

    ``down``: the connection is reset with no answer; ``slow``: the normal
    answer after ``ms``; ``http_500``: a 500 with a JSON error body.
    """

    kind: FaultKind
    ms: int = 0

    def to_json(self) -> dict[str, object]:
        """The control API's form: ``{"kind": ...}``, plus ``ms`` for ``slow``."""
        if self.kind == "slow":
            return {"kind": self.kind, "ms": self.ms}
        return {"kind": self.kind}


def fault_from_json(value: object) -> TokenFault | None:
    """``null`` or ``{"kind": "down" | "slow" | "http_500", "ms": N}``; ``ValueError`` if not."""
    if value is None:
        return None
    if not isinstance(value, dict) or "kind" not in value:
        raise ValueError('fault: must be null or {"kind": "down" | "slow" | "http_500"}')
    kind = value["kind"]
    if kind not in FAULT_KINDS:
        raise ValueError(f"fault.kind: must be one of {', '.join(FAULT_KINDS)}")
    allowed = {"kind", "ms"} if kind == "slow" else {"kind"}
    extra = sorted(set(value) - allowed)
    if extra:
        raise ValueError(f"fault.{extra[0]}: not a parameter of {kind}")
    if kind != "slow":
        return TokenFault(kind)
    ms = value.get("ms")
    if type(ms) is not int or not 0 <= ms <= MAX_FAULT_MS:
        raise ValueError(f"fault.ms: required for slow, an integer 0–{MAX_FAULT_MS}")
    return TokenFault(kind, ms)


class TokenKeeper:
    """The client the lab knows, the tokens it issued with their expiry, and what it answered."""

    def __init__(
        self, client_id: str, client_secret: str, expires_in: int, limit: int = TOKEN_LIMIT
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.expires_in = expires_in
        """Lifetime of the tokens issued from now on (those issued keep theirs)."""
        self.fault: TokenFault | None = None
        self._limit = limit
        self._tokens: OrderedDict[str, float] = OrderedDict()  # token → expiry, in issue order
        self.zero()

    def __repr__(self) -> str:
        return f"<TokenKeeper client_id={self.client_id!r} live={len(self._tokens)}>"

    def zero(self) -> None:
        """Zero the counts and forget the last parameters (tokens, credentials and fault stay)."""
        self.issued = 0
        self.refused = 0
        self.failed = 0
        self.last_params: dict[str, str] = {}

    def credentials_match(self, client_id: str | None, client_secret: str | None) -> bool:
        """Whether the pair is the client's; compared in constant time."""
        if client_id is None or client_secret is None:
            return False
        # Both compared whatever the first gives, so the time says nothing about either.
        id_ok = hmac.compare_digest(client_id.encode(), self.client_id.encode())
        secret_ok = hmac.compare_digest(client_secret.encode(), self.client_secret.encode())
        return id_ok and secret_ok

    def issue(self, now: float) -> str:
        """A fresh random token good for ``expires_in`` seconds from ``now``."""
        tokens = self._tokens
        # Issue order is expiry order unless expires_in changed; either way the
        # expired ones at the front go now, and the limit bounds the rest.
        while tokens:
            oldest = next(iter(tokens))
            if tokens[oldest] > now:
                break
            del tokens[oldest]
        token = secrets.token_urlsafe(32)
        tokens[token] = now + self.expires_in
        while len(tokens) > self._limit:
            tokens.popitem(last=False)
        self.issued += 1
        return token

    def valid(self, token: str, now: float) -> bool:
        """Whether ``token`` was issued here, not revoked, and has not expired at ``now``."""
        expiry = self._tokens.get(token)
        if expiry is None:
            return False
        if now >= expiry:
            del self._tokens[token]
            return False
        return True

    def live(self, now: float) -> int:
        """How many issued tokens are still good; the expired ones are dropped."""
        for token in [t for t, expiry in self._tokens.items() if expiry <= now]:
            del self._tokens[token]
        return len(self._tokens)

    def revoke_all(self) -> int:
        """Forget every token issued, so each is refused from now on; how many there were."""
        count = len(self._tokens)
        self._tokens.clear()
        return count

    def to_json(self, now: float) -> dict[str, object]:
        """The body of ``GET /oauth2``: never the secret, never a token."""
        return {
            "client_id": self.client_id,
            "expires_in": self.expires_in,
            "fault": None if self.fault is None else self.fault.to_json(),
            "fetches": {"issued": self.issued, "refused": self.refused, "failed": self.failed},
            "last_params": dict(self.last_params),
            "live_tokens": self.live(now),
        }
