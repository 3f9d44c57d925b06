"""Named callers: the file, the rate (429 quota_exceeded), seats (429 seats_exceeded), headers."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from quoteflow import cli, handlers
from quoteflow.app import create_app
from quoteflow.auth import ApiKeys
from quoteflow.callers import Callers, Rate, Standing, load_callers
from quoteflow.config import Settings
from quoteflow.options import ConfigError, parse_settings
from tests.callers_files import KEYS, bearer, callers_toml, sha256, write_callers
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, delay

SUPPLIERS = ("atlas", "boreal", "cedar")


def load(path: Path, *tables: dict[str, Any], environ: dict[str, str] | None = None) -> Callers:
    """The callers of a file of ``tables``."""
    return load_callers(str(write_callers(path, *tables)), environ or {})


def sent(suppliers: FakeSuppliers) -> int:
    """Requests that reached any supplier."""
    return len(suppliers.received)


# -- the file ---------------------------------------------------------------------------


def test_a_file_of_digests_and_variables_names_each_caller(tmp_path: Path) -> None:
    """A digest or a ``${VAR}`` names a key; rate and seats are each caller's own."""
    callers = load(
        tmp_path / "callers.toml",
        {"name": "acme", "rate": "100/60s", "seats": 2},
        {"name": "beta", "key": "${BETA_KEY}", "rate": "5/1m"},
        {"name": "gamma"},
        environ={"BETA_KEY": KEYS["beta"]},
    )
    acme, beta, gamma = (callers.identify(f"Bearer {KEYS[n]}") for n in ("acme", "beta", "gamma"))
    assert acme is not None
    assert (acme.name, acme.rate, acme.seats) == ("acme", Rate(100, 60), 2)
    assert beta is not None
    assert (beta.name, beta.rate, beta.seats) == ("beta", Rate(5, 60), None)
    assert gamma is not None
    assert (gamma.rate, gamma.seats) == (None, None)
    assert callers.identify("Bearer nobody-0123456789") is None
    assert callers.identify(None) is None
    assert callers.identify(f"Basic {KEYS['acme']}") is None
    assert repr(callers) == "Callers(acme, beta, gamma)"


