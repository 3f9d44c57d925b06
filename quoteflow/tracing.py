"""Whether QuoteFlow traces, read from OpenTelemetry's own ``OTEL_*`` variables.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or
``console``, not ``none``) or, with that variable unset, when an OTLP
endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` turns it
off whatever the rest says. Off, ``tracing_from_environ`` returns ``None``
and nothing imports OpenTelemetry: a request does exactly what it did
before tracing existed.

On, this module only *checks* the variables: the SDK reads them itself when
``spans.Tracing`` builds the exporter, the batch processor, the sampler and
the resource, so every variable means what the OpenTelemetry docs say. The
SDK answers a bad value with a warning and its default; we refuse to start
instead (one line, exit 2), for every variable whose default would quietly
change what is traced or how much memory it may take.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Final

import attrs
from yarl import URL

from quoteflow.options import ConfigError

EXPORTERS: Final = ("otlp", "console")
"""What ``OTEL_TRACES_EXPORTER`` may name (comma-separated), besides ``none``."""

SAMPLERS: Final = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
"""The SDK's built-in samplers, as ``OTEL_TRACES_SAMPLER`` names them."""

RATIO_SAMPLERS: Final = ("traceidratio", "parentbased_traceidratio")

PROTOCOL: Final = "http/protobuf"
"""The one OTLP protocol the ``tracing`` extra installs (see docs/operations.md: why not gRPC)."""

BSP_LIMITS: Final = (
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_EXPORT_TIMEOUT",
)
"""The batch span processor's bounds: positive integers (a count or milliseconds)."""

EXPORT_TIMEOUTS: Final = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
"""Seconds one export may take, as the Python SDK reads them (the spec says milliseconds)."""

