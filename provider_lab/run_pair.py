"""``make run``: the provider lab and QuoteFlow together, until Ctrl-C.

Starts ``python -m provider_lab`` and ``python -m quoteflow`` (pointed at the
lab) as child processes, and a second QuoteFlow asking the lab's foreign
dialects: docs/suppliers.md's three worked suppliers (atlas classic; boreal
POST JSON with an OAuth2 token and price breaks; cedar with the SKU in the
path and an API key), from a catalogue file written for the lab's address,
with the lab's two secrets in its environment, and a third QuoteFlow asking
atlas, boreal and cedar in the lab's batch dialect (docs/suppliers.md's "Batch
suppliers": up to 20 lines of a cart per call), from a catalogue file written
for the lab's address too, and a fourth, hedged (``--hedge`` and none of the
flags after ``--``), asking the lab as the first does, for a supplier with a
tail (``BOREAL_TAIL``, switched on by hand or by ``make demo``). Those three
start once the lab answers, so the first token fetch finds the token endpoint
up. Every QuoteFlow prices offers in another
currency at the lab's daily rates in the ECB's format (``--fx-rates``), fetched
every ``FX_REFRESH_S`` seconds (``--fx-refresh 1``, not the hourly default), so a
rate changed at the lab's ``/fx`` control, or a stale or failing feed, shows in
the answers within seconds (``make demo`` does that). Waits until all answer ``GET
/health``, prints where they are and ready-to-paste ``curl`` lines, and on
SIGINT/SIGTERM stops the QuoteFlows, then the lab, escalating to SIGKILL after
a few seconds. If any child dies, the others are stopped too. QuoteFlow is
only ever a process here, never imported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import aiohttp

from provider_lab.state import LabConfig

READY_WITHIN_S: Final = 20.0
STOP_WITHIN_S: Final = 5.0

WRITTEN_FOR: Final = "http://127.0.0.1:9101"
WORKED_SUPPLIERS: Final = """\
# Classic: QuoteFlow's own protocol, GET {url}?sku=&scenario=.
[[supplier]]
name = "atlas"
url = "http://127.0.0.1:9101/quotes/atlas"

# POST JSON with a bearer token from an OAuth2 token endpoint; the answer is
# a price list in euros (price breaks), read by an adapter that sees the quantity.
[[supplier]]
name = "boreal"
method = "POST"
url = "http://127.0.0.1:9101/json/boreal/quote"
adapter = "provider_lab.adapters:json_dialect"

[supplier.body]
items = [ { partNumber = "{sku}", quantity = "{quantity}" } ]
scenario = "{scenario}"

[supplier.oauth2]
token_url = "http://127.0.0.1:9101/oauth2/token"
client_id = "quoteflow"
client_secret = "${LAB_CLIENT_SECRET}"

# The SKU in the path, an API key and the quantity in the query; the supplier
# prices the quantity itself.
[[supplier]]
name = "cedar"
url = "http://127.0.0.1:9101/path/cedar/parts/{sku}/price"
query = { qty = "{quantity}", key = "${LAB_API_KEY}", scenario = "{scenario}" }
adapter = "provider_lab.adapters:path_dialect"
"""
"""docs/suppliers.md's "Three worked suppliers", as the page has them (a test compares)."""

_LAB: Final = LabConfig()
LAB_SECRETS: Final = {
    "LAB_CLIENT_SECRET": _LAB.client_secret,
    "LAB_API_KEY": _LAB.api_key or "",
}
"""The worked catalogue's ``${VAR}`` values: the lab's default credentials."""


DIALECTS_PORT: Final = 9103
"""The worked suppliers' QuoteFlow (9102 is ``make fleet``'s redis-server)."""

BATCH_MAX_ITEMS: Final = 20
BATCH_SUPPLIERS: Final = """\
# The lab's batch dialect: many parts per call, read by its adapter.
[[supplier]]
name = "atlas"
method = "POST"
url = "http://127.0.0.1:9101/batch/atlas/match"
adapter = "provider_lab.adapters:batch_dialect"
body = { parts = [ { mpn = "{sku}", qty = "{quantity}" } ], scenario = "{scenario}" }
batch = { max_items = 20, items = "parts" }

[[supplier]]
name = "boreal"
method = "POST"
url = "http://127.0.0.1:9101/batch/boreal/match"
adapter = "provider_lab.adapters:batch_dialect"
body = { parts = [ { mpn = "{sku}", qty = "{quantity}" } ], scenario = "{scenario}" }
batch = { max_items = 20, items = "parts" }

[[supplier]]
name = "cedar"
method = "POST"
url = "http://127.0.0.1:9101/batch/cedar/match"
adapter = "provider_lab.adapters:batch_dialect"
body = { parts = [ { mpn = "{sku}", qty = "{quantity}" } ], scenario = "{scenario}" }
batch = { max_items = 20, items = "parts" }
"""
"""The lab's three suppliers in its batch dialect (docs/suppliers.md's "Batch suppliers"):
a cart's lines in calls of up to ``BATCH_MAX_ITEMS``, a single quote as a call of one."""

