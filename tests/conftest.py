"""Shared fixtures: fake suppliers on real sockets and QuoteFlow built by its own factory."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import pytest
from aiohttp import web_app
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from quoteflow.app import GatewayFactory, create_app
from quoteflow.config import Settings
from tests.api_fakes import ForeignApi
from tests.fakes import FakeSuppliers
from tests.redis_server import RedisServer, redis_server_binary

StartQuoteFlow = Callable[..., Awaitable[TestClient[Any, Any]]]

TEST_BUDGET = 0.5
"""Short budgets keep the suite fast; bounds in tests stay generous."""
LOADED_MARGIN = 0.25
"""Seconds a loaded machine may add to an answer cut at its deadline, as measured by the test.

``make test`` runs three test workers on two cores, and CI may share them with
more: an event loop can be late by a few hundred ms to answer. A time bound is
the deadline plus this, never a hair above what one quiet run measured.
"""

TEST_CONNECT_TIMEOUT = 1.0
"""Past any test's budget. The fake suppliers share QuoteFlow's event loop, so
on a busy test machine a loopback connect can be *noticed* late; with the
default 0.25 s that became a transport_error and a retry the test never asked
for. No test here is about the connect timeout itself."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take what imports and collection built out of every later full garbage collection.

    A full collection walks every object a process tracks, and the event loop
    stands still while it does, about a millisecond per thousand objects on
    a two-core test machine. A test worker holds some 210,000 objects once it
    has collected (modules, fixtures, test items), all alive to the end;
    ``gc.freeze`` leaves them out of every later collection.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def forget_finished_apps() -> Iterator[None]:
    """Let each test's applications go once it is over.

    aiohttp caches the middleware chain it builds for each handler, keyed on
    the handler and its applications, in an LRU of 1,024 entries
    (``web_app._cached_build_middleware``). One application a process is what
    it is for; in a test worker it kept the applications of the last several
    hundred tests alive, with their routes, metrics and event loops: some
    150,000 objects more, walked at every full garbage collection. The pause
    grew to 200-330 ms on a quiet machine, past half a test's 0.5 s budget:
    on a loaded one, every call in flight timed out.
    """
    yield
    cache = getattr(web_app, "_cached_build_middleware", None)
    if cache is not None:
        cache.cache_clear()


@pytest.fixture
async def suppliers(aiohttp_server: AiohttpServer) -> FakeSuppliers:
    """Fake atlas, boreal and cedar, all answering their catalogue quote."""
    fake = FakeSuppliers()
    server = await aiohttp_server(fake.app)
    fake.url = str(server.make_url(""))
    return fake


@pytest.fixture
def start_quoteflow(aiohttp_client: AiohttpClient, suppliers: FakeSuppliers) -> StartQuoteFlow:
    """Start QuoteFlow against the fake suppliers; keyword arguments override settings."""

    async def start(
        *, gateway: GatewayFactory | None = None, **overrides: Any
    ) -> TestClient[Any, Any]:
        values: dict[str, Any] = {
            "budget": TEST_BUDGET,
            "connect_timeout": TEST_CONNECT_TIMEOUT,
            "provider_url": suppliers.url,
        }
        values.update(overrides)
        return await aiohttp_client(create_app(Settings(**values), gateway=gateway))

    return start


@pytest.fixture
async def api(aiohttp_server: AiohttpServer) -> ForeignApi:
    """A supplier API on a real socket: any method and path, and an OAuth2 token endpoint."""
    fake = ForeignApi()
    server = await aiohttp_server(fake.app)
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real, empty redis-server of this test's own, stopped afterwards."""
    server = RedisServer(redis_server_binary())
    server.start()
    try:
        yield server
    finally:
        server.stop()


GUNICORN_FILES = "fleet"
"""The folder of tests that each run a gunicorn fleet, a lab and a redis-server of their own."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One xdist group per file (``--dist loadgroup``); every gunicorn fleet test in one group.

    A file stays on one worker, as its module-scoped processes need. The
    fleet tests run one at a time: each is two gunicorn workers, a lab and a
    redis-server under a load of its own, and four of them at once on two
    cores drove Redis round trips past ``--redis-timeout``, so that what was
    measured was the machine, not the fleet.
    """
    for item in items:
        path = item.path
        group = GUNICORN_FILES if path.parent.name == GUNICORN_FILES else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
    # Longest groups first (xdist hands groups out in collection order): a long
    # file dealt last keeps one worker busy while the others idle. In the
    # alphabetical order the last files were among the longest, ~20 s of tail.
    items.sort(key=_heavy_first)


LONGEST_FIRST: Final = (
    f"tests/{GUNICORN_FILES}/",
    "tests/e2e/test_e2e_run.py",
    "tests/test_slow_suppliers.py",
    "tests/test_rates.py",
    "tests/test_fleet.py",
    "tests/test_connections.py",
    "tests/test_soak.py",
    "tests/test_fleet_app.py",
    "tests/test_beyond.py",
    "tests/test_supplier_apis.py",
    "tests/test_openapi.py",
    "tests/test_tracing.py",
    "tests/test_callers_fleet.py",
    "tests/test_console_browser.py",
)
"""The suite's longest groups, longest first (``--durations``; a list to keep roughly
right, not exact: a group missing from it only runs later)."""


def _heavy_first(item: pytest.Item) -> int:
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return next(
        (rank for rank, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)),
        len(LONGEST_FIRST),
    )
