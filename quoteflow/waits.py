"""What an attempt may wait for before it is sent, besides its slot: a turn, a token.

Both waits hold no outbound slot, both run under the request's deadline (whose
cancellation ends them), and both go on the call's bill (``rate_wait_ms``,
``token_wait_ms``), also when the deadline cut them.
"""

from __future__ import annotations

import asyncio
import time

from quoteflow.callers import Rate
from quoteflow.calls import Call
from quoteflow.models import STOPPED_NO_TOKEN, SupplierTrace
from quoteflow.rates import Turns
from quoteflow.tokens import TokenKeeper, TokenUnavailable


async def turn(turns: Turns, slack: float, call: Call, trace: SupplierTrace, rate: Rate) -> bool:
    """A turn of the supplier's outbound rate, waited for while the attempt could finish.

    The wait ends as soon as the supplier's learned attempt time (and
    ``slack``: in the fleet, a sync's, to lease a slot) would no longer fit
    before the deadline.
    """
    needed = call.needed
    since = time.monotonic()
    try:
        admitted, waited = await turns.take(
            trace.supplier,
            rate,
            call.deadline,
            (lambda now: needed(now) + slack) if slack else needed,
        )
    except asyncio.CancelledError:
        # Cut in the line (the deadline, or the caller gone): the bill still
        # shows the wait, or a call that sent nothing would look as if it
        # never stood in the rate's line at all.
        trace.rate_wait = (trace.rate_wait or 0.0) + time.monotonic() - since
        raise
    if waited is not None:
        trace.rate_wait = (trace.rate_wait or 0.0) + waited
    return admitted


async def token(tokens: TokenKeeper, trace: SupplierTrace) -> str | None:
    """Wait for the one token fetch under way; ``None`` if it brings no token."""
    since = time.monotonic()
    try:
        return await tokens.wait()
    except TokenUnavailable:
        return None
    except asyncio.CancelledError:
        # The deadline came first: ``auth_failed``, not ``timeout`` (``service.py``).
        trace.stopped = STOPPED_NO_TOKEN
        raise
    finally:
        trace.token_wait = (trace.token_wait or 0.0) + time.monotonic() - since
