"""``make fleet``: redis-server, the lab and a 2-worker gunicorn as one process tree."""

from __future__ import annotations

import asyncio
import shlex
import signal
import sys

import aiohttp

from tests.e2e.test_e2e_run import Running, processes_mentioning, refuses
from tests.fleet.procs import redis_binary
from tests.process import free_port


async def _read(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode(errors="replace").rstrip())


async def test_make_fleet_serves_the_printed_curl_and_stops_all_three() -> None:
    """The printed curl gets boreal's quote; /metrics counts it; SIGINT stops every process."""
    redis_binary()  # skip, or fail under CI, when redis-server is missing
    lab_port, port, redis_port = free_port(), free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "provider_lab.run_fleet"),
        *("--lab-port", str(lab_port), "--port", str(port), "--redis-port", str(redis_port)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    running = Running(process, [], lab_port, port)
    assert process.stdout is not None
    reader = asyncio.create_task(_read(process.stdout, running.lines))
    try:
        command = await running.line_containing("gunicorn -c python:quoteflow.gunicorn_conf")
        assert f"QUOTEFLOW_REDIS_URL=redis://127.0.0.1:{redis_port}/0" in command
        assert "--workers 2" in command
        args = shlex.split(await running.line_containing("curl -s -X POST"))
        url, body = args[args.index("POST") + 1], args[args.index("-d") + 1]
        async with aiohttp.ClientSession() as session:
            headers = {"Content-Type": "application/json"}
            async with session.post(url, data=body, headers=headers) as response:
                result = await response.json()
            assert result["best"]["supplier"] == "boreal"
            assert result["failures"] == []
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert 'quoteflow_requests_total{result="ok"} 1.0' in await response.text()
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 45) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await reader
    for taken in (port, lab_port, redis_port):
        assert refuses(taken)
    assert processes_mentioning(f"127.0.0.1:{port}") == []  # the master and its workers
    assert processes_mentioning(f"--port {redis_port}") == []
