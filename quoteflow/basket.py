"""The cheapest basket: which supplier each line of a cart is bought from.

A cart quotes many lines (SKU and quantity) at many suppliers. Buying each
line at its own best quote pays one shipping per line; a basket pays each
supplier's shipping once, so a line may be cheaper bought a little dearer
from a supplier that ships something else anyway. ``solve`` finds the basket
of least total and proves it the least, or says it did not (``optimal``).

The problem
-----------
This is the Internet Shopping Optimization Problem, an uncapacitated facility
location problem (NP-hard). A supplier charges the *largest* ``shipping_cents``
among the lines bought from it, so a supplier is not one facility but a chain
of them: opened at shipping level ``L`` (one of the shipping values it quoted)
it may take the lines whose shipping there is at most ``L`` and costs ``L``
once. Each (supplier, level) is a facility; a line's cost at a facility is
its goods (``line_cents``). The best facility plan and the best basket cost the
same: opening two levels of one supplier never beats opening the higher alone.

How it is solved, and why this way
----------------------------------
Exact branch and bound over facilities, in pure Python:

- *Reduction.* No optimal basket buys a line at an offer dearer in goods
  alone than the line's best quote with its own shipping: moving the line to
  that quote costs at most the quote. Such offers are dropped first, 40–50 %
  of them on the bench's carts.
- *Lower bound: dual ascent, then dual adjustment* (Erlenkotter's DUALOC;
  ``_Dual``). Each line has a price that rises from its cheapest offer while
  every facility can still pay its charge from what the lines pay above their
  goods there; the prices sum to a lower bound (a feasible point of the dual
  of the linear programme). Adjustment lowers the price of a line that pays
  towards two facilities of the best plan, so that others may rise more. On
  carts like real ones that programme is integral (HiGHS found its optimum
  equal to the basket's on every bench cart tried), and the bound comes
  within a few cents of it.
- *Upper bound: local search* from the facilities the bound made tight:
  moves that open, close or re-level one supplier, all of them priced in one
  pass over the offers.
- *Reduced-cost fixing.* Opening a facility lifts the bound by its slack: one
  that would lift it to the best plan's cost is closed for the whole subtree.
- *Branching* on what is left: open one facility (its supplier at exactly that
  level) or close it. Of the bench's realistic carts, every 200 × 8 one is
  proven at the root, and 34 of 50 of the 200 × 32 ones (the rest in 3 to 5
  nodes).

Measured (``python -m bench.basket``; the figures are in its docstring), this
meets the targets with room to spare, where a MIP solver does not: HiGHS
(``highspy`` 1.16, which pip reaches) took about 20 ms for 200 lines × 8
suppliers and 100 ms for 200 × 32 on the same carts, solving alone, before
building its model from Python. So no dependency is added.

Carts built to be hard — prices within ±2 % everywhere and a different
shipping on every line — take seconds to prove, for HiGHS too; there the time
limit ends the search and the best basket found comes back with
``optimal=False``. The limit is checked for every line in the bound's and the
local search's loops, and the search stops early by as long as reading the
cart took, about what writing the answer costs: the answer comes within about
a millisecond of the limit (garbage collection aside), or one read of the cart
after it when the limit is shorter than that read. A first basket exists
before any search (``_first_basket``), so even a limit of 0 answers validly.

Ties, settled inside the search
-------------------------------
Among baskets of equal ``total_cents`` the one chosen has, in this order:

1. the fewest suppliers;
2. the most lines bought as their own SKU, not an alternate;
3. the earliest suppliers in catalogue order: the two sets' catalogue
   positions, sorted, compared lexicographically ({1st, 4th} beats {2nd, 3rd});
4. each line at the offer with the least ``line_cents`` among the chosen
   suppliers whose shipping fits under what that supplier is charged, its
   own SKU first, then its alternates in their order, then the earlier
   supplier in the catalogue.

Rules 1 to 3 are part of the objective: each supplier's charge and each
offer of an alternate carry a penalty far below one cent (``_Cart``), so the
search minimises one integer and every bound and prune stays exact. Rule 4
follows the shipping each supplier is charged;
when two plans of charges tie to the cent with the same suppliers (a rare
coincidence), the one returned is the one the search meets first: the same
input always gives the same basket.

Alternates
----------
A line with approved alternates is bought as any one of its SKUs, so a
supplier may offer it two ways. Of those only a staircase matters (each
offer shipping for less than the cheaper ones before it: ``_useful``), and
each of its offers serves its own step of the supplier's levels, so the
bound stays the dual of the same facility location problem. A cart with no
alternate searches exactly as before.

``per_line_total_cents`` is what buying each line at its own best quote would
cost: the quote ``service._rank`` puts first (least ``unit * quantity +
shipping``, then supplier name). Only that total is summed, so the name order
cannot change it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import attrs

from quoteflow.models import Basket, Pick, RankedQuote, Shipping

# -- inputs ----------------------------------------------------------------------


def _cents(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    # attrs' instance_of(int) accepts True and False; money never is.
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be an int of at least 0, got {value!r}")


def _quantity(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be an int of at least 1, got {value!r}")


def _offers(value: Iterable[Offer]) -> tuple[Offer, ...]:
    return tuple(value)


def _one_per_supplier(
    instance: object, attribute: attrs.Attribute[tuple[Offer, ...]], value: tuple[Offer, ...]
) -> None:
    names = [(offer.supplier, offer.sku) for offer in value]
    if len(set(names)) != len(names):
        raise ValueError(f"{attribute.name} must hold one offer per supplier and SKU, got {names}")


def _maybe_cents(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"{attribute.name} must be an int of at least 0 or None, got {value!r}")


@attrs.frozen
class Offer:
    """One supplier's usable quote for a line: a legal buy within its stock.

    Its goods cost ``line_cents`` when given (an offer priced by its legal buy
    and converted, ``offers.py``), else ``unit_cents`` × the line's quantity.
    """

    supplier: str
    unit_cents: int | None = attrs.field(validator=_maybe_cents)
    shipping_cents: int = attrs.field(validator=_cents)
    line_cents: int | None = attrs.field(default=None, validator=_maybe_cents)
    buy_quantity: int | None = None
    """Units bought, when that is not the line's quantity."""
    sku: str | None = None
    """The alternate this offer sells; None: the line's own SKU."""

    def __attrs_post_init__(self) -> None:
        if self.unit_cents is None and self.line_cents is None:
            raise ValueError("an offer needs unit_cents or line_cents")

    def goods(self, quantity: int) -> int:
        """What the line's goods cost at this offer, shipping apart."""
        if self.line_cents is not None:
            return self.line_cents
        assert self.unit_cents is not None
        return self.unit_cents * quantity

    @classmethod
    def of_quote(cls, quote: RankedQuote, alternate: bool = False) -> Offer:
        """The offer a ranked single quote makes; ``alternate``: it sells one of the line's."""
        return cls(
            quote.supplier,
            quote.unit_cents,
            quote.shipping_cents,
            quote.line_cents,
            quote.buy_quantity,
            quote.sku if alternate else None,
        )


