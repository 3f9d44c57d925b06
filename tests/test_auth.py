"""Optional bearer API keys: off by default, 401 without a valid key, never logged."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from quoteflow.auth import ApiKeys, ApiKeysError
from quoteflow.config import Settings
from quoteflow.logs import JsonFormatter
from quoteflow.options import ConfigError, parse_settings
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers

KEYS = ("first-key-0123456789", "second-key-abcdefghij")


def bearer(key: str) -> dict[str, str]:
    """The ``Authorization`` header for ``key``."""
    return {"Authorization": f"Bearer {key}"}


def keyed(**overrides: Any) -> dict[str, Any]:
    """Settings overrides that turn API keys on."""
    return {"api_keys": ApiKeys(KEYS), **overrides}


# -- off by default ---------------------------------------------------------------------


async def test_off_by_default_with_one_warning(
    start_quoteflow: StartQuoteFlow, caplog: pytest.LogCaptureFixture
) -> None:
    """Without keys every route is open, and start-up says so in one warning."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    client = await start_quoteflow()
    assert (await client.post("/api/quotes", json={})).status == 200
    assert (await client.get("/metrics")).status == 200
    events = [r for r in caplog.records if getattr(r, "event", "").startswith("api_keys")]
    assert [(r.event, r.levelno) for r in events] == [("api_keys_off", logging.WARNING)]  # type: ignore[attr-defined]


# -- on ---------------------------------------------------------------------------------


async def test_missing_key_is_401_and_reaches_no_supplier(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """No Authorization header: 401, a Bearer challenge, a JSON error, no supplier asked."""
    client = await start_quoteflow(**keyed())
    response = await client.post("/api/quotes", json={})
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="quoteflow"'
    assert response.headers["X-Request-ID"]
    assert await response.json() == {"error": "unauthorized", "detail": "no bearer key"}
    assert suppliers.received == []


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-key",
        f"Bearer {KEYS[0]}x",
        f"Bearer {KEYS[0][:-1]}",
        f"Basic {KEYS[0]}",
        KEYS[0],
        "Bearer",
        "Bearer ",
        f"Bearer {KEYS[0]} {KEYS[1]}",
        f"Bearer {KEYS[0]},",
    ],
)
async def test_wrong_key_is_401(
    authorization: str, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A wrong, truncated, extended or malformed key is a 401 saying ``invalid_token``."""
    client = await start_quoteflow(**keyed())
    response = await client.post("/api/quotes", json={}, headers={"Authorization": authorization})
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == (
        'Bearer realm="quoteflow", error="invalid_token"'
    )
    assert (await response.json())["error"] == "unauthorized"
    assert suppliers.received == []


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
async def test_every_configured_key_opens_quotes(
    key: str, scheme: str, start_quoteflow: StartQuoteFlow
) -> None:
    """Each key of the file works, whatever the case of the scheme name."""
    client = await start_quoteflow(**keyed())
    response = await client.post(
        "/api/quotes", json={}, headers={"Authorization": f"{scheme} {key}"}
    )
    assert response.status == 200
    assert (await response.json())["best"]["supplier"] == "boreal"


async def test_every_api_path_is_keyed(start_quoteflow: StartQuoteFlow) -> None:
    """Without a key, any method or path under /api/ is 401 — it reveals no route or method."""
    client = await start_quoteflow(**keyed())
    assert (await client.get("/api/quotes")).status == 401
    assert (await client.post("/api/unknown")).status == 401
    assert (await client.get("/api/quotes", headers=bearer(KEYS[0]))).status == 405


async def test_probes_and_document_stay_open(start_quoteflow: StartQuoteFlow) -> None:
    """/health, /ready, /openapi.json and (by default) /metrics need no key."""
    client = await start_quoteflow(**keyed())
    for path in ("/health", "/ready", "/openapi.json", "/metrics"):
        assert (await client.get(path)).status == 200, path


async def test_metrics_can_require_a_key(start_quoteflow: StartQuoteFlow) -> None:
    """With metrics_require_key, /metrics is 401 without a key and 200 with one."""
    client = await start_quoteflow(**keyed(metrics_require_key=True))
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers=bearer(KEYS[1]))).status == 200
    assert (await client.get("/health")).status == 200


def test_metrics_key_needs_keys() -> None:
    """Asking /metrics for a key with no keys configured is a settings error."""
    with pytest.raises(ValueError, match="API keys"):
        Settings(metrics_require_key=True)


async def test_keys_are_never_logged(
    start_quoteflow: StartQuoteFlow, caplog: pytest.LogCaptureFixture
) -> None:
    """Start-up, a 200, a wrong key and a 401: no key appears in any log line or repr."""
    caplog.set_level(logging.DEBUG)
    settings = Settings(**keyed(metrics_require_key=True))
    client = await start_quoteflow(**keyed(metrics_require_key=True))
    await client.post("/api/quotes", json={}, headers=bearer(KEYS[0]))
    await client.post("/api/quotes", json={}, headers=bearer(KEYS[1] + "-wrong"))
    await client.get("/metrics")
    formatter = JsonFormatter()
    logged = "\n".join(formatter.format(record) for record in caplog.records)
    logged += repr(settings) + str(attrs.asdict(settings))
    assert "api_keys_on" in logged
    for key in KEYS:
        assert key not in logged
        assert key[:8] not in logged


def test_every_key_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check compares the presented key with every configured key, match or not."""
    keys = ApiKeys([f"key-{n}" for n in range(5)])
    calls: list[tuple[bytes, bytes]] = []

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return a == b

    monkeypatch.setattr("hmac.compare_digest", counting)
    for authorization in ("Bearer key-0", "Bearer key-4", "Bearer nope", None, "junk"):
        calls.clear()
        keys.accepts(authorization)
        assert len(calls) == 5
        # Digests of equal length: a wrong key's length is never compared against.
        assert {len(a) for a, _ in calls} == {32}


# -- the keys file ----------------------------------------------------------------------


def test_keys_file_skips_blanks_and_comments(tmp_path: Path) -> None:
    """One key per line; blank lines, ``#`` comments and surrounding spaces are ignored."""
    path = tmp_path / "keys"
    path.write_text(f"# QuoteFlow callers\n\n  {KEYS[0]}  \n\t\n# old: retired\n{KEYS[1]}\n")
    keys = ApiKeys.from_file(str(path))
    assert len(keys) == 2
    assert keys == ApiKeys(KEYS)
    assert repr(keys) == "ApiKeys(2 keys)"
    assert keys.accepts(f"Bearer {KEYS[1]}")
    assert not keys.accepts("Bearer retired")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "holds no API key"),
        (b"# only a comment\n\n   \n", "holds no API key"),
        (b"good-key\nhas a space\n", "line 2 is not a bearer key"),
        (b"\xff\xfe\x00k", "is not UTF-8"),
    ],
)
def test_unusable_keys_file_is_refused(content: bytes, reason: str, tmp_path: Path) -> None:
    """An empty, comment-only, malformed or non-text keys file is refused, quoting no key."""
    path = tmp_path / "keys"
    path.write_bytes(content)
    with pytest.raises(ApiKeysError, match=reason) as caught:
        ApiKeys.from_file(str(path))
    assert "space" not in str(caught.value)


