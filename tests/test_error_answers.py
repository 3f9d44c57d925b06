"""aiohttp's own refusals (404, 405, 413) leave QuoteFlow as JSON, never as a plain-text 500."""

from __future__ import annotations

from tests.conftest import StartQuoteFlow


async def test_unknown_path_is_json_404(start_quoteflow: StartQuoteFlow) -> None:
    """A path QuoteFlow does not serve is a JSON 404 named ``not_found``."""
    client = await start_quoteflow()
    response = await client.get("/nowhere")
    assert response.status == 404
    assert (await response.json())["error"] == "not_found"


async def test_wrong_method_is_json_405_with_allow(start_quoteflow: StartQuoteFlow) -> None:
    """``GET /api/quotes`` is a JSON 405 that still says which method is allowed."""
    client = await start_quoteflow()
    response = await client.get("/api/quotes")
    assert response.status == 405
    assert response.headers["Allow"] == "POST"
    assert (await response.json())["error"] == "method_not_allowed"


async def test_body_over_cap_is_json_413(start_quoteflow: StartQuoteFlow) -> None:
    """A body past the 16 KiB cap is a JSON 413 named ``request_too_large``."""
    client = await start_quoteflow()
    response = await client.post("/api/quotes", data=b" " * (16 * 1024 + 1))
    assert response.status == 413
    assert response.content_type == "application/json"
    assert (await response.json())["error"] == "request_too_large"
