"""The dispatcher's background upkeep, each task on its own and none able to die: a provider
unreachable at startup said once, a lane's model list fetched again, a credit lane's balance
asked, the audit's old rows deleted (the state sync is `state/sync.py`'s)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import httpx2
import trio

from lanes._core.engine.catalog import Catalog, LaneHealth
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import UpstreamError
from lanes._core.runtime.tasks import TaskHealth
from lanes._core.state.backend import Backend, call
from lanes._core.state.clock import StoreClock
from lanes._core.state.records import LocalRecords
from lanes._core.upstream.lane import OpenAICompatibleLane

log = logging.getLogger("lanes")


async def check_reachable(
    health: LaneHealth, lane: OpenAICompatibleLane, within_s: float = 2.0
) -> None:
    """At startup: one log line for a provider on an IP address or localhost that does not accept
    a connection. Hostnames are not looked up here (a lookup can hang and leaves the machine); the
    first request finds out. Startup never waits for this."""
    url = httpx2.URL(lane.spec.base_url)
    host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return
    with trio.move_on_after(within_s):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except Exception as exc:  # refused, unreachable, or anything else: a log line, never fatal
            reason = getattr(exc, "strerror", None) or str(exc)[:120] or type(exc).__name__
            health.unreachable(lane.name, f"unreachable at startup ({reason})")
            log.warning(
                "lane %s: provider unreachable at startup (%s); "
                "serving from the others until it answers",
                lane.name,
                reason,
            )
            return
        await stream.aclose()
        return
    health.unreachable(lane.name, f"accepted no connection within {within_s:g}s at startup")
    log.warning(
        "lane %s: provider accepted no connection within %gs at startup", lane.name, within_s
    )


async def _round(
    health: TaskHealth, what: str, work: Callable[[], Awaitable[None]], within_s: float
) -> bool:
    """One round of a background task within `within_s`: True when it worked. Never raises (but
    for cancellation): a failure, of any kind, goes to the task's health."""
    with trio.move_on_after(within_s):
        try:
            await work()
        except Exception as exc:  # a background task must not die: report, carry on
            health.failed(exc, what if isinstance(exc, UpstreamError) else f"{what} (unreadable)")
            return False
        health.ok()
        return True
    health.failed(TimeoutError(f"no answer within {within_s:g} s"), what)
    return False


async def discover(
    catalog: Catalog, lanes: LaneHealth, lane: OpenAICompatibleLane, health: TaskHealth
) -> None:
    """Fetch the lane's model list now and every `catalog_refresh_s` (sooner after a 404). Never
    dies: a failed round is reported to the task's health and the configured models serve."""
    listed = 0

    async def refresh() -> None:
        nonlocal listed
        listed = await lane.refresh_catalog()
        catalog.catalog_changed(lane)

    first = True
    while True:
        event = lanes.next_refresh(lane.name)
        what = "model list unavailable; routing to configured models"
        if await _round(health, what, refresh, 30.0) and first:
            first = False
            log.info(
                "lane %s: %d models listed, %d routable", lane.name, listed, len(lane.candidates)
            )
        with trio.move_on_after(lane.config.catalog_refresh_s):
            await event.wait()


async def poll_balance(
    manager: FreeTierManager,
    now_wall: Callable[[], EpochTime],
    lane: OpenAICompatibleLane,
    health: TaskHealth,
) -> None:
    """Ask a credit lane's balance endpoint now and every `balance_poll_s`; its figure beats the
    estimate. Never dies: a failed round is reported to the task's health."""

    async def poll() -> None:
        remaining = await lane.fetch_balance()
        if remaining is not None:
            manager.set_balance(lane.name, remaining, now=now_wall())

    while True:
        what = "balance endpoint failed; keeping the local estimate"
        await _round(health, what, poll, min(30.0, lane.config.balance_poll_s))
        await trio.sleep(lane.config.balance_poll_s)


class RecordsStore(Backend, Protocol):
    """What the audit's retention needs of the state store: this host's records, and how a call
    reaches it."""

    @property
    def records(self) -> LocalRecords: ...


async def keep_audit(
    store: RecordsStore, clock: StoreClock, days: float, every_s: float = 3600.0
) -> None:
    """Delete the audit of jobs older than `days`, now and every hour. It never dies: a failure is
    one log line, and the next hour tries again."""
    while True:
        try:
            before = clock.trusted() - days * 86400.0
            removed = await call(store, store.records.prune_audit, before)
        except Exception as exc:  # a background task must not take the sidecar down
            log.warning(
                "audit retention: can not delete old rows (%s); trying again in an hour", exc
            )
        else:
            if removed:
                log.info("audit retention: %d job(s) older than %g days deleted", removed, days)
        await trio.sleep(every_s)
