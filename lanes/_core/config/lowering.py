"""What a new config would lower of the guard the running one holds: who may call (every client
key dropped, the admin key dropped) and what may be spent (a higher paid ceiling, a more
permissive consent mode). A reload refuses such a change unless the operator confirms it
(`lanes reload --accept-weaker`); the same change made at start is the operator's own act."""

from __future__ import annotations

# lanes: pure
from lanes._core.config.schema import Config

#: The consent modes, strictest first (`policy.free_tier_fallback`).
CONSENT_ORDER = ("off", "ask", "allow")


def guard_lowered(old: Config, new: Config) -> list[str]:
    """Each way `new` lowers the guard `old` holds, said by its key (never a value: what is said
    goes to the log)."""
    found = []
    if old.server.clients and not new.server.clients:
        found.append(
            f"server.clients: all {len(old.server.clients)} client keys dropped "
            "(every caller would be served without a key)"
        )
    if old.server.admin_key_env and not new.server.admin_key_env:
        found.append("server.admin_key_env: the admin key dropped")
    if new.policy.paid_ceiling_usd_per_day > old.policy.paid_ceiling_usd_per_day:
        found.append("policy.paid_ceiling_usd_per_day: the paid ceiling raised")
    was, now = old.policy.free_tier_fallback, new.policy.free_tier_fallback
    if CONSENT_ORDER.index(now) > CONSENT_ORDER.index(was):
        found.append("policy.free_tier_fallback: a more permissive consent mode")
    return found