def _alternates_offered(
    instance: Line, attribute: attrs.Attribute[tuple[Offer, ...]], value: tuple[Offer, ...]
) -> None:
    for offer in value:
        if offer.sku is not None and offer.sku not in instance.alternates:
            raise ValueError(f"an offer of {offer.sku!r}, not one of the line's alternates")


@attrs.frozen
class Line:
    """A line of the cart and its usable offers (none: no supplier quoted it).

    A line with ``alternates`` may hold an offer of each of its SKUs from each
    supplier; the basket buys it as any one of them.
    """

    sku: str
    quantity: int = attrs.field(validator=_quantity)
    offers: tuple[Offer, ...] = attrs.field(
        converter=_offers, validator=[_one_per_supplier, _alternates_offered]
    )
    alternates: tuple[str, ...] = ()
    """The line's approved alternates, in the buyer's order (the last tie rule)."""

    @classmethod
    def of_quotes(
        cls,
        sku: str,
        quantity: int,
        quotes: Iterable[RankedQuote],
        alternates: tuple[str, ...] = (),
    ) -> Line:
        """The line a single quote's (or a line's, over all its SKUs) ranked quotes make."""
        if not alternates:
            return cls(sku, quantity, [Offer.of_quote(quote) for quote in quotes])
        offers = [Offer.of_quote(quote, quote.sku != sku) for quote in quotes]
        return cls(sku, quantity, offers, alternates)


# -- the answer: ``models.Basket`` of ``models.Pick`` and ``models.Shipping`` ------


