"""Asking QuoteFlow in a load loop, without the test client keeping every response.

``TestClient.post`` keeps each response it returns until the client closes,
so that it can release what a test forgot to. A load loop of thousands of
requests kept them all, some ten objects each: 85,000 in ``test_rates``'
reload test. A full garbage collection walks every one of them, and the
event loop stands still meanwhile: 100-140 ms on a quiet machine, in the
middle of the 0.5 s budgets being measured. These go through the client's
own session instead, each response released as soon as it is read.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient


async def post(client: TestClient[Any, Any], path: str, body: Any) -> tuple[int, bytes]:
    """``POST path`` with a JSON ``body``: the status and the body, the response released."""
    async with client.session.post(client.make_url(path), json=body) as response:
        return response.status, await response.read()


async def answer_of(
    client: TestClient[Any, Any], body: Any, path: str = "/api/quotes?explain=1"
) -> dict[str, Any]:
    """The JSON answer of a ``POST`` that must be a 200."""
    status, raw = await post(client, path, body)
    assert status == 200, raw[:300]
    answer: dict[str, Any] = json.loads(raw)
    return answer
