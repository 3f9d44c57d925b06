"""The console in a real browser: Debian's chromium, driven by Playwright, against a real
QuoteFlow (``--console --console-lab``) and a real provider lab, both as processes.

One browser for the module (a persistent context on a fresh profile), one page per case.
Every wait is for a state of the page, never for a time. Each case leaves a screenshot
in a temporary folder, never in the work tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect, sync_playwright

from tests.e2e.conftest import spawn, stop, wait_healthy
from tests.process import free_port

CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "apt-get install -y chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BUDGET_S = 0.5
"""QuoteFlow's budget here: short, so a hanging boreal ends the answer quickly."""
INBOUND_LIMIT = 2
"""Small, so a burst of 8 finds the inbound limit full and some are refused."""
WAIT_MS = 15_000
"""How long a state may take to appear on a loaded machine; most come in milliseconds."""
HOSTILE_SKU = "<img src=x onerror=window.pwned=1><script>pwned=2</script>"


def chromium() -> str:
    """Debian's chromium; missing, the test is skipped — or fails when ``CI`` is set (as
    ``make test`` installs it, it is never missing there)."""
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        message = f"chromium is not installed (run: {INSTALL_HINT})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM if os.path.exists(CHROMIUM) else str(shutil.which("chromium"))


@attrs.frozen
class Stack:
    """The lab and QuoteFlow as processes, and where screenshots go."""

    lab: str
    quoteflow: str
    shots: Path


