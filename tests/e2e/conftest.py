"""The provider lab and QuoteFlow as real processes on free ports, shared by the e2e tests.

Both are started once for the package (they are stateless between tests apart
from the lab's faults and statistics, which every test resets through the
``lab`` fixture) and stopped with SIGTERM at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import attrs
import pytest

from provider_lab.control_client import LabControl

BUDGET_S = 0.3
"""QuoteFlow's budget in these tests: short, so hang and slow cases end quickly."""
OUTBOUND_LIMIT = 6
INBOUND_LIMIT = 8


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``url/health`` until it answers 200; fail with the process's log otherwise."""
    end = time.monotonic() + 20
    while time.monotonic() < end and process.poll() is None:
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(f"{url}/health", timeout=1) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become healthy:\n{log.read_text()[-2000:]}")


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after five seconds; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def spawn(args: Sequence[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m ...`` with output to ``log``."""
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def own_quoteflow(pair: Pair, log: Path, *flags: str) -> Iterator[str]:
    """A QuoteFlow process of a test module's own, against the shared lab; its URL.

    It must exit 0 on SIGTERM afterwards.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = spawn(
            ["quoteflow", "--port", str(port), "--provider-url", pair.lab_url, *flags], out
        )
        try:
            wait_healthy(url, process, log)
            yield url
        finally:
            assert stop(process) == 0


@attrs.frozen
class Pair:
    """Where the running lab and QuoteFlow answer."""

    lab_url: str
    service_url: str


@pytest.fixture(scope="package")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """The lab and QuoteFlow (budget 0.3 s) as processes, stopped at the end."""
    logs = tmp_path_factory.mktemp("e2e")
    lab_port, service_port = free_port(), free_port()
    lab_url = f"http://127.0.0.1:{lab_port}"
    service_url = f"http://127.0.0.1:{service_port}"
    with (
        (logs / "lab.log").open("wb") as lab_log,
        (logs / "quoteflow.log").open("wb") as service_log,
    ):
        lab = spawn(["provider_lab", "--port", str(lab_port), "--slow-ms", "2000"], lab_log)
        service = spawn(
            [
                "quoteflow",
                "--port",
                str(service_port),
                "--provider-url",
                lab_url,
                "--budget",
                str(BUDGET_S),
                "--inbound-limit",
                str(INBOUND_LIMIT),
                "--outbound-limit",
                str(OUTBOUND_LIMIT),
                # The contract of sections 2–5 exactly, as the black-box suite
                # runs it: these tests drive one supplier into failure after
                # failure. tests/e2e/test_e2e_breaker.py runs with the breaker.
                "--breaker-failures",
                "0",
            ],
            service_log,
        )
        try:
            wait_healthy(lab_url, lab, logs / "lab.log")
            wait_healthy(service_url, service, logs / "quoteflow.log")
            yield Pair(lab_url, service_url)
        finally:
            codes = stop(service), stop(lab)
    assert codes == (0, 0), f"exit codes {codes}; logs in {logs}"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session for the test, with a generous overall timeout."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


@pytest.fixture
async def lab(pair: Pair, session: aiohttp.ClientSession) -> LabControl:
    """The lab's control API, with no faults, no latency and zeroed statistics."""
    control = LabControl(session, pair.lab_url)
    await control.fresh()
    return control


@attrs.frozen
class Asked:
    """QuoteFlow's answer to one request, and what each supplier received for it."""

    status: int
    body: dict[str, Any]
    attempts: dict[str, int]

    @property
    def failures(self) -> dict[str, str]:
        """Failure codes by supplier."""
        return {f["supplier"]: f["code"] for f in self.body["failures"]}

    @property
    def quoted(self) -> list[str]:
        """Suppliers with a quote, best first."""
        return [q["supplier"] for q in self.body["quotes"]]


async def ask_quoteflow(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl, **body: Any
) -> Asked:
    """``POST /api/quotes`` once, then read the attempts per supplier from the lab."""
    async with session.post(f"{pair.service_url}/api/quotes", json=body) as response:
        status, answer = response.status, await response.json()
    attempts: dict[str, int] = {}
    if status == 200:
        await lab.wait_idle()
        attempts = await lab.attempts(answer["request_id"])
    return Asked(status, answer, attempts)


async def wait_unpaused(session: aiohttp.ClientSession, pair: Pair, within_s: float = 5.0) -> None:
    """Until QuoteFlow has no supplier paused (a 429 with Retry-After pauses one)."""
    end = asyncio.get_running_loop().time() + within_s
    while True:
        async with session.get(f"{pair.service_url}/metrics") as response:
            text = await response.text()
        left = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("quoteflow_supplier_pause_seconds{")
        ]
        if not any(left):
            return
        assert asyncio.get_running_loop().time() < end, f"still paused: {left}"
        await asyncio.sleep(0.05)
