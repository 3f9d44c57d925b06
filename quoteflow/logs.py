"""Events, not sentences: every log line is a stable event name with structured fields.

``log_event(logger, INFO, "supplier_attempt", {"supplier": "boreal", "attempt": 2})``
becomes, with the JSON format, one line on stderr:

    {"ts": "...", "level": "info", "event": "supplier_attempt", "supplier": "boreal", ...}

Tests read ``record.event`` and ``record.fields``; wording never matters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import orjson
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestPayloadError

_FIELDS = "fields"


def log_event(
    logger: logging.Logger,
    level: int,
    event: str,
    fields: Mapping[str, Any],
    exc_info: BaseException | None = None,
) -> None:
    """Log ``event`` with ``fields``; costs one comparison when the level is off."""
    if logger.isEnabledFor(level):
        logger.log(level, event, exc_info=exc_info, extra={"event": event, _FIELDS: fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, event and the event's fields."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # strftime once a second, not once a line
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        line: dict[str, Any] = {
            "ts": f"{self._second_text}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": getattr(record, "event", record.getMessage()),
        }
        line.update(getattr(record, _FIELDS, {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # orjson: one line per served request, so its cost is the request's cost.
        try:
            return orjson.dumps(line, default=str).decode()
        except TypeError:  # e.g. a lone surrogate a caller sent, in an error's text
            return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """For people: ``time level event key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, _FIELDS, {}).items())
        event = getattr(record, "event", record.getMessage())
        text = f"{self.formatTime(record)} {record.levelname:<7} {event} {fields}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class BatchingStreamHandler(logging.StreamHandler[TextIO]):
    """Writes lines to its stream in batches, not one ``write`` per line.

    At the default level QuoteFlow logs a line per served request, and under
    load the system call per line cost more than building the line. Lines
    wait at most ``interval`` seconds, on a timer of the thread's running
    event loop. A record at WARNING or above, a full buffer, a thread without
    a running loop, and ``logging.shutdown()`` at exit all write at once, so
    problems are never held back. What a ``kill -9`` can take is the last
    ``interval`` of routine lines.
    """

    def __init__(self, stream: TextIO, interval: float = 0.05, limit: int = 64 * 1024) -> None:
        super().__init__(stream)
        self.interval = interval
        self.limit = limit
        self._pending: list[str] = []
        self._pending_size = 0
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # Called by Handler.handle with self.lock held.
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self._pending.append(line)
        self._pending_size += len(line)
        if record.levelno >= logging.WARNING or self._pending_size >= self.limit:
            self.flush()
        else:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()  # no loop to flush later from: write now
                return
            # Compared by loop, not a flag: a loop that closed with our timer
            # pending must not leave later lines waiting for a timer that is gone.
            if self._timer_loop is not loop:
                self._timer_loop = loop
                loop.call_later(self.interval, self._on_timer)

    def _on_timer(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._timer_loop = None
            self.flush()

    def flush(self) -> None:
        """Write every pending line, then flush the stream."""
        with self.lock:  # type: ignore[union-attr]
            if self._pending:
                text = "".join(self._pending)
                self._pending.clear()
                self._pending_size = 0
                try:
                    self.stream.write(text)
                except (OSError, ValueError):
                    # stderr is gone or closed: there is nowhere left to say so,
                    # and a request must never fail because its log line did.
                    return
            super().flush()

    def close(self) -> None:
        """Write what is pending, then close (``logging.shutdown()`` also flushes first)."""
        self.flush()
        super().close()


class CallerMistakes(logging.Filter):
    """aiohttp's ERROR records for what a caller sent wrong, as one info event each.

    A request aiohttp cannot parse as HTTP (a bad ``Content-Length``, an
    over-long header line) is answered 400 by aiohttp itself and logged as
    "Error handling request" at ERROR with a traceback. A body QuoteFlow has
    answered 400 because it does not decode (bad gzip, broken chunking) is
    met again when aiohttp drains it, and logged as "Unhandled exception".
    Either way any caller could fill the error log with its own mistakes, so
    those records become ``caller_bad_http`` / ``caller_body_error`` events
    at info. Every other exception aiohttp logs is left as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, RequestPayloadError):
            event = "caller_body_error"
        elif isinstance(error, HttpProcessingError) and record.levelno >= logging.ERROR:
            event = "caller_bad_http"
        else:
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
        record.event = event
        record.fields = {"error": str(error.__cause__ or error).strip()}
        # The logger checked the level before this filter lowered it.
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def quiet_caller_mistakes() -> None:
    """Install ``CallerMistakes`` on aiohttp's server logger, once."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, CallerMistakes) for f in server_log.filters):
        server_log.addFilter(CallerMistakes())


def configure(level: str, fmt: str, *, process_ids: bool = False) -> None:
    """Send every log record to stderr as JSON lines (``json``) or readable text (``text``).

    ``process_ids``: records keep their process id, which gunicorn's own log
    format prints (in a gunicorn worker its log lines go through the same
    ``logging`` module).
    """
    handler = BatchingStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for previous in root.handlers:
        previous.flush()  # lines a replaced handler still holds are written, not lost
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would duplicate our own request event.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    quiet_caller_mistakes()
    # What no event of ours uses, per the logging HOWTO's "Optimization"
    # table: no caller lookup (a stack walk per record), thread or process.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = process_ids
    logging.logMultiprocessing = False