def solve(
    lines: Sequence[Line],
    suppliers: Sequence[str],
    *,
    time_limit: float | None = None,
    deadline: float | None = None,
) -> Basket:
    """The cheapest basket for ``lines``, ties settled by the catalogue order ``suppliers``.

    The search stops at ``time_limit`` seconds from now or at ``deadline``
    (``time.monotonic()``), whichever comes first, and then returns the best
    basket found with ``optimal=False``; a limit of 0 still returns a valid
    basket. With neither, it runs until the basket is proven optimal.

    Raises ``ValueError`` when an offer names a supplier not in ``suppliers``.
    """
    started = time.monotonic()
    if time_limit is not None:
        deadline = started + time_limit if deadline is None else min(deadline, started + time_limit)
    position = {name: at for at, name in enumerate(suppliers)}
    quoted: list[Line] = []
    rows: list[list[_Priced]] = []
    unquoted: list[str] = []
    alone: list[_Priced] = []
    """Each quoted line's own best quote (with its own shipping)."""
    per_line_total = floor = extra = alternated = 0
    for line in lines:
        if not line.offers:
            unquoted.append(line.sku)
            continue
        quantity = line.quantity
        try:
            row = [
                (o.goods(quantity), position[o.supplier], o.shipping_cents, o) for o in line.offers
            ]
        except KeyError as exc:
            raise ValueError(f"offer from {exc.args[0]!r}, not in the supplier order") from None
        totals = [p[0] + p[2] for p in row]
        best = min(totals)
        if line.alternates:
            row, own_best, alternate = _useful(row, best, line.alternates)
            alone.append(own_best)
            alternated += alternate
        else:
            alone.append(row[totals.index(best)])
            # An offer dearer in goods alone than the line's best quote with its own
            # shipping is in no optimal basket: moving the line to that quote costs
            # at most the quote. Dropped here, before anything else looks at offers.
            row = [p for p in row if p[0] <= best]
            # Cheapest first, the earlier supplier first on equal goods (tie rule 4);
            # a line has one offer per supplier, so the offers are never compared.
            row.sort()
        rows.append(row)
        quoted.append(line)
        per_line_total += best
        floor += row[0][0]
        extra = max(extra, best - row[0][0])
    if not quoted:
        return _basket(quoted, [], suppliers, per_line_total, tuple(unquoted), optimal=True)
    # With alternates, one supplier may sell a line two ways: the shortcut's
    # sums take one offer a line and know nothing of tie rule 2.
    single = None if alternated else _one_supplier(rows, floor + extra)
    if single is not None:
        chosen = [next(p[3] for p in row if p[1] == single) for row in rows]
        return _basket(quoted, chosen, suppliers, per_line_total, tuple(unquoted), optimal=True)
    if deadline is not None:
        # Building the search's view of the cart costs about what reading it did,
        # and so does writing the answer and freeing the search's lists: the
        # search stops that much before the deadline. With no time for even the
        # view, the first basket is the answer (see ``_first_basket``).
        now = time.monotonic()
        reading = now - started
        deadline -= reading
        if deadline - now < reading:
            chosen = _first_basket(rows, alone)
            return _basket(quoted, chosen, suppliers, per_line_total, tuple(unquoted), False)
    cart = _Cart(rows, alone, alternated)
    plan, optimal = _search(cart, deadline)
    return _basket(quoted, cart.picked(plan), suppliers, per_line_total, tuple(unquoted), optimal)


_Priced = tuple[int, int, int, Offer]
"""An offer for a line: its goods (``Offer.goods``), catalogue position, shipping, itself."""


def _useful(
    row: list[_Priced], best: int, alternates: tuple[str, ...]
) -> tuple[list[_Priced], _Priced, bool]:
    """The offers of a line with alternates that some optimal basket may take, in search order;
    the first of them with the least total (the line's own best quote); whether any sells an
    alternate.

    As for any line, none dearer in goods than ``best``. The order is the
    one the search prefers: cheapest goods, then the line's own SKU (tie rule
    2), then its alternates in their order, the earlier supplier, the lower
    shipping. Of one supplier's offers only a staircase is kept: each one
    ships for less than every offer before it there, as any later one that
    does not is never taken (an earlier one fits wherever it fits, and is
    preferred). A best quote set aside so has a kept twin as good.
    """
    rank: dict[str | None, int] = {sku: at for at, sku in enumerate(alternates, 1)}
    rank[None] = 0
    kept = [p for p in row if p[0] <= best]
    kept.sort(key=lambda p: (p[0], rank[p[3].sku], p[1], p[2]))
    lowest: dict[int, int] = {}
    useful = []
    alone = kept[0]
    least = alone[0] + alone[2]
    alternate = False
    for p in kept:
        if p[2] < lowest.get(p[1], p[2] + 1):
            lowest[p[1]] = p[2]
            useful.append(p)
            if p[0] + p[2] < least:
                alone, least = p, p[0] + p[2]
            alternate = alternate or p[3].sku is not None
    return useful, alone, alternate


