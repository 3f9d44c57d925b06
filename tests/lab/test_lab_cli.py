"""``python -m provider_lab``: arguments, one-line errors, and a real process."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import pytest

from provider_lab import cli
from provider_lab.faults import FaultError, Kind, parse_fault_spec
from tests.lab.conftest import basic, lab_process


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "http"],
        ["--port", "70000"],
        ["--latency-ms", "-5"],
        ["--fault", "boreal"],
        ["--fault", "zephyr:close"],
        ["--fault", "boreal:meteor"],
        ["--fault", "boreal:latency:ms=fast"],
        ["--fault", "boreal:http_429:count=0"],
        ["--fault", "boreal:close:colour=red"],
        ["--fault", "boreal:close:count"],
        ["--token-ttl", "0"],
        ["--token-ttl", "soon"],
        ["--client-id", ""],
        ["--client-secret", "two\nlines"],
        ["--api-key", ""],
        ["--unknown"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad argument stops the lab with exit code 2 and a single error line."""
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "error:" in err


def test_a_refused_secret_is_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    """The error line for a bad ``--client-secret`` or ``--api-key`` does not repeat it."""
    for flag in ("--client-secret", "--api-key"):
        with pytest.raises(SystemExit):
            cli.main([flag, "hunter2\x07"])
        err = capsys.readouterr().err
        assert flag in err
        assert "hunter2" not in err


def test_fault_spec_with_parameters() -> None:
    """``SUPPLIER:KIND:KEY=VALUE,...`` becomes a typed fault."""
    supplier, fault = parse_fault_spec("boreal:http_429:count=2,retry_after=3")
    assert supplier == "boreal"
    assert fault.to_json() == {"kind": "http_429", "count": 2, "retry_after": 3, "size": 0}


def test_fault_spec_defaults_and_types() -> None:
    """Omitted parameters take their defaults; numbers and null convert by parameter type."""
    assert parse_fault_spec("atlas:reset")[1].to_json() == {
        "kind": "reset",
        "count": None,
        "variant": "before",
    }
    assert parse_fault_spec("cedar:blip:probability=0.25")[1].params["probability"] == 0.25
    assert parse_fault_spec("cedar:http_503:retry_after=null")[1].params["retry_after"] is None


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_parses_from_the_command_line(kind: Kind) -> None:
    """Every fault kind can be switched on from the command line."""
    assert parse_fault_spec(f"atlas:{kind}:count=1")[1].kind is kind


def test_fault_spec_errors_name_the_problem() -> None:
    """A bad spec raises FaultError naming the field."""
    with pytest.raises(FaultError, match="ms: 'soon' is not an integer"):
        parse_fault_spec("boreal:latency:ms=soon")


async def test_real_process_serves_and_stops_on_sigterm() -> None:
    """The lab runs as a process, applies ``--fault``, and exits 0 on SIGTERM."""
    fault = "cedar:http_429:count=1,retry_after=9"
    async with lab_process("--fault", fault) as url, aiohttp.ClientSession(url) as session:
        async with session.get("/quotes/cedar", params={"sku": "KB-001"}) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "9"
        async with session.get("/quotes/cedar", params={"sku": "KB-001"}) as response:
            assert response.status == 200


async def test_real_process_takes_the_dialects_credentials() -> None:
    """``--client-id``, ``--client-secret``, ``--token-ttl`` and ``--api-key`` reach the lab."""
    async with (
        lab_process(
            "--client-id", "erp", "--client-secret", "s:cr+t", "--token-ttl", "5", "--api-key", "k1"
        ) as url,
        aiohttp.ClientSession(url) as session,
    ):
        form = {"grant_type": "client_credentials"}
        headers = {"Authorization": basic("erp", "s:cr+t")}
        async with session.post("/oauth2/token", data=form, headers=headers) as response:
            body = await response.json()
            assert (response.status, body["expires_in"]) == (200, 5)
        order = {"items": [{"partNumber": "KB-001", "quantity": 10}]}
        bearer = {"Authorization": f"Bearer {body['access_token']}"}
        async with session.post("/json/atlas/quote", json=order, headers=bearer) as response:
            assert response.status == 200
        path = "/path/atlas/parts/KB-001/price"
        async with session.get(path, params={"qty": "1", "key": "k1"}) as response:
            assert response.status == 200
        async with session.get(path, params={"qty": "1", "key": "lab-key"}) as response:
            assert response.status == 403


async def test_port_in_use_is_a_one_line_error() -> None:
    """A port that cannot be bound stops the lab with exit 1 and one line."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "provider_lab",
            "--port",
            str(port),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 10)
    finally:
        server.close()
        await server.wait_closed()
    assert process.returncode == 1
    assert err.decode().count("\n") == 1
    assert "cannot listen" in err.decode()
