"""The suite's own garbage: what a test worker keeps alive between tests.

A full garbage collection walks every object alive, and the event loop of
the test under way stands still meanwhile. A worker that kept each finished
test's application made that a pause of 200-330 ms, and a test with a 0.5 s
budget saw every call time out at once (``tests/conftest.py``). These fail
if it comes back: say, an aiohttp that renames the cache the suite clears.
The two tests run in this order, on one worker (a file is one group).
"""

from __future__ import annotations

import gc
import weakref

from aiohttp import web
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpClient

FINISHED: list[weakref.ref[web.Application]] = []
"""The application of the first test, once it is over: a weak reference only."""


@web.middleware
async def passing(request: web.Request, handler: Handler) -> web.StreamResponse:
    return await handler(request)


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def test_an_application_with_a_middleware_answers(aiohttp_client: AiohttpClient) -> None:
    app = web.Application(middlewares=[passing])  # aiohttp caches its chain per handler
    app.router.add_get("/", hello)
    client = await aiohttp_client(app)
    async with client.get("/") as response:
        assert response.status == 200
    FINISHED.append(weakref.ref(app))


def test_the_last_tests_application_is_garbage_once_it_is_over() -> None:
    assert FINISHED, "runs after the test above, in the same process"
    gc.collect()
    kept = FINISHED[0]()
    assert kept is None, [type(holder).__name__ for holder in gc.get_referrers(kept)]


def test_what_collection_built_is_left_out_of_every_full_collection() -> None:
    assert gc.get_freeze_count() > 10_000
