"""The operations endpoints: state views for any client, and the actions only an admin may take —
the runtime kill switch, approval decisions, revoking grants, the store's paid terms, a config
reload (see `guard.py` for the rules). Each handler is `(request, ctx)` behind its door
(`routes.py`): a view's at `CALLER`, an action's at `ADMIN`."""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes._core.audit.forecast import (
    MOST,
    WINDOW_S,
    forecast_body,
    rate_per_hour,
    recent_use,
    scope_rates,
)
from lanes._core.audit.quotas import audited_spend
from lanes._core.audit.report import explain, parse_since, report
from lanes._core.batch.outlook import batch_outlook
from lanes._core.open import clear_left
from lanes._core.state.store import STORE_ERRORS
from lanes._http.context import Context, caller, read_body
from lanes._http.errors import BadRequest, error_response
from lanes._http.guard import RequestRefused
from lanes._http.state import lanes_state, terms_view
from lanes._http.validation import json_object, parse_decision, parse_terms

RELOAD_WAIT_S = 60.0  # `POST /v1/reload` answers within this: new workers get 30 s to serve
RELOAD_POLL_S = 0.05


def own(request: Request, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a caller may see of per-client rows: an admin all of them, a client its own."""
    who = caller(request)
    return rows if who.admin else [r for r in rows if r.get("client") == who.client]


def _audited(ctx: Context) -> Any:
    """A client's spend today as this host's audit has it (for a shared store without its total)."""
    return partial(audited_spend, ctx.dispatcher.store.records.query)


async def lanes_view(request: Request, ctx: Context) -> Response:
    who = caller(request)
    client = None if who.admin else who.client  # a client sees its own jobs only
    body = lanes_state(ctx.dispatcher.statistics(), trio.current_time(), client=client)
    if client is not None:  # a client key: its own paid spend, against its own ceiling too
        try:
            own = ctx.dispatcher.paid_day(client, audited=_audited(ctx))
        except STORE_ERRORS:
            return error_response(503, "the paid ledger can not be read now", "state_store_down")
        body["paid"] |= {  # `client` null: every client's (a shared store keeps no total of its)
            "spent_today_usd": own.spent_usd,
            "ceiling_usd": own.ceiling_usd,
            "client": own.client,
            "closed": own.closed,  # the others' spend took what the global ceiling held
            "this_host": own.this_host,  # the spend as this host's audit has it (Redis)
        }
    body["config"] = ctx.running.view()
    return JSONResponse(body)


async def reload(request: Request, ctx: Context) -> Response:
    """Ask the parent to reload the config (SIGHUP) and answer what it decided."""
    if not ctx.running.supervised:
        return error_response(
            409,
            "this sidecar is one process, which reads its config at startup only: restart it "
            "to apply a changed config, or run `lanes serve --workers N` to reload in place",
            "reload_unsupported",
        )
    asked = json_object(await read_body(request, ctx) or b"{}")
    accept_weaker = asked.get("accept_weaker") is True
    before = (ctx.running.host() or {}).get("reloads", 0)
    try:
        ctx.running.request_reload(accept_weaker=accept_weaker)
    except ProcessLookupError:
        return error_response(503, "the parent process is gone", "reload_unavailable")
    with trio.move_on_after(RELOAD_WAIT_S):
        while (host := ctx.running.host() or {}).get("reloads", 0) == before:  # noqa: ASYNC110
            await trio.sleep(RELOAD_POLL_S)  # the parent's answer is a file: nothing to await
        outcome = host.get("last_reload") or {}
        message = str(outcome.get("message", ""))
        if not outcome.get("ok"):  # the running config stays: nothing to retry as is
            return error_response(422, message, "reload_refused")
        return JSONResponse({"ok": True, "message": message, "sha256": outcome.get("sha256")})
    return error_response(504, "the reload did not end in time; see the log", "reload_timeout")


async def switch(request: Request, ctx: Context) -> Response:
    name, action = request.path_params["name"], request.path_params["action"]
    if action not in ("off", "on"):
        return error_response(404, f"no route {request.url.path}", "not_found")
    try:
        ctx.dispatcher.lane_off(name) if action == "off" else ctx.dispatcher.lane_on(name)
    except KeyError:
        return error_response(404, f"no lane named {name!r}", "lane_not_found", param="name")
    return JSONResponse({"lane": name, "off": ctx.dispatcher.is_off(name)})


async def approvals(request: Request, ctx: Context) -> Response:
    await ctx.dispatcher.approvals.refresh()  # every process's, as the store holds them now
    listed = [dict(a) for a in ctx.dispatcher.statistics().approvals]
    return JSONResponse({"data": own(request, listed)})


async def decide(request: Request, ctx: Context) -> Response:
    approval_id = request.path_params["approval_id"]
    body = json_object(await read_body(request, ctx) or b"{}")
    decision = parse_decision(body.get("decision"))
    try:
        approval = await ctx.dispatcher.approvals.decide(approval_id, decision)
    except KeyError:
        return error_response(404, f"no pending approval {approval_id!r}", "approval_not_found")
    except ValueError as exc:
        return error_response(400, str(exc), "invalid_request", param="decision")
    except STORE_ERRORS:
        return error_response(
            503, "the decision can not be kept: the state store is down", "state_store_down"
        )
    return JSONResponse({"id": approval.id, "decision": approval.decision})


async def grants(request: Request, ctx: Context) -> Response:
    try:
        return JSONResponse({"data": own(request, await ctx.dispatcher.approvals.grants())})
    except STORE_ERRORS:
        return error_response(503, "the state store is down", "state_store_down")


async def revoke(request: Request, ctx: Context) -> Response:
    grant_id = request.path_params["grant_id"]
    try:
        revoked = await ctx.dispatcher.approvals.revoke(grant_id)
    except STORE_ERRORS:
        return error_response(503, "the state store is down", "state_store_down")
    if not revoked:
        return error_response(404, f"no grant {grant_id!r}", "grant_not_found")
    return JSONResponse({"id": grant_id, "revoked": True})


async def ceiling(request: Request, ctx: Context) -> Response:
    """`lanes ceiling set`: the store's terms for every host sharing it (an operator's)."""
    usd, consent = parse_terms(json_object(await read_body(request, ctx) or b"{}"))
    try:
        await ctx.dispatcher.set_terms(ceiling_usd=usd, consent=consent)
    except STORE_ERRORS:
        return error_response(
            503, "the terms can not be kept: the state store is down", "state_store_down"
        )
    return JSONResponse(terms_view(ctx.dispatcher.statistics()))


async def report_view(request: Request, ctx: Context) -> Response:
    try:
        since = parse_since(request.query_params.get("since", "1d"), ctx.dispatcher.clock.trusted())
        by = request.query_params.get("by", "cohort")
        who = caller(request)
        if by == "client" and not who.admin:
            raise RequestRefused(403, "admin_key_required", "a report by client needs an admin key")
        ceiling = ctx.dispatcher.config.policy.paid_ceiling_usd_per_day
        terms = ctx.server.clients.get(who.client)
        if not who.admin and terms is not None and terms.paid_ceiling_usd_per_day is not None:
            ceiling = min(ceiling, terms.paid_ceiling_usd_per_day)
        read = partial(
            report,
            ctx.dispatcher.store.records.query,
            since=since,
            by=by,
            ceiling_usd=ceiling,
            client=None if who.admin else who.client,  # a client: its own jobs only
        )
        body = await trio.to_thread.run_sync(read, limiter=ctx.reading)  # tens of ms at 1M jobs
    except (ValueError, OverflowError) as exc:
        return error_response(400, str(exc), "invalid_request")
    except STORE_ERRORS:
        return error_response(503, "the audit can not be read now", "state_store_down")
    return JSONResponse(body.as_dict())


async def forecast_view(request: Request, ctx: Context) -> Response:
    """Each free quota's projected end and the paid day's, at the last hour's rate (a client: its
    own paid spend only; the free quotas are every client's)."""
    who = caller(request)
    client = None if who.admin else who.client
    dispatcher = ctx.dispatcher
    dispatcher.catch_up()  # what other processes on the host counted a moment ago
    now = dispatcher.now_wall()
    quotas = dispatcher.free_quotas()
    query = dispatcher.store.records.query
    read = partial(recent_use, query, since=now - WINDOW_S, client=client)
    try:
        paid = dispatcher.paid_day(client, audited=_audited(ctx))
        use = await trio.to_thread.run_sync(read, limiter=ctx.reading)  # the last hour's rows
    except STORE_ERRORS:
        return error_response(503, "the audit can not be read now", "state_store_down")
    rates, paid_rate = scope_rates(use, dispatcher.manager.scope), rate_per_hour(use.paid_usd)
    body = forecast_body(quotas, rates, paid, paid_rate=paid_rate, now=now)
    cache = dispatcher.cache
    if cache is not None and who.admin:  # what the response cache saved (every client's)
        counts = await trio.to_thread.run_sync(partial(cache.statistics, sizes=True))
        body["cache"] = attrs.asdict(counts)
    if ctx.batches is not None:  # work that can wait: each open batch's projected end
        held = await ctx.batches.call(ctx.batches.queue.open_batches, client, MOST)
        body["batches"] = [batch_outlook(b, now) for b in held]
    return JSONResponse(body)


