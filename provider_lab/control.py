"""The control API: faults, latency, contracts, credentials of the foreign dialects, statistics.

Served to loopback clients only (see :func:`provider_lab.app.loopback_only`).

=========================  ==================================================
``GET /kinds``             every fault kind, what it does, its parameters
``GET /kinds/batch``       the batch dialect's own fault kinds, likewise
``GET /faults``            every supplier's fault queue
``PUT /faults/{s}``        replace supplier ``s``'s faults with one fault
``POST /faults/{s}``       append a fault to ``s``'s queue
``DELETE /faults/{s}``     clear ``s``'s faults
``DELETE /faults``         clear every fault
``GET /latency``           the lab-wide added latency
``PUT /latency``           set it: ``{"ms": N}``
``GET /cache-control``     the ``Cache-Control`` header each supplier sends
``PUT /cache-control/{s}`` send ``{"value": "max-age=5, ..."}`` on ``s``'s answers
``DELETE /cache-control/{s}``, ``DELETE /cache-control``: send none (one, or all)
``GET /contracts``         every supplier's contract: ``{"rate": "20/1s" | null,
                           "concurrency": N | null}``
``PUT /contracts/{s}``     hold ``s`` to ``{"rate": "N/Ws" | null, "concurrency": N |
                           null}`` (a term left out is null; both null: none)
``DELETE /contracts/{s}``  ``s`` has no contract
``DELETE /contracts``      no supplier has a contract
``GET /stats``             in-flight counts, per-supplier counts, attempts per id, what
                           the contracts refused, admitted requests per second, the
                           latency fault's draws (``?request_id=ID``: only those ids;
                           ``?summary=1``: none, and no draws)
``POST /reset``            zero the statistics, the token endpoint's, the contracts' and
                           the rates feed's counts too (409 while requests are in flight)
``GET /oauth2``            the token endpoint: client id, ``expires_in``, fault,
                           fetch counts, last parameters, live tokens (no secret)
``PUT /oauth2``            change any of ``client_id``, ``client_secret``,
                           ``expires_in``, ``fault`` (null, ``{"kind": "down"}``,
                           ``{"kind": "slow", "ms": N}``, ``{"kind": "http_500"}``)
``DELETE /oauth2/tokens``  revoke every token issued (the next bearer call is 401)
``GET /api-key``           whether the ``path`` dialect has a key (never the key)
``PUT /api-key``           set it: ``{"value": "..."}`` (``null``: none, all refused)
``GET /fx``                the rates feed: date, rates, fault, fetch counts
``PUT /fx``                change any of ``rates`` (``{"USD": "0.9000"}``, null drops
                           one), ``date`` (``"YYYY-MM-DD"``, null: today in Frankfurt),
                           ``fault`` (null or ``{"kind": "stale" | "malformed" | "hang" |
                           "entity_bomb" | "down" | "cut"}``)
``DELETE /fx``             the default rates, today's date, no fault (counts stay)
=========================  ==================================================

``POST /oauth2/token`` itself, like the suppliers, serves anyone (:mod:`provider_lab.oauth2`),
and so does the rates feed, ``GET /fx/eurofxref-daily.xml`` (:mod:`provider_lab.fx`).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Iterable

from aiohttp import web

from provider_lab.answers import json_response
from provider_lab.contracts import ContractError, contract_from_json
from provider_lab.faults import (
    BATCH_SPECS,
    MAX_LATENCY_MS,
    SPECS,
    FaultError,
    KindSpec,
    fault_from_json,
)
from provider_lab.fx import fault_from_json as fx_fault_from_json
from provider_lab.fx import rates_problems
from provider_lab.state import STATE
from provider_lab.tokens import MAX_TTL, credential_ok
from provider_lab.tokens import fault_from_json as token_fault_from_json

logger = logging.getLogger(__name__)


async def _json_body(request: web.Request) -> object:
    try:
        return json.loads(await request.read())
    except ValueError:
        raise _error(400, "invalid_json", detail=["body: not valid JSON"]) from None


def _error(status: int, error: str, **extra: object) -> web.HTTPException:
    body = json.dumps({"error": error, **extra})
    cls = {400: web.HTTPBadRequest, 404: web.HTTPNotFound, 409: web.HTTPConflict}.get(
        status, web.HTTPUnprocessableEntity
    )
    return cls(text=body, content_type="application/json")


def _supplier(request: web.Request) -> str:
    supplier = request.match_info["supplier"]
    served = request.app[STATE].config.suppliers
    if supplier not in served:
        raise _error(404, "unknown_supplier", supplier=supplier, allowed=list(served))
    return supplier


async def kinds(request: web.Request) -> web.Response:
    """Describe every fault kind and its parameters."""
    return _described(SPECS.items())


async def batch_kinds(request: web.Request) -> web.Response:
    """Describe the batch dialect's own fault kinds (switched on like any other)."""
    return _described(BATCH_SPECS.items())


