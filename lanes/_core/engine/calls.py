"""What each door does with an admitted attempt — a completion, an embedding, a stream: send it
under the lane's own cap, within the job's deadline, and hand back what the caller receives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial

import trio

from lanes._core.engine.attempt import AttemptRun
from lanes._core.engine.stream import ReplyStream, first_chunks, with_usage
from lanes._core.freetier.kinds import CreditBased
from lanes._core.model.candidates import Reply
from lanes._core.model.errors import AttemptTimedOut
from lanes._core.model.job import Job
from lanes._core.upstream.client import Response
from lanes._core.upstream.shapes import usage_in


async def complete_call(run: AttemptRun, stack: AsyncExitStack) -> Reply:
    """One non-streamed request under min(deadline, start + attempt_timeout_s)."""
    return await _request(run, partial(run.lane.complete, sent=run.on_sent))


async def embed_call(run: AttemptRun, stack: AsyncExitStack) -> Reply:
    """One embeddings request under min(deadline, start + attempt_timeout_s)."""
    return await _request(run, run.lane.embed)


async def _request(run: AttemptRun, send: Callable[[Job, str], Awaitable[Response]]) -> Reply:
    cap = run.lane.config.attempt_timeout_s
    with trio.move_on_at(min(run.record.deadline_at, run.started + cap)):
        response = await send(run.job, run.candidate.model)
        return served(run, response)
    raise AttemptTimedOut(f"no answer within the lane's attempt_timeout_s={cap:g}")


def served(run: AttemptRun, response: Response) -> Reply:
    """Settle a served non-streamed attempt and wrap the upstream's body."""
    run.answered(response.status, response.headers)
    usage = usage_in(response.body)
    attempt = run.end("ok", status=response.status, usage=usage)
    record = run.record
    return Reply(
        body=response.body,
        lane=run.candidate.lane,
        provider=run.lane.spec.provider,
        model=run.candidate.model,
        route=attempt.route,
        attempts=tuple(record.attempts),
        skips=tuple(record.skips),
        cost_usd=sum(a.cost_usd for a in record.attempts),  # the job's, failed attempts too
        usage=usage,
        explored=record.explored == run.candidate.key,
        raw=response.raw,
        request_id=record.id,
    )


async def stream_call(run: AttemptRun, stack: AsyncExitStack) -> ReplyStream:
    """Open the stream and wait for its first chunk under min(deadline, start + first_token_s);
    the upstream response stays open in `stack`, with the stream."""
    job = run.job
    if run.candidate.tier == "paid" or isinstance(run.lane.spec.free_tier, CreditBased):
        job = with_usage(job)  # billed: settle from the upstream's own count
    cap = run.lane.config.first_token_s
    with trio.move_on_at(min(run.record.deadline_at, run.started + cap)):
        opened = run.lane.open_stream(job, run.candidate.model, sent=run.on_sent)
        reader = await stack.enter_async_context(opened)
        buffered = await first_chunks(reader)
        run.answered(200, reader.headers)
        return ReplyStream(run=run, reader=reader, buffered=buffered)
    raise AttemptTimedOut(f"no first chunk within the lane's first_token_s={cap:g}")