async def cache_clear(request: Request, ctx: Context) -> Response:
    """`lanes cache clear [--client K]`: delete the response cache's entries — one client's, or
    every one (an admin's); with `[cache]` off, what an earlier config's cache left."""
    body = json_object(await read_body(request, ctx) or b"{}")
    client = body.get("client")
    if client is not None and (not isinstance(client, str) or not 0 < len(client) <= 256):
        raise BadRequest("'client' must name a client", "client")
    cache, config = ctx.dispatcher.cache, ctx.dispatcher.config
    try:
        if cache is not None:
            deleted = await cache.clear(client)
        else:
            deleted = await trio.to_thread.run_sync(clear_left, config, client)
    except Exception as exc:  # the store's own errors (SQLite's, Redis's)
        return error_response(
            503, f"the cache can not be cleared now ({type(exc).__name__})", "state_store_down"
        )
    return JSONResponse({"deleted": deleted, "client": client})


async def request_view(request: Request, ctx: Context) -> Response:
    try:
        story = explain(ctx.dispatcher.store.records.query, request.path_params["request_id"])
    except STORE_ERRORS:
        return error_response(503, "the audit can not be read now", "state_store_down")
    if story is None or not own(request, [story]):  # another client's: as unknown
        return error_response(
            404,
            "no such request in the audit (yet: it is written within a second)",
            "request_not_found",
        )
    return JSONResponse(story)
