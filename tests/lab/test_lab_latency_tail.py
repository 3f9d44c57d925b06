"""The ``latency`` fault's tail (issue 38): ``sigma`` makes each answer's delay its own
lognormal draw of median ``ms``, from a stream per supplier that ``--seed`` fixes."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from typing import Any

import aiohttp
import pytest

from provider_lab import cli
from provider_lab.faults import MAX_LATENCY_MS, FaultError, draw_latency_ms, parse_fault_spec
from tests.lab.conftest import LabClient, StartLab, ask, lab_process, set_fault, stats, wait_idle


async def put_raw(lab: LabClient, body: bytes) -> tuple[int, dict[str, Any]]:
    """``PUT /faults/boreal`` with ``body`` sent as it is (``NaN`` is not JSON a client writes)."""
    headers = {"Content-Type": "application/json"}
    async with lab.put("/faults/boreal", data=body, headers=headers) as response:
        return response.status, await response.json()


async def drawn(lab: LabClient, supplier: str = "boreal") -> list[float]:
    """The delays the lab drew for ``supplier`` since the last reset, oldest first."""
    draws: list[float] = (await stats(lab)).get("latency_drawn_ms", {}).get(supplier, [])
    return draws


# -- the fault's parameters ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"kind": "latency", "ms": 20, "sigma": "0.9"}, "sigma: must be a number"),
        ({"kind": "latency", "ms": 20, "sigma": True}, "sigma: must be a number"),
        ({"kind": "latency", "ms": 20, "sigma": False}, "sigma: must be a number"),
        ({"kind": "latency", "ms": 20, "sigma": None}, "sigma: must not be null"),
        ({"kind": "latency", "ms": 20, "sigma": [0.9]}, "sigma: must be a number"),
        ({"kind": "latency", "ms": 20, "sigma": -0.1}, "sigma: must be >= 0"),
        ({"kind": "latency", "ms": 20, "sigma": 3.01}, "sigma: must be <= 3"),
        ({"kind": "latency", "ms": 20, "sigma": 4}, "sigma: must be <= 3"),
        ({"kind": "slow_body", "ms": 20, "sigma": 0.9}, "sigma: not a parameter of slow_body"),
        ({"kind": "hang", "sigma": 0}, "sigma: not a parameter of hang"),
        ({"kind": "http_503", "sigma": 0.5}, "sigma: not a parameter of http_503"),
        ({"kind": "blip", "sigma": 0.5}, "sigma: not a parameter of blip"),
    ],
)
async def test_a_bad_sigma_is_422(lab: LabClient, body: Any, problem: str) -> None:
    """``sigma`` is a number 0–3, on ``latency`` only; anything else is ``422 invalid_fault``."""
    status, answer = await put_raw(lab, json.dumps(body).encode())
    assert status == 422
    assert answer["error"] == "invalid_fault"
    assert any(problem in detail for detail in answer["detail"]), answer
    async with lab.get("/faults") as response:
        assert (await response.json())["boreal"] == []


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
async def test_a_sigma_that_is_not_finite_is_422(lab: LabClient, number: str) -> None:
    """Python's JSON reader takes ``NaN`` and ``Infinity``; the lab refuses them as ``sigma``."""
    body = b'{"kind": "latency", "ms": 20, "sigma": %s}' % number.encode()
    status, answer = await put_raw(lab, body)
    assert (status, answer["error"]) == (422, "invalid_fault")
    assert answer["detail"] == ["sigma: must be finite"]


@pytest.mark.parametrize("sigma", [0, 0.0, 0.9, 1, 3, 3.0])
async def test_sigma_is_listed_as_given(lab: LabClient, sigma: float) -> None:
    """``GET /faults`` shows ``sigma`` as it was given (an integer stays one); none if absent."""
    await set_fault(lab, "boreal", kind="latency", ms=200, sigma=sigma, count=2)
    await set_fault(lab, "boreal", kind="latency", ms=200, append=True)
    async with lab.get("/faults") as response:
        queue = (await response.json())["boreal"]
    assert queue == [
        {"kind": "latency", "count": 2, "ms": 200, "sigma": sigma, "remaining": 2},
        {"kind": "latency", "count": None, "ms": 200, "remaining": None},
    ]
    assert type(queue[0]["sigma"]) is type(sigma)


async def test_kinds_describes_sigma(lab: LabClient) -> None:
    """``GET /kinds`` lists ``sigma`` among ``latency``'s parameters, with no default."""
    async with lab.get("/kinds") as response:
        params = (await response.json())["latency"]["params"]
    assert set(params) == {"ms", "sigma"}
    assert params["sigma"]["type"] == "float"
    assert params["sigma"]["default"] is None
    assert "median" in params["sigma"]["doc"]


