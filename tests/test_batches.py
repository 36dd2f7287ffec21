"""Work that can wait: OpenAI's Files and Batch APIs on a running sidecar over fake providers,
driven by the OpenAI SDK unmodified (`files.create`, `batches.create/retrieve/list/cancel`,
`files.content`), and the runner over the durable queue (the queue's own contract, on SQLite and
Redis, is tests/test_batch_queue.py)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio
import trio.testing

import lanes
from lanes._core.batch.queue import Caps
from lanes._core.batch.runner import Batches
from lanes._core.batch.sqlite_queue import SQLiteBatchQueue
from lanes.testing import ANSWER, answer, rate_limited, raw, status
from sidecar import open_sidecar

CAPS = Caps(max_bytes=1_000_000, max_lines=100, max_line_bytes=10_000)
KEYS = {"A_KEY": "client-a-key-0123456789abcdef", "B_KEY": "client-b-key-0123456789abcdef"}
SERVER = {"clients": {"a": "A_KEY", "b": "B_KEY"}}


def line(custom_id: str, model: str = "free-model", url: str = "/v1/chat/completions") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": f"classify {custom_id}"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def two_clients() -> Any:
    """A sidecar with a free and a paid lane, and two clients (a and b) of their own keys."""
    return open_sidecar(
        ("free", "free", ["free-model"]), ("paid", "paid", ["paid-model"]), server=SERVER, env=KEYS
    )


def sdk(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)


async def finished(client: openai.AsyncOpenAI, batch_id: str) -> Any:
    """The batch once it ended (polled as a user would)."""
    with trio.fail_after(30):
        while True:
            batch = await client.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                return batch
            await trio.sleep(0.05)


@pytest.mark.free_lane
async def test_the_openai_sdk_round_trip_runs_free_and_stays_the_clients_own():
    """Upload, create, poll, read the output: one line per item in OpenAI's format, every item
    served by the free lane, none by the paid one (a batch never pays); another client sees
    neither the file nor the batch."""
    async with two_clients() as (url, fakes):
        a, b = sdk(url, KEYS["A_KEY"]), sdk(url, KEYS["B_KEY"])
        upload = io.BytesIO(jsonl(line("r1"), line("r2"), line("r3", model="paid-model")))
        file = await a.files.create(file=("in.jsonl", upload), purpose="batch")
        assert file.purpose == "batch" and file.bytes > 0
        batch = await a.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert (batch.model_extra or {}).get("lanes") == {"durable": False}  # state in memory
        assert batch.status == "in_progress" and batch.request_counts is not None
        assert batch.request_counts.total == 3
        done = await finished(a, batch.id)
        assert done.status == "completed"
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
        out = [
            json.loads(x)
            for x in (await a.files.content(done.output_file_id)).text.split("\n")
            if x
        ]
        assert sorted(x["custom_id"] for x in out) == ["r1", "r2"]
        assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in out)
        assert {x["response"]["body"]["choices"][0]["message"]["content"] for x in out} == {ANSWER}
        errors = (await a.files.content(done.error_file_id)).text.splitlines()
        refused = json.loads(errors[0])
        assert refused["custom_id"] == "r3" and refused["response"]["status_code"] >= 400
        assert fakes["paid"].requests() == [] and len(fakes["free"].requests()) == 2
        listed = await a.batches.list()
        assert [x.id for x in listed.data] == [batch.id]
        assert (await b.batches.list()).data == []
        with pytest.raises(openai.NotFoundError):
            await b.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await b.files.content(done.output_file_id)
        assert (await a.files.delete(file.id)).deleted
        with pytest.raises(openai.NotFoundError):
            await a.files.retrieve(file.id)
        # /metrics counts the queue's batches and items (as its runner last counted them)
        base = url.removesuffix("/v1")
        want = ('lanes_batches{status="completed"} 1.0', 'lanes_batch_items{state="completed"} 2.0',
                'lanes_batch_items{state="failed"} 1.0', "lanes_waiting_jobs 0.0")  # fmt: skip
        async with httpx2.AsyncClient() as http:
            with trio.fail_after(10):  # polled: the runner counts after each round
                text = (await http.get(f"{base}/metrics")).text
                while any(w not in text for w in want):
                    await trio.sleep(0.05)
                    text = (await http.get(f"{base}/metrics")).text
        assert 'lanes_batch_items{state="pending"} 0.0' in text


@pytest.mark.free_lane
async def test_a_cooling_free_quota_is_waited_for_not_paid():
    """The free model answers 429 with Retry-After 1: the item goes back until then and is served
    free after the reset; the paid lane is never asked, with consent set to allow."""
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "allow"},
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=1), answer())
        client = sdk(url, "unused")
        file = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(line("x")))),
                                         purpose="batch")  # fmt: skip
        batch = await client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]  # lanes' own window; the SDK types only 24h
        )
        start = trio.current_time()
        done = await finished(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 1
        assert trio.current_time() - start >= 0.9  # waited for the reset
        assert fakes["paid"].requests() == [] and len(fakes["free"].requests()) == 2


async def test_a_file_with_bad_lines_fails_the_batch_at_once_and_nothing_runs():
    """Every bad line is listed (1-based, with a code), a duplicate custom_id included; nothing is
    sent upstream."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, fakes):
        client = sdk(url, "unused")
        bad = jsonl(line("a"), "{not json", line("a"), line("b", url="/v1/embeddings"),
                    json.dumps({"custom_id": "c", "url": "/v1/chat/completions"}))  # fmt: skip
        file = await client.files.create(file=("in.jsonl", io.BytesIO(bad)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.status == "failed" and batch.errors is not None
        found = [(e.line, e.code) for e in batch.errors.data or []]
        assert found == [(2, "invalid_json_line"), (3, "duplicate_custom_id"),
                         (4, "mismatched_url"), (5, "missing_required_parameter")]  # fmt: skip
        await trio.sleep(0.2)
        assert fakes["free"].requests() == []
        with pytest.raises(openai.BadRequestError) as window:
            await client.batches.create(
                input_file_id=file.id,
                endpoint="/v1/chat/completions",
                completion_window="8d",  # type: ignore[arg-type]  # refused: over 7d
            )
        assert "completion_window" in str(window.value)


async def test_an_upload_from_a_page_of_another_site_is_refused():
    """A cross-site form may post multipart: without a key header, or with another origin, it
    is refused; nothing is kept."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, _):
        files = {"file": ("in.jsonl", jsonl(line("a")))}
        async with httpx2.AsyncClient() as http:
            bare = await http.post(f"{url}/files", data={"purpose": "batch"}, files=files)
            forged = await http.post(
                f"{url}/files", data={"purpose": "batch"}, files=files,
                headers={"authorization": "Bearer x", "origin": "https://evil.example"},
            )  # fmt: skip
            listed = await http.get(f"{url}/files")
    assert bare.status_code == 401 and forged.status_code == 403
    assert listed.json()["data"] == []


def _queue(tmp_path: Path) -> SQLiteBatchQueue:
    return SQLiteBatchQueue(tmp_path / "q", CAPS)


def _batch(
    queue: SQLiteBatchQueue, lines: bytes, window: str = "1h", now: int = 1000, budget: str = ""
) -> dict[str, Any]:
    upload = queue.upload_path()
    upload.write_bytes(lines)
    file = queue.add_file("c", "batch", "in.jsonl", upload, now)
    ask = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
           "completion_window": window,
           "metadata": {"lanes_max_paid_usd": budget} if budget else None}  # fmt: skip
    return queue.create("c", ask, now)


def params(text: str, model: str = "free-model") -> Any:  # the SDK's TypedDict, built plainly
    return {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


@pytest.mark.free_lane
async def test_the_anthropic_sdk_message_batches_round_trip():
    """`messages.batches.create/retrieve/list/results/cancel/delete`, unmodified, on the same
    queue: results are Anthropic's lines (`succeeded` with the Messages answer, `errored` for a
    request naming only a paid model — a batch never pays); another client sees none of it."""
    import anthropic

    async with two_clients() as (url, fakes):
        a = anthropic.AsyncAnthropic(base_url=url[:-3], api_key=KEYS["A_KEY"], max_retries=0)
        b = anthropic.AsyncAnthropic(base_url=url[:-3], api_key=KEYS["B_KEY"], max_retries=0)
        made = await a.messages.batches.create(requests=[
            {"custom_id": "one", "params": params("hello")},
            {"custom_id": "two", "params": params("again")},
            {"custom_id": "paid", "params": params("money", model="paid-model")},
        ])  # fmt: skip
        assert made.id.startswith("msgbatch_") and made.processing_status == "in_progress"
        assert made.request_counts.processing + made.request_counts.succeeded == 3
        with trio.fail_after(30):
            while True:  # polled as a user would
                done = await a.messages.batches.retrieve(made.id)
                if done.processing_status == "ended":
                    break
                await trio.sleep(0.05)
        assert (done.request_counts.succeeded, done.request_counts.errored) == (2, 1)
        assert done.results_url and done.ended_at is not None
        found = {r.custom_id: r.result async for r in await a.messages.batches.results(made.id)}
        assert {k: v.type for k, v in found.items()} == {
            "one": "succeeded", "two": "succeeded", "paid": "errored"}  # fmt: skip
        one = found["one"]
        assert one.type == "succeeded" and one.message.content[0].type == "text"
        assert fakes["paid"].requests() == []
        assert [x.id async for x in a.messages.batches.list()] == [made.id]
        assert [x.id async for x in b.messages.batches.list()] == []
        with pytest.raises(anthropic.NotFoundError):
            await b.messages.batches.retrieve(made.id)
        assert (await a.messages.batches.delete(made.id)).type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            await a.messages.batches.retrieve(made.id)
        with pytest.raises(anthropic.BadRequestError):  # a custom_id Anthropic would refuse
            await a.messages.batches.create(
                requests=[{"custom_id": "no spaces", "params": params("x")}]
            )


async def test_serve_state_keeps_the_simulation_and_its_batches_in_a_file(tmp_path, nursery):
    """`lanes serve --simulate --state PATH`: the state and the batch queue beside it are files,
    so a batch survives a restart (a batch object says nothing of being in memory)."""
    from lanes._http.server import serve

    state = tmp_path / "sim.db"
    url = await nursery.start(
        lambda task_status: serve(
            None, simulate=True, port=0, state=str(state), env={}, task_status=task_status
        )  # fmt: skip
    )
    client = sdk(f"{url}/v1", "unused")
    file = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(line("a", model="auto")))),
                                     purpose="batch")  # fmt: skip
    batch = await client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert state.exists() and (tmp_path / "sim.db.batches" / "queue.db").exists()
    assert "lanes" not in (batch.model_extra or {})  # durable: no "durable": false
    nursery.cancel_scope.cancel()


def test_a_batch_past_its_retention_is_deleted_with_its_bodies(tmp_path):
    """`batch.retention_days` after it ended, a batch goes with its items, its output file and
    its input file (the one place request bodies are kept); a batch still in its retention, or
    still running, stays."""
    queue = _queue(tmp_path)
    assert queue.lead("me", 1000.0, 1e9)
    old = _batch(queue, jsonl(line("x")), now=1000)
    queue.finish(queue.take(1000.0, 1)[0], ok=True, line=b'{"custom_id": "x"}\n')
    queue.settle(1001.0)
    running = _batch(queue, jsonl(line("y")), now=2000)
    assert queue.purge(ended_before=1001.0) == 0  # ended at 1001: not before
    assert queue.purge(ended_before=5000.0) == 1
    assert queue.batch("c", old["id"]) is None and queue.batch("c", running["id"]) is not None
    kept = sorted(p.name for p in (tmp_path / "q" / "files").iterdir())
    assert kept == [f"{running['input_file_id']}.jsonl"]


def test_a_deleted_input_file_goes_when_its_batch_ends_and_lines_are_read_bounded(tmp_path):
    """A file deleted while its batch runs is removed from disk when the batch ends (review of
    issue 40: it stayed for ever); a line far over the per-line cap is read past in chunks, never
    held whole, and refused by its line number."""
    queue = _queue(tmp_path)
    assert queue.lead("me", 1000.0, 1e9)
    made = _batch(queue, jsonl(line("x"), line("y")))
    assert queue.delete_file("c", made["input_file_id"])
    path = tmp_path / "q" / "files" / f"{made['input_file_id']}.jsonl"
    assert path.exists()  # still read by the running batch
    queue.cancel("c", made["id"], 1001)
    assert not path.exists()
    huge = b'{"custom_id": "big", "pad": "' + b"x" * (CAPS.max_line_bytes * 3) + b'"}\n'
    failed = _batch(queue, jsonl(line("a")) + huge + jsonl(line("b")))
    assert failed["status"] == "failed"
    assert [(e["line"], e["code"]) for e in failed["errors"]["data"]] == [(2, "request_too_large")]


def test_an_item_is_tried_again_unless_it_can_never_be_served_free():
    """Review of issue 40: a breaker open or a lane unreachable for a few seconds failed a
    24-hour batch's items for good. Now only an item that can never be served free (every
    candidate paid, or none able) takes its error as its answer; any other "not now" is put back."""
    from lanes._core.model.candidates import Skip
    from lanes._core.model.errors import NoLaneAvailable, Unservable
    from lanes._core.model.statuses import NEVER_PAYS, try_again_in

    paid_only = NoLaneAvailable("x", skips=[Skip(lane="paid", model="m", reason=NEVER_PAYS)])
    breaker = NoLaneAvailable("x", skips=[Skip(lane="free", model="m", reason="breaker open")])
    both = [Skip(lane="paid", model="m", reason=NEVER_PAYS), *breaker.skips]
    mixed = NoLaneAvailable("x", skips=both)
    unservable = Unservable("x", code="no_capable_model")
    assert try_again_in(paid_only) is None and try_again_in(unservable) is None
    assert try_again_in(breaker) == 1.0 and try_again_in(mixed) == 1.0
    assert try_again_in(lanes.FreeTierExhausted("x", retry_after_s=42.0)) == 42.0
    assert try_again_in(lanes.DeadlineExceeded("x")) is None  # 504: the item's answer


async def test_malformed_uploads_odd_metadata_and_container_bombs_are_refused_in_json():
    """Review of issue 40: a broken multipart body was answered in Starlette's plain text;
    metadata of any type was taken (and nested values turned into text); a Message Batch of
    `[{},{},…]` held 60 times its size while it was parsed on the event loop. Each is a 4xx in
    the API's JSON shape now, nothing kept."""
    async with open_sidecar(("free", "free", ["free-model"])) as (url, _):
        auth = {"authorization": "Bearer x"}
        async with httpx2.AsyncClient(headers=auth) as http:
            broken = await http.post(f"{url}/files", content=b"--x\r\nnope",
                                     headers={"content-type": "multipart/form-data"})  # fmt: skip
            made = await http.post(f"{url}/files", data={"purpose": "batch"},
                                   files={"file": ("in.jsonl", jsonl(line("a")))})  # fmt: skip
            ask = {"input_file_id": made.json()["id"], "endpoint": "/v1/chat/completions",
                   "completion_window": "24h", "metadata": {"a": {"b": [1]}}}  # fmt: skip
            odd = await http.post(f"{url}/batches", json=ask)
            plain = {k: v for k, v in ask.items() if k != "metadata"}
            unnamed = await http.post(f"{url}/batches", json={**plain, "input_file_id": None})
            bomb = b'{"requests": [{"custom_id": "a", "params": {"x": [' + b"{}," * 300_000
            bomb += b"{}]}}]}"
            messages = await http.post(f"{url}/messages/batches", content=bomb,
                                       headers={"content-type": "application/json"})  # fmt: skip
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "file"
    assert odd.status_code == 400 and odd.json()["error"]["param"] == "metadata"
    assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "input_file_id"
    assert messages.status_code == 413 and messages.json()["type"] == "error"


