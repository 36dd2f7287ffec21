"""The hostile review of issue 45's speed changes (review45): each test failed before its fix."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path

import pytest
import trio

import lanes
from helpers import config, free_lane, paid_lane
from lanes.testing import answer, open_fake

MESSAGES = [{"role": "user", "content": "Say the pangram."}]


async def _at_once(d: lanes.Dispatcher, model: str, n: int) -> None:
    """`n` whole-answer jobs to `model` at once (those no lane takes end quietly)."""

    async def one() -> None:
        with contextlib.suppress(lanes.NoLaneAvailable):
            await d.complete(lanes.Job(messages=MESSAGES, model=model, deadline_s=30))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)


@pytest.mark.free_lane
async def test_jobs_beside_a_cold_probe_keep_to_the_known_quota(env, autojump_clock):
    """Jobs that go beside a cold model's probe at its quiet time are still held to the lane's
    known request quota (rpm = 3): at most 3 requests reach it in the minute, not one per job."""
    async with open_fake("wall", models=("slow",)) as wall, open_fake("c") as c:
        wall.script("slow", answer(delay_s=5.0))
        lane = free_lane("wall", wall.base_url, models=["slow"], attempt_timeout_s=20)
        lane["free_tier"] = {"kind": "rate_limited", "rpm": 3}
        async with lanes.open_dispatcher(config(lane, paid_lane("c", c.base_url)), env=env) as d:
            await _at_once(d, "wall/slow", 8)
    sent = sorted(r.at for r in wall.requests())
    assert len(sent) == 3 and sent[0] < 0.1 and all(0.5 <= at < 2.0 for at in sent[1:]), sent


@pytest.mark.free_lane
async def test_the_quiet_time_starts_when_the_probe_has_left(env, autojump_clock):
    """The quiet time counts from when the probe's body has been written, not from when it was
    let go: an upstream that takes 3 s to read an 8 MB probe (a slow link, a slow handshake) and
    then refuses it at once with a 429 is knocked on once — the jobs waiting see the refusal
    (before, they went at the quiet time, 0.75 s then, while the probe was still being sent)."""
    connections: list[float] = []

    async def refusing(stream: trio.SocketStream) -> None:
        data = await stream.receive_some(1024)
        if not data:  # lanes' look at whether the provider is reachable: no request
            return
        connections.append(trio.current_time())
        await trio.sleep(3.0)  # reads no more meanwhile: the client's writes fill the buffers
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += await stream.receive_some(1 << 20)
        refusal = b'{"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}'
        await stream.send_all(
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
            b"retry-after: 60\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (len(refusal), refusal)
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery, open_fake("c") as c:
        [listener] = await nursery.start(partial(trio.serve_tcp, refusing, 0, host="127.0.0.1"))
        url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}/v1"
        lane = free_lane("wall", url, models=["m"])
        async with lanes.open_dispatcher(config(lane, paid_lane("c", c.base_url)), env=env) as d:
            big = [{"role": "user", "content": "x" * _unbuffered()}]

            async def one(messages: list[dict[str, str]]) -> None:
                with contextlib.suppress(lanes.NoLaneAvailable):
                    await d.complete(lanes.Job(messages=messages, model="wall/m", deadline_s=30))

            async with trio.open_nursery() as jobs:
                jobs.start_soon(one, big)
                await trio.sleep(0.01)  # the big one probes
                for _ in range(7):
                    jobs.start_soon(one, MESSAGES)
        nursery.cancel_scope.cancel()
    assert len(connections) == 1, connections


def _unbuffered() -> int:
    """More bytes than this host's socket buffers hold between a writer and a reader that reads
    nothing (the sender's buffer at its most, the receiver's as it starts: a receiver that reads
    nothing is never given more), twice over: the body's last bytes wait for the reader."""
    held = 0
    for name, which in (("tcp_wmem", 2), ("tcp_rmem", 1)):  # the sender's most; the receiver's
        with contextlib.suppress(OSError, ValueError, IndexError):  # own, as it reads nothing
            held += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[which])
    return max(8 << 20, 2 * held + (1 << 20))
