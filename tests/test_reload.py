"""SIGHUP's reload: each file is swapped whole or kept, and says which in one event."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from quoteflow.options import ConfigError
from quoteflow.reload import register, reload_all


class Recording:
    """A reloadable that counts its reloads and refuses while ``broken`` is set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reloads = 0
        self.broken = False

    def reload(self) -> None:
        if self.broken:
            raise ConfigError(f"{self.name}.toml: line 3: bad")
        self.reloads += 1


def test_a_refused_file_is_kept_and_the_others_still_reload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One bad file logs ``reload_refused`` with its reason; the next file is still re-read."""
    app = web.Application()
    first, second = Recording("suppliers"), Recording("callers")
    register(app, first)
    register(app, second)
    first.broken = True
    with caplog.at_level(logging.INFO, logger="quoteflow"):
        reload_all(app)
    assert (first.reloads, second.reloads) == (0, 1)
    seen = [(r.event, r.fields) for r in caplog.records]  # type: ignore[attr-defined]
    assert ("reload_refused", {"file": "suppliers", "error": "suppliers.toml: line 3: bad"}) in seen
    assert ("reloaded", {"file": "callers"}) in seen


def test_an_app_without_files_reloads_nothing() -> None:
    """SIGHUP to a QuoteFlow with no catalogue or callers file is harmless."""
    reload_all(web.Application())
