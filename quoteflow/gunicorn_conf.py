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
- **Files checked in the master, workers booted from the last good copy**
  (``CHECKED_FILES``: the supplier catalogue, the callers file, a rates file). ``kill
  -HUP`` of the master is gunicorn's graceful reload: new workers boot and
  read the files, the old ones finish what they started. A
  worker that found a bad file would exit 3, and gunicorn stops the whole
  fleet when a worker fails to boot. So the master checks each file at start
  (bad: one line, exit 2) and on every ``HUP`` (``on_reload``, which gunicorn
  calls before it starts the new workers), each time in a forked child so
  that what the check imports never stays in the master; a file that passes
  is copied to a private snapshot, one that fails is logged and the snapshot
  kept; every
  worker reads the snapshot (``post_fork`` points its variable there, so a
  worker's own log names that copy). What gunicorn (27) does on ``HUP``, in
  ``Arbiter.reload``: it resets the variables it set from ``--env``, reloads
  its configuration (this module is imported once, so its state survives),
  calls ``on_reload``, forks ``workers`` new workers and at once stops the
  oldest ones beyond that count, which drain as on ``SIGTERM``.
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from quoteflow.callers import load_callers
from quoteflow.config import Settings
from quoteflow.fx import is_url, read_file
from quoteflow.options import (
    GUNICORN_MASTER_ENV,
    METRICS_DIR_ENV,
    ConfigError,
    env_name,
    load_catalogue,
    settings_from_environ,
    unknown_variables,
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


Loader = Callable[[str, Mapping[str, str]], object]
"""A pure loader: a file's path and the environment → what it holds, or ``ConfigError``."""


@attrs.frozen
class CheckedFile:
    """A file the workers serve from, named by an environment variable, checked by ``load``."""

    variable: str
    load: Loader
    is_file: Callable[[str], bool] = attrs.field(default=lambda _: True)
    """Whether the variable's value names a file (``--fx-rates`` may name a URL instead)."""


def _load_catalogue(path: str, environ: Mapping[str, str]) -> object:
    assert _settings is not None  # on_starting refused bad settings first
    return load_catalogue(attrs.evolve(_settings, suppliers_file=path), environ)


def _load_rates(path: str, environ: Mapping[str, str]) -> object:
    return read_file(path)


CHECKED_FILES: list[CheckedFile] = [
    CheckedFile(env_name("suppliers_file"), _load_catalogue),
    CheckedFile(env_name("callers"), load_callers),
    CheckedFile(env_name("fx_rates"), _load_rates, lambda value: not is_url(value)),
]
"""Every file the master checks: the supplier catalogue, the callers file and a rates file
(a rates URL is fetched by each worker, never checked here)."""

_snapshots: dict[str, tuple[str, Path]] = {}
"""Variable → (the operator's path, the last good copy the workers read)."""
_snapshot_dir: str | None = None


def on_starting(server: Any) -> None:
    """In the master, before any worker: refuse bad settings and files, prepare the metrics."""
    global _own_metrics_dir, _snapshot_dir
    if _problem is not None:
        _refuse(str(_problem))
    assert _settings is not None
    unknown = unknown_variables(_settings, os.environ)
    if unknown:
        server.log.warning("quoteflow: unknown variables, ignored: %s", ", ".join(unknown))
    for checked in CHECKED_FILES:
        given = os.environ.get(checked.variable)
        if not given or not checked.is_file(given):
            continue
        if _snapshot_dir is None:
            _snapshot_dir = tempfile.mkdtemp(prefix="quoteflow-files-")
        snapshot = Path(_snapshot_dir) / checked.variable.lower()
        _snapshots[checked.variable] = (given, snapshot)
        problem = _take_snapshot(checked, given, snapshot)
        if problem is not None:
            shutil.rmtree(_snapshot_dir, ignore_errors=True)
            _refuse(problem)
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


def on_reload(server: Any) -> None:
    """In the master, on ``HUP``, before the new workers start: check each file again.

    A file that passes becomes the workers' snapshot; one that fails is logged
    and the last good snapshot stays, so the new workers boot as the old ones did.
    """
    for checked in CHECKED_FILES:
        if checked.variable not in _snapshots:
            continue
        path, snapshot = _snapshots[checked.variable]
        problem = _take_snapshot(checked, path, snapshot)
        if problem is None:
            server.log.info("quoteflow: %s re-read; new workers serve it", path)
        else:
            server.log.error(
                "quoteflow: reload refused, workers keep the last good copy: %s", problem
            )


def post_fork(server: Any, worker: Any) -> None:
    """In a new worker, before it loads the app: read each checked file's last good copy."""
    for variable, (_, snapshot) in _snapshots.items():
        os.environ[variable] = str(snapshot)


def _take_snapshot(checked: CheckedFile, path: str, snapshot: Path) -> str | None:
    """Copy ``path`` to ``snapshot`` if it passes ``checked``'s loader; else the problem.

    The bytes are read once and the copy is what gets checked, so a file
    rewritten meanwhile cannot slip past.
    """
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    candidate = snapshot.with_name(snapshot.name + ".new")
    candidate.write_bytes(content)
    problem = _check_apart(checked, str(candidate))
    if problem is not None:
        candidate.unlink(missing_ok=True)
        return problem.replace(str(candidate), path)
    os.replace(candidate, snapshot)  # a worker booting now reads the old copy or the new, whole
    return None


_PASSED = b"ok"


def _check_apart(checked: CheckedFile, path: str) -> str | None:
    """Run ``checked``'s loader in a forked child of the master; the problem, if any.

    Loading imports what the file names (a catalogue's adapters, with their own
    dependencies and side effects). Done in the master itself, every worker
    forked afterwards would inherit those modules as they were then: a changed
    adapter would never be re-imported, and modules that cannot be imported
    twice could not be unloaded either. The child exits once it has said.
    """
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: check, report through the pipe, and never return
        try:
            os.close(reading)
            try:
                checked.load(path, os.environ)
                said = _PASSED
            except ConfigError as exc:
                said = str(exc).encode()
            except BaseException as exc:  # a loader's bug: named by class, never a traceback
                said = f"{path}: the check failed ({type(exc).__name__})".encode()
            os.write(writing, said)
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        said = pipe.read()
    with contextlib.suppress(ChildProcessError):  # gunicorn's SIGCHLD handler may reap it first
        os.waitpid(pid, 0)
    if said == _PASSED:
        return None
    return said.decode(errors="replace") or f"{path}: the check stopped without an answer"


def child_exit(server: Any, worker: Any) -> None:
    """In the master, after a worker exited: its in-flight gauges leave the host's totals, and
    its slots the fleet's at once (a dead process sends nothing; ``fleet.release``)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]  # untyped upstream
    if _settings is not None and _settings.fleet:
        _release(server, _settings, worker.pid)


def _release(server: Any, settings: Settings, pid: int) -> None:
    """Free ``pid``'s records in Redis from a forked child, and return at once.

    The master imports nothing of the fleet (workers forked after a ``HUP``
    must import the code deployed then, not inherit the master's) and never
    waits on Redis; gunicorn reaps the child as an unknown one. On failure
    the others free the records after the outage grace instead.
    """
    if os.fork() != 0:
        return
    try:
        from quoteflow.fleet.client import blocking_client
        from quoteflow.fleet.release import release_process

        client = blocking_client(settings, timeout=max(0.5, 4 * settings.redis_timeout))
        try:
            if release_process(client, settings.redis_prefix, pid):
                server.log.info("quoteflow: worker %s exited; its slots are free in Redis", pid)
        except Exception as exc:  # Redis away: the grace frees them instead
            server.log.warning("quoteflow: worker %s's slots not freed in Redis: %r", pid, exc)
        finally:
            client.close()
    finally:
        os._exit(0)


def on_exit(server: Any) -> None:
    """In the master, last: remove the metrics and snapshot directories it made."""
    for directory in (_own_metrics_dir, _snapshot_dir):
        if directory is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(directory)


def _refuse(message: str) -> None:
    print(f"quoteflow: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)