@pytest.mark.free_lane
async def test_a_batch_leaves_the_headroom_of_a_quota_to_interactive_work():
    """rpd = 10 and `batch.headroom` 0.2: the batch's items use 8 of the day's requests and wait
    for the next day with 2 items left; an interactive request is still served free."""
    async with open_sidecar(
        ("free", "free", ["free-model"], {"free_tier": {"kind": "rate_limited", "rpd": 10}}),
        batch={"concurrency": 1, "headroom": 0.2},
    ) as (url, fakes):
        client = sdk(url, "unused")
        lines = jsonl(*(line(f"r{i}") for i in range(10)))
        file = await client.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        def completed(batch: Any) -> int:
            assert batch.request_counts is not None
            return int(batch.request_counts.completed)

        with trio.fail_after(30):  # polled as a user would
            now = await client.batches.retrieve(batch.id)
            while completed(now) < 8:
                await trio.sleep(0.05)
                now = await client.batches.retrieve(batch.id)
        assert now.status == "in_progress" and completed(now) == 8
        assert len(fakes["free"].requests()) == 8  # the 9th item was not sent
        # the forecast: its 2 items left wait for the next UTC day (rpd resets at midnight)
        base = url.removesuffix("/v1")
        async with httpx2.AsyncClient() as http:
            with trio.fail_after(10):  # polled: until both items left have been tried and put back
                forecast = (await http.get(f"{base}/v1/forecast")).json()
                while forecast["batches"][0]["next_try_at"] is None:
                    await trio.sleep(0.05)
                    forecast = (await http.get(f"{base}/v1/forecast")).json()
        (outlook,) = forecast["batches"]
        assert (outlook["id"], outlook["left"], outlook["completed"]) == (batch.id, 2, 8)
        midnight = -(-forecast["at"] // 86400) * 86400
        assert outlook["next_try_at"] == pytest.approx(midnight, abs=2.0)
        assert outlook["outlook"] in ("finishes", "expires") and "wait until" in outlook["note"]
        reply = await client.chat.completions.create(
            model="free-model", messages=[{"role": "user", "content": "urgent"}]
        )
        assert reply.choices[0].message.content == ANSWER
        assert len(fakes["free"].requests()) == 9


async def test_no_item_starts_while_interactive_work_waits_for_a_free_quota(tmp_path):
    """While an interactive job waits in the waiting room, a round of the runner starts no item
    and looks again within a second; once it has gone, the next round runs them. (Rounds are
    driven one by one: the queue's calls run in threads, which a virtual clock outruns.)"""
    from lanes._core.batch.runner import YIELD_S, BatchRunner, ItemAnswer
    from lanes._core.engine.backlog import Backlog
    from lanes._core.runtime.tasks import Background

    queue = _queue(tmp_path)
    _batch(queue, jsonl(line("x"), line("y")), now=1000)
    waiting, served, backlog = [1], [], Backlog(0.2)

    async def serve(endpoint: str, body: bytes, client: str, deadline_s: float,
                    paid_cap: float | None = None) -> ItemAnswer:  # fmt: skip
        served.append(json.loads(body)["messages"][0]["content"])
        return ItemAnswer(200, json.dumps({"choices": []}).encode(), "r")

    runner = BatchRunner(
        queue,
        serve,
        now_wall=lambda: 1001.0,
        health=Background().task("batches"),
        interactive_waiting=lambda: waiting[0],
        backlog=backlog,
    )
    async with trio.open_nursery() as nursery:
        assert await runner._round(nursery) == YIELD_S
        await trio.testing.wait_all_tasks_blocked()
        assert served == [] and backlog.items == 2  # interactive jobs are told what is left
        waiting[0] = 0
        await runner._round(nursery)
    assert sorted(served) == ["classify x", "classify y"]
    queue.close()


@pytest.mark.free_lane
async def test_a_batch_budget_pays_only_what_free_capacity_can_not_serve_in_its_window():
    """The free model answers 429 until after the 1-hour window; consent is `allow`. A batch with
    `metadata.lanes_max_paid_usd` has its items served paid — one at a time, their worst case held
    from the budget and settled to the ledger's cost, the sum never over it; a batch without a
    budget sends nothing paid; a budget that is not a number is refused, naming the key."""
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0},
    ) as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=7200))
        client = sdk(url, "unused")
        capped = [  # a small output cap: a worst case of cents, not dollars
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "auto", "max_tokens": 50,
                                 "messages": [{"role": "user", "content": f"item {i}"}]}})
            for i in range(3)
        ]  # fmt: skip
        file = await client.files.create(
            file=("in.jsonl", io.BytesIO(jsonl(*capped))), purpose="batch"
        )

        async def create(metadata: dict[str, str] | None) -> Any:
            return await client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions",
                completion_window="1h",  # type: ignore[arg-type]
                metadata=metadata,
            )  # fmt: skip

        with pytest.raises(openai.BadRequestError) as bad:
            await create({"lanes_max_paid_usd": "lots"})
        assert "metadata.lanes_max_paid_usd" in str(bad.value)
        free_only = await create(None)
        paying = await create({"lanes_max_paid_usd": "0.01"})
        done = await finished(client, paying.id)
        assert done.status == "completed" and done.request_counts.completed == 3
        lanes_part = (done.model_extra or {})["lanes"]
        paid = fakes["paid"].requests()
        assert len(paid) == 3 and lanes_part["paid_held_usd"] == 0.0
        assert 0 < lanes_part["paid_usd"] <= lanes_part["max_paid_usd"] == 0.01
        plain = await client.batches.retrieve(free_only.id)
        assert plain.status == "in_progress" and plain.request_counts is not None
        assert plain.request_counts.completed == 0
        assert "paid_usd" not in ((plain.model_extra or {}).get("lanes") or {})


