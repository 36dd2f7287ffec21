"""The dispatcher's background upkeep, each task on its own and none able to die: a provider
unreachable at startup said once, a lane's model list fetched again, a credit lane's balance
asked, the audit's old rows deleted (the state sync is `state/sync.py`'s)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import httpx2
import trio

from lanes._core.config.schema import LaneConfig
from lanes._core.engine.catalog import Catalog, LaneHealth
from lanes._core.freetier.manager import FreeTierManager
from lanes._core.model.clocks import EpochTime
from lanes._core.model.errors import FinalError, ModelLoading, UpstreamError
from lanes._core.runtime.tasks import TaskHealth
from lanes._core.state.backend import Backend, call
from lanes._core.state.clock import StoreClock
from lanes._core.state.records import LocalRecords
from lanes._core.upstream.lane import OpenAICompatibleLane
from lanes._core.upstream.loader import find_provider
from lanes._core.upstream.spec import resolve

log = logging.getLogger("lanes")


async def unreachable_at_start(lane: OpenAICompatibleLane, within_s: float = 2.0) -> str | None:
    """Why a provider on an IP address or localhost does not accept a connection (None: it does,
    or its host is a name). Hostnames are not looked up here (a lookup can hang and leaves the
    machine); the first request finds out."""
    url = httpx2.URL(lane.spec.base_url)
    host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return None
    with trio.move_on_after(within_s):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except Exception as exc:  # refused, unreachable, or anything else: a log line, never fatal
            reason = getattr(exc, "strerror", None) or str(exc)[:120] or type(exc).__name__
            return f"unreachable at startup ({reason})"
        await stream.aclose()
        return None
    return f"accepted no connection within {within_s:g}s at startup"


async def check_lanes(
    health: LaneHealth,
    lanes: Sequence[OpenAICompatibleLane],
    unavailable: Mapping[str, str],
    fixes: Mapping[str, str],
) -> None:
    """At startup: one log line for each provider on an IP address or localhost that does not
    accept a connection; and, when no lane can serve (none loaded, or every one loaded
    unreachable), one line saying so with what would fix it — `fixes`: lane → what would (see
    `no_lane_line`). Startup never waits for this."""
    found: dict[str, str] = {}

    async def one(lane: OpenAICompatibleLane) -> None:
        if (why := await unreachable_at_start(lane)) is not None:
            health.unreachable(lane.name, why)
            found[lane.name] = why

    async with trio.open_nursery() as nursery:
        for lane in lanes:
            nursery.start_soon(one, lane)
    others = any(lane.name not in found for lane in lanes)
    for lane in lanes:
        if lane.name in found:
            tail = "; serving from the others until it answers" if others else ""
            log.warning("lane %s: provider %s%s", lane.name, found[lane.name], tail)
    if not others:
        log.warning("%s", no_lane_line({**unavailable, **found}, fixes))


def no_lane_line(why: Mapping[str, str], fixes: Mapping[str, str]) -> str:
    """The one line said when no lane can serve: each lane and why not, then what would fix it
    (`fixes`: lane → "set $GROQ_API_KEY", "start the server at http://127.0.0.1:11434/v1", …)."""
    if not why:
        return "no lane can serve: the config names no lane; add a [[lanes]] table (`lanes init`)"
    said = "; ".join(f"{lane}: {reason}" for lane, reason in why.items())
    fix = "; or ".join(f"{fixes[lane]} ({lane})" for lane in why if lane in fixes)
    return (
        f"no lane can serve: every request fails until one can ({said}). "
        f"To fix: {fix or 'see each reason'}"
    )


def fixes_for(lanes: Sequence[LaneConfig], unavailable: Mapping[str, str]) -> dict[str, str]:
    """What would let each lane of the config serve: set its key, enable it, or start its
    server (for the line `no_lane_line` says)."""
    fixes = {}
    for config in lanes:
        provider, _ = find_provider(config)
        if provider is None:
            continue
        spec = resolve(provider, config)
        reason = unavailable.get(config.name, "")
        if not config.enabled:
            fixes[config.name] = "enable it (`enabled = true`)"
        elif spec.api_key_env and "not set" in reason:
            fixes[config.name] = f"set ${spec.api_key_env}"
        elif not reason:
            fixes[config.name] = f"start the server at {spec.base_url}"
    return fixes


async def _round(
    health: TaskHealth, what: str, work: Callable[[], Awaitable[None]], within_s: float
) -> Exception | None:
    """One round of a background task within `within_s`: None when it worked, else what failed.
    Never raises (but for cancellation): a failure, of any kind, goes to the task's health."""
    with trio.move_on_after(within_s):
        try:
            await work()
        except Exception as exc:  # a background task must not die: report, carry on
            health.failed(exc, what if isinstance(exc, UpstreamError) else f"{what} (unreadable)")
            return exc
        health.ok()
        return None
    late = TimeoutError(f"no answer within {within_s:g} s")
    health.failed(late, what)
    return late


#: A model list that could not be had is asked again sooner than `catalog_refresh_s`: every
#: `LOADING_RETRY_S` while the server says it is loading its model (llama-server's 503 "Loading
#: model": it serves within seconds of being ready), else after 1 s, doubling up to
#: `MAX_RETRY_S` (a local server not started yet, a provider's 5xx or timeout). A final answer
#: (401, 403: a key the provider refuses) waits the whole `catalog_refresh_s`.
LOADING_RETRY_S = 2.0
MAX_RETRY_S = 60.0


def next_round_s(refresh_s: float, failed: Exception | None, streak: int) -> float:
    """Seconds until a lane's model list is fetched again, after a round that ended `failed`
    (None: it worked), the `streak`-th failed round in a row since the list was had or the
    server said it was loading."""
    if failed is None or isinstance(failed, FinalError):
        return refresh_s
    if isinstance(failed, ModelLoading):
        return min(refresh_s, LOADING_RETRY_S)
    return min(refresh_s, MAX_RETRY_S, 2.0 ** max(0, streak - 1))


async def discover(
    catalog: Catalog, lanes: LaneHealth, lane: OpenAICompatibleLane, health: TaskHealth
) -> None:
    """Fetch the lane's model list now and every `catalog_refresh_s` (sooner after a 404, and
    after a round that failed: `next_round_s`). Never dies: a failed round is reported to the
    task's health and the configured models serve."""
    listed = 0

    async def refresh() -> None:
        nonlocal listed
        listed = await lane.refresh_catalog()
        catalog.catalog_changed(lane)

    first, streak = True, 0
    while True:
        event = lanes.next_refresh(lane.name)
        what = "model list unavailable; routing to configured models"
        failed = await _round(health, what, refresh, 30.0)
        streak = 0 if failed is None or isinstance(failed, ModelLoading) else streak + 1
        if failed is None and first:
            first = False
            log.info(
                "lane %s: %d models listed, %d routable", lane.name, listed, len(lane.candidates)
            )
        with trio.move_on_after(next_round_s(lane.config.catalog_refresh_s, failed, streak)):
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
