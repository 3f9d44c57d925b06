"""``python -m bench.lateness_probe``: QuoteFlow, instrumented: where is a cut-off answer late?

Started by ``bench/lateness.py`` with QuoteFlow's own flags; measures nothing
QuoteFlow does not do anyway, by wrapping at start-up:

- ``QuoteService.quote``: for a fan-out cut off by its deadline (its bill
  has a supplier ``stopped: deadline``), how late the deadline's timer ran
  (seen by a timer due at the same loop time), how late the fan-out came
  back to the service, ``elapsed_ms``, and, on asyncio's own loop, how many
  loop turns lay between the two (uvloop offers no hook to count them);
- a task that sleeps 5 ms again and again: how late the loop runs all along.

At exit the samples go to the JSON file named by ``LATENESS_OUT``, in seconds.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from quoteflow import cli, service
from quoteflow.models import STOPPED_DEADLINE, QuoteReport

SAMPLES: dict[str, list[float]] = {"fired": [], "came_back": [], "elapsed": [], "lag": []}
TURNS: list[int] = []
"""Loop turns from the timer to the service going on (asyncio's loop only)."""
_turn = 0
_fired: dict[int, tuple[float, int]] = {}
"""When each request's deadline came (monotonic lateness, loop turn), by task id."""


def _count_turns() -> None:
    """Count asyncio's loop turns (``BaseEventLoop._run_once``); uvloop has no such hook."""
    loop_class = asyncio.base_events.BaseEventLoop
    run_once: Callable[[asyncio.base_events.BaseEventLoop], None] = getattr(  # noqa: B009
        loop_class, "_run_once"
    )

    def counted(loop: asyncio.base_events.BaseEventLoop) -> None:
        global _turn
        _turn += 1
        run_once(loop)

    setattr(loop_class, "_run_once", counted)  # noqa: B010 -- not in the type stubs


def _wrap_quote() -> None:
    quote = service.QuoteService.quote

    async def measured(
        self: service.QuoteService, request: Any, request_id: str, admitted_at: float, *rest: Any
    ) -> QuoteReport:
        # A timer due at the same loop time as the service's deadline (which
        # the service sets from the same figures a few µs later): it runs in
        # the same loop turn, so how late it runs is how late that one did.
        loop = asyncio.get_running_loop()
        deadline = admitted_at + self._budget - self._answer_reserve
        key = id(asyncio.current_task())

        def due() -> None:
            _fired[key] = (time.monotonic() - deadline, _turn)

        beside = loop.call_at(loop.time() + deadline - time.monotonic(), due)
        try:
            report = await quote(self, request, request_id, admitted_at, *rest)
        finally:
            beside.cancel()
            fired = _fired.pop(key, None)
        now = time.monotonic()
        if any(trace.stopped == STOPPED_DEADLINE for trace in report.traces):
            SAMPLES["came_back"].append(now - report.deadline)
            SAMPLES["elapsed"].append(report.result.elapsed_ms / 1000)
            if fired is not None:
                late, turn = fired
                SAMPLES["fired"].append(late)
                if _turn:
                    TURNS.append(_turn - turn)
        return report

    setattr(service.QuoteService, "quote", measured)  # noqa: B010 -- mypy: no method assignment


def _with_lag_monitor() -> None:
    run = cli._run

    async def monitored(*args: Any, **kwargs: Any) -> None:
        async def monitor() -> None:
            while True:
                wanted = time.monotonic() + 0.005
                await asyncio.sleep(0.005)
                SAMPLES["lag"].append(time.monotonic() - wanted)

        task = asyncio.get_running_loop().create_task(monitor())
        try:
            await run(*args, **kwargs)
        finally:
            task.cancel()

    setattr(cli, "_run", monitored)  # noqa: B010 -- mypy: no function assignment


def _dump() -> None:
    with open(os.environ["LATENESS_OUT"], "w", encoding="utf-8") as out:
        json.dump({**SAMPLES, "turns": TURNS}, out)


def main(argv: list[str]) -> int:
    """Run QuoteFlow with ``argv``, instrumented; write the samples at exit."""
    _wrap_quote()
    _with_lag_monitor()
    _count_turns()
    atexit.register(_dump)
    return cli.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
