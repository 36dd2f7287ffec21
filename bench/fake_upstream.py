"""`python -m bench.fake_upstream PORT BEHAVIOUR`: one fake provider in its own process.

BEHAVIOUR: `fast` (answers at once), `ratelimit` (429 + Retry-After: 5 every time), `hang` (never
answers), `slow` (streams a chunk every 0.6 s, to hold many streams open), `long` (one stream of
20,000 chunks, as fast as it can), `cold-json` (answers after 5 s), `cold-sse` (streams a chunk
every 0.5 s), or `all`: each of those
for the model of the same name (so one upstream, and one peer process, serves every measure).
`GET /v1/_log` returns every request so far as `[model, arrival time]`. Prints `ready` when
listening; logs each request's arrival time to `--log` on exit.
"""

from __future__ import annotations

import argparse
import json
import signal

import trio

from lanes.testing import answer, hang, open_fake, rate_limited

LONG_WORDS = 20_000  # the `long` model streams one chunk per word

BEHAVIOURS = {
    "fast": answer,
    "ratelimit": lambda: rate_limited(retry_after=5),
    "hang": hang,
    "slow": lambda: answer(chunk_delay_s=0.6),
    "long": lambda: answer(text=" ".join(f"w{i}" for i in range(LONG_WORDS))),
    # a model that thinks 5 s before its whole answer, and one that streams for 5 s
    "cold-json": lambda: answer(delay_s=5.0),
    "cold-sse": lambda: answer(chunk_delay_s=0.5),
}


async def main(port: int, behaviour: str, log: str | None) -> None:
    async with open_fake("bench", port=port, keep_bodies=False) as fake:
        if behaviour == "all":
            for name, make in BEHAVIOURS.items():
                fake.script(name, make())
        else:
            for model in ("m", "openai/m"):
                fake.script(model, BEHAVIOURS[behaviour]())
        print("ready", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        if log:
            await trio.Path(log).write_text(json.dumps([r.at for r in fake.log]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("behaviour", choices=[*sorted(BEHAVIOURS), "all"])
    parser.add_argument("--log")
    args = parser.parse_args()
    trio.run(main, args.port, args.behaviour, args.log)
