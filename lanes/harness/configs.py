"""Lane tables pointing at fake providers, and an in-process sidecar over them (real sockets)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from lanes.testing import FakeProvider, open_fake

PAID_KEY = "sk-test-paid-0123456789abcdef"
FREE_KEY = "gsk_test_free_0123456789abcdef"
CLIENT_KEY = "lanes-client-key-0123456789"
KEYS = {"PAID_API_KEY": PAID_KEY, "FREE_API_KEY": FREE_KEY, "CLIENT_KEY": CLIENT_KEY}


def lane(
    name: str,
    url: str,
    models: list[str],
    *,
    kind: str,
    module: str = "openai_compatible",
    key_env: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """One `[[lanes]]` table for a fake provider."""
    priced = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0} if kind == "none" else {}
    return {
        "name": name,
        "module": module,
        "base_url": url,
        "api_key_env": key_env,
        "free_tier": {"kind": kind},
        "models": [{"id": m, **priced} for m in models],
        **extra,
    }


def free_lane(name: str, url: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return lane(
        name, url, models or ["free-model"], kind="rate_limited", key_env="FREE_API_KEY", **extra
    )


def local_lane(
    name: str, url: str, models: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    return lane(name, url, models or ["local-model"], kind="local", **extra)


def paid_lane(name: str, url: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return lane(name, url, models or ["paid-model"], kind="none", key_env="PAID_API_KEY", **extra)


BUILDERS = {"local": local_lane, "free": free_lane, "paid": paid_lane}


@asynccontextmanager
async def open_sidecar(
    *lanes: tuple[Any, ...],
    policy: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    epoch_now: float | None = None,
    setup: Callable[[dict[str, FakeProvider]], None] | None = None,
    **top: Any,
) -> AsyncIterator[tuple[str, dict[str, FakeProvider]]]:
    """Fakes for `lanes` ((name, kind, models[, extra lane keys]) with kind local/free/paid) and a
    sidecar in front of them in this process. Yields the sidecar's base URL (…/v1) and the fakes.
    `epoch_now`: the sidecar's wall reads it now (under a virtual clock: a day and hour of the
    test's choosing); `setup`: called with the fakes before the sidecar starts (to script what
    they answer its startup: the first model list)."""
    from lanes import load_config
    from lanes._http.server import serve

    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        fakes = {
            spec[0]: await stack.enter_async_context(open_fake(spec[0], models=tuple(spec[2])))
            for spec in lanes
        }
        if setup is not None:
            setup(fakes)
        tables = [
            {
                **BUILDERS[spec[1]](spec[0], fakes[spec[0]].base_url, spec[2]),
                **(spec[3] if len(spec) > 3 else {}),
            }
            for spec in lanes
        ]
        # deterministic unless a caller wants exploration
        top.setdefault("scoring", {"explore_rate": 0.0})
        config = load_config(
            {
                "lanes": tables,
                "policy": policy or {"free_tier_fallback": "allow"},
                "server": {"port": 0, **(server or {})},
                **top,
            },
            env={},
        )
        full_env = {**KEYS, **os.environ, **(env or {})}
        url = await nursery.start(
            lambda task_status: serve(
                config, env=full_env, task_status=task_status, epoch_now=epoch_now
            )
        )
        try:
            yield f"{url}/v1", fakes
        finally:
            nursery.cancel_scope.cancel()
