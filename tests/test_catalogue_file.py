"""The catalogue file: what it may say, and the one line a bad one gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quoteflow.catalogue import LAB_SUPPLIERS, Catalogue
from quoteflow.config import Settings
from quoteflow.options import ConfigError, load_catalogue, loggable, parse_settings

SECRET = "s3cr3t-t0ken-value"

GOOD = """
[[supplier]]
name = "atlas"
url = "http://127.0.0.1:1/q/atlas"
"""


def _load(tmp_path: Path, text: str, **settings: Any) -> Catalogue:
    path = tmp_path / "suppliers.toml"
    path.write_text(text)
    environ = {"TOKEN": SECRET, "CRLF": "a\r\nX-Evil: 1"}
    return load_catalogue(Settings(suppliers_file=str(path), **settings), environ)


def _entry(**keys: str) -> str:
    body = "\n".join(f"{key} = {value}" for key, value in keys.items())
    return f"[[supplier]]\n{body}\n"


_URL = '"http://127.0.0.1:1/q"'

BAD_FILES = {
    "not TOML": ('[[supplier]]\nname = "atlas"\nurl = http://x\n', ["not TOML", "line 3"]),
    "unknown key": (_entry(name='"atlas"', url=_URL, sahre="2"), ["'atlas'", "sahre", "unknown"]),
    "unknown top-level key": (
        'suppliers = 1\n[[supplier]]\nname = "a"\nurl = "http://h/q"\n',
        ["unknown key 'suppliers'"],
    ),
    "no supplier at all": ("", ["no [[supplier]] table"]),
    "missing name": (_entry(url=_URL), ["supplier #1", "name", "missing"]),
    "bad name": (_entry(name='"Atlas Corp"', url=_URL), ["supplier #1", "name", "a-z"]),
    "missing url": (_entry(name='"atlas"'), ["'atlas'", "url", "missing"]),
    "duplicate name": (
        _entry(name='"atlas"', url=_URL) + _entry(name='"atlas"', url=_URL),
        ["'atlas'", "name", "twice"],
    ),
    "not http": (_entry(name='"atlas"', url='"ftp://h/q"'), ["'atlas'", "url", "http"]),
    "credentials in the URL": (
        _entry(name='"atlas"', url='"http://user:pw@h/q"'),
        ["'atlas'", "url", "credentials"],
    ),
    "share above the limit": (
        _entry(name='"atlas"', url=_URL, share="7"),
        ["'atlas'", "share", "above the outbound limit (6)"],
    ),
    "share a float": (_entry(name='"atlas"', url=_URL, share="2.0"), ["'atlas'", "share"]),
    "timeout zero": (
        _entry(name='"atlas"', url=_URL, connect_timeout="0"),
        ["'atlas'", "connect_timeout", "more than 0 and at most 3600"],
    ),
    "timeout past an hour": (
        _entry(name='"atlas"', url=_URL, read_timeout="3600.5"),
        ["'atlas'", "read_timeout", "at most 3600"],
    ),
    "timeout a string": (
        _entry(name='"atlas"', url=_URL, read_timeout='"1"'),
        ["'atlas'", "read_timeout", "number"],
    ),
    "breaker a boolean": (
        _entry(name='"atlas"', url=_URL, breaker_failures="true"),
        ["'atlas'", "breaker_failures"],
    ),
    "retry budget below one": (
        _entry(name='"atlas"', url=_URL, retry_budget_capacity="0.5"),
        ["'atlas'", "retry_budget_capacity", "at least 1"],
    ),
    "breaker past its range": (
        _entry(name='"atlas"', url=_URL, breaker_failures="1001"),
        ["'atlas'", "breaker_failures", "0 to 1000"],
    ),
    "adapter not importable": (
        _entry(name='"atlas"', url=_URL, adapter='"no_such_module_here:fn"'),
        ["'atlas'", "adapter", "cannot be imported"],
    ),
    "adapter not callable": (
        _entry(name='"atlas"', url=_URL, adapter='"quoteflow.catalogue:MAX_SUPPLIERS"'),
        ["'atlas'", "adapter", "not callable"],
    ),
    "adapter without a function": (
        _entry(name='"atlas"', url=_URL, adapter='"quoteflow.catalogue"'),
        ["'atlas'", "adapter", "package.module:function"],
    ),
    "missing variable": (
        _entry(
            name='"atlas"', url=_URL, headers='{ Authorization = "Bearer ${NOT_SET_ANYWHERE}" }'
        ),
        ["'atlas'", "headers.Authorization", "NOT_SET_ANYWHERE is not set"],
    ),
    "a header QuoteFlow sets": (
        _entry(name='"atlas"', url=_URL, headers='{ X-Request-ID = "${TOKEN}" }'),
        ["'atlas'", "headers.X-Request-ID", "set by QuoteFlow"],
    ),
    "a header named twice": (
        _entry(name='"atlas"', url=_URL, headers='{ Accept = "a", accept = "${TOKEN}" }'),
        ["'atlas'", "headers.accept", "twice"],
    ),
    "a value that would split the request": (
        _entry(name='"atlas"', url=_URL, headers='{ Authorization = "${CRLF}" }'),
        ["'atlas'", "headers.Authorization", "control character"],
    ),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_names_the_file_the_supplier_and_the_field(tmp_path: Path, case: str) -> None:
    """Each bad file is one ConfigError line naming file, supplier and field — never a secret."""
    text, fragments = BAD_FILES[case]
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, text)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"supplier catalogue {tmp_path / 'suppliers.toml'}: ")
    for fragment in fragments:
        assert fragment in message, message
    assert SECRET not in message
    assert "X-Evil" not in message


def test_more_than_32_suppliers_are_refused(tmp_path: Path) -> None:
    """A catalogue holds 1 to 32 suppliers."""
    text = "".join(_entry(name=f'"s{i}"', url=_URL) for i in range(33))
    with pytest.raises(ConfigError, match="33 suppliers, at most 32"):
        _load(tmp_path, text)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    """A catalogue path that does not exist says so, naming it."""
    settings = Settings(suppliers_file=str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"absent\.toml: cannot read"):
        load_catalogue(settings, {})


def test_entries_default_to_the_global_settings(tmp_path: Path) -> None:
    """An entry without a setting takes the global one; the default share counts the catalogue."""
    two = _entry(name='"atlas"', url=_URL) + _entry(
        name='"boreal"', url=_URL, share="2", read_timeout="0.3", breaker_failures="0"
    )
    catalogue = _load(tmp_path, two, outbound_limit=10, connect_timeout=0.4)
    atlas, boreal = catalogue.suppliers
    assert (atlas.share, atlas.connect_timeout, atlas.read_timeout) == (9, 0.4, 1.0)
    assert (boreal.share, boreal.read_timeout, boreal.breaker_failures) == (2, 0.3, 0)
    assert atlas.breaker_failures == 5


def test_the_default_catalogue_is_the_three_lab_suppliers() -> None:
    """No file: atlas, boreal and cedar under the provider URL, with 4 of 6 slots each."""
    catalogue = load_catalogue(Settings(provider_url="http://lab:9101/base"), {})
    assert catalogue.names == LAB_SUPPLIERS
    assert [s.url for s in catalogue.suppliers] == [
        f"http://lab:9101/base/quotes/{name}" for name in LAB_SUPPLIERS
    ]
    assert {s.share for s in catalogue.suppliers} == {4}


def test_header_values_never_reach_the_starting_event(tmp_path: Path) -> None:
    """The starting event lists each supplier's header names, never their values."""
    text = _entry(name='"atlas"', url=_URL, headers='{ Authorization = "Bearer ${TOKEN}" }')
    catalogue = _load(tmp_path, text)
    settings = Settings(suppliers_file=str(tmp_path / "suppliers.toml"))
    fields = loggable(settings, catalogue)
    assert fields["suppliers"][0]["headers"] == ["Authorization"]
    assert SECRET not in repr(fields)
    assert SECRET not in repr(catalogue)


