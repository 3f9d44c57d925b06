"""The token endpoint (RFC 6749 §4.4, client credentials) and its control API, on real sockets."""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import aiohttp
import pytest

from provider_lab.control_client import LabControl, LabError
from tests.lab.conftest import (
    LabClient,
    StartLab,
    ask_json,
    ask_path,
    basic,
    fetch_token,
    token_request,
)

GRANT = {"grant_type": "client_credentials"}
CHALLENGE = 'Basic realm="provider-lab"'


async def oauth2(lab: LabClient) -> dict[str, Any]:
    """``GET /oauth2``."""
    async with lab.get("/oauth2") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def put_oauth2(lab: LabClient, body: Any) -> tuple[int, dict[str, Any]]:
    """``PUT /oauth2``; the status and the JSON answer."""
    async with lab.put("/oauth2", json=body) as response:
        return response.status, await response.json()


async def fetches(lab: LabClient) -> dict[str, int]:
    """The token endpoint's counts."""
    counts: dict[str, int] = (await oauth2(lab))["fetches"]
    return counts


# -- issuing tokens ------------------------------------------------------------------------


async def test_basic_authentication_issues_a_bearer_token(lab: LabClient) -> None:
    """Basic credentials and the grant: 200, a fresh url-safe token, ``no-store``."""
    status, body, headers = await token_request(lab)
    assert status == 200
    assert set(body) == {"access_token", "token_type", "expires_in"}
    assert (body["token_type"], body["expires_in"]) == ("Bearer", 3600)
    assert re.fullmatch(r"[A-Za-z0-9_-]{32,}", body["access_token"])
    assert headers["Cache-Control"] == "no-store"
    assert headers["Pragma"] == "no-cache"
    assert headers["Content-Type"].startswith("application/json")
    assert await fetch_token(lab) != body["access_token"]  # fresh every time


async def test_credentials_in_the_body_issue_a_token(lab: LabClient) -> None:
    """RFC 6749 §2.3.1's other form: ``client_id`` and ``client_secret`` in the form."""
    form = {**GRANT, "client_id": "quoteflow", "client_secret": "lab-secret"}
    status, body, _ = await token_request(lab, form, Authorization="")
    assert status == 200
    assert (await ask_json(lab, token=body["access_token"]))[0] == 200


async def test_basic_parts_are_form_urlencoded_before_base64(lab: LabClient) -> None:
    """An id and secret with ``:``, ``+``, ``%``, spaces and non-ASCII work once urlencoded."""
    client_id, secret = "shop:eu+1", "s3cr%t: é+/=="
    status, _ = await put_oauth2(lab, {"client_id": client_id, "client_secret": secret})
    assert status == 200
    assert (await token_request(lab, Authorization=basic(client_id, secret)))[0] == 200
    unencoded = "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()
    status, body, _ = await token_request(lab, Authorization=unencoded)
    assert (status, body) == (401, {"error": "invalid_client"})


@pytest.mark.parametrize(
    ("form", "authorization"),
    [
        (GRANT, basic("quoteflow", "wrong")),
        (GRANT, basic("someone", "lab-secret")),
        (GRANT, basic("", "")),
        (GRANT, ""),  # no credentials at all
        (GRANT, "Basic not*base64"),
        (GRANT, "Basic " + base64.b64encode(b"no-colon").decode()),
        (GRANT, "Basic " + base64.b64encode(b"\xff:\xfe").decode()),
        (GRANT, "Bearer quoteflow:lab-secret"),
        ({**GRANT, "client_id": "quoteflow", "client_secret": "wrong"}, ""),
        ({**GRANT, "client_id": "quoteflow"}, ""),
        ({**GRANT, "client_secret": "lab-secret"}, ""),
    ],
)
async def test_wrong_or_missing_credentials_are_401_invalid_client(
    lab: LabClient, form: dict[str, str], authorization: str
) -> None:
    """Anything but the lab's client is 401 ``invalid_client`` with a Basic challenge."""
    status, body, headers = await token_request(lab, form, Authorization=authorization)
    assert (status, body) == (401, {"error": "invalid_client"})
    assert headers["WWW-Authenticate"] == CHALLENGE
    assert await fetches(lab) == {"issued": 0, "refused": 1, "failed": 0}