async def test_a_round_with_every_slot_busy_waits_for_one_to_free(tmp_path):
    """Review of issue 40: with every slot busy and items due, a round returned a pause of 0 and
    the runner spun (~1,700 rounds a second, each a write renewing the lease). Now it waits to
    be woken by an item that ends."""
    from lanes._core.batch.runner import LEASE_S, BatchRunner, ItemAnswer
    from lanes._core.runtime.tasks import Background

    queue = _queue(tmp_path)
    _batch(queue, jsonl(line("x"), line("y"), line("z")), now=1000)
    release = trio.Event()

    async def serve(endpoint: str, body: bytes, client: str, deadline_s: float,
                    paid_cap: float | None = None) -> ItemAnswer:  # fmt: skip
        await release.wait()
        return ItemAnswer(200, json.dumps({"choices": []}).encode(), "r")

    runner = BatchRunner(
        queue, serve, now_wall=lambda: 1001.0, health=Background().task("b"), concurrency=1
    )
    async with trio.open_nursery() as nursery:
        assert await runner._round(nursery) == LEASE_S / 3  # one taken, two due, no slot
        assert await runner._round(nursery) == LEASE_S / 3
        release.set()
    queue.close()


@pytest.mark.free_lane
async def test_a_batch_budget_caps_the_whole_item_and_a_cancel_stops_paying():
    """Review of issue 40: a budget checked per attempt let an item's second paid attempt (a
    retry after a 500, `paid_attempts = 2`) bill past it; and a batch cancelled while an item's
    free try ran still paid. Now an item's attempts together stay within what is left, and a
    batch no longer running pays nothing (below, on the queue)."""
    async with open_sidecar(
        ("free", "free", ["free-model"]),
        ("paid", "paid", ["paid-model"]),
        ("paid2", "paid", ["paid-model-2"]),
        policy={"free_tier_fallback": "allow", "paid_ceiling_usd_per_day": 1.0,
                "paid_attempts": 2},
    ) as (url, fakes):  # fmt: skip
        fakes["free"].script("free-model", rate_limited(retry_after=7200))
        fakes["paid"].script("paid-model", status(500))
        fakes["paid2"].script("paid-model-2", status(500))
        client = sdk(url, "unused")
        body = {"model": "auto", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
        one = json.dumps({"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions",
                          "body": body})  # fmt: skip
        file = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(one))),
                                         purpose="batch")  # fmt: skip
        batch = await client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
            metadata={"lanes_max_paid_usd": "0.0003"},  # one attempt's worst case, not two
        )  # fmt: skip
        async with httpx2.AsyncClient() as http:
            with trio.fail_after(20):  # polled: until its paid try has been settled
                view = (await client.batches.retrieve(batch.id)).model_extra or {}
                while not view["lanes"]["paid_usd"]:
                    await trio.sleep(0.05)
                    view = (await client.batches.retrieve(batch.id)).model_extra or {}
            spent = (await http.get(f"{url}/lanes")).json()["paid"]["spent_today_usd"]
        assert len(fakes["paid"].requests()) + len(fakes["paid2"].requests()) == 1
        assert spent == view["lanes"]["paid_usd"] <= 0.0003


