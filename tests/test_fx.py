"""The ECB feed's parser: what it takes, and every feed it refuses before using."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest

from quoteflow.errors import ConfigError
from quoteflow.fx import Rates, RatesError, parse_ecb, read_file

GOOD = b"""<?xml version="1.0" encoding="UTF-8"?>
<gesmes:Envelope xmlns:gesmes="http://www.gesmes.org/xml/2002-08-01" xmlns="http://www.ecb.int/vocabulary/2002-08-01/eurofxref">
  <gesmes:subject>Reference rates</gesmes:subject>
  <gesmes:Sender><gesmes:name>European Central Bank</gesmes:name></gesmes:Sender>
  <Cube><Cube time='2026-12-03'>
    <Cube currency='USD' rate='1.0850'/><Cube currency='JPY' rate='162.50'/>
    <Cube currency='GBP' rate='0.85700'/>
  </Cube></Cube>
</gesmes:Envelope>"""

BOMB = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<Envelope><subject>&lol3;</subject><Cube><Cube time='2026-12-03'>
<Cube currency='USD' rate='1.0850'/></Cube></Cube></Envelope>"""


def test_the_ecb_daily_file_is_read_exactly() -> None:
    table = parse_ecb(GOOD)
    assert table.date == dt.date(2026, 12, 3)
    assert table.rates == {
        "EUR": Decimal(1),
        "USD": Decimal("1.0850"),
        "JPY": Decimal("162.50"),
        "GBP": Decimal("0.85700"),
    }
    # Published at 16:00 CET (15:00 UTC) on its date.
    assert table.published == dt.datetime(2026, 12, 3, 15, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (BOMB, "document type declaration"),
        (b"<Cube><Cube time='2026-12-03'><Cube currency='USD' rate='n/a'/></Cube></Cube>", "plain"),
        (b"<Cube><Cube time='2026-12-03'><Cube currency='USD' rate='-1'/></Cube></Cube>", "plain"),
        (b"<Cube><Cube time='2026-12-03'><Cube currency='USD' rate='0'/></Cube></Cube>", "above 0"),
        (b"<Cube><Cube time='2026-12-03'><Cube currency='XAU' rate='1'/></Cube></Cube>", "XAU"),
        (b"<Cube><Cube time='2026-12-03'><Cube currency='EUR' rate='1'/></Cube></Cube>", "EUR"),
        (
            b"<Cube><Cube time='2026-12-03'><Cube currency='USD' rate='1'/>"
            b"<Cube currency='USD' rate='2'/></Cube></Cube>",
            "twice",
        ),
        (b"<Cube><Cube time='2026-12-03'></Cube></Cube>", "no rates"),
        (b"<Cube><Cube currency='USD' rate='1'/></Cube>", "0 Cube dates"),
        (b"<Cube><Cube time='yesterday'><Cube currency='USD' rate='1'/></Cube></Cube>", "date"),
        (GOOD[: len(GOOD) // 2], "not XML"),
        (b"<html><body>Service unavailable</body></html>", "0 Cube dates"),
    ],
)
def test_a_feed_that_is_not_the_format_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(RatesError, match=reason):
        parse_ecb(body)


def test_a_table_is_stale_past_its_max_age_and_a_new_one_brings_it_back() -> None:
    now = [dt.datetime(2026, 12, 3, 16, tzinfo=dt.UTC).timestamp()]
    rates = Rates(max_age=6 * 86400, clock=lambda: now[0])
    assert rates.cross("EUR", "USD") is None  # no table yet
    rates.use(parse_ecb(GOOD))
    assert rates.cross("EUR", "USD") is not None
    now[0] += 6 * 86400 + 3600  # past Wednesday after the Easter weekend
    assert not rates.fresh()
    assert rates.cross("EUR", "USD") is None
    assert rates.knows("USD")  # a request may still ask for dollars: it gets no_rate
    rates.use(parse_ecb(GOOD.replace(b"2026-12-03", b"2026-12-09")))
    assert rates.cross("EUR", "USD") is not None


def test_a_bad_rates_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "eurofxref-daily.xml"
    path.write_bytes(BOMB)
    with pytest.raises(ConfigError, match=r"^--fx-rates .*: a document type declaration"):
        read_file(str(path))
    with pytest.raises(ConfigError, match="cannot be read"):
        read_file(str(tmp_path / "absent.xml"))


def test_sighup_rereads_a_rates_file_and_a_bad_one_keeps_the_old(tmp_path: Path) -> None:
    from quoteflow.app import RATES, create_app
    from quoteflow.config import Settings
    from quoteflow.reload import reload_all

    path = tmp_path / "eurofxref-daily.xml"
    path.write_bytes(GOOD)
    app = create_app(Settings(fx_rates=str(path)))
    rates = app[RATES]
    assert rates.date == "2026-12-03"
    path.write_bytes(GOOD.replace(b"2026-12-03", b"2026-12-04").replace(b"1.0850", b"1.0900"))
    reload_all(app)
    assert rates.date == "2026-12-04"
    assert rates.table is not None
    assert rates.table.rates["USD"] == Decimal("1.0900")
    path.write_bytes(BOMB)
    reload_all(app)  # refused, logged as reload_refused: the last good table serves
    assert rates.date == "2026-12-04"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--currency", "XAU"], "currency"),
        (["--currency", "usd"], "currency"),
        (["--fx-refresh", "0"], "fx_refresh"),
        (["--fx-max-age", "0"], "fx_max_age"),
        (["--fx-max-age", "soon"], "--fx-max-age"),
    ],
)
def test_a_bad_currency_or_rates_setting_is_one_line(argv: list[str], named: str) -> None:
    from quoteflow.options import parse_settings

    with pytest.raises(ConfigError, match=named) as raised:
        parse_settings(argv, {})
    assert "\n" not in str(raised.value)
