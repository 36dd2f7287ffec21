"""A running sidecar over fake providers, for integration tests on real loopback sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from drills.fakes import FakeProvider, open_fake
from helpers import FREE_KEY, PAID_KEY, free_lane, local_lane, paid_lane
from lanes import load_config
from lanes._http.server import serve

CLIENT_KEY = "lanes-client-key-0123456789"


@asynccontextmanager
async def open_sidecar(*lanes: tuple, policy: dict[str, Any] | None = None,
                       server: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                       **top: Any) -> AsyncIterator[tuple[str, dict[str, FakeProvider]]]:
    """Fakes for `lanes` ((name, kind, models[, extra lane keys]) with kind local/free/paid) and a
    sidecar in front.

    Yields the sidecar's base URL (…/v1) and the fakes by lane name.
    """
    builders = {"local": local_lane, "free": free_lane, "paid": paid_lane}
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        fakes = {lane[0]: await stack.enter_async_context(open_fake(lane[0], models=tuple(lane[2]))) for lane in lanes}
        tables = [{**builders[lane[1]](lane[0], fakes[lane[0]].base_url, lane[2]), **(lane[3] if len(lane) > 3 else {})}
                  for lane in lanes]
        config = load_config({"lanes": tables, "policy": policy or {"free_tier_fallback": "allow"},
                              "server": {"port": 0, **(server or {})}, **top}, env={})
        full_env = {"PAID_API_KEY": PAID_KEY, "FREE_API_KEY": FREE_KEY, "CLIENT_KEY": CLIENT_KEY,
                    **__import__("os").environ, **(env or {})}
        url = await nursery.start(lambda task_status: serve(config, env=full_env, task_status=task_status))
        try:
            yield f"{url}/v1", fakes
        finally:
            nursery.cancel_scope.cancel()
