"""The sync script's keys, arguments and reply (``sync.lua``): what one ``EVALSHA`` carries.

KEYS, all under the fleet's prefix ``<p>``:

    <p>:workers   ZSET    live worker id → expiry (ms, Redis' clock)
    <p>:state     HASH    worker id → "name held want pool ... <ms of this record>"
    <p>:tokens    HASH    retry or hedge bucket → level
    <p>:epoch     STRING  when this state began (missing: Redis was emptied)
    <p>:ghosts    HASH    worker id → "<end of its grace, ms> <its part of the limit>":
                          one whose record lapsed, held back as it may still send
    <p>:server    STRING  "<run id> <s|f>": the server the fleet last synced on (s: found
                          by a switch)
    <p>:switched  STRING  when the fleet last found itself on another server (ms)
    <p>:safe      HASH    worker id → "<total> <total before> name now before ...": its
                          safe share by its last two syncs, each by its own catalogue

ARGV: worker id, ttl ms, limit, want-fresh ms, quiet ms, joined (0/1),
leaving (0/1), channel, n entries, may announce ``wanted`` (0/1), outage
grace ms, check the server (0/1), the server this worker last checked (its run
id, or empty), then per entry: name, held, want, tokens
deposited, whole tokens to withdraw, tokens in the pool, its share, its
bucket's capacity. Each supplier is an entry; so is each hedge bucket
(``HEDGE_ENTRY``: a share of 0, no slots).

Reply: ``HEAD`` fields (quiet, others waiting, allowed total, live workers,
announced ``wanted``, this worker's rank, moved to another server since its
last check, the server's run id when checked), then ``PER``
fields per supplier (granted, allowed, free, grantable — free but for the
whole limit —, tokens withdrawn, bucket level); hedge entries follow the
suppliers.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

SCRIPT: Final = resources.files("quoteflow.fleet").joinpath("sync.lua").read_text(encoding="utf-8")
"""The sync, one atomic step in Redis (``sync.lua``): read once, at import; run by ``EVALSHA``."""

HEDGE_ENTRY: Final = "{}#hedge"
"""A hedge bucket's name in Redis: an entry of its own beside the supplier's, holding no slots."""

HEAD: Final = 8
"""Fields of the reply before the first supplier's."""
PER: Final = 6
"""Fields of the reply per entry."""

SERVER_CHECK: Final = 1.0
"""Seconds between two looks at which server a sync runs on, while nothing failed.

A failover is seen at once by a worker whose sync fails (its next one looks);
one whose connections moved over without an error finds it within this.
"""


def keys(prefix: str) -> list[str]:
    """The script's KEYS, in its order (the module's docstring)."""
    names = ("workers", "state", "tokens", "epoch", "ghosts", "server", "switched", "safe")
    return [f"{prefix}:{name}" for name in names]


SWITCHED_KEY: Final = "{}:switched"
"""``<p>:switched``, which the callers' and suppliers' rate script reads too (``quota.lua``)."""


def entry(
    name: str,
    held: int,
    want: int,
    tokens: tuple[float, int, float],
    share: int,
    capacity: float,
) -> list[str | int]:
    """One entry's eight arguments; ``tokens``: deposited, withdrawn, in the pool."""
    deposit, withdraw, pool = tokens
    return [name, held, want, f"{deposit:.6f}", withdraw, f"{pool:.6f}", share, f"{capacity:.6f}"]


def text(value: bytes | str) -> str:
    """A reply's string field (redis-py gives bytes unless told to decode)."""
    return value.decode() if isinstance(value, bytes) else value
