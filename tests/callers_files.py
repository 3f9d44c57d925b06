"""Callers files for tests: keys, their digests, and a file written from tables."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

KEYS = {
    "acme": "acme-key-0123456789",
    "beta": "beta-key-abcdefghij",
    "gamma": "gamma-key-klmnopqrst",
}
"""A key per caller name; the files hold their digests, never these."""


def sha256(key: str) -> str:
    """The ``key_sha256`` of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(name: str) -> dict[str, str]:
    """The ``Authorization`` header of caller ``name``."""
    return {"Authorization": f"Bearer {KEYS[name]}"}


def toml_value(value: Any) -> str:
    """``value`` written as TOML (the few types a callers file holds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def callers_toml(*tables: dict[str, Any]) -> str:
    """A callers file of ``tables``; a table without a key gets its name's digest."""
    lines: list[str] = []
    for table in tables:
        fields = dict(table)
        if "key" not in fields and "key_sha256" not in fields and fields.get("name") in KEYS:
            fields["key_sha256"] = sha256(KEYS[fields["name"]])
        lines.append("[[caller]]")
        lines += [f"{field} = {toml_value(value)}" for field, value in fields.items()]
        lines.append("")
    return "\n".join(lines)


def write_callers(path: Path, *tables: dict[str, Any]) -> Path:
    """Write a callers file of ``tables`` to ``path`` (replacing it whole, as an editor would)."""
    partial = path.with_suffix(".part")
    partial.write_text(callers_toml(*tables), encoding="utf-8")
    partial.replace(path)
    return path