BAD_FILES = [
    ("name = 'x'\n[[caller]\n", "is not valid TOML"),
    ("[server]\nport = 1\n", "unknown table or key 'server'"),
    ("", "holds no [[caller]] table"),
    (callers_toml({"name": "acme", "rte": "1/1s"}), "caller 'acme': unknown field 'rte'"),
    (callers_toml({"name": "acme", "rate": "0/60s"}), "caller 'acme': rate '0/60s': at least 1"),
    (callers_toml({"name": "acme", "rate": "10/0s"}), "caller 'acme': rate '10/0s': the window"),
    (callers_toml({"name": "acme", "rate": "ten/min"}), "caller 'acme': rate 'ten/min' is not"),
    (callers_toml({"name": "acme", "seats": 0}), "caller 'acme': seats must be"),
    (callers_toml({"name": "acme", "seats": True}), "caller 'acme': seats must be"),
    (callers_toml({"name": "acme"}, {"name": "acme"}), "caller 'acme' appears twice"),
    (
        callers_toml({"name": "acme"}, {"name": "beta", "key_sha256": sha256(KEYS["acme"])}),
        "callers 'acme' and 'beta' have the same key",
    ),
    (callers_toml({"name": "acme", "key_sha256": "abc123"}), "caller 'acme': key_sha256 must"),
    (callers_toml({"name": "acme", "key": "${NOT_SET}"}), "caller 'acme': key: ${NOT_SET} is not"),
    (callers_toml({"name": "acme", "key": KEYS["acme"]}), "caller 'acme': key must be \"${"),
    (
        callers_toml({"name": "acme", "key": "${A}", "key_sha256": sha256("x")}),
        "caller 'acme': give exactly one",
    ),
    (callers_toml({"name": "Acme Corp"}), "caller #1: name must be"),
    (callers_toml({"name": "-"}), "caller '-': the name '-'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_a_bad_file_is_one_line_naming_the_caller_never_a_key(
    tmp_path: Path, text: str, message: str
) -> None:
    """Each mistake is one ``ConfigError`` line naming the file and caller, quoting no key."""
    path = tmp_path / "callers.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_callers(str(path), {})
    error = str(raised.value)
    assert message in error
    assert error.startswith(str(path))
    assert "\n" not in error
    for key in KEYS.values():
        assert key not in error
        assert sha256(key) not in error


def test_bad_file_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m quoteflow --callers`` with a bad file: exit 2, one line on stderr."""
    path = tmp_path / "callers.toml"
    path.write_text(callers_toml({"name": "acme", "rate": "ten/min"}), encoding="utf-8")
    assert cli.main(["--callers", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("quoteflow: error: --callers: ")
    assert "caller 'acme'" in err


def test_the_variable_names_the_file_and_excludes_api_keys(tmp_path: Path) -> None:
    """``QUOTEFLOW_CALLERS_FILE`` loads the file; with ``--api-keys-file`` too it is an error."""
    path = write_callers(tmp_path / "callers.toml", {"name": "acme"})
    settings = parse_settings([], {"QUOTEFLOW_CALLERS_FILE": str(path)})
    assert settings.callers is not None
    assert settings.callers.names == ("acme",)
    keys = tmp_path / "keys"
    keys.write_text(KEYS["beta"] + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot both be given"):
        parse_settings(["--callers", str(path), "--api-keys-file", str(keys)], {})


def test_retry_after_is_never_earlier_than_the_next_admission() -> None:
    """Retry-After rounds the wait up: a wait of 12.0001 s is 13 s, never 12."""
    rate = Rate(1, 10)
    assert Standing(rate, used=1.20001, burst=1, interval=10).retry_after == 13
    assert Standing(rate, used=1.0, burst=1, interval=10).retry_after == 10
    assert Standing(rate, used=1.00001, burst=1, interval=10).fields("a") == (
        '"a";q=1;w=10',
        '"a";r=0;t=11',
    )


# -- the rate ---------------------------------------------------------------------------


async def test_a_caller_over_its_rate_is_429_with_exact_fields_then_admitted_again(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """2 per 2 s: two answers, then 429 with Retry-After and both fields; after it, a 200."""
    callers = load(tmp_path / "c.toml", {"name": "acme", "rate": "2/2s"}, {"name": "beta"})
    client = await start_quoteflow(callers=callers)
    first = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    assert first.status == 200
    assert first.headers["RateLimit-Policy"] == '"acme";q=2;w=2'
    assert first.headers["RateLimit"] == '"acme";r=1;t=1'
    # A wrong key is 401 and costs nobody's quota.
    assert (await client.post("/api/quotes", json={}, headers=bearer("gamma"))).status == 401
    second = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    assert (second.status, second.headers["RateLimit"]) == (200, '"acme";r=0;t=1')
    before = sent(suppliers)

    refused = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    assert refused.status == 429
    body = await refused.json()
    assert body["error"] == "quota_exceeded"
    assert body["retry_after_s"] == 1
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["RateLimit-Policy"] == '"acme";q=2;w=2'
    assert refused.headers["RateLimit"] == '"acme";r=0;t=1'
    assert refused.headers["X-Request-ID"]
    assert sent(suppliers) == before  # nothing reached a supplier
    # Another caller, without a rate, is not limited and gets no RateLimit fields.
    other = await client.post("/api/quotes", json={}, headers=bearer("beta"))
    assert other.status == 200
    assert "RateLimit" not in other.headers

    await asyncio.sleep(int(refused.headers["Retry-After"]))
    again = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    assert (again.status, again.headers["RateLimit"]) == (200, '"acme";r=0;t=1')


async def test_every_answer_to_a_caller_with_a_rate_carries_the_fields(
    start_quoteflow: StartQuoteFlow, tmp_path: Path
) -> None:
    """A 422 and a 400 carry both fields too, counted after the request they answer."""
    callers = load(tmp_path / "c.toml", {"name": "acme", "rate": "10/60s"})
    client = await start_quoteflow(callers=callers)
    invalid = await client.post("/api/quotes", json={"quantity": 0}, headers=bearer("acme"))
    assert invalid.status == 422
    assert invalid.headers["RateLimit"] == '"acme";r=9;t=6'
    not_json = await client.post("/api/quotes", data=b"{", headers=bearer("acme"))
    assert not_json.status == 400
    assert not_json.headers["RateLimit"] == '"acme";r=8;t=6'
    assert not_json.headers["RateLimit-Policy"] == '"acme";q=10;w=60'


# -- seats ------------------------------------------------------------------------------


async def test_a_third_request_of_two_seats_is_429_while_another_caller_is_served(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """seats = 2: with two requests held, the third is 429 seats_exceeded; it spends no quota.

    beta's request waits for the slots the held ones free at 0.3 s; a 1 s
    budget leaves it the 0.3 s the suppliers then turn out to need (with
    0.6 s it was at the edge, and a call of it could give its place up).
    """
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.3))
    callers = load(
        tmp_path / "c.toml", {"name": "acme", "rate": "10/60s", "seats": 2}, {"name": "beta"}
    )
    client = await start_quoteflow(callers=callers, budget=1.0)

    async def ask(name: str) -> Any:
        return await client.post("/api/quotes", json={}, headers=bearer(name))

    held = [asyncio.create_task(ask("acme")) for _ in range(2)]
    async with asyncio.timeout(2):
        # Polled: the fake suppliers count arrivals, they signal nothing.
        while suppliers.in_flight < 6:  # noqa: ASYNC110 -- both held requests are at their suppliers
            await asyncio.sleep(0.01)
    before = sent(suppliers)
    third, other = await asyncio.gather(ask("acme"), ask("beta"))
    assert third.status == 429
    assert (await third.json())["error"] == "seats_exceeded"
    assert third.headers["Retry-After"] == "1"
    # Two requests spent, the refused one none.
    assert third.headers["RateLimit"].startswith('"acme";r=8;')
    assert sent(suppliers) == before + 3  # only beta's request was sent on
    assert other.status == 200
    assert [r.status for r in await asyncio.gather(*held)] == [200, 200]
    after = await ask("acme")
    assert after.status == 200
    assert after.headers["RateLimit"].startswith('"acme";r=7;')


async def test_a_rate_refusal_holds_no_seat(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """Refused for its rate, a request leaves its seat free: seats = 1 still serves the next."""
    callers = load(tmp_path / "c.toml", {"name": "acme", "rate": "1/60s", "seats": 1})
    client = await start_quoteflow(callers=callers)
    assert (await client.post("/api/quotes", json={}, headers=bearer("acme"))).status == 200
    for _ in range(3):
        refused = await client.post("/api/quotes", json={}, headers=bearer("acme"))
        assert (await refused.json())["error"] == "quota_exceeded"
    assert client.app is not None
    assert client.app[handlers.GATE].seated == {}


# -- what an operator sees -----------------------------------------------------------------


async def test_metrics_log_and_bill_name_the_caller(
    start_quoteflow: StartQuoteFlow, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Per-caller counts by result, the name in the request's log line and the bill; no key."""
    caplog.set_level(logging.DEBUG, logger="quoteflow")
    callers = load(tmp_path / "c.toml", {"name": "acme", "rate": "2/60s"})
    client = await start_quoteflow(callers=callers)
    served = await client.post("/api/quotes?explain=1", json={}, headers=bearer("acme"))
    assert (await served.json())["explain"]["caller"] == "acme"
    invalid = await client.post("/api/quotes", json={"sku": ""}, headers=bearer("acme"))
    assert invalid.status == 422
    assert (await client.post("/api/quotes", json={}, headers=bearer("acme"))).status == 429
    text = (await (await client.get("/metrics")).read()).decode()
    assert 'quoteflow_caller_requests_total{caller="acme",result="ok"} 1.0' in text
    assert 'quoteflow_caller_requests_total{caller="acme",result="invalid"} 1.0' in text
    assert 'quoteflow_caller_requests_total{caller="acme",result="quota_exceeded"} 1.0' in text
    assert 'quoteflow_requests_total{result="quota_exceeded"} 1.0' in text
    lines = [r.fields for r in caplog.records if getattr(r, "event", "") == "quote_request"]  # type: ignore[attr-defined]
    assert [(f["status"], f.get("caller")) for f in lines] == [
        (200, "acme"),
        (422, "acme"),
        (429, "acme"),
    ]
    logged = caplog.text + repr([getattr(r, "fields", None) for r in caplog.records])
    assert KEYS["acme"] not in logged
    assert sha256(KEYS["acme"]) not in logged


async def test_api_keys_are_unnamed_callers_counted_as_dash(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """``--api-keys-file`` works as before: no quota, no fields, counted as ``caller="-"``."""
    client = await start_quoteflow(api_keys=ApiKeys([KEYS["acme"]]))
    for _ in range(3):
        answer = await client.post("/api/quotes", json={}, headers=bearer("acme"))
        assert answer.status == 200
        assert "RateLimit" not in answer.headers
    assert (await client.post("/api/quotes", json={})).status == 401
    text = (await (await client.get("/metrics")).read()).decode()
    assert 'quoteflow_caller_requests_total{caller="-",result="ok"} 3.0' in text


def test_settings_refuse_callers_and_api_keys_together(tmp_path: Path) -> None:
    """The two ways of naming keys exclude each other."""
    callers = load(tmp_path / "c.toml", {"name": "acme"})
    with pytest.raises(ValueError, match="cannot both be given"):
        Settings(callers=callers, api_keys=ApiKeys([KEYS["beta"]]))


def test_without_keys_a_request_passes_no_callers_layer() -> None:
    """Callers off: no auth middleware, no response hook, the plain handler: nothing per request."""
    app = create_app(Settings())
    assert list(app.middlewares) == [handlers.error_middleware]
    assert handlers.caller_answered not in app.on_response_prepare
    (route,) = [
        r for r in app.router.routes() if r.method == "POST" and "quotes" in str(r.url_for())
    ]
    assert route.handler is handlers.quotes
    assert handlers.GATE not in app


async def test_our_overload_stays_503_and_spends_no_quota(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """Inbound limit full: 503 capacity_exhausted, not 429; its RateLimit shows nothing spent."""
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.3))
    callers = load(tmp_path / "c.toml", {"name": "acme", "rate": "10/60s"})
    client = await start_quoteflow(callers=callers, inbound_limit=1, budget=0.6)
    held = asyncio.create_task(client.post("/api/quotes", json={}, headers=bearer("acme")))
    async with asyncio.timeout(2):
        while suppliers.in_flight < 3:  # noqa: ASYNC110 -- the held request is at its suppliers
            await asyncio.sleep(0.01)
    busy = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    assert busy.status == 503
    assert (await busy.json())["error"] == "capacity_exhausted"
    assert busy.headers["Retry-After"] == "1"
    assert busy.headers["RateLimit"].startswith('"acme";r=9;')  # only the held one spent
    assert (await held).status == 200
