"""OutboundSlots: the shared limit and the per-supplier share, one wait per attempt."""

from __future__ import annotations

import asyncio

import pytest

from quoteflow.slots import OutboundSlots

SUPPLIERS = ("atlas", "boreal", "cedar")


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_limit_and_each_share_hold() -> None:
    slots = OutboundSlots(3, dict.fromkeys(SUPPLIERS, 2))
    await slots.acquire("boreal")
    await slots.acquire("boreal")
    third_boreal = asyncio.create_task(slots.acquire("boreal"))
    await settle()
    assert not third_boreal.done()  # boreal is at its share, though a slot is free
    await slots.acquire("atlas")  # the free slot goes to a supplier with room
    assert slots.in_use == 3
    cedar = asyncio.create_task(slots.acquire("cedar"))
    await settle()
    assert not cedar.done()  # no slot free at all

    slots.release("atlas")  # boreal waited first, but is at its share: cedar fits
    await settle()
    assert cedar.done()
    assert not third_boreal.done()
    slots.release("boreal")
    await settle()
    assert third_boreal.done()
    assert (slots.held("boreal"), slots.held("cedar"), slots.in_use) == (2, 1, 3)


async def test_waiters_are_served_first_come_first_served() -> None:
    slots = OutboundSlots(1, dict.fromkeys(SUPPLIERS, 1))
    await slots.acquire("atlas")
    order: list[str] = []

    async def wait(supplier: str) -> None:
        await slots.acquire(supplier)
        order.append(supplier)

    tasks = [asyncio.create_task(wait(s)) for s in ("cedar", "boreal", "atlas")]
    await settle()
    for supplier in ("atlas", "cedar", "boreal"):
        slots.release(supplier)
        await settle()
    await asyncio.gather(*tasks)
    assert order == ["cedar", "boreal", "atlas"]


async def test_a_waiter_cancelled_leaves_the_queue_and_takes_nothing() -> None:
    slots = OutboundSlots(1, dict.fromkeys(SUPPLIERS, 1))
    await slots.acquire("atlas")
    cancelled = asyncio.create_task(slots.acquire("boreal"))
    later = asyncio.create_task(slots.acquire("cedar"))
    await settle()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    slots.release("atlas")
    await later
    assert (slots.held("boreal"), slots.held("cedar"), slots.in_use) == (0, 1, 1)


async def test_a_slot_handed_to_a_waiter_cancelled_at_once_is_given_back() -> None:
    slots = OutboundSlots(1, dict.fromkeys(SUPPLIERS, 1))
    await slots.acquire("atlas")
    unlucky = asyncio.create_task(slots.acquire("boreal"))
    await settle()
    slots.release("atlas")  # hands the slot to boreal...
    unlucky.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    assert slots.in_use == 0
    assert slots.held("boreal") == 0
    await asyncio.wait_for(slots.acquire("cedar"), 1)  # the slot is really free


async def test_each_supplier_has_its_own_share() -> None:
    """Shares come per supplier: one with a share of 1 waits while another takes a second slot."""
    slots = OutboundSlots(4, {"narrow": 1, "wide": 3})
    await slots.acquire("narrow")
    second_narrow = asyncio.create_task(slots.acquire("narrow"))
    await slots.acquire("wide")
    await slots.acquire("wide")
    await settle()
    assert not second_narrow.done()
    assert (slots.held("narrow"), slots.held("wide"), slots.share("narrow")) == (1, 2, 1)
    slots.release("narrow")
    await settle()
    assert second_narrow.done()


async def test_a_new_catalogue_keeps_what_stays_and_drains_what_goes() -> None:
    """retarget: a larger share lets a waiter in at once; forget drops a removed, idle supplier."""
    slots = OutboundSlots(3, {"stays": 1, "goes": 1})
    await slots.acquire("stays")
    await slots.acquire("goes")
    waiting = asyncio.create_task(slots.acquire("stays"))
    await settle()
    assert not waiting.done()
    slots.retarget({"stays": 2, "new": 1})
    await settle()
    assert waiting.done()  # its share grew: no release needed
    assert slots.held("goes") == 1  # a removed supplier's attempt still holds its slot
    slots.forget(["goes"])
    assert slots.held("goes") == 1  # busy: not forgotten yet
    slots.release("goes")
    slots.forget(["goes"])
    with pytest.raises(KeyError):
        slots.held("goes")
    assert (slots.held("stays"), slots.held("new"), slots.in_use) == (2, 0, 2)


async def test_a_carts_waiting_calls_let_single_quotes_go_first() -> None:
    """``later`` waiters (a cart's calls) get a freed slot only when no single quote's call can."""
    slots = OutboundSlots(1, dict.fromkeys(SUPPLIERS, 1))
    await slots.acquire("atlas")
    order: list[str] = []

    async def wait(name: str, supplier: str, later: bool) -> None:
        await slots.acquire(supplier, later=later)
        order.append(name)

    tasks = [
        asyncio.create_task(wait("cart-1", "atlas", True)),
        asyncio.create_task(wait("cart-2", "boreal", True)),
    ]
    await settle()
    tasks.append(asyncio.create_task(wait("single", "cedar", False)))
    await settle()
    for supplier in ("atlas", "cedar", "atlas", "boreal"):
        slots.release(supplier)
        await settle()
    await asyncio.gather(*tasks)
    assert order == ["single", "cart-1", "cart-2"]
    assert slots.in_use == 0


async def test_a_carts_call_still_gets_a_slot_no_single_quote_can_use() -> None:
    """A single quote waiting for its supplier's share does not hold a cart's call back."""
    slots = OutboundSlots(2, dict.fromkeys(SUPPLIERS, 1))
    await slots.acquire("atlas")
    await slots.acquire("boreal")
    single = asyncio.create_task(slots.acquire("atlas"))  # atlas is at its share
    cart = asyncio.create_task(slots.acquire("cedar", later=True))
    await settle()
    slots.release("boreal")
    await settle()
    assert cart.done()
    assert not single.done()
    slots.release("atlas")
    await settle()
    assert single.done()
