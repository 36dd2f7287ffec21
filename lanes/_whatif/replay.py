"""One config replayed: the recorded jobs, at their recorded arrival times on a virtual clock,
through the real dispatcher built from that config, against the in-process providers of
`providers.py`. What it yields is the replay's own audit rows — the same rows a sidecar writes —
so the recorded and the replayed figures come from one summary (`figures.py`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio
import trio.testing

from lanes._core.config.schema import Config, LaneConfig, TelemetryConfig
from lanes._core.dispatcher import Dispatcher
from lanes._core.freetier.kinds import CreditBased, FreeModelsOnly, RateLimitedFree
from lanes._core.model.errors import JobFailed
from lanes._core.model.job import Job
from lanes._core.open import open_over
from lanes._core.state.records import LocalRecords
from lanes._core.state.store import SQLiteStore
from lanes._core.upstream.loader import find_provider
from lanes._core.upstream.spec import resolve
from lanes._whatif.providers import (
    Ask,
    Fault,
    Limits,
    ReplayTransport,
    SimLane,
    host_of,
    index_line,
    padding,
    prompt_for,
)
from lanes._whatif.recorded import Recorded

log = logging.getLogger("lanes.whatif")

#: The replay's state sync runs this often (virtual seconds): one process, nothing to share (the
#: audit rows are taken as each job ends), and an idle stretch of the window costs a wake-up an
#: hour.
SYNC_S = 3600.0
#: At most this many replayed jobs in flight at once: a later arrival waits for one to end (and is
#: counted as started late). Bounds the replay's memory to this many prompts.
MAX_IN_FLIGHT = 1024
#: What each replayed audit row keeps (the rest is dropped as it arrives: bounded memory).
KEPT = ("job", "at", "outcome", "route", "lane", "model", "tier", "cost_usd", "approval", "plan")
#: An approval the audit shows granted is granted again within this many virtual seconds.
APPROVE_WITHIN_S = 5.0


@attrs.frozen(kw_only=True)
class Replayed:
    """A replay's audit rows (one per job, `KEPT` columns, plus `index`: the recorded job's
    position), each candidate's tier, the replay's providers and what they refused."""

    rows: tuple[Mapping[str, Any], ...]
    tiers: Mapping[str, str]  # "lane/model" → local, free, byok, paid
    lanes: Mapping[str, SimLane]  # by lane name
    unstated: tuple[str, ...]  # free lanes whose config states no limits: never refused here
    unkeyed: Mapping[str, str] = attrs.field(factory=dict)  # lanes off for want of a key here
    refused: Mapping[str, int]  # lane → requests its provider refused over a quota
    upstream_requests: int
    wall_s: float  # how long the replay took (wall clock)
    late: int = 0  # jobs started after their arrival: MAX_IN_FLIGHT were in flight


class _Unkeyed(logging.Filter):
    """Keeps the loader's "KEY is not set — lane off" lines of a replay's lanes out of the
    command's output: the replay's notes say it once, for all of them."""

    def __init__(self, lanes: Mapping[str, str]) -> None:
        super().__init__()
        self._lanes = set(lanes)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and args[0] in self._lanes and "not set" in str(args[-1]))


class _Kept(LocalRecords):
    """The replay's audit: rows kept in memory as the sync hands them over, not written."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock) -> None:
        super().__init__(conn, lock)
        self.rows: list[dict[str, Any]] = []

    def add_audit(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend({k: row.get(k) for k in KEPT} for row in rows)


def sim_lanes(config: Config, seen: Mapping[str, set[str]]) -> dict[str, SimLane]:
    """Each enabled lane of `config` as a replay's provider: its resolved free tier's limits and
    its models' prices; `seen` adds the models the audit saw a lane serve to its catalog."""
    found = {}
    for lane_config in config.lanes:
        provider, _ = find_provider(lane_config)
        if provider is None or not lane_config.enabled:
            continue  # the dispatcher will not load it either (and says why)
        spec = resolve(provider, lane_config)
        kind = spec.free_tier
        # the limits the kind states (a kind without one has none): credits and free models count
        # account-wide, a rate-limited tier as its config says
        limits = Limits(**{f.name: getattr(kind, f.name, None) for f in attrs.fields(Limits)})
        account_wide = isinstance(kind, FreeModelsOnly | CreditBased) or (
            isinstance(kind, RateLimitedFree) and kind.account_wide
        )
        models = tuple(m.id for m in spec.models)
        found[lane_config.name] = SimLane(
            name=lane_config.name,
            kind=kind.kind,
            limits=limits,
            account_wide=account_wide,
            free_patterns=kind.patterns if isinstance(kind, FreeModelsOnly) else (),
            budget_usd=kind.budget_usd if isinstance(kind, CreditBased) else None,
            prices={
                m.id: (m.input_usd_per_mtok or 0.0, m.output_usd_per_mtok or 0.0)
                for m in spec.models
            },
            models=models + tuple(sorted(seen.get(lane_config.name, set()) - set(models))),
        )
    return found


def replay_config(
    config: Config, environ: Mapping[str, str]
) -> tuple[Config, dict[str, str], dict[str, str], dict[str, str]]:
    """`config` pointed at the replay's providers, with its state in memory (the operator's files
    are never opened), no traces and no job log lines; the environment its lanes read keys from
    (placeholders for the keys set in `environ`: nothing is sent anywhere, and a lane whose key
    is not set here is off in the replay as it would be at start); each lane's host there; and
    the lanes left off for want of a key (lane → the variable)."""
    rewritten: list[LaneConfig] = []
    env: dict[str, str] = {}
    hosts, unkeyed = {}, {}
    for n, lane_config in enumerate(config.lanes):
        host = host_of(n)
        hosts[lane_config.name] = host
        rewritten.append(attrs.evolve(lane_config, base_url=f"http://{host}/v1"))
        provider, _ = find_provider(lane_config)
        if provider is not None and lane_config.enabled and not lane_config.byok:
            key_env = resolve(provider, lane_config).api_key_env
            if key_env and environ.get(key_env, "").strip():
                env[key_env] = "whatif-placeholder-key"
            elif key_env:
                unkeyed[lane_config.name] = key_env
    replayed = attrs.evolve(
        config,
        lanes=rewritten,
        state=":memory:",
        local_state=":memory:",
        telemetry=TelemetryConfig(),
        log_jobs=False,
        audit_days=0.0,
    )
    return replayed, env, hosts, unkeyed


class _Replaying:
    """One replay under way: each recorded job run at its arrival (at most `MAX_IN_FLIGHT` at
    once, those that wait for room counted `late`), its audit row kept, progress told."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        kept: _Kept,
        total: int,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self._dispatcher, self._kept = dispatcher, kept
        self._total, self._progress = total, progress
        self._room = trio.Semaphore(MAX_IN_FLIGHT)
        self._step = max(1, total // 100)
        self._done = 0
        self.ids: dict[str, int] = {}  # job id → its index among the recorded jobs
        self.late = 0

    async def one(self, index: int, recorded: Recorded, nursery: trio.Nursery) -> None:
        arrived = trio.current_time()
        async with self._room:
            if trio.current_time() > arrived:  # it waited for room: it starts late
                self.late += 1
            await self._run(index, recorded, nursery)
        self._kept.add_audit(self._dispatcher.take_audit_rows())

    async def _run(self, index: int, recorded: Recorded, nursery: trio.Nursery) -> None:
        job = _job(index, recorded)
        self.ids[job.id] = index
        if recorded.approval in ("once", "granted"):
            nursery.start_soon(_approve, self._dispatcher, job)
        try:
            await _run(self._dispatcher, job, recorded)
        except JobFailed:
            pass  # its audit row says how it ended
        except Exception as exc:  # a job the dispatcher refused outright (a bad shape)
            log.warning("replayed job %d: %s", index, type(exc).__name__)
        self._done += 1
        done, progress = self._done, self._progress
        if progress is not None and (done % self._step == 0 or done == self._total):
            progress(done, self._total)


def replay(
    config: Config,
    jobs: Sequence[Recorded],
    *,
    since: float,
    faults: Sequence[Fault] = (),
    progress: Callable[[int, int], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Replayed:
    """Replay `jobs` (sorted by arrival) under `config`, the virtual clock starting at `since` or
    a minute before the first arrival, whichever is later (an empty stretch costs nothing, but a
    window reaching back years would be synced through). A lane whose key `environ` (default:
    this process's environment) does not set is off, as at start. Runs its own trio loop: call it
    from a thread when you are inside one."""
    if jobs:
        since = max(since, jobs[0].arrived - 60.0)
    seen: dict[str, set[str]] = {}
    for job in jobs:
        if job.lane and job.model:
            seen.setdefault(job.lane, set()).add(job.model)
    lanes = sim_lanes(config, seen)
    replayed, env, hosts, unkeyed = replay_config(
        config, os.environ if environ is None else environ
    )
    by_host = {hosts[name]: lane for name, lane in lanes.items()}
    asks = [
        Ask(
            prompt_tokens=j.prompt_tokens,
            completion_tokens=j.completion_tokens,
            latency_s=j.latency_s,
        )
        for j in jobs
    ]
    started = time.perf_counter()  # wall-clock: how long the replay itself took
    holder: dict[str, Any] = {}

    async def main() -> None:
        t0 = trio.current_time()
        transport = ReplayTransport(
            by_host, asks, lambda: since + trio.current_time() - t0, faults=faults
        )
        store = SQLiteStore(":memory:", records=_Kept)
        kept = store.records
        assert isinstance(kept, _Kept)
        async with open_over(
            replayed,
            env=env,
            epoch_now=since,
            transport=transport,
            sync_interval_s=SYNC_S,
            store=store,
        ) as dispatcher:
            run = _Replaying(dispatcher, kept, len(jobs), progress)
            async with trio.open_nursery() as nursery:
                for index, recorded in enumerate(jobs):
                    await trio.sleep_until(t0 + max(0.0, recorded.arrived - since))
                    nursery.start_soon(run.one, index, recorded, nursery)
            holder["tiers"] = {c.key: c.tier for c in dispatcher.candidates()}
        holder["rows"] = [{**row, "index": run.ids.get(str(row["job"]), -1)} for row in kept.rows]
        holder["transport"] = transport
        holder["late"] = run.late

    quiet = _Unkeyed(unkeyed)
    loader_log = logging.getLogger("lanes")  # the loader says it there
    loader_log.addFilter(quiet)
    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        loader_log.removeFilter(quiet)
    transport: ReplayTransport = holder["transport"]
    unstated = tuple(
        name
        for name, lane in lanes.items()
        if lane.kind in ("rate_limited", "free_models", "credits")
        and not lane.limits.stated
        and name not in unkeyed
    )
    return Replayed(
        rows=tuple(holder["rows"]),
        tiers=holder["tiers"],
        lanes=lanes,
        unstated=unstated,
        unkeyed=unkeyed,
        refused=dict(transport.refused),
        upstream_requests=transport.requests,
        wall_s=time.perf_counter() - started,
        late=holder["late"],
    )


def _job(index: int, recorded: Recorded) -> Job:
    params: dict[str, Any] = {}
    if recorded.max_tokens is not None and not recorded.embedding:
        params["max_tokens"] = recorded.max_tokens
    common: dict[str, Any] = {
        "model": recorded.asked,
        "client": recorded.client,
        "cohort": recorded.cohort or None,
        "request_class": recorded.request_class,
        "privacy": recorded.privacy if recorded.privacy in ("any", "zdr", "local") else "any",
        "deadline_s": recorded.deadline_s,
        "params": params,
    }
    if recorded.embedding:
        return Job(input=prompt_for(index, recorded.prompt_tokens), **common)
    messages = [
        {"role": "system", "content": index_line(index)},
        {"role": "user", "content": padding(recorded.prompt_tokens)},
    ]
    return Job(messages=messages, **common)


async def _run(dispatcher: Dispatcher, job: Job, recorded: Recorded) -> None:
    if recorded.embedding:
        await dispatcher.embed(job)
    elif recorded.streamed:
        async with dispatcher.open_stream(job) as stream:
            async for _ in stream:
                pass
    else:
        await dispatcher.complete(job)


async def _approve(dispatcher: Dispatcher, job: Job) -> None:
    """Grant `job`'s approval once, as the audit shows its recorded job's was."""
    fingerprint = job.request_fingerprint()
    with trio.move_on_after(APPROVE_WITHIN_S):
        while True:
            for asked in dispatcher.approvals.pending():
                if asked.client == job.client and asked.fingerprint == fingerprint:
                    with contextlib.suppress(KeyError):  # decided or expired meanwhile
                        await dispatcher.approvals.decide(asked.id, "once")
                    return
            await trio.sleep(0.05)