BATCH_PORT: Final = 9104
"""The batch suppliers' QuoteFlow."""

CART_SKUS: Final = tuple(f"BOM-{n:03d}" for n in range(1, 6))
CART_QUANTITY: Final = 2
"""The banner's cart: line by line cedar (shipping for least) is cheapest, but bought all
from atlas (shipping for most, lower unit prices), shipping paid once, it costs less."""


HEDGED_PORT: Final = 9105
"""The hedged QuoteFlow: ``--hedge``, pointed at the lab as the first one is."""
BOREAL_TAIL: Final = {"kind": "latency", "ms": 200, "sigma": 0.9}
"""boreal's lognormal tail (``bench/tails.py``'s): median 200 ms, about 6 % of its answers past
the 0.8 s budget; what the banner's curl and ``make demo``'s hedge case switch on."""


FX_REFRESH_S: Final = 1
"""Seconds between two fetches of the lab's rates by each QuoteFlow (``--fx-refresh``)."""


def rates_url(lab_url: str) -> str:
    """The lab's daily exchange rates, in the ECB's format (``GET /fx/eurofxref-daily.xml``)."""
    return f"{lab_url}/fx/eurofxref-daily.xml"


def worked_catalogue(lab_url: str) -> str:
    """The three worked suppliers' catalogue, pointed at the lab at ``lab_url``."""
    return WORKED_SUPPLIERS.replace(WRITTEN_FOR, lab_url)


def batch_catalogue(lab_url: str) -> str:
    """The batch suppliers' catalogue, pointed at the lab at ``lab_url``."""
    return BATCH_SUPPLIERS.replace(WRITTEN_FOR, lab_url)


async def wait_ready(
    url: str, process: asyncio.subprocess.Process, session: aiohttp.ClientSession
) -> bool:
    """Poll ``url/health`` until it answers 200; ``False`` if the process exits first."""
    loop = asyncio.get_running_loop()
    end = loop.time() + READY_WITHIN_S
    while loop.time() < end and process.returncode is None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(f"{url}/health") as response:
                if response.status == 200:
                    return True
        await asyncio.sleep(0.1)
    return False


async def stop_child(process: asyncio.subprocess.Process, within_s: float = STOP_WITHIN_S) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``within_s`` seconds."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), within_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def cart_body(skus: Sequence[str] = CART_SKUS, quantity: int = CART_QUANTITY) -> str:
    """A cart of ``skus``, each at ``quantity``, as compact JSON (the banner's curl)."""
    lines = [{"sku": sku, "quantity": quantity} for sku in skus]
    return json.dumps({"lines": lines}, separators=(",", ":"))