def _http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A provider lab and a QuoteFlow with the console and its lab controls, for the module."""
    chromium()  # skip (or fail in CI) before starting anything
    lab = subprocess.Popen(
        [sys.executable, "-m", "provider_lab", "--port", "0", "--seed", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    quoteflow: subprocess.Popen[bytes] | None = None
    log_path = tmp_path_factory.mktemp("console-stack") / "quoteflow.log"
    log = log_path.open("wb")
    try:
        assert lab.stdout is not None
        line = lab.stdout.readline().decode()
        lab_url = line.strip().rsplit(" ", 1)[-1]
        assert lab_url.startswith("http://127.0.0.1:"), line
        port = free_port()
        quoteflow = spawn(
            [
                "quoteflow",
                "--port",
                str(port),
                "--provider-url",
                lab_url,
                "--budget",
                str(BUDGET_S),
                "--inbound-limit",
                str(INBOUND_LIMIT),
                "--console",
                "--console-lab",
                lab_url,
                "--log-level",
                "warning",
            ],
            log,
        )
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, quoteflow, log_path)
        yield Stack(lab_url, url, tmp_path_factory.mktemp("console-shots"))
    finally:
        if quoteflow is not None:
            stop(quoteflow)
        stop(lab)
        log.close()
        if lab.stdout is not None:
            lab.stdout.close()


@pytest.fixture(scope="module")
def browser(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """One chromium for the module, on a fresh profile; nothing downloaded."""
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=chromium(),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1100, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def console(stack: Stack, browser: BrowserContext) -> Iterator[Page]:
    """The console page, loaded with its lab controls, on a lab without faults or latency.

    Any Content-Security-Policy violation (the page's own code refused) fails the case.
    """
    _http("DELETE", f"{stack.lab}/faults")
    _http("PUT", f"{stack.lab}/latency", {"ms": 0})
    page = browser.new_page()
    errors: list[str] = []
    page.on(
        "console", lambda message: errors.append(message.text) if message.type == "error" else None
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{stack.quoteflow}/console")
    expect(page.locator("body[data-lab-loaded=true]")).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator("#fault-boreal")).to_be_visible()
    yield page
    page.close()
    assert not [e for e in errors if "Content Security Policy" in e or "Refused" in e], errors


def answers(page: Page) -> Locator:
    return page.locator("#results > article.answer")


def ask(page: Page) -> Locator:
    """Press Ask; the newest answer once it is drawn."""
    before = answers(page).count()
    page.locator("#ask").click()
    expect(answers(page)).to_have_count(before + 1, timeout=WAIT_MS)
    return answers(page).first


def row(answer: Locator, supplier: str) -> Locator:
    return answer.locator(f'svg g[data-supplier="{supplier}"]')


def outcomes(supplier_row: Locator) -> list[str | None]:
    tried = supplier_row.locator("g[data-attempt]")
    return [tried.nth(i).get_attribute("data-outcome") for i in range(tried.count())]


def shot(page: Page, stack: Stack, name: str) -> None:
    page.screenshot(path=str(stack.shots / f"{name}.png"), full_page=True)


def test_ask_for_flaky_by_keyboard(console: Page, stack: Stack) -> None:
    """Fill the form with the keyboard, Ask: boreal's 503 then ok, with a backoff between."""
    page = console
    page.locator("#sku").focus()
    page.keyboard.press("Control+A")
    page.keyboard.type("KB-001")
    page.keyboard.press("Tab")
    expect(page.locator("#quantity")).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    page.keyboard.press("Tab")
    expect(page.locator("#scenario")).to_be_focused()
    page.keyboard.type("flaky")
    expect(page.locator("#scenario")).to_have_value("flaky")
    answer = ask(page)
    expect(answer).to_have_attribute("data-status", "200")
    boreal = row(answer, "boreal")
    expect(boreal).to_have_attribute("data-stopped", "success")
    assert outcomes(boreal) == ["http_503", "ok"]
    expect(boreal.locator("g[data-backoff-ms]")).to_have_count(1)
    expect(answer.locator("svg g[data-deadline-ms]")).to_have_attribute(
        "data-deadline-ms", repr(BUDGET_S * 1000)
    )
    expect(answer.locator("svg [data-supplier]")).to_have_count(3)
    # The keyboard alone can ask again: Enter in a field submits the form.
    page.locator("#sku").press("Enter")
    expect(answers(page)).to_have_count(2, timeout=WAIT_MS)
    shot(page, stack, "flaky")


def test_a_fault_switched_from_the_page_shows_in_the_next_waterfall(
    console: Page, stack: Stack
) -> None:
    """boreal set to hang from the page: its row ends at the deadline as timeout; set back to
    none, the next answer has boreal's quote again."""
    page = console
    page.locator("#fault-boreal").select_option("hang")
    page.locator("#set-boreal").click()
    expect(page.locator("#now-boreal")).to_have_text("now: hang", timeout=WAIT_MS)
    assert [f["kind"] for f in _http("GET", f"{stack.lab}/faults")["boreal"]] == ["hang"]
    answer = ask(page)
    boreal = row(answer, "boreal")
    expect(boreal).to_have_attribute("data-stopped", "deadline")
    assert outcomes(boreal) == ["timeout"]
    expect(answer.locator('svg text[data-failure-supplier="boreal"]')).to_have_attribute(
        "data-code", "timeout"
    )
    expect(row(answer, "atlas")).to_have_attribute("data-stopped", "success")
    shot(page, stack, "hang")

    page.locator("#fault-boreal").select_option("none")
    page.locator("#set-boreal").click()
    expect(page.locator("#now-boreal")).to_have_text("now: none", timeout=WAIT_MS)
    answer = ask(page)
    boreal = row(answer, "boreal")
    expect(boreal).to_have_attribute("data-stopped", "success")
    assert outcomes(boreal) == ["ok"]
    expect(answer.locator('svg text[data-quote-supplier="boreal"]')).to_have_count(1)


def test_a_burst_draws_every_request_refusals_included(console: Page, stack: Stack) -> None:
    """8 at once with the lab at 400 ms and 2 seats: 8 rows, the refused as rows of their own."""
    page = console
    page.locator("#latency").fill("400")
    page.locator("#set-latency").click()
    expect(page.locator("#status")).to_have_text("lab latency: 400 ms", timeout=WAIT_MS)
    page.locator("#burst-size").fill("8")
    page.locator("#burst").click()
    burst = page.locator("#results > section.burst").first
    expect(burst).to_have_attribute("data-burst-size", "8", timeout=WAIT_MS)
    rows = burst.locator("article.answer")
    expect(rows).to_have_count(8)
    served = burst.locator('article.answer[data-status="200"]')
    refused = burst.locator('article.answer[data-status="503"]')
    assert served.count() >= 1
    assert refused.count() >= 1
    assert served.count() + refused.count() == 8
    expect(refused.locator('svg g[data-refused="503"]')).to_have_count(refused.count())
    expect(refused.first.locator('g[data-error="capacity_exhausted"]')).to_have_count(1)
    expect(served.locator("svg g[data-supplier]")).to_have_count(3 * served.count())
    first = served.first.locator('svg g[data-supplier="atlas"] g[data-attempt]')
    assert float(first.get_attribute("data-duration-ms") or 0) >= 400
    shot(page, stack, "burst")


def test_a_hostile_sku_is_drawn_as_text_and_runs_nothing(console: Page, stack: Stack) -> None:
    """A SKU of markup comes back as the waterfall's text: no element made, no script run."""
    page = console
    page.locator("#sku").fill(HOSTILE_SKU)
    answer = ask(page)
    expect(answer).to_have_attribute("data-status", "200")
    heading = answer.locator("svg > text").first
    expect(heading).to_have_text(f"{HOSTILE_SKU} × 2")
    expect(page.locator("#results img, #results script")).to_have_count(0)
    assert page.evaluate("window.pwned") is None
    shot(page, stack, "hostile-sku")


def test_a_cart_typed_into_the_page_is_drawn_one_row_per_call(console: Page, stack: Stack) -> None:
    """Cart lines in the form: the page asks ``/api/carts`` and draws a row per supplier call."""
    page = console
    page.locator("#cart").fill("KB-001 2\nKB-002 1")
    answer = ask(page)
    expect(answer).to_have_attribute("data-status", "200")
    expect(answer.locator("svg")).to_have_attribute("data-kind", "cart")
    expect(answer.locator("svg g[data-supplier]")).to_have_count(6)
    expect(answer.locator('svg g[data-supplier-group="boreal"] g[data-call]')).to_have_count(2)
    shot(page, stack, "cart")


def test_a_bom_pasted_as_csv_is_sent_as_csv_and_its_basket_drawn(
    console: Page, stack: Stack
) -> None:
    """A BOM's CSV pasted in the cart box (a header naming the MPN and quantity columns): the
    page sends it as ``text/csv``, as it is, and draws the cart, a pick per line."""
    page = console
    page.locator("#cart").fill("Reference,Qty,MPN,Value\nR1,2,BOM-001,10k\nC1,1,BOM-002,100n\n")
    before = answers(page).count()
    with page.expect_request("**/api/carts?explain=svg") as sent:
        page.locator("#ask").click()
    assert sent.value.headers["content-type"] == "text/csv"
    assert sent.value.post_data == "Reference,Qty,MPN,Value\nR1,2,BOM-001,10k\nC1,1,BOM-002,100n\n"
    expect(answers(page)).to_have_count(before + 1, timeout=WAIT_MS)
    answer = answers(page).first
    expect(answer).to_have_attribute("data-status", "200")
    expect(answer.locator("svg")).to_have_attribute("data-kind", "cart")
    expect(answer.locator("svg g[data-supplier]")).to_have_count(6)
    for sku in ("BOM-001", "BOM-002"):
        expect(answer.locator(f'svg text.pick[data-sku="{sku}"]')).to_have_count(1)
    shot(page, stack, "cart-csv")
