"""Run the canary, pin a baseline, report drift — and feed the verdicts back into routing.

Answers live in the same state file as everything else (tables `canary_answer`, `canary_baseline`);
a run whose verdict for a model is `drifted` or `failed` writes the model into `quarantine`, which
every dispatcher sharing the file skips until a run passes it, it is re-pinned, or it is released.
`report` only reads. Probes go through the dispatcher like any job, so they count against the free
quota — and they are skipped, never forced, when a model is backed off, its breaker is open or its
reported quota is low. A probe refused for capacity (429, 402, a backoff) is *skipped* too: a
rate limit says nothing about quality, so it never fails or quarantines a model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import trio

import lanes
from lanes._core.model.candidates import Candidate
from lanes._core.model.job import digest
from lanes.canary.checks import run_checks
from lanes.canary.prompts import CanaryConfig, Prompt
from lanes.canary.score import Answer, ModelReport, score_model

ANSWER_COLUMNS = {
    "run": int,
    "at": float,
    "key": str,
    "prompt": str,
    "status": str,
    "reason": str,
    "text": str,
    "sha256": str,
    "checks": str,
    "reported_model": str,
    "fingerprint": str,
    "latency_s": float,
    "tokens": int,
}


def ensure_tables(db: Any) -> None:
    db["canary_answer"].create(ANSWER_COLUMNS, pk=("run", "key", "prompt"), if_not_exists=True)
    db["canary_baseline"].create(ANSWER_COLUMNS, pk=("key", "prompt"), if_not_exists=True)


def _why_skip(dispatcher: lanes.Dispatcher, c: Candidate, min_quota_left: int) -> str | None:
    model = dispatcher.model_statistics(c.key)
    if not model.free_now:
        return model.reason
    if model.requests_remaining is not None and model.requests_remaining < min_quota_left:
        return f"quota low ({model.requests_remaining:g} left)"
    return None


CAPACITY = frozenset({"rate_limited", "credit_exhausted"})


def _capacity(exc: lanes.JobFailed) -> bool:
    """The probe was refused for capacity (a 429, a 402, a backoff or quota), not for quality."""
    if isinstance(exc, (lanes.FreeTierExhausted, lanes.GovernorExhausted)):
        return True
    return bool(exc.attempts) and all(a.outcome in CAPACITY for a in exc.attempts)


async def _probe(
    dispatcher: lanes.Dispatcher,
    c: Candidate,
    prompt: Prompt,
    deadline_s: float,
    min_quota_left: int,
) -> Answer:
    at = dispatcher.now_wall()
    if (skip := _why_skip(dispatcher, c, min_quota_left)) is not None:
        return Answer(prompt=prompt.id, status="skipped", reason=skip, at=at)
    params: dict[str, Any] = {"temperature": 0, "max_tokens": prompt.max_tokens}
    if prompt.seed is not None:
        params["seed"] = prompt.seed
    if prompt.tools:
        params["tools"] = prompt.tools
    job = lanes.Job(
        messages=prompt.messages,
        params=params,
        model=c.key,
        deadline_s=deadline_s,
        client="canary",
        request_class="canary",
        cache="off",  # the canary asks the models, never the response cache
    )
    try:
        reply = await dispatcher.complete(job)
    except lanes.JobFailed as exc:
        status: Literal["error", "skipped"] = "skipped" if _capacity(exc) else "error"
        why = f"{exc.code}: {str(exc)[:160]}"
        return Answer(prompt=prompt.id, status=status, reason=why, at=at)
    message = reply.body["choices"][0].get("message") or {}
    text = message.get("content") or ""
    return Answer(
        prompt=prompt.id,
        status="ok",
        text=text,
        checks=run_checks(prompt.checks, text, message.get("tool_calls")),
        reported_model=str(reply.body.get("model", "")),
        fingerprint=str(reply.body.get("system_fingerprint") or ""),
        at=at,
    )


#: The tiers the canary probes: borrowed free capacity, and owned local capacity — a local model
#: changes silently too (a new quantisation, another file). A paid model costs money per probe:
#: never probed.
PROBED_TIERS = ("local", "free")


def _not_probed(c: Candidate) -> str | None:
    """Why the canary never probes this model, or None."""
    if c.embedding:  # the prompts are chats; an embedding model answers none
        return "an embedding model: the canary's prompts are chats"
    if c.tier not in PROBED_TIERS:
        return f"a {c.tier} model: the canary never spends money on a probe"
    return None


def _missing(dispatcher: lanes.Dispatcher, name: str) -> str:
    """Why a lane offers the canary no model at all."""
    unavailable = dispatcher.statistics().unavailable
    if name in unavailable:
        return f"not loaded: {unavailable[name]}"
    if name in dispatcher.lanes:
        return "no models listed or configured yet (is its server running?)"
    return "no lane of that name in the config"


def select(
    dispatcher: lanes.Dispatcher, lanes_: Sequence[str] = (), models: Sequence[str] = ()
) -> tuple[list[Candidate], dict[str, str]]:
    """The models a run probes — every local and free chat model, or those of `lanes_` and
    `models` — and what was asked for but is not probed, with why (a lane, model or "lane/model"
    → why). Without `lanes_` or `models`, only lanes that did not load are said."""
    every = dispatcher.candidates()
    picked = [
        c
        for c in every
        if (not lanes_ or c.lane in lanes_) and (not models or {c.model, c.key} & set(models))
    ]
    chosen = [c for c in picked if _not_probed(c) is None]
    skipped: dict[str, str] = {}
    if lanes_ or models:
        skipped |= {c.key: why for c in picked if (why := _not_probed(c)) is not None}
    offered = {c.lane for c in every}
    for name in lanes_ or dispatcher.statistics().unavailable:
        if name not in offered:
            skipped[name] = _missing(dispatcher, name)
    for model in models:
        if not any(model in (c.model, c.key) for c in every):
            skipped[model] = "no such model in any lane"
    return chosen, skipped


async def run_canary(
    dispatcher: lanes.Dispatcher,
    config: CanaryConfig,
    *,
    lanes_: Sequence[str] = (),
    models: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Probe every selected model (`select`: local and free ones) with every prompt; store the
    answers; return the run id."""
    db = dispatcher.store.records.db
    ensure_tables(db)
    dispatcher.canary_probing(True)  # quarantined models are probed too, so they can pass again
    settings = config.settings
    candidates, _ = select(dispatcher, lanes_, models)
    run = int(dispatcher.now_wall() * 1000)
    limiter = trio.CapacityLimiter(settings.concurrency)
    total, done, rows = len(candidates) * len(config.prompts), 0, []

    async def one(c: Candidate, prompt: Prompt) -> None:
        nonlocal done
        async with limiter:
            started = trio.current_time()
            answer = await _probe(
                dispatcher, c, prompt, settings.deadline_s, settings.min_quota_left
            )
            rows.append(_row(run, c.key, answer, trio.current_time() - started))
        done += 1
        if progress:
            progress(done, total)

    async with trio.open_nursery() as nursery:
        for c in candidates:
            for prompt in config.prompts:
                nursery.start_soon(one, c, prompt)
    db["canary_answer"].insert_all(rows, replace=True)
    apply_verdicts(dispatcher.store, report(dispatcher.store, config), config)
    return run


