"""A real ``redis-server`` on a free port, persistence off, that a test may stop and start.

Nothing about Redis is mocked in QuoteFlow's tests: fleet mode is tested
against the server itself, killed, restarted and emptied like in production.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.process import free_port

INSTALL_HINT = "apt-get install -y redis-server"


def redis_server_binary() -> str:
    """The path of ``redis-server``; missing, the test is skipped — or fails when ``CI`` is set."""
    found = shutil.which("redis-server")
    if found is None:
        message = f"redis-server is not installed (run: {INSTALL_HINT})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class RedisServer:
    """One redis-server process; ``stop`` and ``start`` keep its port, so clients reconnect."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server (empty: nothing is saved) and wait until it answers PING."""
        assert self.process is None
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"redis-server exited with {self.process.returncode}")
            if self.command("PING") == "+PONG":
                return
            time.sleep(0.01)
        raise AssertionError("redis-server did not answer PING")

    def stop(self) -> None:
        """Terminate the server (SIGTERM) and wait for it: every connection is gone."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def command(self, *words: str) -> str | None:
        """Send one inline command; the first line of the reply, or None if nobody answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(" ".join(words).encode() + b"\r\n")
                return sock.recv(4096).split(b"\r\n", 1)[0].decode()
        except OSError:
            return None