def _basket(
    quoted: Sequence[Line],
    chosen: Sequence[Offer],
    suppliers: Sequence[str],
    per_line_total: int,
    unquoted: tuple[str, ...],
    optimal: bool,
) -> Basket:
    """The answer for ``chosen``, the offer taken for each quoted line."""
    picks = tuple(
        Pick(
            sku=line.sku,
            quantity=line.quantity,
            supplier=offer.supplier,
            unit_cents=offer.unit_cents,
            bought_sku=offer.sku or line.sku,
            line_cents=offer.goods(line.quantity),
            buy_quantity=offer.buy_quantity,
        )
        for line, offer in zip(quoted, chosen, strict=True)
    )
    charged: dict[str, int] = {}
    for offer in chosen:
        charged[offer.supplier] = max(charged.get(offer.supplier, 0), offer.shipping_cents)
    shipping = tuple(Shipping(name, charged[name]) for name in suppliers if name in charged)
    return Basket(
        picks=picks,
        shipping=shipping,
        total_cents=sum(pick.line_cents for pick in picks) + sum(charged.values()),
        per_line_total_cents=per_line_total,
        complete=not unquoted,
        unquoted=unquoted,
        optimal=optimal,
    )


def _first_basket(rows: list[list[_Priced]], alone: list[_Priced]) -> list[Offer]:
    """The suppliers of each line's own best quote, each line at its cheapest offer among them.

    The offer must fit under what its supplier is charged, the largest shipping
    of those best quotes: a line moved there adds no shipping (tie rule 3).
    """
    charged: dict[int, int] = {}
    for _, at, shipping, _ in alone:
        charged[at] = max(charged.get(at, 0), shipping)
    return [next(p[3] for p in row if p[2] <= charged.get(p[1], -1)) for row in rows]


def _one_supplier(rows: list[list[_Priced]], floor: int) -> int | None:
    """The catalogue position of the one supplier to buy everything from, when proven best.

    ``floor`` is every line's cheapest goods plus, for the one line where it
    is most, the rest of that line's best quote: no basket costs less, since
    the supplier a line goes to charges at least that line's shipping. A
    one-supplier basket that reaches it is optimal, and one supplier is the
    fewest. It is the cart one supplier sells cheapest, at one pass's cost.

    (Every line's best quote being at one supplier is not enough: lines a
    little cheaper elsewhere may share one low shipping there.)
    """
    everywhere = {p[1] for p in rows[0]}
    for row in rows:
        everywhere.intersection_update([p[1] for p in row])
        if not everywhere:
            return None
    goods = dict.fromkeys(everywhere, 0)
    shipping = dict.fromkeys(everywhere, 0)
    for row in rows:
        for spent, at, charge, _ in row:
            if at in goods:
                goods[at] += spent
                shipping[at] = max(shipping[at], charge)
    best = min(everywhere, key=lambda at: (goods[at] + shipping[at], at))
    return best if goods[best] + shipping[best] == floor else None


# -- the search ------------------------------------------------------------------
#
# Everything below works on plain lists of ints: the search touches every
# offer a few times per node, and attribute lookups on attrs classes would
# cost more than the arithmetic.
#
# Facilities are numbered supplier by supplier in catalogue order, each
# supplier's levels lowest first. A plan is a list with one entry per
# supplier: -1 when it is not bought from, else the facility (so the level) it
# is charged at; an offer at facility f fits supplier j when f <= plan[j]. A
# node's state is a list with one entry per facility: 0 free, 1 open, -1 closed.

_FREE = 0
_OPEN = 1
_CLOSED = -1


class _OutOfTime(Exception):
    """The deadline came: the search keeps the best plan it has."""


