"""The paid day's one rule: what is left under the ceiling. Pure.

The ceiling in force is the lowest of the configured one and the state store's terms' (the
strictest live host's, or an operator's); a client with a ceiling of its own is held to it as well,
its own spend against its own ceiling. The ledger's check, the SQLite reservation and the views ask
these functions; the Redis script (`state/redis_scripts.py`) is their copy in Lua, pinned to them
by the ledger's contract suite.
"""

from __future__ import annotations

#: A float sum that lands exactly on the ceiling is within it.
EPSILON_USD = 1e-12


def ceiling_in_force(ceiling: float, *lower: float | None) -> float:
    """The lowest of `ceiling` and the others given (None: not set)."""
    return min([ceiling, *(c for c in lower if c is not None)])


def room(
    *,
    spent: float,
    ceiling: float,
    client_spent: float = 0.0,
    client_ceiling: float | None = None,
) -> float:
    """USD left today under `ceiling` (the day's total `spent` against it) and, for a client with
    a ceiling of its own, under that (its own `client_spent`): the lower room. Negative once
    over."""
    left = ceiling - spent
    if client_ceiling is not None:
        left = min(left, client_ceiling - client_spent)
    return left


def fits(amount: float, left: float) -> bool:
    """Does a worst case of `amount` USD fit in `left` USD of room?"""
    return amount <= left + EPSILON_USD
