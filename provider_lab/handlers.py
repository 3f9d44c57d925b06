"""The suppliers themselves: the decision pipeline every dialect shares, and the classic one.

Order of decisions for one request: the dialect reads it (``/quotes/{supplier}``
here; :mod:`provider_lab.dialects` for the others): unknown supplier (404), a
request it cannot read (400) → count it → the dialect's credentials (bearer
token, API key; none for the classic dialect; the batch dialect's parts limit,
413) → the supplier's contract, if it has one (:mod:`provider_lab.contracts`:
503 past its concurrency, 429 past its rate) → the lab-wide latency → the
supplier's next fault, if any → the scenario (boreal only) → the catalogue
(404 for an unknown SKU; a batch call's unknown part is an entry of its
answer) → the quote, written in the dialect's shape. The supplier's
``Cache-Control``, if one is set, goes on whatever answer that is.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import attrs
from aiohttp import web

from provider_lab import answers
from provider_lab.answers import Call
from provider_lab.faults import BatchKind, Fault, Kind, draw_latency_ms
from provider_lab.state import SCENARIOS, STATE

logger = logging.getLogger(__name__)

DATA_KINDS = frozenset(
    {
        Kind.NOT_JSON,
        Kind.WRONG_TYPES,
        Kind.NEGATIVE,
        Kind.EXTRA_KEY,
        Kind.MISSING_KEY,
        Kind.DUPLICATE_KEY,
        Kind.WRONG_SUPPLIER,
        Kind.WRONG_SKU,
        Kind.WRONG_CONTENT_TYPE,
    }
)
STATUS_KINDS = frozenset(
    {Kind.HTTP_404, Kind.HTTP_429, Kind.HTTP_500, Kind.HTTP_503, Kind.HTTP_STATUS}
)


def deadline(header: str | None) -> float | None:
    """The loop time at which the caller gives up, from ``X-Deadline-Remaining-Ms``."""
    if header is None:
        return None
    try:
        remaining_ms = float(header)
    except ValueError:
        return None
    if not math.isfinite(remaining_ms):
        return None
    return asyncio.get_running_loop().time() + remaining_ms / 1000


Refusal = tuple[str, web.Response]
"""What ``/stats`` counts a refused request as, and the answer that refuses it."""

Gate = Callable[[Call], Refusal | None]
"""A dialect's authentication check: ``None`` lets the request through."""


async def quote(request: web.Request) -> web.StreamResponse:
    """``GET /quotes/{supplier}?sku=&scenario=``: the classic dialect, with no credentials."""
    supplier = request.match_info["supplier"]
    state = request.app[STATE]
    if supplier not in state.suppliers:
        return answers.json_response(404, {"error": "unknown_supplier", "supplier": supplier})
    scenario = request.query.get("scenario", "normal")
    if scenario not in SCENARIOS:
        return answers.json_response(
            400, {"error": "unknown_scenario", "scenario": scenario, "allowed": list(SCENARIOS)}
        )
    sku = request.query.get("sku")
    if sku is None:
        return answers.json_response(400, {"error": "missing_sku"})
    headers = request.headers
    call = Call(
        request=request,
        state=state,
        supplier=supplier,
        sku=sku,
        scenario=scenario,
        request_id=headers.get("X-Request-ID"),
        deadline=deadline(headers.get("X-Deadline-Remaining-Ms")),
    )
    return await serve(call)


async def serve(call: Call, gate: Gate | None = None) -> web.StreamResponse:
    """Answer one supplier request read by any dialect: the pipeline every dialect shares.

    Count it in ``/stats`` → ``gate`` (a dialect's credentials) → the supplier's
    contract → the latency → the supplier's next fault → the scenario → the
    catalogue → the quote, written by ``call``'s dialect. The supplier's
    ``Cache-Control`` goes on whatever answer that is.
    """
    state = call.state
    headers = call.request.headers
    state.stats.started(
        call.supplier,
        call.request_id,
        headers.get("X-Attempt"),
        headers.get("X-Deadline-Remaining-Ms"),
        headers.get("traceparent"),
        call.batch_size(),
    )
    line = state.contracts.lines[call.supplier]
    entered = False
    label = _Label()
    try:
        refused = None if gate is None else gate(call)
        if refused is None:
            if line.contract is None:
                # The benchmark's hot path: no contract, only the supplier's in-flight count.
                line.in_flight += 1
                if line.in_flight > line.max_in_flight:
                    line.max_in_flight = line.in_flight
            else:
                refused = line.enter(asyncio.get_running_loop().time())
            entered = refused is None
        what, response = await _decide(call, label) if refused is None else refused
        label.what = what
        cache_control = state.cache_control.get(call.supplier)
        # On every answer not already sent (a truncated body is): a cache must
        # also see the header on the answers it must never store, such as a 503.
        if cache_control is not None and not response.prepared:
            response.headers["Cache-Control"] = cache_control
        return response
    finally:
        # Recorded even when aiohttp cancels the handler because the client left.
        if entered:
            line.in_flight -= 1
        state.stats.answered(call.supplier, label.what)
        state.stats.finished()
        logger.debug(
            "answered supplier=%s sku=%r scenario=%s request_id=%s what=%s",
            call.supplier,
            call.sku,
            call.scenario,
            call.request_id,
            label.what,
        )


@attrs.define
class _Label:
    """How the current request is being answered, for ``/stats``'s ``answers``."""

    what: str = "client_gone"  # until something else is decided


