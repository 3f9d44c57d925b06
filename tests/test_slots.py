"""OutboundSlots: the shared limit and the per-supplier share, one wait per attempt."""

from __future__ import annotations

import asyncio

import pytest

from quoteflow.slots import SINGLES_LINGER, OutboundSlots

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


async def test_a_carts_call_below_the_carts_part_gets_a_slot_no_single_quote_can_use() -> None:
    """A single quote waiting for its supplier's share does not hold a cart's call back."""
    slots = OutboundSlots(2, dict.fromkeys(SUPPLIERS, 1), cart_slots=1)
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


async def take(slots: OutboundSlots, supplier: str, later: bool) -> asyncio.Task[bool]:
    task = asyncio.create_task(slots.acquire(supplier, later=later))
    await settle()
    return task


async def test_carts_hold_at_most_their_part_while_single_quotes_are_present() -> None:
    """Beside one single quote's call, carts hold 2 of 6 slots; the rest stay the singles'."""
    slots = OutboundSlots(6, dict.fromkeys(SUPPLIERS, 6), cart_slots=2)
    await slots.acquire("atlas")  # a single quote's call
    carts = [await take(slots, SUPPLIERS[n % 3], True) for n in range(5)]
    assert [cart.done() for cart in carts] == [True, True, False, False, False]
    assert (slots.carts.held, slots.in_use) == (2, 3)
    singles = [await take(slots, supplier, False) for supplier in SUPPLIERS]
    assert all(single.done() for single in singles)  # the free slots were theirs at once
    for supplier in ("atlas", "atlas", "boreal", "cedar"):
        slots.release(supplier)  # single quotes end; their linger keeps carts at 2
        await settle()
    assert (slots.carts.held, slots.in_use) == (2, 2)
    slots.release(SUPPLIERS[0], later=True)  # a cart's call ends: the next cart's takes it
    await settle()
    assert [cart.done() for cart in carts] == [True, True, True, False, False]
    assert slots.carts.held == 2


async def test_single_quotes_filling_every_slot_never_starve_carts() -> None:
    """Below their part, carts' calls go before single quotes' calls; above it, after."""
    slots = OutboundSlots(3, dict.fromkeys(SUPPLIERS, 3), cart_slots=1)
    for supplier in SUPPLIERS:
        await slots.acquire(supplier)
    single = await take(slots, "atlas", False)
    carts = [await take(slots, "boreal", True) for _ in range(2)]
    slots.release("cedar")
    await settle()
    assert (carts[0].done(), single.done(), carts[1].done()) == (True, False, False)
    slots.release("boreal")
    await settle()
    assert (single.done(), carts[1].done()) == (True, False)  # carts are at their part
    slots.release("boreal", later=True)
    await settle()
    assert carts[1].done()
    assert (slots.carts.held, slots.in_use) == (1, 3)


async def test_with_no_single_quote_carts_use_every_slot_and_single_quotes_get_them_back() -> None:
    """Idle, a cart takes every slot; once single quotes come, carts shrink back to their part."""
    slots = OutboundSlots(4, dict.fromkeys(SUPPLIERS, 4), cart_slots=1)
    for _ in range(4):
        assert await asyncio.wait_for(slots.acquire("atlas", later=True), 0.1)
    assert slots.carts.held == 4
    singles = [await take(slots, "boreal", False) for _ in range(3)]
    cart = await take(slots, "atlas", True)
    for handed in range(1, 4):
        slots.release("atlas", later=True)
        await settle()
        assert sum(single.done() for single in singles) == handed
        assert not cart.done()
    assert slots.carts.held == 1
    slots.release("atlas", later=True)  # down to no slot: the cart's call goes first
    await settle()
    assert cart.done()
    assert slots.carts.held == 1


async def test_carts_get_the_free_slots_back_once_single_quotes_are_gone() -> None:
    """Single quotes count as present for SINGLES_LINGER after their last slot; then carts."""
    slots = OutboundSlots(4, dict.fromkeys(SUPPLIERS, 4), cart_slots=1)
    await slots.acquire("atlas")  # a single quote's
    carts = [await take(slots, "boreal", True) for _ in range(3)]
    assert [cart.done() for cart in carts] == [True, False, False]
    slots.release("atlas")
    await settle()
    assert not carts[1].done()  # its caller's next single quote may be on its way
    await asyncio.wait_for(asyncio.gather(*carts), SINGLES_LINGER + 0.1)
    assert (slots.carts.held, slots.in_use) == (3, 3)
