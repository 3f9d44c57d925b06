"""Issue 50's failover figure: from a primary's death to every worker coordinating on the new one.

A primary, a replica and three sentinels (down-after 1 s, failover-timeout
3 s; ``tests/test_fleet_ha.Replicated``), two workers (coordinators) under
load through the sentinels. The primary is SIGKILLed; the time is until both
workers have synced on the promoted replica, having found the switch. Five
kills, each on fresh servers; the median is the figure (target: down-after
+ 2 s = 3 s).

    python -m bench.failover [--kills 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from tests.test_fleet import Meter
from tests.test_fleet_ha import Replicated, failover, fleet, kept, through_sentinels


async def one_kill(directory: Path) -> tuple[float, bool]:
    servers = Replicated(directory, introduced=False)  # they find each other, as deployed
    servers.start()
    try:
        settings = through_sentinels(tuple(("127.0.0.1", port) for port in servers.sentinels))
        meter = Meter()
        async with fleet([settings, settings], meter) as workers:
            return await failover(servers, workers, within=30.0), kept(meter)
    finally:
        servers.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args()
    times = []
    for kill in range(args.kills):
        with tempfile.TemporaryDirectory(prefix="quoteflow-failover-") as directory:
            took, kept = asyncio.run(one_kill(Path(directory)))
        times.append(took)
        print(
            f"kill {kill + 1}: every worker on the new primary after {took:.2f} s; "
            f"shares and limit kept: {kept}"
        )
    print(
        f"median of {len(times)}: {statistics.median(times):.2f} s "
        f"(min {min(times):.2f}, max {max(times):.2f})"
    )


if __name__ == "__main__":
    main()
