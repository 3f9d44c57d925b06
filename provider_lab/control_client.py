"""A small client for the lab's control API, used by ``make demo`` and the end-to-end tests."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from provider_lab.catalogue import SUPPLIERS


class LabError(RuntimeError):
    """The lab refused a control request."""


class LabControl:
    """Drive a running lab at ``base_url`` through one ``ClientSession``."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self.base_url = base_url.rstrip("/")

    async def _call(self, method: str, path: str, body: object = None) -> Any:
        async with self._session.request(method, self.base_url + path, json=body) as response:
            payload = await response.json()
            if response.status >= 400:
                raise LabError(f"{method} {path}: {response.status} {payload}")
            return payload

    async def clear_faults(self) -> None:
        """Clear every supplier's faults."""
        await self._call("DELETE", "/faults")

    async def add_fault(self, supplier: str, fault: Mapping[str, object]) -> None:
        """Queue ``fault`` (the control API's JSON form) after ``supplier``'s others."""
        await self._call("POST", f"/faults/{supplier}", dict(fault))

    async def set_latency(self, ms: int) -> None:
        """Set the latency added to every supplier answer."""
        await self._call("PUT", "/latency", {"ms": ms})

    async def set_cache_control(self, supplier: str, value: str | None) -> None:
        """Send ``Cache-Control: value`` on ``supplier``'s answers (None: send none)."""
        if value is None:
            await self._call("DELETE", f"/cache-control/{supplier}")
        else:
            await self._call("PUT", f"/cache-control/{supplier}", {"value": value})

    async def oauth2(self) -> dict[str, Any]:
        """``GET /oauth2``: the token endpoint's client id, ``expires_in``, fault and counts."""
        result: dict[str, Any] = await self._call("GET", "/oauth2")
        return result

    async def set_oauth2(self, **settings: object) -> dict[str, Any]:
        """``PUT /oauth2``: any of ``client_id``, ``client_secret``, ``expires_in``, ``fault``."""
        result: dict[str, Any] = await self._call("PUT", "/oauth2", settings)
        return result

    async def set_token_fault(self, fault: Mapping[str, object] | None) -> None:
        """Make the token endpoint ``down``, ``slow`` (``ms``) or ``http_500`` until changed."""
        await self.set_oauth2(fault=None if fault is None else dict(fault))

    async def revoke_tokens(self) -> int:
        """Revoke every token the lab issued (the next bearer call is a 401); how many."""
        revoked: int = (await self._call("DELETE", "/oauth2/tokens"))["revoked"]
        return revoked

    async def set_api_key(self, value: str | None) -> None:
        """The key the ``path`` dialect wants (``None``: none, every key refused)."""
        await self._call("PUT", "/api-key", {"value": value})

    async def fx(self) -> dict[str, Any]:
        """``GET /fx``: the rates feed's date, rates, fault, ``fetches`` and ``answers``."""
        result: dict[str, Any] = await self._call("GET", "/fx")
        return result

    async def set_fx(self, **settings: object) -> dict[str, Any]:
        """``PUT /fx``: any of ``rates`` (``{"USD": "0.9000"}``, ``None`` drops one, merged),
        ``date`` (``"YYYY-MM-DD"``, ``None``: today in Frankfurt) and ``fault`` (``None`` or
        ``{"kind": "stale" | "malformed" | "hang" | "entity_bomb" | "down" | "cut"}``)."""
        result: dict[str, Any] = await self._call("PUT", "/fx", settings)
        return result

    async def set_fx_fault(self, fault: Mapping[str, object] | None) -> None:
        """The rates feed's fault until changed (``None``: none)."""
        await self.set_fx(fault=None if fault is None else dict(fault))

    async def reset_fx(self) -> None:
        """``DELETE /fx``: the feed's default rates, today's date, no fault."""
        await self._call("DELETE", "/fx")

    async def contracts(self) -> dict[str, dict[str, Any]]:
        """``GET /contracts``: every supplier's ``{"rate": ..., "concurrency": ...}``."""
        result: dict[str, dict[str, Any]] = await self._call("GET", "/contracts")
        return result

    async def set_contract(
        self, supplier: str, *, rate: str | None = None, concurrency: int | None = None
    ) -> dict[str, Any]:
        """Hold ``supplier`` to at most ``rate`` (``"20/1s"``) and ``concurrency`` at once.

        Both ``None``: no contract. A changed rate keeps what the supplier has
        used of it; ``clear_contract`` first to start it afresh.
        """
        body = {"rate": rate, "concurrency": concurrency}
        result: dict[str, Any] = await self._call("PUT", f"/contracts/{supplier}", body)
        return result

    async def clear_contract(self, supplier: str) -> None:
        """``supplier`` has no contract any more (its rate starts afresh if given one again)."""
        await self._call("DELETE", f"/contracts/{supplier}")

    async def clear_contracts(self) -> None:
        """No supplier has a contract any more."""
        await self._call("DELETE", "/contracts")

    async def contract_counts(self, supplier: str) -> dict[str, Any]:
        """``supplier``'s part of ``/stats`` for its contract: ``in_flight``, ``max_in_flight``,
        ``rate_refused``, ``concurrency_refused`` and ``admitted_per_second`` (60 counts,
        oldest first, the current second last; ``None`` while it has no contract)."""
        current = await self._call("GET", "/stats?summary=1")
        keys = ("in_flight", "max_in_flight", "rate_refused", "concurrency_refused")
        counts: dict[str, Any] = {key: current[key][supplier] for key in keys}
        counts["admitted_per_second"] = current["admitted_per_second"].get(supplier)
        return counts

    async def reset(self) -> None:
        """``POST /reset``: zero the statistics (contracts and faults stay)."""
        await self._call("POST", "/reset")

    async def stats(self, request_id: str | None = None) -> dict[str, Any]:
        """``GET /stats``, per-id maps limited to ``request_id`` if given."""
        query = "" if request_id is None else f"?request_id={quote(request_id, safe='')}"
        result: dict[str, Any] = await self._call("GET", f"/stats{query}")
        return result

    async def batch_sizes(self, supplier: str) -> dict[int, int]:
        """How many batch-dialect calls of each size (parts) ``supplier`` received since the
        last reset, e.g. ``{50: 2, 20: 1}`` for a cart of 120 lines in chunks of 50."""
        current = await self._call("GET", "/stats?summary=1")
        sizes = current.get("batch_sizes", {}).get(supplier, {})
        return {int(size): int(count) for size, count in sizes.items()}

    async def batch_sizes_of(self, request_id: str) -> dict[str, list[int]]:
        """Per supplier, the parts of each batch call that carried ``request_id``, in the order
        received (the first 32 calls of that id)."""
        per_id = (await self.stats(request_id)).get("batch_sizes_per_id", {})
        return {supplier: list(sizes) for supplier, sizes in per_id.get(request_id, {}).items()}

    async def wait_idle(self, within_s: float = 5.0) -> None:
        """Wait until no supplier request is in flight (callers hang up after their deadline)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within_s
        while (await self._call("GET", "/stats?summary=1"))["active"]:
            if loop.time() > end:
                raise LabError(f"supplier requests still in flight after {within_s} s")
            await asyncio.sleep(0.02)

    async def fresh(self) -> None:
        """No faults (the token endpoint's and the rates feed's too, whose rates and date are
        the defaults again), no added latency, no Cache-Control, no contracts, nothing in
        flight, statistics zeroed. Credentials, keys and issued tokens stay as they are."""
        await self.clear_faults()
        await self.set_token_fault(None)
        await self.reset_fx()
        await self.set_latency(0)
        await self._call("DELETE", "/cache-control")
        await self.clear_contracts()
        await self.wait_idle()
        await self.reset()

    async def attempts(
        self, request_id: str, suppliers: tuple[str, ...] = SUPPLIERS
    ) -> dict[str, int]:
        """Requests each of ``suppliers`` received carrying ``request_id`` (0 for none)."""
        seen = (await self.stats(request_id))["attempts_per_supplier"].get(request_id, {})
        return {supplier: int(seen.get(supplier, 0)) for supplier in suppliers}
