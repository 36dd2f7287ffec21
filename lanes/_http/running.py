"""What config a sidecar process runs, and — under `lanes serve --workers N` — what its parent says
every worker runs.

The parent writes a small status file in its private directory whenever a worker starts serving,
exits, or a reload ends (`team.py`, written whole and renamed into place); a worker reads it when
asked (`/ready`, `/v1/lanes`, `POST /v1/reload`). A single `lanes serve` has no parent: it shows
its own config's hash and refuses a reload.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import attrs

MAX_STATUS_BYTES = 64 * 1024  # the parent's status file: 64 workers of one short line each


@attrs.frozen(kw_only=True)
class Running:
    """This process's config (`sha256` of its file's bytes; None for a config given as an object)
    and, under `--workers`, its number, its parent and the parent's status file."""

    sha256: str | None = None
    worker: int | None = None
    parent_pid: int | None = None
    status_path: str | None = None

    @property
    def supervised(self) -> bool:
        return self.status_path is not None

    def host(self) -> dict[str, Any] | None:
        """The parent's status (see `team.py`), or None: no parent, or its file unreadable."""
        if self.status_path is None:
            return None
        try:
            with Path(self.status_path).open("rb") as file:
                status = json.loads(file.read(MAX_STATUS_BYTES + 1)[:MAX_STATUS_BYTES])
        except (OSError, ValueError):
            return None
        return status if isinstance(status, dict) else None

    def view(self) -> dict[str, Any]:
        """`/v1/lanes`' `config`: the hash this process runs, and the parent's view of every
        worker (`host`, under `--workers`)."""
        body: dict[str, Any] = {"sha256": self.sha256}
        if self.worker is not None:
            body["worker"] = self.worker
        if self.supervised:
            host = self.host() or {}
            body["host"] = {
                "sha256": host.get("sha256"),
                "workers": host.get("workers", []),
                "reloads": host.get("reloads", 0),
                "last_reload": host.get("last_reload"),
            }
        return body

    def missing(self) -> tuple[list[int], int] | None:
        """The workers not serving now, and how many there should be (None: no parent)."""
        if not self.supervised:
            return None
        host = self.host()
        if host is None:
            return [], 0
        workers = [w for w in host.get("workers", []) if isinstance(w, dict)]
        return [w.get("worker", 0) for w in workers if not w.get("serving")], len(workers)

    def request_reload(self, *, accept_weaker: bool = False) -> None:
        """Ask the parent to reload (SIGHUP; SIGUSR1 to accept a config that lowers the guard):
        only this process's own parent, still alive."""
        if self.parent_pid is None or os.getppid() != self.parent_pid:
            raise ProcessLookupError("the parent process is gone")
        os.kill(self.parent_pid, signal.SIGUSR1 if accept_weaker else signal.SIGHUP)
