"""Fake OpenAI-compatible providers for tests, drills, benchmarks and `lanes serve --simulate`.

Real HTTP/1.1 servers on 127.0.0.1 (trio sockets + h11), scripted per model to answer, stall, cut a
stream, refuse connections or rate-limit — so a job's own test suite can exercise `lanes` over real
sockets without a key or the network:

```python
from lanes.testing import open_fake, answer, rate_limited

async with open_fake("groq", models=("llama",)) as fake:
    fake.script("llama", rate_limited(retry_after=5), answer())
    ... fake.base_url ... fake.requests("llama") ...
```
"""

from lanes.testing.behaviours import (
    ANSWER,
    Behaviour,
    answer,
    garbage,
    hang,
    malformed_chunk,
    no_done,
    quota,
    rate_limited,
    raw,
    replay,
    reset,
    status,
    stream_cut,
    stream_stall,
)
from lanes.testing.fakes import Departed, FakeProvider, Logged, open_fake

__all__ = [
    "ANSWER",
    "Behaviour",
    "Departed",
    "FakeProvider",
    "Logged",
    "answer",
    "garbage",
    "hang",
    "malformed_chunk",
    "no_done",
    "open_fake",
    "quota",
    "rate_limited",
    "raw",
    "replay",
    "reset",
    "status",
    "stream_cut",
    "stream_stall",
]