async def test_both_authentication_forms_at_once_are_400(lab: LabClient) -> None:
    """Basic and credentials in the body together: 400 ``invalid_request`` (one method only)."""
    form = {**GRANT, "client_id": "quoteflow", "client_secret": "lab-secret"}
    status, body, headers = await token_request(lab, form)
    assert (status, body) == (400, {"error": "invalid_request"})
    assert "WWW-Authenticate" not in headers


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({}, "invalid_request"),
        ({"scope": "quotes"}, "invalid_request"),
        ({"grant_type": "password"}, "unsupported_grant_type"),
        ({"grant_type": "authorization_code"}, "unsupported_grant_type"),
        ({"grant_type": ""}, "unsupported_grant_type"),
        ({"grant_type": "CLIENT_CREDENTIALS"}, "unsupported_grant_type"),
    ],
)
async def test_grant_type_is_checked(lab: LabClient, form: dict[str, str], error: str) -> None:
    """No ``grant_type``: 400 ``invalid_request``; another grant: 400 ``unsupported_grant_type``."""
    status, body, _ = await token_request(lab, form)
    assert (status, body) == (400, {"error": error})


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b'{"grant_type": "client_credentials"}', "application/json"),
        (b"grant_type=client_credentials", "text/plain"),
        (b"grant_type=client_credentials&grant_type=client_credentials", None),
        (b"grant_type=client_credentials&scope", None),
        (b"grant_type=client_credentials&&", None),
        (b"grant_type=client_credentials&scope=%FF", None),
    ],
)
async def test_a_body_that_is_not_one_form_is_400(
    lab: LabClient, data: bytes, content_type: str | None
) -> None:
    """Not form-encoded, a field without ``=``, a repeated parameter, not UTF-8: 400."""
    headers = {"Authorization": basic()}
    headers["Content-Type"] = content_type or "application/x-www-form-urlencoded"
    async with lab.post("/oauth2/token", data=data, headers=headers) as response:
        assert (response.status, await response.json()) == (400, {"error": "invalid_request"})


async def test_scope_and_extra_params_are_recorded_without_credentials(lab: LabClient) -> None:
    """``last_params`` shows what arrived (``scope``, ``audience``...), never the credentials."""
    form = {
        **GRANT,
        "scope": "quotes:read prices",
        "audience": "https://api.example/ü",
        "client_id": "quoteflow",
        "client_secret": "lab-secret",
    }
    assert (await token_request(lab, form, Authorization=""))[0] == 200
    state = await oauth2(lab)
    assert state["last_params"] == {
        "grant_type": "client_credentials",
        "scope": "quotes:read prices",
        "audience": "https://api.example/ü",
    }
    assert (await token_request(lab, {**GRANT, "resource": "x"}))[0] == 200
    assert (await oauth2(lab))["last_params"] == {
        "grant_type": "client_credentials",
        "resource": "x",
    }


async def test_get_oauth2_shows_everything_but_the_secret(lab: LabClient) -> None:
    """``GET /oauth2``: client id, ``expires_in``, fault, counts, last params, live tokens."""
    assert await oauth2(lab) == {
        "client_id": "quoteflow",
        "expires_in": 3600,
        "fault": None,
        "fetches": {"issued": 0, "refused": 0, "failed": 0},
        "last_params": {},
        "live_tokens": 0,
    }
    token = await fetch_token(lab)
    async with lab.get("/oauth2") as response:
        text = await response.text()
    assert "lab-secret" not in text
    assert token not in text
    assert (await oauth2(lab))["live_tokens"] == 1


# -- expiry and revocation -----------------------------------------------------------------


async def test_a_token_is_refused_once_it_expires(start_lab: StartLab) -> None:
    """``--token-ttl 1``: ``expires_in`` 1; the token works, and a second later it is a 401."""
    lab = await start_lab(token_ttl=1)
    status, body, _ = await token_request(lab)
    assert (status, body["expires_in"]) == (200, 1)
    token = body["access_token"]
    assert (await ask_json(lab, token=token))[0] == 200
    await asyncio.sleep(1.05)
    assert (await ask_json(lab, token=token))[0] == 401
    assert (await oauth2(lab))["live_tokens"] == 0
    assert (await ask_json(lab, token=await fetch_token(lab)))[0] == 200  # a fresh one works


async def test_expires_in_changes_live_for_tokens_issued_afterwards(lab: LabClient) -> None:
    """``PUT /oauth2 {"expires_in": 1}``: new tokens last 1 s; tokens issued before keep theirs."""
    before = await fetch_token(lab)
    status, state = await put_oauth2(lab, {"expires_in": 1})
    assert (status, state["expires_in"]) == (200, 1)
    status, body, _ = await token_request(lab)
    assert body["expires_in"] == 1
    await asyncio.sleep(1.05)
    assert (await ask_json(lab, token=body["access_token"]))[0] == 401
    assert (await ask_json(lab, token=before))[0] == 200


