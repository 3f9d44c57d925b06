"""The framework baseline: the fan-out you would write yourself in plain aiohttp.

One GET to each supplier through one shared ``ClientSession``, gathered, and
ranked into roughly QuoteFlow's response shape — with no request validation,
no supplier-data validation, no retries, no time budget and no limits. Whatever
QuoteFlow costs beyond this is the price of its guarantees; the benchmark
reports QuoteFlow's figures as ratios of this app's, measured in the same run.

    python -m bench.bare_fanout --port 9200 --provider-url http://127.0.0.1:9101

``--names a,b,c`` asks those suppliers (at ``{provider}/quotes/{name}``)
instead of atlas, boreal and cedar: the like-for-like baseline of a catalogue.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from aiohttp import web

SUPPLIERS = ("atlas", "boreal", "cedar")
SESSION = web.AppKey("session", aiohttp.ClientSession)
PROVIDER_URL = web.AppKey("provider_url", str)
NAMES = web.AppKey("names", tuple[str, ...])


async def _ask(
    session: aiohttp.ClientSession, url: str, params: dict[str, str], request_id: str
) -> dict[str, Any]:
    async with session.get(url, params=params, headers={"X-Request-ID": request_id}) as resp:
        if resp.status != 200:
            return {"code": f"http_{resp.status}"}
        quote: dict[str, Any] = await resp.json(content_type=None)
        return quote


async def quotes(request: web.Request) -> web.Response:
    """Ask every supplier at once and rank what comes back."""
    body: dict[str, Any] = await request.json()
    sku = body.get("sku", "KB-001")
    quantity = body.get("quantity", 2)
    params = {"sku": sku, "scenario": body.get("scenario", "normal")}
    request_id = uuid.uuid4().hex
    session = request.app[SESSION]
    base = request.app[PROVIDER_URL]
    names = request.app[NAMES]
    loop = asyncio.get_running_loop()
    started = loop.time()
    answers = await asyncio.gather(
        *(_ask(session, f"{base}/quotes/{name}", params, request_id) for name in names),
        return_exceptions=True,
    )
    found: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    for name, answer in zip(names, answers, strict=True):
        if isinstance(answer, BaseException):
            failures.append({"supplier": name, "code": "transport_error"})
        elif "code" in answer:
            failures.append({"supplier": name, "code": answer["code"]})
        elif answer["stock"] >= quantity:
            answer["total_cents"] = answer["unit_cents"] * quantity + answer["shipping_cents"]
            found.append(answer)
    found.sort(key=lambda quote: (quote["total_cents"], quote["supplier"]))
    return web.json_response(
        {
            "sku": sku,
            "quantity": quantity,
            "quotes": found,
            "failures": failures,
            "best": found[0] if found else None,
            "elapsed_ms": round((loop.time() - started) * 1000, 3),
            "request_id": request_id,
        }
    )


async def health(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


def create_app(provider_url: str, names: tuple[str, ...] = SUPPLIERS) -> web.Application:
    """The bare fan-out app; its session lives from start-up to shutdown."""
    app = web.Application()
    app[PROVIDER_URL] = provider_url.rstrip("/")
    app[NAMES] = names

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        # aiohttp's defaults, as a hand-written fan-out would have them: a pool
        # of 100 connections, which no benchmark workload comes near.
        async with aiohttp.ClientSession() as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/health", health)
    app.router.add_post("/api/quotes", quotes)
    return app


def _have_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the bare fan-out until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m bench.bare_fanout", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9200)
    parser.add_argument("--provider-url", default="http://127.0.0.1:9101")
    parser.add_argument("--names", default=",".join(SUPPLIERS), help="suppliers to ask")
    parser.add_argument(
        "--event-loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="auto (default): uvloop when installed, as QuoteFlow does",
    )
    args = parser.parse_args(argv)
    loop: asyncio.AbstractEventLoop
    if args.event_loop == "asyncio" or (args.event_loop == "auto" and not _have_uvloop()):
        loop = asyncio.new_event_loop()
    else:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(
        create_app(args.provider_url, tuple(args.names.split(","))),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        loop=loop,
    )


if __name__ == "__main__":
    main()
