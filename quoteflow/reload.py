"""Live reload: the files a ``SIGHUP`` re-reads, each swapped whole or not at all.

A file QuoteFlow serves from (the supplier catalogue, the callers) registers a
``Reloadable`` with the app (``register``). ``python -m quoteflow`` calls
``reload_all`` on ``SIGHUP``; each reloadable re-reads its file, checks it with
the same checks as at start-up, and swaps the object it feeds in one step — or,
when the file fails a check, raises ``ConfigError`` and changes nothing, so the
old object keeps serving. Requests in flight keep the object they started with:
they hold a reference, never a global.

Under gunicorn the master's ``HUP`` is gunicorn's own graceful reload: new
workers start (reading the files as at boot) and the old ones finish what they
started. ``gunicorn_conf`` checks the files in the master on that ``HUP`` so a
bad file never reaches a booting worker.
"""

from __future__ import annotations

import logging
from typing import Protocol

from aiohttp import web

from quoteflow.logs import log_event
from quoteflow.options import ConfigError

log = logging.getLogger("quoteflow")


class Reloadable(Protocol):
    """One file QuoteFlow serves from, re-read on ``SIGHUP``."""

    name: str
    """What the file holds, for the log: ``suppliers``, ``callers``."""

    def reload(self) -> None:
        """Re-read the file and swap what it feeds; raise ``ConfigError`` to change nothing."""
        ...


RELOADABLES = web.AppKey("reloadables", list[Reloadable])


def register(app: web.Application, reloadable: Reloadable) -> None:
    """Have ``reload_all`` re-read ``reloadable``'s file (call before the app starts)."""
    app.setdefault(RELOADABLES, []).append(reloadable)


def reload_all(app: web.Application) -> None:
    """Re-read every registered file; one event each, ``error`` for a file kept as it was."""
    for reloadable in app.get(RELOADABLES, ()):
        try:
            reloadable.reload()
        except ConfigError as exc:
            log_event(
                log, logging.ERROR, "reload_refused", {"file": reloadable.name, "error": str(exc)}
            )
        else:
            log_event(log, logging.INFO, "reloaded", {"file": reloadable.name})
