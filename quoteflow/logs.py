"""Events, not sentences: every log line is a stable event name with structured fields.

``log_event(logger, INFO, "supplier_attempt", {"supplier": "boreal", "attempt": 2})``
becomes, with the JSON format, one line on stderr:

    {"ts": "...", "level": "info", "event": "supplier_attempt", "supplier": "boreal", ...}

Tests read ``record.event`` and ``record.fields``; wording never matters.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

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
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """For people: ``time level event key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, _FIELDS, {}).items())
        event = getattr(record, "event", record.getMessage())
        text = f"{self.formatTime(record)} {record.levelname:<7} {event} {fields}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(level: str, fmt: str) -> None:
    """Send every log record to stderr as JSON lines (``json``) or readable text (``text``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would duplicate our own request event.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # What no event of ours uses, per the logging HOWTO's "Optimization"
    # table: no caller lookup (a stack walk per record), thread or process.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
