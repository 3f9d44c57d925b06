"""QuoteFlow's exceptions, branched by what the caller does next.

    QuoteFlowError
    ├── Unauthenticated        API keys are on and the caller gave none, or a wrong
    │                          one: send a valid key (401)
    ├── CapacityExhausted      not admitted: the caller may try again later (503)
    ├── BadRequestBody         the caller's body is not JSON: fix it (400)
    ├── SlowRequestBody        the body did not arrive in time: send it faster (408)
    ├── InvalidRequest         JSON, but not a valid quote request: fix it (422)
    └── InvalidSupplierData    a supplier answered 200 with a body that is not a
                               valid quote: never retried (``invalid_data``)

Supplier trouble never leaves ``supplier.py`` as an exception: there it becomes
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


class BadRequestBody(QuoteFlowError):
    """The inbound body could not be read as JSON."""


class SlowRequestBody(QuoteFlowError):
    """The inbound body did not arrive within its time limit."""


class InvalidSupplierData(QuoteFlowError):
    """A supplier's 200 answer is not a valid quote; retrying will not fix it."""


@attrs.frozen
class FieldError:
    """One problem with one field of an inbound request."""

    loc: tuple[str | int, ...]
    msg: str


class InvalidRequest(QuoteFlowError):
    """The request body is JSON but not a valid quote request."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        super().__init__(f"{len(errors)} invalid field(s)")
        self.errors = tuple(errors)