def _row(run: int, key: str, answer: Answer, latency_s: float) -> dict[str, Any]:
    """An answer as `canary_answer` keeps it: its fields (the checks as JSON), and the run's."""
    return attrs.asdict(answer) | {
        "run": run,
        "key": key,
        "sha256": digest(answer.text)[0] if answer.text else "",
        "checks": json.dumps(dict(answer.checks)),
        "latency_s": latency_s if answer.status != "skipped" else 0.0,
        "tokens": 0,
    }


def _answer(row: dict[str, Any]) -> Answer:
    """The inverse of `_row`."""
    fields = {f.name: row[f.name] for f in attrs.fields(Answer)}
    return Answer(**fields | {"checks": json.loads(row["checks"])})


def latest_run(db: Any) -> int | None:
    ensure_tables(db)
    row = db.execute("SELECT MAX(run) FROM canary_answer").fetchone()
    return row[0] if row and row[0] is not None else None


def pin(store: Any, *, keys: Sequence[str] = ()) -> list[str]:
    """Record the latest run's answered prompts as each model's baseline; release its quarantine
    (a model named in `keys` is released even when it has no answer to pin)."""
    db = store.records.db
    for key in keys:
        store.set_quarantine(key, None)
    run = latest_run(db)
    if run is None:
        return []
    rows = [
        r
        for r in db["canary_answer"].rows_where("run = ? AND status = 'ok'", [run])
        if not keys or r["key"] in keys
    ]
    pinned = sorted({r["key"] for r in rows})
    for key in pinned:
        db["canary_baseline"].delete_where("key = ?", [key])
        store.set_quarantine(key, None)
    db["canary_baseline"].insert_all(rows, replace=True)
    return pinned


def release(store: Any, keys: Sequence[str]) -> dict[str, bool]:
    """Take `keys` out of quarantine; for each, whether it was quarantined."""
    quarantined = store.quarantined()
    for key in keys:
        store.set_quarantine(key, None)
    return {key: key in quarantined for key in keys}


def apply_verdicts(store: Any, reports: Sequence[ModelReport], config: CanaryConfig) -> None:
    """Quarantine the models a run found drifted or failed; release those it found ok (a skipped
    model keeps what it had)."""
    for r in reports:
        if r.verdict in ("drifted", "failed") and config.settings.quarantine:
            store.set_quarantine(r.key, r.verdict, r.reason, at=r.at)
        elif r.verdict == "ok":
            store.set_quarantine(r.key, None)


def report(store: Any, config: CanaryConfig) -> list[ModelReport]:
    """Verdicts for the latest run against the baseline. Reads only."""
    db = store.records.db
    run = latest_run(db)
    if run is None:
        return []
    baseline: dict[str, dict[str, Answer]] = {}
    for row in db["canary_baseline"].rows:
        baseline.setdefault(row["key"], {})[row["prompt"]] = _answer(row)
    now: dict[str, list[Answer]] = {}
    for row in db["canary_answer"].rows_where("run = ?", [run]):
        now.setdefault(row["key"], []).append(_answer(row))
    s = config.settings
    reports = [
        score_model(
            key,
            answers,
            baseline.get(key, {}),
            similarity_ok=s.similarity_ok,
            drift_threshold=s.drift_threshold,
        )
        for key, answers in sorted(now.items())
    ]
    return [attrs.evolve(r, at=run / 1000) for r in reports]