async def test_revoking_every_token_makes_the_next_bearer_call_401(lab: LabClient) -> None:
    """``DELETE /oauth2/tokens``: every issued token is refused; a fresh one then works."""
    tokens = [await fetch_token(lab) for _ in range(3)]
    async with lab.delete("/oauth2/tokens") as response:
        assert (response.status, await response.json()) == (200, {"revoked": 3})
    for token in tokens:
        assert (await ask_json(lab, token=token))[0] == 401
    assert (await oauth2(lab))["live_tokens"] == 0
    assert (await ask_json(lab, token=await fetch_token(lab)))[0] == 200


async def test_issued_tokens_are_bounded(start_lab: StartLab) -> None:
    """Past ``token_limit`` the oldest token is forgotten, and so refused."""
    lab = await start_lab(token_limit=2)
    first, second, third = [await fetch_token(lab) for _ in range(3)]
    assert (await oauth2(lab))["live_tokens"] == 2
    assert (await ask_json(lab, token=first))[0] == 401
    assert (await ask_json(lab, token=second))[0] == 200
    assert (await ask_json(lab, token=third))[0] == 200


async def test_rotated_credentials_apply_to_the_next_request(lab: LabClient) -> None:
    """A new id or secret is the only one accepted from then on; tokens issued stay good."""
    token = await fetch_token(lab)
    status, state = await put_oauth2(lab, {"client_id": "shop-2", "client_secret": "rotated"})
    assert (status, state["client_id"]) == (200, "shop-2")
    assert (await token_request(lab))[0] == 401
    assert (await token_request(lab, Authorization=basic("shop-2", "rotated")))[0] == 200
    assert (await ask_json(lab, token=token))[0] == 200


async def test_start_up_credentials_come_from_the_config(start_lab: StartLab) -> None:
    """``LabConfig(client_id=..., client_secret=...)`` (the CLI's flags) is the client."""
    lab = await start_lab(client_id="erp", client_secret="hunter2")
    assert (await token_request(lab))[0] == 401
    assert (await token_request(lab, Authorization=basic("erp", "hunter2")))[0] == 200
    assert (await oauth2(lab))["client_id"] == "erp"


# -- the endpoint's own faults -------------------------------------------------------------


async def test_down_resets_the_connection_until_cleared(lab: LabClient) -> None:
    """``{"kind": "down"}``: every fetch gets its connection reset, no answer; null undoes it."""
    status, state = await put_oauth2(lab, {"fault": {"kind": "down"}})
    assert (status, state["fault"]) == (200, {"kind": "down"})
    for _ in range(2):  # not a one-shot
        with pytest.raises(aiohttp.ClientConnectionError):
            await token_request(lab)
    assert await fetches(lab) == {"issued": 0, "refused": 0, "failed": 2}
    assert (await put_oauth2(lab, {"fault": None}))[1]["fault"] is None
    assert (await token_request(lab))[0] == 200


async def test_http_500_until_cleared(lab: LabClient) -> None:
    """``{"kind": "http_500"}``: a 500 with a JSON body on every fetch."""
    await put_oauth2(lab, {"fault": {"kind": "http_500"}})
    for _ in range(2):
        status, body, _ = await token_request(lab)
        assert (status, body) == (500, {"error": "injected_http_500"})
    assert await fetches(lab) == {"issued": 0, "refused": 0, "failed": 2}


async def test_slow_answers_after_ms_then_normally(lab: LabClient) -> None:
    """``{"kind": "slow", "ms": N}``: the normal answer, N ms late, a refusal as much as a token."""
    status, state = await put_oauth2(lab, {"fault": {"kind": "slow", "ms": 300}})
    assert (status, state["fault"]) == (200, {"kind": "slow", "ms": 300})
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await token_request(lab))[0] == 200
    assert (await token_request(lab, Authorization=basic("x", "y")))[0] == 401
    assert loop.time() - started >= 0.6
    assert await fetches(lab) == {"issued": 1, "refused": 1, "failed": 0}


async def test_a_client_that_gives_up_on_slow_is_a_failed_fetch(lab: LabClient) -> None:
    """A fetch abandoned during ``slow`` is counted ``failed``, so every fetch is counted once."""
    await put_oauth2(lab, {"fault": {"kind": "slow", "ms": 5000}})
    with pytest.raises(asyncio.TimeoutError):
        async with lab.post(
            "/oauth2/token",
            data=GRANT,
            headers={"Authorization": basic()},
            timeout=aiohttp.ClientTimeout(total=0.1),
        ):
            pass
    for _ in range(100):  # the lab notices within its 20 ms poll
        if (await fetches(lab))["failed"]:
            break
        await asyncio.sleep(0.02)
    assert await fetches(lab) == {"issued": 0, "refused": 0, "failed": 1}


