"""gunicorn's settings for QuoteFlow's fleet mode (``pip install 'quoteflow[fleet]'``)::

    gunicorn -c python:quoteflow.gunicorn_conf quoteflow.app:gunicorn_app \\
        --worker-class aiohttp.GunicornUVLoopWebWorker --workers 2 --bind 127.0.0.1:9100

Command-line options win over everything here. What it adds to gunicorn:

- **QuoteFlow's settings are checked once, in the master,** before any worker
  starts: a bad ``QUOTEFLOW_*`` value prints QuoteFlow's one-line error and
  gunicorn exits 2.
- **Defaults from QuoteFlow's settings:** ``bind`` is
  ``QUOTEFLOW_HOST:QUOTEFLOW_PORT`` (127.0.0.1:9100); the worker class is
  aiohttp's uvloop worker; ``graceful_timeout`` and ``timeout`` leave room
  for the drain and the requests in flight; no control socket (see below).
- **Host-wide metrics** (``hostmetrics.py``): prometheus-client's multiprocess
  mode needs ``PROMETHEUS_MULTIPROC_DIR`` set before any worker imports it,
  emptied when the master starts, and a worker's live gauges removed when it
  exits. If the variable is set, that directory is used (created if missing,
  its ``*.db`` files deleted at start); if not, the master makes a private
  temporary directory and removes it when it exits. Without this file a
  worker cannot know its metrics would be the host's: it refuses to boot,
  printing the command with ``-c python:quoteflow.gunicorn_conf`` added.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from quoteflow.config import Settings
from quoteflow.options import (
    GUNICORN_MASTER_ENV,
    METRICS_DIR_ENV,
    ConfigError,
    settings_from_environ,
)

# Read at import, which gunicorn does once, in the master, to learn ``bind``;
# a problem is reported by ``on_starting``, where it can stop gunicorn cleanly.
_settings: Settings | None = None
_problem: ConfigError | None = None
try:
    _settings = settings_from_environ(os.environ)
except ConfigError as exc:
    _problem = exc

worker_class = "aiohttp.GunicornUVLoopWebWorker"

# gunicorn 25.1+ opens a control socket at one path per user, shared by every
# gunicorn that user runs (two fleets, or tests running beside `make fleet`,
# would take it from each other). Off; a deployment that wants `gunicornc`
# uses a config of its own with its own `control_socket` path.
control_socket_disable = True

if _settings is not None:
    _host = f"[{_settings.host}]" if ":" in _settings.host else _settings.host
    bind = [f"{_host}:{_settings.port}"]
    # gunicorn waits this long after SIGTERM before it kills a worker: enough
    # for the drain, the requests in flight (one budget each) and a second of
    # the worker's own heartbeat; never less than gunicorn's default. A worker
    # stopping on its own (--max-requests) sends no heartbeat while it drains,
    # so the heartbeat timeout must cover the same.
    graceful_timeout = timeout = max(30, int(_settings.shutdown_drain + _settings.budget) + 3)

_own_metrics_dir: str | None = None
"""The temporary directory the master made for metrics files, removed at exit."""


def on_starting(server: Any) -> None:
    """In the master, before any worker: refuse bad settings, prepare the metrics directory."""
    global _own_metrics_dir
    if _problem is not None:
        _refuse(str(_problem))
    directory = os.environ.get(METRICS_DIR_ENV)
    if not directory:
        if "prometheus_client" in sys.modules:
            # With --preload the app (and prometheus-client) is imported before
            # this hook; the workers would inherit its single-process mode.
            _refuse(f"set {METRICS_DIR_ENV} before gunicorn starts (--preload imports the app)")
        directory = _own_metrics_dir = tempfile.mkdtemp(prefix="quoteflow-metrics-")
        os.environ[METRICS_DIR_ENV] = directory  # the workers inherit it
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    # Files of a previous run would be added to this one's totals.
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    # The workers check it is their own master that did this (``app.gunicorn_app``).
    os.environ[GUNICORN_MASTER_ENV] = str(os.getpid())


def child_exit(server: Any, worker: Any) -> None:
    """In the master, after a worker exited: its in-flight gauges leave the host's totals."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]  # untyped upstream


def on_exit(server: Any) -> None:
    """In the master, last: remove the metrics directory if it made it."""
    if _own_metrics_dir is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(_own_metrics_dir)


def _refuse(message: str) -> None:
    print(f"quoteflow: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)
