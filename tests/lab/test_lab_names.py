"""The lab serving any catalogue: suppliers by name, offers derived from the name, every fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from provider_lab import cli
from provider_lab.catalogue import derived_offer, lookup, names_from_file
from tests.lab.conftest import StartLab, ask, set_fault, stats

NAMES = ("north", "south", "east")


async def test_named_suppliers_quote_offers_derived_from_their_names(start_lab: StartLab) -> None:
    """Each named supplier answers its derived offer; an unnamed one, even atlas, is a 404."""
    lab = await start_lab(suppliers=NAMES)
    for name in NAMES:
        status, body = await ask(lab, name, "MN-270")
        assert status == 200
        offer = derived_offer(name, "MN-270")
        assert json.loads(body) == {
            "supplier": name,
            "sku": "MN-270",
            "unit_cents": offer.unit_cents,
            "shipping_cents": offer.shipping_cents,
            "stock": offer.stock,
        }
    assert (await ask(lab, "atlas"))[0] == 404
    assert (await ask(lab, "north", "NO-SUCH-SKU"))[0] == 404
    assert set((await stats(lab))["per_supplier"]) == set(NAMES)


def test_derived_offers_are_stable_and_the_lab_three_keep_their_table() -> None:
    """The derived offer is a pure function of name and SKU; atlas keeps the lesson's prices."""
    assert derived_offer("north", "KB-001") == derived_offer("north", "KB-001")
    assert derived_offer("north", "KB-001") != derived_offer("south", "KB-001")
    assert derived_offer("north", "CB-404").stock == 0
    offer = lookup("atlas", "KB-001")
    assert offer is not None
    assert offer.unit_cents == 1200


@pytest.mark.parametrize("scenario", ["broken", "flaky", "malformed", "slow"])
async def test_scenarios_act_on_every_supplier_when_boreal_is_not_served(
    start_lab: StartLab, scenario: str
) -> None:
    """Without boreal, each named supplier plays the lesson's scenarios itself."""
    lab = await start_lab(suppliers=NAMES)
    for name in NAMES:
        status, body = await ask(lab, name, scenario=scenario, request_id=f"r-{scenario}")
        if scenario in ("broken", "flaky"):
            assert status == 503
        elif scenario == "malformed":
            assert isinstance(json.loads(body)["unit_cents"], str)
        else:
            assert status == 200  # slow: late, but a quote


async def test_scenarios_can_be_pointed_at_chosen_suppliers(start_lab: StartLab) -> None:
    """``scenario_suppliers`` picks who plays them; the others answer normally."""
    lab = await start_lab(suppliers=NAMES, scenario_suppliers=("south",))
    assert (await ask(lab, "south", scenario="broken"))[0] == 503
    assert (await ask(lab, "north", scenario="broken"))[0] == 200


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ({"kind": "http_503"}, "status_503"),
        ({"kind": "http_429", "retry_after": 2}, "status_429"),
        ({"kind": "wrong_supplier"}, "echoes_south"),
        ({"kind": "wrong_types", "field": "stock", "variant": "string"}, "stock_string"),
        ({"kind": "truncated"}, "payload_error"),
        ({"kind": "reset"}, "connection_error"),
        ({"kind": "not_json"}, "not_json"),
    ],
)
async def test_faults_work_for_a_named_supplier(
    start_lab: StartLab, fault: dict[str, Any], check: str
) -> None:
    """A fault switched on for a named supplier is served by it, as for the lab's three."""
    lab = await start_lab(suppliers=NAMES)
    await set_fault(lab, "north", **fault)
    try:
        status, body = await ask(lab, "north")
    except aiohttp.ClientPayloadError:
        assert check == "payload_error"
        return
    except aiohttp.ClientOSError:
        assert check == "connection_error"
        return
    if check.startswith("status_"):
        assert status == int(check.removeprefix("status_"))
    elif check == "echoes_south":
        assert json.loads(body)["supplier"] == "south"
    elif check == "stock_string":
        assert json.loads(body)["stock"] == str(derived_offer("north", "KB-001").stock)
    else:
        with pytest.raises(json.JSONDecodeError):
            json.loads(body)
    assert (await ask(lab, "south"))[0] == 200  # the others are untouched


def test_the_lab_reads_the_names_of_a_quoteflow_catalogue(tmp_path: Path) -> None:
    """``--suppliers FILE`` serves the names of a QuoteFlow catalogue file, in its order."""
    path = tmp_path / "suppliers.toml"
    path.write_text(
        '[[supplier]]\nname = "west"\nurl = "http://127.0.0.1:9101/quotes/west"\nshare = 2\n'
        '[[supplier]]\nname = "east"\nurl = "http://127.0.0.1:9101/quotes/east"\n'
    )
    assert names_from_file(str(path)) == ("west", "east")


@pytest.mark.parametrize(
    "argv",
    [
        ["--names", "Bad Name"],
        ["--names", "a,a"],
        ["--names", "a,b", "--fault", "atlas:close"],
        ["--names", "a,b", "--scenario-on", "c"],
        ["--suppliers", "/nonexistent/suppliers.toml"],
        ["--names", "a", "--suppliers", "x.toml"],
    ],
)
def test_bad_names_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad list of names, or a fault for a supplier not served, exits 2 with one line."""
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "error:" in err
