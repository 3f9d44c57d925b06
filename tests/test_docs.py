"""The docs name everything the code defines: flags, environment variables, metrics, codes, links.

Each list is read from the code or the running service, never written out
here, so a flag, metric, failure code or ``stopped`` reason added later fails
these tests until the page that documents it names it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quoteflow import models
from tests.conftest import StartQuoteFlow
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"
API = DOCS / "api.md"
BENCHMARK = DOCS / "benchmark.md"
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.md"

_OPTION_LINE = re.compile(r"^\s+(-{1,2}\w.*?)(?:\s{2,}|$)")
"""An option line of argparse's help: the invocation, then two spaces and its help."""
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
_QUOTEFLOW_ENV = re.compile(r"QUOTEFLOW_[A-Z0-9][A-Z0-9_]*")
_BENCH_ENV_READ = re.compile(r"""(?:environ|env)(?:\.get\(|\[)\s*["'](BENCH_[A-Z0-9_]+)["']""")
"""A ``BENCH_*`` variable the benchmark reads (those it sets for wrk's Lua script are its own)."""
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _mentions(page: str, name: str) -> bool:
    """``name`` appears in ``page`` as a whole token, not inside a longer name."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", page) is not None


def _missing(names: set[str], page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return sorted(name for name in names if not _mentions(text, name))


def _quoteflow_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        # Wide enough that argparse keeps each option on its own line.
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_flag_is_in_operations_md() -> None:
    """Every flag ``quoteflow --help`` lists is named in docs/operations.md."""
    flags = {
        flag
        for line in _quoteflow_help().splitlines()
        if (option := _OPTION_LINE.match(line))
        for flag in _FLAG.findall(option.group(1))
    } - {"--help"}
    assert {"--budget", "--inbound-limit", "--outbound-limit"} <= flags, flags
    assert _missing(flags, OPERATIONS) == []


CLIENT_COMMANDS = {"cart_cli.py"}
"""Commands that talk to a running QuoteFlow (``quoteflow cart``): their variables are
documented with the command, in docs/api.md, not among the service's."""


def test_every_environment_variable_is_in_operations_md() -> None:
    """Every QUOTEFLOW_* variable, in the help or anywhere in the package, is documented."""
    names = set(_QUOTEFLOW_ENV.findall(_quoteflow_help()))
    client: set[str] = set()
    for source in (ROOT / "quoteflow").rglob("*.py"):
        found = set(_QUOTEFLOW_ENV.findall(source.read_text(encoding="utf-8")))
        if source.name in CLIENT_COMMANDS and source.parent.name == "quoteflow":
            client |= found
        else:
            names |= found
    assert "QUOTEFLOW_BUDGET" in names, names
    assert _missing(names, OPERATIONS) == []
    assert "QUOTEFLOW_URL" in client, client
    assert _missing(client, API) == []


def test_every_bench_variable_is_in_benchmark_md() -> None:
    """Every BENCH_* variable the benchmark reads is documented in docs/benchmark.md."""
    names: set[str] = set()
    for source in (ROOT / "bench").rglob("*.py"):
        names |= set(_BENCH_ENV_READ.findall(source.read_text(encoding="utf-8")))
    assert "BENCH_DURATION" in names, names
    assert _missing(names, BENCHMARK) == []


_ECB_TABLE = (
    "<?xml version='1.0' encoding='UTF-8'?>"
    "<gesmes:Envelope xmlns:gesmes='http://www.gesmes.org/xml/2002-08-01'"
    " xmlns='http://www.ecb.int/vocabulary/2002-08-01/eurofxref'>"
    "<Cube><Cube time='{date}'><Cube currency='USD' rate='1.0850'/></Cube></Cube>"
    "</gesmes:Envelope>"
)


@pytest.mark.parametrize("mode", ["one-process", "fleet", "rates"])
async def test_every_metric_is_in_operations_md(
    start_quoteflow: StartQuoteFlow, request: pytest.FixtureRequest, tmp_path: Path, mode: str
) -> None:
    """Every metric family the real app exports, after one request, is in docs/operations.md.

    In fleet mode too (a real redis-server): its coordination metrics exist only
    there; and with exchange rates (an ``--fx-rates`` file), whose metrics exist
    only then.
    """
    overrides: dict[str, object] = {}
    if mode == "fleet":
        redis: RedisServer = request.getfixturevalue("redis_server")
        overrides = {"redis_url": redis.url, "redis_timeout": 0.2}
    if mode == "rates":
        table = tmp_path / "eurofxref-daily.xml"
        table.write_text(_ECB_TABLE.format(date=dt.date.today().isoformat()))
        overrides = {"fx_rates": str(table)}
    client = await start_quoteflow(**overrides)
    answer = await client.post("/api/quotes", json={})
    assert answer.status == 200
    scrape = await client.get("/metrics")
    assert scrape.status == 200
    names = set(re.findall(r"^# TYPE (\S+) ", await scrape.text(), re.MULTILINE))
    assert "quoteflow_requests_total" in names, names
    assert ("quoteflow_coordination_up" in names) == (mode == "fleet")
    assert ("quoteflow_fx_rates_fresh" in names) == (mode == "rates")
    assert _missing(names, OPERATIONS) == []


def _string_constants() -> dict[str, str]:
    """Every module-level string constant of ``quoteflow.models``: its codes and reasons."""
    return {
        name: value
        for name, value in vars(models).items()
        if name.isupper() and isinstance(value, str)
    }


def _table_keys(page: Path) -> set[str]:
    """The backticked first cell of every table row of ``page``."""
    text = page.read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE))