async def test_a_clients_default_budget_is_its_batches_unless_they_name_one():
    """Client a's `batch_max_paid_usd` is the budget of a batch it creates without one of its
    own; client b has none; a batch naming its own keeps it (the free lane serves them all)."""
    server = {"clients": {"a": {"key_env": "A_KEY", "batch_max_paid_usd": 0.02}, "b": "B_KEY"}}
    async with open_sidecar(("free", "free", ["free-model"]), server=server, env=KEYS) as (url, _):
        a, b = sdk(url, KEYS["A_KEY"]), sdk(url, KEYS["B_KEY"])

        async def budget(client: openai.AsyncOpenAI, metadata: dict[str, str] | None) -> Any:
            file = await client.files.create(
                file=("in.jsonl", io.BytesIO(jsonl(line("r1")))), purpose="batch"
            )
            made = await client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions",
                completion_window="24h", metadata=metadata,
            )  # fmt: skip
            return (made.model_extra or {})["lanes"].get("max_paid_usd", 0.0)

        assert await budget(a, None) == 0.02
        assert await budget(a, {"lanes_max_paid_usd": "0.005"}) == 0.005
        assert await budget(b, None) == 0.0


async def test_an_item_told_not_now_holds_its_batch_until_the_reset(tmp_path):
    """The free quota answers "not now" for 30 s: the item waits for exactly then, and so do
    its batch's other items of its model — the next round tries none of them, the queue says
    when the next is due; a batch whose items name several models is not held."""
    from lanes._core.batch.runner import BatchRunner, ItemAnswer
    from lanes._core.runtime.tasks import Background

    queue = _queue(tmp_path)
    one = _batch(queue, jsonl(line("x"), line("y"), line("z")), now=1000)
    served: list[str] = []

    async def serve(endpoint: str, body: bytes, client: str, deadline_s: float,
                    paid_cap: float | None = None) -> ItemAnswer:  # fmt: skip
        served.append(json.loads(body)["messages"][0]["content"])
        return ItemAnswer(429, b"{}", "r", retry_after_s=30.0)

    runner = BatchRunner(queue, serve, now_wall=lambda: 1001.0,
                         health=Background().task("batches"), concurrency=1)  # fmt: skip

    async def round_done(nursery: trio.Nursery) -> None:
        """One round, and the items it started put back (they run in threads, too)."""
        await runner._round(nursery)
        with trio.fail_after(10):
            while runner._slots.borrowed_tokens:  # noqa: ASYNC110 - threads set no event
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        await round_done(nursery)
        assert served == ["classify x"]
        await round_done(nursery)
        assert served == ["classify x"] and queue.next_due(1001.0) == pytest.approx(1031.0)
        mixed = _batch(queue, jsonl(line("p"), line("q", model="other-model")), now=1000)
        for _ in range(3):
            await round_done(nursery)
    assert served[1:] == ["classify p", "classify q"]  # q tried though p was told "not now"
    assert one["id"] != mixed["id"]
    queue.close()


