"""The fleet's Redis client: one server named by ``--redis-url``, or the primary Sentinel names.

With ``--redis-sentinel`` the client asks the sentinels for the primary's
address whenever it opens a connection (redis-py's ``SentinelConnectionPool``),
so after a failover the next connection goes to the promoted replica. That
is all redis-py promises; the coordinator does not rely on it to learn that
the primary changed: the sync script compares the server it runs on with
the one the fleet last ran on (``sync.lua``'s ``server`` check), whatever
the client did or did not notice.

Neither client retries a failed call: the coordinator's next sync is the retry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quoteflow.config import Settings

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.sentinel import Sentinel


SENTINEL_CALLS = 2
"""Redis time limits one sentinel may take to answer where the primary is."""


def discovery_limit(settings: Settings) -> float:
    """The most asking the sentinels for the primary takes: each in turn, each at its limit."""
    sentinels = len(settings.redis_sentinel or ())
    return sentinels * SENTINEL_CALLS * settings.redis_timeout


def redis_client(settings: Settings, *, timeout: float) -> tuple[Redis, Sentinel | None]:
    """The client for the fleet's Redis, and the sentinels' own (closed with it), if any.

    ``timeout``: a backstop on every socket operation, connecting included; a
    sync's own deadline is shorter. Asking the sentinels is bounded by it too,
    each in turn.
    """
    from redis.asyncio import Redis
    from redis.asyncio.sentinel import Sentinel

    sockets = _sockets(timeout)
    if settings.redis_sentinel is None:
        assert settings.redis_url is not None
        return Redis.from_url(settings.redis_url, **sockets), None
    sentinels = Sentinel(settings.redis_sentinel, **_sentinel_kwargs(settings, sockets))
    return sentinels.master_for(_master(settings), **sockets), sentinels


def blocking_client(settings: Settings, *, timeout: float) -> Any:
    """A blocking client to the same server, for gunicorn's master (which has no event loop)."""
    from redis import Redis
    from redis.sentinel import Sentinel

    sockets = _sockets(timeout, blocking=True)
    if settings.redis_sentinel is None:
        assert settings.redis_url is not None
        return Redis.from_url(settings.redis_url, **sockets)
    sentinels = Sentinel(settings.redis_sentinel, **_sentinel_kwargs(settings, sockets))
    return sentinels.master_for(_master(settings), **sockets)


def _sockets(timeout: float, *, blocking: bool = False) -> dict[str, Any]:
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import NoBackoff
    from redis.retry import Retry as BlockingRetry

    # A failed call is not retried by the client: the next sync is the retry.
    Retry = BlockingRetry if blocking else AsyncRetry
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }


def _master(settings: Settings) -> str:
    assert settings.redis_master is not None
    return settings.redis_master


def _sentinel_kwargs(settings: Settings, sockets: dict[str, Any]) -> dict[str, Any]:
    """``Sentinel``'s keywords: how to reach the sentinels, and what ``--redis-url`` lends.

    The URL lends the primary's db, credentials and TLS; its address is the sentinels' to give.
    """
    from redis.connection import parse_url

    lent: dict[str, Any] = {}
    if settings.redis_url is not None:
        lent = dict(parse_url(settings.redis_url))  # type: ignore[no-untyped-call]
        lent.pop("host", None)
        lent.pop("port", None)
        if lent.pop("connection_class", None) is not None:  # rediss://: the only class it sets
            lent["ssl"] = True
    # Each sentinel gets two Redis time limits, not the client's backstop: one
    # on a dead host would otherwise use up every sync's time limit before the
    # next was asked, and the fleet never find the new primary.
    own = {**sockets, "socket_timeout": SENTINEL_CALLS * settings.redis_timeout}
    own["socket_connect_timeout"] = own["socket_timeout"]
    if settings.redis_sentinel_password is not None:
        own["password"] = settings.redis_sentinel_password
    return {"sentinel_kwargs": own, **lent}
