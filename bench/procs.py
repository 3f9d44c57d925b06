"""The benchmark's child processes: start, wait until ready, read CPU time, stop.

CPU time comes from ``/proc/<pid>/stat`` (user + system), so no extra
dependency is needed; the load generator's own CPU comes from ``wait4``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"


class BenchError(Exception):
    """The benchmark cannot go on (a process did not start, a tool is missing)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces: split after its ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    """Live (not zombie) child processes of ``pid``, from ``/proc`` (gunicorn's workers)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return sorted(found)


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def http(
    method: str, url: str, body: Any = None, timeout: float = 5.0
) -> tuple[int, dict[str, str], Any]:
    """One blocking JSON request (control calls and checks, never load)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status, headers = resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        status, headers = exc.code, dict(exc.headers)
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:
        payload = raw.decode(errors="replace")
    return status, headers, payload


@attrs.define
class Service:
    """One child server process listening on 127.0.0.1."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """Process id, for CPU accounting and profilers."""
        return self.process.pid

    def cpu(self) -> float:
        """CPU seconds used so far; a process that has died stops the benchmark."""
        if self.process.poll() is not None:
            raise BenchError(
                f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
            )
        return cpu_seconds(self.process.pid)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the process's output, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start(
    name: str,
    argv: Sequence[str],
    port: int,
    log_dir: Path,
    *,
    ready_path: str = "/health",
    cwd: Path | None = None,
    ready_timeout: float = 15.0,
    env: Mapping[str, str] | None = None,
) -> Service:
    """Start ``argv`` and wait until ``GET ready_path`` answers 200.

    ``QUOTEFLOW_*`` and ``OTEL_*`` variables of the caller's environment are
    left out: the benchmark sets QuoteFlow's configuration with flags, and
    only with flags — or, for gunicorn, which has no QuoteFlow flags, and for
    tracing, configured by ``OTEL_*`` variables, with ``env``.
    """
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("QUOTEFLOW_", "OTEL_"))}
    env = {**inherited, **(env or {})}
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the runner, which stops us in order
        )
    service = Service(name, port, process, log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{name} exited with {process.returncode}:\n{service.log_tail()}")
        try:
            if http("GET", service.url + ready_path, timeout=0.5)[0] == 200:
                return service
        except OSError:
            pass
        time.sleep(0.1)
    stop(service)
    raise BenchError(f"{name} did not answer {ready_path} within {ready_timeout} s")


def stop(service: Service, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    process = service.process
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


def find_or_install(command: str, package: str) -> str:
    """``command``'s path; Debian's ``package`` is installed first if we are root with apt.

    ``BENCH_NO_INSTALL=1`` turns the install off; without the command the
    bench stops with the one line to run.
    """
    found = shutil.which(command)
    if found:
        return found
    install = f"apt-get update && apt-get install -y {package}"
    apt = shutil.which("apt-get")
    if os.geteuid() == 0 and apt and os.environ.get("BENCH_NO_INSTALL") != "1":
        print(f"{command} not found: running `{install}`", flush=True)
        subprocess.run([apt, "update", "-qq"], check=True)
        subprocess.run([apt, "install", "-y", "-qq", package], check=True)
        found = shutil.which(command)
        if found:
            return found
    raise BenchError(f"{command} is not installed; install it (as root) with:\n    {install}")
