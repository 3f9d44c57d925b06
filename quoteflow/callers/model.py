"""Who may call: ``Caller`` (a name, a rate, seats) and ``Callers``, found by key alone.

A ``Caller`` holds no key. The keys live in ``Callers`` only, as SHA-256
digests, and a presented key is compared with every digest in constant time
(``hmac.compare_digest``, no early exit), so neither timing nor anything the
caller sends besides its key tells which caller it is.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator

import attrs
from attrs import validators as v

from quoteflow.auth import presented_digest

UNNAMED = "-"
"""The name every key of ``--api-keys-file`` shares: callers without a name, rate or seats."""


@attrs.frozen
class Rate:
    """At most ``quota`` admitted requests per ``window`` seconds (smoothed: see ``meter``)."""

    quota: int = attrs.field(validator=[v.instance_of(int), v.ge(1), v.le(1_000_000)])
    window: int = attrs.field(validator=[v.instance_of(int), v.ge(1), v.le(86_400)])
    """Whole seconds, as the RateLimit-Policy field's ``w`` must be."""

    @property
    def interval(self) -> float:
        """Seconds for one used request to drain back: ``window / quota``."""
        return self.window / self.quota

    def __str__(self) -> str:
        return f"{self.quota}/{self.window}s"


@attrs.frozen
class Caller:
    """One named caller: the limits of its key, never the key itself."""

    name: str
    rate: Rate | None = None
    """``None``: no quota."""
    seats: int | None = None
    """Requests of this caller one process serves at once; ``None``: any of its inbound seats."""


class Callers:
    """Every caller of one file (or of ``--api-keys-file``), each found by its key's digest.

    A plain class, not attrs: ``attrs.asdict(settings)`` (the ``starting``
    event) must show the names, never recurse into the digests.
    """

    __slots__ = ("_callers", "_digests", "source")

    def __init__(self, entries: Iterable[tuple[bytes, Caller]], source: str | None = None) -> None:
        pairs = tuple(entries)
        if not pairs:
            raise ValueError("no caller given")
        self._digests = tuple(digest for digest, _ in pairs)
        self._callers = tuple(caller for _, caller in pairs)
        self.source = source
        """The file the callers came from (re-read on reload); ``None`` for API keys."""

    @classmethod
    def unnamed(cls, digests: Iterable[bytes]) -> Callers:
        """Each key of ``--api-keys-file`` as a caller named ``-``, with no rate or seats."""
        caller = Caller(UNNAMED)
        return cls((digest, caller) for digest in digests)

    @property
    def names(self) -> tuple[str, ...]:
        """Every caller's name, in file order."""
        return tuple(caller.name for caller in self._callers)

    def __len__(self) -> int:
        return len(self._callers)

    def __iter__(self) -> Iterator[Caller]:
        return iter(self._callers)

    def __repr__(self) -> str:
        named = sorted({name for name in self.names if name != UNNAMED})
        if not named:
            return f"Callers({len(self)} unnamed)"
        return f"Callers({', '.join(named)})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Callers)
            and self._digests == other._digests
            and self._callers == other._callers
        )

    def __hash__(self) -> int:
        return hash((self._digests, self._callers))

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller whose key an ``Authorization`` value carries, or ``None``."""
        presented, well_formed = presented_digest(authorization)
        found = -1
        for index, digest in enumerate(self._digests):
            # Every digest is compared, whichever matches (no early exit); the
            # select below costs the same either way.
            match = hmac.compare_digest(presented, digest)
            found = index if match else found
        if found < 0 or not well_formed:
            return None
        return self._callers[found]