class _Cart:
    """A cart as the search reads it: scaled costs, facilities, each line's useful offers."""

    def __init__(self, rows: list[list[_Priced]], alone: list[_Priced], alternated: int) -> None:
        pairs = sorted({(p[1], p[2]) for row in rows for p in row})
        # Only suppliers with a useful offer take part, in catalogue order.
        taking = sorted({at for at, _ in pairs})
        index = [-1] * (taking[-1] + 1)
        for j, at in enumerate(taking):
            index[at] = j
        n = self.n = len(taking)
        # Costs are scaled so that the tie rules fit below one cent. A supplier's
        # penalty is each - 2**(n-1-j), an offer of an alternate's is 2**n: with
        # each = (alternated + 1) * 2**n, fewer suppliers win first (all the
        # alternates and catalogue bits together stay below each), then fewer
        # alternates (the bits stay below 2**n), then earlier suppliers (the
        # bits order the sets lexicographically); all penalties together stay
        # below scale. With no alternate this is n << n, as it always was.
        each = (alternated + 1) << n
        scale = n * each + (alternated << n)
        self.cost = [shipping * scale + each - (1 << (n - 1 - index[at])) for at, shipping in pairs]
        """Each facility's charge: its shipping, scaled, and its supplier's penalty."""
        self.owner = [index[at] for at, _ in pairs]
        """Each facility's supplier."""
        self.first = [self.owner.index(j) for j in range(n)]
        """Each supplier's first (lowest) facility."""
        end = self.end = [*self.first[1:], len(pairs)]
        """One past each supplier's last (highest) facility."""
        facility = {pair: f for f, pair in enumerate(pairs)}
        if alternated:
            alternate = 1 << n
            self.offers = [
                [
                    (goods * scale + (alternate if o.sku else 0), index[at], facility[at, shipping])
                    for goods, at, shipping, o in row
                ]
                for row in rows
            ]
        else:
            self.offers = [
                [
                    (goods * scale, index[at], facility[at, shipping])
                    for goods, at, shipping, _ in row
                ]
                for row in rows
            ]
        """Each line's useful offers as (scaled goods, supplier, facility), in ``rows`` order."""
        self.tops: list[list[int] | None] | None = None
        """For each line, one past the last facility each offer serves, where one supplier
        sells it two ways (``_useful``'s staircase: a dearer offer serves the levels below the
        cheaper one's); None for a line with one offer a supplier, or when every line has."""
        for i, row in enumerate(self.offers if alternated else ()):
            seen: dict[int, int] = {}
            tops = []
            for _, j, f in row:
                tops.append(seen.get(j, end[j]))
                seen[j] = f
            if len(seen) < len(row):
                if self.tops is None:
                    self.tops = [None] * len(rows)
                self.tops[i] = tops
        self.reach: list[list[tuple[int, int, Sequence[int]]]]
        """Each line's offers as the bound reads them: (scaled goods, facility, those it serves)."""
        if self.tops is None:
            self.reach = [[(goods, f, range(f, end[j])) for goods, j, f in r] for r in self.offers]
        else:
            self.reach = [
                [
                    (goods, f, range(f, end[j] if top is None else top[k]))
                    for k, (goods, j, f) in enumerate(row)
                ]
                for row, top in zip(self.offers, self.tops, strict=True)
            ]
        self.sources = [[p[3] for p in row] for row in rows]
        self.alone = [-1] * n
        """The plan of each line at its own best quote: the first basket, before any search."""
        for _, at, shipping, _ in alone:
            j = index[at]
            self.alone[j] = max(self.alone[j], facility[at, shipping])
        # Dual ascent raises the lines with the fewest offers first: they have
        # the least choice of where to pay. Measured against request order and
        # most-offers-first, it branches 2-8 times less on the bench's carts.
        self.order = sorted(range(len(rows)), key=lambda i: len(self.offers[i]))
        self.beyond = sum(row[-1][0] for row in self.offers) + sum(self.cost) + 1
        """More than any plan costs: stands for "no such offer"."""

    def picked(self, plan: list[int]) -> list[Offer]:
        """The offer each line takes under ``plan`` (tie rule 3)."""
        chosen = []
        for row, sources in zip(self.offers, self.sources, strict=True):
            # The first offer that fits is the cheapest, the earlier supplier on a tie.
            k = next(k for k, (_, j, f) in enumerate(row) if f <= plan[j])
            chosen.append(sources[k])
        return chosen


_Prices = tuple[int, list[int], list[int], list[int]]
"""What a plan costs (scaled), and each line's best cost, its supplier, and its second best."""


def _price(cart: _Cart, plan: list[int]) -> _Prices | None:
    """What ``plan`` costs; None when some line has no offer that fits it."""
    if cart.tops is not None:
        return _price_stairs(cart, plan)
    cost = sum(cart.cost[f] for f in plan if f >= 0)
    best: list[int] = []
    second: list[int] = []
    at: list[int] = []
    beyond = cart.beyond
    for row in cart.offers:
        first = -1
        for goods, j, f in row:
            if f <= plan[j]:
                if first < 0:
                    first = goods
                    at.append(j)
                else:
                    second.append(goods)
                    break
        else:
            if first < 0:
                return None
            second.append(beyond)
        best.append(first)
        cost += first
    return cost, best, at, second