def _described(specs: Iterable[tuple[str, KindSpec]]) -> web.Response:
    return json_response(
        200,
        {
            str(kind): {
                "doc": spec.doc,
                "params": {
                    name: {
                        "type": param.type.__name__,
                        "default": param.default,
                        "doc": param.doc,
                        **({"choices": list(param.choices)} if param.choices else {}),
                    }
                    for name, param in spec.params.items()
                },
            }
            for kind, spec in specs
        },
    )


async def list_faults(request: web.Request) -> web.Response:
    """Every supplier's fault queue."""
    return json_response(200, request.app[STATE].faults.snapshot())


async def _set_fault(request: web.Request, *, append: bool) -> web.Response:
    supplier = _supplier(request)
    try:
        fault = fault_from_json(await _json_body(request))
    except FaultError as exc:
        raise _error(422, "invalid_fault", detail=exc.problems) from None
    table = request.app[STATE].faults
    if append:
        table.append(supplier, fault)
    else:
        table.replace(supplier, fault)
    logger.info("fault_set supplier=%s fault=%s append=%s", supplier, fault.to_json(), append)
    return json_response(200, {"supplier": supplier, "faults": table.snapshot()[supplier]})


async def put_fault(request: web.Request) -> web.Response:
    """Replace a supplier's faults with the one in the body."""
    return await _set_fault(request, append=False)


async def post_fault(request: web.Request) -> web.Response:
    """Append the fault in the body to a supplier's queue."""
    return await _set_fault(request, append=True)


async def clear_supplier(request: web.Request) -> web.Response:
    """Clear one supplier's faults."""
    supplier = _supplier(request)
    request.app[STATE].faults.clear(supplier)
    logger.info("faults_cleared supplier=%s", supplier)
    return json_response(200, {"supplier": supplier, "faults": []})


async def clear_all(request: web.Request) -> web.Response:
    """Clear every supplier's faults."""
    table = request.app[STATE].faults
    table.clear()
    logger.info("faults_cleared supplier=all")
    return json_response(200, table.snapshot())


async def get_latency(request: web.Request) -> web.Response:
    """The latency added to every supplier answer."""
    return json_response(200, {"ms": request.app[STATE].latency_ms})


async def put_latency(request: web.Request) -> web.Response:
    """Set the latency added to every supplier answer: ``{"ms": N}``."""
    data = await _json_body(request)
    if not isinstance(data, dict) or set(data) != {"ms"}:
        raise _error(422, "invalid_latency", detail=['body: must be {"ms": N}'])
    ms = data["ms"]
    if type(ms) is not int or not 0 <= ms <= MAX_LATENCY_MS:
        raise _error(422, "invalid_latency", detail=[f"ms: must be an integer 0–{MAX_LATENCY_MS}"])
    request.app[STATE].latency_ms = ms
    logger.info("latency_set ms=%d", ms)
    return json_response(200, {"ms": ms})


MAX_CACHE_CONTROL = 256


async def get_cache_control(request: web.Request) -> web.Response:
    """The ``Cache-Control`` header each supplier sends on its answers."""
    return json_response(200, dict(request.app[STATE].cache_control))


async def put_cache_control(request: web.Request) -> web.Response:
    """Send ``{"value": "..."}`` as ``Cache-Control`` on every answer of one supplier."""
    supplier = _supplier(request)
    data = await _json_body(request)
    if not isinstance(data, dict) or set(data) != {"value"}:
        raise _error(422, "invalid_cache_control", detail=['body: must be {"value": "..."}'])
    value = data["value"]
    # Printable ASCII only: a CR or LF would let the value forge headers of its own.
    if (
        type(value) is not str
        or not 0 < len(value) <= MAX_CACHE_CONTROL
        or not all(" " <= char <= "~" for char in value)
    ):
        raise _error(
            422,
            "invalid_cache_control",
            detail=[f"value: must be 1–{MAX_CACHE_CONTROL} printable ASCII characters"],
        )
    request.app[STATE].cache_control[supplier] = value
    logger.info("cache_control_set supplier=%s value=%r", supplier, value)
    return json_response(200, {"supplier": supplier, "value": value})


async def clear_cache_control(request: web.Request) -> web.Response:
    """Send no ``Cache-Control`` on one supplier's answers."""
    supplier = _supplier(request)
    request.app[STATE].cache_control.pop(supplier, None)
    logger.info("cache_control_cleared supplier=%s", supplier)
    return json_response(200, {"supplier": supplier, "value": None})


async def clear_all_cache_control(request: web.Request) -> web.Response:
    """Send no ``Cache-Control`` on any supplier's answers."""
    request.app[STATE].cache_control.clear()
    logger.info("cache_control_cleared supplier=all")
    return json_response(200, {})


