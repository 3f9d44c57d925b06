"""CPU time of ``basket.solve`` on carts that resemble real ones: ``python -m bench.basket``.

``realistic_cart`` makes a seeded cart: SKUs cost 1 € to 500 € (log-uniform)
in quantities of 1 to 5, now and then 10; a SKU's unit price varies ±30 %
across suppliers (a supplier-wide bias of ±10 % and ±20 % for the item),
shipping is 500–1500 cents per supplier with a surcharge for bulky lines
(two weight tiers, so a supplier quotes up to three shipping values), each
supplier quotes 70–98 % of the lines, and one line in ten is rare: each
supplier quotes it with probability 0.1.

``hard_cart`` is built to be hard: prices within ±2 % everywhere and a
different shipping on every line, so no offer can be set aside and every
line is a shipping level. Proving those takes seconds (for a MIP solver too);
the bench shows what a time limit returns there.

Each cart's CPU time is the least of ``REPEAT`` runs. Measured on the
development machine (2 cores shared with other jobs' tests, Python 3.11),
over two runs::

    200 lines x  8 suppliers: median 2.6-2.8 ms, p95 3.3 ms, max 3.4 ms; 50/50 proven
    200 lines x 32 suppliers: median 5.7-7.5 ms, p95 9.8-14.6 ms, max 15-17 ms; 50/50 proven

and with ``ALTERNATES`` (issue 49, on a later and faster day: the carts
without alternates 1.7 and 4.4-4.9 ms that day, 0.97-0.98 x the build
before alternates, each solved in turn with it)::

    200 lines x  8 suppliers, 2 alternates: median 3.4-3.6 ms, p95 3.8 ms, max 5.7 ms; 50/50
    200 lines x 32 suppliers, 2 alternates: median 10.3-10.5 ms, p95 14.3 ms, max 28 ms; 50/50
    hard 200 x  8, limit 50 ms: median 49.5-50.5 ms; 0/10 proven
    hard 200 x 32, limit 50 ms: median 49.6-49.8 ms; 0/10 proven

The targets are 5 ms and 50 ms. HiGHS, for comparison, took about 20 ms and
100 ms on the realistic carts of each size (its solve alone).
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time

from quoteflow.basket import Line, Offer, solve

CARTS = 50
"""Seeded carts per size."""
SIZES = ((200, 8), (200, 32))
"""(lines, suppliers) of each measured size."""
REPEAT = 3
"""Runs of each cart; the least CPU time counts."""
ALTERNATES = 2
"""Approved alternates of every line in the carts measured with alternates."""
HARD_LIMIT = 0.05
"""Seconds ``solve`` may take on a hard cart."""


def supplier_names(count: int) -> tuple[str, ...]:
    """A catalogue of ``count`` suppliers, in catalogue order."""
    return tuple(f"supplier-{j:02d}" for j in range(count))


def realistic_cart(
    seed: int, lines: int, suppliers: int, alternates: int = 0
) -> tuple[list[Line], tuple[str, ...]]:
    """A cart of ``lines`` lines quoted by up to ``suppliers`` suppliers, and their catalogue.

    With ``alternates``, every line has that many approved alternates, drawn
    apart so that the line's own offers are those of the cart without: each
    costs 0.7-1.4 x the line's base, in the line's weight tier four times in
    five (the same part in another make), and is quoted as often as any SKU.
    """
    rng = random.Random(seed)
    other = random.Random(f"{seed}-alternates")
    names = supplier_names(suppliers)
    shipping = [rng.randrange(500, 1501, 10) for _ in names]
    surcharge = [(0, rng.randrange(200, 801, 50), rng.randrange(800, 2001, 50)) for _ in names]
    bias = [rng.uniform(-0.1, 0.1) for _ in names]
    coverage = [rng.uniform(0.7, 0.98) for _ in names]
    cart: list[Line] = []
    for n in range(lines):
        base = math.exp(rng.uniform(math.log(100), math.log(50_000)))
        quantity = rng.choice((1, 1, 1, 1, 2, 2, 3, 4, 5, 10))
        tier = rng.choices((0, 1, 2), weights=(75, 18, 7))[0]
        rare = rng.random() < 0.1
        offers = [
            Offer(
                name,
                max(1, round(base * (1 + bias[j] + rng.uniform(-0.2, 0.2)))),
                shipping[j] + surcharge[j][tier],
            )
            for j, name in enumerate(names)
            if rng.random() < (0.1 if rare else coverage[j])
        ]
        if not offers:
            j = rng.randrange(suppliers)
            offers = [Offer(names[j], round(base), shipping[j] + surcharge[j][tier])]
        skus = tuple(f"SKU-{n:04d}-{k}" for k in range(1, alternates + 1))
        for sku in skus:
            price = base * other.uniform(0.7, 1.4)
            weight = tier if other.random() < 0.8 else other.choice((0, 1, 2))
            offers += [
                Offer(
                    name,
                    max(1, round(price * (1 + bias[j] + other.uniform(-0.2, 0.2)))),
                    shipping[j] + surcharge[j][weight],
                    sku=sku,
                )
                for j, name in enumerate(names)
                if other.random() < coverage[j]
            ]
        cart.append(Line(f"SKU-{n:04d}", quantity, offers, skus))
    return cart, names


def hard_cart(seed: int, lines: int, suppliers: int) -> tuple[list[Line], tuple[str, ...]]:
    """A cart built to be hard: near-equal prices and a different shipping on every line."""
    rng = random.Random(seed)
    names = supplier_names(suppliers)
    cart: list[Line] = []
    for n in range(lines):
        base = rng.randrange(100, 5000)
        offers = [
            Offer(name, round(base * rng.uniform(0.98, 1.02)), rng.randrange(500, 1501))
            for name in names
            if rng.random() < 0.9
        ]
        cart.append(Line(f"SKU-{n:04d}", rng.choice((1, 1, 2, 3, 5)), offers))
    return cart, names


def cpu_ms(
    cart: list[Line], names: tuple[str, ...], time_limit: float | None
) -> tuple[float, bool]:
    """CPU milliseconds of ``solve`` (the least of ``REPEAT``), and whether it proved its basket.

    The least of a few runs, each after a full garbage collection: the bench
    measures the search, not the neighbours on a shared machine or a
    collection of the carts made before it.
    """
    spent = []
    for _ in range(REPEAT):
        gc.collect()
        started = time.process_time()
        basket = solve(cart, names, time_limit=time_limit)
        spent.append((time.process_time() - started) * 1000)
    return min(spent), basket.optimal


def report(label: str, runs: list[tuple[float, bool]]) -> str:
    """One line: median, p95 and max CPU ms, and how many baskets were proven."""
    times = sorted(ms for ms, _ in runs)
    p95 = times[math.ceil(0.95 * len(times)) - 1]
    proven = sum(optimal for _, optimal in runs)
    return (
        f"{label}: median {statistics.median(times):.1f} ms, p95 {p95:.1f} ms,"
        f" max {times[-1]:.1f} ms; {proven}/{len(runs)} proven"
    )


def figures() -> dict[str, dict[str, float | int]]:
    """The realistic sizes' CPU (median, p95, max ms, proven), as the carts section reports it."""
    cpu_ms(*realistic_cart(-1, 50, 8), None)
    found: dict[str, dict[str, float | int]] = {}
    for lines, suppliers in SIZES:
        carts = [realistic_cart(seed, lines, suppliers) for seed in range(CARTS)]
        runs = [cpu_ms(cart, names, None) for cart, names in carts]
        times = sorted(ms for ms, _ in runs)
        found[f"{lines}x{suppliers}"] = {
            "median_ms": round(statistics.median(times), 2),
            "p95_ms": round(times[math.ceil(0.95 * len(times)) - 1], 2),
            "max_ms": round(times[-1], 2),
            "proven": sum(optimal for _, optimal in runs),
            "carts": len(runs),
        }
    return found


def main() -> None:
    """Print the CPU time of ``solve`` over seeded carts of each size."""
    cpu_ms(*realistic_cart(-1, 50, 8), None)  # warm the imports and caches
    for alternates in (0, ALTERNATES):
        for lines, suppliers in SIZES:
            carts = [realistic_cart(seed, lines, suppliers, alternates) for seed in range(CARTS)]
            runs = [cpu_ms(cart, names, None) for cart, names in carts]
            label = f"{lines} lines x {suppliers:2d} suppliers"
            print(report(label + (f", {alternates} alternates" if alternates else ""), runs))
    for lines, suppliers in SIZES:
        carts = [hard_cart(seed, lines, suppliers) for seed in range(CARTS // 5)]
        runs = [cpu_ms(cart, names, HARD_LIMIT) for cart, names in carts]
        print(report(f"hard {lines} x {suppliers:2d}, limit {HARD_LIMIT * 1000:.0f} ms", runs))


if __name__ == "__main__":
    main()
