"""lanes — a free-tier-first LLM routing sidecar and library.

```python
import lanes, trio

async def main():
    async with lanes.open_dispatcher("config/lanes.toml") as dispatcher:
        reply = await dispatcher.complete(lanes.Job(messages=[{"role": "user", "content": "hi"}]))
        print(reply.lane, reply.route, reply.text)

trio.run(main)
```

A lane module (one provider, one file) imports only from here: `Provider`, `Model`, the free-tier
kinds, and — for quirks — `OpenAICompatibleLane` (its hook `adapt_request` takes a body and a `Job`;
its settings are a `LaneSpec`; its constructor takes a `Secret` and the shared `Upstream`). See
docs/lane-authors.md.
"""

from lanes._core.audit.statistics import Statistics
from lanes._core.batch.library import BatchCancelled, BatchExpired, BatchResult, LibraryBatch
from lanes._core.config.schema import Config, load_config, read_config
from lanes._core.config.schema import ModelConfig as Model
from lanes._core.dispatcher import Dispatcher
from lanes._core.engine.stream import ReplyStream
from lanes._core.freetier.kinds import (
    AlwaysFreeLocal,
    CreditBased,
    CustomEndpoint,
    FreeModelsOnly,
    NoFreeTier,
    RateLimitedFree,
    Subscription,
)
from lanes._core.model.candidates import Attempt, Candidate, Reply, Skip
from lanes._core.model.errors import (
    ConfigError,
    DeadlineExceeded,
    FallbackDenied,
    FallbackNeedsApproval,
    FreeTierExhausted,
    GovernorExhausted,
    JobFailed,
    LanesError,
    ModelNotFound,
    NoLaneAvailable,
    PaidBudgetExhausted,
    RetryLater,
    StreamInterrupted,
    UnknownModel,
    Unservable,
    UpstreamRejected,
)
from lanes._core.model.job import Job
from lanes._core.open import complete_sync, open_dispatcher
from lanes._core.upstream.client import Upstream
from lanes._core.upstream.lane import OpenAICompatibleLane, Secret
from lanes._core.upstream.spec import LaneSpec, Provider
from lanes._whatif import WhatIf, whatif

__all__ = [
    "AlwaysFreeLocal",
    "Attempt",
    "BatchCancelled",
    "BatchExpired",
    "BatchResult",
    "Candidate",
    "Config",
    "ConfigError",
    "CreditBased",
    "CustomEndpoint",
    "DeadlineExceeded",
    "Dispatcher",
    "FallbackDenied",
    "FallbackNeedsApproval",
    "FreeModelsOnly",
    "FreeTierExhausted",
    "GovernorExhausted",
    "Job",
    "JobFailed",
    "LaneSpec",
    "LanesError",
    "LibraryBatch",
    "Model",
    "ModelNotFound",
    "NoFreeTier",
    "NoLaneAvailable",
    "OpenAICompatibleLane",
    "PaidBudgetExhausted",
    "Provider",
    "RateLimitedFree",
    "Reply",
    "ReplyStream",
    "RetryLater",
    "Secret",
    "Skip",
    "Statistics",
    "StreamInterrupted",
    "Subscription",
    "UnknownModel",
    "Unservable",
    "Upstream",
    "UpstreamRejected",
    "WhatIf",
    "complete_sync",
    "load_config",
    "open_dispatcher",
    "read_config",
    "whatif",
]