async def test_a_message_batch_refused_keeps_no_input_file(tmp_path):
    """Hostile review: a Message Batch refused after its requests were written (its client has
    `max_open` batches running) left its input file behind: not listed, so never deleted, and
    counted against the client's files until every upload was refused."""
    folder = tmp_path / "queue"
    sidecar = open_sidecar(("free", "free", ["free-model"]), batch={"folder": str(folder)})
    async with sidecar as (url, fakes):
        fakes["free"].script("free-model", rate_limited(retry_after=3600))  # they stay open
        async with httpx2.AsyncClient(headers={"authorization": "Bearer x"}) as http:
            made = await http.post(f"{url}/files", data={"purpose": "batch"},
                                   files={"file": ("in.jsonl", jsonl(line("a")))})  # fmt: skip
            ask = {"input_file_id": made.json()["id"], "endpoint": "/v1/chat/completions",
                   "completion_window": "24h"}  # fmt: skip
            for _ in range(CAPS.max_open):
                assert (await http.post(f"{url}/batches", json=ask)).status_code == 200
            body = {"requests": [{"custom_id": "m", "params": params("hello")}]}
            refused = [await http.post(f"{url}/messages/batches", json=body) for _ in range(3)]
    assert {r.status_code for r in refused} == {400}
    assert len(list((folder / "files").glob("*.jsonl"))) == 1  # the one uploaded


