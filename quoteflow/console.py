"""The console: a page that asks, bursts and draws each bill, and may switch a lab's faults.

``--console`` serves one static page (``console.html``, package data) at
``/console``. Everything it does goes through ``/api/``: it asks for quotes
with ``?explain=svg`` under the key typed into the page (held in the page's
memory only), so the console adds no power a caller lacks. The page is
plain HTML with a little inline JavaScript; its ``Content-Security-Policy``
is ``default-src 'self'`` and allows exactly the page's own inline script
and style by hash, so nothing else can run in it.

``--console-lab URL`` adds ``/api/console/lab/...``: a provider lab's fault
and latency controls, forwarded to that lab and to nothing else. A fixed
list of (method, path) pairs is registered; any other path is aiohttp's
404, and without ``--console-lab`` there are no such routes at all. Since a
call switches what every caller of this QuoteFlow sees, it must come from
the page's own origin (``Origin``, and ``Sec-Fetch-Site`` when a browser
sends it), with a JSON body for every change (a cross-site form can send
neither), and QuoteFlow must listen on a loopback address unless keys are
configured (then ``auth_middleware`` has already asked for one).

The forwarding has a ``ClientSession`` of its own, opened only with
``--console-lab``: the lab is not a supplier, and its calls must never take
a connection from the suppliers' pool. Each call has a total time limit and
its answer is read whole inside ``async with``, so no socket outlives it.
This is the one place outside ``wire.py`` that catches aiohttp's client
errors: a lab that is down is the console's 502, not a supplier failure.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import logging
import re
from collections.abc import AsyncIterator
from importlib import resources

import aiohttp
from aiohttp import web
from yarl import URL

from quoteflow import handlers
from quoteflow.codec import to_json
from quoteflow.config import Settings
from quoteflow.logs import log_event

log = logging.getLogger("quoteflow")

LAB_PREFIX = "/api/console/lab"
LAB_TIMEOUT = aiohttp.ClientTimeout(total=3.0, connect=1.0)
"""A lab's control call answers at once; past this the lab is treated as down."""
MAX_LAB_ANSWER = 256 * 1024
"""The lab's control answers are small JSON documents; more is not a lab."""

LAB_ROUTES: tuple[tuple[str, str], ...] = (
    ("GET", "/kinds"),
    ("GET", "/faults"),
    ("DELETE", "/faults"),
    ("PUT", "/faults/{supplier}"),
    ("DELETE", "/faults/{supplier}"),
    ("GET", "/latency"),
    ("PUT", "/latency"),
)
"""The lab's control calls the console may forward: faults per supplier and the latency."""

_SUPPLIER = re.compile(r"[A-Za-z0-9_-]{1,64}")

CONSOLE_PAGE = web.AppKey("console_page", bytes)
CONSOLE_POLICY = web.AppKey("console_policy", str)
LAB_URL = web.AppKey("console_lab_url", URL)
LAB_SESSION = web.AppKey("console_lab_session", aiohttp.ClientSession)
LAB_OPEN = web.AppKey("console_lab_open", bool)
"""Lab calls allowed without a key: QuoteFlow listens on a loopback address only."""
LAB_LIMIT = web.AppKey("console_lab_timeout", aiohttp.ClientTimeout)
"""The time limits of each forwarded call (``LAB_TIMEOUT``; a test may set its own)."""

_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


def page() -> bytes:
    """The console page as shipped in the package."""
    return resources.files("quoteflow").joinpath("console.html").read_bytes()