def test_sigma_from_the_command_line() -> None:
    """``--fault boreal:latency:ms=200,sigma=0.9``; a bad sigma is refused as in the API."""
    assert parse_fault_spec("boreal:latency:ms=200,sigma=0.9")[1].to_json() == {
        "kind": "latency",
        "count": None,
        "ms": 200,
        "sigma": 0.9,
    }
    for spec, problem in [
        ("boreal:latency:sigma=nan", "sigma: must be finite"),
        ("boreal:latency:sigma=inf", "sigma: must be finite"),
        ("boreal:latency:sigma=wide", "sigma: 'wide' is not a number"),
        ("boreal:latency:sigma=3.5", "sigma: must be <= 3"),
        ("boreal:slow_body:sigma=1", "sigma: not a parameter of slow_body"),
    ]:
        with pytest.raises(FaultError, match=problem):
            parse_fault_spec(spec)


def test_a_bad_sigma_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The lab does not start with a bad ``sigma``: exit 2, one error line."""
    with pytest.raises(SystemExit) as caught:
        cli.main(["--fault", "boreal:latency:ms=200,sigma=-1"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "sigma: must be >= 0" in err


# -- the draw ------------------------------------------------------------------------------


class _Fixed:
    """A stand-in for ``random.Random`` whose normal draws are given; counts them."""

    def __init__(self, *z: float) -> None:
        self.z = list(z)
        self.calls = 0

    def normalvariate(self, mu: float = 0.0, sigma: float = 1.0) -> float:
        self.calls += 1
        return self.z.pop(0)


def test_the_draw_is_ms_times_exp_sigma_z_capped() -> None:
    """``ms * exp(sigma * z)``, one normal draw each, never above ``MAX_LATENCY_MS``."""
    assert draw_latency_ms(200, 0.9, _Fixed(0.0)) == 200
    assert draw_latency_ms(200, 0.9, _Fixed(1.0)) == pytest.approx(200 * math.exp(0.9))
    assert draw_latency_ms(200, 0.9, _Fixed(-2.0)) == pytest.approx(200 * math.exp(-1.8))
    assert draw_latency_ms(200, 3.0, _Fixed(1e6)) == MAX_LATENCY_MS  # no OverflowError
    assert draw_latency_ms(MAX_LATENCY_MS, 3.0, _Fixed(0.5)) == MAX_LATENCY_MS
    assert 0 <= draw_latency_ms(200, 3.0, _Fixed(-1e6)) < 1e-300
    stream = _Fixed(1.0, 1.0)
    assert draw_latency_ms(0, 0.9, stream) == 0
    assert stream.calls == 1  # a draw is used even when ms is 0: one per request


async def test_sigma_zero_is_the_fixed_delay(lab: LabClient) -> None:
    """``sigma: 0`` is ``ms`` exactly, as without it: nothing drawn, nothing new in ``/stats``."""
    before = set(await stats(lab))
    await set_fault(lab, "boreal", kind="latency", ms=40, sigma=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await ask(lab))[0] == 200
    assert loop.time() - started >= 0.039
    assert set(await stats(lab)) == before


async def test_200_draws_have_median_ms_and_a_lognormal_tail(lab: LabClient) -> None:
    """Median 20 ms, sigma 0.9: 200 answers' delays (seeded), drawn at the lab, have a
    median within 20 % of 20 ms and about 6.2 % over 80 ms; each answer took its draw."""
    await set_fault(lab, "boreal", kind="latency", ms=20, sigma=0.9)
    loop = asyncio.get_running_loop()

    async def timed(request_id: str) -> float:
        started = loop.time()
        status, _ = await ask(lab, request_id=request_id)
        assert status == 200
        return loop.time() - started

    ids = [f"tail-{i}" for i in range(200)]
    elapsed = await asyncio.gather(*(timed(request_id) for request_id in ids))
    current = await stats(lab)
    draws = current["latency_drawn_ms"]["boreal"]
    assert len(draws) == 200
    assert 16 <= statistics.median(draws) <= 24
    over = sum(ms > 80 for ms in draws)
    assert 5 <= over <= 22, over  # 6.2 % of 200 is 12.3; about 2.3 binomial sds either side
    assert max(draws) > 80  # a tail each way, not a fixed delay
    assert min(draws) < 10
    per_id = current["latency_drawn_ms_per_id"]
    assert sorted(ms for request_id in ids for ms in per_id[request_id]["boreal"]) == sorted(draws)
    for request_id, seconds in zip(ids, elapsed, strict=True):
        (ms,) = per_id[request_id]["boreal"]
        assert seconds >= ms / 1000 - 0.002, (request_id, ms, seconds)
    slowest = max(range(200), key=lambda i: per_id[ids[i]]["boreal"][0])
    assert elapsed[slowest] < per_id[ids[slowest]]["boreal"][0] / 1000 + 1.0


async def test_the_cap_holds_each_draw(lab: LabClient) -> None:
    """``ms`` at the lab's maximum and sigma 3: half the draws would be above it; each is
    cut to ``MAX_LATENCY_MS`` (the caller's deadline ends the wait)."""
    await set_fault(lab, "boreal", kind="latency", ms=MAX_LATENCY_MS, sigma=3)
    deadline = {"X-Deadline-Remaining-Ms": "0"}
    results = await asyncio.gather(*(ask(lab, **deadline) for _ in range(8)))
    assert [status for status, _ in results] == [504] * 8
    draws = await drawn(lab)
    assert len(draws) == 8
    assert max(draws) == MAX_LATENCY_MS
    assert min(draws) < MAX_LATENCY_MS


# -- independent draws, reproducible with a seed --------------------------------------------


async def boreal_draws(lab: LabClient, n: int = 20, *, atlas_too: bool = False) -> list[float]:
    """``n`` requests to boreal (``ms`` 1, sigma 1), one by one; boreal's draws.

    ``atlas_too``: atlas has the same fault and a request before each of boreal's.
    """
    await set_fault(lab, "boreal", kind="latency", ms=1, sigma=1)
    if atlas_too:
        await set_fault(lab, "atlas", kind="latency", ms=1, sigma=1)
    for _ in range(n):
        if atlas_too:
            assert (await ask(lab, "atlas"))[0] == 200
        assert (await ask(lab))[0] == 200
    if atlas_too:
        assert len(await drawn(lab, "atlas")) == n
    return await drawn(lab)


async def test_the_same_seed_gives_the_same_draws(start_lab: StartLab) -> None:
    """Two labs with one seed draw the same delays for boreal, whatever atlas's traffic;
    another seed, or none, draws others."""
    first = await boreal_draws(await start_lab(seed=7))
    assert len(first) == 20
    assert len(set(first)) == 20
    assert await boreal_draws(await start_lab(seed=7), atlas_too=True) == first
    assert await boreal_draws(await start_lab(seed=8)) != first
    unseeded = await boreal_draws(await start_lab(seed=None))
    assert unseeded != first
    assert await boreal_draws(await start_lab(seed=None)) != unseeded


async def test_the_seed_fixes_the_draws_in_another_process(start_lab: StartLab) -> None:
    """``--seed 7 --fault boreal:latency:ms=1,sigma=1`` in a real process draws what a lab
    built with seed 7 here draws: the sequence does not depend on the process's hashing."""
    here = await boreal_draws(await start_lab(seed=7), 10)
    fault = "boreal:latency:ms=1,sigma=1"
    async with (
        lab_process("--seed", "7", "--fault", fault) as url,
        aiohttp.ClientSession(url) as session,
    ):
        async with session.get("/faults") as response:
            assert (await response.json())["boreal"] == [
                {"kind": "latency", "count": None, "ms": 1, "sigma": 1.0, "remaining": None}
            ]
        for _ in range(10):
            async with session.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
                assert response.status == 200
        async with session.get("/stats") as response:
            assert (await response.json())["latency_drawn_ms"]["boreal"] == here


async def test_each_attempt_of_a_request_id_draws_its_own(lab: LabClient) -> None:
    """A retry (one after the other) and a hedge (both at once) with the same
    ``X-Request-ID`` each get a draw of their own, the next ones of boreal's stream."""
    await set_fault(lab, "boreal", kind="latency", ms=5, sigma=0.9)
    for _ in range(2):
        assert (await ask(lab, request_id="retried"))[0] == 200
    both = await asyncio.gather(*(ask(lab, request_id="hedged") for _ in range(2)))
    assert [status for status, _ in both] == [200, 200]
    current = await stats(lab)
    per_id = current["latency_drawn_ms_per_id"]
    retried, hedged = per_id["retried"]["boreal"], per_id["hedged"]["boreal"]
    assert len(retried) == 2
    assert retried[0] != retried[1]
    assert len(hedged) == 2
    assert hedged[0] != hedged[1]
    sequence = current["latency_drawn_ms"]["boreal"]
    assert sequence[:2] == retried
    assert sorted(sequence[2:]) == sorted(hedged)
    assert current["attempts"] == {"retried": 2, "hedged": 2}


async def test_summary_leaves_the_draws_out_and_reset_zeroes_them(lab: LabClient) -> None:
    """``?summary=1`` has no draws; ``POST /reset`` forgets them, and the stream goes on
    (it is not rewound: the next draw is a new one)."""
    await set_fault(lab, "boreal", kind="latency", ms=1, sigma=1)
    assert (await ask(lab, request_id="a"))[0] == 200
    async with lab.get("/stats", params={"summary": "1"}) as response:
        summary = await response.json()
    assert "latency_drawn_ms" not in summary
    assert "latency_drawn_ms_per_id" not in summary
    (first,) = await drawn(lab)
    await wait_idle(lab)
    async with lab.post("/reset") as response:
        assert response.status == 200
    assert "latency_drawn_ms" not in await stats(lab)
    assert (await ask(lab))[0] == 200
    (second,) = await drawn(lab)
    assert second != first