async def get_contracts(request: web.Request) -> web.Response:
    """Every supplier's contract (nulls for a supplier without one)."""
    return json_response(200, request.app[STATE].contracts.snapshot())


async def put_contract(request: web.Request) -> web.Response:
    """Hold one supplier to ``{"rate": "N/Ws" | null, "concurrency": N | null}``.

    A term left out is null; both null removes the contract. A changed rate
    keeps what the supplier has used of it; one given after none starts afresh.
    """
    supplier = _supplier(request)
    try:
        contract = contract_from_json(await _json_body(request))
    except ContractError as exc:
        raise _error(422, "invalid_contract", detail=exc.problems) from None
    table = request.app[STATE].contracts
    table.set(supplier, contract, asyncio.get_running_loop().time())
    shown = table.shown(supplier)
    logger.info("contract_set supplier=%s rate=%s concurrency=%s", supplier, *shown.values())
    return json_response(200, {"supplier": supplier, **shown})


async def clear_contract(request: web.Request) -> web.Response:
    """One supplier has no contract any more."""
    supplier = _supplier(request)
    table = request.app[STATE].contracts
    table.set(supplier, None, asyncio.get_running_loop().time())
    logger.info("contract_cleared supplier=%s", supplier)
    return json_response(200, {"supplier": supplier, **table.shown(supplier)})


async def clear_contracts(request: web.Request) -> web.Response:
    """No supplier has a contract any more."""
    table = request.app[STATE].contracts
    table.clear()
    logger.info("contract_cleared supplier=all")
    return json_response(200, table.snapshot())


async def stats(request: web.Request) -> web.Response:
    """What the lab has seen since the last reset.

    ``?request_id=ID`` (repeatable) limits the per-id maps to those ids;
    ``?summary=1`` leaves them out, and the latency fault's draws, for callers
    that only want the counters.
    """
    query = request.query
    ids: list[str] | None = query.getall("request_id", None)
    summary = query.get("summary") in ("1", "true")
    if summary:
        ids = []
    state = request.app[STATE]
    now = asyncio.get_running_loop().time()
    counts = state.stats.to_json(ids, draws=not summary)
    # Only once the feed was fetched since the reset: without it, the body is what it was.
    fx = {"fx_fetches": state.fx.fetches} if state.fx.fetches else {}
    return json_response(200, {**counts, **state.contracts.to_json(now), **fx})


async def reset(request: web.Request) -> web.Response:
    """Zero the statistics (the token endpoint's and the contracts' counts too) and the
    flaky/blip memory.

    Refused (409) while supplier requests are in flight; faults, contracts (and
    what their rates have used), tokens and keys stay.
    """
    state = request.app[STATE]
    if state.stats.active:
        raise _error(409, "requests_active", active=state.stats.active)
    state.reset()
    logger.info("stats_reset")
    return json_response(200, {"status": "reset"})


OAUTH2_SETTINGS = ("client_id", "client_secret", "expires_in", "fault")


async def get_oauth2(request: web.Request) -> web.Response:
    """The token endpoint's settings and counts; never the secret or a token."""
    keeper = request.app[STATE].tokens
    return json_response(200, keeper.to_json(asyncio.get_running_loop().time()))


async def put_oauth2(request: web.Request) -> web.Response:
    """Change any of the client id, the secret, ``expires_in`` and the endpoint's fault.

    Tokens already issued keep their expiry (``DELETE /oauth2/tokens`` revokes
    them); a fault stays until it is changed.
    """
    data = await _json_body(request)
    if not isinstance(data, dict):
        raise _error(422, "invalid_oauth2", detail=["body: must be a JSON object"])
    problems = [
        f"{name}: not a setting ({', '.join(OAUTH2_SETTINGS)})"
        for name in sorted(set(data) - set(OAUTH2_SETTINGS))
    ]
    for name in ("client_id", "client_secret"):
        if name in data and not credential_ok(data[name]):
            problems.append(f"{name}: must be 1–256 printable characters")
    expires_in = data.get("expires_in")
    if "expires_in" in data and (type(expires_in) is not int or not 1 <= expires_in <= MAX_TTL):
        problems.append(f"expires_in: must be an integer 1–{MAX_TTL}")
    fault = None
    if "fault" in data:
        try:
            fault = token_fault_from_json(data["fault"])
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise _error(422, "invalid_oauth2", detail=problems)
    keeper = request.app[STATE].tokens
    if "client_id" in data:
        keeper.client_id = data["client_id"]
    if "client_secret" in data:
        keeper.client_secret = data["client_secret"]
    if isinstance(expires_in, int):
        keeper.expires_in = expires_in
    if "fault" in data:
        keeper.fault = fault
    # The names changed, not the values: the secret never reaches a log.
    current = keeper.fault and keeper.fault.to_json()
    logger.info("oauth2_set settings=%s fault=%s", sorted(data), current)
    return json_response(200, keeper.to_json(asyncio.get_running_loop().time()))