def _price_stairs(cart: _Cart, plan: list[int]) -> _Prices | None:
    """``_price`` where a supplier may sell a line two ways: a line's second best is
    its best at another supplier, what it falls back to when its own is dropped."""
    cost = sum(cart.cost[f] for f in plan if f >= 0)
    best: list[int] = []
    second: list[int] = []
    at: list[int] = []
    beyond = cart.beyond
    for row in cart.offers:
        first = a = -1
        for goods, j, f in row:
            if f <= plan[j]:
                if first < 0:
                    first, a = goods, j
                    at.append(j)
                elif j != a:
                    second.append(goods)
                    break
        else:
            if first < 0:
                return None
            second.append(beyond)
        best.append(first)
        cost += first
    return cost, best, at, second


def _tally_stairs(
    cart: _Cart, plan: list[int], priced: _Prices, slots: int, deadline: float | None
) -> tuple[list[int], list[int]]:
    """``_improve``'s pass where a supplier may sell a line two ways (``_Cart.tops``).

    An offer serves only its step of its supplier's levels: a line gains from
    a supplier moved onto that step, and a line whose supplier moves below
    its offer falls to the step it lands on or to its second best elsewhere,
    whichever is cheaper.
    """
    _, best, at, second = priced
    first, end = cart.first, cart.end
    loss = [0] * slots
    gain = [0] * slots
    tops = cart.tops
    assert tops is not None
    for row, top, b, a, s in zip(cart.offers, tops, best, at, second, strict=True):
        if deadline is not None and time.monotonic() >= deadline:
            raise _OutOfTime
        bought = False
        for k, (goods, j, f) in enumerate(row):
            hi = end[j] if top is None else top[k]
            # Slot end[j] + j + 1 is the next supplier's: a step to the top needs no end mark.
            if bought:
                if goods >= s:
                    break
                if j == a:
                    loss[f + j + 1] -= s - goods
                    if hi < end[j]:
                        loss[hi + j + 1] += s - goods
            elif j == a and f <= plan[j]:
                loss[first[j] + j] += s - b
                loss[f + j + 1] -= s - b
                if top is None:
                    break
                bought = True
            elif goods < b:
                gain[f + j + 1] += b - goods
                if hi < end[j]:
                    gain[hi + j + 1] -= b - goods
    return loss, gain


def _improve(
    cart: _Cart, plan: list[int], allowed: list[list[bool] | None], deadline: float | None
) -> tuple[list[int], _Prices | None]:
    """Local search from ``plan``: the best single-supplier change, until none helps.

    ``allowed[j][k]`` says whether supplier ``j`` may move to its ``k``-th
    facility (``k = 0``: not bought from, ``k = 1``: its lowest level); None
    when its facility is fixed. Every supplier's change to every level is
    priced in one pass over the offers: a line at ``j`` falls back to its
    second best when ``j`` drops below the line's level; a line elsewhere
    gains when ``j`` comes to fit it more cheaply.
    """
    priced = _price(cart, plan)
    if priced is None:
        return plan, None
    charge, first = cart.cost, cart.first
    # Supplier j's moves are slots first[j] + j (not bought from) to end[j] + j.
    slots = len(charge) + cart.n
    while True:
        _, best, at, second = priced
        if cart.tops is not None:
            loss, gain = _tally_stairs(cart, plan, priced, slots, deadline)
        else:
            loss = [0] * slots
            gain = [0] * slots
            for row, b, a, s in zip(cart.offers, best, at, second, strict=True):
                if deadline is not None and time.monotonic() >= deadline:
                    raise _OutOfTime
                for goods, j, f in row:
                    if j == a:
                        # Closed or below this level, the line falls back to its second best.
                        loss[first[j] + j] += s - b
                        loss[f + j + 1] -= s - b
                        break
                    if goods < b:
                        gain[f + j + 1] += b - goods
        move_by = 0
        move = (-1, -1)
        for j, may in enumerate(allowed):
            if may is None:
                continue
            now = plan[j]
            now_charge = charge[now] if now >= 0 else 0
            lost = gained = 0
            slot = first[j] + j
            for k, ok in enumerate(may):
                lost += loss[slot + k]
                gained += gain[slot + k]
                to = first[j] + k - 1 if k else -1
                if ok and to != now:
                    by = (charge[to] if k else 0) - now_charge + lost - gained
                    if by < move_by:
                        move_by, move = by, (j, to)
        if not move_by:
            return plan, priced
        plan = plan.copy()
        plan[move[0]] = move[1]
        priced = _price(cart, plan)
        assert priced is not None  # a move that strands a line costs ``beyond``