@pytest.mark.free_lane
async def test_an_answer_the_upstream_wrote_on_several_lines_is_one_line_of_the_output():
    """Hostile review: the output file carried the upstream's own bytes, so an answer it
    pretty-printed (or ended with a newline, as many servers do) broke its line into several —
    a JSONL file no reader could parse, where an upstream could write a line of its choosing."""
    completion = {"id": "c", "object": "chat.completion", "model": "free-model", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "a\nb"},
         "finish_reason": "stop"}]}  # fmt: skip
    pretty = json.dumps(completion, indent=2).encode() + b"\n"
    async with open_sidecar(("free", "free", ["free-model"])) as (url, fakes):
        fakes["free"].script("free-model", raw(200, pretty))
        client = sdk(url, "unused")
        file = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(line("x")))),
                                         purpose="batch")  # fmt: skip
        made = await client.batches.create(input_file_id=file.id,
                                           endpoint="/v1/chat/completions",
                                           completion_window="24h")  # fmt: skip
        done = await finished(client, made.id)
        assert done.output_file_id is not None
        output = (await client.files.content(done.output_file_id)).content
    [one] = output.splitlines()
    assert json.loads(one)["response"]["body"] == completion


def test_the_queues_folder_is_its_owners_alone(tmp_path):
    """Hostile review: the queue's folder, its uploaded files (request bodies) and its SQLite file
    (their answers) were made under the process's umask — readable by every user of the host."""
    queue = _queue(tmp_path)
    made = _batch(queue, jsonl(line("a")))
    folder = tmp_path / "q"
    kept = [folder, folder / "files", *folder.glob("queue.db*")]  # the uploads: in `files/`
    assert made["status"] == "in_progress" and len(kept) >= 3
    assert {oct(p.stat().st_mode & 0o077) for p in kept} == {"0o0"}
    queue.close()


async def test_a_message_batchs_parse_holds_up_no_queue_call(tmp_path):
    """Hostile review: a Message Batch's requests (inline, up to 32 MB: ~12 s and ~600 MB to
    parse) were parsed in the queue's one-at-a-time worker, so every client's batch calls and
    the runner's lease waited behind it. Parses now take turns of their own."""
    queue = SQLiteBatchQueue(tmp_path, Caps(max_bytes=10_000, max_lines=10, max_line_bytes=1000))
    batches = Batches(queue=queue, runner=None)  # type: ignore[arg-type]  # no runner called
    parsed = threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.parse, parsed.wait)  # a parse that lasts until told
        try:
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(30):  # before the change: held until the parse ends
                listed = await batches.call(queue.files, "c", 10, None)
        finally:
            parsed.set()
    queue.close()
    assert listed == []
