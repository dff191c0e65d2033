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
from typing import TYPE_CHECKING, Any

import redis.exceptions

from _signal_leases.redis.support import map_errors

if TYPE_CHECKING:
    from _signal_leases.redis.support import RedisHandle

__all__ = ["Script", "run_script"]


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


async def run_script(handle: RedisHandle, script: Script, keys: Sequence[Any],
                     args: Sequence[Any], operation: str, *, writes: bool = True) -> Any:
    """``script`` on ``handle``'s client, as every backend calls one: on asyncio only, after a
    Cluster client learnt its slots, with ``WAIT`` when ``wait_replicas`` is set and the
    script ``writes``, redis-py's errors mapped (naming ``operation``). One ``try`` rather
    than a context manager per call: this is the hot path of every lease and signal."""
    handle.require_asyncio()
    try:
        if not handle.initialized:
            await handle.ready()
        if writes and handle.wait_replicas:
            return (await handle.eval_many(handle.client, script, [(keys, args)],
                                           operation))[0]
        return await script(keys=keys, args=args)
    except Exception as exc:
        with map_errors(operation):
            raise exc
