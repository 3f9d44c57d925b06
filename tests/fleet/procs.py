"""Real processes for the fleet tests: redis-server, the provider lab and gunicorn.

Everything here is synchronous (``subprocess``), so module-scoped fixtures can
share one started process across the tests of a module. Process ids of
gunicorn's workers come from ``/proc`` (the children of the master).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import pytest

from bench.procs import children
from tests.process import free_port

REDIS_INSTALL = "apt-get update && apt-get install -y redis-server"
GUNICORN_APP = "quoteflow.app:gunicorn_app"
WORKER_CLASS = "aiohttp.GunicornUVLoopWebWorker"
STOP_WITHIN_S = 10.0


def redis_binary() -> str:
    """``redis-server``'s path; missing, a skip with the command to run, or a failure under CI."""
    found = shutil.which("redis-server")
    if found:
        return found
    message = f"redis-server is not installed; install it (as root) with: {REDIS_INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(message)  # CI must never pass by skipping the fleet tests
    pytest.skip(message)


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def get(url: str, timeout: float = 1.0) -> int:
    """The status of a blocking ``GET url`` (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def stop(process: subprocess.Popen[bytes], within_s: float = STOP_WITHIN_S) -> int:
    """SIGTERM, then SIGKILL if still there after ``within_s``; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(within_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def kill(pid: int, within_s: float = 5.0) -> None:
    """SIGKILL ``pid`` and wait until it is dead (a zombie or gone): it accepts nothing more."""
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + within_s
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat[stat.rindex(")") + 2] == "Z":
            return
        if time.monotonic() > end:
            raise RuntimeError(f"process {pid} survived SIGKILL for {within_s} s")
        time.sleep(0.01)


@attrs.define
class RedisServer:
    """A redis-server on a free port with persistence off; ``restart`` brings it back empty."""

    directory: Path
    port: int = attrs.field(factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """What ``QUOTEFLOW_REDIS_URL`` is set to."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        """Where redis-server writes its log."""
        return self.directory / "redis.log"

    def start(self) -> None:
        """Start redis-server and wait until it answers PING."""
        argv = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        # Nothing is written to disk: a restart comes back empty, as after a crash.
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 10
        while self.cli("PING") != "PONG":
            if self.process.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"redis-server did not start:\n{tail(self.log_path)}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop redis-server (its data is gone: nothing is saved)."""
        if self.process is not None:
            stop(self.process)
            self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port, with every key lost."""
        self.stop()
        self.start()

    def cli(self, *command: str) -> str:
        """``redis-cli`` against this server; its output, stripped ("" if it cannot connect)."""
        cli = shutil.which("redis-cli") or "redis-cli"  # redis-server's package depends on it
        done = subprocess.run(
            [cli, "-p", str(self.port), *command],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return done.stdout.strip()


@attrs.define
class Lab:
    """The provider lab as a process."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path


def start_lab(directory: Path, *flags: str) -> Lab:
    """``python -m provider_lab`` on a free port, started and healthy."""
    port = free_port()
    log_path = directory / "lab.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "provider_lab", "--port", str(port), *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    lab = Lab(process, f"http://127.0.0.1:{port}", log_path)
    end = time.monotonic() + 20
    while get(f"{lab.url}/health") != 200:
        if process.poll() is not None or time.monotonic() > end:
            stop(process)
            raise RuntimeError(f"the provider lab did not start:\n{tail(log_path)}")
        time.sleep(0.05)
    return lab


def gunicorn_argv(port: int, workers: int = 2, *, config: bool = True) -> list[str]:
    """The fleet's command line: gunicorn, QuoteFlow's factory, its config, aiohttp's worker."""
    argv = [sys.executable, "-m", "gunicorn"]
    if config:
        argv += ["-c", "python:quoteflow.gunicorn_conf"]
    else:
        argv += ["--no-control-socket"]  # what the config does; see gunicorn_conf.py
    return [
        *argv,
        GUNICORN_APP,
        *("--worker-class", WORKER_CLASS),
        *("--workers", str(workers)),
        *("--bind", f"127.0.0.1:{port}"),
    ]


def quoteflow_env(settings: Mapping[str, str], **extra: str) -> dict[str, str]:
    """This process's environment without any QuoteFlow or metrics setting, plus ``settings``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("QUOTEFLOW_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    return {**env, **settings, **extra}


@attrs.define
class Gunicorn:
    """A gunicorn master serving QuoteFlow on 127.0.0.1, and where its files are."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    metrics_dir: Path

    @property
    def pid(self) -> int:
        """The master's process id."""
        return self.process.pid

    def workers(self) -> set[int]:
        """Process ids of the live workers."""
        return set(children(self.pid))

    def booted(self, pid: int) -> bool:
        """Whether worker ``pid`` has built its app (it writes its in-flight gauge file then)."""
        return (self.metrics_dir / f"gauge_livesum_{pid}.db").exists()

    def wait_workers(self, count: int, within_s: float = 20.0) -> set[int]:
        """Wait until exactly ``count`` workers run and each has booted; their ids."""
        end = time.monotonic() + within_s
        while True:
            pids = self.workers()
            if len(pids) == count and all(self.booted(pid) for pid in pids):
                return pids
            if self.process.poll() is not None or time.monotonic() > end:
                raise RuntimeError(
                    f"gunicorn has workers {sorted(pids)}, wanted {count}:\n{tail(self.log_path)}"
                )
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM the master (a graceful stop of every worker); its exit code."""
        return stop(self.process, within_s=30)


def start_gunicorn(
    directory: Path,
    settings: Mapping[str, str],
    *,
    workers: int = 2,
    argv: Sequence[str] | None = None,
) -> Gunicorn:
    """Start QuoteFlow under gunicorn with ``settings`` (``QUOTEFLOW_*``); wait for every worker."""
    port = free_port()
    metrics_dir = directory / "metrics"
    log_path = directory / "gunicorn.log"
    env = quoteflow_env(settings, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv or gunicorn_argv(port, workers)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    fleet = Gunicorn(process, f"http://127.0.0.1:{port}", log_path, metrics_dir)
    try:
        fleet.wait_workers(workers)
        end = time.monotonic() + 10
        while get(f"{fleet.url}/health") != 200:
            if time.monotonic() > end:
                raise RuntimeError(f"gunicorn does not answer /health:\n{tail(log_path)}")
            time.sleep(0.05)
    except BaseException:
        with contextlib.suppress(Exception):
            stop(process)
        raise
    return fleet
