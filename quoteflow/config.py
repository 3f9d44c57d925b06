"""Settings and limits: one frozen object, built once by the CLI or a test."""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs
from attrs import validators as v
from yarl import URL

from quoteflow.auth import ApiKeys
from quoteflow.callers import Callers
from quoteflow.money import DEFAULT_CURRENCY, minor_unit

DEFAULT_CART_SLOTS = 2
"""Carts' part of the outbound slots beside single quotes unless ``--cart-slots`` says."""

SCENARIOS: tuple[str, ...] = ("normal", "slow", "broken", "malformed", "flaky")
"""Lab scenarios a caller may forward to the suppliers."""


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    # A duration: finite, above 0 and at most an hour (inf or 1e308 would
    # overflow every deadline computed from it).
    if not 0 < value <= 3600:
        raise ValueError(f"{attribute.name} must be more than 0 and at most 3600 s, got {value!r}")


_PREFIX = re.compile(r"[!-~]{1,100}")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) masked, fit for a log line or an error."""
    try:
        parsed = URL(url)
    except ValueError:
        return "<unparsable URL>"
    if parsed.password is None:
        return url
    return str(parsed.with_password("***"))


def _lower(value: str) -> str:
    return value.lower()


def _addresses(value: Iterable[tuple[str, int]] | None) -> tuple[tuple[str, int], ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen(kw_only=True)
class Settings:
    """Everything one QuoteFlow process needs to know; defaults are the contract's."""

    host: str = "127.0.0.1"
    port: int = attrs.field(default=9100, validator=[v.ge(0), v.le(65535)])
    provider_url: str = attrs.field(default="http://127.0.0.1:9101")
    budget: float = attrs.field(default=0.8, validator=_positive)
    """Seconds from admission to the answer, whatever the suppliers do."""
    answer_reserve: float = attrs.field(default=0.005, validator=v.ge(0))
    """Seconds of the budget kept for ranking, encoding and sending the answer."""
    inbound_limit: int = attrs.field(default=8, validator=v.ge(1))
    """Inbound requests served at once; the next one gets 503 at once."""
    cart_budget: float = attrs.field(default=2.0, validator=_positive)
    """Seconds from a cart's admission to its answer: slot waits, calls, retries, the basket."""
    cart_limit: int = attrs.field(default=2, validator=v.ge(1))
    """Carts served at once; the next one gets 503 at once. A cart never takes a single
    quote's inbound seat."""
    max_cart_lines: int = attrs.field(default=200, validator=[v.ge(1), v.le(10_000)])
    """Most lines one cart may have; its body may be 1 KiB + 1 KiB per line."""
    outbound_limit: int = attrs.field(default=6, validator=v.ge(1))
    """Supplier HTTP attempts in flight at once, shared by every request."""
    cart_slots: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Outbound slots all carts of a process hold at most while single quotes are present
    (``slots.CartPart``); below it a cart's call goes first. ``None`` (the default): 2, or
    one below ``outbound_limit`` when that is less (no part at all for a limit of 1). Given,
    it must be below ``outbound_limit``: single quotes always keep a slot."""
    supplier_share: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Outbound slots one supplier may hold at once: a hanging one cannot starve the rest.

    ``None`` (the default): all but one slot for each other supplier of the
    catalogue, at least 1 (4 of 6 for the three lab suppliers): a slow but
    healthy supplier still gets most of the capacity, and a hanging one always
    leaves slots for the others. A catalogue entry's own ``share`` wins.
    """
    suppliers_file: str | None = attrs.field(default=None)
    """The supplier catalogue, a TOML file (``catalogue.py``); ``None``: the three lab
    suppliers under ``provider_url``."""
    attempts: int = attrs.field(default=2, validator=[v.ge(1), v.le(2)])
    hedge: bool = False
    """Hedge every supplier whose catalogue entry has no ``hedge`` key of its own: a first
    attempt late past a percentile of its answer times is joined by the second."""
    hedge_earn: float = attrs.field(default=0.2, validator=[v.gt(0), v.le(1)])
    """Hedge tokens a supplier earns per successful attempt, unless its ``hedge`` table says."""
    hedge_burst: int = attrs.field(default=10, validator=[v.ge(1), v.le(1000)])
    """Hedge tokens a supplier may save up (full at start), unless its ``hedge`` table says."""
    backoff_min: float = attrs.field(default=0.020, validator=v.ge(0))
    backoff_max: float = attrs.field(default=0.030, validator=v.ge(0))
    min_attempt_time: float = attrs.field(default=0.05, validator=v.ge(0))
    """Least budget a second attempt must have left (after its backoff) to be started."""
    retry_after_cap: float = attrs.field(default=0.5, validator=v.ge(0))
    pause_max: float = attrs.field(default=60.0, validator=_positive)
    """Longest a supplier's 429 ``Retry-After`` pauses it for (``pauses.py``)."""
    """Longest ``Retry-After`` a 503 may ask for and still be retried."""
    retry_budget_capacity: float = attrs.field(default=20.0, validator=v.ge(1))
    """Retries a supplier may spend in a burst before they must pay off."""
    retry_budget_earn: float = attrs.field(default=0.1, validator=[v.ge(0), v.le(1)])
    """Share of a retry every request earns: the retry rate of a supplier that is down."""
    connect_timeout: float = attrs.field(default=0.25, validator=_positive)
    """Socket connect timeout of one attempt; firing is a transient transport error."""
    read_timeout: float = attrs.field(default=1.0, validator=_positive)
    """Longest silence while reading one answer; firing is a transient transport error.

    Longer than the default budget on purpose: with the defaults a hanging
    supplier is the request deadline's business (``timeout``, one request),
    and a second attempt at a supplier that just stalled for most of the
    budget would only add load. With a longer ``budget`` it catches stalls.
    """
    breaker_failures: int = attrs.field(default=5, validator=[v.ge(0), v.le(1000)])
    """Failures in a row that open a supplier's circuit; 0 turns the breaker off."""
    breaker_open: float = attrs.field(default=1.0, validator=_positive)
    """Seconds a circuit first stays open before one request probes the supplier."""
    breaker_open_max: float = attrs.field(default=10.0, validator=_positive)
    """Cap on the open time, which doubles with every failed probe."""
    log_level: str = attrs.field(
        default="info",
        converter=_lower,
        validator=v.in_(("debug", "info", "warning", "error")),
    )
    log_format: str = attrs.field(default="json", validator=v.in_(("json", "text")))
    event_loop: str = attrs.field(default="auto", validator=v.in_(("auto", "asyncio", "uvloop")))
    """``auto`` runs on uvloop when it is installed, else on asyncio's own loop."""
    shutdown_drain: float = attrs.field(default=0.5, validator=[v.ge(0), v.le(60)])
    """Seconds between a stop signal and closing the listener, with ``/ready`` at 503."""
    body_timeout: float = attrs.field(default=1.0, validator=_positive)
    """Seconds an inbound body may take to arrive before the answer is 408."""
    header_timeout: float = attrs.field(default=5.0, validator=_positive)
    """Seconds a request head (request line and headers) may take to arrive once it began."""
    idle_timeout: float = attrs.field(default=15.0, validator=_positive)
    """Seconds a connection with no request in progress stays open."""
    max_connections: int = attrs.field(default=1024, validator=[v.ge(1), v.le(1_000_000)])
    """Open inbound connections per process; at the cap the longest-idle one makes room."""
    max_request_bytes: int = attrs.field(default=16 * 1024, validator=v.ge(1))
    max_supplier_body_bytes: int = attrs.field(default=64 * 1024, validator=v.ge(1))
    """Cap on a supplier's decoded body; anything longer is ``invalid_data``."""
    api_keys: ApiKeys | None = attrs.field(
        default=None, validator=v.optional(v.instance_of(ApiKeys))
    )
    """Bearer keys that open ``/api/`` routes; ``None`` (the default): no key needed."""
    callers: Callers | None = attrs.field(
        default=None, validator=v.optional(v.instance_of(Callers))
    )
    """Named callers with their keys, rates and seats (``--callers``); not with ``api_keys``."""
    metrics_require_key: bool = attrs.field(default=False, validator=v.instance_of(bool))
    """Ask ``/metrics`` callers for one of ``api_keys`` too."""
    redis_url: str | None = attrs.field(default=None)
    """Fleet mode: the Redis that holds the outbound limit, shares and retry budgets of
    every worker (``redis://host:port/db``); ``None`` (the default): one process, in memory."""
    redis_timeout: float = attrs.field(default=0.05, validator=_positive)
    """Time limit of every Redis call, seconds; past it the worker keeps to its safe share."""
    redis_prefix: str = attrs.field(default="quoteflow")
    """Prefix of QuoteFlow's Redis keys, so several fleets can share one Redis."""
    redis_sentinel: tuple[tuple[str, int], ...] | None = attrs.field(
        default=None, converter=_addresses
    )
    """Fleet mode through Redis Sentinel: the sentinels' addresses; the primary is theirs to
    name, and a failover is followed. Needs ``redis_master``; ``redis_url``, if given, only
    lends its db, credentials and TLS."""
    redis_master: str | None = attrs.field(default=None)
    """The primary's name the sentinels know (their ``sentinel monitor <name> ...``)."""
    redis_sentinel_password: str | None = attrs.field(default=None, repr=False)
    """The sentinels' own password (``requirepass`` in sentinel.conf), if they have one."""
    redis_outage_grace: float = attrs.field(default=60.0, validator=[v.ge(0), v.le(3600)])
    """Seconds the workers still on Redis hold back what a worker they stopped hearing from
    may still be sending (the larger of its last holdings and its safe share)."""
    coalesce: bool = attrs.field(default=False, validator=v.instance_of(bool))
    """Share a supplier call in flight with every request that would send the same one."""
    cache_size: int = attrs.field(default=0, validator=[v.ge(0), v.le(10_000_000)])
    """Quotes the cache holds at most (least recently used out first); 0 turns it off."""
    cache_max_age: float = attrs.field(default=30.0, validator=_positive)
    """Cap on a supplier's ``max-age`` and ``stale-if-error``, seconds."""
    console: bool = attrs.field(default=False, validator=v.instance_of(bool))
    """Serve the console page (``GET /console``): ask, burst and see each bill drawn."""
    console_lab: str | None = attrs.field(default=None)
    """A provider lab the console may switch faults and latency of (``/api/console/lab/``);
    ``None`` (the default): no such routes. Only ever the lab: a real supplier has no
    control API, and these routes forward nothing else."""
    currency: str = attrs.field(default=DEFAULT_CURRENCY)
    """The answers' currency unless a request names one, and every supplier's unless its
    catalogue entry or its quote says otherwise: ISO 4217 with a minor unit."""
    fx_rates: str | None = attrs.field(default=None)
    """ECB ``eurofxref-daily.xml`` rates: a file, or an ``http(s)`` URL refreshed in the
    background (``fx.py``). None: quotes in another currency than the answer's are ``no_rate``."""
    fx_refresh: float = attrs.field(default=3600.0, validator=[v.ge(1), v.le(7 * 86400)])
    """Seconds between two fetches of a rates URL."""
    fx_max_age: float = attrs.field(default=6 * 86400.0, validator=[v.gt(0), v.le(366 * 86400)])
    """Seconds after its publication (its date at 16:00 CET) a rates table is still used."""

    @provider_url.validator
    def _check_provider_url(self, attribute: attrs.Attribute[str], value: str) -> None:
        problem = f"provider_url must be an http(s) URL with a host, got {value!r}"
        try:
            url = URL(value)
            url.port  # noqa: B018 -- parsing the port is the check
        except ValueError:
            raise ValueError(problem) from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(problem)

    @currency.validator
    def _check_currency(self, attribute: attrs.Attribute[str], value: str) -> None:
        if minor_unit(value) is None:
            raise ValueError(
                f"currency must be an ISO 4217 code with a minor unit, e.g. USD; got {value!r}"
            )

    @fx_rates.validator
    def _check_fx_rates(self, attribute: attrs.Attribute[str | None], value: str | None) -> None:
        if value is not None and not value.strip():
            raise ValueError("fx_rates must name a file or an http(s) URL")

    @console_lab.validator
    def _check_console_lab(self, attribute: attrs.Attribute[str | None], value: str | None) -> None:
        if value is None:
            return
        if not self.console:
            raise ValueError("console_lab needs the console (--console)")
        problem = f"console_lab must be an http(s) URL with a host, got {redact_url(value)!r}"
        try:
            url = URL(value)
            url.port  # noqa: B018 -- parsing the port is the check
        except ValueError:
            raise ValueError(problem) from None
        if url.scheme not in ("http", "https") or not url.host or url.query_string:
            raise ValueError(problem)

    @suppliers_file.validator
    def _check_suppliers_file(
        self, attribute: attrs.Attribute[str | None], value: str | None
    ) -> None:
        if value is not None and not value:
            raise ValueError("suppliers_file must be a path, got an empty string")

    @redis_url.validator
    def _check_redis_url(self, attribute: attrs.Attribute[str | None], value: str | None) -> None:
        if value is None:
            return
        problem = (
            f"redis_url must be a redis://, rediss:// or unix:// URL, got {redact_url(value)!r}"
        )
        try:
            url = URL(value)
            url.port  # noqa: B018 -- parsing the port is the check
        except ValueError:
            raise ValueError(problem) from None
        if url.scheme in ("redis", "rediss"):
            if not url.host:
                raise ValueError(problem)
        elif url.scheme != "unix" or not url.path:
            raise ValueError(problem)

    @redis_sentinel.validator
    def _check_redis_sentinel(
        self, attribute: attrs.Attribute[object], value: tuple[tuple[str, int], ...] | None
    ) -> None:
        if (value is None) != (self.redis_master is None):
            raise ValueError(
                "--redis-sentinel and --redis-master go together: the sentinels' addresses "
                "and the name of the primary they watch"
            )
        if value is not None and not value:
            raise ValueError("redis_sentinel must name at least one HOST:PORT")
        if value is not None and self.redis_url is not None and self.redis_url.startswith("unix:"):
            raise ValueError(
                "with --redis-sentinel, --redis-url lends only the primary's db, credentials "
                "and TLS: a redis:// or rediss:// URL, not unix://"
            )

    @redis_master.validator
    def _check_redis_master(
        self, attribute: attrs.Attribute[str | None], value: str | None
    ) -> None:
        if value is not None and not _PREFIX.fullmatch(value):
            raise ValueError(
                f"redis_master must be 1-100 printable characters without spaces, got {value!r}"
            )

    @property
    def fleet(self) -> bool:
        """Fleet mode: a Redis (or the sentinels that name one) holds the fleet's limits."""
        return self.redis_url is not None or self.redis_sentinel is not None

    @redis_timeout.validator
    def _check_redis_timeout(self, attribute: attrs.Attribute[float], value: float) -> None:
        # A Redis call must be able to fail and leave time for the request to go
        # on with local limits: it can never use up a whole budget.
        if value >= self.budget:
            raise ValueError(
                f"redis_timeout must be below the budget ({self.budget} s), got {value!r}"
            )

    @redis_prefix.validator
    def _check_redis_prefix(self, attribute: attrs.Attribute[str], value: str) -> None:
        if not _PREFIX.fullmatch(value):
            raise ValueError(
                f"redis_prefix must be 1-100 printable characters without spaces, got {value!r}"
            )

    @callers.validator
    def _check_callers(self, attribute: attrs.Attribute[Callers | None], value: object) -> None:
        if value is not None and self.api_keys is not None:
            raise ValueError("--callers and --api-keys-file cannot both be given: choose one")

    @metrics_require_key.validator
    def _check_metrics_key(self, attribute: attrs.Attribute[bool], value: bool) -> None:
        if value and self.api_keys is None and self.callers is None:
            raise ValueError("metrics_require_key needs API keys (--api-keys-file or --callers)")

    @answer_reserve.validator
    def _check_reserve(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value >= self.budget:
            raise ValueError(f"budget must be more than {value} s (the answer's reserve)")

    @breaker_open_max.validator
    def _check_breaker_open_max(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value < self.breaker_open:
            raise ValueError("breaker_open_max must not be below breaker_open")

    @idle_timeout.validator
    def _check_idle_timeout(self, attribute: attrs.Attribute[float], value: float) -> None:
        # A head that began on an idle connection gets the whole header timeout.
        if value < self.header_timeout:
            raise ValueError(
                f"header_timeout ({self.header_timeout} s) must not be above"
                f" idle_timeout ({value} s)"
            )

    @cart_slots.validator
    def _check_cart_slots(self, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None and value >= self.outbound_limit:
            raise ValueError(
                f"cart_slots ({value}) must be below outbound_limit ({self.outbound_limit}):"
                " single quotes keep at least one slot"
            )

    @property
    def carts_part(self) -> int:
        """Slots carts hold at most beside single quotes: ``cart_slots`` or its default."""
        if self.cart_slots is not None:
            return self.cart_slots
        return min(DEFAULT_CART_SLOTS, self.outbound_limit - 1)

    @backoff_max.validator
    def _check_backoff(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value < self.backoff_min:
            raise ValueError("backoff_max must not be below backoff_min")