def _banner(
    lab_url: str,
    service_url: str,
    extra: Sequence[str] = (),
    dialects_url: str | None = None,
    batch_url: str | None = None,
    console: bool = False,
    hedged_url: str | None = None,
) -> str:
    body = '{"quantity":2,"scenario":"flaky"}'
    lines = [
        f"provider lab  {lab_url}   (faults: {lab_url}/faults, stats: {lab_url}/stats)",
        f"QuoteFlow     {service_url}",
    ]
    if console:
        lines.append(
            f"console       {service_url}/console   (open it in a browser: ask, burst, switch "
            "the lab's faults, every bill drawn as a waterfall)"
        )
    lines.append(
        f"rates         {rates_url(lab_url)}   (the ECB's daily format; every QuoteFlow "
        f"fetches it every {FX_REFRESH_S} s, --fx-refresh {FX_REFRESH_S}; control: {lab_url}/fx)"
    )
    if dialects_url is not None:
        lines.append(
            f"QuoteFlow     {dialects_url}   (docs/suppliers.md's worked suppliers: "
            "boreal by POST JSON + OAuth2, cedar by path + API key)"
        )
    if batch_url is not None:
        lines.append(
            f"QuoteFlow     {batch_url}   (batch suppliers: atlas, boreal and cedar in the lab's "
            f"batch dialect, up to {BATCH_MAX_ITEMS} cart lines a call)"
        )
    if hedged_url is not None:
        lines.append(
            f"QuoteFlow     {hedged_url}   (hedged, --hedge: a second attempt once the first is "
            "out past the supplier's 0.65 percentile of recent answer times, after 10 answers)"
        )
    lines += [
        "",
        "Try:",
        f"  curl -s -X POST {service_url}/api/quotes "
        f"-H 'Content-Type: application/json' -d '{body}'",
    ]
    if "--cache-size" in extra:
        lines += [
            "and, to see the quote cache (ask twice: boreal's quote comes back with age_s):",
            f'  curl -s -X PUT {lab_url}/cache-control/boreal -d \'{{"value": "max-age=10"}}\'',
        ]
    lines += [
        'and, to try slow suppliers (every one answers after 400 ms; {"ms": 0} undoes it):',
        f"  curl -s -X PUT {lab_url}/latency -d '{{\"ms\": 400}}'",
    ]
    if dialects_url is not None:
        ten = '{"quantity":10}'
        lines += [
            "and, to try the worked suppliers (quantity 10: boreal's price break, 9.90 EUR, in USD "
            "at the lab's rate;",
            "after the lab revokes every token, boreal's attempts in the bill: a 401, then a 200):",
            f"  curl -s -X POST {dialects_url}/api/quotes "
            f"-H 'Content-Type: application/json' -d '{ten}'",
            f"  curl -s -X DELETE {lab_url}/oauth2/tokens",
            f"  curl -s -X POST '{dialects_url}/api/quotes?explain=1' "
            f"-H 'Content-Type: application/json' -d '{ten}'",
            f"and, to see the ranking flip with the rate (boreal's euros dearer: atlas best, "
            f"within {FX_REFRESH_S} s; DELETE undoes it):",
            f'  curl -s -X PUT {lab_url}/fx -d \'{{"rates": {{"USD": "1.3000"}}}}\'',
        ]
    if batch_url is not None:
        lines += [
            f"and, to try a cart ({len(CART_SKUS)} lines, one call to each batch supplier: cedar, "
            "shipping for least, is each line's best;",
            "the basket buys all from atlas, its shipping paid once: total_cents under "
            "per_line_total_cents):",
            f"  curl -s -X POST {batch_url}/api/carts "
            f"-H 'Content-Type: application/json' -d '{cart_body()}'",
        ]
    if hedged_url is not None:
        tail = json.dumps(BOREAL_TAIL)
        lines += [
            f"and, to see a hedge (boreal's answers get a lognormal tail, median "
            f"{BOREAL_TAIL['ms']} ms; ask the hedged QuoteFlow a few dozen times: once it has "
            "learned the tail,",
            'a late first attempt is joined by a "hedge": true one, the bill says which "won" and '
            "the loser is cancelled; DELETE undoes the tail):",
            f"  curl -s -X PUT {lab_url}/faults/boreal -d '{tail}'",
            f"  curl -s -X POST '{hedged_url}/api/quotes?explain=1' -d '{{}}'",
            f"  curl -s -X POST '{hedged_url}/api/quotes?explain=svg' -d '{{}}' > hedge.svg",
            f"  curl -s -X DELETE {lab_url}/faults/boreal",
        ]
    everyone = {0: "both", 1: "all three", 2: "all four", 3: "all five"}[
        (dialects_url is not None) + (batch_url is not None) + (hedged_url is not None)
    ]
    lines += [
        "",
        f"make demo drives every scenario and fault against them. Ctrl-C stops {everyone}.",
    ]
    return "\n".join(lines)