def policy(html: bytes) -> str:
    """``default-src 'self'``, and the page's own inline script and style by their hashes.

    A hash names exactly the bytes shipped: no other inline code, no
    ``unsafe-inline``, nothing from another origin. The page may not be framed.
    """
    allowed: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for match in _INLINE.finditer(html):
        digest = base64.b64encode(hashlib.sha256(match.group(2)).digest()).decode()
        allowed[match.group(1)].append(f"'sha256-{digest}'")
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src 'self' {' '.join(allowed[b'script'])}".rstrip(),
            f"style-src 'self' {' '.join(allowed[b'style'])}".rstrip(),
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def add_console(app: web.Application, settings: Settings) -> None:
    """Serve the console and, with ``console_lab``, the lab's control calls; nothing otherwise."""
    if not settings.console:
        return
    app.on_startup.append(_load_page)  # create_app does no I/O
    app.router.add_get("/console", console_page)
    if settings.console_lab is None:
        return
    app[LAB_URL] = URL(settings.console_lab.rstrip("/"))
    app[LAB_OPEN] = _loopback(settings.host)
    app[LAB_LIMIT] = LAB_TIMEOUT
    app.cleanup_ctx.append(_lab_session)
    for method, path in LAB_ROUTES:
        route = path.replace("{supplier}", "{supplier:[A-Za-z0-9_-]{1,64}}")
        app.router.add_route(method, LAB_PREFIX + route, forward)


async def _load_page(app: web.Application) -> None:
    html = app[CONSOLE_PAGE] = page()
    app[CONSOLE_POLICY] = policy(html)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _lab_session(app: web.Application) -> AsyncIterator[None]:
    """The lab's own small session: never one of the suppliers' connections."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=4),
        timeout=app[LAB_LIMIT],
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:
        app[LAB_SESSION] = session
        yield


async def console_page(request: web.Request) -> web.Response:
    """The console page: static, its policy allowing only its own code."""
    return web.Response(
        body=request.app[CONSOLE_PAGE],
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": request.app[CONSOLE_POLICY],
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


def _refused(status: int, error: str, detail: str) -> web.Response:
    return web.Response(
        body=to_json({"error": error, "detail": detail}),
        status=status,
        content_type="application/json",
        charset="utf-8",
    )


def _refusal(request: web.Request) -> web.Response | None:
    """Why this lab call may not be forwarded, as its answer; None when it may."""
    if not request.app[LAB_OPEN] and handlers.GATE not in request.app:
        return _refused(
            403,
            "console_lab_forbidden",
            "lab controls need QuoteFlow on a loopback address, or API keys",
        )
    origin = request.headers.get("Origin")
    own = f"{request.scheme}://{request.host}"
    if (origin is not None and origin != own) or request.headers.get(
        "Sec-Fetch-Site", "same-origin"
    ) not in ("same-origin", "none"):
        return _refused(403, "console_lab_forbidden", "lab controls answer the console page only")
    if request.method != "GET" and request.content_type != "application/json":
        return _refused(415, "json_required", "a change to the lab needs a JSON body")
    return None


async def forward(request: web.Request) -> web.Response:
    """Forward one of the lab's control calls (``LAB_ROUTES``) and give back its answer."""
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    body = None
    if request.method == "PUT":
        body = await request.read()
        try:
            json.loads(body)
        except ValueError:
            return _refused(400, "invalid_json", "the body is not JSON")
    path = request.path.removeprefix(LAB_PREFIX)
    supplier = request.match_info.get("supplier")
    if supplier is not None and not _SUPPLIER.fullmatch(supplier):
        return _refused(404, "not_found", "no such supplier")  # the route's pattern sees to it
    url = request.app[LAB_URL].with_path(request.app[LAB_URL].path.rstrip("/") + path)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        async with request.app[LAB_SESSION].request(
            request.method, url, data=body, headers=headers, allow_redirects=False
        ) as answer:
            if (answer.content_length or 0) > MAX_LAB_ANSWER:
                return _refused(502, "lab_unreachable", "the lab's answer is too large")
            content = await answer.read()
            status = answer.status
    except TimeoutError:
        limit = request.app[LAB_LIMIT].total
        return _refused(504, "lab_timeout", f"the lab did not answer within {limit} s")
    except aiohttp.ClientError as exc:
        return _refused(502, "lab_unreachable", f"{type(exc).__name__}: {exc}")
    if len(content) > MAX_LAB_ANSWER:
        return _refused(502, "lab_unreachable", "the lab's answer is too large")
    if request.method != "GET":
        log_event(
            log,
            logging.INFO,
            "console_lab_changed",
            {"method": request.method, "path": path, "status": status},
        )
    return web.Response(
        body=content, status=status, content_type="application/json", charset="utf-8"
    )