class _Dual:
    """A lower bound for a node: the dual of its linear programme, raised by ascent.

    Each line has a price (its dual value), at first its cheapest goods. A
    line pays each facility that may serve it what its price exceeds its
    goods there; a facility's slack is its charge less what its lines pay.
    While no slack is negative the prices sum to a lower bound on every plan
    in the node (a feasible dual point). Ascent raises each price, one offer
    at a time, as far as the slack of what it pays towards allows; an open
    facility has no slack (its charge is counted in the bound instead).
    """

    def __init__(self, cart: _Cart, state: list[int], deadline: float | None) -> None:
        self._cart = cart
        self._deadline = deadline
        charge, owner = cart.cost, cart.owner
        self._slack = [c if s == _FREE else 0 for c, s in zip(charge, state, strict=True)]
        self._fixed = sum(c for c, s in zip(charge, state, strict=True) if s == _OPEN)
        narrowed = [False] * cart.n
        for f, s in enumerate(state):
            if s == _CLOSED:
                narrowed[owner[f]] = True
        self._rows: list[list[tuple[int, int, Sequence[int]]]] = []
        """Each line's offers as (scaled goods, facility, the facilities that may serve it)."""
        self._price: list[int] = []
        self._paying: list[list[Sequence[int]]] = []
        """What each line pays towards: the facilities of every offer at or below its price.

        Kept offer by offer, not flattened: with many shipping levels a flat list
        is hundreds of thousands of ints, and freeing it alone takes milliseconds."""
        self._step: list[int] = []
        """Each line's next offer above its price."""
        self.feasible = True
        """False when the node leaves some line no offer."""
        narrowing = any(narrowed)
        for reachable in cart.reach:
            # Checked for each line, as in ``_rise``: with many levels this is long.
            if deadline is not None and time.monotonic() >= deadline:
                raise _OutOfTime
            reach: list[tuple[int, int, Sequence[int]]] = reachable
            if narrowing:
                reach = []
                for goods, f, serving in reachable:
                    if narrowed[owner[f]]:
                        open_ = [g for g in serving if state[g] != _CLOSED]
                        if not open_:
                            continue
                        serving = open_
                    reach.append((goods, f, serving))
            if not reach:
                self.feasible = False
                break
            self._rows.append(reach)
            self._price.append(reach[0][0])
            facilities: list[Sequence[int]] = []
            k = 0
            while k < len(reach) and reach[k][0] == reach[0][0]:
                facilities.append(reach[k][2])
                k += 1
            self._paying.append(facilities)
            self._step.append(k)
        else:
            self._rise(cart.order)
        self.bound = self._fixed + sum(self._price)
        """The best lower bound found for the node (scaled)."""
        self.slack = self._slack
        """Each facility's slack at ``bound``."""

    def _rise(self, rising: list[int]) -> None:
        """Raise the prices of ``rising`` (in that order) until none can rise."""
        rows, step, price = self._rows, self._step, self._price
        paying, slack = self._paying, self._slack
        beyond, deadline = self._cart.beyond, self._deadline
        while rising:
            still: list[int] = []
            for i in rising:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _OutOfTime
                reach, k = rows[i], step[i]
                target = reach[k][0] if k < len(reach) else beyond
                by = target - price[i]
                facilities = paying[i]
                for serving in facilities:
                    for f in serving:
                        if slack[f] < by:
                            by = slack[f]
                    if not by:
                        break
                if not by:
                    continue  # blocked until some slack is given back
                for serving in facilities:
                    for f in serving:
                        slack[f] -= by
                price[i] += by
                if price[i] == target:
                    # One step per pass, so that every line gets its share of the slack.
                    while k < len(reach) and reach[k][0] == target:
                        facilities.append(reach[k][2])
                        k += 1
                    step[i] = k
                    still.append(i)
            rising = still

    def adjust(self, plan: list[int]) -> None:
        """Erlenkotter's dual adjustment: trade one line's price for several others'.

        A line that pays towards two or more tight facilities of ``plan`` holds
        slack the plan cannot use: a basket buys the line once. Its price goes
        down to its next lower offer, giving that slack back; the lines blocked
        there rise first, then the line itself, then all. When two lines rise
        where one fell, the bound grows. On the bench's carts this closes most
        of the gap ascent leaves, and the tree shrinks from hundreds of nodes
        to a few on the worst of them.
        """
        cart, owner, deadline = self._cart, self._cart.owner, self._deadline
        rows, step, price = self._rows, self._step, self._price
        paying, slack = self._paying, self._slack
        # Kept apart from here: the bound is the best point met, and the slack is its.
        self.slack = slack.copy()
        for i in cart.order:
            reach, k, paid = rows[i], step[i], price[i]
            held = 0
            lower = -1
            for n, (goods, f, _) in enumerate(reach[:k]):
                if goods >= paid:
                    break
                lower = n
                at = plan[owner[f]]
                if at >= f and not slack[at]:
                    held += 1
            if held < 2:
                continue
            by = paid - reach[lower][0]
            freed: set[int] = set()
            facilities: list[Sequence[int]] = []
            for _, _, serving in reach[: lower + 1]:
                for f in serving:
                    if not slack[f]:
                        freed.add(f)
                    slack[f] += by
                facilities.append(serving)
            price[i] -= by
            paying[i] = facilities
            step[i] = lower + 1
            blocked = []
            for o in cart.order:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _OutOfTime
                if o != i and not all(freed.isdisjoint(serving) for serving in paying[o]):
                    blocked.append(o)
            self._rise(blocked)
            self._rise([i])
            self._rise(cart.order)
            bound = self._fixed + sum(price)
            if bound > self.bound:
                self.bound = bound
                self.slack = slack.copy()


