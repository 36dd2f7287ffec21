"""`python -m bench.fake_upstream PORT BEHAVIOUR`: one fake provider in its own process.

BEHAVIOUR: `fast` (answers at once), `ratelimit` (429 + Retry-After: 5 every time), `hang` (never
answers), `slow` (streams a chunk every 0.6 s, to hold many streams open). Prints `ready` when listening; logs each request's arrival time to `--log` on exit.
"""

from __future__ import annotations

import argparse
import json
import signal

import trio

from drills.fakes import answer, hang, open_fake, rate_limited

BEHAVIOURS = {"fast": answer, "ratelimit": lambda: rate_limited(retry_after=5), "hang": hang,
              "slow": lambda: answer(chunk_delay_s=0.6)}


async def main(port: int, behaviour: str, log: str | None) -> None:
    async with open_fake("bench", port=port) as fake:
        for model in ("m", "openai/m"):
            fake.script(model, BEHAVIOURS[behaviour]())
        print("ready", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        if log:
            with open(log, "w") as f:
                json.dump([r.at for r in fake.log], f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("behaviour", choices=sorted(BEHAVIOURS))
    parser.add_argument("--log")
    args = parser.parse_args()
    trio.run(main, args.port, args.behaviour, args.log)
