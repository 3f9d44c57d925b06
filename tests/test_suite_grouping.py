"""The suite's own distribution: ``--dist loadgroup`` really keeps a file on one worker.

pytest 9.2 changed how node ids are kept, and pytest-xdist's loadgroup (which
adds the group to each node id) silently stopped grouping: files were split
across workers, their module-scoped processes started once per worker, and the
gunicorn fleet tests, meant to run one at a time, overlapped. Nothing failed
but the timing tests, now and then. This test fails instead.
"""

from __future__ import annotations

import os

import pytest


def test_under_loadgroup_every_test_carries_its_group(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("only meaningful on a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith(f"@{request.node.path}"), request.node.nodeid
