"""``python -m provider_lab``: argv → :class:`LabConfig`, then serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from aiohttp import web

from provider_lab import answers
from provider_lab.app import create_app
from provider_lab.catalogue import SUPPLIERS, NamesError, check_names, names_from_file
from provider_lab.contracts import ContractError, parse_contract_spec
from provider_lab.faults import MAX_LATENCY_MS, FaultError, parse_fault_spec
from provider_lab.fx import FAULT_KINDS, FxFault, parse_rate_spec
from provider_lab.fx import parse_fault_spec as parse_fx_fault
from provider_lab.state import BATCH_MAX_ITEMS, MAX_BATCH_MAX_ITEMS, LabConfig
from provider_lab.tokens import MAX_TTL, credential_ok

logger = logging.getLogger("provider_lab")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, not usage plus a message."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}–{high}")
        return value

    return convert


def _credential(text: str) -> str:
    if not credential_ok(text):
        # Never the value itself: it may be a secret.
        raise argparse.ArgumentTypeError("must be 1–256 printable characters")
    return text


def _fx_rate(text: str) -> tuple[str, str]:
    try:
        return parse_rate_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fx_fault(text: str) -> FxFault:
    try:
        return parse_fx_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(text: str) -> tuple[str, ...]:
    try:
        return check_names([name.strip() for name in text.split(",")], "--names")
    except NamesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The lab's command line."""
    parser = _Parser(
        prog="python -m provider_lab",
        description="Fake suppliers (atlas, boreal, cedar, or any you name) with switchable "
        "faults, asked the classic way or in the json (OAuth2 bearer), path (API key) and "
        "batch (many parts per call) dialects.",
    )
    named = parser.add_mutually_exclusive_group()
    named.add_argument(
        "--names",
        type=_names,
        metavar="NAME,NAME,...",
        help="serve these suppliers at /quotes/{name} (default: atlas,boreal,cedar)",
    )
    named.add_argument(
        "--suppliers",
        metavar="FILE",
        help="serve the suppliers a QuoteFlow catalogue file names, in its order",
    )
    parser.add_argument(
        "--scenario-on",
        type=_names,
        metavar="NAME,NAME,...",
        help="suppliers the scenarios act on (default: boreal, or every one if boreal is "
        "not served)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=_int_in(0, 65535), default=9101, help="port (9101)")
    parser.add_argument(
        "--latency-ms",
        type=_int_in(0, MAX_LATENCY_MS),
        default=0,
        help="latency added to every supplier answer (0)",
    )
    parser.add_argument(
        "--slow-ms",
        type=_int_in(0, MAX_LATENCY_MS),
        default=2000,
        help="how long boreal takes under scenario=slow (2000)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SUPPLIER:KIND[:KEY=VALUE,...]",
        help="switch a fault on at start-up, e.g. boreal:http_429:count=2,retry_after=3 or "
        "boreal:latency:ms=200,sigma=0.9 (repeatable; GET /kinds lists kinds)",
    )
    parser.add_argument(
        "--contract",
        action="append",
        default=[],
        metavar="SUPPLIER:TERM=VALUE[,...]",
        help="hold a supplier to a contract from the start, e.g. "
        "boreal:rate=20/1s,concurrency=4: 429 past the rate (GCRA, a burst of the whole "
        "quota), 503 past the concurrency (repeatable; PUT /contracts/{supplier} changes it)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed for the blip fault's dice and the latency fault's draws (default: random)",
    )
    parser.add_argument(
        "--client-id",
        type=_credential,
        default="quoteflow",
        help="the OAuth2 client POST /oauth2/token knows (quoteflow)",
    )
    parser.add_argument(
        "--client-secret",
        type=_credential,
        default="lab-secret",
        help="that client's secret (lab-secret)",
    )
    parser.add_argument(
        "--token-ttl",
        type=_int_in(1, MAX_TTL),
        default=3600,
        metavar="SECONDS",
        help="expires_in of the tokens issued, at least 1 (3600)",
    )
    parser.add_argument(
        "--api-key",
        type=_credential,
        default="lab-key",
        help="the key the path dialect wants in ?key= (lab-key)",
    )
    parser.add_argument(
        "--batch-max-items",
        type=_int_in(1, MAX_BATCH_MAX_ITEMS),
        default=BATCH_MAX_ITEMS,
        metavar="N",
        help=f"the most parts one batch-dialect call may ask for; more is a 413 "
        f"({BATCH_MAX_ITEMS})",
    )
    parser.add_argument(
        "--fx-rate",
        type=_fx_rate,
        action="append",
        default=[],
        metavar="CODE=RATE",
        help="a rate of the feed at /fx/eurofxref-daily.xml, units per euro, e.g. USD=0.9000 "
        "(repeatable; PUT /fx changes them)",
    )
    parser.add_argument(
        "--fx-fault",
        type=_fx_fault,
        default=None,
        metavar="KIND[:KEY=VALUE]",
        help=f"the rates feed's fault from the start: {', '.join(FAULT_KINDS)} "
        "(stale:days=N, malformed:variant=rate|truncated|no_time|html; PUT /fx changes it)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="logging level (INFO)",
    )
    return parser


async def serve(config: LabConfig, host: str, port: int, *, access_log: bool) -> None:
    """Serve the lab until SIGINT or SIGTERM, then shut down within a second."""
    runner = web.AppRunner(
        create_app(config),
        handler_cancellation=True,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        warming = asyncio.create_task(asyncio.to_thread(answers.warm_up))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        bound_host, bound_port = runner.addresses[0][:2]
        url = f"http://{bound_host}:{bound_port}"
        logger.info("lab_listening url=%s", url)
        print(f"provider lab listening on {url}", flush=True)
        await stop.wait()
        logger.info("lab_stopping")
        await warming
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the lab; bad arguments exit 2 with a one-line error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        suppliers = names_from_file(args.suppliers) if args.suppliers else args.names
    except NamesError as exc:
        parser.error(f"--suppliers: {exc}")
    suppliers = suppliers or SUPPLIERS
    if args.scenario_on and not set(args.scenario_on) <= set(suppliers):
        parser.error("--scenario-on: every name must be one of the lab's suppliers")
    try:
        # Checked once the names are known: a fault must name a supplier the lab serves.
        faults = tuple(parse_fault_spec(spec, suppliers) for spec in args.fault)
    except FaultError as exc:
        parser.error(f"argument --fault: {exc}")
    try:
        contracts = tuple(parse_contract_spec(spec, suppliers) for spec in args.contract)
    except ContractError as exc:
        parser.error(f"argument --contract: {exc}")
    config = LabConfig(
        suppliers=suppliers,
        scenario_suppliers=args.scenario_on,
        latency_ms=args.latency_ms,
        slow_ms=args.slow_ms,
        faults=faults,
        seed=args.seed,
        client_id=args.client_id,
        client_secret=args.client_secret,
        token_ttl=args.token_ttl,
        api_key=args.api_key,
        contracts=contracts,
        batch_max_items=args.batch_max_items,
        fx_rates=tuple(args.fx_rate),
        fx_fault=args.fx_fault,
    )
    try:
        asyncio.run(serve(config, args.host, args.port, access_log=args.access_log))
    except OSError as exc:
        print(
            f"provider_lab: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    return 0