def test_every_stopped_reason_has_a_row_in_api_md() -> None:
    """Each ``STOPPED_*`` reason of the budget bill is a row of docs/api.md's table."""
    reasons = {value for name, value in _string_constants().items() if name.startswith("STOPPED_")}
    assert {"success", "deadline", "no_time"} <= reasons, reasons
    assert sorted(reasons - _table_keys(API)) == []


def test_every_failure_code_has_a_row_in_api_md() -> None:
    """Each failure code, ``http_<status>`` included, is a row of docs/api.md's table.

    Every string constant of ``quoteflow.models`` that is neither a ``stopped``
    reason nor an attempt's outcome that is no failure (``OK``, ``CANCELLED``:
    a hedged call's loser, whose call always has the winner's quote) is a
    failure code a caller can see in ``failures``.
    """
    constants = _string_constants()
    codes = {
        value
        for name, value in constants.items()
        if not name.startswith("STOPPED_") and name not in ("OK", "CANCELLED")
    }
    assert {"invalid_data", "transport_error", "timeout"} <= codes, codes
    http_form = models.http_failure_code(503).replace("503", "<status>")
    keys = _table_keys(API)
    assert sorted((codes | {http_form}) - keys) == []
    assert _mentions(API.read_text(encoding="utf-8"), constants["OK"])
    assert _mentions(API.read_text(encoding="utf-8"), constants["CANCELLED"])


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = _slug(heading)
        n = 0
        while (candidate := slug if n == 0 else f"{slug}-{n}") in anchors:
            n += 1
        anchors.add(candidate)
    return anchors


PAGES = sorted([README, CHANGELOG, *DOCS.glob("*.md")])


def _broken_links(page: Path, text: str) -> list[str]:
    """The relative links of ``text``, written in ``page``, that lead nowhere.

    A link leads somewhere when its file exists and, for a Markdown page with
    an ``#anchor`` (``CHANGELOG.md#unreleased`` as much as a docs page's), when
    that page has the heading. Links inside code fences are not links.
    """
    broken: list[str] = []
    for target in _LINK.findall(_FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: ...
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        ):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    """Every relative link leads to a file that exists, and to a heading it has."""
    assert _broken_links(page, page.read_text(encoding="utf-8")) == []


def test_links_into_the_changelog_are_checked() -> None:
    """A link to a heading of CHANGELOG.md is checked like one into docs/."""
    page = DOCS / "any.md"
    assert "unreleased" in _anchors(CHANGELOG)
    good = "[what changed](../CHANGELOG.md#unreleased), [top](../CHANGELOG.md)"
    assert _broken_links(page, good) == []
    bad = "[gone](../CHANGELOG.md#no-such-version), [moved](../CHANGES.md)"
    assert _broken_links(page, bad) == ["../CHANGELOG.md#no-such-version", "../CHANGES.md"]


_PAGE_ANCHOR = re.compile(r"(?<![\w/.-])((?:docs/)?[\w.-]+\.md)#([\w-]+)")
"""A page and heading named in code or build files, e.g. ``docs/benchmark.md#making-it-fast``."""
_SOURCES = ("quoteflow", "provider_lab", "bench", "tests")


def test_anchors_named_outside_the_docs_resolve() -> None:
    """``page.md#heading`` in the code, the tests, the bench or the Makefile names a real heading.

    This file is left out: its examples of broken links are broken on purpose.
    """
    files = [ROOT / "Makefile", ROOT / "setup.cfg", ROOT / "pyproject.toml"]
    for folder in _SOURCES:
        files += [f for f in (ROOT / folder).rglob("*") if f.suffix in {".py", ".lua", ".toml"}]
    broken: list[str] = []
    for source in files:
        if not source.is_file() or source == Path(__file__).resolve():
            continue
        for name, anchor in _PAGE_ANCHOR.findall(source.read_text(encoding="utf-8")):
            page = ROOT / name if "/" in name else DOCS / name
            if not page.exists():
                page = ROOT / name
            if not page.exists() or anchor not in _anchors(page):
                broken.append(f"{source.relative_to(ROOT)}: {name}#{anchor}")
    assert broken == []


def _lines(page: Path) -> int:
    return len(page.read_text(encoding="utf-8").splitlines())


def test_the_front_pages_stay_short() -> None:
    """The README stays a front door and the benchmark page a reference (issue 31)."""
    assert _lines(README) <= 170
    assert _lines(BENCHMARK) <= 450


def test_readme_fleet_mode_is_short() -> None:
    """Fleet mode has its own heading in the README, at most 15 lines under it."""
    readme = README.read_text(encoding="utf-8")
    section = re.search(r"^## Fleet mode\n(.*?)(?=^## |\Z)", readme, re.MULTILINE | re.DOTALL)
    assert section is not None, "README.md has no '## Fleet mode' section"
    assert len([line for line in section.group(1).splitlines() if line.strip()]) <= 15


def test_benchmark_md_keeps_one_dated_heading() -> None:
    """Figures are replaced, not appended: at most one heading of benchmark.md carries a date."""
    text = _FENCE.sub("", BENCHMARK.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)
    dated = [h for h in headings if re.search(r"\b\d{4}-\d{2}-\d{2}\b", h)]
    assert len(dated) <= 1, dated


def test_readme_links_every_docs_page() -> None:
    """The README is the front door: each page under docs/ is linked from it."""
    readme = README.read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in _LINK.findall(readme)}
    pages = {f"docs/{page.name}" for page in DOCS.glob("*.md")}
    assert {"docs/api.md", "docs/operations.md"} <= pages
    assert sorted(pages - linked) == []
