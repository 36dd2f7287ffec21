"""lanes — a free-tier-first LLM routing sidecar and library.

```python
import lanes, trio

async def main():
    async with lanes.open_dispatcher("config/lanes.toml") as dispatcher:
        reply = await dispatcher.complete(lanes.Job(messages=[{"role": "user", "content": "hi"}]))
        print(reply.lane, reply.route, reply.text)

trio.run(main)
```
"""

from lanes._core.config import Config, load_config, read_config
from lanes._core.dispatcher import Dispatcher
from lanes._core.open import complete_sync, open_dispatcher
from lanes._core.errors import (
    ConfigError,
    DeadlineExceeded,
    FallbackDenied,
    FallbackNeedsApproval,
    FreeTierExhausted,
    GovernorExhausted,
    JobFailed,
    LanesError,
    NoLaneAvailable,
    PaidBudgetExhausted,
    RetryLater,
    StreamInterrupted,
    UnknownModel,
    UpstreamRejected,
)
from lanes._core.job import Attempt, Candidate, Job, Reply, Skip
from lanes._core.streaming.stream import ReplyStream

__all__ = [
    "Attempt",
    "Candidate",
    "Config",
    "ConfigError",
    "DeadlineExceeded",
    "Dispatcher",
    "FallbackDenied",
    "FallbackNeedsApproval",
    "FreeTierExhausted",
    "GovernorExhausted",
    "Job",
    "JobFailed",
    "LanesError",
    "NoLaneAvailable",
    "PaidBudgetExhausted",
    "Reply",
    "ReplyStream",
    "RetryLater",
    "Skip",
    "StreamInterrupted",
    "UnknownModel",
    "UpstreamRejected",
    "complete_sync",
    "load_config",
    "open_dispatcher",
    "read_config",
]
