"""The log handler writes lines in batches, yet never holds back a problem or loses a line."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from quoteflow.logs import BatchingStreamHandler, JsonFormatter, log_event


class CountingStream(io.StringIO):
    """A stream that counts the writes it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def logged() -> tuple[logging.Logger, CountingStream, BatchingStreamHandler]:
    stream = CountingStream()
    handler = BatchingStreamHandler(stream, interval=0.02)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("quoteflow.test_logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream, handler


def events(stream: CountingStream) -> list[str]:
    return [json.loads(line)["event"] for line in stream.getvalue().splitlines()]


async def test_lines_wait_for_the_timer_then_go_in_one_write(
    logged: tuple[logging.Logger, CountingStream, BatchingStreamHandler],
) -> None:
    logger, stream, _ = logged
    for n in range(50):
        log_event(logger, logging.INFO, f"line_{n}", {"n": n})
    assert stream.writes == 0
    await asyncio.sleep(0.1)
    assert events(stream) == [f"line_{n}" for n in range(50)]
    assert stream.writes == 1


async def test_a_warning_is_written_at_once_after_the_lines_before_it(
    logged: tuple[logging.Logger, CountingStream, BatchingStreamHandler],
) -> None:
    logger, stream, _ = logged
    log_event(logger, logging.INFO, "routine", {})
    log_event(logger, logging.WARNING, "problem", {})
    assert events(stream) == ["routine", "problem"]


async def test_a_full_buffer_is_written_without_waiting(
    logged: tuple[logging.Logger, CountingStream, BatchingStreamHandler],
) -> None:
    logger, stream, handler = logged
    handler.limit = 1000
    for n in range(40):
        log_event(logger, logging.INFO, "padded", {"pad": "x" * 50, "n": n})
    assert stream.writes >= 1
    assert len(stream.getvalue()) >= 1000


def test_without_a_running_loop_lines_are_written_at_once(
    logged: tuple[logging.Logger, CountingStream, BatchingStreamHandler],
) -> None:
    logger, stream, _ = logged
    log_event(logger, logging.INFO, "from_a_thread_without_a_loop", {})
    assert events(stream) == ["from_a_thread_without_a_loop"]


def test_pending_lines_survive_a_closed_loop_and_shutdown(
    logged: tuple[logging.Logger, CountingStream, BatchingStreamHandler],
) -> None:
    logger, stream, handler = logged

    async def log_one(event: str) -> None:
        log_event(logger, logging.INFO, event, {})

    # The first loop closes with its flush timer still pending.
    asyncio.run(log_one("first_loop"))
    assert events(stream) == []

    async def log_and_wait() -> None:
        await log_one("second_loop")
        await asyncio.sleep(0.1)

    # A later loop gets a timer of its own: both lines come out.
    asyncio.run(log_and_wait())
    assert events(stream) == ["first_loop", "second_loop"]

    asyncio.run(log_one("at_exit"))
    handler.close()  # what logging.shutdown() does at exit
    assert events(stream)[-1] == "at_exit"


def test_a_line_orjson_refuses_is_still_written(
    logged: tuple[logging.Logger, CountingStream, BatchingStreamHandler],
) -> None:
    """A lone surrogate (a caller's text, e.g. in an error) falls back to json's escapes."""
    logger, stream, _ = logged
    log_event(logger, logging.WARNING, "odd_key", {"key": "\ud800"})
    assert json.loads(stream.getvalue()) | {"ts": None} == {
        "ts": None,
        "level": "warning",
        "event": "odd_key",
        "key": "\ud800",
    }
