"""Freeing a dead worker's slots at once, from its gunicorn master (``child_exit``).

Redis cannot tell a worker that died from one cut off alone and still sending
on its own: both stop syncing. So a silent worker is held back for the outage
grace (``sync.lua``), which would strand a killed worker's slots that long.
Its master knows better: gunicorn reports every worker that exits, killed or
not, and a dead process sends nothing. The master frees every record of that
host and process id (``hosts.worker_identity``) in one atomic step and
says ``freed`` on the channel, so a worker waiting for those slots syncs now.
"""

from __future__ import annotations

import socket
from typing import Any, Final

from quoteflow.fleet.script import keys

RELEASE: Final = """
local freed = 0
for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do
  if string.sub(id, 1, #ARGV[1]) == ARGV[1] then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[8], id)
    freed = freed + 1
  end
end
if freed > 0 then redis.call('PUBLISH', ARGV[2], 'freed ' .. ARGV[1]) end
return freed
"""
"""KEYS: the sync script's; ARGV: the id prefix (``<host>/<pid>/``), the channel."""


def release_process(client: Any, prefix: str, pid: int, host: str | None = None) -> int:
    """Drop process ``pid``'s records from the fleet (``client``: a blocking redis-py client).

    Returns how many records went (0: it had said goodbye, or never joined).
    """
    owner = f"{host or socket.gethostname()}/{pid}/"
    return int(client.eval(RELEASE, 8, *keys(prefix), owner, f"{prefix}:freed"))