async def test_reset_zeroes_the_counts_but_keeps_tokens_and_fault(lab: LabClient) -> None:
    """``POST /reset`` zeroes the fetch counts and the last params; tokens and fault stay."""
    token = await fetch_token(lab)
    await token_request(lab, Authorization=basic("x", "y"))
    await put_oauth2(lab, {"fault": {"kind": "slow", "ms": 1}})
    assert await fetches(lab) == {"issued": 1, "refused": 1, "failed": 0}
    async with lab.post("/reset") as response:
        assert response.status == 200
    state = await oauth2(lab)
    assert state["fetches"] == {"issued": 0, "refused": 0, "failed": 0}
    assert state["last_params"] == {}
    assert (state["live_tokens"], state["fault"]) == (1, {"kind": "slow", "ms": 1})
    assert (await ask_json(lab, token=token))[0] == 200


async def test_token_fetches_are_not_supplier_requests(lab: LabClient) -> None:
    """The token endpoint is not a supplier: ``/stats`` does not count its requests."""
    await fetch_token(lab)
    async with lab.get("/stats") as response:
        assert (await response.json())["total"] == 0


# -- PUT /oauth2 validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "body: must be a JSON object"),
        ({"secret": "x"}, "secret: not a setting"),
        ({"client_id": ""}, "client_id: must be 1–256 printable characters"),
        ({"client_id": 5}, "client_id: must be"),
        ({"client_secret": "a\nb"}, "client_secret: must be"),
        ({"client_secret": "x" * 257}, "client_secret: must be"),
        ({"expires_in": 0}, "expires_in: must be an integer"),
        ({"expires_in": 1.5}, "expires_in: must be an integer"),
        ({"expires_in": True}, "expires_in: must be an integer"),
        ({"expires_in": "60"}, "expires_in: must be an integer"),
        ({"fault": "down"}, "fault: must be null or"),
        ({"fault": {}}, "fault: must be null or"),
        ({"fault": {"kind": "hang"}}, "fault.kind: must be one of"),
        ({"fault": {"kind": "slow"}}, "fault.ms: required for slow"),
        ({"fault": {"kind": "slow", "ms": -1}}, "fault.ms: required for slow"),
        ({"fault": {"kind": "slow", "ms": True}}, "fault.ms: required for slow"),
        ({"fault": {"kind": "down", "ms": 5}}, "fault.ms: not a parameter of down"),
    ],
)
async def test_invalid_settings_are_422_and_change_nothing(
    lab: LabClient, body: Any, problem: str
) -> None:
    """A bad ``PUT /oauth2`` is 422 ``invalid_oauth2`` naming the field, and nothing changes."""
    status, answer = await put_oauth2(lab, body)
    assert (status, answer["error"]) == (422, "invalid_oauth2")
    assert any(problem in detail for detail in answer["detail"]), answer
    assert (await oauth2(lab))["client_id"] == "quoteflow"
    assert (await token_request(lab))[0] == 200


async def test_one_bad_setting_refuses_the_good_ones_too(lab: LabClient) -> None:
    """Settings apply all together or not at all."""
    status, answer = await put_oauth2(lab, {"client_id": "new", "expires_in": 0})
    assert status == 422
    assert len(answer["detail"]) == 1
    assert (await oauth2(lab))["client_id"] == "quoteflow"


async def test_lab_control_drives_the_token_endpoint_and_the_key(lab: LabClient) -> None:
    """``LabControl`` (make demo, the end-to-end tests): faults, settings, revocation, key;
    ``fresh`` clears the token endpoint's fault with the suppliers' faults."""
    control = LabControl(lab.session, str(lab.make_url("/")))
    await control.set_token_fault({"kind": "slow", "ms": 5})
    assert (await control.oauth2())["fault"] == {"kind": "slow", "ms": 5}
    assert (await control.set_oauth2(expires_in=7))["expires_in"] == 7
    await control.fresh()
    assert (await control.oauth2())["fault"] is None
    token = await fetch_token(lab)
    assert await control.revoke_tokens() == 1
    assert (await ask_json(lab, token=token))[0] == 401
    await control.set_api_key("k2")
    assert (await ask_path(lab, key="k2"))[0] == 200
    with pytest.raises(LabError, match="422"):
        await control.set_oauth2(expires_in=0)
