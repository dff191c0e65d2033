"""A Lua script of the library's Redis backends, called by ``EVALSHA``.

redis-py's ``AsyncScript`` does, at every call, two ``isinstance`` checks of the client
against its pipeline classes (protocol classes, so each check runs in Python) and two imports,
about a tenth of the Python a routed signal spends outside redis-py's connection. The library
never calls a script on a pipeline (``RedisHandle.eval_many`` sends ``EVALSHA`` itself), so
:class:`Script` calls ``EVALSHA`` directly, and on ``NOSCRIPT`` (a restart, a failover, a
flushed cache) loads the script and calls it again, as redis-py does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis.exceptions

__all__ = ["Script"]


class Script:
    """``await script(keys=..., args=...)`` on ``client`` (or on ``client=``); ``sha`` and
    ``script`` as redis-py's ``AsyncScript`` has them."""

    __slots__ = ("client", "script", "sha")

    def __init__(self, client: Any, script: str) -> None:
        self.client = client
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                       client: Any = None) -> Any:
        target = self.client if client is None else client
        try:
            return await target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.sha = await target.script_load(self.script)
            return await target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