def test_unreadable_keys_file_is_refused(tmp_path: Path) -> None:
    """A missing file or a directory is refused with the reason in one line."""
    with pytest.raises(ApiKeysError, match="cannot read"):
        ApiKeys.from_file(str(tmp_path / "missing"))
    with pytest.raises(ApiKeysError, match="cannot read"):
        ApiKeys.from_file(str(tmp_path))


def test_keys_file_from_flag_and_environment(tmp_path: Path) -> None:
    """--api-keys-file or QUOTEFLOW_API_KEYS_FILE load the keys; the flag wins."""
    flag_file, env_file = tmp_path / "flag", tmp_path / "env"
    flag_file.write_text(KEYS[0] + "\n")
    env_file.write_text(KEYS[1] + "\n")
    environ = {"QUOTEFLOW_API_KEYS_FILE": str(env_file)}
    assert parse_settings([], environ).api_keys == ApiKeys([KEYS[1]])
    assert parse_settings(["--api-keys-file", str(flag_file)], environ).api_keys == ApiKeys(
        [KEYS[0]]
    )
    assert parse_settings([], {}).api_keys is None


def test_metrics_switch_from_flag_and_environment(tmp_path: Path) -> None:
    """--metrics-require-key is a bare flag; QUOTEFLOW_METRICS_REQUIRE_KEY takes 1/0 words."""
    path = tmp_path / "keys"
    path.write_text(KEYS[0])
    keys = ["--api-keys-file", str(path)]
    assert parse_settings([*keys, "--metrics-require-key"], {}).metrics_require_key
    assert parse_settings(keys, {"QUOTEFLOW_METRICS_REQUIRE_KEY": "yes"}).metrics_require_key
    assert not parse_settings(keys, {"QUOTEFLOW_METRICS_REQUIRE_KEY": "0"}).metrics_require_key
    with pytest.raises(ConfigError, match="QUOTEFLOW_METRICS_REQUIRE_KEY"):
        parse_settings(keys, {"QUOTEFLOW_METRICS_REQUIRE_KEY": "maybe"})
    with pytest.raises(ConfigError, match="API keys"):
        parse_settings(["--metrics-require-key"], {})


@pytest.mark.parametrize("content", [None, "", "# nothing here\n"])
def test_bad_keys_file_stops_start_up_with_one_line(content: str | None, tmp_path: Path) -> None:
    """`python -m quoteflow` with a missing or empty keys file exits 2 with one line."""
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--api-keys-file", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("quoteflow: error: --api-keys-file: ")
    assert "Traceback" not in done.stderr


# -- the supplier body cap's flag -------------------------------------------------------


def test_supplier_body_cap_from_flag_and_environment() -> None:
    """--max-supplier-body or QUOTEFLOW_MAX_SUPPLIER_BODY set the cap; bad values are refused."""
    assert parse_settings([], {}).max_supplier_body_bytes == 64 * 1024
    environ = {"QUOTEFLOW_MAX_SUPPLIER_BODY": "2048"}
    assert parse_settings([], environ).max_supplier_body_bytes == 2048
    assert parse_settings(["--max-supplier-body", "4096"], environ).max_supplier_body_bytes == 4096
    for bad in ("lots", "0", "-1"):
        with pytest.raises(ConfigError):
            parse_settings(["--max-supplier-body", bad], {})
