"""The cohorts jobs may name, bounded per client. Pure.

A cohort (`X-Lanes-Cohort`, or the client's default) is free text from outside. The declared ones —
`[metrics] cohorts` and the clients' default cohorts — are always taken as named. Beyond those,
each client's jobs may name at most `[metrics] cohorts_per_client` distinct cohorts in this process;
a later new one counts as `other` (in the audit, the reports and `/metrics`), said once in the log
per client. So no client can grow the audit's roll-ups, a report or a label set without bound, nor
take the names another client's jobs would use. Whether a cohort becomes a `/metrics` label is the
tally's business (`tally.py`): declared, or sent by a trusted (admin) client.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lanes._core.config.schema import Config

OTHER = "other"
#: Clients whose cohorts are tracked at most (a keyless sidecar's in-process jobs may name any).
MAX_CLIENTS = 10_000


class Cohorts:
    @classmethod
    def of(cls, config: Config) -> Cohorts:
        """The cohorts jobs may name: `[metrics] cohorts` and the clients' defaults declared,
        the rest bounded per client; admins (or, with no keys, every caller) may add `/metrics`
        labels."""
        server = config.server
        declared = [
            *config.metrics.cohorts,
            *(c.cohort for c in server.clients.values() if c.cohort),
        ]
        keyed = bool(server.clients or server.admin_key_env)
        admins = {name for name, c in server.clients.items() if c.admin}
        if server.admin_key_env:
            admins.add("admin")
        return cls(
            declared=declared,
            per_client=config.metrics.cohorts_per_client,
            trusted=admins if keyed else None,
        )

    def __init__(
        self, *, declared: Iterable[str], per_client: int, trusted: Container[str] | None
    ) -> None:
        """`trusted`: the clients that may add `/metrics` labels (admins); None: every client (a
        sidecar with no keys, whose callers are all the operator's)."""
        self.declared = frozenset(declared)
        self._per_client = per_client
        self._trusted = trusted
        self._named: dict[str, set[str]] = {}  # client → the undeclared cohorts its jobs named
        self.bounded: set[str] = set()  # the clients whose bound has bitten

    def trusted(self, client: str) -> bool:
        return self._trusted is None or client in self._trusted

    def admit(self, client: str, cohort: str | None) -> tuple[str | None, bool]:
        """The cohort a job of `client` naming `cohort` is counted under, and whether this is the
        first time the client's bound bites (the caller says so, once)."""
        if cohort is None or cohort in self.declared or cohort == OTHER:
            return cohort, False
        named = self._named.get(client)
        if named is None:
            if len(self._named) >= MAX_CLIENTS:
                return OTHER, False
            named = self._named[client] = set()
        if cohort in named:
            return cohort, False
        if len(named) < self._per_client:
            named.add(cohort)
            return cohort, False
        first = client not in self.bounded
        self.bounded.add(client)
        return OTHER, first
