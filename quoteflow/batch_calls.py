"""A batch supplier's call: many lines of a cart in one request (``[supplier.batch]``).

The call is rendered from the supplier's templates (``batching.py``) and sent
through the same attempt loop as any call (``supplier.SupplierClient._ask``):
the same slots, rate, token, retry and deadline. Its answer is read line by
line (``wire.py``): a bad entry fails its own line alone. A call that failed
as a whole is that failure for every one of its lines.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import aiohttp
import attrs

from quoteflow.calls import AttemptResult, Call, SupplierState
from quoteflow.catalogue import Supplier
from quoteflow.logs import log_event
from quoteflow.models import (
    CartLine,
    Failure,
    MovingDeadline,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)

log = logging.getLogger("quoteflow")

Ask = Callable[[SupplierState, Call, SupplierTrace], Awaitable[AttemptResult]]
"""The attempt loop a call is sent through."""


def chunks(spec: Supplier, lines: tuple[CartLine, ...]) -> list[tuple[CartLine, ...]]:
    """A cart's ``lines`` as the calls a batch supplier is asked in; empty for any other."""
    batch = spec.batch
    if batch is None:
        return []
    burst = spec.rate.quota if batch.rate_unit == "item" and spec.rate is not None else None
    return batch.chunks(lines, burst)  # type: ignore[return-value]  # CartLines in, out


async def ask_batch(
    ask: Ask,
    state: SupplierState,
    trace: SupplierTrace,
    lines: tuple[CartLine, ...],
    request: QuoteRequest,
    request_id: str,
    deadline: float | MovingDeadline,
) -> dict[str, SupplierQuote | Failure]:
    """Ask ``state``'s supplier for ``lines`` in one call: an outcome for every line's SKU."""
    batch, shape = state.spec.batch, state.shape
    assert batch is not None
    assert shape is not None
    shaped, body = batch.render(shape, lines, request.scenario, request_id)
    if body is not None:
        payload = aiohttp.BytesPayload(body, content_type=shape.content_type)
        shaped = attrs.evolve(shaped, body=payload)
    call = Call(shaped.url, request, request_id, deadline, state.attempt_time, shaped, lines=lines)
    result = await ask(state, call, trace)
    if result.lines is not None:
        return result.lines
    if result.status == 413 and not state.told_too_large:
        state.told_too_large = True
        log_event(
            log,
            logging.WARNING,
            "batch_too_large",
            {"supplier": state.spec.name, "items": len(lines), "max_items": batch.max_items},
        )
    failure = Failure(trace.supplier, result.code)
    return dict.fromkeys((line.sku for line in lines), failure)