async def _decide(call: Call, label: _Label) -> tuple[str, web.StreamResponse]:
    state = call.state
    fault = state.faults.take(call.supplier)
    if fault is not None and isinstance(fault.kind, BatchKind) and call.batch_size() is None:
        fault = None  # a batch dialect's fault, used up by a call of another: none for it
    if state.latency_ms:
        waited = await answers.wait(call, state.latency_ms / 1000)
        if waited != "done":
            return _stopped(call, waited)
    if fault is not None:
        label.what = str(fault.kind)  # kept if the client leaves while it is served
        return label.what, await _faulty(call, fault)
    if call.scenario != "normal" and call.supplier in state.scenario_suppliers:
        scenario = await _scenario(call)
        if scenario is not None:
            return scenario
    quote = call.quote()
    if quote is None:
        return "unknown_sku", call.unknown_sku()
    return "ok", quote.ok()


def _stopped(call: Call, waited: answers.Waited) -> tuple[str, web.StreamResponse]:
    if waited == "gone":
        return "client_gone", answers.gone()
    return "deadline_passed", answers.deadline_passed(call)


async def _scenario(call: Call) -> tuple[str, web.StreamResponse] | None:
    """Boreal's behaviour under a lesson scenario, or ``None`` to answer normally."""
    label = f"scenario_{call.scenario}"
    match call.scenario:
        case "slow":
            waited = await answers.wait(call, call.state.config.slow_ms / 1000)
            if waited != "done":
                return _stopped(call, waited)
        case "broken":
            return label, answers.json_response(503, {"error": "scenario_broken"})
        case "flaky":
            # No X-Request-ID means every request is a first sight: always 503.
            # Keyed per supplier too: with several playing, each fails its first sight.
            # A batch call's first sight is also keyed by its first part (each chunk of a cart).
            if call.request_id is None or call.state.flaky_seen.add(call.first_sight()):
                return label, answers.json_response(503, {"error": "scenario_flaky"})
        case "malformed":
            quote = call.quote()
            if quote is None:
                return "unknown_sku", call.unknown_sku()
            return label, web.Response(body=quote.malformed(), content_type=answers.JSON)
    return None


def _latency_s(call: Call, fault: Fault) -> float:
    """How long the ``latency`` fault holds this request back, in seconds.

    ``ms`` exactly without ``sigma`` (or with 0); otherwise a draw of its own from the
    supplier's stream for every request that reaches the fault — a retry or a hedge with
    the same ``X-Request-ID`` included — recorded in ``/stats``.
    """
    ms = fault.int_param("ms")
    sigma = fault.optional_float_param("sigma")
    if not sigma:
        return ms / 1000
    drawn = draw_latency_ms(ms, sigma, call.state.latency_random(call.supplier))
    call.state.stats.latency_drawn(call.supplier, call.request_id, drawn)
    return drawn / 1000


async def _faulty(call: Call, fault: Fault) -> web.StreamResponse:
    """Produce ``fault`` for this request, on the real connection."""
    kind = fault.kind
    # Latency and blips touch every request while they are on: at info level a
    # benchmark would write a line per request. A blip that fires says so below.
    logger.log(
        logging.DEBUG if kind in (Kind.LATENCY, Kind.BLIP) else logging.INFO,
        "fault_served supplier=%s kind=%s request_id=%s",
        call.supplier,
        kind,
        call.request_id,
    )
    if kind in STATUS_KINDS:
        return answers.http_error(call, fault)
    if kind is Kind.CLOSE:
        return answers.close(call)
    if kind is Kind.NOT_HTTP:
        return answers.not_http(call)
    if kind is Kind.RESET and fault.str_param("variant") == "before":
        answers.reset_connection(call.request)
        return answers.gone()
    if kind is Kind.HANG:
        return _stopped(call, await answers.wait(call, math.inf))[1]
    if kind is Kind.LATENCY:
        waited = await answers.wait(call, _latency_s(call, fault))
        if waited != "done":
            return _stopped(call, waited)[1]
    if kind is Kind.BLIP:
        first = call.request_id is None or call.state.blip_seen.add(call.first_sight())
        if first and call.state.random.random() < fault.float_param("probability"):
            logger.info("blip_fired supplier=%s request_id=%s", call.supplier, call.request_id)
            return answers.json_response(503, {"error": "injected_blip"})
    # Every remaining kind needs the good answer; an unknown SKU stays a 404 whatever the
    # fault (a batch call always has one: an unknown part is an entry of its answer).
    quote = call.quote()
    if quote is None:
        return call.unknown_sku()
    if kind in DATA_KINDS or isinstance(kind, BatchKind):
        return answers.bad_data(fault, quote)
    match kind:
        case Kind.BAD_GZIP:
            return answers.bad_gzip(quote)
        case Kind.GZIP_BOMB:
            return await answers.gzip_bomb(fault, quote)
        case Kind.OVERSIZED:
            return await answers.oversized(call, fault, quote)
        case Kind.TRUNCATED:
            return await answers.truncated(call, quote)
        case Kind.RESET:
            return await answers.reset_mid_body(call, quote)
        case Kind.SLOW_BODY:
            return await answers.slow_body(call, fault, quote)
    # latency and a blip that did not fire: the answer the scenario would give.
    if call.scenario != "normal" and call.supplier in call.state.scenario_suppliers:
        scenario = await _scenario(call)
        if scenario is not None:
            return scenario[1]
    return quote.ok()
