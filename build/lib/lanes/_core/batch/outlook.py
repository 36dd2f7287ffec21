"""Each open batch's outlook, for `GET /v1/forecast`, the page and `lanes status`: when it is
projected to end at the pace its items have ended since it started, and how many free requests
its items left need at least. Pure; linear, and it says so: a projection, not a fact.

Work that can wait runs on what interactive work leaves, so its pace follows the quotas' resets:
a batch whose items wait for a quota's reset (`next_try_at`) is projected from that moment.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Mapping
from typing import Any, Literal

from lanes._core.audit.forecast import rate_per_hour, when

BatchOutlook = Literal["finishes", "expires", "no_rate", "ending"]
MIN_SPAN_S = 60.0  # a pace is taken over at least this long (a batch a second old has none)


def batch_outlook(batch: Mapping[str, Any], now: float) -> dict[str, Any]:
    """`batch` (an OpenAI batch object, or a Message Batch's queue record) projected from `now`
    (epoch s): its counts, its pace (items per hour since it started), its projected end and
    whether that is before its window's end, the free requests its items left need (one each,
    at least) and what it paid (nothing: a batch never pays)."""
    counts = batch.get("request_counts") or {}
    total = int(counts.get("total") or 0)
    done = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
    left = max(0, total - done)
    started = float(batch.get("in_progress_at") or batch.get("created_at") or now)
    expires = float(batch.get("expires_at") or now)
    pace = rate_per_hour(done, max(now - started, MIN_SPAN_S))
    resumes = max(now, float(batch.get("next_try_at") or now))  # its items wait until then
    waits = f"; its items wait until {when(resumes)}" if resumes > now else ""
    finish: float | None = None
    outlook: BatchOutlook
    if left == 0 or batch.get("status") in ("cancelling", "finalizing"):
        outlook, note = "ending", "no item left to run"
    elif pace is None:
        outlook, note = "no_rate", f"no item ended yet: no projection{waits}"
    else:
        finish = resumes + left / pace * 3600.0
        how = f"at {pace:.1f} items per hour since it started"
        if finish <= expires:
            outlook, note = "finishes", f"projected to end at {when(finish)}, {how}{waits}"
        else:
            outlook, finish = "expires", None
            note = (
                f"projected to reach its window's end ({when(expires)}) with items left, "
                f"{how}{waits}"
            )
    return {
        "id": batch.get("id"),
        "endpoint": batch.get("endpoint"),
        "status": batch.get("status"),
        "total": total,
        "completed": int(counts.get("completed") or 0),
        "failed": int(counts.get("failed") or 0),
        "left": left,
        "items_per_hour": pace,
        "projected_end_at": finish,
        "expires_at": expires,
        "next_try_at": resumes if resumes > now else None,
        "outlook": outlook,
        "needs_free_requests": left,
        "paid_usd": 0.0,
        "note": note,
    }