async def run(
    host: str,
    lab_port: int,
    service_port: int,
    extra: Sequence[str],
    dialects_port: int | None = DIALECTS_PORT,
    batch_port: int | None = BATCH_PORT,
    console: bool = False,
    hedged_port: int | None = HEDGED_PORT,
) -> int:
    """Start them all, wait for a signal or a child's death, stop them all; the exit code.

    ``console``: the first QuoteFlow serves the console, with this lab's controls.
    ``hedged_port``: a QuoteFlow with ``--hedge``, asking the lab as the first does.
    """
    lab_url = f"http://{host}:{lab_port}"
    service_url = f"http://{host}:{service_port}"
    dialects_url = None if dialects_port is None else f"http://{host}:{dialects_port}"
    batch_url = None if batch_port is None else f"http://{host}:{batch_port}"
    hedged_url = None if hedged_port is None else f"http://{host}:{hedged_port}"
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    python = sys.executable
    lab = await asyncio.create_subprocess_exec(
        python, "-m", "provider_lab", "--host", host, "--port", str(lab_port)
    )
    services: list[asyncio.subprocess.Process] = []  # the lab's clients: stopped first

    async def quoteflow(
        port: int, *args: str, env: dict[str, str] | None = None
    ) -> asyncio.subprocess.Process:
        # Every QuoteFlow prices foreign offers at the lab's ECB-format rates, fetched
        # every FX_REFRESH_S seconds (its own flags, after these, may say otherwise).
        rates = ("--fx-rates", rates_url(lab_url), "--fx-refresh", str(FX_REFRESH_S))
        return await asyncio.create_subprocess_exec(
            python, "-m", "quoteflow", "--host", host, "--port", str(port), *rates, *args, env=env
        )

    with tempfile.TemporaryDirectory(prefix="quoteflow-run-") as folder:
        try:
            own = ("--console", "--console-lab", lab_url) if console else ()
            services.append(await quoteflow(service_port, "--provider-url", lab_url, *own, *extra))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
                service_ready = asyncio.create_task(wait_ready(service_url, services[0], session))
                ready = {"provider lab": await wait_ready(lab_url, lab, session)}
                # Started once the lab answers (the first token fetch finds its endpoint
                # up), in this order, then waited for together.
                later: dict[str, tuple[str, asyncio.subprocess.Process]] = {}
                if dialects_port is not None and dialects_url is not None and ready["provider lab"]:
                    catalogue = Path(folder) / "worked-suppliers.toml"
                    catalogue.write_text(worked_catalogue(lab_url))
                    services.append(
                        await quoteflow(
                            dialects_port,
                            *extra,
                            "--suppliers",
                            str(catalogue),
                            env={**os.environ, **LAB_SECRETS},
                        )
                    )
                    later["QuoteFlow of the worked suppliers"] = (dialects_url, services[-1])
                if batch_port is not None and batch_url is not None and ready["provider lab"]:
                    catalogue = Path(folder) / "batch-suppliers.toml"
                    catalogue.write_text(batch_catalogue(lab_url))
                    services.append(
                        await quoteflow(batch_port, *extra, "--suppliers", str(catalogue))
                    )
                    later["QuoteFlow of the batch suppliers"] = (batch_url, services[-1])
                if hedged_port is not None and hedged_url is not None and ready["provider lab"]:
                    # Its own flags alone, not ``extra``: a coalesced call's bill does not
                    # carry ``won`` or ``hedge_refused`` (coalesce.py's ``_settle``), and the
                    # bill of a hedge is what this QuoteFlow is there to show.
                    services.append(
                        await quoteflow(hedged_port, "--provider-url", lab_url, "--hedge")
                    )
                    later["hedged QuoteFlow"] = (hedged_url, services[-1])
                answered = await asyncio.gather(
                    *(wait_ready(url, child, session) for url, child in later.values())
                )
                ready.update(zip(later, answered, strict=True))
                ready["QuoteFlow"] = await service_ready
            if not all(ready.values()):
                missing = [name for name, ok in ready.items() if not ok]
                print(f"run: {' and '.join(missing)} did not start; stopping", file=sys.stderr)
                return 1
            banner = _banner(
                lab_url, service_url, extra, dialects_url, batch_url, console, hedged_url
            )
            print(banner, flush=True)
            waiters: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
            waiters += [asyncio.create_task(child.wait()) for child in (*services, lab)]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if not stop.is_set():
                print("run: a process exited; stopping the others", file=sys.stderr)
                return 1
            both = {1: "QuoteFlow", 2: "both QuoteFlows"}.get(len(services), "the QuoteFlows")
            print(f"\nrun: stopping {both} and the provider lab", flush=True)
            return 0
        finally:
            await asyncio.gather(*(stop_child(service) for service in services))
            await stop_child(lab)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m provider_lab.run_pair [--host] [--lab-port] [--port] [--dialects-port]
    [--batch-port] [--hedged-port] [-- quoteflow flags]``."""
    parser = argparse.ArgumentParser(
        prog="python -m provider_lab.run_pair",
        description="Run the provider lab and QuoteFlow together until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lab-port", type=int, default=9101)
    parser.add_argument("--port", type=int, default=9100, help="QuoteFlow's port")
    parser.add_argument(
        "--dialects-port",
        type=int,
        default=DIALECTS_PORT,
        help=f"the port of the QuoteFlow asking the worked suppliers ({DIALECTS_PORT}); 0: none",
    )
    parser.add_argument(
        "--batch-port",
        type=int,
        default=BATCH_PORT,
        help=f"the port of the QuoteFlow asking the batch suppliers ({BATCH_PORT}); 0: none",
    )
    parser.add_argument(
        "--hedged-port",
        type=int,
        default=HEDGED_PORT,
        help=f"the port of the hedged QuoteFlow (--hedge, asking the lab as the first does; "
        f"{HEDGED_PORT}); 0: none",
    )
    parser.add_argument(
        "--console",
        action="store_true",
        help="the first QuoteFlow serves /console, with this lab's fault and latency controls",
    )
    parser.add_argument(
        "extra",
        nargs="*",
        help="more QuoteFlow flags (every QuoteFlow but the hedged one), after --",
    )
    args = parser.parse_args(argv)
    dialects = args.dialects_port or None
    batch = args.batch_port or None
    hedged = args.hedged_port or None
    return asyncio.run(
        run(args.host, args.lab_port, args.port, args.extra, dialects, batch, args.console, hedged)
    )


if __name__ == "__main__":
    raise SystemExit(main())
