"""Named callers: who may call, how often (a rate) and how much at once (seats).

The design in brief (each module says more):

**The file** (``file.py``). ``--callers FILE``: TOML, one ``[[caller]]`` table
each — ``name``, the key as ``key_sha256`` (the file holds no secret) or
``key = "${VAR}"``, an optional ``rate`` (``"100/60s"``) and optional
``seats``. ``load_callers(path, environ) -> Callers`` is a pure function that
raises ``ConfigError`` (one line naming the file and caller, never a key);
start-up, ``SIGHUP`` and gunicorn's master all run that same check.
``--api-keys-file`` still works: each key is an unnamed caller (``-``) with no
rate and no seats. A caller is identified by its key alone, compared in
constant time with every key (``model.py``); nothing else it sends counts.

**The rate** (``meter.py``): GCRA with a burst of the whole quota, kept as a
leaky bucket's level in requests. One number per caller, changed only when a
request is admitted; a caller idle for a window may send its quota at once,
then one request per ``window / quota``. Why GCRA rather than a token bucket
with a refill timer: the same limit, but one value per caller and no timer,
which is what makes it one small Lua script in Redis that writes only when it
admits. A reload that changes a rate keeps
what the caller has used; it drains at the new rate from then on.

**Seats** (``gate.py``): at most ``seats`` of a process's inbound seats held by
one caller at once (default: no limit but the inbound one). Seats are per
process, like the inbound limit, also in fleet mode.

**The order** (``gate.py``): seat → inbound limit → rate. A refusal takes
nothing and gives back what the steps before it took: refused for seats
spends no quota, refused for the rate holds no seat, a refused request
reaches no supplier. A wrong or missing key is 401 before any of it.

**The answers**: 429 ``quota_exceeded`` with ``Retry-After`` (whole seconds,
rounded up: never earlier than the caller may succeed); 429 ``seats_exceeded``
with ``Retry-After: 1``; our own overload stays 503 ``capacity_exhausted``.
Every answer to a caller with a rate carries ``RateLimit-Policy:
"<name>";q=<quota>;w=<window>`` and ``RateLimit: "<name>";r=<remaining>;t=<s>``
(draft-ietf-httpapi-ratelimit-headers-11), ``r`` counted after this request
and ``t`` the seconds until one more request is available (so a 429's ``t``
equals its ``Retry-After``).

**Fleet-wide** (``shared.py``, with ``--redis-url``): the rate holds for every
worker together, at most one EVALSHA of ``quota.lua`` per admitted request
(far from the quota, one per short lease of several) and none for a refusal
whose retry time is known; Redis out of reach → each worker keeps to ``rate /
live workers``, bounded by ``--redis-timeout``, never a 5xx.

**Reload** (``CallersFile``): ``SIGHUP`` re-reads the file and swaps the
callers whole; a bad file changes nothing (one ``reload_refused`` event).
"""

from __future__ import annotations

from quoteflow.callers.file import load_callers, parse_rate
from quoteflow.callers.gate import QUOTA_EXCEEDED, SEATS_EXCEEDED, CallersFile, Gate, Pass
from quoteflow.callers.meter import LocalMeter, Standing
from quoteflow.callers.model import UNNAMED, Caller, Callers, Rate
from quoteflow.callers.shared import SharedMeter

__all__ = [
    "QUOTA_EXCEEDED",
    "SEATS_EXCEEDED",
    "UNNAMED",
    "Caller",
    "Callers",
    "CallersFile",
    "Gate",
    "LocalMeter",
    "Pass",
    "Rate",
    "SharedMeter",
    "Standing",
    "load_callers",
    "parse_rate",
]