async def revoke_tokens(request: web.Request) -> web.Response:
    """Revoke every token the endpoint issued: the next bearer call is a 401."""
    revoked = request.app[STATE].tokens.revoke_all()
    logger.info("tokens_revoked count=%d", revoked)
    return json_response(200, {"revoked": revoked})


async def get_api_key(request: web.Request) -> web.Response:
    """Whether the ``path`` dialect has an API key: never the key itself."""
    return json_response(200, {"set": request.app[STATE].api_key is not None})


async def put_api_key(request: web.Request) -> web.Response:
    """Set the ``path`` dialect's key, ``{"value": "..."}``; ``null``: none, every key refused."""
    data = await _json_body(request)
    if not isinstance(data, dict) or set(data) != {"value"}:
        raise _error(422, "invalid_api_key", detail=['body: must be {"value": "..." or null}'])
    value = data["value"]
    if value is not None and not credential_ok(value):
        raise _error(422, "invalid_api_key", detail=["value: must be 1–256 printable characters"])
    request.app[STATE].api_key = value
    logger.info("api_key_set set=%s", value is not None)
    return json_response(200, {"set": value is not None})


FX_SETTINGS = ("rates", "date", "fault")


async def get_fx(request: web.Request) -> web.Response:
    """The rates feed: the date it shows, its rates, its fault and how often it was fetched."""
    return json_response(200, request.app[STATE].fx.to_json())


async def put_fx(request: web.Request) -> web.Response:
    """Change any of the feed's ``rates`` (merged; null drops one), ``date`` and ``fault``.

    Every problem is listed at once (``422 invalid_fx``) and nothing changes; a fault stays
    until changed, for every fetch.
    """
    data = await _json_body(request)
    if not isinstance(data, dict):
        raise _error(422, "invalid_fx", detail=["body: must be a JSON object"])
    problems = [
        f"{name}: not a setting ({', '.join(FX_SETTINGS)})"
        for name in sorted(set(data) - set(FX_SETTINGS))
    ]
    if "rates" in data:
        problems += rates_problems(data["rates"])
    date = None
    if data.get("date") is not None:
        try:
            date = datetime.date.fromisoformat(data["date"])
        except (TypeError, ValueError):
            problems.append('date: must be null or "YYYY-MM-DD"')
    fault = None
    if "fault" in data:
        try:
            fault = fx_fault_from_json(data["fault"])
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise _error(422, "invalid_fx", detail=problems)
    fx = request.app[STATE].fx
    if "rates" in data:
        fx.change_rates(data["rates"])
    if "date" in data:
        fx.date = date
    if "fault" in data:
        fx.fault = fault
    logger.info(
        "fx_set settings=%s fault=%s date=%s",
        sorted(data),
        fx.fault and fx.fault.to_json(),
        fx.table_date(),
    )
    return json_response(200, fx.to_json())


async def reset_fx(request: web.Request) -> web.Response:
    """The feed's default rates, today's date and no fault; its counts stay."""
    fx = request.app[STATE].fx
    fx.defaults()
    logger.info("fx_reset")
    return json_response(200, fx.to_json())


def add_routes(router: web.UrlDispatcher) -> None:
    """Register the control API on ``router``."""
    router.add_get("/kinds", kinds)
    router.add_get("/kinds/batch", batch_kinds)
    router.add_get("/faults", list_faults)
    router.add_delete("/faults", clear_all)
    router.add_put("/faults/{supplier}", put_fault)
    router.add_post("/faults/{supplier}", post_fault)
    router.add_delete("/faults/{supplier}", clear_supplier)
    router.add_get("/latency", get_latency)
    router.add_put("/latency", put_latency)
    router.add_get("/cache-control", get_cache_control)
    router.add_delete("/cache-control", clear_all_cache_control)
    router.add_put("/cache-control/{supplier}", put_cache_control)
    router.add_delete("/cache-control/{supplier}", clear_cache_control)
    router.add_get("/contracts", get_contracts)
    router.add_delete("/contracts", clear_contracts)
    router.add_put("/contracts/{supplier}", put_contract)
    router.add_delete("/contracts/{supplier}", clear_contract)
    router.add_get("/stats", stats)
    router.add_post("/reset", reset)
    router.add_get("/oauth2", get_oauth2)
    router.add_put("/oauth2", put_oauth2)
    router.add_delete("/oauth2/tokens", revoke_tokens)
    router.add_get("/api-key", get_api_key)
    router.add_put("/api-key", put_api_key)
    router.add_get("/fx", get_fx)
    router.add_put("/fx", put_fx)
    router.add_delete("/fx", reset_fx)