DEFAULT_SERVICE_NAME: Final = "quoteflow"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` gives one."""

DEFAULT_FLUSH_TIMEOUT: Final = 30.0
"""Seconds shutdown waits for the last spans: ``OTEL_BSP_EXPORT_TIMEOUT``'s default."""

DEFAULT_SCHEDULE_DELAY: Final = 5.0
"""Seconds between the batch processor's exports: ``OTEL_BSP_SCHEDULE_DELAY``'s default."""

RECORD_DELAY_MAX: Final = 1.0
"""Seconds at most between a sampled request's end and its spans being made."""


@attrs.frozen(kw_only=True)
class TracingConfig:
    """What was checked at start-up; ``spans.Tracing`` builds the SDK objects from it."""

    exporters: tuple[str, ...]
    """``otlp`` and/or ``console``."""
    endpoint: str | None
    """The OTLP endpoint, for the start-up log line only (the SDK resolves its own)."""
    sampler: str
    ratio: float | None
    """``OTEL_TRACES_SAMPLER_ARG`` of a ratio sampler."""
    flush_timeout: float
    """Seconds shutdown waits for the last spans to leave (``OTEL_BSP_EXPORT_TIMEOUT``)."""
    record_delay: float = RECORD_DELAY_MAX
    """Seconds at most a sampled request's spans wait to be made with others' (``spans.py``):
    half the batch processor's export delay, and at most ``RECORD_DELAY_MAX``, so a
    request's spans leave about as soon as they would if made at once."""

    def loggable(self) -> dict[str, object]:
        """The fields of the ``tracing_on`` start-up event."""
        return {
            "exporters": list(self.exporters),
            "endpoint": self.endpoint,
            "sampler": self.sampler,
            "ratio": self.ratio,
            "record_delay_s": self.record_delay,
        }


def _set(environ: Mapping[str, str], name: str) -> str | None:
    """A variable's value, or None when it is unset or blank (as the SDK treats blank)."""
    value = environ.get(name, "").strip()
    return value or None


def tracing_from_environ(environ: Mapping[str, str]) -> TracingConfig | None:
    """``None`` when tracing is off; else the checked configuration.

    Raises ``ConfigError`` (one line) for a value the SDK would replace
    with a default, or when the ``tracing`` extra is not installed.
    """
    if (_set(environ, "OTEL_SDK_DISABLED") or "").lower() == "true":
        return None
    named = _set(environ, "OTEL_TRACES_EXPORTER")
    endpoint = _endpoint(environ)
    if named is None:
        if endpoint is None:
            return None
        exporters: tuple[str, ...] = ("otlp",)
    else:
        exporters = _exporters(named)
        if not exporters:
            return None
    if importlib.util.find_spec("opentelemetry.sdk") is None or (
        "otlp" in exporters
        and importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None
    ):
        raise ConfigError(
            "OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT: tracing needs "
            "the tracing extra: pip install 'quoteflow[tracing]'"
        )
    if "otlp" in exporters:
        _check_protocol(environ)
        for name in EXPORT_TIMEOUTS:
            _positive_number(environ, name)
    sampler, ratio = _sampler(environ)
    limits = {name: _positive_int(environ, name) for name in BSP_LIMITS}
    queue, batch = limits["OTEL_BSP_MAX_QUEUE_SIZE"], limits["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"]
    # The SDK's defaults are 2048 and 512; it refuses a batch larger than the queue.
    if (batch or 512) > (queue or 2048):
        raise ConfigError(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE: {batch or 512} is more than "
            f"OTEL_BSP_MAX_QUEUE_SIZE {queue or 2048}"
        )
    export_timeout = limits["OTEL_BSP_EXPORT_TIMEOUT"]
    schedule_delay = limits["OTEL_BSP_SCHEDULE_DELAY"]
    export_delay = DEFAULT_SCHEDULE_DELAY if schedule_delay is None else schedule_delay / 1000
    return TracingConfig(
        exporters=exporters,
        endpoint=endpoint if "otlp" in exporters else None,
        sampler=sampler,
        ratio=ratio,
        flush_timeout=DEFAULT_FLUSH_TIMEOUT if export_timeout is None else export_timeout / 1000,
        record_delay=min(RECORD_DELAY_MAX, export_delay / 2),
    )


def _exporters(named: str) -> tuple[str, ...]:
    """The exporters of ``OTEL_TRACES_EXPORTER``; empty for ``none``."""
    names = tuple(dict.fromkeys(part.strip().lower() for part in named.split(",")))
    if names == ("none",):
        return ()
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: {unknown[0]!r} is not one of {', '.join(EXPORTERS)} or none"
        )
    return names


def _endpoint(environ: Mapping[str, str]) -> str | None:
    """The traces endpoint the exporter will use, if one is set; checked to be an http(s) URL."""
    for name, suffix in (
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "/v1/traces"),
    ):
        value = _set(environ, name)
        if value is None:
            continue
        try:
            url = URL(value)
        except ValueError:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"{name}: {value!r} is not an http:// or https:// URL")
        # The SDK appends the signal's path to the generic endpoint only.
        return str(url.with_user(None).with_password(None)).removesuffix("/") + suffix
    return None


def _check_protocol(environ: Mapping[str, str]) -> None:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = _set(environ, name)
        if value is not None:
            if value != PROTOCOL:
                raise ConfigError(
                    f"{name}: {value!r}: the tracing extra exports OTLP over {PROTOCOL} only"
                )
            return  # the signal's own variable wins over the generic one


def _sampler(environ: Mapping[str, str]) -> tuple[str, float | None]:
    sampler = (_set(environ, "OTEL_TRACES_SAMPLER") or "parentbased_always_on").lower()
    if sampler not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    raw = _set(environ, "OTEL_TRACES_SAMPLER_ARG")
    if sampler not in RATIO_SAMPLERS:
        return sampler, None
    if raw is None:
        return sampler, 1.0  # the SDK's default ratio
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is not a ratio from 0 to 1")
    return sampler, ratio


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = _set(environ, name)
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}: {raw!r} is not a positive integer")
    return int(raw)


def _positive_number(environ: Mapping[str, str], name: str) -> None:
    raw = _set(environ, name)
    if raw is None:
        return
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ConfigError(f"{name}: {raw!r} is not a number of seconds above 0")