def test_fleet_mode_serves_suppliers_of_different_shares_and_budgets(tmp_path: Path) -> None:
    """Each supplier's share and retry bucket go to Redis with every sync: any catalogue serves."""
    text = _entry(name='"atlas"', url=_URL, share="1", retry_budget_capacity="3") + _entry(
        name='"boreal"', url=_URL, share="4"
    )
    catalogue = _load(tmp_path, text, redis_url="redis://127.0.0.1:1/0")
    assert catalogue.shares() == {"atlas": 1, "boreal": 4}


def test_quoteflow_exits_2_with_one_line_and_no_secret(tmp_path: Path) -> None:
    """``python -m quoteflow --suppliers BAD`` prints one line and exits 2, no traceback."""
    path = tmp_path / "suppliers.toml"
    path.write_text(
        _entry(name='"atlas"', url=_URL, headers='{ Authorization = "${TOKEN}" }', share="99")
    )
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--suppliers", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"TOKEN": SECRET, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("quoteflow: error: supplier catalogue ")
    assert "'atlas': share" in lines[0]
    assert SECRET not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_the_file_may_come_from_the_environment(tmp_path: Path) -> None:
    """``QUOTEFLOW_SUPPLIERS_FILE`` names the file when the flag does not."""
    path = tmp_path / "suppliers.toml"
    path.write_text(GOOD)
    settings = parse_settings([], {"QUOTEFLOW_SUPPLIERS_FILE": str(path)})
    assert settings.suppliers_file == str(path)
    assert load_catalogue(settings, {}).names == ("atlas",)
