"""When tracing is on, and every ``OTEL_*`` value it refuses to start with."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quoteflow.options import ConfigError
from quoteflow.tracing import tracing_from_environ

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT},
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "q"},  # no exporter named
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "},
    ],
)
def test_tracing_is_off_without_an_exporter_or_endpoint(environ: dict[str, str]) -> None:
    """No exporter named and no endpoint set (or ``none``, or the SDK disabled): off."""
    assert tracing_from_environ(environ) is None


def test_an_endpoint_alone_turns_otlp_on() -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` alone: OTLP to ``<endpoint>/v1/traces``, every trace."""
    config = tracing_from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT + "/"})
    assert config is not None
    assert config.loggable() == {
        "exporters": ["otlp"],
        "endpoint": ENDPOINT + "/v1/traces",
        "sampler": "parentbased_always_on",
        "ratio": None,
        "record_delay_s": 1.0,
    }
    assert config.flush_timeout == 30.0
    assert config.record_delay == 1.0  # the most a sampled request's spans wait


@pytest.mark.parametrize(("schedule_ms", "record_delay"), [("50", 0.025), ("1000", 0.5)])
def test_spans_wait_at_most_half_the_export_delay(schedule_ms: str, record_delay: float) -> None:
    """A short ``OTEL_BSP_SCHEDULE_DELAY``: spans are made in half of it, and leave in time."""
    config = tracing_from_environ(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_BSP_SCHEDULE_DELAY": schedule_ms}
    )
    assert config is not None
    assert config.record_delay == record_delay


def test_the_traces_endpoint_wins_and_a_password_is_not_shown() -> None:
    """The signal's own endpoint is used as it is; its password never reaches the log line."""
    config = tracing_from_environ(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://u:secret@collector.example/in",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01",
            "OTEL_BSP_EXPORT_TIMEOUT": "1500",
        }
    )
    assert config is not None
    assert config.endpoint == "https://collector.example/in"
    assert (config.sampler, config.ratio, config.flush_timeout) == (
        "parentbased_traceidratio",
        0.01,
        1.5,
    )


def test_the_console_exporter_needs_no_endpoint() -> None:
    """``OTEL_TRACES_EXPORTER=console`` is on, with no OTLP endpoint."""
    config = tracing_from_environ({"OTEL_TRACES_EXPORTER": "console"})
    assert config is not None
    assert (config.exporters, config.endpoint) == (("console",), None)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: 'zipkin' is not one of"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
            "OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' is not an http:// or https:// URL",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc': the tracing extra exports OTLP over",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_SAMPLER": "sometimes"},
            "OTEL_TRACES_SAMPLER: 'sometimes' is not one of",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "5",
            },
            "OTEL_TRACES_SAMPLER_ARG: '5' is not a ratio from 0 to 1",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_BSP_MAX_QUEUE_SIZE": "0"},
            "OTEL_BSP_MAX_QUEUE_SIZE: '0' is not a positive integer",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_BSP_MAX_QUEUE_SIZE": "100"},
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE: 512 is more than OTEL_BSP_MAX_QUEUE_SIZE 100",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
            "OTEL_EXPORTER_OTLP_TIMEOUT: 'soon' is not a number of seconds",
        ),
    ],
)
def test_a_value_the_sdk_would_replace_stops_start_up(
    environ: dict[str, str], message: str
) -> None:
    """A value the SDK would quietly swap for its default is one ConfigError line instead."""
    with pytest.raises(ConfigError) as caught:
        tracing_from_environ(environ)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_bad_variable_exits_2_with_one_line() -> None:
    """``python -m quoteflow`` with a bad ``OTEL_*`` value: one line on stderr, exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--port", "0"],
        env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "maybe", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "quoteflow: error: OTEL_TRACES_SAMPLER: 'maybe' is not one of always_on, always_off, "
        "traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
    ]


OFF_COSTS_NOTHING = """
import asyncio, sys
from aiohttp.test_utils import TestClient, TestServer
from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.tracing import tracing_from_environ
assert tracing_from_environ({}) is None

async def main():
    client = TestClient(TestServer(create_app(Settings(provider_url="http://127.0.0.1:9"))))
    await client.start_server()
    answer = await client.post("/api/quotes", json={})
    assert answer.status == 200, answer.status
    await client.close()

asyncio.run(main())
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
assert not loaded, loaded
"""


def test_tracing_off_never_imports_opentelemetry() -> None:
    """With tracing off, a served request leaves no OpenTelemetry module loaded."""
    subprocess.run([sys.executable, "-c", OFF_COSTS_NOTHING], check=True, timeout=60)
