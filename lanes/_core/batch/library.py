"""Work that can wait, from the library: `dispatcher.submit_batch(jobs, window="24h")`.

The jobs run as the sidecar's batch items do — never paying without a budget of their own
(`Job.free_only`), leaving `batch.headroom` of every free quota to interactive work, no job
started while an interactive one waits for a free quota, a "not now" (the rule of
`model/statuses.py`) tried again at its Retry-After — the quota's reset — with no job of the
same model tried before then, the rest ended by the window; while it has jobs left,
interactive jobs spare the quotas it needs (`engine/backlog.py`). The jobs are the caller's
objects, in memory already; nothing is written to disk (the sidecar's queue is the durable one).

    async with dispatcher.submit_batch(jobs, window="6h") as batch:
        async for result in batch.results():
            ...  # result.index, result.reply or result.error, as each ends
        print(batch.progress)

Leaving the block waits for the batch to end; `batch.cancel()` ends it sooner (jobs running are
let finish, the rest answer `batch_cancelled`).

A batch may pay on a budget of its own (`max_paid_usd`, as the sidecar's `lanes_max_paid_usd`): a
job pays only when free capacity can not serve it within the window (its next free try would fall
at or after the window's end), one job at a time, under consent `allow` and the daily ceiling, its
paid attempts' worst cases together within what is left (`Job.paid_cap_usd`); a try whose end was
not seen counts the whole of what it held.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence

import attrs
import trio

from lanes._core.batch.budget import MAX_USD
from lanes._core.batch.lines import window_s
from lanes._core.batch.runner import MIN_PAID_S, YIELD_S, ItemsLeft, put_back_for
from lanes._core.model.candidates import Reply
from lanes._core.model.errors import DeadlineExceeded, JobFailed
from lanes._core.model.job import Job
from lanes._core.model.statuses import try_again_in
from lanes._core.policy.needs import needs_of

log = logging.getLogger("lanes")

MAX_TRY_S = 3600.0  # one try's deadline, at most (the window's end when sooner), as the runner's


class BatchCancelled(JobFailed):
    """The batch was cancelled before this job ran."""

    code = "batch_cancelled"


class BatchExpired(DeadlineExceeded):
    """The batch's window ended before this job could be served free."""

    code = "batch_expired"


@attrs.frozen
class BatchResult:
    """One job's end: its place in what was submitted, and its reply or its error."""

    index: int
    job: Job
    reply: Reply | None = None
    error: JobFailed | None = None


@attrs.frozen
class Progress:
    total: int
    completed: int = 0
    failed: int = 0  # its error is its answer (expired and cancelled included)
    running: int = 0
    paid_usd: float = 0.0  # spent on its budget (what a try not seen to its end held, in full)

    @property
    def remaining(self) -> int:
        return self.total - self.completed - self.failed


def window_of(window: str | float) -> float:
    """A window in seconds: OpenAI's `24h` and lanes' `1h`..`7d` as text, or seconds (> 0)."""
    if isinstance(window, str):
        return float(window_s(window))
    if not (isinstance(window, int | float) and 0 < window <= 7 * 86400 and math.isfinite(window)):
        raise ValueError(f"window must be 0 < seconds <= 7 days, or text as 24h (got {window!r})")
    return float(window)


