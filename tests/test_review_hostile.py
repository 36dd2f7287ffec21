"""A hostile review of the HTTP surface after issues 27 and 28: each finding kept as the test that
showed it (a strict xfail until it is fixed, then a guard of the fix). Everything runs against
`lanes.testing` fakes on loopback, or on the pure translations."""

from __future__ import annotations

import time

from lanes._core.dialects import responses_api
from lanes._core.job import MAX_DROPPED, bounded_names

# == finding 1: naming what was dropped is quadratic in the names =================================


def _cpu_s(n: int, tries: int) -> float:
    """The CPU seconds `bounded_names` takes over `n` distinct names (the best of `tries`)."""
    best = float("inf")
    for _ in range(tries):
        names = [f"k{i}" for i in range(n)]
        started = time.process_time()
        bounded_names(names)
        best = min(best, time.process_time() - started)
    return best


def test_naming_dropped_fields_is_linear_in_their_count():
    """A body of many unknown keys (a 4 MiB body holds ~350,000) is named as dropped in time
    linear in their count: the names were deduplicated against a list, so 40,000 keys took 18 s
    of the event loop, and a full body about 20 minutes, with every other request waiting."""
    small, large = _cpu_s(2_000, tries=5), _cpu_s(20_000, tries=1)
    assert large < 35 * max(small, 1e-4), (
        small,
        large,
    )  # 10x the names: 10x linear, 100x quadratic
    named = bounded_names(f"k{i}" for i in range(2_000))
    assert len(named) == MAX_DROPPED and named[-1] == f"+{2_000 - MAX_DROPPED + 1} more"


# == finding 2: colliding namespaced tools grow their flat names one underscore at a time ==========


def test_colliding_namespaced_tools_get_short_distinct_flat_names():
    """1,000 namespace tools of one name, each with a member `x` (62 KB of body): every flat name
    stays short and distinct. Each collision added one `_` and tried again, so names grew to the
    count (1,003 characters, sent upstream) and the translation was cubic: 4,000 such tools
    (250 KB) held the event loop 20 s."""
    tools = [{"type": "namespace", "name": "n", "tools": [{"name": "x"}]} for _ in range(1_000)]
    chat = responses_api.to_chat({"input": "hi", "tools": tools})
    names = [t["function"]["name"] for t in chat.params["tools"]]
    assert len(set(names)) == len(names) == 1_000
    assert max(map(len, names)) <= len("n__x") + 6, max(map(len, names))