def _search(cart: _Cart, deadline: float | None) -> tuple[list[int], bool]:
    """The best plan, and whether it is proven optimal (the deadline did not come first)."""
    incumbent = cart.alone
    priced = _price(cart, incumbent)
    assert priced is not None  # every line has its own best quote
    ceiling = priced[0]
    stack = [[_FREE] * len(cart.cost)]
    try:
        while stack:
            state = stack.pop()
            dual = _Dual(cart, state, deadline)
            if not dual.feasible or dual.bound >= ceiling:
                continue
            plan, allowed = _start(cart, state, dual.slack)
            plan, found = _improve(cart, plan, allowed, deadline)
            if found is not None and found[0] < ceiling:
                ceiling, incumbent = found[0], plan
            if dual.bound < ceiling:
                dual.adjust(plan)
            if dual.bound >= ceiling:
                continue
            # Reduced-cost fixing: opening f lifts the bound by its slack, so a
            # facility that would lift it to the best plan's cost is closed for
            # the whole subtree. It leaves a handful of facilities to branch on.
            state = [
                _CLOSED if s == _FREE and dual.bound + gap >= ceiling else s
                for s, gap in zip(state, dual.slack, strict=True)
            ]
            f = _branch_on(state, plan, found)
            if f is None:
                continue
            opened = state.copy()
            j = cart.owner[f]
            for g in range(cart.first[j], cart.end[j]):
                opened[g] = _CLOSED
            opened[f] = _OPEN
            closed = state.copy()
            closed[f] = _CLOSED
            stack.append(opened)
            stack.append(closed)
    except _OutOfTime:
        return incumbent, False
    return incumbent, True


def _start(
    cart: _Cart, state: list[int], slack: list[int]
) -> tuple[list[int], list[list[bool] | None]]:
    """A node's first plan (each supplier at its highest tight level) and what may change."""
    plan = [-1] * cart.n
    allowed: list[list[bool] | None] = []
    for first, end in zip(cart.first, cart.end, strict=True):
        facilities = range(first, end)
        opened = [f for f in facilities if state[f] == _OPEN]
        if opened:
            plan[cart.owner[first]] = opened[0]
            allowed.append(None)
            continue
        allowed.append([True, *(state[f] == _FREE for f in facilities)])
        tight = [f for f in facilities if state[f] == _FREE and slack[f] == 0]
        if tight:
            plan[cart.owner[first]] = tight[-1]
    return plan, allowed


def _branch_on(state: list[int], plan: list[int], priced: _Prices | None) -> int | None:
    """The free facility to branch on: the open one of ``plan`` whose lines lose most without it."""
    weight: dict[int, int] = {}
    if priced is not None:
        _, best, at, second = priced
        for b, a, s in zip(best, at, second, strict=True):
            f = plan[a]
            if state[f] == _FREE:
                weight[f] = weight.get(f, 0) + s - b
    if weight:
        return max(weight, key=lambda f: (weight[f], -f))
    return next((f for f, s in enumerate(state) if s == _FREE), None)
