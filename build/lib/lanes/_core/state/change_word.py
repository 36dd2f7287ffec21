"""The change word: 8 bytes in a file beside the SQLite state file (`<state>-changes`) that tell a
process — in about a microsecond — whether another one wrote a backoff, a kill switch, a probe's
backoff or an approval decision since it last looked (see `SQLiteStore.peek`).

Every writer of one of them writes a new random word there *after* its commit; a reader compares
the word with the last one it saw (one `pread`) and reads the tables only when it changed. A word
that can not be read or written (no such file can be made) says "changed" every time: the tables
are then read on every look (tens of microseconds), never skipped.

What else the processes of one host coordinate through the file lives with its concern: probe
leases in `leases.py`, pending approvals in `approvals.py`, the beats and the store's terms in
`beats.py`.
"""

from __future__ import annotations

import contextlib
import os


class ChangeWord:
    """The word beside the state file that says "another process wrote something to look at"."""

    def __init__(self, path: str | None) -> None:
        self._fd: int | None = None
        self._seen = b""
        if path is None:
            return
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)  # a no-op if another process got there first
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    def changed(self) -> bool:
        """True when another process wrote since the last call (or this one can not tell)."""
        if self._fd is None:
            return True
        try:
            word = os.pread(self._fd, 8, 0)
        except OSError:
            return True
        if word == self._seen:
            return False
        self._seen = word
        return True

    def bump(self) -> None:
        """Tell the others: call after the commit they must see."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # they read the tables at their next sync instead
                os.pwrite(self._fd, os.urandom(8), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
