"""``python -m bench.otlp_sink --port N``: an OTLP/HTTP receiver that accepts every export.

The tracing section's collector: QuoteFlow's exporter does all its real work
(encoding, a POST per batch, reading the answer) and the sink answers 200
with an empty ``ExportTraceServiceResponse`` (zero bytes of protobuf),
counting exports and bytes. It decodes nothing, so it costs the machine as
little as a collector can. ``GET /stats`` → ``{"exports": n, "bytes": n}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from aiohttp import web

EXPORTS = web.AppKey("exports", list[int])
"""``[exports, bytes]`` received so far."""


async def export(request: web.Request) -> web.Response:
    """Take one batch of spans."""
    body = await request.read()
    counts = request.app[EXPORTS]
    counts[0] += 1
    counts[1] += len(body)
    return web.Response(body=b"", content_type="application/x-protobuf")


async def stats(request: web.Request) -> web.Response:
    """Exports and bytes received so far."""
    exports, received = request.app[EXPORTS]
    return web.json_response({"exports": exports, "bytes": received})


async def health(request: web.Request) -> web.Response:
    """The bench waits for this before the first run."""
    return web.json_response({"status": "ok"})


def create_app() -> web.Application:
    """The sink's routes."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[EXPORTS] = [0, 0]
    app.router.add_post("/v1/traces", export)
    app.router.add_get("/stats", stats)
    app.router.add_get("/health", health)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve on 127.0.0.1 until stopped."""
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    web.run_app(create_app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