class LibraryBatch:
    """Runs `jobs` through `serve` within `window_s`; see the module's text."""

    def __init__(
        self,
        jobs: Sequence[Job],
        serve: Callable[[Job], Awaitable[Reply]],
        *,
        window_s: float,
        headroom: float,
        concurrency: int,
        interactive_waiting: Callable[[], int],
        backlog: ItemsLeft,
        max_paid_usd: float = 0.0,
    ) -> None:
        self._budget, self._paying = _dollars(max_paid_usd), trio.Lock()
        self._cut: trio.CancelScope | None = None  # the paid try running, which a cancel cuts
        self._backlog, self._source = backlog, f"library batch {id(self):x}"
        self._own = list(jobs)  # as the caller made them: its free_only and paid cap hold
        self._jobs = [attrs.evolve(j, free_only=True, headroom=headroom, max_wait_s=None)
                      for j in jobs]  # fmt: skip
        self._kinds = [_kind(j) for j in self._jobs]
        self._serve, self._waiting = serve, interactive_waiting
        self._end = trio.current_time() + window_s
        self._slots = trio.CapacityLimiter(concurrency)
        self._due: list[tuple[float, int, int]] = [(0.0, i, 0) for i in range(len(self._jobs))]
        self._held: dict[Hashable, float] = {}  # a kind → none of it tried before (trio time)
        self._progress = Progress(total=len(self._jobs))
        self._send, self._receive = trio.open_memory_channel[BatchResult](math.inf)
        self._wake = trio.Event()
        self._cancelled = False

    @property
    def progress(self) -> Progress:
        return self._progress

    @property
    def ends_at(self) -> float:
        """The window's end, on trio's clock."""
        return self._end

    def cancel(self) -> None:
        """No job starts any more; those not started answer `batch_cancelled`; a paid try
        running is cut (counted in full: its upstream may bill it)."""
        self._cancelled = True
        if self._cut is not None:
            self._cut.cancel()
        self._wake.set()

    async def results(self) -> AsyncIterator[BatchResult]:
        """Each job's result as it ends, once each; ends when the batch has."""
        async with self._receive.clone() as receive:
            async for result in receive:
                yield result

    async def run(self) -> None:
        """Start what is due while there is room, until every job has ended."""
        self._backlog.left(self._source, self._progress.remaining)
        try:
            await self._run()
        finally:
            self._backlog.left(self._source, 0)

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            while self._due or self._progress.running:
                now = trio.current_time()
                if self._cancelled or now >= self._end:  # what is not running ends now; what
                    self._end_the_rest(BatchCancelled if self._cancelled else BatchExpired)
                    if not self._progress.running:
                        break
                    pause = math.inf  # is ends by the window's end, or is put back and ends
                else:
                    pause = self._start_due(nursery, now)
                with trio.move_on_after(pause):
                    await self._wake.wait()
                self._wake = trio.Event()
        await self._send.aclose()

    def _start_due(self, nursery: trio.Nursery, now: float) -> float:
        """Start the jobs due while there is room; how long to sleep before looking again."""
        if self._waiting():  # interactive work waits for a free quota: it goes first
            return YIELD_S
        while self._due and self._due[0][0] <= now and self._slots.available_tokens:
            _, index, tries = heapq.heappop(self._due)
            held = self._held.get(self._kinds[index], 0.0)
            if held > now:  # a job like it was told "not before": none is tried sooner
                heapq.heappush(self._due, (min(held, self._end), index, tries))
                continue
            self._slots.acquire_on_behalf_of_nowait(index)
            self._progress = attrs.evolve(self._progress, running=self._progress.running + 1)
            nursery.start_soon(self._one, index, tries)
        if self._due and self._due[0][0] <= now:  # every slot busy: a job that ends wakes it
            return self._end - now
        return min(self._end, self._due[0][0] if self._due else self._end) - now

    async def _one(self, index: int, tries: int) -> None:
        job, now = self._jobs[index], trio.current_time()
        try:
            later: float | None = None
            try:
                timed = attrs.evolve(job, deadline_s=None,
                                     deadline_at=min(self._end, now + MAX_TRY_S))  # fmt: skip
                self._ended(BatchResult(index, job, reply=await self._serve(timed)))
            except JobFailed as exc:
                later = try_again_in(exc)
                if later is None:
                    self._ended(BatchResult(index, job, error=exc))
            if later is not None:
                await self._later(index, tries, later)
        except Exception as exc:  # a fault of ours: this job's end, not the batch's
            log.exception("batch job %d: %s", index, type(exc).__name__)
            failed = JobFailed(f"the job could not be run ({type(exc).__name__})")
            self._ended(BatchResult(index, job, error=failed))
        finally:
            self._slots.release_on_behalf_of(index)
            self._progress = attrs.evolve(self._progress, running=self._progress.running - 1)
            self._wake.set()

    async def _later(self, index: int, tries: int, later: float) -> None:
        """A job told "not now": tried again at its Retry-After (a reset) within the window, the
        jobs of its kind with it; else paid on the budget, if it may; else it expires."""
        when = trio.current_time() + put_back_for(later)
        if when < self._end or not self._budget:  # (without a budget, the others expire too)
            self._held[self._kinds[index]] = when
        if when < self._end:
            heapq.heappush(self._due, (when, index, tries + 1))
            return
        paid = await self._pay(index)
        if paid is not None:
            self._ended(paid)
        else:
            heapq.heappush(self._due, (self._end, index, tries + 1))

    async def _pay(self, index: int) -> BatchResult | None:
        """One paid try of job `index` on what is left of the budget (one job at a time, within
        the caller's own cap), or None: the caller said free only, nothing is left, too little of
        the window, the batch was cancelled, or the try was told "not now" too."""
        job, own = self._jobs[index], self._own[index]
        if own.free_only:
            return None
        async with self._paying:
            now = trio.current_time()
            room = self._budget - self._progress.paid_usd
            if own.paid_cap_usd is not None:
                room = min(room, own.paid_cap_usd)
            if not room > 0 or self._cancelled or self._end - now < MIN_PAID_S:
                return None
            paying = attrs.evolve(job, free_only=False, paid_cap_usd=room, deadline_s=None,
                                  deadline_at=min(self._end, now + MAX_TRY_S))  # fmt: skip
            cost, result = room, None  # an exit whose end we did not see counts all it held
            try:
                with trio.CancelScope() as self._cut:
                    try:
                        reply = await self._serve(paying)
                        cost, result = reply.cost_usd, BatchResult(index, job, reply=reply)
                    except JobFailed as exc:
                        cost = sum(a.cost_usd for a in exc.attempts)
                        if try_again_in(exc) is None:
                            result = BatchResult(index, job, error=exc)
            finally:
                self._cut = None
                paid = self._progress.paid_usd + cost
                self._progress = attrs.evolve(self._progress, paid_usd=paid)
                if cost > room + 1e-12:
                    log.warning("a library batch's paid try cost $%.6f, over the $%.6f it held; "
                                "nothing is left to pay", cost, room)  # fmt: skip
            return result

    def _ended(self, result: BatchResult) -> None:
        ok = result.reply is not None
        p = self._progress
        self._progress = attrs.evolve(p, completed=p.completed + ok, failed=p.failed + (not ok))
        self._backlog.left(self._source, self._progress.remaining)
        self._send.send_nowait(result)

    def _end_the_rest(self, error: type[JobFailed]) -> None:
        why = "the batch was cancelled" if error is BatchCancelled else "the batch's window ended"
        for _, index, _ in sorted(self._due, key=lambda d: d[1]):
            self._ended(BatchResult(index, self._jobs[index], error=error(why)))
        self._due.clear()


def _dollars(value: object) -> float:
    """A budget in dollars from 0 to `MAX_USD` (a number, not a bool), or ValueError."""
    try:
        found = math.nan if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        found = math.nan
    if not (math.isfinite(found) and 0.0 <= found <= MAX_USD):
        raise ValueError(f"max_paid_usd must be a number of dollars from 0 to {MAX_USD:g}")
    return found


def _kind(job: Job) -> Hashable:
    """Jobs of one kind have the same candidates — but for the context sizes their lengths
    need — so one told "not now" holds back the others until its reset."""
    n = needs_of(job)
    return (job.model, n.tools, n.images, n.json_mode, n.embedding, job.privacy, job.client,
            job.cohort, job.request_class)  # fmt: skip
