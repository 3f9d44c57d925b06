"""QuoteFlow's exceptions, branched by what the caller does next.

    QuoteFlowError
    ├── Unauthenticated        API keys are on and the caller gave none, or a wrong
    │                          one: send a valid key (401)
    ├── CapacityExhausted      not admitted: the caller may try again later (503)
    ├── QuotaExceeded          the caller is over its rate: wait Retry-After (429)
    ├── SeatsExceeded          the caller has all its seats in use: wait for one (429)
    ├── BadRequestBody         the caller's body is not JSON: fix it (400)
    ├── SlowRequestBody        the body did not arrive in time: send it faster (408)
    ├── InvalidRequest         JSON, but not a valid quote request: fix it (422)
    └── InvalidSupplierData    a supplier answered 200 with a body that is not a
                               valid quote: never retried (``invalid_data``)

    ConfigError                a setting or file QuoteFlow cannot run with: one line,
                               exit 2 at start-up; on reload the old file is kept

Supplier trouble never leaves ``wire.py`` and ``supplier.py`` as an exception: there it becomes
an ordinary *result*, a failure code listed in the answer.
Anything else that escapes — ``RuntimeError``, ``TypeError``, ... — is a bug
in QuoteFlow and becomes a 500 at the HTTP edge, after every slot and task has
been given back.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


class QuoteFlowError(Exception):
    """Base of every error QuoteFlow raises on purpose."""


class Unauthenticated(QuoteFlowError):
    """The route needs a bearer API key and the request carried none that is valid."""

    def __init__(self, *, missing: bool) -> None:
        super().__init__("no bearer key" if missing else "the bearer key is not valid")
        self.missing = missing


class CapacityExhausted(QuoteFlowError):
    """Every inbound slot is taken; the request was refused without waiting."""


class QuotaExceeded(QuoteFlowError):
    """The caller has used its whole rate; it may succeed again in ``retry_after`` seconds."""

    def __init__(self, caller: str, retry_after: int) -> None:
        super().__init__(f"caller {caller!r} is over its rate")
        self.caller = caller
        self.retry_after = retry_after
        """Whole seconds, rounded up: never earlier than the caller may succeed."""


class SeatsExceeded(QuoteFlowError):
    """The caller already has as many requests in progress as its seats allow."""

    def __init__(self, caller: str, seats: int) -> None:
        super().__init__(f"caller {caller!r} has all {seats} of its seats in use")
        self.caller = caller
        self.seats = seats


class BadRequestBody(QuoteFlowError):
    """The inbound body could not be read as JSON."""


class SlowRequestBody(QuoteFlowError):
    """The inbound body did not arrive within its time limit."""


class InvalidSupplierData(QuoteFlowError):
    """A supplier's 200 answer is not a valid quote; retrying will not fix it."""


class ConfigError(Exception):
    """A flag, environment variable or file has a value QuoteFlow cannot run with.

    Its text is one line that names where the value came from and never quotes a secret.
    """


@attrs.frozen
class FieldError:
    """One problem with one field of an inbound request."""

    loc: tuple[str | int, ...]
    msg: str
    row: int | None = None
    """For a CSV cart: the physical line of the file the problem is on."""


class InvalidRequest(QuoteFlowError):
    """The request body is JSON but not a valid quote request."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        super().__init__(f"{len(errors)} invalid field(s)")
        self.errors = tuple(errors)
